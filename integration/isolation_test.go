package integration

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Two runs side by side, with workers of the same names and ranks: run A
// goes through its whole deadline sequence while run B's workers see none
// of it, and a worker id of run A means nothing in run B.
func TestRunsAreIsolated(t *testing.T) {
	ctx := testContext(t)
	srv := startInproc(t, nil)
	c := newCluster(t, srv.addr)
	b := time.Now().Add(time.Hour)
	a := c.createRun(ctx, "run-a", deadlineSpec(1, b, false))
	bb := c.createRun(ctx, "run-b", deadlineSpec(1, b, false))
	// B has more workers than A, so that whatever A's worker ids are, ids
	// numbered like them exist in B.
	aRank, aEnvs := a.trainers(ctx, 1)[0], a.envs(ctx, 2)
	bRank, bEnvs := bb.trainers(ctx, 1)[0], bb.envs(ctx, 4)
	aAll := append([]string{aRank}, aEnvs...)

	var aReaders, bReaders []*reader
	for i, id := range aAll {
		aReaders = append(aReaders, a.startReader(ctx, "a-"+id, id, i%2 == 1, 0))
	}
	for i, id := range append([]string{bRank}, bEnvs...) {
		bReaders = append(bReaders, bb.startReader(ctx, "b-"+id, id, i%2 == 1, 0))
	}

	// A: fire, save, snapshot, stop.
	a.step(ctx, aRank, 1, fireIteration)
	a.saved(ctx, aRank, 1, 1)
	var aSnap string
	for _, rd := range aReaders[1:] {
		aSnap = rd.expect(ctx, "SaveAtDeadline").GetSaveAtDeadline().SnapshotId
	}
	for _, id := range aEnvs {
		if err := a.reportSnapshot(ctx, id, aSnap, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
			t.Fatalf("ReportSnapshot in A: %v", err)
		}
	}
	waitStopped(ctx, t, aReaders...)

	// B is untouched: still pending, no snapshot, no decision.
	if run := bb.get(ctx); run.State != v1.RunState_RUN_STATE_PENDING || run.FiredAt != nil || run.LastStep != 0 {
		t.Errorf("run B is %v (fired %v, last step %d) after run A stopped; want PENDING, untouched", run.State, run.FiredAt, run.LastStep)
	}
	if snaps := bb.snapshots(ctx); len(snaps) != 0 {
		t.Errorf("run B has snapshots %v", snaps)
	}
	// B's first command ends B: if anything of A had leaked into B's
	// streams or polls it would come before it.
	if _, err := c.runs.CancelRun(ctx, &v1.CancelRunRequest{RunId: bb.id, Reason: "isolation test"}); err != nil {
		t.Fatalf("CancelRun B: %v", err)
	}
	waitStopped(ctx, t, bReaders...)
	for _, rd := range bReaders {
		if got := rd.log(); len(got) != 1 || got[0].Seq != 1 || got[0].GetStop() == nil {
			t.Errorf("%s received %s, want only run B's own Stop, seq 1", rd, kinds(got))
		}
	}

	// Workers: each run lists its own.
	for _, w := range bb.workers(ctx) {
		for _, id := range aAll {
			if w.WorkerId == id {
				t.Errorf("run B lists run A's worker %s (%s)", id, w.Name)
			}
		}
	}
	if n := len(a.workers(ctx)); n != 3 {
		t.Errorf("run A lists %d workers, want its 3", n)
	}
	// A's worker ids, used with run B (and B's token), are unknown there.
	for _, id := range aAll {
		_, err := bb.ws.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: bb.id, WorkerId: id})
		wantCode(t, "Heartbeat in run B with run A's worker "+id, err, codes.NotFound)
		_, err = bb.ws.PollCommands(ctx, &v1.PollCommandsRequest{RunId: bb.id, WorkerId: id})
		wantCode(t, "PollCommands in run B with run A's worker "+id, err, codes.NotFound)
		wantCode(t, "StreamCommands in run B with run A's worker "+id, streamErr(ctx, bb, id), codes.NotFound)
	}
	err := bb.reportSnapshot(ctx, bEnvs[0], aSnap, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	wantCode(t, "ReportSnapshot in run B of run A's snapshot", err, codes.NotFound)
	// B's events tell only of B.
	for _, ev := range bb.events(ctx) {
		if ev.SnapshotId != "" || ev.Type == v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_FIRED {
			t.Errorf("run B has event %v", ev)
		}
	}
}

// streamErr opens a command stream and returns how it ended.
func streamErr(ctx context.Context, r *run, workerID string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := r.ws.StreamCommands(ctx, &v1.StreamCommandsRequest{RunId: r.id, WorkerId: workerID})
	if err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// Registration: a re-register of the same name is the same worker with the
// next incarnation, and closes the old incarnation's stream; a rank held by
// another live name is ALREADY_EXISTS until its holder leaves; an unknown
// run is PERMISSION_DENIED to another run's token; a terminal run takes
// nobody.
func TestRegistration(t *testing.T) {
	ctx := testContext(t)
	srv := startInproc(t, nil)
	c := newCluster(t, srv.addr)
	// Turn level with a Snapshot after every checkpoint and no deadline.
	spec := deadlineSpec(2, time.Time{}, true)
	spec.Checkpointing = nil
	r := c.createRun(ctx, "reg", spec)
	ranks := r.trainers(ctx, 2)
	first := r.register(ctx, v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, "env-a", 0)
	if first.Incarnation != 1 {
		t.Fatalf("first registration: incarnation %d, want 1", first.Incarnation)
	}
	old := r.startReader(ctx, "env-a#1", first.WorkerId, false, 0)

	// A Snapshot proves the stream is open on the server.
	for _, rank := range ranks {
		r.step(ctx, rank, 1, shortIteration)
		r.saved(ctx, rank, 1, 1)
	}
	snap := old.expect(ctx, "Snapshot")

	again := r.register(ctx, v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, "env-a", 0)
	if again.WorkerId != first.WorkerId || again.Incarnation != 2 {
		t.Fatalf("re-register: worker %s incarnation %d, want %s incarnation 2", again.WorkerId, again.Incarnation, first.WorkerId)
	}
	if again.LastCommandSeq != snap.Seq {
		t.Errorf("re-register: last_command_seq %d, want %d", again.LastCommandSeq, snap.Seq)
	}
	err := old.wait(ctx)
	wantCode(t, "the old incarnation's stream", err, codes.FailedPrecondition)
	old.checkClean()
	// The new incarnation resumes where the old one was; the snapshot it
	// reports for is the same worker's.
	cur := r.startReader(ctx, "env-a#2", again.WorkerId, false, 0)
	if c := cur.expect(ctx, "Snapshot"); c.Seq != snap.Seq {
		t.Errorf("new incarnation from seq 0: got seq %d, want %d", c.Seq, snap.Seq)
	}
	if err := r.reportSnapshot(ctx, again.WorkerId, snap.GetSnapshot().SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
		t.Fatalf("ReportSnapshot by the new incarnation: %v", err)
	}
	for _, w := range r.workers(ctx) {
		if w.Name == "env-a" && (w.Incarnation != 2 || w.State != v1.WorkerState_WORKER_STATE_LIVE) {
			t.Errorf("env-a listed as %v incarnation %d, want LIVE incarnation 2", w.State, w.Incarnation)
		}
	}

	// Ranks.
	_, err = r.ws.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: r.id, Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "usurper", Rank: 1})
	wantCode(t, "rank 1 while rank-1 is live", err, codes.AlreadyExists)
	_, err = r.ws.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: r.id, Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "env-a", Rank: 0})
	wantCode(t, "env-a re-registering as a trainer", err, codes.AlreadyExists)
	_, err = r.ws.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: r.id, Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-9", Rank: 9})
	wantCode(t, "rank 9 of a world of 2", err, codes.InvalidArgument)
	if _, err := r.ws.DeregisterWorker(ctx, &v1.DeregisterWorkerRequest{RunId: r.id, WorkerId: ranks[1]}); err != nil {
		t.Fatalf("DeregisterWorker rank-1: %v", err)
	}
	if resp := r.register(ctx, v1.WorkerRole_WORKER_ROLE_TRAINER, "usurper", 1); resp.Incarnation != 1 {
		t.Errorf("usurper: incarnation %d, want 1", resp.Incarnation)
	}

	// Unknown run: the production chain checks the run token before the
	// run is looked up, so a token of another run learns nothing about it.
	_, err = r.ws.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: "no-such-run", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "x"})
	wantCode(t, "RegisterWorker in an unknown run", err, codes.PermissionDenied)

	// Terminal run: nobody new, nobody again.
	if _, err := c.runs.CancelRun(ctx, &v1.CancelRunRequest{RunId: r.id}); err != nil {
		t.Fatalf("CancelRun: %v", err)
	}
	_, err = r.ws.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: r.id, Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "late"})
	wantCode(t, "RegisterWorker in a cancelled run", err, codes.FailedPrecondition)
	_, err = r.ws.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: r.id, Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-a"})
	wantCode(t, "re-register in a cancelled run", err, codes.FailedPrecondition)
	waitStopped(ctx, t, cur)
	if got := cur.log(); got[len(got)-1].GetStop() == nil {
		t.Errorf("env-a#2 received %s, want it to end with the Stop", kinds(got))
	}
}
