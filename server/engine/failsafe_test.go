package engine

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// stepActed reports a step a rank already acted on while the coordinator was
// out of its reach.
func (h *harness) stepActed(run, worker string, step int64, iter float64, acted v1.StepAction) *v1.Decision {
	h.t.Helper()
	resp, err := h.e.CompleteStep(h.ctx, &v1.CompleteStepRequest{RunId: run, WorkerId: worker, Step: step, IterationSeconds: iter, LocalAction: acted})
	if err != nil {
		h.t.Fatalf("CompleteStep %d (acted %v): %v", step, acted, err)
	}
	return resp.Decision
}

// Ranks that lost the coordinator report, once it is back, the steps they
// went on with and the step they saved at. The run then records that save as
// its deadline save, and the environment snapshot follows, anchored to the
// checkpoint the ranks actually wrote.
func TestStepsActedOnLocallyBecomeTheDecisions(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(2, "00:01:00:00"))
	ranks := h.trainers("r", 2)
	envs := h.envs("r", 1)
	if a := h.stepAll("r", ranks, 1, 10); a != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 1: %v", a)
	}
	// Steps 2 and 3 were decided by the ranks while the coordinator was
	// gone; the rule itself would say continue at both (an hour left).
	for _, w := range ranks {
		if d := h.stepActed("r", w, 2, 10, v1.StepAction_STEP_ACTION_CONTINUE); d.Action != v1.StepAction_STEP_ACTION_CONTINUE {
			t.Fatalf("step 2 acted CONTINUE: got %v", d)
		}
	}
	for i, w := range ranks {
		d := h.stepActed("r", w, 3, 10, v1.StepAction_STEP_ACTION_SAVE_AND_STOP)
		if d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP || !strings.Contains(d.Explanation, "rank 0 could not reach the coordinator") {
			t.Fatalf("rank %d, step 3 acted SAVE_AND_STOP: got %v %q", i, d.Action, d.Explanation)
		}
	}
	run := h.wantState("r", v1.RunState_RUN_STATE_SAVING)
	if run.FireKind != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_LOCAL || run.FiredAtStep != 3 {
		t.Fatalf("fired %v at step %d, want LOCAL at 3", run.FireKind, run.FiredAtStep)
	}
	h.checkpoint("r", ranks, 3, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 2)
	snap := h.lastSnapshot("r")
	if snap.Reason != v1.SnapshotReason_SNAPSHOT_REASON_DEADLINE || snap.AnchorStep != 3 {
		t.Fatalf("snapshot %v anchored at %d, want the deadline snapshot of step 3", snap.Reason, snap.AnchorStep)
	}
	h.reportAll("r", envs, snap.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
}

// A step the coordinator already decided keeps its decision whatever a rank
// says it did: another rank reached the coordinator in time, and its answer
// is the one every rank that asks gets.
func TestActedOnLocallyNeverContradictsAStoredDecision(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(2, "00:01:00:00"))
	ranks := h.trainers("r", 2)
	h.stepAll("r", ranks, 1, 10)
	first := h.step("r", ranks[0], 2, 10)
	got := h.stepActed("r", ranks[1], 2, 10, v1.StepAction_STEP_ACTION_SAVE_AND_STOP)
	if got.Action != first.Action || got.Explanation != first.Explanation {
		t.Fatalf("step 2: acted SAVE_AND_STOP got %v %q, want the stored %v", got.Action, got.Explanation, first.Action)
	}
	if run := h.get("r"); run.FiredAtStep != 0 {
		t.Fatalf("the deadline fired at step %d", run.FiredAtStep)
	}
}

// A hand trigger that waits for the next step does not turn a step the
// ranks already went on from into a save: it waits for the next one.
func TestActedContinueLeavesAPendingTriggerForTheNextStep(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, "00:01:00:00"))
	ranks := h.trainers("r", 1)
	h.stepAll("r", ranks, 1, 10)
	if _, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r", Reason: "operator"}); err != nil {
		t.Fatal(err)
	}
	if d := h.stepActed("r", ranks[0], 2, 10, v1.StepAction_STEP_ACTION_CONTINUE); d.Action != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 2: %v", d.Action)
	}
	if d := h.step("r", ranks[0], 3, 10); d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 3: %v, want the pending trigger's SAVE_AND_STOP", d.Action)
	}
}

// A resuming rank learns from its registration which checkpoint the run
// last completed, so a loop that restored it numbers its steps after it.
func TestRegistrationNamesTheLastCheckpoint(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, "00:01:00:00"))
	if got := h.registerAgain("r", "rank-aa", 0).LastCheckpointStep; got != 0 {
		t.Fatalf("before any checkpoint: %d", got)
	}
	ranks := h.trainers("r", 1)
	for s := int64(1); s <= 5; s++ {
		h.stepAll("r", ranks, s, 10)
	}
	h.checkpoint("r", ranks, 4, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 1)
	h.restart()
	if got := h.registerAgain("r", "rank-aa", 0).LastCheckpointStep; got != 4 {
		t.Fatalf("after a restart, a re-registering rank hears checkpoint step %d, want 4", got)
	}
}

// A rank that saves but never reports it is named while there is still
// time, once only the snapshot and the margin are left before B, and a rank
// that leaves without reporting is named at once, as the rank it was.
func TestUnreportedDeadlineCheckpointIsNamed(t *testing.T) {
	h := newHarness(t)
	spec := turnSpec(2, "00:01:00:00")
	spec.Reserve = &v1.ReserveSpec{MarginSeconds: 20, ExpectedCheckpointSeconds: ptr(40.0), ExpectedSnapshotSeconds: ptr(30.0)}
	h.create("r", spec)
	ranks := h.trainers("r", 2)
	h.stepAll("r", ranks, 1, 10)
	if _, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	h.stepAll("r", ranks, 2, 10)
	h.checkpoint("r", ranks[:1], 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 1)
	h.advance(time.Hour-50*time.Second-time.Second, "r", ranks...) // B - R - M
	if w := h.unreportedWarnings("r"); len(w) != 0 {
		t.Fatalf("a warning before C + M passed: %v", w)
	}
	h.advance(2*time.Second, "r", ranks...)
	warns := h.unreportedWarnings("r")
	if len(warns) != 1 || !strings.Contains(warns[0].Message, `rank 1 (`) || !strings.Contains(warns[0].Message, `"rank-ab", live)`) ||
		!strings.Contains(warns[0].Message, "checkpoint_saved()") {
		t.Fatalf("warnings %v, want one naming rank 1", warns)
	}
	if _, err := h.e.DeregisterWorker(h.ctx, &v1.DeregisterWorkerRequest{RunId: "r", WorkerId: ranks[1]}); err != nil {
		t.Fatal(err)
	}
	warns = h.unreportedWarnings("r")
	if len(warns) != 2 || !strings.Contains(warns[1].Message, `"rank-ab", left) left without reporting its checkpoint of step 2`) {
		t.Fatalf("warnings %v, want the second naming rank 1 as LEFT", warns)
	}
}

// unreportedWarnings are the run's warnings about a checkpoint not reported.
func (h *harness) unreportedWarnings(run string) []*v1.RunEvent {
	var out []*v1.RunEvent
	for _, ev := range h.eventsOf(run, v1.RunEventType_RUN_EVENT_TYPE_WARNING) {
		if strings.Contains(ev.Message, "without it the run fails at B") {
			out = append(out, ev)
		}
	}
	return out
}

// A rank that heard a step's decision before the coordinator went away waits
// at the next collective for the ranks that heard it only after the
// coordinator was back: its next iteration carries the outage, which must
// not become I for the rest of the run.
func TestAnOutageAtTheCollectivesIsNotAnIteration(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(2, "00:10:00:00"))
	ranks := h.trainers("r", 2)
	h.stepAll("r", ranks, 1, 10)
	h.advance(10*time.Second, "r", ranks...)
	h.step("r", ranks[0], 2, 10) // rank 0 hears step 2's decision
	h.advance(30*time.Second, "r", ranks...)
	h.step("r", ranks[1], 2, 10) // rank 1 only 30 s later (the coordinator was away)
	h.advance(10*time.Second, "r", ranks...)
	h.step("r", ranks[1], 3, 10)
	h.step("r", ranks[0], 3, 40) // 10 s of its own, 30 s waiting for rank 1
	if got := h.get("r").Deadline.IterationSeconds; got != 10 {
		t.Fatalf("I = %v s after the outage, want the 10 s the ranks computed", got)
	}
	// A rank that is merely slower still counts in full.
	h.advance(25*time.Second, "r", ranks...)
	h.step("r", ranks[0], 4, 25)
	h.step("r", ranks[1], 4, 25)
	if got := h.get("r").Deadline.IterationSeconds; got != 25 {
		t.Fatalf("I = %v s after a 25 s step, want 25", got)
	}
}
