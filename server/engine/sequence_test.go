package engine

import (
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// The whole deadline sequence at turn level: steps continue while they fit,
// the step that would overrun B saves and stops, the trainer checkpoint is
// followed by a forced SaveAtDeadline to every environment worker, and the
// run stops once all of them saved.
func TestDeadlineSequenceTurnLevel(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(2, "00:01:00:00")) // B = t0 + 1h
	ranks := h.trainers("r", 2)
	envs := h.envs("r", 3)

	step := int64(0)
	for {
		step++
		h.advance(10*time.Minute, "r", append(ranks, envs...)...)
		if a := h.stepAll("r", ranks, step, 600); a != v1.StepAction_STEP_ACTION_CONTINUE {
			if a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
				t.Fatalf("step %d: %v", step, a)
			}
			break
		}
	}
	// now+I = t0 + 10m*step + 10m must reach B = t0 + 60m: step 5.
	if step != 5 {
		t.Fatalf("fired at step %d, want 5", step)
	}
	if got := h.get("r"); got.State != v1.RunState_RUN_STATE_SAVING || got.FiredAtStep != 5 {
		t.Fatalf("after fire: state %v fired_at_step %d", got.State, got.FiredAtStep)
	}
	if d := h.step("r", ranks[0], 6, 1); d.Action != v1.StepAction_STEP_ACTION_STOP {
		t.Fatalf("step after fire: %v", d.Action)
	}

	h.checkpoint("r", ranks, 5, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 30)
	run := h.get("r")
	if run.State != v1.RunState_RUN_STATE_SNAPSHOTTING || run.LastPublishedStep != 5 {
		t.Fatalf("after checkpoint: state %v published %d", run.State, run.LastPublishedStep)
	}
	h.settle("r")
	var snap *v1.SaveAtDeadlineCommand
	for _, w := range envs {
		cmds := h.poll("r", w, 0)
		if len(cmds) != 1 || cmds[0].GetSaveAtDeadline() == nil {
			t.Fatalf("env %s got %v, want one SaveAtDeadline", w, cmds)
		}
		snap = cmds[0].GetSaveAtDeadline()
	}
	if snap.AnchorStep != 5 || !snap.MustFinishBy.AsTime().Equal(t0.Add(time.Hour)) {
		t.Fatalf("SaveAtDeadline %v", snap)
	}
	if cmds := h.poll("r", ranks[0], 0); len(cmds) != 0 {
		t.Fatalf("trainer got environment commands: %v", cmds)
	}
	h.clk.Advance(2 * time.Second)
	for _, w := range envs {
		if err := h.report("r", w, snap.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 2); err != nil {
			t.Fatal(err)
		}
	}
	run = h.get("r")
	if run.State != v1.RunState_RUN_STATE_STOPPED {
		t.Fatalf("state %v, want STOPPED", run.State)
	}
	if run.Deadline.SaveReserveSeconds != 2 || run.Deadline.CheckpointSeconds != 30 {
		t.Fatalf("estimates %v", run.Deadline)
	}
	h.settle("r")
	for _, w := range append(ranks, envs...) {
		cmds := h.poll("r", w, 0)
		if last := cmds[len(cmds)-1]; last.GetStop() == nil {
			t.Fatalf("worker %s: last command %v, want Stop", w, last)
		}
	}
	// A restart changes no decision and no state.
	h.restart()
	if d := h.step("r", ranks[1], 5, 600); d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("after restart step 5: %v", d.Action)
	}
	if got := h.get("r"); got.State != v1.RunState_RUN_STATE_STOPPED {
		t.Fatalf("after restart: %v", got.State)
	}
}
