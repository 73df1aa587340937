package engine

import (
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// LiveRun is what the per-run gauges show of a run that has not ended.
type LiveRun struct {
	Run *v1.Run // a copy
	// LastDecision is the latest step's decision with its inputs; nil
	// before the first step.
	LastDecision *v1.Decision
	// SnapshotFailuresInARow counts IO_ERROR and TIMEOUT snapshots since
	// the last SAVED, as max_consecutive_failures does.
	SnapshotFailuresInARow int
}

// LiveRuns lists the runs that have not ended, by id. It reads memory only
// (no store access, no wait for commits), so a metrics scrape stays cheap:
// a change being committed may show one scrape early.
func (e *Engine) LiveRuns() []LiveRun {
	e.mu.RLock()
	runs := e.allRuns()
	e.mu.RUnlock()
	live := make([]LiveRun, 0, len(runs))
	for _, r := range runs {
		r.mu.Lock()
		if !r.terminal() && !r.purged {
			lr := LiveRun{Run: r.view(), SnapshotFailuresInARow: int(r.rec.ConsecutiveFailures)}
			if st := r.steps[r.rec.Run.LastStep]; st != nil && st.Decision != nil {
				lr.LastDecision = proto.Clone(st.Decision).(*v1.Decision)
			}
			live = append(live, lr)
		}
		r.mu.Unlock()
	}
	slices.SortFunc(live, func(a, b LiveRun) int { return strings.Compare(a.Run.RunId, b.Run.RunId) })
	return live
}
