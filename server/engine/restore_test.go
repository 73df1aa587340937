package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// backup copies the data file aside, the coordinator stopped for it (a
// copy of a file being written may be torn), and starts it again.
func (h *harness) backup() []byte {
	h.t.Helper()
	h.close()
	data, err := os.ReadFile(filepath.Join(h.dir, "snapcoord.db"))
	if err != nil {
		h.t.Fatal(err)
	}
	h.open()
	return data
}

// restore stops the coordinator, puts back a copy of its data file made
// by backup, and starts it on it: its state goes back to the copy's.
func (h *harness) restore(data []byte) {
	h.t.Helper()
	h.close()
	if err := os.WriteFile(filepath.Join(h.dir, "snapcoord.db"), data, 0o600); err != nil {
		h.t.Fatal(err)
	}
	h.open()
}

// restoreSpec: B an hour after the run's creation, C and M a minute each,
// no environment snapshots; with 5-minute steps it fires at step 11.
func restoreSpec() *v1.RunSpec {
	return &v1.RunSpec{TrainerWorldSize: 2, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00"},
		Reserve: &v1.ReserveSpec{MarginSeconds: 60, ExpectedCheckpointSeconds: ptr(60.0)}}
}

// stepEvery5Min has both ranks complete steps from..to, each 5 minutes
// long, saving every third, and returns the step that said SAVE_AND_STOP
// (0 if none did).
func (h *harness) stepEvery5Min(run string, ranks []string, from, to int64) int64 {
	h.t.Helper()
	for step := from; step <= to; step++ {
		h.clk.Advance(5 * time.Minute)
		a := h.stepAll(run, ranks, step, 300)
		if a == v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
			h.checkpoint(run, ranks, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 30)
			return step
		}
		if step%3 == 0 {
			h.checkpoint(run, ranks, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 30)
		}
	}
	return 0
}

// restoredAfter runs run "r" of restoreSpec to step copied, copies its
// data file, runs on to step trained, and restores the copy.
func restoredAfter(t *testing.T, copied, trained int64) (*harness, []string) {
	t.Helper()
	h := newHarnessWith(t, Options{HeartbeatInterval: time.Hour})
	h.create("r", restoreSpec())
	ranks := h.trainers("r", 2)
	h.stepEvery5Min("r", ranks, 1, copied)
	data := h.backup()
	h.stepEvery5Min("r", ranks, copied+1, trained)
	h.restore(data)
	return h, ranks
}

// The coordinator's data file is replaced by an older copy (made at step
// 3) while the ranks trained on to step 7. The ranks' next step, 8, is
// taken as the run's step after the restore, once, with a WARNING naming
// the rank and the steps lost; every rank gets the same decisions from
// there, and the deadline fires at the step it fires at in a run that lost
// nothing. A later jump is refused as before.
func TestRestoredFromAnOlderCopyTheRanksGoOn(t *testing.T) {
	control := newHarnessWith(t, Options{HeartbeatInterval: time.Hour})
	control.create("r", restoreSpec())
	want := control.stepEvery5Min("r", control.trainers("r", 2), 1, 20)

	h, ranks := restoredAfter(t, 3, 7)
	if run := h.get("r"); run.LastStep != 3 || run.LastPublishedStep != 3 {
		t.Fatalf("the restored copy: last step %d, published %d; want 3 and 3", run.LastStep, run.LastPublishedStep)
	}

	h.clk.Advance(5 * time.Minute)
	first := h.step("r", ranks[1], 8, 300) // rank 1 is first this time
	if d := h.step("r", ranks[0], 8, 300); d.Action != first.Action || !d.DecidedAt.AsTime().Equal(first.DecidedAt.AsTime()) {
		t.Fatalf("step 8: rank 0 got %v, rank 1 %v", d, first)
	}
	warns := h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_WARNING)
	if len(warns) != 1 || warns[0].Step != 8 || !strings.Contains(warns[0].Message, "rank 1 is at step 8 and the run's last recorded step is 3") ||
		!strings.Contains(warns[0].Message, "steps 4 to 7 are not recorded") {
		t.Fatalf("WARNING events %v; want one naming rank 1, step 8 and the steps lost", warns)
	}
	_, err := h.e.CompleteStep(h.ctx, &v1.CompleteStepRequest{RunId: "r", WorkerId: ranks[0], Step: 100, IterationSeconds: 300})
	wantErr(t, err, ErrFailedPrecondition, "step:")

	if fired := h.stepEvery5Min("r", ranks, 9, 20); fired != want {
		t.Fatalf("after the restore the deadline fired at step %d; a run that lost nothing fires at %d", fired, want)
	}
	run := h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
	if run.FiredAtStep != want || run.LastPublishedStep != want {
		t.Fatalf("fired at %d, published %d; want both %d", run.FiredAtStep, run.LastPublishedStep, want)
	}
}

// After a restore, the ranks' first call may be the checkpoint of the
// step they are about to ask about: it is the jump, and the step is then
// asked about as usual.
func TestRestoredFromAnOlderCopyCheckpointFirst(t *testing.T) {
	h, ranks := restoredAfter(t, 2, 5)

	h.clk.Advance(5 * time.Minute)
	h.checkpoint("r", ranks, 6, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 30)
	if a := h.stepAll("r", ranks, 6, 300); a != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 6 after its checkpoint: %v", a)
	}
	if run := h.get("r"); run.LastStep != 6 || run.LastPublishedStep != 6 {
		t.Fatalf("last step %d, published %d; want 6 and 6", run.LastStep, run.LastPublishedStep)
	}
}
