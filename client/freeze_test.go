package client_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
)

// freezeTTL is the coordinators' --election-ttl in the freeze tests: short,
// so that a failover takes seconds, long enough that a loaded machine does
// not depose a healthy leader.
const freezeTTL = 3 * time.Second

// snapcoord is the binary, built by the first test that runs it.
var snapcoord coordproc.Lazy

// startHAGroup runs n snapcoord binaries on one prefix of a real 3-member
// etcd cluster, with freezeTTL.
func startHAGroup(t *testing.T, n int) []*coordproc.Proc {
	t.Helper()
	etcd := etcdtest.Start(t, 3)
	bin := snapcoord.Path(t)
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
// and a deadline snapshot's report in flight on the frozen leader, and an
// environment worker's command stream and an event watch open there, move
// to the next leader as soon as it serves, not when the frozen one runs
// again (2× and 5× the election TTL later) or keepalive gives up on it.
// The step and the report are answered (the run SNAPSHOTTING ends
// STOPPED), and a run cancelled at the new leader is heard by the worker
// and the watch, within the TTL + 1 s.
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
	runClient := func(id string) *client.Client {
		created, err := admin.Runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: id, Spec: turnSpec(1)})
		if err != nil {
			t.Fatalf("CreateRun: %v", err)
		}
		return dialList(t, list, created.GetRunToken())
	}
	// r1: a trainer rank steps; r2: an environment worker and a watch follow.
	rank, err := runClient("r1").StartTrainer(ctx, client.TrainerConfig{RunID: "r1", Rank: 0, Logger: testLogger(t),
		FailSafe: &client.FailSafeConfig{Off: true}})
	if err != nil {
		t.Fatalf("StartTrainer: %v", err)
	}
	t.Cleanup(func() { closeWorker(t, rank) })
	env := startEnvWorker(t, runClient("r2"), "r2", false)
	if _, err := rank.CompleteStep(ctx, 1, time.Second); err != nil {
		t.Fatalf("step 1: %v", err)
	}
	// r3 is SNAPSHOTTING: its deadline fired, its environment worker saves.
	saver := startEnvWorker(t, runClient("r3"), "r3", false)
	if _, err := admin.Runs.TriggerDeadline(ctx, &v1.TriggerDeadlineRequest{RunId: "r3", Reason: "test"}); err != nil {
		t.Fatalf("TriggerDeadline: %v", err)
	}
	save := nextCommand(t, saver).GetSaveAtDeadline()
	if save == nil {
		t.Fatal("r3: no SaveAtDeadline")
	}
	events := make(chan *v1.RunEvent, 64)
	watched := make(chan error, 1)
	go func() {
		watched <- admin.WatchEvents(ctx, "r2", 0, true, func(ev *v1.RunEvent) error { events <- ev; return nil })
	}()
	<-events // the run's creation: the watch is open

	if err := old.Pause(); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	thaw := time.AfterFunc(freeze, func() { _ = old.Resume() })
	t.Cleanup(func() {
		if thaw.Stop() {
			_ = old.Resume()
		}
	})
	type answer struct {
		err error
		at  time.Time
	}
	stepped, reported := make(chan answer, 1), make(chan answer, 1)
	go func() {
		_, err := rank.CompleteStep(ctx, 2, time.Second)
		stepped <- answer{err, time.Now()}
	}()
	go func() {
		_, err := saver.ReportSnapshot(ctx, save.GetSnapshotId(), v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, time.Second, "ok")
		reported <- answer{err, time.Now()}
	}()

	next, serving := coordproc.LeaderForTest(ctx, t, procs, old)
	direct := dialList(t, next.Addr, "")
	if _, err := direct.Runs.CancelRun(ctx, &v1.CancelRunRequest{RunId: "r2", Reason: "test"}); err != nil {
		t.Fatalf("CancelRun at the next leader: %v", err)
	}
	cancelled := time.Now()
	t.Logf("leader %s frozen for %v; %s SERVING %v later (election TTL %v)", old.Addr, freeze, next.Addr,
		serving.Sub(frozen).Round(time.Millisecond), freezeTTL)
	bound := freezeTTL + time.Second
	for _, c := range []struct {
		what string
		got  chan answer
	}{{"step 2 of r1", stepped}, {"the report of r3's deadline snapshot", reported}} {
		a := <-c.got
		if a.err != nil {
			t.Fatalf("%s, sent as the leader froze: %v", c.what, a.err)
		}
		t.Logf("%s answered %v after the freeze, %v after the next leader served", c.what, a.at.Sub(frozen).Round(time.Millisecond),
			a.at.Sub(serving).Round(time.Millisecond))
		if late := a.at.Sub(serving); late > bound {
			t.Errorf("%s answered %v after the next leader served, want within %v", c.what, late.Round(time.Millisecond), bound)
		}
	}
	if run, err := direct.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: "r3"}); err != nil || run.GetRun().GetState() != v1.RunState_RUN_STATE_STOPPED {
		t.Errorf("r3 after its report: %v, %v; want STOPPED", run.GetRun().GetState(), err)
	}

	if cmd := nextCommand(t, env); cmd.GetStop() == nil {
		t.Fatalf("got %v, want the Stop of the cancelled run", cmd)
	}
	heard := time.Since(cancelled)
	if err := <-watched; err != nil {
		t.Fatalf("the watch of the cancelled run: %v", err)
	}
	watchedEnd := time.Since(cancelled)
	t.Logf("run r2 cancelled at the next leader: its Stop reached the worker %v later, the watch ended %v later",
		heard.Round(time.Millisecond), watchedEnd.Round(time.Millisecond))
	if heard > bound || watchedEnd > bound {
		t.Errorf("the worker's command stream and the watch, open on the frozen leader, heard the cancellation %v and %v later, want within %v",
			heard.Round(time.Millisecond), watchedEnd.Round(time.Millisecond), bound)
	}
}
