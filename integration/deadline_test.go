package integration

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/coordinator"
	"github.com/snapcoord/snapcoord/server/engine"
)

// The whole deadline sequence over a real server: 4 trainer ranks and 8
// environment workers (half streaming, half long-polling; the ranks too).
// The deadline fires at the step the test chooses; every rank is told the
// identical decision; every environment worker receives SaveAtDeadline
// exactly once; Stop reaches all twelve workers; the run ends STOPPED.
func TestDeadlineScenario(t *testing.T) {
	ctx := testContext(t)
	srv := startInproc(t, nil)
	r := newCluster(t, srv.addr).createRun(ctx, "scenario", deadlineSpec(4, time.Now().Add(time.Hour), false))
	ranks := r.trainers(ctx, 4)
	envs := r.envs(ctx, 8)

	var trainerReaders, envReaders []*reader
	for i, id := range ranks {
		trainerReaders = append(trainerReaders, r.startReader(ctx, fmt.Sprintf("rank-%d", i), id, i >= 2, 0))
	}
	for i, id := range envs {
		envReaders = append(envReaders, r.startReader(ctx, fmt.Sprintf("env-%d", i), id, i >= 4, 0))
	}

	for step := int64(1); step <= 2; step++ {
		if d := r.stepAll(ctx, ranks, step, shortIteration); d.Action != v1.StepAction_STEP_ACTION_CONTINUE {
			t.Fatalf("step %d: %v (%s), want CONTINUE", step, d.Action, d.Explanation)
		}
	}
	fired := r.stepAll(ctx, ranks, 3, fireIteration)
	if fired.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 3: %v (%s), want SAVE_AND_STOP", fired.Action, fired.Explanation)
	}
	if d := r.stepAll(ctx, ranks, 4, shortIteration); d.Action != v1.StepAction_STEP_ACTION_STOP {
		t.Fatalf("step 4 after the fire: %v, want STOP", d.Action)
	}
	if run := r.get(ctx); run.State != v1.RunState_RUN_STATE_SAVING || run.FiredAtStep != 3 {
		t.Fatalf("after the fire: state %v, fired_at_step %d; want SAVING at 3", run.State, run.FiredAtStep)
	}

	// The ranks save, all at once; the last SAVED publishes step 3 and
	// sends SaveAtDeadline to every environment worker.
	var wg sync.WaitGroup
	for _, id := range ranks {
		wg.Go(func() {
			_, err := r.ws.ReportCheckpoint(ctx, &v1.ReportCheckpointRequest{RunId: r.id, WorkerId: id, Step: 3,
				Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 2.5})
			if err != nil {
				t.Errorf("ReportCheckpoint(step 3) by %s: %v", id, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	var snapID string
	for _, rd := range envReaders {
		c := rd.expect(ctx, "SaveAtDeadline")
		sad := c.GetSaveAtDeadline()
		if snapID == "" {
			snapID = sad.SnapshotId
		}
		if sad.SnapshotId != snapID || sad.AnchorStep != 3 || sad.MustFinishBy == nil {
			t.Fatalf("%s: SaveAtDeadline %v, want snapshot %s anchored at step 3 with must_finish_by", rd, sad, snapID)
		}
	}
	if run := r.get(ctx); run.State != v1.RunState_RUN_STATE_SNAPSHOTTING || run.LastPublishedStep != 3 {
		t.Fatalf("after the checkpoint: state %v, last_published_step %d; want SNAPSHOTTING, 3", run.State, run.LastPublishedStep)
	}
	for _, id := range envs {
		wg.Go(func() {
			if err := r.reportSnapshot(ctx, id, snapID, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
				t.Errorf("ReportSnapshot by %s: %v", id, err)
			}
		})
	}
	wg.Wait()

	all := append(append([]*reader(nil), trainerReaders...), envReaders...)
	waitStopped(ctx, t, all...)
	if t.Failed() {
		return
	}

	// Each role saw exactly its commands, the same ones whether it streamed
	// or polled: environment workers one SaveAtDeadline then Stop, ranks
	// only the Stop (no deferred finalize, so no PublishCheckpoint).
	envLog := envReaders[0].log()
	if got := kinds(envLog); len(envLog) != 2 || envLog[0].GetSaveAtDeadline() == nil || envLog[1].GetStop() == nil {
		t.Fatalf("environment worker received %s, want [SaveAtDeadline Stop]", got)
	}
	for _, rd := range envReaders[1:] {
		sameCommands(t, rd.String(), rd.log(), envLog)
	}
	for _, rd := range trainerReaders {
		sameCommands(t, rd.String(), rd.log(), envLog[1:])
	}
	// The command log replayed from 0 is what the workers were sent.
	resp, err := r.ws.PollCommands(ctx, &v1.PollCommandsRequest{RunId: r.id, WorkerId: envs[0]})
	if err != nil {
		t.Fatalf("PollCommands from 0: %v", err)
	}
	sameCommands(t, "replay from seq 0", resp.Commands, envLog)

	run := r.get(ctx)
	if run.State != v1.RunState_RUN_STATE_STOPPED || run.FiredAtStep != 3 || run.LastPublishedStep != 3 {
		t.Errorf("final run: state %v, fired_at_step %d, last_published_step %d; want STOPPED, 3, 3",
			run.State, run.FiredAtStep, run.LastPublishedStep)
	}
	snaps := r.snapshots(ctx)
	if len(snaps) != 1 {
		t.Fatalf("%d snapshots, want the deadline snapshot only: %v", len(snaps), snaps)
	}
	s := snaps[0]
	if s.SnapshotId != snapID || s.Reason != v1.SnapshotReason_SNAPSHOT_REASON_DEADLINE || !s.Forced ||
		s.AnchorStep != 3 || s.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED || len(s.Reports) != len(envs) {
		t.Errorf("deadline snapshot %v: want %s, DEADLINE, forced, anchor 3, SAVED, %d reports", s, snapID, len(envs))
	}
	evs := r.events(ctx)
	checkEventLog(t, evs, nil)
	if f := eventsOf(evs, v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_FIRED); len(f) != 1 || f[0].Step != 3 {
		t.Errorf("DEADLINE_FIRED events %v, want one at step 3", f)
	}
	if d := eventsOf(evs, v1.RunEventType_RUN_EVENT_TYPE_DECISION); len(d) != 4 {
		t.Errorf("%d DECISION events, want 4: a decision is made once per step, not once per rank", len(d))
	}

	// After the end: the same decision for the fired step, retries of
	// recorded reports are OK, anything new is refused.
	if d := r.step(ctx, ranks[1], 3, fireIteration); !protoEqual(d, fired) {
		t.Errorf("CompleteStep(3) again: %v, want the stored %v", d, fired)
	}
	if err := r.reportSnapshot(ctx, envs[5], snapID, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
		t.Errorf("retried ReportSnapshot after STOPPED: %v, want OK", err)
	}
	r.saved(ctx, ranks[2], 3, 2.5)
	_, err = r.ws.ReportCheckpoint(ctx, &v1.ReportCheckpointRequest{RunId: r.id, WorkerId: ranks[0], Step: 4,
		Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 1})
	wantCode(t, "new ReportCheckpoint after STOPPED", err, codes.FailedPrecondition)
	err = r.reportSnapshot(ctx, envs[0], "snap-999", v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	wantCode(t, "ReportSnapshot of a snapshot never issued", err, codes.NotFound)
}

// A streaming worker whose stream drops in the middle of the run and
// reconnects with its last sequence number receives exactly what a worker
// that never disconnected received, and so does a polling worker: nothing
// missed, nothing invented, nothing twice. The first cut is made before a
// command is issued, so that command must be replayed from the log; the
// second right after one was issued, so depending on timing it lands before
// or after the command was sent, and both must give the same log.
func TestStreamReconnectMissesNothing(t *testing.T) {
	ctx := testContext(t)
	srv := startInproc(t, nil)
	r := newCluster(t, srv.addr).createRun(ctx, "reconnect", deadlineSpec(1, time.Now().Add(time.Hour), true))
	rank := r.trainers(ctx, 1)[0]
	envs := r.envs(ctx, 3)
	trainer := r.startReader(ctx, "rank-0", rank, false, 0)
	steady := r.startReader(ctx, "steady", envs[0], false, 0)
	poller := r.startReader(ctx, "poller", envs[1], true, 0)
	flaky := r.startReader(ctx, "flaky", envs[2], false, 0)
	var flakyLog []*v1.Command // what flaky received over all its connections

	// answer has a worker report the snapshot command c.
	answer := func(rd *reader, c *v1.Command) {
		t.Helper()
		id := c.GetSnapshot().GetSnapshotId()
		if sad := c.GetSaveAtDeadline(); sad != nil {
			id = sad.SnapshotId
		}
		if id == "" {
			t.Fatalf("%s: %s is not a snapshot command", rd, kindOf(c))
		}
		if err := r.reportSnapshot(ctx, rd.workerID, id, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
			t.Fatalf("ReportSnapshot by %s: %v", rd, err)
		}
	}
	// cut drops flaky's connection, answers what it had received but not
	// yet answered, and returns the seq to resume from.
	answered := 0
	cut := func() int64 {
		t.Helper()
		flaky.disconnect()
		if err := flaky.endErr(); err == nil {
			t.Fatalf("flaky ended with a Stop before its cut")
		}
		flaky.checkClean()
		got := flaky.log()
		flakyLog = append(flakyLog, got...)
		for _, c := range got[answered:] {
			answer(flaky, c)
		}
		answered = 0
		return flaky.lastSeq()
	}
	// Steps 1 and 2: a published checkpoint, a Snapshot to every worker,
	// every worker reports.
	for step := int64(1); step <= 2; step++ {
		r.step(ctx, rank, step, shortIteration)
		r.saved(ctx, rank, step, 1)
		for _, rd := range []*reader{steady, poller, flaky} {
			answer(rd, rd.expect(ctx, "Snapshot"))
		}
		answered++
	}

	// Cut 1, before step 3's Snapshot is issued: flaky must get it from
	// the log when it comes back.
	after := cut()
	r.step(ctx, rank, 3, shortIteration)
	r.saved(ctx, rank, 3, 1)
	for _, rd := range []*reader{steady, poller} {
		answer(rd, rd.expect(ctx, "Snapshot"))
	}
	flaky = r.startReader(ctx, "flaky-2", envs[2], false, after)
	answer(flaky, flaky.expect(ctx, "Snapshot"))
	answered++

	// Step 4 fires the deadline; cut 2 races the SaveAtDeadline.
	if d := r.step(ctx, rank, 4, fireIteration); d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 4: %v, want SAVE_AND_STOP", d.Action)
	}
	r.saved(ctx, rank, 4, 1)
	after = cut()
	cutAt := len(flakyLog)
	for _, rd := range []*reader{steady, poller} {
		answer(rd, rd.expect(ctx, "SaveAtDeadline"))
	}
	flaky = r.startReader(ctx, "flaky-3", envs[2], false, after)
	for {
		c := flaky.next(ctx)
		if c.GetStop() != nil {
			break
		}
		answer(flaky, c)
	}
	waitStopped(ctx, t, trainer, steady, poller, flaky)
	if t.Failed() {
		return
	}
	flakyLog = append(flakyLog, flaky.log()...)

	want := steady.log()
	if got := kinds(want); len(want) != 5 || want[3].GetSaveAtDeadline() == nil || want[4].GetStop() == nil {
		t.Errorf("environment log %s, want three Snapshots, SaveAtDeadline, Stop", got)
	}
	sameCommands(t, "flaky (over three connections)", flakyLog, want)
	sameCommands(t, "poller", poller.log(), want)
	resp, err := r.ws.PollCommands(ctx, &v1.PollCommandsRequest{RunId: r.id, WorkerId: envs[2]})
	if err != nil {
		t.Fatalf("PollCommands from 0: %v", err)
	}
	sameCommands(t, "replay from seq 0", resp.Commands, want)
	if run := r.get(ctx); run.State != v1.RunState_RUN_STATE_STOPPED {
		t.Errorf("run %v, want STOPPED", run.State)
	}
	t.Logf("the second cut came after flaky had %d of the 5 commands", cutAt)
}

// PollCommands returns at once when something is pending, wakes up when a
// command is issued while it waits, and never waits longer than the server's
// cap, whatever wait_seconds asks.
func TestPollCommandsWaits(t *testing.T) {
	ctx := testContext(t)
	srv := startInproc(t, nil)
	r := newCluster(t, srv.addr).createRun(ctx, "poll", deadlineSpec(1, time.Now().Add(time.Hour), false))
	rank := r.trainers(ctx, 1)[0]
	env := r.envs(ctx, 1)[0]

	// A poll waiting with nothing pending is woken by the SaveAtDeadline.
	// wait_seconds is far beyond the test timeout: only a wake-up ends it.
	type result struct {
		resp *v1.PollCommandsResponse
		err  error
	}
	woke := make(chan result, 1)
	go func() {
		resp, err := r.ws.PollCommands(ctx, &v1.PollCommandsRequest{RunId: r.id, WorkerId: env, WaitSeconds: 3600})
		woke <- result{resp, err}
	}()
	r.step(ctx, rank, 1, fireIteration)
	r.saved(ctx, rank, 1, 1)
	var got result
	select {
	case got = <-woke:
	case <-ctx.Done():
		t.Fatal("a waiting poll was not woken by a new command")
	}
	if got.err != nil || len(got.resp.Commands) != 1 || got.resp.Commands[0].GetSaveAtDeadline() == nil {
		t.Fatalf("woken poll: %v, %v; want the SaveAtDeadline", got.resp, got.err)
	}
	seq := got.resp.Commands[0].Seq

	// Pending: returned at once, even with a long wait.
	resp, err := r.ws.PollCommands(ctx, &v1.PollCommandsRequest{RunId: r.id, WorkerId: env, AfterSeq: seq - 1, WaitSeconds: 3600})
	if err != nil || len(resp.Commands) != 1 || resp.Commands[0].Seq != seq {
		t.Fatalf("poll with a pending command: %v, %v", resp, err)
	}

	// Nothing pending and a server capped at 200ms: wait_seconds 3600 ends
	// empty after about the cap.
	capped := startInproc(t, nil, coordinator.WithEngine(func(o *engine.Options) { o.MaxPollWait = 200 * time.Millisecond }))
	r2 := newCluster(t, capped.addr).createRun(ctx, "capped", deadlineSpec(1, time.Now().Add(time.Hour), false))
	env2 := r2.envs(ctx, 1)[0]
	start := time.Now()
	resp, err = r2.ws.PollCommands(ctx, &v1.PollCommandsRequest{RunId: r2.id, WorkerId: env2, WaitSeconds: 3600})
	elapsed := time.Since(start)
	if err != nil || len(resp.Commands) != 0 {
		t.Fatalf("capped poll: %v, %v; want no commands", resp, err)
	}
	if elapsed < 150*time.Millisecond || elapsed > 10*time.Second {
		t.Errorf("capped poll took %v, want about the 200ms cap", elapsed)
	}
}

// A run's terminal state and its Stop are committed together, so a poll
// never answers a terminal run_state without the Stop: here non-waiting
// polls spin while the last report of the deadline snapshot commits.
func TestPollNeverTellsTerminalBeforeStop(t *testing.T) {
	ctx := testContext(t)
	srv := startInproc(t, nil)
	for round := range 5 {
		r := newCluster(t, srv.addr).createRun(ctx, fmt.Sprintf("spin-%d", round), deadlineSpec(1, time.Now().Add(time.Hour), false))
		rank := r.trainers(ctx, 1)[0]
		envs := r.envs(ctx, 4)
		var readers []*reader
		for i, id := range envs {
			readers = append(readers, r.startReaderWait(ctx, fmt.Sprintf("env-%d", i), id, true, 0, 0))
		}
		r.step(ctx, rank, 1, fireIteration)
		r.saved(ctx, rank, 1, 1)
		var snapID string
		for _, rd := range readers {
			snapID = rd.expect(ctx, "SaveAtDeadline").GetSaveAtDeadline().SnapshotId
		}
		for _, id := range envs {
			if err := r.reportSnapshot(ctx, id, snapID, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
				t.Fatalf("ReportSnapshot: %v", err)
			}
		}
		waitStopped(ctx, t, readers...)
	}
}

// With deferred finalize, the PublishCheckpoint of the fired step reaches
// every rank (streaming or polling) and no environment worker; one
// PUBLISHED report then starts the deadline snapshot.
func TestPublishCheckpointReachesEveryRank(t *testing.T) {
	ctx := testContext(t)
	srv := startInproc(t, nil)
	spec := deadlineSpec(3, time.Now().Add(time.Hour), false)
	spec.Checkpointing.DeferredFinalize = true
	r := newCluster(t, srv.addr).createRun(ctx, "deferred", spec)
	ranks := r.trainers(ctx, 3)
	env := r.envs(ctx, 1)[0]
	var trainers []*reader
	for i, id := range ranks {
		trainers = append(trainers, r.startReader(ctx, fmt.Sprintf("rank-%d", i), id, i == 1, 0))
	}
	envReader := r.startReader(ctx, "env-0", env, true, 0)

	if d := r.stepAll(ctx, ranks, 1, fireIteration); d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 1: %v, want SAVE_AND_STOP", d.Action)
	}
	for _, id := range ranks {
		r.saved(ctx, id, 1, 1)
	}
	for _, rd := range trainers {
		if c := rd.expect(ctx, "PublishCheckpoint"); c.GetPublishCheckpoint().Step != 1 {
			t.Fatalf("%s: PublishCheckpoint %v, want step 1", rd, c.GetPublishCheckpoint())
		}
	}
	if run := r.get(ctx); run.State != v1.RunState_RUN_STATE_SAVING || run.LastPublishedStep != 0 {
		t.Fatalf("before PUBLISHED: state %v, last_published_step %d; want SAVING, 0", run.State, run.LastPublishedStep)
	}
	_, err := r.ws.ReportCheckpoint(ctx, &v1.ReportCheckpointRequest{RunId: r.id, WorkerId: ranks[0], Step: 1,
		Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED})
	if err != nil {
		t.Fatalf("ReportCheckpoint PUBLISHED: %v", err)
	}
	snapID := envReader.expect(ctx, "SaveAtDeadline").GetSaveAtDeadline().SnapshotId
	if err := r.reportSnapshot(ctx, env, snapID, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
		t.Fatalf("ReportSnapshot: %v", err)
	}
	waitStopped(ctx, t, append(trainers, envReader)...)
	for _, rd := range trainers {
		if got := rd.log(); len(got) != 2 || got[1].GetStop() == nil {
			t.Errorf("%s received %s, want [PublishCheckpoint Stop]", rd, kinds(got))
		}
	}
	if got := envReader.log(); len(got) != 2 || got[0].GetSaveAtDeadline() == nil {
		t.Errorf("env-0 received %s, want [SaveAtDeadline Stop]", kinds(got))
	}
	if run := r.get(ctx); run.State != v1.RunState_RUN_STATE_STOPPED || run.LastPublishedStep != 1 {
		t.Errorf("final: state %v, last_published_step %d; want STOPPED, 1", run.State, run.LastPublishedStep)
	}
}
