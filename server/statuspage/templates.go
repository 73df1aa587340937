package statuspage

// pageTemplates are the two pages. The SVG is inline and well-formed XML,
// so tests can parse it; styles are inline too (the page's CSP allows no
// other source).
const pageTemplates = `
{{define "head"}}<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{{.RefreshSec}}">
<title>{{.Title}}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fafafa; }
h1 { font-size: 1.4em; margin: 0 0 .2em; }
.meta { color: #666; margin-bottom: 1em; }
table { border-collapse: collapse; margin: .5em 0 1.5em; background: #fff; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.state-running, .continue, .saved { color: #1a7f37; }
.state-saving, .state-snapshotting, .save-and-stop { color: #b35900; font-weight: 600; }
.missed, .state-failed, .state-cancelled, .io-error, .timeout, .invariant-failure { color: #c62828; font-weight: 600; }
.state-stopped, .state-completed { color: #1f4e99; }
.past-b, .flag { color: #fff; background: #c62828; font-weight: 600; padding: 0 .35em; border-radius: 3px; }
tr.lagging td, tr.silent td { background: #fdecea; }
.worker-lost { color: #c62828; font-weight: 600; }
.worker-left { color: #888; }
.cell { display: inline-block; width: .9em; height: .9em; margin-right: 2px; border-radius: 2px; background: #9ca3af; vertical-align: middle; }
.cell.saved { background: #34d399; }
.cell.skipped { background: #d1d5db; }
.cell.in-flight { background: #fde68a; }
.cell.io-error, .cell.timeout, .cell.invariant-failure, .cell.no-report { background: #e53935; }
#flagged { border-left: 4px solid #c62828; background: #fdecea; padding: .4em .8em; margin: .5em 0 1em; }
#flagged li { margin: .1em 0; }
svg { background: #fff; border: 1px solid #ddd; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
svg .lane { fill: #555; font-weight: 600; }
svg .step { stroke-width: 2; }
svg .step.continue { stroke: #2da44e; }
svg .step.save-and-stop { stroke: #d97706; stroke-width: 3; }
svg .step.stop { stroke: #888; }
svg .spare-line { fill: none; stroke: #2563eb; stroke-width: 1.5; }
svg .decision { fill: #2563eb; }
svg .decision.no-spare { fill: #c62828; }
svg .checkpoint { fill: #7c3aed; }
svg .snapshot { fill: #9ca3af; }
svg .snapshot.saved { fill: #34d399; }
svg .snapshot.in-flight { fill: #fde68a; }
svg .snapshot.io-error, svg .snapshot.timeout, svg .snapshot.invariant-failure { fill: #f87171; }
svg .snapshot.skipped { fill: #d1d5db; }
svg .snapshot.reason-deadline { stroke: #c62828; stroke-width: 2; }
svg .deadline { stroke: #c62828; stroke-width: 2; }
svg .fires-at { stroke: #d97706; stroke-width: 1.5; stroke-dasharray: 5 3; }
svg .fired { stroke: #7c3aed; stroke-width: 2; }
svg .now { stroke: #6b7280; stroke-dasharray: 2 3; }
svg .axis { stroke: #999; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<div class="meta">{{.Now}} · refreshes every {{.RefreshSec}} s · <a href="/">all runs</a> · <a href="/metrics">metrics</a></div>
{{end}}

{{define "index"}}{{template "head" .}}
{{if .Runs}}
<table id="runs">
<tr><th>run</th><th>state</th><th>last step</th><th>B (must save by)</th><th>time to B</th><th>fires</th><th>I</th><th>C</th><th>R</th><th>M</th></tr>
{{range .Runs}}<tr>
<td><a href="/runs/{{.ID}}">{{.ID}}</a></td>
<td class="{{.StateClass}}">{{.State}}{{if .Missed}} <span class="missed" title="{{.Missed}}">DEADLINE MISSED</span>{{end}}{{if .PastB}} <span class="past-b" title="{{.PastB}}">PAST B</span>{{end}}</td>
<td class="num">{{.LastStep}}</td>
<td>{{if .B}}{{.B}}{{else}}none{{end}}</td>
<td>{{if .PastB}}<span class="past-b">{{.PastB}}</span>{{else}}{{.UntilB}}{{end}}</td>
<td>{{if .FiredAt}}fired {{.FiredAt}}{{else}}{{.UntilFires}}{{end}}</td>
<td class="num">{{.I}}</td><td class="num">{{.C}}</td><td class="num">{{.R}}</td><td class="num">{{.M}}</td>
</tr>
{{end}}</table>
{{if .More}}<p>Only the first 1000 runs are listed; <code>snapctl run list</code> lists them all.</p>{{end}}
{{else}}<p>No runs.</p>{{end}}
</body></html>
{{end}}

{{define "run"}}{{template "head" .}}
{{with .Run}}
<table id="summary">
<tr><th>state</th><td class="{{.StateClass}}">{{.State}}</td><th>last step</th><td>{{.LastStep}}</td></tr>
<tr><th>B</th><td>{{if .B}}{{.B}} ({{.UntilB}}){{else}}none{{end}}</td><th>fires_at</th><td>{{if .FiredAt}}fired {{.FiredAt}}{{else if .Fire}}{{.Fire}} ({{.UntilFires}}){{else}}-{{end}}</td></tr>
<tr><th>I + C + R + M</th><td colspan="3">{{.I}} + {{.C}} + {{.R}} + {{.M}}</td></tr>
{{if .Ended}}<tr><th>ended</th><td colspan="3">{{.Ended}}</td></tr>{{end}}
{{if .PastB}}<tr><th>deadline</th><td colspan="3"><span class="past-b" id="past-b">{{.PastB}}</span></td></tr>{{end}}
{{if .Missed}}<tr><th>deadline</th><td colspan="3" class="missed">DEADLINE MISSED: {{.Missed}}</td></tr>{{end}}
{{if .Failure}}<tr><th>failure</th><td colspan="3">{{.Failure}}</td></tr>{{end}}
</table>
{{end}}
{{if .Flagged}}<div id="flagged"><strong>{{len .Flagged}} worker(s) need attention</strong><ul>
{{range .Flagged}}<li>{{.}}</li>
{{end}}</ul></div>{{end}}
<h2>Workers</h2>
{{if .Workers}}<table id="workers">
<tr><th>worker</th><th>role</th><th>state</th><th>last heartbeat</th><th>last step / last report</th><th>snapshots (oldest → newest)</th><th>flags</th></tr>
{{range .Workers}}<tr class="{{.Class}}" data-worker="{{.Name}}">
<td>{{.Name}}</td><td>{{.Role}}</td><td class="{{.StateClass}}">{{.State}}</td>
<td title="{{.HeartbeatTitle}}">{{.Heartbeat}}</td>
<td class="{{.ProgressClass}}">{{.Progress}}</td>
<td>{{range .Outcomes}}<span class="{{.Class}}" title="{{.Title}}"></span>{{else}}-{{end}}</td>
<td>{{range .Flags}}<span class="flag">{{.}}</span> {{end}}</td>
</tr>
{{end}}</table>
{{if .MoreWorkers}}<p>Only the first 2000 workers are listed; <code>snapctl</code> lists them all.</p>{{end}}
{{else}}<p>No worker registered.</p>{{end}}
{{with .Timeline}}
<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="run timeline">
{{range .Lanes}}<text class="lane" x="{{.X}}" y="{{.Y}}">{{.Text}}</text>
{{end}}<text x="{{.Left}}" y="{{.SpareLabelY}}">spare at most {{.SpareMax}}</text>
<line class="axis" x1="{{.Left}}" y1="{{.AxisY}}" x2="{{.Right}}" y2="{{.AxisY}}"/>
{{range .Ticks}}<line class="axis" x1="{{printf "%.1f" .X}}" y1="{{$.Timeline.AxisY}}" x2="{{printf "%.1f" .X}}" y2="{{$.Timeline.TickY}}"/><text x="{{printf "%.1f" .X}}" y="{{.Y}}" text-anchor="middle">{{.Text}}</text>
{{end}}{{range .Steps}}<line class="{{.Class}}" x1="{{printf "%.1f" .X}}" y1="{{.Y}}" x2="{{printf "%.1f" .X}}" y2="{{.Y2}}" stroke-linecap="round"><title>{{.Title}}</title></line>
{{end}}{{if .SparePath}}<polyline class="spare-line" points="{{.SparePath}}"/>
{{end}}{{range .SparePoints}}<circle class="{{.Class}}" cx="{{printf "%.1f" .X}}" cy="{{printf "%.1f" .Y}}" r="3"><title>{{.Title}}</title></circle>
{{end}}{{range .Checkpoints}}<path class="checkpoint" d="M {{printf "%.1f" .X}} {{.Y}} l 6 8 l -6 8 l -6 -8 z"><title>{{.Title}}</title></path>
{{end}}{{range .Snapshots}}<g><rect class="{{.Class}}" x="{{printf "%.1f" .X}}" y="{{.Y}}" width="{{printf "%.1f" .W}}" height="{{.H}}"><title>{{.Title}}</title></rect><text x="{{printf "%.1f" .X}}" y="{{.TextY}}">{{.Text}}</text></g>
{{end}}{{range .Lines}}<line id="{{.ID}}" class="{{.Class}}" x1="{{printf "%.1f" .X}}" y1="32" x2="{{printf "%.1f" .X}}" y2="{{$.Timeline.AxisY}}"/><text x="{{printf "%.1f" .X}}" y="{{.TextY}}" text-anchor="middle">{{.Text}}</text>
{{end}}</svg>
{{if .Empty}}<p>No step, checkpoint or snapshot yet.</p>{{end}}
<h2>Latest decisions, newest first</h2>
{{if .DecisionRows}}<table id="decisions">
<tr><th>step</th><th>decided</th><th>action</th><th>spare</th><th>why</th></tr>
{{range .DecisionRows}}<tr><td class="num">{{.Step}}</td><td>{{.At}}</td><td class="{{.Class}}">{{.Action}}</td><td class="num">{{.Spare}}</td><td title="{{.Rule}}">{{.Why}}</td></tr>
{{end}}</table>{{else}}<p>None yet.</p>{{end}}
<h2>Latest snapshots, newest first</h2>
{{if .SnapshotRows}}<table id="snapshots">
<tr><th>snapshot</th><th>reason</th><th>anchor step</th><th>issued</th><th>outcome</th><th>duration</th></tr>
{{range .SnapshotRows}}<tr><td>{{.ID}}</td><td>{{.Reason}}</td><td class="num">{{.Anchor}}</td><td>{{.Issued}}</td><td class="{{.Class}}">{{.Outcome}}</td><td class="num">{{.Duration}}</td></tr>
{{end}}</table>{{else}}<p>None yet.</p>{{end}}
{{end}}
</body></html>
{{end}}
`
