package engine

import (
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// LiveRun is what the per-run gauges show of a run.
type LiveRun struct {
	Run *v1.Run // a copy
	// LastDecision is the latest step's decision with its inputs; nil
	// before the first step.
	LastDecision *v1.Decision
	// SnapshotFailuresInARow counts IO_ERROR and TIMEOUT snapshots since
	// the last SAVED, as max_consecutive_failures does.
	SnapshotFailuresInARow int
}

// MetricRuns lists, by id, the runs that have per-run gauges: those
// running (see running) and those that ended less than endedWithin ago,
// by the engine's clock. A PENDING run that nothing runs for yet (a queued
// job's) has none, so the gauges' series are bounded by the jobs actually
// running and the runs ended recently, not by --max-runs. It reads memory
// only (no store access, no wait for commits), so a metrics scrape stays
// cheap: a change being committed may show one scrape early.
func (e *Engine) MetricRuns(endedWithin time.Duration) []LiveRun {
	cutoff := e.clk.Now().Add(-endedWithin)
	e.mu.RLock()
	runs := e.allRuns()
	e.mu.RUnlock()
	var out []LiveRun
	for _, r := range runs {
		r.mu.Lock()
		if !r.purged && (r.running() || r.endedAfter(cutoff)) {
			lr := LiveRun{Run: r.view(), SnapshotFailuresInARow: int(r.rec.ConsecutiveFailures)}
			if st := r.steps[r.rec.Run.LastStep]; st != nil && st.Decision != nil {
				lr.LastDecision = proto.Clone(st.Decision).(*v1.Decision)
			}
			out = append(out, lr)
		}
		r.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b LiveRun) int { return strings.Compare(a.Run.RunId, b.Run.RunId) })
	return out
}

// running reports whether the run's job is running: the run is RUNNING,
// SAVING or SNAPSHOTTING, or PENDING with a LIVE worker (its processes are
// up before the first step: loading a checkpoint, environment workers
// already snapshotting, the pre-step deadline still able to fire).
func (r *runState) running() bool {
	switch r.state() {
	case v1.RunState_RUN_STATE_RUNNING, v1.RunState_RUN_STATE_SAVING, v1.RunState_RUN_STATE_SNAPSHOTTING:
		return true
	case v1.RunState_RUN_STATE_PENDING:
		for _, w := range r.workers {
			if w.w.State == v1.WorkerState_WORKER_STATE_LIVE {
				return true
			}
		}
	}
	return false
}

// endedAfter reports whether the run is terminal and ended after cutoff.
func (r *runState) endedAfter(cutoff time.Time) bool {
	ended := r.rec.Run.EndedAt
	return r.terminal() && ended != nil && ended.AsTime().After(cutoff)
}
