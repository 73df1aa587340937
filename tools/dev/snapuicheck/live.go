package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// The live run the worker lanes are checked on: B two minutes away (time
// enough for the checks, short enough for its timeline to show a snapshot
// of a few seconds as a bar one can see), two ranks and two environment
// workers. rank-1 completes one step and then only
// heartbeats (a hung rank); env-0 fails its first snapshot (IO_ERROR) and
// saves the later ones; env-1 registers once that snapshot failed and
// never heartbeats (LOST once its 5 s lease lapses, failing the snapshot
// it was expected in with TIMEOUT). The late run is created with B a second away and never
// started: pending past B.
const (
	liveRun     = "ui-live"
	lateRun     = "ui-late"
	liveBudget  = "00:00:02:00"
	lateBudget  = "00:00:00:01"
	liveTimeout = 30 * time.Second
)

// liveRuns plays the live run and creates the late one; they go on until
// stop is called. It returns once the page has something to flag: rank-1
// behind, env-1 LOST, a failed snapshot, the late run past B.
func liveRuns(ctx context.Context, addr string) (stop func(), err error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	runs, workers := v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn)
	admin := bearer(ctx, adminToken)
	if _, err := runs.CreateRun(admin, &v1.CreateRunRequest{RunId: lateRun, Spec: &v1.RunSpec{
		TrainerWorldSize: 1, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: lateBudget}}}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("CreateRun(%s): %w", lateRun, err)
	}
	// C's prior of 3 ms checks that a small duration does not read "0s".
	created, err := runs.CreateRun(admin, &v1.CreateRunRequest{RunId: liveRun, Spec: turnSpec(2, liveBudget, 0.003)})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("CreateRun(%s): %w", liveRun, err)
	}
	asRun := bearer(ctx, created.GetRunToken())
	ids := map[string]string{}
	for _, w := range []struct {
		name string
		role v1.WorkerRole
		rank int32
	}{{"rank-0", v1.WorkerRole_WORKER_ROLE_TRAINER, 0}, {"rank-1", v1.WorkerRole_WORKER_ROLE_TRAINER, 1},
		{"env-0", v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, 0}} {
		r, err := workers.RegisterWorker(asRun, &v1.RegisterWorkerRequest{RunId: liveRun, Role: w.role, Name: w.name, Rank: w.rank})
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("RegisterWorker(%s): %w", w.name, err)
		}
		ids[w.name] = r.GetWorkerId()
	}
	playCtx, cancel := context.WithCancel(asRun)
	var wg sync.WaitGroup
	for _, play := range []func(context.Context){
		func(ctx context.Context) {
			heartbeat(ctx, workers, liveRun, ids["rank-0"], ids["rank-1"], ids["env-0"])
		},
		func(ctx context.Context) { keepStepping(ctx, workers, ids["rank-0"], ids["rank-1"]) },
		func(ctx context.Context) { failFirstSnapshot(ctx, workers, ids["env-0"]) },
	} {
		wg.Add(1)
		go func() { defer wg.Done(); play(playCtx) }()
	}
	stop = func() { cancel(); wg.Wait(); conn.Close() }
	if err := waitFor(func() (bool, string, error) { return snapshotFailed(admin, runs) }); err != nil {
		stop()
		return nil, err
	}
	env1, err := workers.RegisterWorker(asRun, &v1.RegisterWorkerRequest{RunId: liveRun, Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-1"})
	if err != nil {
		stop()
		return nil, fmt.Errorf("RegisterWorker(env-1): %w", err)
	}
	if err := waitFor(func() (bool, string, error) { return liveState(admin, runs, env1.GetWorkerId()) }); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// snapshotFailed reports whether a snapshot of the live run ended IO_ERROR.
func snapshotFailed(ctx context.Context, runs v1.RunServiceClient) (bool, string, error) {
	snaps, err := runs.ListSnapshots(ctx, &v1.ListSnapshotsRequest{RunId: liveRun})
	if err != nil {
		return false, "", err
	}
	for _, s := range snaps.GetSnapshots() {
		if s.GetOutcome() == v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR {
			return true, "", nil
		}
	}
	return false, fmt.Sprintf("no failed snapshot among %d", len(snaps.GetSnapshots())), nil
}

// keepStepping has both ranks complete step 1, then rank-0 alone go on.
func keepStepping(ctx context.Context, workers v1.WorkerServiceClient, rank0, rank1 string) {
	t := time.NewTicker(stepEvery)
	defer t.Stop()
	for step := int64(1); ; step++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ids := []string{rank0}
		if step == 1 {
			ids = append(ids, rank1)
		}
		for _, id := range ids {
			_, _ = workers.CompleteStep(ctx, &v1.CompleteStepRequest{RunId: liveRun, WorkerId: id, Step: step,
				IterationSeconds: stepEvery.Seconds()})
		}
	}
}

// failFirstSnapshot answers env-0's snapshots: IO_ERROR for the first,
// SAVED after.
func failFirstSnapshot(ctx context.Context, workers v1.WorkerServiceClient, env string) {
	after, outcome := int64(0), v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR
	for ctx.Err() == nil {
		resp, err := workers.PollCommands(ctx, &v1.PollCommandsRequest{RunId: liveRun, WorkerId: env, AfterSeq: after, WaitSeconds: 5})
		if err != nil {
			continue
		}
		for _, cmd := range resp.GetCommands() {
			after = cmd.GetSeq()
			if s := cmd.GetSnapshot(); s != nil {
				_, _ = workers.ReportSnapshot(ctx, &v1.ReportSnapshotRequest{RunId: liveRun, WorkerId: env, SnapshotId: s.GetSnapshotId(),
					Outcome: outcome, DurationSeconds: 0.012, Message: "ui-check: disk full"})
				outcome = v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED
			}
		}
	}
}

// waitFor polls cond until it holds, fails, or liveTimeout passes.
func waitFor(cond func() (ok bool, why string, err error)) error {
	deadline := time.Now().Add(liveTimeout)
	var last string
	for time.Now().Before(deadline) {
		switch ok, why, err := cond(); {
		case err != nil:
			return err
		case ok:
			return nil
		default:
			last = why
		}
		time.Sleep(250 * time.Millisecond) // polling a live process, not a test's synchronisation
	}
	return errors.New("the live runs did not reach the state to check within " + liveTimeout.String() + ": " + last)
}

// liveState reports whether env-1 is LOST, the live run is 3 steps on
// and the late run is past B.
func liveState(ctx context.Context, runs v1.RunServiceClient, env1 string) (ok bool, why string, err error) {
	live, err := runs.GetRun(ctx, &v1.GetRunRequest{RunId: liveRun})
	if err != nil {
		return false, "", err
	}
	late, err := runs.GetRun(ctx, &v1.GetRunRequest{RunId: lateRun})
	if err != nil {
		return false, "", err
	}
	ws, err := runs.ListWorkers(ctx, &v1.ListWorkersRequest{RunId: liveRun})
	if err != nil {
		return false, "", err
	}
	lost := false
	for _, w := range ws.GetWorkers() {
		lost = lost || (w.GetWorkerId() == env1 && w.GetState() == v1.WorkerState_WORKER_STATE_LOST)
	}
	b := late.GetRun().GetDeadline().GetMustSaveBy()
	pastB := b != nil && time.Now().After(b.AsTime())
	why = fmt.Sprintf("env-1 lost %v, live run at step %d, late run past B %v", lost, live.GetRun().GetLastStep(), pastB)
	return lost && pastB && live.GetRun().GetLastStep() >= 3, why, nil
}
