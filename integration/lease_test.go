package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/clock"
	"github.com/snapcoord/snapcoord/server/coordinator"
	"github.com/snapcoord/snapcoord/server/engine"
)

// Lease timings of these tests: heartbeat every 100ms, lost after 300ms of
// silence, 1s of grace after a restart. The coordinator runs on a fake
// clock, so the test moves time and nothing waits for it.
const (
	hbInterval = 100 * time.Millisecond
	leaseTTL   = 300 * time.Millisecond
	grace      = time.Second
)

func leaseTimings(c *coordinator.Config) { c.HeartbeatInterval, c.LeaseTTL = hbInterval, leaseTTL }

// onClock runs the engine on clk, with grace after a restart.
func onClock(clk clock.Clock) coordinator.Option {
	return coordinator.WithEngine(func(o *engine.Options) { o.Clock, o.RestartGrace = clk, grace })
}

func workerStates(ctx context.Context, r *run) map[string]v1.WorkerState {
	states := map[string]v1.WorkerState{}
	for _, w := range r.workers(ctx) {
		states[w.Name] = w.State
	}
	return states
}

// An environment worker whose heartbeats stop is LOST once its TTL has
// passed, not before, and the deadline snapshot it was expected in
// completes without it: the run stops instead of waiting for B.
func TestSilentWorkerIsLostAndDoesNotBlockTheSnapshot(t *testing.T) {
	ctx := testContext(t)
	clk := clock.NewFake(time.Now())
	srv := startInproc(t, leaseTimings, onClock(clk))
	r := newCluster(t, srv.addr).createRun(ctx, "leases", deadlineSpec(1, clk.Now().Add(time.Hour), false))
	reg := r.register(ctx, v1.WorkerRole_WORKER_ROLE_TRAINER, "rank-0", 0)
	if reg.HeartbeatInterval.AsDuration() != hbInterval || reg.LeaseTtl.AsDuration() != leaseTTL {
		t.Fatalf("RegisterWorker told heartbeat %v, lease %v; want %v, %v", reg.HeartbeatInterval.AsDuration(), reg.LeaseTtl.AsDuration(), hbInterval, leaseTTL)
	}
	rank := reg.WorkerId
	envs := r.envs(ctx, 3) // env-2 will fall silent
	var readers []*reader
	for i, id := range envs {
		readers = append(readers, r.startReader(ctx, fmt.Sprintf("env-%d", i), id, false, 0))
	}
	trainer := r.startReader(ctx, "rank-0", rank, false, 0)

	r.step(ctx, rank, 1, fireIteration)
	r.saved(ctx, rank, 1, 1)
	snapID := readers[0].expect(ctx, "SaveAtDeadline").GetSaveAtDeadline().SnapshotId
	readers[1].expect(ctx, "SaveAtDeadline")
	for _, id := range envs[:2] {
		if err := r.reportSnapshot(ctx, id, snapID, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
			t.Fatalf("ReportSnapshot: %v", err)
		}
	}
	if s := r.snapshots(ctx)[0]; s.CompletedAt != nil {
		t.Fatalf("snapshot completed before env-2 reported or was lost: %v", s)
	}

	// Time passes in heartbeat intervals; everyone but env-2 heartbeats.
	tick := func() {
		clk.Advance(hbInterval)
		for _, id := range []string{rank, envs[0], envs[1]} {
			r.heartbeat(ctx, id)
		}
	}
	tick()
	tick() // 200ms of silence: within the TTL
	if st := workerStates(ctx, r); st["env-2"] != v1.WorkerState_WORKER_STATE_LIVE {
		t.Fatalf("env-2 is %v after 200ms of silence, want LIVE until its 300ms TTL", st["env-2"])
	}
	if run := r.get(ctx); run.State != v1.RunState_RUN_STATE_SNAPSHOTTING {
		t.Fatalf("run %v before env-2's TTL, want SNAPSHOTTING", run.State)
	}
	tick() // 300ms: the TTL
	st := workerStates(ctx, r)
	if st["env-2"] != v1.WorkerState_WORKER_STATE_LOST {
		t.Fatalf("env-2 is %v after its TTL, want LOST", st["env-2"])
	}
	for _, name := range []string{"rank-0", "env-0", "env-1"} {
		if st[name] != v1.WorkerState_WORKER_STATE_LIVE {
			t.Errorf("%s is %v, want LIVE: it heartbeats", name, st[name])
		}
	}
	// The lost worker no longer holds up the deadline snapshot, an hour
	// before B: the run stops, with a warning that the snapshot is not
	// complete.
	run := r.get(ctx)
	if run.State != v1.RunState_RUN_STATE_STOPPED {
		t.Fatalf("run %v after env-2 was lost, want STOPPED", run.State)
	}
	s := r.snapshots(ctx)[0]
	if s.CompletedAt == nil || s.Outcome == v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED || len(s.Reports) != 2 {
		t.Errorf("deadline snapshot %v: want completed, not SAVED (env-2's state was not saved), 2 reports", s)
	}
	waitStopped(ctx, t, readers[0], readers[1], trainer)
	evs := r.events(ctx)
	if lost := eventsOf(evs, v1.RunEventType_RUN_EVENT_TYPE_WORKER_LOST); len(lost) != 1 || lost[0].WorkerId != envs[2] {
		t.Errorf("WORKER_LOST events %v, want one for env-2 (%s)", lost, envs[2])
	}
	if w := eventsOf(evs, v1.RunEventType_RUN_EVENT_TYPE_WARNING); len(w) == 0 {
		t.Errorf("no WARNING event for a deadline snapshot that was not saved by everyone")
	}
}

// After a restart every known worker gets the grace period before it can
// be lost, however long the coordinator was down: nobody is lost inside it,
// and once it is over the silent are lost and the heartbeating are not.
func TestNobodyLostInsideRestartGrace(t *testing.T) {
	ctx := testContext(t)
	clk := clock.NewFake(time.Now())
	srv := startInproc(t, leaseTimings, onClock(clk))
	r := newCluster(t, srv.addr).createRun(ctx, "grace", deadlineSpec(1, clk.Now().Add(time.Hour), false))
	rank := r.trainers(ctx, 1)[0]
	envs := r.envs(ctx, 2)
	r.step(ctx, rank, 1, shortIteration)

	// Down for 10s: every lease stored before the stop is long expired.
	srv.stop()
	clk.Advance(10 * time.Second)
	srv.start()

	for range 9 { // 900ms of silence from everyone, inside the 1s grace
		clk.Advance(hbInterval)
	}
	for name, st := range workerStates(ctx, r) {
		if st != v1.WorkerState_WORKER_STATE_LIVE {
			t.Errorf("%s is %v 900ms after the restart, inside the grace period; want LIVE", name, st)
		}
	}
	// The grace ends at 1s; rank-0 and env-0 heartbeat, env-1 stays silent.
	for range 4 {
		r.heartbeat(ctx, rank)
		r.heartbeat(ctx, envs[0])
		clk.Advance(hbInterval)
	}
	st := workerStates(ctx, r)
	if st["env-1"] != v1.WorkerState_WORKER_STATE_LOST {
		t.Errorf("env-1 is %v after the grace period without a heartbeat, want LOST", st["env-1"])
	}
	if st["rank-0"] != v1.WorkerState_WORKER_STATE_LIVE || st["env-0"] != v1.WorkerState_WORKER_STATE_LIVE {
		t.Errorf("rank-0 %v, env-0 %v; want LIVE: they heartbeat", st["rank-0"], st["env-0"])
	}
	if lost := eventsOf(r.events(ctx), v1.RunEventType_RUN_EVENT_TYPE_WORKER_LOST); len(lost) != 1 || lost[0].WorkerId != envs[1] {
		t.Errorf("WORKER_LOST events %v, want one, for env-1", lost)
	}
	// A lost worker that heartbeats again is back.
	r.heartbeat(ctx, envs[1])
	if st := workerStates(ctx, r); st["env-1"] != v1.WorkerState_WORKER_STATE_LIVE {
		t.Errorf("env-1 is %v after heartbeating again, want LIVE", st["env-1"])
	}
}
