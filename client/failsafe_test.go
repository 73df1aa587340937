package client_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
)

// A short plan, so that a rank goes its own way in a fraction of a second.
var shortFailSafe = client.FailSafeConfig{Wait: 300 * time.Millisecond, Probe: 100 * time.Millisecond}

func startFailSafeTrainer(t *testing.T, cl *client.Client, rank int32, fs client.FailSafeConfig) (*client.Trainer, *logsink.Recorder) {
	t.Helper()
	logs := &logsink.Recorder{}
	tr, err := cl.StartTrainer(t.Context(), client.TrainerConfig{RunID: "r1", Rank: rank, Logger: logs.Logger(), FailSafe: &fs})
	if err != nil {
		t.Fatalf("StartTrainer(%d): %v", rank, err)
	}
	t.Cleanup(func() { closeWorker(t, tr) })
	return tr, logs
}

func step(t *testing.T, tr *client.Trainer, n int64) *v1.Decision {
	t.Helper()
	d, err := tr.CompleteStep(t.Context(), n, time.Second)
	if err != nil {
		t.Fatalf("CompleteStep(%d): %v", n, err)
	}
	return d
}

// A rank that could not reach the coordinator went on by its plan while
// the other rank heard SAVE_AND_STOP for the same step: the step keeps the
// coordinator's decision, the rank is told so in an ERROR, and its next
// step follows the run (STOP).
func TestTrainerFailSafeStepDecidedOtherwiseLogsAnError(t *testing.T) {
	co := startCoordinator(t)
	cl := co.createRun("r1", turnSpec(2))
	a, logs := startFailSafeTrainer(t, cl, 0, shortFailSafe)
	b, _ := startFailSafeTrainer(t, cl, 1, shortFailSafe)
	step(t, a, 1)
	step(t, b, 1)

	co.gate.set(func(g *gate) { g.failNext["CompleteStep"] = 1 << 20 })
	if d := step(t, a, 2); d.GetAction() != v1.StepAction_STEP_ACTION_CONTINUE || !strings.HasPrefix(d.GetExplanation(), "decided by this rank") {
		t.Fatalf("rank 0 out of reach, step 2: %v (%s), want its own CONTINUE", d.GetAction(), d.GetExplanation())
	}
	co.gate.set(func(g *gate) { g.failNext["CompleteStep"] = 0 })
	if _, err := co.dial("").Runs.TriggerDeadline(t.Context(), &v1.TriggerDeadlineRequest{RunId: "r1", Reason: "test"}); err != nil {
		t.Fatalf("TriggerDeadline: %v", err)
	}
	if d := step(t, b, 2); d.GetAction() != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("rank 1, step 2: %v (%s), want SAVE_AND_STOP", d.GetAction(), d.GetExplanation())
	}

	if d := step(t, a, 3); d.GetAction() != v1.StepAction_STEP_ACTION_STOP || strings.HasPrefix(d.GetExplanation(), "decided by this rank") {
		t.Fatalf("rank 0 back, step 3: %v (%s), want the coordinator's STOP", d.GetAction(), d.GetExplanation())
	}
	if errs := logs.At(slog.LevelError); len(errs) != 1 || !strings.Contains(errs[0], "decided a step otherwise") {
		t.Errorf("rank 0 logged ERRORs %q, want one saying step 2 was decided otherwise", errs)
	}
	if warns := logs.At(slog.LevelWarn); len(warns) != 2 {
		t.Errorf("rank 0 logged WARNINGs %q, want two: out of reach, back", warns)
	}
}

// With the plan off, or before the rank's first answered step (nothing to
// plan from), a coordinator out of reach is the caller's error.
func TestTrainerFailSafeOffOrWithoutADecisionReturnsTheError(t *testing.T) {
	co := startCoordinator(t)
	created, err := co.dial("").Runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "r1", Spec: turnSpec(2)})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	// Two attempts: the plan off, the retry policy is all the wait.
	cl := co.dial(created.GetRunToken(), client.WithRetry(client.RetryPolicy{MaxAttempts: 2}))
	off := shortFailSafe
	off.Off = true
	a, _ := startFailSafeTrainer(t, cl, 0, off)
	b, _ := startFailSafeTrainer(t, cl, 1, shortFailSafe)
	step(t, a, 1)
	co.gate.set(func(g *gate) { g.failNext["CompleteStep"] = 1 << 20 })
	if _, err := a.CompleteStep(t.Context(), 2, time.Second); status.Code(err) != codes.Unavailable {
		t.Errorf("the plan off: CompleteStep out of reach returned %v, want UNAVAILABLE", err)
	}
	// Retried until the plan's wait, which bounds it: DEADLINE_EXCEEDED.
	if _, err := b.CompleteStep(t.Context(), 1, time.Second); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("no step answered yet: CompleteStep out of reach returned %v, want DEADLINE_EXCEEDED", err)
	}
}

// A rank process started again (a requeue) learns where the run's newest
// checkpoint is, to number its next step after it.
func TestTrainerLastCheckpointStep(t *testing.T) {
	co := startCoordinator(t)
	cl := co.createRun("r1", turnSpec(2))
	ranks := []*client.Trainer{startTrainer(t, cl, 0), startTrainer(t, cl, 1)}
	if got := ranks[0].LastCheckpointStep(); got != 0 {
		t.Fatalf("a fresh run: LastCheckpointStep %d, want 0", got)
	}
	for _, tr := range ranks {
		step(t, tr, 1)
		step(t, tr, 2)
		if _, err := tr.ReportCheckpoint(t.Context(), 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, time.Second); err != nil {
			t.Fatalf("ReportCheckpoint: %v", err)
		}
	}
	again := startTrainer(t, cl, 0)
	if got := again.LastCheckpointStep(); got != 2 {
		t.Errorf("rank 0 started again after both ranks saved step 2: LastCheckpointStep %d, want 2", got)
	}
}
