package client_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/coordproc"
	"github.com/snapcoord/snapcoord/internal/etcdtest"
)

// freezeTTL is the coordinators' --election-ttl in the freeze tests: short,
// so that a failover takes seconds, long enough that a loaded machine does
// not depose a healthy leader.
const freezeTTL = 3 * time.Second

// binDir holds the snapcoord binary, built by the first test that runs it.
var binDir struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

func snapcoordBin(t *testing.T) string {
	t.Helper()
	binDir.once.Do(func() {
		if binDir.dir, binDir.err = os.MkdirTemp("", "snapcoord-client-test-"); binDir.err == nil {
			binDir.bin, binDir.err = coordproc.Build(binDir.dir)
		}
	})
	if binDir.err != nil {
		t.Fatal(binDir.err)
	}
	return binDir.bin
}

// removeBin runs after the tests (TestMain).
func removeBin() {
	if binDir.dir != "" {
		os.RemoveAll(binDir.dir)
	}
}

// startHAGroup runs n snapcoord binaries on one prefix of a real 3-member
// etcd cluster, with freezeTTL.
func startHAGroup(t *testing.T, n int) []*coordproc.Proc {
	t.Helper()
	etcd := etcdtest.Start(t, 3)
	bin := snapcoordBin(t)
	procs := make([]*coordproc.Proc, n)
	for i := range procs {
		procs[i] = coordproc.ForTest(t, coordproc.Config{Bin: bin,
			LogPath: filepath.Join(t.TempDir(), fmt.Sprintf("snapcoord-%d.log", i)),
			Etcd:    coordproc.Etcd{Endpoints: etcd.Endpoints(), Prefix: "/freeze", ElectionTTL: freezeTTL},
			Args:    []string{"--metrics-listen", "", "--lease-ttl", "1m"}})
	}
	return procs
}

// A leader frozen by SIGSTOP (a long GC pause, a stuck disk, a VM stall)
// costs a client given every address no more than the failover: a step
// in flight on the frozen leader, and the command stream of an environment
// worker opened there, move to the next leader as soon as it serves, not
// when the frozen one runs again (2× and 5× the election TTL later) or
// keepalive gives up on it. A deadline fired at the new leader reaches the
// worker, and its report is counted, within the TTL + 1 s of the new leader
// serving.
func TestFrozenLeaderCallsMoveToTheNextLeader(t *testing.T) {
	for _, freeze := range []time.Duration{2 * freezeTTL, 5 * freezeTTL} {
		t.Run(fmt.Sprintf("frozen %v", freeze), func(t *testing.T) { frozenLeader(t, freeze) })
	}
}

func frozenLeader(t *testing.T, freeze time.Duration) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	procs := startHAGroup(t, 2)
	old, _ := coordproc.LeaderForTest(ctx, t, procs, nil)
	list := procs[0].Addr + "," + procs[1].Addr
	admin := dialList(t, list, "")
	created, err := admin.Runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: "r1", Spec: turnSpec(1)})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	workers := dialList(t, list, created.GetRunToken())
	rank, err := workers.StartTrainer(ctx, client.TrainerConfig{RunID: "r1", Rank: 0, Logger: testLogger(t),
		FailSafe: &client.FailSafeConfig{Off: true}})
	if err != nil {
		t.Fatalf("StartTrainer: %v", err)
	}
	t.Cleanup(func() { closeWorker(t, rank) })
	env := startEnvWorker(t, workers, "r1", false)
	if _, err := rank.CompleteStep(ctx, 1, time.Second); err != nil {
		t.Fatalf("step 1: %v", err)
	}

	if err := old.Pause(); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	resumed := make(chan struct{})
	thaw := time.AfterFunc(freeze, func() {
		defer close(resumed)
		if err := old.Resume(); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() {
		if thaw.Stop() {
			_ = old.Resume()
			close(resumed)
		}
		<-resumed
	})
	type answer struct {
		d   *v1.Decision
		err error
		at  time.Time
	}
	stepped := make(chan answer, 1)
	go func() {
		d, err := rank.CompleteStep(ctx, 2, time.Second)
		stepped <- answer{d, err, time.Now()}
	}()

	next, serving := coordproc.LeaderForTest(ctx, t, procs, old)
	t.Logf("leader %s frozen for %v; %s SERVING %v later (election TTL %v)", old.Addr, freeze, next.Addr,
		serving.Sub(frozen).Round(time.Millisecond), freezeTTL)
	bound := freezeTTL + time.Second
	step := <-stepped
	if step.err != nil {
		t.Fatalf("step 2, issued as the leader froze: %v", step.err)
	}
	t.Logf("step 2 answered %v after the freeze, %v after the next leader served", step.at.Sub(frozen).Round(time.Millisecond),
		step.at.Sub(serving).Round(time.Millisecond))
	if late := step.at.Sub(serving); late > bound {
		t.Errorf("step 2 answered %v after the next leader served, want within %v", late.Round(time.Millisecond), bound)
	}

	// The deadline, fired at the new leader, reaches the worker whose
	// command stream was on the frozen one.
	direct := dialList(t, next.Addr, "")
	if _, err := direct.Runs.TriggerDeadline(ctx, &v1.TriggerDeadlineRequest{RunId: "r1", Reason: "test"}); err != nil {
		t.Fatalf("TriggerDeadline: %v", err)
	}
	if d, err := rank.CompleteStep(ctx, 3, time.Second); err != nil || d.GetAction() != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 3 after the deadline fired: %v, %v; want SAVE_AND_STOP", d, err)
	}
	if _, err := rank.ReportCheckpoint(ctx, 3, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, time.Second); err != nil {
		t.Fatalf("ReportCheckpoint: %v", err)
	}
	fired := time.Now() // the coordinator sends SaveAtDeadline now
	cmd := nextCommand(t, env)
	save := cmd.GetSaveAtDeadline()
	if save == nil {
		t.Fatalf("got %v, want a SaveAtDeadline", cmd)
	}
	if _, err := env.ReportSnapshot(ctx, save.GetSnapshotId(), v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 0, "ok"); err != nil {
		t.Fatalf("ReportSnapshot: %v", err)
	}
	reported := time.Now()
	t.Logf("SaveAtDeadline sent %v after the next leader served; received and its report answered %v after", fired.Sub(serving).Round(time.Millisecond),
		reported.Sub(fired).Round(time.Millisecond))
	if late := reported.Sub(fired); late > bound {
		t.Errorf("the SaveAtDeadline, sent to a worker whose command stream was on the frozen leader, was received and reported %v later, want within %v",
			late.Round(time.Millisecond), bound)
	}
	snaps, err := direct.Snapshots(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(snaps); n != 1 || len(snaps[0].GetReports()) != 1 {
		t.Fatalf("snapshots on the new leader: %v; want the deadline snapshot with its one report", snaps)
	}
	if run, err := direct.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: "r1"}); err != nil || run.GetRun().GetState() != v1.RunState_RUN_STATE_STOPPED {
		t.Fatalf("GetRun: %v, %v; want STOPPED", run.GetRun().GetState(), err)
	}
}
