package engine

import (
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// snapshotCommands returns the Snapshot commands a worker received.
func (h *harness) snapshotCommands(run, worker string) []*v1.SnapshotCommand {
	h.t.Helper()
	var out []*v1.SnapshotCommand
	for _, c := range h.commands(run, worker) {
		if s := c.GetSnapshot(); s != nil {
			out = append(out, s)
		}
	}
	return out
}

// The trigger after a trainer checkpoint: at turn/prefix level with
// snapshot_on_trainer_checkpoint (the default) a published checkpoint of
// step N is followed by Snapshot{TRAINER_CHECKPOINT, anchor N}; with it
// off, or at sibling/prompt_group level, by nothing.
func TestSnapshotAfterTrainerCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name   string
		level  v1.TargetLevel
		onCkpt *bool
		want   bool
	}{
		{"turn, default", v1.TargetLevel_TARGET_LEVEL_TURN, nil, true},
		{"turn, on", v1.TargetLevel_TARGET_LEVEL_TURN, ptr(true), true},
		{"prefix, default", v1.TargetLevel_TARGET_LEVEL_PREFIX, nil, true},
		{"turn, off", v1.TargetLevel_TARGET_LEVEL_TURN, ptr(false), false},
		{"sibling", v1.TargetLevel_TARGET_LEVEL_SIBLING, nil, false},
		{"sibling, on", v1.TargetLevel_TARGET_LEVEL_SIBLING, ptr(true), false},
		{"prompt_group", v1.TargetLevel_TARGET_LEVEL_PROMPT_GROUP, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			spec := turnSpec(2, "01:00:00:00")
			spec.RolloutRecovery.TargetLevel = tc.level
			spec.RolloutCheckpointing = &v1.RolloutCheckpointingSpec{SnapshotOnTrainerCheckpoint: tc.onCkpt}
			h.create("r", spec)
			ranks := h.trainers("r", 2)
			envs := h.envs("r", 2)

			for step := int64(1); step <= 2; step++ {
				h.stepAll("r", ranks, step, 10)
				h.checkpoint("r", ranks[:1], step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
				before := 0 // snapshots of earlier steps
				if tc.want {
					before = int(step - 1)
				}
				if n := len(h.snapshots("r")); n != before {
					t.Fatalf("step %d: %d snapshots before every rank saved, want %d", step, n, before)
				}
				h.checkpoint("r", ranks[1:], step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
				if got := h.get("r").LastPublishedStep; got != step {
					t.Fatalf("last_published_step %d, want %d", got, step)
				}
				cmds := h.snapshotCommands("r", envs[0])
				if !tc.want {
					if len(cmds) != 0 || len(h.snapshots("r")) != 0 {
						t.Fatalf("step %d: snapshot issued after a trainer checkpoint: %v", step, cmds)
					}
					continue
				}
				if len(cmds) != int(step) {
					t.Fatalf("step %d: %d snapshot commands, want %d", step, len(cmds), step)
				}
				c := cmds[step-1]
				if c.Reason != v1.SnapshotReason_SNAPSHOT_REASON_TRAINER_CHECKPOINT || c.AnchorStep != step || c.Forced {
					t.Fatalf("step %d: %v, want TRAINER_CHECKPOINT anchored to %d, not forced", step, c, step)
				}
				if got := h.snapshotCommands("r", envs[1]); len(got) != int(step) {
					t.Fatalf("second environment worker got %v", got)
				}
				if cmds := h.commands("r", ranks[0]); len(cmds) != 0 {
					t.Fatalf("a trainer got %v", cmds)
				}
				h.reportAll("r", envs, c.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
			}
		})
	}
}

// The pump with no interval: no snapshot_attempt_interval_s, no INTERVAL
// snapshot however long the clock runs; only trainer checkpoints trigger.
func TestNoIntervalPump(t *testing.T) {
	h := newHarnessWith(t, Options{HeartbeatInterval: time.Hour})
	h.create("r", turnSpec(1, "")) // no deadline either: nothing else is timed
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 1)

	h.advance(48*time.Hour, "r", envs...)
	if s := h.snapshots("r"); len(s) != 0 {
		t.Fatalf("snapshots with no interval and no checkpoint: %v", s)
	}
	h.stepAll("r", ranks, 1, 10)
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	s := h.lastSnapshot("r")
	if s.Reason != v1.SnapshotReason_SNAPSHOT_REASON_TRAINER_CHECKPOINT {
		t.Fatalf("snapshot %v", s)
	}
	h.advance(time.Hour, "r", envs...)
	h.reportAll("r", envs, s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.advance(7*24*time.Hour, "r", envs...)
	if s := h.snapshots("r"); len(s) != 1 {
		t.Fatalf("%d snapshots after a week, want the one trainer-checkpoint snapshot", len(s))
	}
	if n := len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_SNAPSHOT_TICK_SKIPPED)); n != 0 {
		t.Fatalf("%d tick-skipped events with no interval", n)
	}
	if got := h.get("r").State; got != v1.RunState_RUN_STATE_RUNNING {
		t.Fatalf("state %v", got)
	}
}

// With an interval, each tick issues Snapshot{INTERVAL, not forced, anchor
// = latest published step}; a tick while one is in flight is skipped, and
// the skip is an event.
func TestIntervalPump(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{
		TrainerWorldSize:     1,
		RolloutCheckpointing: &v1.RolloutCheckpointingSpec{SnapshotAttemptIntervalS: ptr[int32](60)},
		RolloutRecovery:      &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_SIBLING},
	})
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 2)
	alive := append(ranks, envs...)

	h.advance(59*time.Second, "r", alive...)
	if n := len(h.snapshots("r")); n != 0 {
		t.Fatalf("%d snapshots before the first tick", n)
	}
	h.advance(time.Second, "r", alive...)
	cmds := h.snapshotCommands("r", envs[0])
	if len(cmds) != 1 {
		t.Fatalf("after the first tick: %v", cmds)
	}
	if c := cmds[0]; c.Reason != v1.SnapshotReason_SNAPSHOT_REASON_INTERVAL || c.Forced || c.AnchorStep != 0 {
		t.Fatalf("first tick: %v, want INTERVAL, not forced, anchor 0", c)
	}
	if s := h.lastSnapshot("r"); !s.IssuedAt.AsTime().Equal(t0.Add(60*time.Second)) || len(s.ExpectedWorkerIds) != 2 {
		t.Fatalf("first snapshot %v", s)
	}
	h.reportAll("r", envs, cmds[0].SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED) // nothing new: fine

	// A published checkpoint moves the anchor (sibling level: no snapshot of its own).
	h.stepAll("r", ranks, 1, 10)
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	h.stepAll("r", ranks, 2, 10)
	h.checkpoint("r", ranks, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	if n := len(h.snapshots("r")); n != 1 {
		t.Fatalf("%d snapshots after sibling-level checkpoints, want 1", n)
	}
	h.advance(60*time.Second, "r", alive...)
	cmds = h.snapshotCommands("r", envs[1])
	if len(cmds) != 2 || cmds[1].AnchorStep != 2 || cmds[1].Reason != v1.SnapshotReason_SNAPSHOT_REASON_INTERVAL || cmds[1].Forced {
		t.Fatalf("second tick: %v, want INTERVAL anchored to step 2", cmds)
	}
	inFlight := cmds[1].SnapshotId
	h.reportAll("r", envs[:1], inFlight, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)

	// Third tick: the second snapshot still waits for envs[1]: skipped.
	h.advance(60*time.Second, "r", alive...)
	if n := len(h.snapshots("r")); n != 2 {
		t.Fatalf("%d snapshots after a tick with one in flight, want 2", n)
	}
	skips := h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_SNAPSHOT_TICK_SKIPPED)
	if len(skips) != 1 || !strings.Contains(skips[0].Message, inFlight) {
		t.Fatalf("tick-skipped events %v", skips)
	}
	h.reportAll("r", envs[1:], inFlight, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	if s := h.lastSnapshot("r"); s.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Fatalf("second snapshot %v", s)
	}

	// The period continues from the ticks, not from the reports.
	h.advance(60*time.Second, "r", alive...)
	s := h.lastSnapshot("r")
	if len(h.snapshots("r")) != 3 || !s.IssuedAt.AsTime().Equal(t0.Add(240*time.Second)) {
		t.Fatalf("fourth tick: %v", s)
	}
	h.reportAll("r", envs, s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)

	// With no environment worker live, a tick is skipped too.
	for _, w := range envs {
		if _, err := h.e.DeregisterWorker(h.ctx, &v1.DeregisterWorkerRequest{RunId: "r", WorkerId: w}); err != nil {
			t.Fatal(err)
		}
	}
	h.advance(60*time.Second, "r", ranks...)
	if n := len(h.snapshots("r")); n != 3 {
		t.Fatalf("%d snapshots with no environment worker", n)
	}
	if skips := h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_SNAPSHOT_TICK_SKIPPED); len(skips) != 2 {
		t.Fatalf("tick-skipped events %v", skips)
	}
}

// max_consecutive_failures IO_ERROR/TIMEOUT outcomes in a row fail the run;
// a SAVED in between resets the count, a SKIPPED neither resets nor counts.
func TestMaxConsecutiveFailures(t *testing.T) {
	h := newHarness(t)
	h.create("r", intervalSpec(3))
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 2)
	alive := append(ranks, envs...)
	const timeout = v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT // here: envs[1] never reports

	for i, outcome := range []v1.SnapshotOutcome{
		v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, // 1
		timeout, // 2
		v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, // 0
		timeout, // 1
		v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED,  // 1
		v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, // 2
		timeout, // 3: fails the run
	} {
		tick := t0.Add(time.Duration(i+1) * time.Minute)
		h.advance(tick.Sub(h.clk.Now()), "r", alive...)
		s := h.lastSnapshot("r")
		if s.CompletedAt != nil || !s.IssuedAt.AsTime().Equal(tick) {
			t.Fatalf("tick %d: no new snapshot (last %v)", i+1, s)
		}
		h.wantState("r", v1.RunState_RUN_STATE_PENDING)
		if outcome == timeout {
			h.reportAll("r", envs[:1], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
			h.advance(29*time.Second, "r", alive...)
			if got := h.lastSnapshot("r"); got.CompletedAt != nil {
				t.Fatalf("tick %d: completed before snapshot_timeout_s: %v", i+1, got)
			}
			h.advance(time.Second, "r", alive...)
		} else {
			h.reportAll("r", envs, s.SnapshotId, outcome)
		}
		if got := h.lastSnapshot("r"); got.Outcome != outcome {
			t.Fatalf("tick %d: outcome %v, want %v", i+1, got.Outcome, outcome)
		}
	}
	run := h.wantState("r", v1.RunState_RUN_STATE_FAILED)
	if !strings.Contains(run.FailureMessage, "3 consecutive") {
		t.Fatalf("failure_message %q", run.FailureMessage)
	}
	h.wantStopLast("r", alive...)
	// No more ticks once the run is over.
	h.advance(5*time.Minute, "r")
	if n := len(h.snapshots("r")); n != 7 {
		t.Fatalf("%d snapshots after the run failed, want 7", n)
	}
}

// An INVARIANT_FAILURE in a regular snapshot fails the run at once, without
// waiting for the other workers, with the worker's message.
func TestInvariantFailureInRegularSnapshot(t *testing.T) {
	h := newHarness(t)
	ranks, envs := h.snapshotInFlight("r", 3)
	s := h.lastSnapshot("r")
	if err := h.report("r", envs[0], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1); err != nil {
		t.Fatal(err)
	}
	h.wantState("r", v1.RunState_RUN_STATE_RUNNING)
	if err := h.reportMsg("r", envs[1], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_INVARIANT_FAILURE, 1, "turn 7 lost its prefix"); err != nil {
		t.Fatal(err)
	}
	run := h.wantState("r", v1.RunState_RUN_STATE_FAILED)
	if !strings.Contains(run.FailureMessage, "turn 7 lost its prefix") {
		t.Fatalf("failure_message %q does not carry the worker's message", run.FailureMessage)
	}
	if got := h.lastSnapshot("r"); got.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_INVARIANT_FAILURE {
		t.Fatalf("snapshot %v", got)
	}
	h.wantStopLast("r", append(ranks, envs...)...)
	if d := h.step("r", ranks[0], 2, 10); d.Action != v1.StepAction_STEP_ACTION_STOP {
		t.Fatalf("CompleteStep in a failed run: %v", d.Action)
	}
}

// A lost environment worker does not hold up a snapshot: once its lease
// lapses, the snapshot completes (not SAVED: its state was not saved), and
// the next snapshot no longer waits for it.
func TestLostEnvWorkerDoesNotHoldUpSnapshot(t *testing.T) {
	h := newHarness(t)
	ranks, envs := h.snapshotInFlight("r", 2)
	s := h.lastSnapshot("r")
	if err := h.report("r", envs[0], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1); err != nil {
		t.Fatal(err)
	}
	// envs[1] goes silent; the lease TTL is 15 s.
	h.advance(10*time.Second, "r", ranks[0], envs[0])
	if got := h.lastSnapshot("r"); got.CompletedAt != nil {
		t.Fatalf("completed while the silent worker still held its lease: %v", got)
	}
	h.advance(10*time.Second, "r", ranks[0], envs[0])
	workers, err := h.e.ListWorkers(h.ctx, &v1.ListWorkersRequest{RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range workers.Workers {
		if w.WorkerId == envs[1] && w.State != v1.WorkerState_WORKER_STATE_LOST {
			t.Fatalf("silent worker is %v", w.State)
		}
	}
	got := h.lastSnapshot("r")
	if got.CompletedAt == nil || got.CompletedAt.AsTime().After(t0.Add(20*time.Second)) {
		t.Fatalf("snapshot not completed when its worker was lost: %v", got)
	}
	if got.Outcome == v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED || !strings.Contains(got.Message, envs[1]) {
		t.Fatalf("snapshot with a lost worker: %v %q", got.Outcome, got.Message)
	}
	if len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_WORKER_LOST)) != 1 {
		t.Fatal("want one WORKER_LOST event")
	}

	// The next snapshot expects only the live worker.
	h.stepAll("r", ranks, 2, 10)
	h.checkpoint("r", ranks, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	s = h.lastSnapshot("r")
	if len(s.ExpectedWorkerIds) != 1 || s.ExpectedWorkerIds[0] != envs[0] {
		t.Fatalf("second snapshot expects %v", s.ExpectedWorkerIds)
	}
	h.reportAll("r", envs[:1], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	if got := h.lastSnapshot("r"); got.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Fatalf("second snapshot %v", got)
	}
	h.wantState("r", v1.RunState_RUN_STATE_RUNNING)
}

// A snapshot that misses only the reports of workers lost meanwhile is
// TIMEOUT (their state was not saved) but does not count toward
// max_consecutive_failures: workers coming and going must not fail a run.
// A live worker that does not report still counts.
func TestLostWorkersDoNotCountAsSnapshotFailures(t *testing.T) {
	h := newHarness(t)
	h.create("r", intervalSpec(1))
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 3)

	// Tick 1: envs[0] saves; envs[1] is lost (its lease of 15 s lapses);
	// envs[2] saved... and is lost too before the snapshot completes.
	h.advance(time.Minute, "r", append(ranks, envs...)...)
	s := h.lastSnapshot("r")
	h.reportAll("r", []string{envs[0], envs[2]}, s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.advance(20*time.Second, "r", ranks[0], envs[0])
	got := h.lastSnapshot("r")
	if got.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT || !strings.Contains(got.Message, "not counted") {
		t.Fatalf("snapshot missing a lost worker's report: %v %q, want TIMEOUT, not counted", got.Outcome, got.Message)
	}
	h.wantState("r", v1.RunState_RUN_STATE_PENDING)

	// Tick 2: envs[0] stays live and does not report: that counts, and
	// with max_consecutive_failures 1 fails the run.
	h.advance(40*time.Second, "r", ranks[0], envs[0])
	s = h.lastSnapshot("r")
	h.advance(30*time.Second, "r", ranks[0], envs[0])
	if got := h.lastSnapshot("r"); got.SnapshotId != s.SnapshotId || got.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT {
		t.Fatalf("second snapshot %v, want %s TIMEOUT", got, s.SnapshotId)
	}
	run := h.wantState("r", v1.RunState_RUN_STATE_FAILED)
	if !strings.Contains(run.FailureMessage, "1 consecutive") {
		t.Fatalf("failure_message %q", run.FailureMessage)
	}
}

// Reports are idempotent: the same report twice is one report; after the
// run is terminal the retry is still OK while a new report is
// FAILED_PRECONDITION; an unknown snapshot is NOT_FOUND.
func TestIdempotentReports(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(2, ""))
	ranks := h.trainers("r", 2)
	envs := h.envs("r", 2)
	h.stepAll("r", ranks, 1, 10)

	n := len(h.events("r"))
	h.checkpoint("r", ranks[:1], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	afterFirst := len(h.events("r"))
	h.checkpoint("r", ranks[:1], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 99) // a retry
	if got := len(h.events("r")); got != afterFirst {
		t.Fatalf("a checkpoint retry added %d events", got-afterFirst)
	}
	if c := h.get("r").Deadline.CheckpointSeconds; c != 5 {
		t.Fatalf("a retry changed C to %v", c)
	}
	if afterFirst != n {
		t.Fatalf("one rank's SAVED added %d events", afterFirst-n)
	}
	h.checkpoint("r", ranks[1:], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5) // completes: saved, published, snapshot
	if len(h.snapshots("r")) != 1 {
		t.Fatal("no snapshot after the checkpoint")
	}
	n = len(h.events("r"))
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	h.checkpoint("r", ranks[:1], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED, 0) // SAVED already meant published
	if got := len(h.events("r")); got != n || len(h.snapshots("r")) != 1 {
		t.Fatalf("retries after completion added %d events, %d snapshots", got-n, len(h.snapshots("r")))
	}

	s := h.lastSnapshot("r")
	if err := h.report("r", envs[0], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1); err != nil {
		t.Fatal(err)
	}
	n = len(h.events("r"))
	if err := h.report("r", envs[0], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, 2); err != nil {
		t.Fatalf("snapshot report retry: %v", err)
	}
	if got := len(h.events("r")); got != n {
		t.Fatalf("a snapshot report retry added %d events", got-n)
	}
	if got := h.lastSnapshot("r"); len(got.Reports) != 1 || got.Reports[0].Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Fatalf("reports after a retry: %v (the first report stands)", got.Reports)
	}
	err := h.report("r", envs[0], "snap-99", v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1)
	wantErr(t, err, ErrNotFound, "snapshot_id")

	// End the run; retries are still fine, new reports are not.
	h.stepAll("r", ranks, 2, 10)
	if _, err := h.e.FinishRun(h.ctx, &v1.FinishRunRequest{RunId: "r", WorkerId: ranks[0]}); err != nil {
		t.Fatal(err)
	}
	h.wantState("r", v1.RunState_RUN_STATE_COMPLETED)
	n = len(h.events("r"))
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	if err := h.report("r", envs[0], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1); err != nil {
		t.Fatalf("retry into a terminal run: %v", err)
	}
	_, err = h.e.ReportCheckpoint(h.ctx, &v1.ReportCheckpointRequest{RunId: "r", WorkerId: ranks[0], Step: 2,
		Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 5})
	wantErr(t, err, ErrFailedPrecondition, "COMPLETED")
	err = h.report("r", envs[1], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1)
	wantErr(t, err, ErrFailedPrecondition, "COMPLETED")
	err = h.report("r", envs[1], "snap-99", v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1)
	wantErr(t, err, ErrNotFound, "snapshot_id")
	if got := len(h.events("r")); got != n {
		t.Fatalf("reports into a terminal run added %d events", got-n)
	}

	// The same after a restart: the records, not memory, decide.
	h.restart()
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	if err := h.report("r", envs[0], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1); err != nil {
		t.Fatalf("retry after restart: %v", err)
	}
	err = h.report("r", envs[1], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1)
	wantErr(t, err, ErrFailedPrecondition, "COMPLETED")

	// Reports from the wrong role are refused.
	_, err = h.e.ReportCheckpoint(h.ctx, &v1.ReportCheckpointRequest{RunId: "r", WorkerId: envs[0], Step: 1,
		Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED})
	wantErr(t, err, ErrInvalidArgument, "worker_id")
	err = h.report("r", ranks[0], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1)
	wantErr(t, err, ErrInvalidArgument, "worker_id")
}

// ListSnapshots pages: by page_size, and by bytes, so that a run whose
// snapshots carry thousands of reports never answers more than a client
// accepts. The pages hold every snapshot once, oldest first.
func TestListSnapshotsPages(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, "01:00:00:00"))
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 8)
	long := strings.Repeat("x", 4000) // 8 reports of 4 KB: 32 KB a snapshot
	const n = 40
	for step := int64(1); step <= n; step++ {
		h.stepAll("r", ranks, step, 10)
		h.checkpoint("r", ranks, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
		id := h.lastSnapshot("r").SnapshotId
		for _, w := range envs {
			if err := h.reportMsg("r", w, id, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1, long); err != nil {
				t.Fatal(err)
			}
		}
	}
	pages := func(size int32) (sizes []int) {
		t.Helper()
		var ids []string
		req := &v1.ListSnapshotsRequest{RunId: "r", PageSize: size}
		for {
			resp, err := h.e.ListSnapshots(h.ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if b := proto.Size(resp); b > snapshotPageBytes+1024 {
				t.Errorf("a page of %d bytes", b)
			}
			sizes = append(sizes, len(resp.Snapshots))
			for _, s := range resp.Snapshots {
				ids = append(ids, s.SnapshotId)
			}
			if req.PageToken = resp.NextPageToken; req.PageToken == "" {
				break
			}
		}
		for i, id := range ids {
			if want := snapshotID(int64(i + 1)); id != want {
				t.Fatalf("page_size %d: snapshot %d is %s, want %s (all: %v)", size, i, id, want, ids)
			}
		}
		if len(ids) != n {
			t.Fatalf("page_size %d: %d snapshots, want %d", size, len(ids), n)
		}
		return sizes
	}
	if got := pages(7); !slices.Equal(got, []int{7, 7, 7, 7, 7, 5}) {
		t.Errorf("page_size 7: pages of %v", got)
	}
	if got := pages(0); len(got) < 2 {
		t.Errorf("page_size 0: pages of %v, want 1 MiB pages", got)
	}
	_, err := h.e.ListSnapshots(h.ctx, &v1.ListSnapshotsRequest{RunId: "r", PageToken: "bm90LWEtc25hcHNob3Q"})
	wantErr(t, err, ErrInvalidArgument, "page_token")
}

// A completed snapshot's reports are kept on disk, not in memory, yet
// ListSnapshots shows them all, late ones included, in the order they came,
// before and after a restart. A late report changes no outcome; the first
// report of a worker stands; in a terminal run only its retry is accepted.
func TestCompletedSnapshotReports(t *testing.T) {
	h := newHarness(t)
	h.create("r", intervalSpec(5))
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 4)
	alive := append(ranks, envs...)
	const saved, ioErr = v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR

	h.advance(time.Minute, "r", alive...)
	s := h.lastSnapshot("r")
	h.reportAll("r", envs[1:2], s.SnapshotId, saved)
	h.advance(time.Second, "r", alive...) // reports are ordered by their time
	h.reportAll("r", envs[:1], s.SnapshotId, saved)
	h.advance(29*time.Second, "r", alive...) // envs[2] and envs[3] are late
	if got := h.lastSnapshot("r"); got.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT {
		t.Fatalf("snapshot %v, want TIMEOUT", got)
	}
	h.advance(time.Second, "r", alive...)
	if err := h.report("r", envs[2], s.SnapshotId, saved, 31); err != nil {
		t.Fatalf("late report: %v", err)
	}
	if err := h.report("r", envs[2], s.SnapshotId, ioErr, 32); err != nil {
		t.Fatalf("retry of a late report: %v", err)
	}
	wantReports := func(when string, ids ...string) {
		t.Helper()
		got := h.snapshots("r")[0]
		if got.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT || len(got.ExpectedWorkerIds) != len(envs) {
			t.Fatalf("%s: snapshot %v, want TIMEOUT expecting %d workers", when, got, len(envs))
		}
		var reported []string
		for _, rep := range got.Reports {
			reported = append(reported, rep.WorkerId)
			if rep.Outcome != saved {
				t.Fatalf("%s: %s's report %v, want its first, SAVED", when, rep.WorkerId, rep.Outcome)
			}
		}
		if !slices.Equal(reported, ids) {
			t.Fatalf("%s: reports from %v, want %v in the order they came", when, reported, ids)
		}
	}
	wantReports("after a late report", envs[1], envs[0], envs[2])

	h.stepAll("r", ranks, 1, 10)
	if _, err := h.e.FinishRun(h.ctx, &v1.FinishRunRequest{RunId: "r", WorkerId: ranks[0]}); err != nil {
		t.Fatal(err)
	}
	h.wantState("r", v1.RunState_RUN_STATE_COMPLETED)
	for _, when := range []string{"terminal run", "terminal run after a restart"} {
		if err := h.report("r", envs[2], s.SnapshotId, saved, 31); err != nil {
			t.Fatalf("%s: retry of a late report: %v", when, err)
		}
		err := h.report("r", envs[3], s.SnapshotId, saved, 40)
		wantErr(t, err, ErrFailedPrecondition, "COMPLETED")
		wantReports(when, envs[1], envs[0], envs[2])
		h.restart()
	}
}

// A run that ends with a regular snapshot in flight closes it: the
// snapshot's outcome can no longer change the run. Before, the last worker
// leaving completed it as TIMEOUT, and a COMPLETED or CANCELLED run became
// FAILED, sent a second Stop and answered a step differently.
func TestRunEndClosesSnapshotInFlight(t *testing.T) {
	for _, end := range []struct {
		name  string
		state v1.RunState
		call  func(h *harness, rank string) error
	}{
		{"finish", v1.RunState_RUN_STATE_COMPLETED, func(h *harness, rank string) error {
			_, err := h.e.FinishRun(h.ctx, &v1.FinishRunRequest{RunId: "r", WorkerId: rank})
			return err
		}},
		{"cancel", v1.RunState_RUN_STATE_CANCELLED, func(h *harness, _ string) error {
			_, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "r"})
			return err
		}},
	} {
		t.Run(end.name, func(t *testing.T) {
			h := newHarness(t)
			h.create("r", intervalSpec(1))
			ranks := h.trainers("r", 1)
			envs := h.envs("r", 2)
			h.advance(60*time.Second, "r", append(ranks, envs...)...)
			s := h.lastSnapshot("r")
			if err := h.report("r", envs[0], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, 1); err != nil {
				t.Fatal(err)
			}
			if err := end.call(h, ranks[0]); err != nil {
				t.Fatal(err)
			}
			ended := h.wantState("r", end.state)
			before := h.step("r", ranks[0], 7, 1)
			closed := h.lastSnapshot("r")
			if closed.SnapshotId != s.SnapshotId || closed.CompletedAt == nil ||
				closed.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED || !strings.Contains(closed.Message, "run ended") {
				t.Fatalf("snapshot after the run ended: %v", closed)
			}

			if _, err := h.e.DeregisterWorker(h.ctx, &v1.DeregisterWorkerRequest{RunId: "r", WorkerId: envs[1]}); err != nil {
				t.Fatal(err)
			}
			h.advance(10*time.Minute, "r") // every lease lapses too
			h.restart()
			after := h.wantState("r", end.state)
			if !proto.Equal(after.EndedAt, ended.EndedAt) || after.FailureMessage != ended.FailureMessage {
				t.Fatalf("the ended run changed: ended_at %v → %v, message %q → %q",
					ended.EndedAt, after.EndedAt, ended.FailureMessage, after.FailureMessage)
			}
			if got := h.lastSnapshot("r"); got.Outcome != closed.Outcome || !proto.Equal(got.CompletedAt, closed.CompletedAt) {
				t.Fatalf("the closed snapshot changed: %v", got)
			}
			if again := h.step("r", ranks[0], 7, 1); again.Explanation != before.Explanation {
				t.Fatalf("step 7 answered %q, then %q", before.Explanation, again.Explanation)
			}
			stops := 0
			for _, c := range h.commands("r", envs[0]) {
				if c.GetStop() != nil {
					stops++
				}
			}
			if stops != 1 {
				t.Fatalf("%d Stop commands, want 1", stops)
			}
		})
	}
}

// A snapshot that fails on thousands of workers names the first few, with
// the start of their messages, and counts the rest: its message goes on
// into failure_message and every worker's Stop, which must stay readable.
// Control characters in a message are stored as spaces.
func TestSnapshotFailureMessageIsBounded(t *testing.T) {
	h := newHarness(t)
	h.create("r", intervalSpec(1))
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 20)
	h.advance(60*time.Second, "r", append(ranks, envs...)...)
	s := h.lastSnapshot("r")
	long := "disk full\x00\n\x1b[2K" + strings.Repeat("é", 2000) // 4 KB, with control characters
	for _, env := range envs {
		if err := h.reportMsg("r", env, s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, 1, long); err != nil {
			t.Fatal(err)
		}
	}
	run := h.wantState("r", v1.RunState_RUN_STATE_FAILED)
	msg := run.FailureMessage
	if len(msg) > 2048 || !strings.Contains(msg, "and 15 more") || !utf8.ValidString(msg) {
		t.Fatalf("failure_message of %d bytes (valid UTF-8: %v): %.300q", len(msg), utf8.ValidString(msg), msg)
	}
	for _, r := range msg {
		if unicode.IsControl(r) {
			t.Fatalf("failure_message holds control character %q", r)
		}
	}
}
