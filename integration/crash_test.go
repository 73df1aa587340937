package integration

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// The coordinator binary is SIGKILLed twice in the middle of the deadline
// sequence and restarted on the same data directory and port: once after
// the deadline fired and half the ranks reported SAVED, once after
// SaveAtDeadline was issued and half the environment workers reported.
// Every acknowledged report survives, the fired step's decision is the
// same, streaming and polling workers resume from their last sequence
// number without re-registering, and the run completes its sequence.
func TestCrashDuringDeadlineSequence(t *testing.T) {
	ctx := testContext(t)
	p := startProc(t)
	r := newCluster(t, p.addr).createRun(ctx, "crash", deadlineSpec(4, time.Now().Add(time.Hour), false))
	ranks := r.trainers(ctx, 4)
	envs := r.envs(ctx, 4)
	var trainers, envReaders []*reader
	for i, id := range ranks {
		trainers = append(trainers, r.startReader(ctx, fmt.Sprintf("rank-%d", i), id, i%2 == 1, 0))
	}
	for i, id := range envs {
		envReaders = append(envReaders, r.startReader(ctx, fmt.Sprintf("env-%d", i), id, i%2 == 1, 0))
	}

	for step := int64(1); step <= 2; step++ {
		r.stepAll(ctx, ranks, step, shortIteration)
	}
	fired := r.stepAll(ctx, ranks[:2], 3, fireIteration)
	if fired.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 3: %v, want SAVE_AND_STOP", fired.Action)
	}
	r.saved(ctx, ranks[0], 3, 2)
	r.saved(ctx, ranks[1], 3, 2)
	before := r.events(ctx)

	// Crash 1: fired at step 3, ranks 0 and 1 SAVED, ranks 2 and 3 have
	// not even asked about step 3 yet.
	p.kill()
	p.restart()

	run := r.get(ctx)
	if run.State != v1.RunState_RUN_STATE_SAVING || run.FiredAtStep != 3 || run.LastStep != 3 || run.LastPublishedStep != 0 {
		t.Fatalf("after crash 1: state %v fired_at_step %d last_step %d last_published_step %d; want SAVING, 3, 3, 0",
			run.State, run.FiredAtStep, run.LastStep, run.LastPublishedStep)
	}
	checkEventLog(t, r.events(ctx), before)
	for _, w := range r.workers(ctx) {
		if w.State != v1.WorkerState_WORKER_STATE_LIVE || w.Incarnation != 1 {
			t.Errorf("after crash 1: worker %s %v incarnation %d, want LIVE, 1", w.Name, w.State, w.Incarnation)
		}
	}
	// The decision for step 3 was stored before rank 0 heard it: ranks
	// that ask for the first time after the crash hear the same, to the
	// timestamp.
	if d := r.stepAll(ctx, ranks, 3, fireIteration); !protoEqual(d, fired) {
		t.Fatalf("step 3 after the crash: %v, want the decision given before it: %v", d, fired)
	}
	// Ranks 2 and 3 save. Only the SAVED reports of ranks 0 and 1 from
	// before the crash make that all four: the checkpoint publishes.
	r.saved(ctx, ranks[2], 3, 2)
	r.saved(ctx, ranks[3], 3, 2)
	run = r.get(ctx)
	if run.State != v1.RunState_RUN_STATE_SNAPSHOTTING || run.LastPublishedStep != 3 {
		t.Fatalf("after all ranks saved: state %v last_published_step %d; want SNAPSHOTTING, 3 (SAVED reports from before the crash lost?)",
			run.State, run.LastPublishedStep)
	}
	var snapID string
	for _, rd := range envReaders {
		snapID = rd.expect(ctx, "SaveAtDeadline").GetSaveAtDeadline().SnapshotId
	}
	for _, i := range []int{0, 1} { // one streaming and one polling worker
		if err := r.reportSnapshot(ctx, envs[i], snapID, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
			t.Fatalf("ReportSnapshot by env-%d: %v", i, err)
		}
	}
	before = r.events(ctx)

	// Crash 2: SaveAtDeadline issued, two of four environment workers
	// reported.
	p.kill()
	p.restart()

	checkEventLog(t, r.events(ctx), before)
	snaps := r.snapshots(ctx)
	if len(snaps) != 1 || snaps[0].SnapshotId != snapID || snaps[0].CompletedAt != nil {
		t.Fatalf("after crash 2: snapshots %v, want %s still in flight", snaps, snapID)
	}
	reported := map[string]bool{}
	for _, rep := range snaps[0].Reports {
		reported[rep.WorkerId] = true
	}
	if len(snaps[0].Reports) != 2 || !reported[envs[0]] || !reported[envs[1]] {
		t.Fatalf("after crash 2: reports %v, want exactly env-0's and env-1's", snaps[0].Reports)
	}
	if run := r.get(ctx); run.State != v1.RunState_RUN_STATE_SNAPSHOTTING || run.LastPublishedStep != 3 {
		t.Fatalf("after crash 2: state %v last_published_step %d; want SNAPSHOTTING, 3", run.State, run.LastPublishedStep)
	}
	if d := r.step(ctx, ranks[3], 3, 1); !protoEqual(d, fired) {
		t.Errorf("step 3 after crash 2: %v, want %v", d, fired)
	}
	// A retry of a report recorded before the crash changes nothing.
	if err := r.reportSnapshot(ctx, envs[0], snapID, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
		t.Fatalf("retried ReportSnapshot by env-0: %v", err)
	}
	if run := r.get(ctx); run.State != v1.RunState_RUN_STATE_SNAPSHOTTING {
		t.Fatalf("a retried report moved the run to %v", run.State)
	}
	for _, i := range []int{2, 3} {
		if err := r.reportSnapshot(ctx, envs[i], snapID, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
			t.Fatalf("ReportSnapshot by env-%d: %v", i, err)
		}
	}

	waitStopped(ctx, t, append(append([]*reader(nil), trainers...), envReaders...)...)
	if t.Failed() {
		return
	}
	want := envReaders[0].log()
	if len(want) != 2 || want[1].GetStop() == nil {
		t.Fatalf("env-0 received %s, want [SaveAtDeadline Stop]", kinds(want))
	}
	for _, rd := range envReaders[1:] {
		sameCommands(t, rd.String(), rd.log(), want)
	}
	for _, rd := range trainers {
		sameCommands(t, rd.String(), rd.log(), want[1:])
	}
	for _, rd := range append(trainers, envReaders...) {
		if rd.reconnectCount() < 2 {
			t.Errorf("%s reconnected %d times, want at least once per crash", rd, rd.reconnectCount())
		}
	}
	run = r.get(ctx)
	if run.State != v1.RunState_RUN_STATE_STOPPED || run.FiredAtStep != 3 || run.LastPublishedStep != 3 {
		t.Errorf("final: state %v fired_at_step %d last_published_step %d; want STOPPED, 3, 3", run.State, run.FiredAtStep, run.LastPublishedStep)
	}
	if s := r.snapshots(ctx)[0]; s.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED || len(s.Reports) != 4 {
		t.Errorf("final deadline snapshot: %v with %d reports, want SAVED with 4", s.Outcome, len(s.Reports))
	}
	evs := r.events(ctx)
	checkEventLog(t, evs, before)
	if f := eventsOf(evs, v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_FIRED); len(f) != 1 {
		t.Errorf("%d DEADLINE_FIRED events, want 1", len(f))
	}
}

// 64 environment workers report the deadline snapshot at once and the
// coordinator is SIGKILLed while they do. Every report the coordinator
// acknowledged is there after the restart; those that failed are retried,
// and the run completes.
func TestConcurrentReportsSurviveSIGKILL(t *testing.T) {
	const n = 64
	ctx := testContext(t)
	p := startProc(t)
	r := newCluster(t, p.addr).createRun(ctx, "many", deadlineSpec(1, time.Now().Add(time.Hour), false))
	rank := r.trainers(ctx, 1)[0]
	envs := make([]string, n)
	var wg sync.WaitGroup
	for i := range envs {
		wg.Go(func() {
			resp, err := r.ws.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: r.id,
				Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: fmt.Sprintf("env-%d", i)})
			if err != nil {
				t.Errorf("RegisterWorker env-%d: %v", i, err)
				return
			}
			envs[i] = resp.WorkerId
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if d := r.step(ctx, rank, 1, fireIteration); d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 1: %v, want SAVE_AND_STOP", d.Action)
	}
	r.saved(ctx, rank, 1, 1)
	snaps := r.snapshots(ctx)
	if len(snaps) != 1 || len(snaps[0].ExpectedWorkerIds) != n {
		t.Fatalf("snapshots %v, want one deadline snapshot expecting %d workers", snaps, n)
	}
	snapID := snaps[0].SnapshotId

	// Everyone reports at once; the coordinator dies after a few acks.
	type result struct {
		i   int
		err error
	}
	results := make(chan result, n)
	start := make(chan struct{})
	for i, id := range envs {
		wg.Go(func() {
			<-start
			results <- result{i, r.reportSnapshot(ctx, id, snapID, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)}
		})
	}
	close(start)
	acked := map[int]bool{}
	var failed []int
	collect := func(res result) {
		switch {
		case res.err == nil:
			acked[res.i] = true
		case status.Code(res.err) == codes.Unavailable:
			failed = append(failed, res.i) // cut off: may or may not have committed
		default:
			t.Errorf("ReportSnapshot by env-%d: %v", res.i, res.err)
		}
	}
	for len(acked) < 8 {
		collect(<-results)
	}
	ackedBeforeKill := len(acked)
	p.kill()
	p.restart()
	wg.Wait() // calls still waiting for a connection complete against the new process
	close(results)
	for res := range results {
		collect(res)
	}

	present := map[string]int{}
	for _, rep := range r.snapshots(ctx)[0].Reports {
		present[rep.WorkerId]++
	}
	for i := range acked {
		if present[envs[i]] != 1 {
			t.Errorf("env-%d's acknowledged report appears %d times after the SIGKILL, want once", i, present[envs[i]])
		}
	}
	for _, i := range failed {
		if err := r.reportSnapshot(ctx, envs[i], snapID, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
			t.Errorf("retried ReportSnapshot by env-%d: %v", i, err)
		}
	}
	s := r.snapshots(ctx)[0]
	if len(s.Reports) != n || s.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Errorf("deadline snapshot: %d reports, outcome %v; want %d, SAVED", len(s.Reports), s.Outcome, n)
	}
	if run := r.get(ctx); run.State != v1.RunState_RUN_STATE_STOPPED {
		t.Errorf("run %v, want STOPPED", run.State)
	}
	t.Logf("%d reports acknowledged before the SIGKILL, %d after; %d cut off and retried", ackedBeforeKill, len(acked)-ackedBeforeKill, len(failed))
}
