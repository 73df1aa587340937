package engine

import (
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Observer receives the engine's countable happenings, for metrics. Calls
// are made outside any lock and must not block.
type Observer interface {
	Decision(action v1.StepAction)
	DeadlineFired(kind v1.DeadlineFireKind)
	CommandIssued(kind string)
	// CommandDelivered is called when a command is sent on a stream or
	// returned by a poll, with the time since it was issued.
	CommandDelivered(kind string, latency time.Duration)
	SnapshotCompleted(reason v1.SnapshotReason, outcome v1.SnapshotOutcome, seconds float64)
}

type nopObserver struct{}

func (nopObserver) Decision(v1.StepAction)                                           {}
func (nopObserver) DeadlineFired(v1.DeadlineFireKind)                                {}
func (nopObserver) CommandIssued(string)                                             {}
func (nopObserver) CommandDelivered(string, time.Duration)                           {}
func (nopObserver) SnapshotCompleted(v1.SnapshotReason, v1.SnapshotOutcome, float64) {}

// Stats counts runs by state and workers by role and state, for gauges.
type Stats struct {
	Runs    map[v1.RunState]int
	Workers map[v1.WorkerRole]map[v1.WorkerState]int
}

// Stats takes a consistent-per-run count of runs and workers.
func (e *Engine) Stats() Stats {
	s := Stats{Runs: map[v1.RunState]int{}, Workers: map[v1.WorkerRole]map[v1.WorkerState]int{}}
	e.mu.RLock()
	runs := make([]*runState, 0, len(e.runs))
	for _, r := range e.runs {
		runs = append(runs, r)
	}
	e.mu.RUnlock()
	for _, r := range runs {
		r.mu.Lock()
		s.Runs[r.rec.Run.State]++
		for _, w := range r.workers {
			if s.Workers[w.w.Role] == nil {
				s.Workers[w.w.Role] = map[v1.WorkerState]int{}
			}
			s.Workers[w.w.Role][w.w.State]++
		}
		r.mu.Unlock()
	}
	return s
}
