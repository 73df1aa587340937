package engine

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/clock"
)

// wantSuperseded: the call was refused because its incarnation is no longer
// current, with the reason a client acts on.
func wantSuperseded(t *testing.T, what string, err error) {
	t.Helper()
	wantErr(t, err, ErrFailedPrecondition, "incarnation")
	if ee, ok := errors.AsType[*Error](err); !ok || ee.Reason != ReasonWorkerSuperseded {
		t.Fatalf("%s: %v has no reason %s", what, err, ReasonWorkerSuperseded)
	}
}

// Once another process registers under a worker's name, calls that name the
// old incarnation are refused: an old process still running (a node thought
// dead) gets no commands, cannot deregister the new one, and cannot take the
// name back by registering again. Calls that name no incarnation (grpcurl)
// are not checked; a process starting (incarnation 0) takes the name over.
func TestStaleIncarnationIsFenced(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, ""))
	env := v1.WorkerRole_WORKER_ROLE_ENVIRONMENT
	register := func(inc int64) (*v1.RegisterWorkerResponse, error) {
		return h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: env, Name: "env-a", Incarnation: inc})
	}
	old, err := register(0)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := register(0) // a new process under the same name
	if err != nil || cur.Incarnation != old.Incarnation+1 || cur.WorkerId != old.WorkerId {
		t.Fatalf("second process: %v, %v; want incarnation %d of %s", cur, err, old.Incarnation+1, old.WorkerId)
	}
	id := cur.WorkerId

	_, err = h.e.Heartbeat(h.ctx, &v1.HeartbeatRequest{RunId: "r", WorkerId: id, Incarnation: old.Incarnation})
	wantSuperseded(t, "Heartbeat", err)
	_, err = h.e.PollCommands(h.ctx, &v1.PollCommandsRequest{RunId: "r", WorkerId: id, Incarnation: old.Incarnation})
	wantSuperseded(t, "PollCommands", err)
	err = h.e.StreamCommands(h.ctx, &v1.StreamCommandsRequest{RunId: "r", WorkerId: id, Incarnation: old.Incarnation},
		func(*v1.Command) error { return nil })
	wantSuperseded(t, "StreamCommands", err)
	_, err = h.e.DeregisterWorker(h.ctx, &v1.DeregisterWorkerRequest{RunId: "r", WorkerId: id, Incarnation: old.Incarnation})
	wantSuperseded(t, "DeregisterWorker", err)
	_, err = register(old.Incarnation)
	wantSuperseded(t, "RegisterWorker", err)

	for _, inc := range []int64{cur.Incarnation, 0} {
		if _, err := h.e.Heartbeat(h.ctx, &v1.HeartbeatRequest{RunId: "r", WorkerId: id, Incarnation: inc}); err != nil {
			t.Fatalf("heartbeat of incarnation %d: %v", inc, err)
		}
	}
	workers, err := h.e.ListWorkers(h.ctx, &v1.ListWorkersRequest{RunId: "r"})
	if err != nil || len(workers.Workers) != 1 || workers.Workers[0].Incarnation != cur.Incarnation ||
		workers.Workers[0].State != v1.WorkerState_WORKER_STATE_LIVE {
		t.Fatalf("after the old process's calls: %v, %v; want incarnation %d LIVE", workers, err, cur.Incarnation)
	}

	// The current process registering again (its lease lapsed) names the
	// incarnation it holds, and may.
	next, err := register(cur.Incarnation)
	if err != nil || next.Incarnation != cur.Incarnation+1 {
		t.Fatalf("re-register of the current incarnation: %v, %v", next, err)
	}
	// Its answer was lost and it asks again: the same registration, not
	// "superseded" (it would stop) nor a third incarnation.
	if again, err := register(cur.Incarnation); err != nil || again.Incarnation != next.Incarnation {
		t.Fatalf("repeated re-register: %v, %v; want incarnation %d again", again, err, next.Incarnation)
	}
	_, err = register(old.Incarnation)
	wantSuperseded(t, "RegisterWorker of an older incarnation", err)
	if _, err := h.e.DeregisterWorker(h.ctx, &v1.DeregisterWorkerRequest{RunId: "r", WorkerId: id, Incarnation: next.Incarnation}); err != nil {
		t.Fatal(err)
	}
	// A name the coordinator does not know (its state was reset) registers
	// whatever incarnation the process held.
	if _, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: env, Name: "env-b", Incarnation: 7}); err != nil {
		t.Fatalf("re-register of an unknown name: %v", err)
	}
	h.restart() // incarnations are durable
	_, err = h.e.Heartbeat(h.ctx, &v1.HeartbeatRequest{RunId: "r", WorkerId: id, Incarnation: cur.Incarnation})
	wantSuperseded(t, "Heartbeat after a restart", err)

	// Once the run is over, a superseded process still hears that it was
	// superseded, not that the run takes no new workers.
	if _, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "r", Reason: "done"}); err != nil {
		t.Fatal(err)
	}
	_, err = register(old.Incarnation)
	wantSuperseded(t, "RegisterWorker into a terminal run", err)
}

// The coordinator's state went back (restored from a backup) to before a
// running process registered again: the process holds an incarnation ahead
// of the one the state knows. Nobody took the name since, so the process is
// not superseded: its calls are refused (the coordinator cannot tell it
// from a stale one without registering), and registering again with what
// it holds gives it an incarnation above every one it held, which fences
// them all, while a process holding an older one is still superseded.
func TestRegisterAgainAheadOfARestoredState(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, ""))
	env := v1.WorkerRole_WORKER_ROLE_ENVIRONMENT
	register := func(inc int64) (*v1.RegisterWorkerResponse, error) {
		return h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: env, Name: "env-a", Incarnation: inc})
	}
	restored, err := register(0) // the incarnation the backup holds
	if err != nil {
		t.Fatal(err)
	}
	held := restored.Incarnation + 2 // the process registered twice more before the restore
	_, err = h.e.Heartbeat(h.ctx, &v1.HeartbeatRequest{RunId: "r", WorkerId: restored.WorkerId, Incarnation: held})
	wantSuperseded(t, "Heartbeat of an incarnation ahead", err)

	again, err := register(held)
	if err != nil || again.Incarnation != held+1 || again.WorkerId != restored.WorkerId {
		t.Fatalf("re-register holding incarnation %d over a state at %d: %v, %v; want incarnation %d of %s",
			held, restored.Incarnation, again, err, held+1, restored.WorkerId)
	}
	for _, inc := range []int64{restored.Incarnation, held} {
		_, err = h.e.Heartbeat(h.ctx, &v1.HeartbeatRequest{RunId: "r", WorkerId: again.WorkerId, Incarnation: inc})
		wantSuperseded(t, "Heartbeat of an incarnation replaced", err)
	}
	if _, err := h.e.Heartbeat(h.ctx, &v1.HeartbeatRequest{RunId: "r", WorkerId: again.WorkerId, Incarnation: again.Incarnation}); err != nil {
		t.Fatalf("heartbeat of the new incarnation: %v", err)
	}
	_, err = register(restored.Incarnation)
	wantSuperseded(t, "RegisterWorker of an older incarnation", err)

	// The largest incarnation has no successor: refused, not wrapped round.
	_, err = register(math.MaxInt64)
	wantErr(t, err, ErrInvalidArgument, "incarnation")
}

// A worker process that restarts in the middle of a snapshot resumes just
// before that snapshot's command, so that it still does its part; once it
// reported, or for a worker the snapshot does not expect, delivery starts at
// the end of the log.
func TestRestartedWorkerResumesAtPendingSnapshot(t *testing.T) {
	h := newHarness(t)
	_, envs := h.snapshotInFlight("r", 2)
	s := h.lastSnapshot("r")
	cmds := h.commands("r", envs[0])
	snapCmd := cmds[len(cmds)-1]
	if snapCmd.GetSnapshot().GetSnapshotId() != s.SnapshotId {
		t.Fatalf("last command %v, want the snapshot %s", snapCmd, s.SnapshotId)
	}
	register := func(name string) *v1.RegisterWorkerResponse {
		t.Helper()
		resp, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if err := h.report("r", envs[1], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1); err != nil {
		t.Fatal(err)
	}

	if got := register("env-aa"); got.ResumeAfterSeq != snapCmd.Seq-1 { // envs[0], not reported yet
		t.Fatalf("restarted mid-snapshot: resume_after_seq %d, want %d (before the snapshot's command)", got.ResumeAfterSeq, snapCmd.Seq-1)
	}
	if got := register("env-ab"); got.ResumeAfterSeq != got.LastCommandSeq { // envs[1], reported
		t.Fatalf("restarted after reporting: resume_after_seq %d, want the end %d", got.ResumeAfterSeq, got.LastCommandSeq)
	}
	if got := register("env-new"); got.ResumeAfterSeq != got.LastCommandSeq {
		t.Fatalf("a worker the snapshot does not expect: resume_after_seq %d, want the end %d", got.ResumeAfterSeq, got.LastCommandSeq)
	}
	if err := h.report("r", envs[0], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1); err != nil {
		t.Fatal(err)
	}
	if got := register("env-aa"); got.ResumeAfterSeq != got.LastCommandSeq {
		t.Fatalf("after its report: resume_after_seq %d, want the end %d", got.ResumeAfterSeq, got.LastCommandSeq)
	}
}

// A superseded process's reports are refused too, and change nothing: its
// snapshot report does not count as its replacement's, its step and
// checkpoint reports record nothing, and it cannot finish the run.
func TestStaleReportsAreFenced(t *testing.T) {
	h := newHarness(t)
	ranks, envs := h.snapshotInFlight("r", 1)
	s := h.lastSnapshot("r")
	oldEnv, oldRank := int64(1), int64(1)
	env, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-aa"})
	if err != nil {
		t.Fatal(err)
	}
	rank := h.registerAgain("r", "rank-aa", 0)
	if env.WorkerId != envs[0] || rank.WorkerId != ranks[0] || env.Incarnation != oldEnv+1 || rank.Incarnation != oldRank+1 {
		t.Fatalf("replacements: %v, %v", env, rank)
	}

	_, err = h.e.ReportSnapshot(h.ctx, &v1.ReportSnapshotRequest{RunId: "r", WorkerId: envs[0], SnapshotId: s.SnapshotId,
		Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, Message: "old process", Incarnation: oldEnv})
	wantSuperseded(t, "ReportSnapshot", err)
	_, err = h.e.CompleteStep(h.ctx, &v1.CompleteStepRequest{RunId: "r", WorkerId: ranks[0], Step: 2, IterationSeconds: 9999, Incarnation: oldRank})
	wantSuperseded(t, "CompleteStep", err)
	_, err = h.e.ReportCheckpoint(h.ctx, &v1.ReportCheckpointRequest{RunId: "r", WorkerId: ranks[0], Step: 2,
		Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, Incarnation: oldRank})
	wantSuperseded(t, "ReportCheckpoint", err)
	_, err = h.e.FinishRun(h.ctx, &v1.FinishRunRequest{RunId: "r", WorkerId: ranks[0], Incarnation: oldRank})
	wantSuperseded(t, "FinishRun", err)

	if run := h.get("r"); run.State != v1.RunState_RUN_STATE_RUNNING || run.LastStep != 1 {
		t.Fatalf("after the old processes' calls: %v at step %d", run.State, run.LastStep)
	}
	if n := len(h.lastSnapshot("r").Reports); n != 0 {
		t.Fatalf("the old process's report was recorded: %d reports", n)
	}
	if _, err := h.e.ReportSnapshot(h.ctx, &v1.ReportSnapshotRequest{RunId: "r", WorkerId: envs[0], SnapshotId: s.SnapshotId,
		Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, Incarnation: env.Incarnation}); err != nil {
		t.Fatal(err)
	}
	if got := h.lastSnapshot("r"); got.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Fatalf("after the replacement reported: %v, want SAVED", got.Outcome)
	}
	d, err := h.e.CompleteStep(h.ctx, &v1.CompleteStepRequest{RunId: "r", WorkerId: ranks[0], Step: 2, IterationSeconds: 10, Incarnation: rank.Incarnation})
	if err != nil || d.Decision.Inputs.GetIterationSeconds() != 10 {
		t.Fatalf("the replacement's step 2: %v, %v; want a decision from 10 s iterations", d, err)
	}
}

// A rank taken over by a process with another name (restarted on another
// node) fences the old process out, as a new incarnation of its own name
// would: one cut off from the network, not dead, must not go on acting as
// the rank. Its open stream ends, and its steps, reports and FinishRun are
// refused with the reason a client stops on.
func TestTakenOverRankIsFenced(t *testing.T) { synctest.Test(t, testTakenOverRankIsFenced) }

func testTakenOverRankIsFenced(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{TrainerWorldSize: 1,
		Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00", DeferredFinalize: true}})
	tr := v1.WorkerRole_WORKER_ROLE_TRAINER
	old, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: tr, Name: "node1-rank0"})
	if err != nil {
		t.Fatal(err)
	}
	if d := h.step("r", old.WorkerId, 1, 3600); d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 1: %v", d.Action)
	}
	h.checkpoint("r", []string{old.WorkerId}, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	got := make(chan *v1.Command, 1)
	streamEnded := make(chan error, 1)
	go func() {
		streamEnded <- h.e.StreamCommands(h.ctx, &v1.StreamCommandsRequest{RunId: "r", WorkerId: old.WorkerId, Incarnation: old.Incarnation},
			func(c *v1.Command) error {
				got <- c
				return nil
			})
	}()
	if c := <-got; c.GetPublishCheckpoint().GetStep() != 1 { // the stream is open
		t.Fatalf("first command %v, want PublishCheckpoint of step 1", c)
	}
	h.advance(time.Minute/2, "r") // old is LOST, before B
	taker := h.register("r", tr, "node2-rank0", 0)

	wantDisplaced := func(what string, err error) {
		t.Helper()
		wantErr(t, err, ErrFailedPrecondition, "node2-rank0")
		if ee, ok := errors.AsType[*Error](err); !ok || ee.Reason != ReasonWorkerSuperseded {
			t.Fatalf("%s: %v has no reason %s", what, err, ReasonWorkerSuperseded)
		}
	}
	synctest.Wait() // every goroutine of the bubble has done what it can
	select {
	case err := <-streamEnded:
		wantDisplaced("the open stream", err)
	default:
		t.Fatal("the old process's stream is still open after its rank was taken over")
	}
	_, err = h.e.ReportCheckpoint(h.ctx, &v1.ReportCheckpointRequest{RunId: "r", WorkerId: old.WorkerId, Step: 1,
		Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED, Incarnation: old.Incarnation})
	wantDisplaced("ReportCheckpoint", err)
	_, err = h.e.CompleteStep(h.ctx, &v1.CompleteStepRequest{RunId: "r", WorkerId: old.WorkerId, Step: 2, IterationSeconds: 1, Incarnation: old.Incarnation})
	wantDisplaced("CompleteStep", err)
	_, err = h.e.FinishRun(h.ctx, &v1.FinishRunRequest{RunId: "r", WorkerId: old.WorkerId, Incarnation: old.Incarnation})
	wantDisplaced("FinishRun", err)
	_, err = h.e.PollCommands(h.ctx, &v1.PollCommandsRequest{RunId: "r", WorkerId: old.WorkerId, Incarnation: old.Incarnation})
	wantDisplaced("PollCommands", err)
	h.wantState("r", v1.RunState_RUN_STATE_SAVING)

	h.checkpoint("r", []string{taker}, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED, 0)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
}

// A rank restarted on another node takes the rank over even when the run
// is at max_workers_per_run: its live workers do not grow. A new name for
// anything else is still refused at the limit.
func TestTakeoverAtTheWorkerLimit(t *testing.T) {
	h := newHarnessWith(t, Options{HeartbeatInterval: 5 * time.Second, MaxWorkersPerRun: 2})
	h.create("r", turnSpec(2, ""))
	ranks := h.trainers("r", 2)
	h.advance(time.Minute, "r", ranks[1]) // rank 0 is LOST
	tr := v1.WorkerRole_WORKER_ROLE_TRAINER
	if _, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: tr, Name: "node9-rank0", Rank: 0}); err != nil {
		t.Fatalf("rank 0 restarted on another node at the limit: %v", err)
	}
	_, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-new"})
	wantErr(t, err, ErrResourceExhausted, "max_workers_per_run")
}

// A name new to the coordinator that registers with the incarnation its
// process held (the data restored from a backup) replaced its own
// incarnation. Registering again with it, after deregistering, is a new
// incarnation and the worker is live again, not the repeat of a lost answer.
func TestRegisterAgainAfterRegisteringWithAnIncarnation(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, ""))
	env := v1.WorkerRole_WORKER_ROLE_ENVIRONMENT
	first, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: env, Name: "env-x", Incarnation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.e.DeregisterWorker(h.ctx, &v1.DeregisterWorkerRequest{RunId: "r", WorkerId: first.WorkerId, Incarnation: first.Incarnation}); err != nil {
		t.Fatal(err)
	}
	again, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: env, Name: "env-x", Incarnation: first.Incarnation})
	if err != nil || again.Incarnation != first.Incarnation+1 {
		t.Fatalf("registering again: %v, %v; want incarnation %d", again, err, first.Incarnation+1)
	}
	if _, err := h.e.Heartbeat(h.ctx, &v1.HeartbeatRequest{RunId: "r", WorkerId: again.WorkerId, Incarnation: again.Incarnation}); err != nil {
		t.Fatalf("heartbeat after registering again: %v", err)
	}
}

// RegisterWorker's bad inputs: each gets its own status, naming the field,
// whether or not the name is already registered.
func TestRegisterWorkerRefusals(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(2, ""))
	h.envs("r", 1) // env-aa
	h.trainers("r", 1)
	tr, env := v1.WorkerRole_WORKER_ROLE_TRAINER, v1.WorkerRole_WORKER_ROLE_ENVIRONMENT
	for _, tc := range []struct {
		name string
		req  *v1.RegisterWorkerRequest
		kind error
		want string
	}{
		{"environment with a rank", &v1.RegisterWorkerRequest{Role: env, Name: "env-new", Rank: 3}, ErrInvalidArgument, "rank"},
		{"known environment with a rank", &v1.RegisterWorkerRequest{Role: env, Name: "env-aa", Rank: 3}, ErrInvalidArgument, "rank"},
		{"rank outside the world", &v1.RegisterWorkerRequest{Role: tr, Name: "node-rank5", Rank: 5}, ErrInvalidArgument, "rank"},
		{"rank held by a live worker", &v1.RegisterWorkerRequest{Role: tr, Name: "node-other", Rank: 0}, ErrAlreadyExists, "rank"},
		{"known name, another role", &v1.RegisterWorkerRequest{Role: tr, Name: "env-aa", Rank: 1}, ErrAlreadyExists, "name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.RunId = "r"
			_, err := h.e.RegisterWorker(h.ctx, tc.req)
			wantErr(t, err, tc.kind, tc.want+":")
		})
	}
}

// A lease timer that fires while its worker leaves and registers again
// (the callback waiting for the run's lock meanwhile) must not start a
// second chain of lease timers beside the new registration's, one of which
// would then outlive Close.
func TestLeaseTimerFiringDuringReRegisterIsNotDuplicated(t *testing.T) {
	fake := clock.NewFake(t0)
	fired := make(chan struct{}, 1)
	h := &harness{t: t, ctx: context.Background(), clk: fake, dir: t.TempDir(),
		opts: Options{HeartbeatInterval: 5 * time.Second, Clock: startClock{Fake: fake, started: fired}}}
	h.open()
	t.Cleanup(h.close)
	h.create("r", turnSpec(1, "")) // no deadline, no interval: lease timers only
	env := h.envs("r", 1)[0]
	if n := h.clk.Pending(); n != 1 {
		t.Fatalf("%d timers armed, want the lease timer", n)
	}
	r, err := h.e.run("r")
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock() // a call holds the run
	advanced := make(chan struct{})
	go func() {
		defer close(advanced)
		h.clk.Advance(h.e.opts.LeaseTTL) // the lease timer fires; its callback waits for the lock
	}()
	<-fired
	// Ahead of the callback on the lock: the worker leaves and registers again.
	m := &mut{e: h.e, r: r, now: h.clk.Now()}
	m.workers().leave(r.workers[env], "deregistered")
	if _, err := m.workers().register(&v1.RegisterWorkerRequest{RunId: "r", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-aa"}); err != nil {
		t.Fatal(err)
	}
	m.flush()
	r.mu.Unlock()
	<-advanced
	if n := h.clk.Pending(); n != 1 {
		t.Errorf("%d timers armed for one live worker, want 1", n)
	}
	h.e.Close()
	if n := h.clk.Pending(); n != 0 {
		t.Errorf("%d timers still armed after Close, want 0", n)
	}
}

// startClock is a fake clock that signals each timer callback as it starts,
// so that a test can act while the callback waits for a lock.
type startClock struct {
	*clock.Fake
	started chan<- struct{}
}

func (c startClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return c.Fake.AfterFunc(d, func() {
		c.started <- struct{}{}
		f()
	})
}
