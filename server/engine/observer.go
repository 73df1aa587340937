package engine

import (
	"context"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Observer receives the engine's countable happenings, for metrics and
// traces. Calls are made outside any lock, once the change is durable, and
// must not block. ctx is the call that caused the happening (so a span can
// be its child), or a background context for a timer's. The run, step and
// snapshot identify a happening in a trace; they are too many to be metric
// labels.
type Observer interface {
	Decision(ctx context.Context, runID string, step int64, action v1.StepAction)
	DeadlineFired(ctx context.Context, runID string, step int64, kind v1.DeadlineFireKind)
	CommandIssued(ctx context.Context, kind string)
	// CommandDelivered is called when a command is sent on a stream or
	// returned by a poll, with the time since it was issued.
	CommandDelivered(ctx context.Context, kind string, latency time.Duration)
	SnapshotCompleted(ctx context.Context, runID, snapshotID string, reason v1.SnapshotReason, outcome v1.SnapshotOutcome, seconds float64)
	// CheckpointSaved is called once every rank saved a step's checkpoint,
	// with the slowest rank's save.
	CheckpointSaved(ctx context.Context, runID string, step int64, seconds float64)
	// DeadlineMissed is called once per run, when it is found to have
	// missed its deadline (Run.deadline_missed).
	DeadlineMissed(ctx context.Context, runID string, cause MissCause)
}

type nopObserver struct{}

func (nopObserver) Decision(context.Context, string, int64, v1.StepAction)            {}
func (nopObserver) DeadlineFired(context.Context, string, int64, v1.DeadlineFireKind) {}
func (nopObserver) CommandIssued(context.Context, string)                             {}
func (nopObserver) CommandDelivered(context.Context, string, time.Duration)           {}
func (nopObserver) DeadlineMissed(context.Context, string, MissCause)                 {}
func (nopObserver) SnapshotCompleted(context.Context, string, string, v1.SnapshotReason, v1.SnapshotOutcome, float64) {
}
func (nopObserver) CheckpointSaved(context.Context, string, int64, float64) {}

// Stats counts runs by state and workers by role and state, for gauges.
type Stats struct {
	Runs    map[v1.RunState]int
	Workers map[v1.WorkerRole]map[v1.WorkerState]int
}

// Stats takes a consistent-per-run count of runs and workers.
func (e *Engine) Stats() Stats {
	s := Stats{Runs: map[v1.RunState]int{}, Workers: map[v1.WorkerRole]map[v1.WorkerState]int{}}
	e.mu.RLock()
	runs := e.allRuns()
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
