package engine

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// fireAtStepOne creates a run whose deadline fires at step 1 (an iteration
// as long as the budget) and returns its ranks.
func fireAtStepOne(t *testing.T, h *harness, spec *v1.RunSpec) []string {
	t.Helper()
	h.create("r", spec)
	ranks := h.trainers("r", int(spec.TrainerWorldSize))
	if a := h.stepAll("r", ranks, 1, 3600); a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 1: %v, want SAVE_AND_STOP", a)
	}
	return ranks
}

// A rank that never saves the fired step's checkpoint does not leave the
// run SAVING forever: at B it fails, naming the late rank, and every worker
// is told to stop.
func TestDeadlineSaveNotDoneByB(t *testing.T) {
	h := newHarness(t)
	ranks := fireAtStepOne(t, h, &v1.RunSpec{TrainerWorldSize: 3,
		Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00"}})
	h.checkpoint("r", []string{ranks[0], ranks[2]}, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 10)

	h.clk.Advance(time.Hour - time.Second)
	if got := h.get("r"); got.State != v1.RunState_RUN_STATE_SAVING {
		t.Fatalf("before B: %v, want SAVING", got.State)
	}
	h.clk.Advance(time.Second)
	got := h.get("r")
	if got.State != v1.RunState_RUN_STATE_FAILED {
		t.Fatalf("at B: %v, want FAILED", got.State)
	}
	if msg := got.FailureMessage; !strings.Contains(msg, "rank 1 (") || strings.Contains(msg, "rank 0") || !strings.Contains(msg, "rank-ab") {
		t.Fatalf("failure_message %q: want rank 1 (rank-ab) named, and only it", msg)
	}
	h.settle("r")
	cmds := h.poll("r", ranks[1], 0)
	if len(cmds) == 0 || cmds[len(cmds)-1].GetStop() == nil {
		t.Fatalf("rank 1 commands %v, want a Stop last", cmds)
	}
}

// With deferred finalize, a checkpoint saved by every rank but never
// published by B fails the run, saying so; the bound survives a restart
// during which it falls due, and is applied once the restart grace has
// passed.
func TestDeadlineSaveNotPublishedByBAcrossRestart(t *testing.T) {
	h := newHarness(t)
	ranks := fireAtStepOne(t, h, &v1.RunSpec{TrainerWorldSize: 2,
		Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00", DeferredFinalize: true}})
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 10)

	h.close()
	h.clk.Advance(2 * time.Hour) // B passes while the coordinator is down
	h.open()
	h.clk.Advance(h.e.opts.RestartGrace - time.Millisecond)
	h.wantState("r", v1.RunState_RUN_STATE_SAVING)
	h.clk.Advance(time.Millisecond)
	got := h.get("r")
	if got.State != v1.RunState_RUN_STATE_FAILED || !strings.Contains(got.FailureMessage, "not published") {
		t.Fatalf("after restart past B: %v %q, want FAILED, not published", got.State, got.FailureMessage)
	}
}

// Ranks that saved by B while the coordinator was down retry their reports
// once it is back: within the restart grace they count, and the run stops
// as it should, instead of failing because the coordinator crashed.
func TestDeadlineSaveReportedAfterRestartWithinGrace(t *testing.T) {
	h := newHarness(t)
	ranks := fireAtStepOne(t, h, &v1.RunSpec{TrainerWorldSize: 2,
		Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00"}})
	h.checkpoint("r", ranks[:1], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 10)

	h.down(2 * time.Hour) // B passes while the coordinator is down
	h.clk.Advance(h.e.opts.RestartGrace - time.Millisecond)
	h.checkpoint("r", ranks[1:], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 10)
	h.clk.Advance(time.Hour)
	if got := h.get("r"); got.State != v1.RunState_RUN_STATE_STOPPED {
		t.Fatalf("%v %q, want STOPPED", got.State, got.FailureMessage)
	}
}

// A save that completes in time is not touched by the bound.
func TestDeadlineSaveInTimeIsNotFailed(t *testing.T) {
	h := newHarness(t)
	ranks := fireAtStepOne(t, h, &v1.RunSpec{TrainerWorldSize: 2,
		Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00"}})
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 10)
	h.clk.Advance(2 * time.Hour)
	if got := h.get("r"); got.State != v1.RunState_RUN_STATE_STOPPED {
		t.Fatalf("%v %q, want STOPPED", got.State, got.FailureMessage)
	}
}

// Ranks that save a step's checkpoint before asking about it: when that
// step fires, the deadline save goes on at once (the deadline snapshot, a
// PublishCheckpoint with deferred finalize, or the stop), rather than wait
// for SAVED reports that will not come and fail the run at B.
func TestDeadlineSaveOfAStepSavedBeforeItFired(t *testing.T) {
	for _, tc := range []struct {
		name     string
		level    v1.TargetLevel
		deferred bool
		want     v1.RunState
	}{
		{"no snapshots", v1.TargetLevel_TARGET_LEVEL_SIBLING, false, v1.RunState_RUN_STATE_STOPPED},
		{"snapshots", v1.TargetLevel_TARGET_LEVEL_TURN, false, v1.RunState_RUN_STATE_SNAPSHOTTING},
		{"deferred finalize", v1.TargetLevel_TARGET_LEVEL_SIBLING, true, v1.RunState_RUN_STATE_SAVING},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.create("r", &v1.RunSpec{TrainerWorldSize: 2,
				Checkpointing:   &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00", DeferredFinalize: tc.deferred},
				RolloutRecovery: &v1.RolloutRecoverySpec{TargetLevel: tc.level}})
			ranks := h.trainers("r", 2)
			envs := h.envs("r", 1)
			h.stepAll("r", ranks, 1, 10)
			h.checkpoint("r", ranks, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5) // before anyone asks about step 2
			if a := h.stepAll("r", ranks, 2, 3600); a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
				t.Fatalf("step 2: %v, want SAVE_AND_STOP", a)
			}
			h.checkpoint("r", ranks, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5) // as told: a retry
			h.wantState("r", tc.want)
			switch tc.want {
			case v1.RunState_RUN_STATE_SNAPSHOTTING:
				if sd := h.saveAtDeadline("r", envs...); sd.AnchorStep != 2 {
					t.Fatalf("SaveAtDeadline anchored to step %d, want 2", sd.AnchorStep)
				}
			case v1.RunState_RUN_STATE_SAVING:
				h.settle("r")
				var published []int64
				for _, c := range h.poll("r", ranks[0], 0) {
					if p := c.GetPublishCheckpoint(); p != nil {
						published = append(published, p.Step)
					}
				}
				if len(published) != 1 || published[0] != 2 {
					t.Fatalf("PublishCheckpoint commands for steps %v, want [2]", published)
				}
				h.checkpoint("r", ranks[:1], 2, v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED, 0)
				h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
			}
		})
	}
}
