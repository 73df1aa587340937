package integration

import (
	"context"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
)

// The Go client, given every coordinator's address, follows the leader:
// a worker streaming commands and an event watch ride out the leader's
// SIGKILL, a snapshot report made during the failover is answered by the
// next leader as soon as it serves (the worker's client backs off for an
// hour: only its health checks seeing the leader serve let the report be
// made again in time), and the deadline save issued there reaches the
// worker. Two coordinators on a real 3-member etcd, the snapcoord binary.
func TestClientFollowsTheLeaderAcrossAFailover(t *testing.T) {
	ctx := testContext(t)
	procs := startGroup(t, 2)
	lead := awaitLeader(ctx, t, procs)
	list := procs[0].Addr + "," + procs[1].Addr
	dialList := func(runToken string, opts ...client.Option) *client.Client {
		cl, err := client.Dial(list, append([]client.Option{client.WithInsecure(), client.WithRunToken(runToken)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	admin := dialList("")
	created, err := admin.Runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: "follow",
		Spec: spectest.TurnUntil(1, time.Now().Add(time.Hour), true)})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	cl := dialList(created.GetRunToken())
	hourly := dialList(created.GetRunToken(), client.WithRetry(client.RetryPolicy{MaxAttempts: 2, Base: time.Hour, Max: time.Hour}))
	env, err := hourly.StartWorker(ctx, client.WorkerConfig{RunID: "follow", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-0"})
	if err != nil {
		t.Fatalf("StartWorker: %v", err)
	}
	t.Cleanup(func() { _ = env.Close(context.Background()) })
	trainer, err := cl.StartTrainer(ctx, client.TrainerConfig{RunID: "follow", Rank: 0})
	if err != nil {
		t.Fatalf("StartTrainer: %v", err)
	}
	t.Cleanup(func() { _ = trainer.Close(context.Background()) })
	var seqs []int64
	watched := make(chan error, 1)
	go func() {
		watched <- admin.WatchEvents(ctx, "follow", 0, true, func(ev *v1.RunEvent) error {
			seqs = append(seqs, ev.GetSeq())
			return nil
		})
	}()
	next := func(what string) *v1.Command {
		t.Helper()
		select {
		case cmd, ok := <-env.Commands():
			if !ok {
				t.Fatalf("waiting for %s: commands closed: %v", what, env.Err())
			}
			return cmd
		case <-ctx.Done():
			t.Fatalf("no %s: %v", what, ctx.Err())
		}
		return nil
	}

	if _, err := trainer.CompleteStep(ctx, 1, time.Second); err != nil {
		t.Fatalf("CompleteStep(1): %v", err)
	}
	if _, err := trainer.ReportCheckpoint(ctx, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, time.Second); err != nil {
		t.Fatalf("ReportCheckpoint(1): %v", err)
	}
	snap := next("the checkpoint's Snapshot").GetSnapshot()
	if snap == nil {
		t.Fatal("the first command is no Snapshot")
	}

	if err := lead.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	reported := make(chan error, 1)
	go func() { // made while no coordinator leads
		_, err := env.ReportSnapshot(ctx, snap.GetSnapshotId(), v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, time.Second, "")
		reported <- err
	}()
	nextLead := awaitLeader(ctx, t, procs, lead)
	served := time.Now()
	t.Logf("leader %s SIGKILLed; %s SERVING after %v", lead.Addr, nextLead.Addr, served.Sub(killed).Round(time.Millisecond))
	if err := <-reported; err != nil {
		t.Fatalf("ReportSnapshot across the failover: %v", err)
	}
	t.Logf("report answered %v after the kill, %v after the next leader served",
		time.Since(killed).Round(time.Millisecond), time.Since(served).Round(time.Millisecond))

	// A read first, retried on UNAVAILABLE: it waits until the client sees
	// the new leader serve.
	if _, err := admin.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: "follow"}); err != nil {
		t.Fatalf("GetRun after the failover: %v", err)
	}
	if _, err := admin.Runs.TriggerDeadline(ctx, &v1.TriggerDeadlineRequest{RunId: "follow", Reason: "test"}); err != nil {
		t.Fatalf("TriggerDeadline on the new leader: %v", err)
	}
	if d, err := trainer.CompleteStep(ctx, 2, time.Second); err != nil || d.GetAction() != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("CompleteStep(2) = %v, %v; want SAVE_AND_STOP", d, err)
	}
	if _, err := trainer.ReportCheckpoint(ctx, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, time.Second); err != nil {
		t.Fatalf("ReportCheckpoint(2): %v", err)
	}
	save := next("the SaveAtDeadline").GetSaveAtDeadline()
	if save.GetAnchorStep() != 2 {
		t.Fatalf("got %v, want the SaveAtDeadline of step 2", save)
	}
	if _, err := env.ReportSnapshot(ctx, save.GetSnapshotId(), v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, time.Second, ""); err != nil {
		t.Fatalf("ReportSnapshot(%s): %v", save.GetSnapshotId(), err)
	}
	if stop := next("the Stop"); stop.GetStop() == nil {
		t.Fatalf("got %v, want Stop", stop)
	}
	run, err := admin.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: "follow"})
	if err != nil || run.GetRun().GetState() != v1.RunState_RUN_STATE_STOPPED {
		t.Fatalf("GetRun = %v, %v; want STOPPED", run.GetRun().GetState(), err)
	}
	snaps, err := admin.Runs.ListSnapshots(ctx, &v1.ListSnapshotsRequest{RunId: "follow"})
	if err != nil || len(snaps.GetSnapshots()) == 0 || snaps.GetSnapshots()[0].GetOutcome() != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Fatalf("ListSnapshots = %v, %v; want the first snapshot SAVED by the report made during the failover", snaps.GetSnapshots(), err)
	}

	if err := <-watched; err != nil {
		t.Fatalf("WatchEvents across the failover: %v", err)
	}
	for i, seq := range seqs {
		if seq != int64(i+1) {
			t.Fatalf("event seqs %v: want 1..%d, each once", seqs, len(seqs))
		}
	}
}
