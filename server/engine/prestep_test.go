package engine

import (
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// preStepSpec: turn level, B = t0 + 1h, C = 60, R = 30, M = 10 (priors), so
// the pre-step deadline is B - (C + R + M) = t0 + 1h - 100s.
func preStepSpec() *v1.RunSpec {
	s := turnSpec(1, "00:01:00:00")
	s.Reserve = &v1.ReserveSpec{MarginSeconds: 10, ExpectedCheckpointSeconds: ptr(60.0), ExpectedSnapshotSeconds: ptr(30.0)}
	return s
}

var preStepAt = t0.Add(time.Hour - 100*time.Second)

// With snapshots enabled and no step completed by B - (C + R + M), the
// bootstrap state is saved: SaveAtDeadline{anchor 0} to the environment
// workers, SNAPSHOTTING, then STOPPED once they saved.
func TestPreStepDeadline(t *testing.T) {
	h := newHarness(t)
	h.create("r", preStepSpec())
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 2)
	all := append(append([]string(nil), ranks...), envs...)

	h.advance(preStepAt.Add(-time.Nanosecond).Sub(h.clk.Now()), "r", all...)
	h.wantState("r", v1.RunState_RUN_STATE_PENDING)
	if n := len(h.commands("r", envs[0])); n != 0 {
		t.Fatalf("%d commands before the pre-step deadline", n)
	}
	h.advance(time.Nanosecond, "r", all...)

	run := h.wantState("r", v1.RunState_RUN_STATE_SNAPSHOTTING)
	if run.FireKind != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_PRE_STEP || run.FiredAtStep != 0 || !run.FiredAt.AsTime().Equal(preStepAt) {
		t.Fatalf("fired %v at step %d at %v", run.FireKind, run.FiredAtStep, run.FiredAt.AsTime())
	}
	cmd := h.saveAtDeadline("r", envs...)
	if cmd.AnchorStep != 0 || !cmd.MustFinishBy.AsTime().Equal(t0.Add(time.Hour)) {
		t.Fatalf("SaveAtDeadline %v, want anchor 0 and must_finish_by B", cmd)
	}
	if cmds := h.commands("r", ranks[0]); len(cmds) != 0 {
		t.Fatalf("trainer got %v", cmds)
	}
	if evs := h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_FIRED); len(evs) != 1 || evs[0].Step != 0 {
		t.Fatalf("DEADLINE_FIRED events %v", evs)
	}
	// A first step completing now is told to stop.
	if d := h.step("r", ranks[0], 1, 10); d.Action != v1.StepAction_STEP_ACTION_STOP {
		t.Fatalf("first step after the pre-step deadline: %v", d.Action)
	}

	h.advance(20*time.Second, "r", all...)
	h.reportAll("r", envs[:1], cmd.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.wantState("r", v1.RunState_RUN_STATE_SNAPSHOTTING)
	h.reportAll("r", envs[1:], cmd.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
	if len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_WARNING)) != 0 {
		t.Fatal("warning after a clean pre-step save")
	}
	h.wantStopLast("r", all...)
}

// A stale deadline wait saves nothing: the first step completed before the
// pre-step time, so passing it (and B) issues nothing.
func TestPreStepStaleWait(t *testing.T) {
	h := newHarness(t)
	h.create("r", preStepSpec())
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 1)
	all := append(append([]string(nil), ranks...), envs...)

	h.advance(10*time.Minute, "r", all...)
	if a := h.stepAll("r", ranks, 1, 60); a != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 1: %v", a)
	}
	h.advance(preStepAt.Sub(h.clk.Now()), "r", all...)
	h.advance(2*time.Hour, "r", all...)
	run := h.wantState("r", v1.RunState_RUN_STATE_RUNNING)
	if run.FiredAt != nil || len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_FIRED)) != 0 {
		t.Fatalf("the stale pre-step deadline fired: %v", run)
	}
	if cmds := h.commands("r", envs[0]); len(cmds) != 0 || len(h.snapshots("r")) != 0 {
		t.Fatalf("the stale pre-step deadline issued %v", cmds)
	}
	// The next step fires normally, anchored to its checkpoint.
	if a := h.stepAll("r", ranks, 2, 1); a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 2 past B: %v", a)
	}
	h.checkpoint("r", ranks, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 1)
	if cmd := h.saveAtDeadline("r", envs...); cmd.AnchorStep != 2 {
		t.Fatalf("SaveAtDeadline %v", cmd)
	}
}

// Without environment snapshots there is no pre-step deadline.
func TestNoPreStepWithoutSnapshots(t *testing.T) {
	h := newHarness(t)
	spec := preStepSpec()
	spec.RolloutRecovery.TargetLevel = v1.TargetLevel_TARGET_LEVEL_SIBLING
	h.create("r", spec)
	envs := h.envs("r", 1)
	h.advance(2*time.Hour, "r", envs...)
	if run := h.wantState("r", v1.RunState_RUN_STATE_PENDING); run.FiredAt != nil {
		t.Fatalf("fired: %v", run)
	}
	if cmds := h.commands("r", envs[0]); len(cmds) != 0 {
		t.Fatalf("commands %v", cmds)
	}
}

// The pre-step deadline follows R: a long snapshot before the first step
// moves it earlier.
func TestPreStepFollowsReserve(t *testing.T) {
	h := newHarness(t)
	spec := preStepSpec()
	spec.RolloutCheckpointing = &v1.RolloutCheckpointingSpec{SnapshotAttemptIntervalS: ptr[int32](600)}
	h.create("r", spec)
	envs := h.envs("r", 1)

	h.advance(10*time.Minute, "r", envs...) // the first interval snapshot
	s := h.lastSnapshot("r")
	h.advance(200*time.Second, "r", envs...)
	h.reportAll("r", envs, s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	// R = 200: B - (60 + 200 + 10) s.
	at := t0.Add(time.Hour - 270*time.Second)
	if d := h.get("r").Deadline; d.SaveReserveSeconds != 200 {
		t.Fatalf("R = %v", d.SaveReserveSeconds)
	}
	// Later ticks find nothing new (SKIPPED does not feed R).
	for tick := 20 * time.Minute; tick <= 50*time.Minute; tick += 10 * time.Minute {
		h.advance(t0.Add(tick).Sub(h.clk.Now()), "r", envs...)
		h.reportAll("r", envs, h.lastSnapshot("r").SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED)
	}
	h.advance(at.Add(-time.Nanosecond).Sub(h.clk.Now()), "r", envs...)
	h.wantState("r", v1.RunState_RUN_STATE_PENDING)
	h.advance(time.Nanosecond, "r", envs...)
	run := h.wantState("r", v1.RunState_RUN_STATE_SNAPSHOTTING)
	if !run.FiredAt.AsTime().Equal(at) {
		t.Fatalf("fired at %v, want %v", run.FiredAt.AsTime(), at)
	}
}

// A pre-step deadline with no environment worker live stops the run with a
// warning: there was nobody to save.
func TestPreStepWithNoEnvironmentWorker(t *testing.T) {
	h := newHarness(t)
	h.create("r", preStepSpec())
	h.clk.Advance(time.Hour)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
	if len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_WARNING)) != 1 {
		t.Fatal("want a warning")
	}
}
