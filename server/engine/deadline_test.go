package engine

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// fireAtStep1 makes step 1 (at t0 + 1m, with a one-hour iteration) fire the
// deadline B = t0 + 1h of a run created with spec.
func (h *harness) fireAtStep1(run string, ranks []string, alive ...string) {
	h.t.Helper()
	h.advance(time.Minute, run, alive...)
	if a := h.stepAll(run, ranks, 1, 3600); a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		h.t.Fatalf("step 1: %v", a)
	}
	h.wantState(run, v1.RunState_RUN_STATE_SAVING)
}

// saveAtDeadline returns the SaveAtDeadline command every given worker got,
// checking they got the same one.
func (h *harness) saveAtDeadline(run string, workers ...string) *v1.SaveAtDeadlineCommand {
	h.t.Helper()
	var got *v1.SaveAtDeadlineCommand
	for _, w := range workers {
		var mine []*v1.SaveAtDeadlineCommand
		for _, c := range h.commands(run, w) {
			if s := c.GetSaveAtDeadline(); s != nil {
				mine = append(mine, s)
			}
		}
		if len(mine) != 1 || got != nil && mine[0].SnapshotId != got.SnapshotId {
			h.t.Fatalf("worker %s got SaveAtDeadline %v", w, mine)
		}
		got = mine[0]
	}
	return got
}

// Each outcome of the deadline snapshot, and that the run stops only after
// it: SNAPSHOTTING (and CompleteStep answering STOP) until the environment
// workers reported, then STOPPED (with a warning unless all SAVED) or
// FAILED; Stop is the last command every worker receives.
func TestDeadlineSnapshotOutcomes(t *testing.T) {
	const (
		saved     = v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED
		skipped   = v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED
		ioError   = v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR
		invariant = v1.SnapshotOutcome_SNAPSHOT_OUTCOME_INVARIANT_FAILURE
		timeout   = v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT // the last worker never reports, but stays live
		lost      = v1.SnapshotOutcome(100)                     // the last worker goes silent and is lost
	)
	for _, tc := range []struct {
		name    string
		last    v1.SnapshotOutcome // what the last environment worker does
		state   v1.RunState
		outcome v1.SnapshotOutcome
		warning bool
		missed  bool // the save was still going at B
	}{
		{"all saved", saved, v1.RunState_RUN_STATE_STOPPED, saved, false, false},
		{"one skipped", skipped, v1.RunState_RUN_STATE_STOPPED, skipped, true, false},
		{"I/O error", ioError, v1.RunState_RUN_STATE_STOPPED, ioError, true, false},
		{"invariant failure", invariant, v1.RunState_RUN_STATE_FAILED, invariant, false, false},
		{"timeout at B", timeout, v1.RunState_RUN_STATE_STOPPED, timeout, true, true},
		{"worker lost", lost, v1.RunState_RUN_STATE_STOPPED, timeout, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.create("r", turnSpec(2, "00:01:00:00"))
			ranks := h.trainers("r", 2)
			envs := h.envs("r", 3)
			all := append(append([]string(nil), ranks...), envs...)
			b := t0.Add(time.Hour)
			h.fireAtStep1("r", ranks, all...)
			if cmds := h.commands("r", envs[0]); len(cmds) != 0 {
				t.Fatalf("environment commands before the trainer checkpoint: %v", cmds)
			}

			h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 30)
			h.wantState("r", v1.RunState_RUN_STATE_SNAPSHOTTING)
			cmd := h.saveAtDeadline("r", envs...)
			if cmd.AnchorStep != 1 || !cmd.MustFinishBy.AsTime().Equal(b) {
				t.Fatalf("SaveAtDeadline %v, want anchor 1, must_finish_by B", cmd)
			}
			s := h.lastSnapshot("r")
			if s.SnapshotId != cmd.SnapshotId || !s.Forced || s.Reason != v1.SnapshotReason_SNAPSHOT_REASON_DEADLINE || len(s.ExpectedWorkerIds) != 3 {
				t.Fatalf("deadline snapshot %v", s)
			}
			if n := len(h.snapshots("r")); n != 1 {
				t.Fatalf("%d snapshots: the deadline snapshot replaces the trainer-checkpoint one", n)
			}
			for _, w := range ranks {
				if cmds := h.commands("r", w); len(cmds) != 0 {
					t.Fatalf("trainer %s got %v", w, cmds)
				}
			}

			h.advance(10*time.Second, "r", all...)
			for _, w := range envs[:2] {
				if err := h.report("r", w, cmd.SnapshotId, saved, 10); err != nil {
					t.Fatal(err)
				}
			}
			// Not stopped while a worker has not reported.
			h.wantState("r", v1.RunState_RUN_STATE_SNAPSHOTTING)
			if d := h.step("r", ranks[0], 2, 10); d.Action != v1.StepAction_STEP_ACTION_STOP {
				t.Fatalf("CompleteStep while snapshotting: %v", d.Action)
			}
			for _, w := range all {
				for _, c := range h.commands("r", w) {
					if c.GetStop() != nil {
						t.Fatalf("%s got Stop before the deadline snapshot completed", w)
					}
				}
			}

			switch tc.last {
			case timeout:
				h.advance(b.Add(-time.Nanosecond).Sub(h.clk.Now()), "r", all...)
				h.wantState("r", v1.RunState_RUN_STATE_SNAPSHOTTING)
				h.advance(time.Nanosecond, "r", all...)
			case lost:
				h.advance(20*time.Second, "r", all[:4]...)
				if !h.clk.Now().Before(b) {
					t.Fatal("test clock passed B")
				}
			default:
				if err := h.reportMsg("r", envs[2], cmd.SnapshotId, tc.last, 10, "env-2 says "+tc.last.String()); err != nil {
					t.Fatal(err)
				}
			}

			run := h.wantState("r", tc.state)
			got := h.lastSnapshot("r")
			if got.Outcome != tc.outcome {
				t.Fatalf("deadline snapshot outcome %v, want %v", got.Outcome, tc.outcome)
			}
			warnings, missed := h.warnings("r")
			if tc.missed != run.DeadlineMissed || tc.missed != (len(missed) == 1) || len(missed) > 1 {
				t.Fatalf("deadline_missed %v (%q), warnings %v; want missed %v", run.DeadlineMissed, run.DeadlineMissedReason, missed, tc.missed)
			}
			if tc.warning != (len(warnings) == 1) || len(warnings) > 1 {
				t.Fatalf("warnings %v, want %v", warnings, tc.warning)
			}
			if tc.warning && (warnings[0].SnapshotId != cmd.SnapshotId || !strings.Contains(warnings[0].Message, "consistent")) {
				t.Fatalf("warning %v", warnings[0])
			}
			if tc.state == v1.RunState_RUN_STATE_FAILED && !strings.Contains(run.FailureMessage, "env-2 says SNAPSHOT_OUTCOME_INVARIANT_FAILURE") {
				t.Fatalf("failure_message %q lacks the worker's message", run.FailureMessage)
			}
			if tc.state == v1.RunState_RUN_STATE_STOPPED && run.FailureMessage != "" {
				t.Fatalf("a stopped run has failure_message %q", run.FailureMessage)
			}
			if tc.outcome == saved && run.Deadline.SaveReserveSeconds != 10 {
				t.Fatalf("R after a 10 s deadline snapshot = %v", run.Deadline.SaveReserveSeconds)
			}
			h.wantStopLast("r", all...)
			if d := h.step("r", ranks[1], 3, 10); d.Action != v1.StepAction_STEP_ACTION_STOP {
				t.Fatalf("CompleteStep after the run ended: %v", d.Action)
			}
			if d := h.step("r", ranks[1], 1, 10); d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
				t.Fatalf("step 1 asked again after the run ended: %v", d.Action)
			}
		})
	}
}

// With snapshots disabled the run stops as soon as the checkpoint of the
// fired step is published.
func TestDeadlineWithoutSnapshots(t *testing.T) {
	h := newHarness(t)
	spec := turnSpec(2, "00:01:00:00")
	spec.RolloutRecovery.TargetLevel = v1.TargetLevel_TARGET_LEVEL_SIBLING
	h.create("r", spec)
	ranks := h.trainers("r", 2)
	envs := h.envs("r", 1)
	h.fireAtStep1("r", ranks, append(ranks, envs...)...)
	h.checkpoint("r", ranks[:1], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 30)
	h.wantState("r", v1.RunState_RUN_STATE_SAVING)
	h.checkpoint("r", ranks[1:], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 30)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
	if n := len(h.snapshots("r")); n != 0 {
		t.Fatalf("%d snapshots with snapshots disabled", n)
	}
	h.wantStopLast("r", append(ranks, envs...)...)
	if len(h.commands("r", envs[0])) != 1 {
		t.Fatal("environment worker got more than Stop")
	}
}

// Deferred finalize: at the deadline, once all ranks SAVED, the engine asks
// the trainers to publish and waits (SAVING) for a PUBLISHED report; only
// then SaveAtDeadline. PUBLISHED before all SAVED is FAILED_PRECONDITION.
// Before the deadline, nothing follows a saved checkpoint (deadline-only
// snapshots). A restart while waiting for PUBLISHED loses nothing.
func TestDeferredFinalize(t *testing.T) {
	for _, restart := range []bool{false, true} {
		name := "no restart"
		if restart {
			name = "restart before PUBLISHED"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			spec := turnSpec(2, "00:01:00:00")
			spec.Checkpointing.DeferredFinalize = true
			spec.RolloutCheckpointing = &v1.RolloutCheckpointingSpec{SnapshotOnTrainerCheckpoint: ptr(false)}
			h.create("r", spec)
			ranks := h.trainers("r", 2)
			envs := h.envs("r", 2)
			all := append(append([]string(nil), ranks...), envs...)

			// Step 1 continues; its checkpoint is saved, published by the
			// trainers themselves, and followed by no snapshot.
			h.advance(time.Minute, "r", all...)
			if a := h.stepAll("r", ranks, 1, 60); a != v1.StepAction_STEP_ACTION_CONTINUE {
				t.Fatalf("step 1: %v", a)
			}
			h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 20)
			if run := h.get("r"); run.LastPublishedStep != 0 {
				t.Fatalf("deferred checkpoint published on SAVED: %d", run.LastPublishedStep)
			}
			if cmds := h.commands("r", ranks[0]); len(cmds) != 0 {
				t.Fatalf("PublishCheckpoint before the deadline: %v", cmds)
			}
			h.checkpoint("r", ranks[:1], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED, 0)
			if run := h.get("r"); run.LastPublishedStep != 1 || len(h.snapshots("r")) != 0 {
				t.Fatalf("after PUBLISHED: last_published_step %d, %d snapshots", run.LastPublishedStep, len(h.snapshots("r")))
			}

			// Step 2 fires.
			h.advance(time.Minute, "r", all...)
			if a := h.stepAll("r", ranks, 2, 3600); a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
				t.Fatalf("step 2: %v", a)
			}
			_, err := h.e.ReportCheckpoint(h.ctx, &v1.ReportCheckpointRequest{RunId: "r", WorkerId: ranks[0], Step: 2,
				Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED})
			wantErr(t, err, ErrFailedPrecondition, "step")
			h.checkpoint("r", ranks[:1], 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 20)
			_, err = h.e.ReportCheckpoint(h.ctx, &v1.ReportCheckpointRequest{RunId: "r", WorkerId: ranks[1], Step: 2,
				Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED})
			wantErr(t, err, ErrFailedPrecondition, "step")
			if cmds := h.commands("r", ranks[0]); len(cmds) != 0 {
				t.Fatalf("PublishCheckpoint before all ranks saved: %v", cmds)
			}
			h.checkpoint("r", ranks[1:], 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 20)

			run := h.wantState("r", v1.RunState_RUN_STATE_SAVING)
			if run.LastPublishedStep != 1 {
				t.Fatalf("last_published_step %d before PUBLISHED", run.LastPublishedStep)
			}
			for _, w := range ranks {
				cmds := h.commands("r", w)
				if len(cmds) != 1 || cmds[0].GetPublishCheckpoint().GetStep() != 2 {
					t.Fatalf("trainer %s got %v, want PublishCheckpoint{2}", w, cmds)
				}
			}
			if len(h.snapshots("r")) != 0 || len(h.commands("r", envs[0])) != 0 {
				t.Fatal("SaveAtDeadline before the checkpoint was published")
			}
			// A rank's process restarted now must still see the command.
			publish := h.commands("r", ranks[0])[0]
			if reg := h.registerAgain("r", "rank-aa", 0); reg.ResumeAfterSeq != publish.Seq-1 {
				t.Fatalf("a rank restarted before publishing resumes after %d, want %d (before PublishCheckpoint)", reg.ResumeAfterSeq, publish.Seq-1)
			}
			if restart {
				h.restart()
				h.wantState("r", v1.RunState_RUN_STATE_SAVING)
				h.checkpoint("r", ranks, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 20) // retries are fine
				if n := len(h.commands("r", ranks[0])); n != 1 {
					t.Fatalf("a SAVED retry after restart issued another PublishCheckpoint (%d commands)", n)
				}
			}
			h.advance(5*time.Second, "r", all...)
			h.checkpoint("r", ranks[1:], 2, v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED, 0)
			run = h.wantState("r", v1.RunState_RUN_STATE_SNAPSHOTTING)
			if run.LastPublishedStep != 2 {
				t.Fatalf("last_published_step %d after PUBLISHED", run.LastPublishedStep)
			}
			if reg := h.registerAgain("r", "rank-aa", 0); reg.ResumeAfterSeq != reg.LastCommandSeq {
				t.Fatalf("a rank restarted after publishing resumes after %d, want the end %d", reg.ResumeAfterSeq, reg.LastCommandSeq)
			}
			cmd := h.saveAtDeadline("r", envs...)
			if cmd.AnchorStep != 2 {
				t.Fatalf("SaveAtDeadline anchored to %d", cmd.AnchorStep)
			}
			h.checkpoint("r", ranks[:1], 2, v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED, 0) // a second PUBLISHED is a retry
			if n := len(h.snapshots("r")); n != 1 {
				t.Fatalf("%d snapshots after a PUBLISHED retry", n)
			}
			h.reportAll("r", envs, cmd.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
			h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
			h.wantStopLast("r", all...)
		})
	}
}

// Deferred finalize with snapshots disabled: publishing the fired step
// stops the run.
func TestDeferredFinalizeWithoutSnapshots(t *testing.T) {
	h := newHarness(t)
	spec := turnSpec(1, "00:01:00:00")
	spec.RolloutRecovery.TargetLevel = v1.TargetLevel_TARGET_LEVEL_SIBLING
	spec.Checkpointing.DeferredFinalize = true
	h.create("r", spec)
	ranks := h.trainers("r", 1)
	h.fireAtStep1("r", ranks, ranks...)
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	h.wantState("r", v1.RunState_RUN_STATE_SAVING)
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED, 0)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
	cmds := h.commands("r", ranks[0])
	if len(cmds) != 2 || cmds[0].GetPublishCheckpoint().GetStep() != 1 || cmds[1].GetStop() == nil {
		t.Fatalf("trainer commands %v, want PublishCheckpoint{1}, Stop", cmds)
	}
}

// UpdateDeadline moves B: the pre-step timer is re-armed (the old time fires
// nothing) and the next decision uses the new B.
func TestUpdateDeadline(t *testing.T) {
	h := newHarness(t)
	spec := turnSpec(1, "00:01:00:00")
	spec.Reserve = &v1.ReserveSpec{MarginSeconds: 10, ExpectedCheckpointSeconds: ptr(60.0), ExpectedSnapshotSeconds: ptr(30.0)}
	h.create("r", spec)
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 1)
	all := append(append([]string(nil), ranks...), envs...)

	for _, bad := range []*v1.UpdateDeadlineRequest{
		{RunId: "r", CheckpointMustSaveBy: "2h"},
		{RunId: "r", CheckpointMustSaveBy: "00:02:00:00", MustSaveBy: timestamppb.New(t0)},
		{RunId: "r"},
	} {
		_, err := h.e.UpdateDeadline(h.ctx, bad)
		wantErr(t, err, ErrInvalidArgument, "checkpoint_must_save_by")
	}
	_, err := h.e.UpdateDeadline(h.ctx, &v1.UpdateDeadlineRequest{RunId: "nope", CheckpointMustSaveBy: "00:02:00:00"})
	wantErr(t, err, ErrNotFound, "nope")

	// Later: B = t0 + 2h, so the pre-step deadline moves from
	// t0 + 1h - 100s to t0 + 2h - 100s.
	resp, err := h.e.UpdateDeadline(h.ctx, &v1.UpdateDeadlineRequest{RunId: "r", CheckpointMustSaveBy: "00:02:00:00"})
	if err != nil {
		t.Fatal(err)
	}
	if b := resp.Run.Deadline.MustSaveBy.AsTime(); !b.Equal(t0.Add(2 * time.Hour)) {
		t.Fatalf("B after update = %v", b)
	}
	if evs := h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_UPDATED); len(evs) != 1 {
		t.Fatalf("DEADLINE_UPDATED events %v", evs)
	}
	h.advance(time.Hour, "r", all...)
	h.wantState("r", v1.RunState_RUN_STATE_PENDING)
	if n := len(h.snapshots("r")); n != 0 || len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_FIRED)) != 0 {
		t.Fatal("the pre-step deadline fired at the old B")
	}
	preStep := t0.Add(2*time.Hour - 100*time.Second)
	h.advance(preStep.Add(-time.Nanosecond).Sub(h.clk.Now()), "r", all...)
	h.wantState("r", v1.RunState_RUN_STATE_PENDING)

	// Earlier again (an absolute B a minute from now): the pre-step time,
	// B - 100s, is already past, so it is due at once.
	newB := h.clk.Now().Add(time.Minute)
	if _, err := h.e.UpdateDeadline(h.ctx, &v1.UpdateDeadlineRequest{RunId: "r", MustSaveBy: timestamppb.New(newB)}); err != nil {
		t.Fatal(err)
	}
	h.advance(time.Nanosecond, "r", all...)
	run := h.wantState("r", v1.RunState_RUN_STATE_SNAPSHOTTING)
	if run.FireKind != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_PRE_STEP {
		t.Fatalf("fire kind %v", run.FireKind)
	}
	if cmd := h.saveAtDeadline("r", envs...); cmd.AnchorStep != 0 || !cmd.MustFinishBy.AsTime().Equal(newB) {
		t.Fatalf("SaveAtDeadline %v", cmd)
	}
	_, err = h.e.UpdateDeadline(h.ctx, &v1.UpdateDeadlineRequest{RunId: "r", CheckpointMustSaveBy: "00:05:00:00"})
	wantErr(t, err, ErrFailedPrecondition, "SNAPSHOTTING")
}

// Moving B for a running run changes the next decision.
func TestUpdateDeadlineRunning(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{TrainerWorldSize: 1, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:10:00:00"}})
	ranks := h.trainers("r", 1)
	h.advance(10*time.Minute, "r", ranks...)
	if a := h.stepAll("r", ranks, 1, 600); a != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 1: %v", a)
	}
	if _, err := h.e.UpdateDeadline(h.ctx, &v1.UpdateDeadlineRequest{RunId: "r", MustSaveBy: timestamppb.New(t0.Add(30 * time.Minute))}); err != nil {
		t.Fatal(err)
	}
	if got := h.get("r").Deadline.FiresAt.AsTime(); !got.Equal(t0.Add(20 * time.Minute)) {
		t.Fatalf("fires_at %v", got)
	}
	h.advance(10*time.Minute, "r", ranks...)
	if a := h.stepAll("r", ranks, 2, 600); a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 2 with B moved to t0 + 30m: %v", a)
	}
	// Once fired, B can no longer move; the same B again (a repeat whose
	// first answer was lost) is OK and changes nothing.
	_, err := h.e.UpdateDeadline(h.ctx, &v1.UpdateDeadlineRequest{RunId: "r", CheckpointMustSaveBy: "00:20:00:00"})
	wantErr(t, err, ErrFailedPrecondition, "no longer")
	updates := len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_UPDATED))
	resp, err := h.e.UpdateDeadline(h.ctx, &v1.UpdateDeadlineRequest{RunId: "r", CheckpointMustSaveBy: "00:00:30:00"})
	if err != nil || !resp.Run.Deadline.MustSaveBy.AsTime().Equal(t0.Add(30*time.Minute)) {
		t.Fatalf("the same B again once fired: %v, %v; want OK with B = t0 + 30m", resp.GetRun().GetDeadline(), err)
	}
	if n := len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_UPDATED)); n != updates {
		t.Fatalf("the same B again logged %d more DEADLINE_UPDATED events", n-updates)
	}
}

// A TriggerDeadline repeated with the same reason (its first answer lost, or
// of unknown outcome) answers OK with the run the trigger changed, pending,
// fired, after the run ended and across a restart, never "already fired":
// the clients retry it. Another reason is another trigger.
func TestTriggerDeadlineRepeatAnswersAsTheFirst(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, "01:00:00:00"))
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 1)
	h.step("r", ranks[0], 1, 10)
	trigger := func(reason string) (*v1.Run, error) {
		resp, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r", Reason: reason})
		return resp.GetRun(), err
	}
	if _, err := trigger("drain"); err != nil {
		t.Fatal(err)
	}
	if run, err := trigger("drain"); err != nil || run.Deadline.TriggerPending != "drain" {
		t.Fatalf("repeat while pending: %v, %v", run.GetDeadline(), err)
	}
	h.step("r", ranks[0], 2, 10)
	fired := h.wantState("r", v1.RunState_RUN_STATE_SAVING)
	wantFiredBy := func(when string, run *v1.Run, err error) {
		t.Helper()
		if err != nil || !run.FiredAt.AsTime().Equal(fired.FiredAt.AsTime()) || run.FireKind != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_MANUAL {
			t.Fatalf("the same trigger again %s: %v, %v; want OK with the fire at %v", when, run, err, fired.FiredAt.AsTime())
		}
	}
	run, err := trigger("drain")
	wantFiredBy("once fired", run, err)
	_, err = trigger("another cause")
	wantErr(t, err, ErrFailedPrecondition, "already fired")
	if n := len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_FIRED)); n != 1 {
		t.Fatalf("%d DEADLINE_FIRED events", n)
	}

	h.checkpoint("r", ranks, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	cmd := h.saveAtDeadline("r", envs...)
	h.reportAll("r", envs, cmd.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
	h.restart()
	run, err = trigger("drain")
	wantFiredBy("after the run stopped and a restart", run, err)

	// A deadline fired by B is no trigger's: a trigger then is refused.
	h.create("by-b", turnSpec(1, "00:00:01:00"))
	h.advance(time.Minute, "by-b")
	if h.get("by-b").FiredAt == nil {
		t.Fatal("the deadline of by-b did not fire at B")
	}
	_, err = h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "by-b"})
	wantErr(t, err, ErrFailedPrecondition, "already fired")
}

// TriggerDeadline after a step: the next step saves and stops (kind
// MANUAL); already-decided steps keep their answer.
func TestTriggerDeadlineAfterStep(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(2, "01:00:00:00"))
	ranks := h.trainers("r", 2)
	envs := h.envs("r", 1)
	h.step("r", ranks[0], 1, 10)
	run, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r", Reason: "node drain at 14:00"})
	if err != nil {
		t.Fatal(err)
	}
	if run.Run.State != v1.RunState_RUN_STATE_RUNNING || run.Run.FiredAt != nil || run.Run.Deadline.TriggerPending != "node drain at 14:00" {
		t.Fatalf("after trigger: %v", run.Run)
	}
	if _, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r"}); err != nil {
		t.Fatalf("a second trigger before the next step: %v", err)
	}
	if d := h.step("r", ranks[1], 1, 10); d.Action != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 1 asked again after the trigger: %v", d.Action)
	}
	h.restart() // the pending trigger is durable
	if p := h.get("r").Deadline.TriggerPending; p != "node drain at 14:00" {
		t.Fatalf("trigger_pending after a restart: %q", p)
	}
	d := h.step("r", ranks[1], 2, 10)
	if d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP || !strings.Contains(d.Explanation, "node drain at 14:00") ||
		d.Inputs.TriggerPending == "" {
		t.Fatalf("step 2: %v %q, inputs %v", d.Action, d.Explanation, d.Inputs)
	}
	run2 := h.wantState("r", v1.RunState_RUN_STATE_SAVING)
	if run2.Deadline.TriggerPending != "" {
		t.Fatalf("trigger still pending once fired: %q", run2.Deadline.TriggerPending)
	}
	if run2.FireKind != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_MANUAL || run2.FiredAtStep != 2 {
		t.Fatalf("fire kind %v at step %d", run2.FireKind, run2.FiredAtStep)
	}
	_, err = h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r"})
	wantErr(t, err, ErrFailedPrecondition, "already fired")
	h.checkpoint("r", ranks, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	cmd := h.saveAtDeadline("r", envs...)
	if cmd.AnchorStep != 2 {
		t.Fatalf("SaveAtDeadline %v", cmd)
	}
	h.reportAll("r", envs, cmd.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
	_, err = h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r"})
	wantErr(t, err, ErrFailedPrecondition, "STOPPED")
}

// TriggerDeadline before any step takes the pre-step path at once.
func TestTriggerDeadlineBeforeFirstStep(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, "")) // no deadline at all: a trigger still works
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 2)
	if _, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	run := h.wantState("r", v1.RunState_RUN_STATE_SNAPSHOTTING)
	if run.FireKind != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_MANUAL || run.FiredAtStep != 0 {
		t.Fatalf("fire kind %v at step %d", run.FireKind, run.FiredAtStep)
	}
	cmd := h.saveAtDeadline("r", envs...)
	if cmd.AnchorStep != 0 || !cmd.MustFinishBy.AsTime().Equal(t0.Add(600*time.Second)) {
		t.Fatalf("SaveAtDeadline %v, want anchor 0 and snapshot_timeout_s from now", cmd)
	}
	if d := h.step("r", ranks[0], 1, 10); d.Action != v1.StepAction_STEP_ACTION_STOP {
		t.Fatalf("first step after a pre-step trigger: %v", d.Action)
	}
	_, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r", Reason: "another cause"})
	wantErr(t, err, ErrFailedPrecondition, "already fired")
	h.reportAll("r", envs, cmd.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
	h.wantStopLast("r", append(ranks, envs...)...)

	// Snapshots disabled: nothing to save, the run stops at once.
	h.create("plain", &v1.RunSpec{TrainerWorldSize: 1})
	if _, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "plain"}); err != nil {
		t.Fatal(err)
	}
	h.wantState("plain", v1.RunState_RUN_STATE_STOPPED)
}

// FinishRun completes the run and CancelRun cancels it; both push Stop to
// every worker and end every timer; a terminal run answers STOP.
func TestFinishAndCancel(t *testing.T) {
	spec := func() *v1.RunSpec {
		s := turnSpec(1, "00:01:00:00")
		s.RolloutCheckpointing = &v1.RolloutCheckpointingSpec{SnapshotAttemptIntervalS: ptr[int32](60)}
		return s
	}
	h := newHarness(t)
	h.create("done", spec())
	h.create("cancelled", spec())
	dr, de := h.trainers("done", 1), h.envs("done", 1)
	cr, ce := h.trainers("cancelled", 1), h.envs("cancelled", 1)
	h.step("done", dr[0], 1, 10)
	h.step("cancelled", cr[0], 1, 10)

	_, err := h.e.FinishRun(h.ctx, &v1.FinishRunRequest{RunId: "done", WorkerId: de[0]})
	wantErr(t, err, ErrInvalidArgument, "worker_id")
	for range 2 { // the second call is a retry
		resp, err := h.e.FinishRun(h.ctx, &v1.FinishRunRequest{RunId: "done", WorkerId: dr[0]})
		if err != nil || resp.RunState != v1.RunState_RUN_STATE_COMPLETED {
			t.Fatalf("FinishRun: %v, %v", resp, err)
		}
	}
	for range 2 {
		resp, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "cancelled", Reason: "bad learning rate"})
		if err != nil || resp.Run.State != v1.RunState_RUN_STATE_CANCELLED || resp.Run.FailureMessage != "bad learning rate" {
			t.Fatalf("CancelRun: %v, %v", resp, err)
		}
	}
	h.wantStopLast("done", dr[0], de[0])
	h.wantStopLast("cancelled", cr[0], ce[0])
	for _, run := range []string{"done", "cancelled"} {
		if got := h.get(run); got.EndedAt == nil {
			t.Fatalf("%s: no ended_at", run)
		}
	}

	_, err = h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "done"})
	wantErr(t, err, ErrFailedPrecondition, "COMPLETED")
	_, err = h.e.FinishRun(h.ctx, &v1.FinishRunRequest{RunId: "cancelled", WorkerId: cr[0]})
	wantErr(t, err, ErrFailedPrecondition, "CANCELLED")
	_, err = h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "done", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "late"})
	wantErr(t, err, ErrFailedPrecondition, "COMPLETED")

	// No timer of a terminal run fires: no interval snapshot, no pre-step
	// or deadline, however long the clock runs.
	h.advance(2*time.Hour, "done", dr[0], de[0])
	for _, run := range []string{"done", "cancelled"} {
		if n := len(h.snapshots(run)); n != 0 {
			t.Fatalf("%s: %d snapshots after the run ended", run, n)
		}
		if d := h.step(run, map[string]string{"done": dr[0], "cancelled": cr[0]}[run], 2, 10); d.Action != v1.StepAction_STEP_ACTION_STOP {
			t.Fatalf("%s: CompleteStep %v", run, d.Action)
		}
	}
	if got := h.get("done").State; got != v1.RunState_RUN_STATE_COMPLETED {
		t.Fatalf("done: %v", got)
	}

	// FinishRun during the deadline sequence is refused: the run stops when
	// the sequence ends.
	h.create("firing", turnSpec(1, "00:01:00:00"))
	fr := h.trainers("firing", 1)
	h.fireAtStep1("firing", fr, fr...)
	_, err = h.e.FinishRun(h.ctx, &v1.FinishRunRequest{RunId: "firing", WorkerId: fr[0]})
	wantErr(t, err, ErrFailedPrecondition, "deadline")
}

// A regular snapshot still in flight when the deadline fires cannot fail
// the run by its outcome: the deadline sequence decides how the run ends
// (even the deadline snapshot's own I/O error only warns).
func TestRegularSnapshotFailureDuringDeadlineSequence(t *testing.T) {
	h := newHarness(t)
	spec := turnSpec(1, "00:01:00:00")
	spec.RolloutCheckpointing = &v1.RolloutCheckpointingSpec{MaxConsecutiveFailures: 1, SnapshotTimeoutS: 60}
	h.create("r", spec)
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 2)
	all := append(append([]string(nil), ranks...), envs...)

	h.advance(time.Minute, "r", all...)
	h.stepAll("r", ranks, 1, 60)
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	regular := h.lastSnapshot("r") // in flight
	if a := h.stepAll("r", ranks, 2, 3600); a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 2: %v", a)
	}
	// The regular snapshot fails while the trainers save.
	h.reportAll("r", envs[:1], regular.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR)
	h.advance(time.Minute, "r", all...) // and times out
	if s := h.lastSnapshot("r"); s.CompletedAt == nil {
		t.Fatalf("regular snapshot still in flight: %v", s)
	}
	h.wantState("r", v1.RunState_RUN_STATE_SAVING)

	h.checkpoint("r", ranks, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	cmd := h.saveAtDeadline("r", envs...)
	h.reportAll("r", envs, cmd.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
	h.wantStopLast("r", all...)
}

// Checkpoints may complete out of order (asynchronous saves overlap). The
// newer one's publication issues the trainer-checkpoint snapshot; the older
// one's, coming after, issues none (the environments have moved past it)
// and says so in an event.
func TestOlderCheckpointPublishedLateTakesNoSnapshot(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(2, "01:00:00:00"))
	ranks := h.trainers("r", 2)
	envs := h.envs("r", 1)
	h.stepAll("r", ranks, 1, 10)
	h.checkpoint("r", ranks[:1], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	h.stepAll("r", ranks, 2, 10)
	h.checkpoint("r", ranks, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	s := h.lastSnapshot("r")
	if s.Reason != v1.SnapshotReason_SNAPSHOT_REASON_TRAINER_CHECKPOINT || s.AnchorStep != 2 {
		t.Fatalf("after step 2 saved: %v, want a trainer-checkpoint snapshot anchored at 2", s)
	}
	h.reportAll("r", envs, s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)

	h.checkpoint("r", ranks[1:], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5) // step 1 completes last
	if snaps := h.snapshots("r"); len(snaps) != 1 {
		t.Fatalf("step 1 published after step 2 issued another snapshot: %v", snaps[1:])
	}
	if run := h.get("r"); run.LastPublishedStep != 2 {
		t.Fatalf("last_published_step %d, want 2", run.LastPublishedStep)
	}
	skips := h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_SNAPSHOT_TICK_SKIPPED)
	if len(skips) != 1 || skips[0].Step != 1 || !strings.Contains(skips[0].Message, "after the newer one of step 2") {
		t.Fatalf("skip events %v, want one for step 1 naming step 2", skips)
	}
}
