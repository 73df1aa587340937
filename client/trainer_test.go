package client_test

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
)

func startTrainer(t *testing.T, cl *client.Client, rank int32) *client.Trainer {
	t.Helper()
	tr, err := cl.StartTrainer(t.Context(), client.TrainerConfig{RunID: "r1", Rank: rank, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("StartTrainer(%d): %v", rank, err)
	}
	t.Cleanup(func() { closeWorker(t, tr) })
	return tr
}

// Two ranks through the deadline sequence: identical decisions per step,
// checkpoint reports that may be repeated, and a Stop for both.
func TestTrainersShareDecisions(t *testing.T) {
	co := startCoordinator(t)
	cl := co.createRun("r1", turnSpec(2))
	admin := co.dial("")
	ranks := []*client.Trainer{startTrainer(t, cl, 0), startTrainer(t, cl, 1)}

	// exact: the decision is stored once, so every field is the same. A
	// terminal run answers STOP afresh to each rank (a new decided_at).
	decide := func(step int64, want v1.StepAction, exact bool) {
		t.Helper()
		var first *v1.Decision
		for i, tr := range ranks {
			d, err := tr.CompleteStep(t.Context(), step, time.Duration(i+1)*time.Second)
			if err != nil {
				t.Fatalf("rank %d CompleteStep(%d): %v", i, step, err)
			}
			if d.GetAction() != want || d.GetExplanation() == "" {
				t.Fatalf("rank %d step %d: %v (%q), want %v with an explanation", i, step, d.GetAction(), d.GetExplanation(), want)
			}
			if first == nil {
				first = d
			} else if exact && !proto.Equal(d, first) || d.GetExplanation() != first.GetExplanation() {
				t.Fatalf("step %d: rank 1 got %v, rank 0 got %v; want the same decision", step, d, first)
			}
		}
	}

	decide(1, v1.StepAction_STEP_ACTION_CONTINUE, true)
	if _, err := admin.Runs.TriggerDeadline(t.Context(), &v1.TriggerDeadlineRequest{RunId: "r1"}); err != nil {
		t.Fatalf("TriggerDeadline: %v", err)
	}
	decide(2, v1.StepAction_STEP_ACTION_SAVE_AND_STOP, true)
	for i, tr := range ranks {
		if _, err := tr.ReportCheckpoint(t.Context(), 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 3*time.Second); err != nil {
			t.Fatalf("rank %d ReportCheckpoint: %v", i, err)
		}
	}
	// No environment worker is live, so the deadline snapshot ends at once
	// and the run stops. A repeated report is still fine.
	for i, tr := range ranks {
		if stop := nextCommand(t, tr.Worker); stop.GetStop() == nil {
			t.Fatalf("rank %d got %v, want Stop", i, stop)
		}
	}
	state, err := ranks[0].ReportCheckpoint(t.Context(), 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 3*time.Second)
	if err != nil || state != v1.RunState_RUN_STATE_STOPPED {
		t.Fatalf("repeated ReportCheckpoint = %v, %v; want STOPPED, nil", state, err)
	}
	decide(3, v1.StepAction_STEP_ACTION_STOP, false)
	run, err := admin.Runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "r1"})
	if err != nil {
		t.Fatalf("GetRun: %v", err)
	}
	if got := run.GetRun().GetDeadline().GetCheckpointSeconds(); got != 3 {
		t.Errorf("C = %v, want the reported 3 s", got)
	}
}

func TestTrainerFinishRun(t *testing.T) {
	co := startCoordinator(t)
	cl := co.createRun("r1", turnSpec(1))
	tr := startTrainer(t, cl, 0)
	if _, err := tr.CompleteStep(t.Context(), 1, time.Second); err != nil {
		t.Fatalf("CompleteStep: %v", err)
	}
	for range 2 { // the second call is a retry: still OK
		if state, err := tr.FinishRun(t.Context()); err != nil || state != v1.RunState_RUN_STATE_COMPLETED {
			t.Fatalf("FinishRun = %v, %v; want COMPLETED", state, err)
		}
	}
	if stop := nextCommand(t, tr.Worker); stop.GetStop() == nil {
		t.Fatalf("got %v, want Stop", stop)
	}
}

// A trainer process replaced by another under the same rank cannot decide
// or report anything more: its calls fail with ErrSuperseded and it stops.
// A process whose own re-registration answer was lost repeats the call
// under the incarnation it then learns, and it goes through.
func TestSupersededTrainerCallsAreRefused(t *testing.T) {
	co := startCoordinator(t)
	cl := co.createRun("r1", turnSpec(1))
	old := startTrainer(t, cl, 0)
	replacement := startTrainer(t, cl, 0)

	if _, err := old.CompleteStep(t.Context(), 1, time.Second); !errors.Is(err, client.ErrSuperseded) {
		t.Fatalf("old process's CompleteStep: %v, want ErrSuperseded", err)
	}
	if _, err := old.ReportCheckpoint(t.Context(), 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, time.Second); !errors.Is(err, client.ErrSuperseded) {
		t.Fatalf("old process's ReportCheckpoint: %v, want ErrSuperseded", err)
	}
	if _, err := old.FinishRun(t.Context()); !errors.Is(err, client.ErrSuperseded) {
		t.Fatalf("old process's FinishRun: %v, want ErrSuperseded", err)
	}
	select {
	case _, ok := <-old.Commands():
		if ok {
			t.Fatal("the superseded trainer got a command")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the superseded trainer still runs after 15 s")
	}
	if err := old.Err(); !errors.Is(err, client.ErrSuperseded) {
		t.Fatalf("Err = %v, want ErrSuperseded", err)
	}

	// The replacement registers again and loses the answer: the coordinator
	// holds a newer incarnation than the process knows.
	inc := replacement.Incarnation()
	if _, err := cl.Workers.RegisterWorker(t.Context(), &v1.RegisterWorkerRequest{RunId: "r1", Role: v1.WorkerRole_WORKER_ROLE_TRAINER,
		Name: "rank-0", Rank: 0, Incarnation: inc}); err != nil {
		t.Fatal(err)
	}
	d, err := replacement.CompleteStep(t.Context(), 1, time.Second)
	if err != nil || d.GetAction() != v1.StepAction_STEP_ACTION_CONTINUE || replacement.Incarnation() != inc+1 {
		t.Fatalf("replacement's CompleteStep: %v, %v at incarnation %d; want CONTINUE at %d", d, err, replacement.Incarnation(), inc+1)
	}
	if err := replacement.Err(); err != nil {
		t.Fatalf("replacement's Err = %v", err)
	}
}

// An action this client does not know (a newer coordinator's) comes back
// as ErrUnknownAction with the decision, never as a bare decision that a
// loop checking for SAVE_AND_STOP would read as CONTINUE.
func TestTrainerUnknownAction(t *testing.T) {
	co := startCoordinator(t)
	cl := co.createRun("r1", turnSpec(1))
	tr := startTrainer(t, cl, 0)
	answer := func(a v1.StepAction) {
		co.gate.set(func(g *gate) {
			g.alter = func(name string, resp any) {
				if r, ok := resp.(*v1.CompleteStepResponse); ok {
					// A copy: the coordinator answers with the decision it stores.
					r.Decision = proto.Clone(r.Decision).(*v1.Decision)
					r.Action, r.Decision.Action = a, a
				}
			}
		})
	}
	answer(9)
	d, err := tr.CompleteStep(t.Context(), 1, time.Second)
	if !errors.Is(err, client.ErrUnknownAction) || d.GetAction() != 9 || d.GetStep() != 1 {
		t.Fatalf("CompleteStep answered action 9: %v, %v; want the decision and ErrUnknownAction", d, err)
	}
	answer(v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE) // known: a safety save
	if d, err := tr.CompleteStep(t.Context(), 1, time.Second); err != nil || d.GetAction() != v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE {
		t.Fatalf("CompleteStep answered SAVE_AND_CONTINUE: %v, %v", d, err)
	}
	co.gate.set(func(g *gate) { g.alter = nil })
	if d, err := tr.CompleteStep(t.Context(), 1, time.Second); err != nil || d.GetAction() != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("the same step as stored: %v, %v; want CONTINUE", d, err)
	}
}
