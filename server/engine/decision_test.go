package engine

import (
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// askAll has every rank ask about the step at the same time and returns
// their answers, by rank.
func (h *harness) askAll(run string, ranks []string, step int64, iter func(rank int) float64) []*v1.Decision {
	h.t.Helper()
	out := make([]*v1.Decision, len(ranks))
	errs := make([]error, len(ranks))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, w := range ranks {
		wg.Go(func() {
			<-start
			resp, err := h.e.CompleteStep(h.ctx, &v1.CompleteStepRequest{RunId: run, WorkerId: w, Step: step, IterationSeconds: iter(i)})
			if err == nil {
				out[i] = resp.Decision
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			h.t.Fatalf("rank %d CompleteStep(%d): %v", i, step, err)
		}
	}
	return out
}

func wantOneDecision(t *testing.T, ds []*v1.Decision) *v1.Decision {
	t.Helper()
	for i, d := range ds {
		if !proto.Equal(d, ds[0]) {
			t.Fatalf("rank %d got %v, rank 0 got %v", i, d, ds[0])
		}
	}
	return ds[0]
}

// 64 ranks asking about the same step concurrently all get one decision,
// made once, whichever rank came first; one DECISION event per step.
func TestConcurrentRanksOneDecision(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{TrainerWorldSize: 64, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00"}})
	ranks := h.trainers("r", 64)

	var last *v1.Decision
	for step := int64(1); ; step++ {
		h.advance(10*time.Minute, "r", ranks...)
		// Ranks report different iteration times: the decision is the
		// first asker's, whoever that was, and every rank hears it.
		d := wantOneDecision(t, h.askAll("r", ranks, step, func(rank int) float64 { return 300 + float64(rank) }))
		if d.Step != step {
			t.Fatalf("decision for step %d says step %d", step, d.Step)
		}
		// Every rank's iteration was recorded: I is the max over ranks.
		if i := h.get("r").Deadline.IterationSeconds; i != 363 {
			t.Fatalf("step %d: I = %v, want 363", step, i)
		}
		if d.Action != v1.StepAction_STEP_ACTION_CONTINUE {
			last = d
			break
		}
		if step > 10 {
			t.Fatal("the deadline never fired")
		}
	}
	// now + I reaches B = t0 + 60m at step 6 (t0 + 60m - 363 s <= t0 + 60m).
	if last.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP || last.Step != 6 {
		t.Fatalf("fired %v at step %d, want SAVE_AND_STOP at 6", last.Action, last.Step)
	}
	if n := len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DECISION)); n != 6 {
		t.Fatalf("%d DECISION events for 6 steps", n)
	}
	if n := len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_FIRED)); n != 1 {
		t.Fatalf("%d DEADLINE_FIRED events", n)
	}
	// The next step is STOP for everyone, concurrently too.
	if d := wantOneDecision(t, h.askAll("r", ranks, 7, func(int) float64 { return 1 })); d.Action != v1.StepAction_STEP_ACTION_STOP {
		t.Fatalf("step 7: %v", d.Action)
	}
}

// A coordinator restart between two ranks' calls does not change the
// decision, whether it was CONTINUE (the clock has since passed B) or
// SAVE_AND_STOP.
func TestDecisionSurvivesRestart(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{TrainerWorldSize: 64, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00"}})
	ranks := h.trainers("r", 64)

	h.advance(10*time.Minute, "r", ranks...)
	cont := wantOneDecision(t, h.askAll("r", ranks[:32], 1, func(int) float64 { return 600 }))
	if cont.Action != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 1: %v", cont.Action)
	}
	h.restart()
	h.advance(2*time.Hour, "r", ranks...) // past B: a fresh decision would fire
	if d := wantOneDecision(t, h.askAll("r", ranks[32:], 1, func(int) float64 { return 600 })); !proto.Equal(d, cont) {
		t.Fatalf("after restart step 1: %v, before %v", d, cont)
	}

	fire := h.step("r", ranks[5], 2, 600)
	if fire.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 2: %v", fire.Action)
	}
	h.restart()
	h.advance(time.Minute, "r", ranks...)
	if d := wantOneDecision(t, h.askAll("r", ranks, 2, func(int) float64 { return 1 })); !proto.Equal(d, fire) {
		t.Fatalf("after restart step 2: %v, before %v", d, fire)
	}
	if run := h.get("r"); run.State != v1.RunState_RUN_STATE_SAVING || run.FiredAtStep != 2 {
		t.Fatalf("after restart: %v at step %d", run.State, run.FiredAtStep)
	}
	if n := len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DECISION)); n != 2 {
		t.Fatalf("%d DECISION events for 2 steps", n)
	}
}

// In a terminal run every rank that asks about a new step gets the same
// STOP decision, at any time and across a restart.
func TestTerminalRunStopIsIdentical(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{TrainerWorldSize: 2})
	ranks := h.trainers("r", 2)
	h.stepAll("r", ranks, 1, 10)
	if _, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	n := len(h.events("r"))
	first := h.step("r", ranks[0], 2, 10)
	if first.Action != v1.StepAction_STEP_ACTION_STOP || first.Step != 2 {
		t.Fatalf("step 2 in a cancelled run: %v", first)
	}
	h.advance(time.Minute, "r", ranks...)
	if d := h.step("r", ranks[1], 2, 99); !proto.Equal(d, first) {
		t.Fatalf("rank 1 got %v, rank 0 got %v", d, first)
	}
	h.restart()
	h.advance(time.Minute, "r", ranks...)
	if d := h.step("r", ranks[1], 2, 10); !proto.Equal(d, first) {
		t.Fatalf("after restart rank 1 got %v, rank 0 got %v", d, first)
	}
	// Step 1, decided before the run ended, keeps its answer.
	if d := h.step("r", ranks[1], 1, 10); d.Action != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 1 after the run ended: %v", d.Action)
	}
	if got := len(h.events("r")); got != n {
		t.Fatalf("questions to a terminal run added %d events", got-n)
	}
}

// A first question about a step before the fired one (a rank that was
// behind) is CONTINUE: the ranks must reach the fired step together.
func TestLateQuestionBeforeFiredStep(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{TrainerWorldSize: 1, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00"}})
	ranks := h.trainers("r", 1)
	h.advance(time.Minute, "r", ranks...)
	if d := h.step("r", ranks[0], 5, 3600); d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 5: %v", d.Action)
	}
	if d := h.step("r", ranks[0], 3, 10); d.Action != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 3 asked after the fire at 5: %v", d.Action)
	}
	if d := h.step("r", ranks[0], 6, 10); d.Action != v1.StepAction_STEP_ACTION_STOP {
		t.Fatalf("step 6: %v", d.Action)
	}
}

// A step whose now + I lands on B exactly saves, though 1.8 + 8.2 added as
// floats, or 8.2 s truncated to nanoseconds, comes out a nanosecond short.
func TestStepEndingAtBExactlySaves(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{TrainerWorldSize: 1, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:00:00:10"}})
	ranks := h.trainers("r", 1)
	h.clk.Advance(1800 * time.Millisecond)
	if d := h.step("r", ranks[0], 1, 8.2); d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 1 at B - 8.2 s with an 8.2 s iteration: %v (%s)", d.Action, d.Explanation)
	}
}

// A step more than one past the run's last is refused, naming the field: a
// wrong step number (a sample count) must not fire the deadline at a step
// no rank reaches, nor publish a checkpoint every later one seems older
// than. The first step may be any (a run resumed from a checkpoint), and a
// rank may checkpoint the step it is about to ask about.
func TestStepFarAheadIsRefused(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(2, "00:01:00:00"))
	ranks := h.trainers("r", 2)
	h.stepAll("r", ranks, 5001, 10) // resumed from the checkpoint of step 5000
	_, err := h.e.CompleteStep(h.ctx, &v1.CompleteStepRequest{RunId: "r", WorkerId: ranks[1], Step: 1_000_000_000_000, IterationSeconds: 3600})
	wantErr(t, err, ErrFailedPrecondition, "step:")
	_, err = h.e.ReportCheckpoint(h.ctx, &v1.ReportCheckpointRequest{RunId: "r", WorkerId: ranks[0], Step: 9000,
		Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 1})
	wantErr(t, err, ErrFailedPrecondition, "step:")
	h.checkpoint("r", ranks, 5002, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 1) // saved, then asked about
	if a := h.stepAll("r", ranks, 5002, 10); a != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 5002: %v", a)
	}
	run := h.get("r")
	if run.LastStep != 5002 || run.LastPublishedStep != 5002 || run.FiredAt != nil {
		t.Fatalf("after the refused steps: last step %d, published %d, fired %v", run.LastStep, run.LastPublishedStep, run.FiredAt)
	}
}
