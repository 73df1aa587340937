package engine

import (
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// down simulates a coordinator that is down for d: close, let the clock run,
// open on the same data file.
func (h *harness) down(d time.Duration) {
	h.t.Helper()
	h.close()
	h.clk.Advance(d)
	h.open()
}

// An interval snapshot that fell due while the coordinator was down is
// issued right after the restart, anchored to the latest published step;
// the period then continues from it.
func TestRestartRearmsInterval(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{
		TrainerWorldSize:     1,
		RolloutCheckpointing: &v1.RolloutCheckpointingSpec{SnapshotAttemptIntervalS: ptr[int32](60)},
		RolloutRecovery:      &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_SIBLING},
	})
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 1)
	h.stepAll("r", ranks, 1, 10)
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	h.advance(30*time.Second, "r", envs...)

	h.down(60 * time.Second) // the tick at t0 + 60s passes while down
	restartedAt := h.clk.Now()
	if n := len(h.snapshots("r")); n != 0 {
		t.Fatalf("%d snapshots before the re-armed timer ran", n)
	}
	h.clk.Advance(0) // due timers run; nothing else moves
	s := h.lastSnapshot("r")
	if s.Reason != v1.SnapshotReason_SNAPSHOT_REASON_INTERVAL || s.AnchorStep != 1 || !s.IssuedAt.AsTime().Equal(restartedAt) {
		t.Fatalf("after restart: %v, want an INTERVAL snapshot anchored to step 1 at %v", s, restartedAt)
	}
	cmds := h.snapshotCommands("r", envs[0])
	if len(cmds) != 1 || cmds[0].SnapshotId != s.SnapshotId {
		t.Fatalf("commands after restart %v", cmds)
	}
	h.reportAll("r", envs, s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.advance(59*time.Second, "r", envs...)
	if n := len(h.snapshots("r")); n != 1 {
		t.Fatalf("%d snapshots 59 s after the restart tick", n)
	}
	h.advance(time.Second, "r", envs...)
	if s := h.lastSnapshot("r"); s.SnapshotId != "snap-2" || !s.IssuedAt.AsTime().Equal(restartedAt.Add(time.Minute)) {
		t.Fatalf("next tick %v", s)
	}
}

// A pre-step deadline that passed while the coordinator was down fires
// right after the restart; one that a step overtook stays stale.
func TestRestartRearmsPreStep(t *testing.T) {
	h := newHarness(t)
	h.create("r", preStepSpec())
	h.create("stale", preStepSpec())
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 1)
	staleRanks := h.trainers("stale", 1)
	staleEnvs := h.envs("stale", 1)
	h.advance(10*time.Minute, "r", append(ranks, envs...)...)
	h.beat("stale", staleEnvs...)
	h.stepAll("stale", staleRanks, 1, 60)

	h.down(preStepAt.Add(50 * time.Second).Sub(h.clk.Now()))
	h.wantState("r", v1.RunState_RUN_STATE_PENDING)
	h.clk.Advance(0)
	run := h.wantState("r", v1.RunState_RUN_STATE_SNAPSHOTTING)
	if run.FireKind != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_PRE_STEP {
		t.Fatalf("fire kind %v", run.FireKind)
	}
	cmd := h.saveAtDeadline("r", envs...)
	if cmd.AnchorStep != 0 || !cmd.MustFinishBy.AsTime().Equal(t0.Add(time.Hour)) {
		t.Fatalf("SaveAtDeadline %v", cmd)
	}
	h.reportAll("r", envs, cmd.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)

	h.advance(time.Hour, "stale", staleEnvs...)
	if run := h.wantState("stale", v1.RunState_RUN_STATE_RUNNING); run.FiredAt != nil {
		t.Fatalf("stale pre-step fired after restart: %v", run)
	}
	if cmds := h.commands("stale", staleEnvs[0]); len(cmds) != 0 {
		t.Fatalf("stale run commands %v", cmds)
	}
}

// A snapshot timeout that fell due while the coordinator was down is
// applied once the restart grace has passed, not at once (reports the
// outage held up still count until then): a regular snapshot times out
// (and counts as a failure); the deadline snapshot times out at B and the
// run stops with a warning.
func TestRestartRearmsSnapshotTimeout(t *testing.T) {
	h := newHarness(t)
	h.create("deadline", turnSpec(1, "00:01:00:00"))
	dr := h.trainers("deadline", 1)
	de := h.envs("deadline", 2)
	h.fireAtStep1("deadline", dr, append(dr, de...)...)
	h.checkpoint("deadline", dr, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	ds := h.lastSnapshot("deadline")
	h.reportAll("deadline", de[:1], ds.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)

	spec := turnSpec(1, "")
	spec.RolloutCheckpointing = &v1.RolloutCheckpointingSpec{SnapshotTimeoutS: 30}
	h.create("regular", spec)
	rr := h.trainers("regular", 1)
	re := h.envs("regular", 2)
	h.stepAll("regular", rr, 1, 10)
	h.checkpoint("regular", rr, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	regular := h.lastSnapshot("regular")
	h.reportAll("regular", re[:1], regular.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)

	h.down(time.Hour) // past both timeouts and past B
	h.clk.Advance(h.e.opts.RestartGrace - time.Millisecond)
	for _, run := range []string{"regular", "deadline"} {
		if s := h.lastSnapshot(run); s.CompletedAt != nil {
			t.Fatalf("%s: completed within the restart grace: %v", run, s)
		}
	}
	h.beat("regular", append(rr, re...)...) // live, but the report never comes
	h.beat("deadline", append(dr, de...)...)
	h.clk.Advance(time.Millisecond)

	if s := h.lastSnapshot("regular"); s.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT {
		t.Fatalf("regular snapshot after restart: %v", s)
	}
	h.wantState("regular", v1.RunState_RUN_STATE_RUNNING) // one failure of three

	if s := h.lastSnapshot("deadline"); s.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT {
		t.Fatalf("deadline snapshot after restart: %v", s)
	}
	if run := h.wantState("deadline", v1.RunState_RUN_STATE_STOPPED); !run.DeadlineMissed {
		t.Fatal("deadline_missed not set: the deadline snapshot was still going at the end of the restart grace, past B")
	}
	if warnings, missed := h.warnings("deadline"); len(warnings) != 1 || len(missed) != 1 {
		t.Fatalf("warnings %v and %v, want one for the timed-out deadline snapshot and one for the missed deadline", warnings, missed)
	}
	h.wantStopLast("deadline", append(dr, de...)...)
}

// A worker that saved the deadline snapshot while the coordinator was down,
// past B, retries its report once the coordinator is back: within the
// restart grace it counts, and the snapshot is SAVED rather than timed out
// because the coordinator had crashed.
func TestRestartGraceCountsDeadlineSnapshotReport(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, "00:01:00:00"))
	ranks, envs := h.trainers("r", 1), h.envs("r", 2)
	h.fireAtStep1("r", ranks, append(ranks, envs...)...)
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	s := h.lastSnapshot("r")
	h.reportAll("r", envs[:1], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)

	h.down(time.Hour) // past B
	h.clk.Advance(h.e.opts.RestartGrace - time.Millisecond)
	h.reportAll("r", envs[1:], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.clk.Advance(time.Hour)

	if got := h.lastSnapshot("r"); got.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Fatalf("deadline snapshot reported within the grace: %v", got)
	}
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
	if w := h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_WARNING); len(w) != 0 {
		t.Fatalf("warnings for a saved deadline snapshot: %v", w)
	}
}

// A restart loses nothing a worker was told: commands keep their sequence
// numbers (a worker resumes after its last one), a snapshot in flight can
// still be reported, and ids and sequence numbers are never reused.
func TestRestartResumesCommandsAndSnapshots(t *testing.T) {
	h := newHarness(t)
	ranks, envs := h.snapshotInFlight("r", 2)
	before := h.commands("r", envs[0])
	if len(before) != 1 {
		t.Fatalf("commands %v", before)
	}
	s := before[0].GetSnapshot()
	h.reportAll("r", envs[:1], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	lastEvent := h.get("r").LastEventSeq

	h.restart()
	after := h.commands("r", envs[1])
	if len(after) != 1 || after[0].Seq != before[0].Seq || after[0].GetSnapshot().GetSnapshotId() != s.SnapshotId {
		t.Fatalf("commands after restart %v, before %v", after, before)
	}
	if more := h.poll("r", envs[1], before[0].Seq); len(more) != 0 {
		t.Fatalf("commands after seq %d: %v", before[0].Seq, more)
	}
	h.reportAll("r", envs[1:], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	if got := h.lastSnapshot("r"); got.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED || len(got.Reports) != 2 {
		t.Fatalf("snapshot after restart %v", got)
	}
	if evs := h.events("r"); evs[len(evs)-1].Seq <= lastEvent {
		t.Fatal("no new events after restart")
	}

	h.stepAll("r", ranks, 2, 10)
	h.checkpoint("r", ranks, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	h.settle("r")
	next := h.poll("r", envs[0], before[0].Seq)
	if len(next) != 1 || next[0].Seq <= before[0].Seq || next[0].GetSnapshot().GetSnapshotId() == s.SnapshotId {
		t.Fatalf("next command %v", next)
	}
	env := h.register("r", v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, "late", 0)
	for _, old := range append(ranks, envs...) {
		if env == old {
			t.Fatalf("worker id %s reused", env)
		}
	}
}

// A snapshot the coordinator's restart interrupted adds to R what the
// workers took, not the outage: counted from its issue, R would be as long
// as the coordinator was down, and every deadline would fire that much
// earlier for the next reserve window.
func TestSnapshotAcrossARestartAddsNotTheOutageToR(t *testing.T) {
	h := newHarness(t)
	spec := intervalSpec(3)
	h.create("r", spec)
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 2)
	h.advance(60*time.Second, "r", append(ranks, envs...)...)
	s := h.lastSnapshot("r")
	h.down(25 * time.Second) // the workers save meanwhile, and report once it is back
	for i, env := range envs {
		if err := h.report("r", env, s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 2+float64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.lastSnapshot("r"); got.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED || got.DurationSeconds < 25 {
		t.Fatalf("snapshot %v: want SAVED, lasting the outage from its issue", got)
	}
	if r := h.get("r").Deadline.SaveReserveSeconds; r != 3 {
		t.Fatalf("R = %v s after a snapshot the workers took 2 and 3 s over, want 3", r)
	}

	// One issued after the restart counts from its issue, as before.
	h.advance(60*time.Second, "r", append(ranks, envs...)...)
	next := h.lastSnapshot("r")
	h.clk.Advance(4 * time.Second)
	h.reportAll("r", envs, next.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	done := h.lastSnapshot("r")
	if r := h.get("r").Deadline.SaveReserveSeconds; done.SnapshotId != next.SnapshotId || done.DurationSeconds < 4 || r != done.DurationSeconds {
		t.Fatalf("R = %v s after snapshot %s took %v s from issue to its last report; want that", r, done.SnapshotId, done.DurationSeconds)
	}
}
