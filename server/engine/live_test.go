package engine

import (
	"context"
	"sync"
	"testing"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// checkpointObserver records CheckpointSaved calls.
type checkpointObserver struct {
	nopObserver
	mu    sync.Mutex
	saved []float64
}

func (o *checkpointObserver) CheckpointSaved(_ context.Context, _ string, _ int64, sec float64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.saved = append(o.saved, sec)
}

// MetricRuns(0) lists the runs that have not ended, each with its latest
// decision; CheckpointSaved reports a checkpoint once, with the slowest
// rank's save, when the last rank saved it.
func TestLiveRunsAndCheckpointSaved(t *testing.T) {
	obs := &checkpointObserver{}
	h := newHarnessWith(t, Options{Observer: obs})
	h.create("a", turnSpec(2, "00:01:00:00"))
	h.create("b", turnSpec(1, "00:01:00:00"))
	ranks := h.trainers("a", 2)
	h.stepAll("a", ranks, 1, 3)
	h.checkpoint("a", ranks[:1], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 4)
	obs.mu.Lock()
	if len(obs.saved) != 0 {
		t.Errorf("CheckpointSaved after one rank of two: %v", obs.saved)
	}
	obs.mu.Unlock()
	h.checkpoint("a", ranks[1:], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 2)
	h.settle("a")
	obs.mu.Lock()
	if len(obs.saved) != 1 || obs.saved[0] != 4 {
		t.Errorf("CheckpointSaved = %v, want one call with the slowest save, 4", obs.saved)
	}
	obs.mu.Unlock()

	if _, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "b"}); err != nil {
		t.Fatal(err)
	}
	live := h.e.MetricRuns(0)
	if len(live) != 1 || live[0].Run.GetRunId() != "a" {
		t.Fatalf("MetricRuns(0) = %v, want only run a", live)
	}
	if d := live[0].LastDecision; d.GetStep() != 1 || d.GetAction() != v1.StepAction_STEP_ACTION_CONTINUE || d.GetInputs().GetMustSaveBy() == nil {
		t.Errorf("LastDecision = %v, want step 1 CONTINUE with its inputs", d)
	}
}
