package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"
)

// row is one figure with its floor.
type row struct {
	ID     string   `json:"id"`
	Figure string   `json:"figure"`
	Value  float64  `json:"value"`
	Unit   string   `json:"unit"`
	Lat    *latJSON `json:"latency_ms,omitempty"`
	// Floor is the same figure for the floor named by FloorWhat.
	Floor     float64  `json:"floor"`
	FloorWhat string   `json:"floor_what"`
	FloorLat  *latJSON `json:"floor_latency_ms,omitempty"`
	// Ratio is Value / Floor: for a rate, the fraction of the floor
	// reached; for a time or a size, how many times the floor it is.
	Ratio  float64 `json:"ratio"`
	Target string  `json:"target,omitempty"`
	Met    *bool   `json:"target_met,omitempty"`
	Note   string  `json:"note,omitempty"`
}

type latJSON struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func latOf(l latency) *latJSON {
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }
	return &latJSON{P50: ms(l.P50), P99: ms(l.P99), Max: ms(l.Max)}
}

func ratio(v, floor float64) float64 {
	if floor == 0 {
		return 0
	}
	return v / floor
}

func (b *bench) add(r row) {
	r.Ratio = ratio(r.Value, r.Floor)
	b.rows = append(b.rows, r)
	b.logf("  %s: %s (floor %s, ratio %.2f)", r.Figure, fmtValue(r.Value, r.Unit), fmtValue(r.Floor, r.Unit), r.Ratio)
}

func met(ok bool) *bool { return &ok }

type report struct {
	Tool      string    `json:"tool"`
	Started   time.Time `json:"started"`
	Seconds   float64   `json:"seconds"`
	Cores     int       `json:"cores"`
	GoVersion string    `json:"go_version"`
	LoadAvg   struct {
		Before string `json:"before"`
		After  string `json:"after"`
	} `json:"loadavg"`
	Config map[string]any `json:"config"`
	Rows   []row          `json:"rows"`
}

func (b *bench) report() report {
	r := report{Tool: "snapbench", Started: b.started, Seconds: math.Round(time.Since(b.started).Seconds()*10) / 10,
		Cores: cores(), GoVersion: runtime.Version(), Rows: b.rows}
	r.LoadAvg.Before, r.LoadAvg.After = b.loadBef, loadAvg()
	c := b.cfg
	r.Config = map[string]any{
		"warmup": c.warmup.String(), "duration": c.duration.String(),
		"step_runs": c.stepRuns, "step_ranks": c.stepRanks, "report_workers": c.reportWorkers,
		"fanout_workers": c.fanoutWorkers, "workers_per_conn": c.workersPerConn, "node_workers_per_conn": c.nodeWorkersPerConn, "heartbeat_workers": c.heartbeatWorkers,
		"restart_runs": c.restartRuns, "restart_workers_per_run": c.restartWorkers, "restart_steps": c.restartSteps,
		"storm_runs": c.stormRuns, "storm_ranks": c.stormRanks, "storm_workers": c.stormWorkers,
		"storm_ranks_per_conn": c.stormRanksPerConn, "storm_workers_per_conn": c.stormWorkersPerConn,
		"storm_step": c.stormStep.String(), "storm_save": c.stormSave.String(), "storm_lead": c.stormLead.String(), "storm_margin": c.stormMargin.String(), "storm_stores": c.stormStores,
		"serve_args": c.serveArgs, "pprof": c.pprofDir != "",
	}
	return r
}

func (r report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (r report) printTable(w io.Writer) {
	fmt.Fprintf(w, "snapbench: %d cores, %s, load average %s before / %s after, %.0f s\n\n",
		r.Cores, r.GoVersion, r.LoadAvg.Before, r.LoadAvg.After, r.Seconds)
	if r.Config["pprof"] == true {
		fmt.Fprintf(w, "with --pprof the coordinator was profiled during its windows and the floors were not: this run's ratios overstate its cost\n\n")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tmeasured\tp50 / p99 / max\tfloor\tfloor p50 / p99 / max\tratio\ttarget\tmet")
	for _, row := range r.Rows {
		ok := "-"
		if row.Met != nil {
			ok = map[bool]string{true: "yes", false: "NO"}[*row.Met]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s (%s)\t%s\t%.2f\t%s\t%s\n", row.Figure, fmtValue(row.Value, row.Unit), fmtLat(row.Lat),
			fmtValue(row.Floor, row.Unit), row.FloorWhat, fmtLat(row.FloorLat), row.Ratio, row.Target, ok)
	}
	_ = tw.Flush()
	var notes []string
	for _, row := range r.Rows {
		if row.Note != "" {
			notes = append(notes, "  "+row.Figure+": "+row.Note)
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(w, "\nnotes:\n%s\n", strings.Join(notes, "\n"))
	}
}

func fmtLat(l *latJSON) string {
	if l == nil {
		return "-"
	}
	return fmt.Sprintf("%s / %s / %s ms", fmtMS(l.P50), fmtMS(l.P99), fmtMS(l.Max))
}

func fmtMS(ms float64) string {
	if ms < 10 {
		return fmt.Sprintf("%.2f", ms)
	}
	return fmt.Sprintf("%.0f", ms)
}

func fmtValue(v float64, unit string) string {
	switch unit {
	case "/s":
		return fmt.Sprintf("%.0f/s", v)
	case "KiB":
		return fmt.Sprintf("%.1f KiB", v)
	case "s":
		return fmt.Sprintf("%.3f s", v)
	case "ms":
		return fmt.Sprintf("%s ms", fmtMS(v))
	case "MiB":
		return fmt.Sprintf("%.0f MiB", v)
	case "%":
		return fmt.Sprintf("%.1f %%", v)
	}
	return fmt.Sprintf("%.3g %s", v, unit)
}
