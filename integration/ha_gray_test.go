package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
)

// Gray failures of a coordinator group (issue 22): a frozen leader, a lost
// etcd quorum, a dead etcd member, a rolling restart; real etcd members,
// real snapcoord processes, workers on the Go client given every address.

// grayArgs are the workers' timings in these tests: production's
// proportions to the election TTL (5 s: 5 s heartbeats, 15 s leases),
// scaled to haTTL, so that a stall that would cost a worker its lease in
// production costs it here too.
var grayArgs = []string{"--heartbeat-interval", "3s", "--lease-ttl", "9s"}

// fleet is a run's ranks and environment workers, each on its own client.
type fleet struct {
	t     *testing.T
	list  string
	admin *client.Client
	id    string
	tok   string // the run token
	ranks []*client.Trainer
	envs  []*client.Worker
	// saves gets each SaveAtDeadline an environment worker receives; its
	// report is the test's to make. Other snapshots are reported at once.
	saves chan envSave
	// stopped gets one value per worker told Stop.
	stopped chan string

	mu       sync.Mutex
	reported map[string][]string // snapshot id → workers whose report was acknowledged
}

type envSave struct {
	w    *client.Worker
	snap *v1.SaveAtDeadlineCommand
}

// dialAll dials every coordinator; runToken "" is an admin client.
func dialAll(t *testing.T, list, runToken string) *client.Client {
	t.Helper()
	cl, err := client.Dial(list, client.WithInsecure(), client.WithRunToken(runToken))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func addrList(procs []*coordproc.Proc) string {
	addrs := make([]string, len(procs))
	for i, p := range procs {
		addrs[i] = p.Addr
	}
	return strings.Join(addrs, ",")
}

// newFleet creates run id (B at b) and starts its ranks and environment
// workers.
func newFleet(ctx context.Context, t *testing.T, procs []*coordproc.Proc, id string, ranks, envs int, b time.Time) *fleet {
	t.Helper()
	f := &fleet{t: t, list: addrList(procs), id: id, saves: make(chan envSave, envs),
		stopped: make(chan string, ranks+envs), reported: map[string][]string{}}
	f.admin = dialAll(t, f.list, "")
	created, err := f.admin.Runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: id, Spec: spectest.TurnUntil(int32(ranks), b, true)})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	f.tok = created.GetRunToken()
	for i := range envs {
		w, err := dialAll(t, f.list, created.GetRunToken()).StartWorker(ctx, client.WorkerConfig{RunID: id,
			Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: fmt.Sprintf("env-%d", i)})
		if err != nil {
			t.Fatalf("StartWorker: %v", err)
		}
		t.Cleanup(func() { _ = w.Close(context.Background()) })
		f.envs = append(f.envs, w)
		go f.serveEnv(ctx, w)
	}
	for i := range ranks {
		tr, err := dialAll(t, f.list, created.GetRunToken()).StartTrainer(ctx, client.TrainerConfig{RunID: id, Rank: int32(i)})
		if err != nil {
			t.Fatalf("StartTrainer: %v", err)
		}
		t.Cleanup(func() { _ = tr.Close(context.Background()) })
		f.ranks = append(f.ranks, tr)
		go f.awaitStop(tr.Worker)
	}
	return f
}

// serveEnv is an environment worker: it saves and reports every snapshot
// at once, except a SaveAtDeadline, which it hands to the test.
func (f *fleet) serveEnv(ctx context.Context, w *client.Worker) {
	for cmd := range w.Commands() {
		switch {
		case cmd.GetStop() != nil:
			f.stopped <- w.ID()
		case cmd.GetSaveAtDeadline() != nil:
			f.saves <- envSave{w: w, snap: cmd.GetSaveAtDeadline()}
		case cmd.GetSnapshot() != nil:
			_ = f.report(ctx, w, cmd.GetSnapshot().GetSnapshotId())
		}
	}
}

func (f *fleet) awaitStop(w *client.Worker) {
	for cmd := range w.Commands() {
		if cmd.GetStop() != nil {
			f.stopped <- w.ID()
		}
	}
}

// close deregisters every worker.
func (f *fleet) close(ctx context.Context) {
	for _, w := range f.envs {
		_ = w.Close(ctx)
	}
	for _, tr := range f.ranks {
		_ = tr.Close(ctx)
	}
}

// report reports a snapshot SAVED and records it once acknowledged.
func (f *fleet) report(ctx context.Context, w *client.Worker, snapID string) error {
	if _, err := w.ReportSnapshot(ctx, snapID, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 10*time.Millisecond, ""); err != nil {
		return err
	}
	f.mu.Lock()
	f.reported[snapID] = append(f.reported[snapID], w.ID())
	f.mu.Unlock()
	return nil
}

// stepAll completes step on every rank at once.
func (f *fleet) stepAll(ctx context.Context, step int64) []*v1.Decision {
	f.t.Helper()
	ds := make([]*v1.Decision, len(f.ranks))
	errs := make([]error, len(f.ranks))
	var wg sync.WaitGroup
	for i, tr := range f.ranks {
		wg.Go(func() { ds[i], errs[i] = tr.CompleteStep(ctx, step, 100*time.Millisecond) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		f.t.Fatalf("CompleteStep(%d): %v", step, err)
	}
	return ds
}

// checkpointAll reports step saved on every rank.
func (f *fleet) checkpointAll(ctx context.Context, step int64) {
	f.t.Helper()
	for _, tr := range f.ranks {
		if _, err := tr.ReportCheckpoint(ctx, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 50*time.Millisecond); err != nil {
			f.t.Fatalf("ReportCheckpoint(%d): %v", step, err)
		}
	}
}

// verify checks, through the leader, that the run ended STOPPED (or runs
// on, when want is RUNNING), that every acknowledged snapshot report is
// stored, and that no worker was declared LOST while the run went on.
func (f *fleet) verify(ctx context.Context, want v1.RunState) {
	f.t.Helper()
	run, err := f.admin.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: f.id})
	if err != nil || run.GetRun().GetState() != want {
		f.t.Fatalf("GetRun = %v, %v; want %v", run.GetRun().GetState(), err, want)
	}
	snaps, err := f.admin.Runs.ListSnapshots(ctx, &v1.ListSnapshotsRequest{RunId: f.id})
	if err != nil {
		f.t.Fatal(err)
	}
	stored := map[string]map[string]bool{}
	for _, s := range snaps.GetSnapshots() {
		stored[s.GetSnapshotId()] = map[string]bool{}
		for _, r := range s.GetReports() {
			stored[s.GetSnapshotId()][r.GetWorkerId()] = true
		}
	}
	f.mu.Lock()
	for id, workers := range f.reported {
		for _, w := range workers {
			if !stored[id][w] {
				f.t.Errorf("snapshot %s: the report of %s was acknowledged but is not stored", id, w)
			}
		}
	}
	f.mu.Unlock()
	// A worker's process stops heartbeating once told Stop (its commands
	// end), so leases lapse after the run ended: only a loss while the run
	// went on is a healthy worker's.
	ended := run.GetRun().GetEndedAt()
	err = f.admin.WatchEvents(ctx, f.id, 0, false, func(ev *v1.RunEvent) error {
		if ev.GetType() == v1.RunEventType_RUN_EVENT_TYPE_WORKER_LOST && (ended == nil || ev.GetAt().AsTime().Before(ended.AsTime())) {
			f.t.Errorf("a healthy worker was declared lost while the run went on: %s", ev.GetMessage())
		}
		return nil
	})
	if err != nil {
		f.t.Fatalf("WatchEvents: %v", err)
	}
}

// A leader frozen (SIGSTOP) for 2× its election TTL while a deadline
// snapshot waits for the environment workers' reports, which they make
// during the freeze: another coordinator takes over, every report reaches
// it once the ex-leader wakes and refuses it, the run ends STOPPED before
// B with all three reports, and no worker is declared LOST (the new leader
// renews every lease when it takes over). A heartbeat that sat in the
// frozen leader's socket is refused when it wakes, not answered from its
// memory as though it still led.
func TestHAFrozenLeaderDuringSnapshot(t *testing.T) {
	frozenLeaderDuringSnapshot(t, 2*haTTL)
}

// The same with a freeze of 5× the TTL (15 s), longer than the workers'
// leases run after the takeover (9 s): the clients must leave the frozen
// ex-leader for the new one. Before they cut a call waiting on a leader
// that another replaced, every report and heartbeat made during the
// freeze waited for SIGCONT (15.1 s), and 3 of 5 workers were declared
// lost 9 s after the takeover.
func TestHAFrozenLeaderDuringSnapshotLong(t *testing.T) {
	frozenLeaderDuringSnapshot(t, 5*haTTL)
}

func frozenLeaderDuringSnapshot(t *testing.T, freeze time.Duration) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout+freeze)
	defer cancel()
	_, procs := startEtcdGroup(t, 3, grayArgs...)
	lead := awaitLeader(ctx, t, procs)
	b := time.Now().Add(30*time.Second + freeze)
	f := newFleet(ctx, t, procs, "frozen", 2, 3, b)
	f.stepAll(ctx, 1)
	if _, err := f.admin.Runs.TriggerDeadline(ctx, &v1.TriggerDeadlineRequest{RunId: f.id, Reason: "test"}); err != nil {
		t.Fatalf("TriggerDeadline: %v", err)
	}
	for _, d := range f.stepAll(ctx, 2) {
		if d.GetAction() != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
			t.Fatalf("CompleteStep(2) after the trigger: %v; want SAVE_AND_STOP", d)
		}
	}
	f.checkpointAll(ctx, 2)
	var saves []envSave
	for range f.envs {
		select {
		case s := <-f.saves:
			saves = append(saves, s)
		case <-ctx.Done():
			t.Fatalf("%d of %d SaveAtDeadline received", len(saves), len(f.envs))
		}
	}
	if run, err := f.admin.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: f.id}); err != nil || run.GetRun().GetState() != v1.RunState_RUN_STATE_SNAPSHOTTING {
		t.Fatalf("before the freeze: %v, %v; want SNAPSHOTTING", run.GetRun().GetState(), err)
	}
	direct := v1.NewWorkerServiceClient(dial(t, lead.Addr, f.tok))
	if _, err := direct.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: f.id, WorkerId: f.envs[0].ID(), Incarnation: f.envs[0].Incarnation()}); err != nil {
		t.Fatalf("Heartbeat on the leader: %v", err)
	}

	if err := lead.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	stale := make(chan error, 1)
	go func() { // sits in the frozen leader's socket
		_, err := direct.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: f.id, WorkerId: f.envs[0].ID(), Incarnation: f.envs[0].Incarnation()})
		stale <- err
	}()
	answered := make(chan time.Duration, len(saves))
	for _, s := range saves {
		go func() {
			if err := f.report(ctx, s.w, s.snap.GetSnapshotId()); err != nil {
				t.Errorf("ReportSnapshot of %s during the freeze: %v", s.w.ID(), err)
			}
			answered <- time.Since(paused)
		}()
	}
	next := awaitLeader(ctx, t, procs, lead)
	served := time.Since(paused)
	time.Sleep(time.Until(paused.Add(freeze))) // the freeze itself
	if err := lead.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed := time.Since(paused)
	notLeader(t, "a heartbeat that sat in the frozen leader's socket", <-stale)
	var slowest time.Duration
	for range saves {
		slowest = max(slowest, <-answered)
	}
	t.Logf("froze the leader %v (election TTL %v): %s SERVING after %v; reports made during the freeze answered by %v (SIGCONT at %v)",
		freeze, haTTL, next.Addr, served.Round(time.Millisecond), slowest.Round(time.Millisecond), resumed.Round(time.Millisecond))
	for range len(f.envs) + len(f.ranks) {
		select {
		case <-f.stopped:
		case <-ctx.Done():
			t.Fatal("not every worker was told Stop")
		}
	}
	if now := time.Now(); !now.Before(b) {
		t.Fatalf("the run stopped %v after B", now.Sub(b))
	}
	f.verify(ctx, v1.RunState_RUN_STATE_STOPPED)
	for _, s := range saves {
		if got := len(f.reported[s.snap.GetSnapshotId()]); got != len(f.envs) {
			t.Fatalf("deadline snapshot %s: %d reports acknowledged, want %d", s.snap.GetSnapshotId(), got, len(f.envs))
		}
	}
	if err := lead.AwaitHealth(ctx, runService, healthpb.HealthCheckResponse_NOT_SERVING); err != nil {
		t.Fatal(err)
	}
}

// stepping drives every rank of a fleet through a step every 100 ms (its
// iteration) until stop, recording each decision once acknowledged; a rank
// told to save reports the checkpoint saved.
type stepping struct {
	f      *fleet
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	changed chan struct{}            // closed and replaced at each acknowledgement
	decided []map[int64]*v1.Decision // per rank
	last    []int64
	longest time.Duration // the slowest acknowledged call
	err     error
}

func (f *fleet) step(ctx context.Context) *stepping {
	ctx, cancel := context.WithCancel(ctx)
	s := &stepping{f: f, cancel: cancel, changed: make(chan struct{}), last: make([]int64, len(f.ranks))}
	for i, tr := range f.ranks {
		s.decided = append(s.decided, map[int64]*v1.Decision{})
		s.wg.Go(func() { s.rank(ctx, i, tr) })
	}
	return s
}

func (s *stepping) rank(ctx context.Context, i int, tr *client.Trainer) {
	for step := int64(1); ; step++ {
		began := time.Now()
		d, err := tr.CompleteStep(ctx, step, 100*time.Millisecond)
		if err == nil && d.GetAction() == v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE {
			_, err = tr.ReportCheckpoint(ctx, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 10*time.Millisecond)
		}
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		if err != nil {
			s.err = fmt.Errorf("rank %d, step %d: %w", i, step, err)
			s.mu.Unlock()
			return
		}
		s.decided[i][step], s.last[i] = d, step
		s.longest = max(s.longest, time.Since(began))
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond): // the iteration
		}
	}
}

// slowest returns the slowest call acknowledged since the last time it was
// asked.
func (s *stepping) slowest() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.longest
	s.longest = 0
	return d
}

// progressed returns once every rank has had n more steps acknowledged
// than when it was called; it fails t if a rank's call failed.
func (s *stepping) progressed(ctx context.Context, t *testing.T, n int64) {
	t.Helper()
	s.mu.Lock()
	target := slices.Max(s.last) + n
	s.mu.Unlock()
	s.await(ctx, t, fmt.Sprintf("the ranks to reach step %d", target), func() bool { return slices.Min(s.last) >= target })
}

// answered returns once every rank's latest decision came from a
// coordinator, not from its fail-safe plan.
func (s *stepping) answered(ctx context.Context, t *testing.T) {
	t.Helper()
	s.await(ctx, t, "the ranks' decisions to come from a coordinator again", func() bool {
		for i, last := range s.last {
			if local(s.decided[i][last]) {
				return false
			}
		}
		return true
	})
}

// await returns once done (called under s.mu) holds after an
// acknowledgement; it fails t if a rank's call failed or ctx ends first.
func (s *stepping) await(ctx context.Context, t *testing.T, what string, done func() bool) {
	t.Helper()
	for {
		s.mu.Lock()
		err, ok, changed := s.err, done(), s.changed
		s.mu.Unlock()
		switch {
		case err != nil:
			t.Fatalf("a rank's call failed: %v", err)
		case ok:
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}

// stop ends the stepping and checks, through the leader, that the last
// decisions acknowledged are given again unchanged when asked again.
func (s *stepping) stop(ctx context.Context, t *testing.T) time.Duration {
	t.Helper()
	s.cancel()
	s.wg.Wait()
	if s.err != nil {
		t.Fatalf("a rank's call failed: %v", s.err)
	}
	for i, tr := range s.f.ranks {
		for step := max(1, s.last[i]-40); step <= s.last[i]; step++ {
			d, err := tr.CompleteStep(ctx, step, 100*time.Millisecond)
			acked := s.decided[i][step]
			if local(acked) {
				// Decided by the rank's fail-safe plan: its report made
				// the same action the step's decision.
				if err != nil || d.GetAction() != acked.GetAction() || local(d) {
					t.Fatalf("rank %d, step %d, decided by the rank, asked again: %v, %v; want the coordinator's %v", i, step, d, err, acked.GetAction())
				}
				continue
			}
			if err != nil || !protoEqual(d, acked) {
				t.Fatalf("rank %d, step %d asked again: %v, %v; want the decision acknowledged: %v", i, step, d, err, acked)
			}
		}
	}
	return s.longest
}

// local reports whether d was decided by a rank's fail-safe plan, not
// answered by a coordinator.
func local(d *v1.Decision) bool { return strings.HasPrefix(d.GetExplanation(), "decided by this rank") }

// etcd losing its quorum for ~3 s (two of three members SIGSTOPped) while
// the ranks step: every decision acknowledged is kept and given again
// unchanged, every snapshot report acknowledged is stored, the run goes
// on once quorum is back, and no worker is declared LOST.
func TestHAQuorumLossDuringStepping(t *testing.T) {
	quorumLossDuringStepping(t, 3*time.Second)
}

// The same for ~20 s, past the election TTL and the workers' leases: the
// leader loses its session and no coordinator leads until quorum is back.
// No error reaches the ranks' loop (they decide by the fail-safe plan and
// report those steps when a leader serves again, which keeps them), and
// the new leader's grace keeps every worker.
func TestHALongQuorumLossDuringStepping(t *testing.T) {
	quorumLossDuringStepping(t, 20*time.Second)
}

func quorumLossDuringStepping(t *testing.T, outage time.Duration) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout+outage)
	defer cancel()
	etcd, procs := startEtcdGroup(t, 3, grayArgs...)
	awaitLeader(ctx, t, procs)
	f := newFleet(ctx, t, procs, "quorum", 2, 2, time.Now().Add(time.Hour))
	s := f.step(ctx)
	s.progressed(ctx, t, 5)

	for _, i := range []int{1, 2} {
		if err := etcd.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(outage) // the outage itself
	for _, i := range []int{1, 2} {
		if err := etcd.Cont(i); err != nil {
			t.Fatal(err)
		}
	}
	back := time.Now()
	s.progressed(ctx, t, 5)
	s.answered(ctx, t)
	t.Logf("etcd quorum lost for %v: the ranks stepped 5 more times %v after it returned", outage, time.Since(back).Round(time.Millisecond))
	t.Logf("slowest step acknowledged: %v", s.stop(ctx, t).Round(time.Millisecond))
	f.verify(ctx, v1.RunState_RUN_STATE_RUNNING)
}

// An etcd member SIGKILLed, then every coordinator restarted in turn
// (SIGTERM, start again; the leader last), while the ranks step: the run
// goes on throughout, nothing acknowledged is lost or changed, and no
// worker is declared LOST.
func TestHAEtcdMemberLossAndRollingRestart(t *testing.T) {
	ctx := testContext(t)
	etcd, procs := startEtcdGroup(t, 3, grayArgs...)
	lead := awaitLeader(ctx, t, procs)
	f := newFleet(ctx, t, procs, "rolling", 2, 2, time.Now().Add(time.Hour))
	s := f.step(ctx)
	s.progressed(ctx, t, 5)

	s.slowest()
	if err := etcd.Kill(0); err != nil {
		t.Fatal(err)
	}
	s.progressed(ctx, t, 5)
	if err := etcd.Restart(ctx, 0); err != nil {
		t.Fatal(err)
	}
	s.progressed(ctx, t, 3)
	t.Logf("etcd member 0 killed and restarted: slowest step acknowledged %v", s.slowest().Round(time.Millisecond))

	order := slices.DeleteFunc(slices.Clone(procs), func(p *coordproc.Proc) bool { return p == lead })
	for _, p := range append(order, lead) {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Fatalf("stop %s: %v", p.Addr, err)
		}
		procs[slices.Index(procs, p)] = p.RestartForTest(t)
		awaitLeader(ctx, t, procs)
		s.progressed(ctx, t, 3)
		t.Logf("coordinator %s restarted (leader: %v): slowest step acknowledged %v", p.Addr, p == lead, s.slowest().Round(time.Millisecond))
	}
	s.stop(ctx, t)
	f.verify(ctx, v1.RunState_RUN_STATE_RUNNING)
	// The restarted coordinators' cleanups run before the workers'.
	f.close(ctx)
}
