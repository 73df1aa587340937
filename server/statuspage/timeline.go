package statuspage

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
	"github.com/snapcoord/snapcoord/internal/paging"
)

// Bounds on what one page draws, so a run of many days stays one quick
// page: its latest events and snapshots.
const (
	maxEvents    = 2000
	maxSnapshots = 500
	tableRows    = 30
)

// timeline is what a run's page is drawn from.
type timeline struct {
	run         *v1.Run
	decisions   []*v1.Decision
	checkpoints []*v1.RunEvent
	snapshots   []*v1.Snapshot
	workers     []*v1.Worker
}

func loadTimeline(ctx context.Context, runs Runs, id string) (*timeline, error) {
	got, err := runs.GetRun(ctx, &v1.GetRunRequest{RunId: id})
	if err != nil {
		return nil, err
	}
	tl := &timeline{run: got.GetRun()}
	if err := tl.loadEvents(ctx, runs); err != nil {
		return nil, err
	}
	err = paging.Each(func(token string) ([]*v1.Snapshot, string, error) {
		page, err := runs.ListSnapshots(ctx, &v1.ListSnapshotsRequest{RunId: id, PageToken: token})
		return page.GetSnapshots(), page.GetNextPageToken(), err
	}, func(snaps []*v1.Snapshot) {
		tl.snapshots = append(tl.snapshots, snaps...)
		if len(tl.snapshots) > maxSnapshots {
			tl.snapshots = tl.snapshots[len(tl.snapshots)-maxSnapshots:]
		}
	})
	if err != nil {
		return nil, err
	}
	if err := tl.loadWorkers(ctx, runs); err != nil {
		return nil, err
	}
	return tl, nil
}

// errCaughtUp ends the watch once the events GetRun counted are in.
var errCaughtUp = errors.New("caught up")

// catchUpWait bounds the wait for events GetRun counted but the engine has
// not published to watchers yet (they are published once durable, just
// after the commit GetRun waited for).
const catchUpWait = 2 * time.Second

// loadEvents reads the run's latest events up to the one GetRun counted
// last, so the timeline agrees with the run's state above it.
func (tl *timeline) loadEvents(ctx context.Context, runs Runs) error {
	last := tl.run.GetLastEventSeq()
	after := max(0, last-maxEvents)
	if last <= after {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, catchUpWait)
	defer cancel()
	err := runs.WatchRun(ctx, &v1.WatchRunRequest{RunId: tl.run.GetRunId(), AfterSeq: after}, func(ev *v1.RunEvent) error {
		switch ev.GetType() {
		case v1.RunEventType_RUN_EVENT_TYPE_DECISION:
			if ev.GetDecision() != nil {
				tl.decisions = append(tl.decisions, ev.GetDecision())
			}
		case v1.RunEventType_RUN_EVENT_TYPE_CHECKPOINT_SAVED:
			tl.checkpoints = append(tl.checkpoints, ev)
		}
		if ev.GetSeq() >= last {
			return errCaughtUp
		}
		return nil
	})
	if errors.Is(err, errCaughtUp) || errors.Is(err, context.DeadlineExceeded) {
		return nil // caught up, or as far as the bound allowed
	}
	return err
}

// The drawing's geometry, in SVG user units.
const (
	svgWidth  = 1100
	plotLeft  = 110
	plotRight = 1080
	stepsY    = 40  // step ticks: stepsY to stepsY+24
	spareTop  = 90  // spare time: a line from spareTop (most) to spareBase (none)
	spareBase = 170 //
	ckptY     = 200 // checkpoint markers
	snapY     = 235 // snapshot bars: snapY to snapY+22
	axisY     = 285
	// labelWidth is room enough for a duration under a snapshot's bar.
	labelWidth = 50
	svgHeight  = 330
)

// timelineView is the drawing, laid out for the template.
type timelineView struct {
	Width, Height, Left, Right, AxisY int
	TickY, SpareLabelY                int
	Lanes                             []label
	Ticks                             []label
	Steps                             []mark
	SparePoints                       []mark
	SparePath                         string
	SpareMax                          string
	Checkpoints                       []mark
	Snapshots                         []bar
	Lines                             []vline
	Empty                             bool

	DecisionRows []decisionRow
	SnapshotRows []snapshotRow
}

type label struct {
	X, Y float64
	Text string
}

type mark struct {
	X, Y  float64
	Y2    float64 // a step tick's lower end
	Class string
	Title string
}

type bar struct {
	X, Y, W, H float64
	TextY      float64
	Class      string
	Title      string
	Text       string
}

type vline struct {
	X         float64
	ID, Class string
	Text      string
	TextY     float64
}

type decisionRow struct {
	Step                   int64
	At, Action, Spare, Why string
	Rule                   string // the engine's own explanation, for the row's tooltip
	Class                  string
}

type snapshotRow struct {
	ID, Reason, Issued, Outcome, Duration string
	Anchor                                int64
	Class                                 string
}

// span is the drawn time range.
type span struct{ from, to time.Time }

func (s span) x(t time.Time) float64 {
	f := t.Sub(s.from).Seconds() / s.to.Sub(s.from).Seconds()
	return plotLeft + math.Max(0, math.Min(1, f))*(plotRight-plotLeft)
}

// extent covers everything drawn: the items, B, the firing and now (or
// the run's end).
func (tl *timeline) extent(now time.Time) span {
	var ts []time.Time
	for _, d := range tl.decisions {
		ts = append(ts, d.GetDecidedAt().AsTime())
	}
	for _, c := range tl.checkpoints {
		ts = append(ts, c.GetAt().AsTime())
	}
	for _, s := range tl.snapshots {
		ts = append(ts, s.GetIssuedAt().AsTime())
	}
	run := tl.run
	end := now
	if run.GetEndedAt() != nil {
		end = run.GetEndedAt().AsTime()
	}
	ts = append(ts, end)
	if len(tl.decisions)+len(tl.checkpoints)+len(tl.snapshots) == 0 || run.GetCreatedAt().AsTime().After(ts[0]) {
		ts = append(ts, run.GetCreatedAt().AsTime())
	}
	for _, t := range []*timestamppb.Timestamp{run.GetDeadline().GetMustSaveBy(), run.GetDeadline().GetFiresAt(), run.GetFiredAt()} {
		if t != nil {
			ts = append(ts, t.AsTime())
		}
	}
	s := span{from: ts[0], to: ts[0]}
	for _, t := range ts {
		if t.Before(s.from) {
			s.from = t
		}
		if t.After(s.to) {
			s.to = t
		}
	}
	pad := max(s.to.Sub(s.from)/40, time.Second)
	s.from, s.to = s.from.Add(-pad), s.to.Add(pad)
	return s
}

func (tl *timeline) draw(now time.Time) timelineView {
	s := tl.extent(now)
	v := timelineView{Width: svgWidth, Height: svgHeight, Left: plotLeft, Right: plotRight, AxisY: axisY,
		TickY: axisY + 5, SpareLabelY: spareTop - 6,
		Empty: len(tl.decisions)+len(tl.checkpoints)+len(tl.snapshots) == 0}
	v.Lanes = []label{{10, stepsY + 16, "steps"}, {10, (spareTop + spareBase) / 2, "spare"}, {10, ckptY + 4, "checkpoints"}, {10, snapY + 15, "snapshots"}}
	v.Ticks = ticks(s)
	tl.drawDecisions(&v, s)
	for _, c := range tl.checkpoints {
		v.Checkpoints = append(v.Checkpoints, mark{X: s.x(c.GetAt().AsTime()), Y: ckptY, Class: "checkpoint",
			Title: fmt.Sprintf("%s: %s", c.GetAt().AsTime().UTC().Format(timeLayout), c.GetMessage())})
	}
	tl.drawSnapshots(&v, s, now)
	v.Lines = tl.lines(s, now)
	return v
}

func (tl *timeline) drawDecisions(v *timelineView, s span) {
	spareMax := 1.0
	spares := make([]float64, len(tl.decisions))
	for i, d := range tl.decisions {
		spares[i] = spare(d)
		if !math.IsNaN(spares[i]) {
			spareMax = math.Max(spareMax, spares[i])
		}
	}
	v.SpareMax = seconds(spareMax)
	var path []string
	for i, d := range tl.decisions {
		x := s.x(d.GetDecidedAt().AsTime())
		action := actionName(d.GetAction())
		title := fmt.Sprintf("step %d: %s at %s", d.GetStep(), action, d.GetDecidedAt().AsTime().UTC().Format(timeLayout))
		if !math.IsNaN(spares[i]) {
			title += ", spare " + seconds(spares[i])
			y := spareBase - math.Max(0, spares[i])/spareMax*(spareBase-spareTop)
			class := "decision"
			if spares[i] <= 0 { // the rule fires here
				class += " no-spare"
			}
			v.SparePoints = append(v.SparePoints, mark{X: x, Y: y, Class: class, Title: title})
			path = append(path, fmt.Sprintf("%.1f,%.1f", x, y))
		}
		v.Steps = append(v.Steps, mark{X: x, Y: stepsY, Y2: stepsY + 24, Class: "step " + action, Title: title})
	}
	v.SparePath = strings.Join(path, " ")
	// Newest first: the latest decision is the one an operator looks for.
	for _, d := range slices.Backward(tl.decisions[max(0, len(tl.decisions)-tableRows):]) {
		sp := "-"
		if v := spare(d); !math.IsNaN(v) {
			sp = seconds(v)
		}
		action := actionName(d.GetAction())
		v.DecisionRows = append(v.DecisionRows, decisionRow{Step: d.GetStep(), At: d.GetDecidedAt().AsTime().UTC().Format(timeLayout),
			Action: action, Class: action, Spare: sp, Why: why(d), Rule: d.GetExplanation()})
	}
}

// spare is what a decision left: B - (decided_at + I + C + R + M); NaN
// for a run without B.
func spare(d *v1.Decision) float64 {
	in := d.GetInputs()
	if in.GetMustSaveBy() == nil {
		return math.NaN()
	}
	need := in.GetIterationSeconds() + in.GetCheckpointSeconds() + in.GetSaveReserveSeconds() + in.GetMarginSeconds()
	return in.GetMustSaveBy().AsTime().Sub(d.GetDecidedAt().AsTime()).Seconds() - need
}

func (tl *timeline) drawSnapshots(v *timelineView, s span, now time.Time) {
	for _, sn := range tl.snapshots {
		from, to := sn.GetIssuedAt().AsTime(), now
		outcome := "in-flight"
		dur := "in flight"
		if sn.GetCompletedAt() != nil {
			to = sn.GetCompletedAt().AsTime()
			outcome = apifacts.EnumLower(sn.GetOutcome())
			dur = seconds(sn.GetDurationSeconds())
		}
		reason := apifacts.EnumLower(sn.GetReason())
		x := s.x(from)
		v.Snapshots = append(v.Snapshots, bar{X: x, Y: snapY, W: math.Max(2, s.x(to)-x), H: 22, TextY: snapY + 36,
			Class: "snapshot " + cssName(outcome) + " reason-" + cssName(reason),
			Title: fmt.Sprintf("%s (%s, anchor step %d): %s, %s", sn.GetSnapshotId(), reason, sn.GetAnchorStep(), outcome, dur),
			Text:  dur})
	}
	// A duration is written under its bar only where it does not run into
	// the next one's; the bar's title has it anyway.
	for i := range v.Snapshots {
		if i+1 < len(v.Snapshots) && v.Snapshots[i+1].X-v.Snapshots[i].X < labelWidth {
			v.Snapshots[i].Text = ""
		}
	}
	for _, sn := range slices.Backward(tl.snapshots[max(0, len(tl.snapshots)-tableRows):]) {
		row := snapshotRow{ID: sn.GetSnapshotId(), Anchor: sn.GetAnchorStep(), Issued: sn.GetIssuedAt().AsTime().UTC().Format(timeLayout),
			Reason: apifacts.EnumLower(sn.GetReason()), Outcome: "in flight", Duration: "-"}
		if sn.GetCompletedAt() != nil {
			row.Outcome = apifacts.EnumLower(sn.GetOutcome())
			row.Duration = seconds(sn.GetDurationSeconds())
		}
		// The style sheet selects "io-error", the enum's text is "io_error".
		row.Class = cssName(row.Outcome)
		v.SnapshotRows = append(v.SnapshotRows, row)
	}
}

// lines are the moments drawn across the whole height: B, fires_at, the
// firing and now.
func (tl *timeline) lines(s span, now time.Time) []vline {
	run := tl.run
	var ls []vline
	add := func(t time.Time, id, class, text string) {
		ls = append(ls, vline{X: s.x(t), ID: id, Class: class, Text: text, TextY: float64(18 + 11*(len(ls)%2))})
	}
	if b := run.GetDeadline().GetMustSaveBy(); b != nil {
		add(b.AsTime(), "line-B", "deadline", "B "+b.AsTime().UTC().Format("15:04:05"))
	}
	if f := run.GetDeadline().GetFiresAt(); f != nil && run.GetFiredAt() == nil {
		add(f.AsTime(), "line-fires-at", "fires-at", "fires_at "+f.AsTime().UTC().Format("15:04:05"))
	}
	if f := run.GetFiredAt(); f != nil {
		add(f.AsTime(), "line-fired", "fired", fmt.Sprintf("fired at step %d", run.GetFiredAtStep()))
	}
	if run.GetEndedAt() == nil {
		add(now, "line-now", "now", "now")
	}
	return ls
}

// ticks labels the time axis with about eight round instants.
func ticks(s span) []label {
	total := s.to.Sub(s.from)
	step := time.Second
	for _, c := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second,
		30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
		time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour} {
		step = c
		if total/c <= 8 {
			break
		}
	}
	layout := "15:04:05"
	if step >= 24*time.Hour {
		layout = "Jan 2"
	}
	var out []label
	for t := s.from.Truncate(step).Add(step); t.Before(s.to); t = t.Add(step) {
		out = append(out, label{X: s.x(t), Y: axisY + 16, Text: t.UTC().Format(layout)})
	}
	return out
}

func actionName(a v1.StepAction) string {
	return strings.ReplaceAll(apifacts.EnumLower(a), "_", "-")
}
