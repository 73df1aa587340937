package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
)

// leaderService is the service whose health tells the leader (SERVING)
// from a follower (NOT_SERVING).
const leaderService = "snapcoord.v1.RunService"

// probesPerPause is how many writes are sent to a paused leader, after
// another took over, to be answered when it runs again: every one must be
// refused.
const probesPerPause = 4

// haCluster is the etcd cluster and the coordinators sharing one prefix.
type haCluster struct {
	procs  []*coordproc.Proc
	leader int // index of the coordinator serving as leader
	ttl    time.Duration
}

// addrs is every coordinator's address, as clients are given them.
func (h *haCluster) addrs() string {
	var a []string
	for _, p := range h.procs {
		a = append(a, p.Addr)
	}
	return strings.Join(a, ",")
}

func (h *haCluster) stop() {
	for _, p := range h.procs {
		_ = syscall.Kill(p.Pid(), syscall.SIGCONT) // a paused one cannot drain
		_ = p.Stop(15 * time.Second)
	}
}

// failoverWait bounds the wait for a new leader: the dead leader's session
// lease must lapse (the election TTL) before another can win, then it loads
// the state from etcd.
func (h *haCluster) failoverWait() time.Duration { return 3*h.ttl + 30*time.Second }

// watchLeaders starts watching every coordinator but the leader, before the
// leader is killed or paused, and returns a wait for the first to report
// SERVING as leader: its index and when its report arrived.
func (h *haCluster) watchLeaders(ctx context.Context) (func(timeout time.Duration) (int, time.Time, error), error) {
	type won struct {
		i  int
		at time.Time
	}
	ctx, cancel := context.WithCancel(ctx)
	first := make(chan won, len(h.procs))
	for i, p := range h.procs {
		if i == h.leader {
			continue
		}
		ch, err := p.WatchHealth(ctx, leaderService)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("watch coordinator %d: %w", i, err)
		}
		go func() {
			for st := range ch {
				if st == healthpb.HealthCheckResponse_SERVING {
					first <- won{i, time.Now()}
					return
				}
			}
		}()
	}
	return func(timeout time.Duration) (int, time.Time, error) {
		defer cancel()
		select {
		case w := <-first:
			return w.i, w.at, nil
		case <-time.After(timeout):
			return -1, time.Time{}, fmt.Errorf("no coordinator became leader within %s", timeout)
		case <-ctx.Done():
			return -1, time.Time{}, ctx.Err()
		}
	}, nil
}

// findLeader waits for one coordinator to serve as leader.
func (h *haCluster) findLeader(ctx context.Context) error {
	h.leader = -1 // watch them all
	wait, err := h.watchLeaders(ctx)
	if err != nil {
		return err
	}
	h.leader, _, err = wait(h.failoverWait())
	return err
}

// haSummary adds to summary what only the HA loop measures.
type haSummary struct {
	summary
	kills, pauses []time.Duration // failover times
	probes        int             // writes sent to deposed leaders
	probeAcked    []string        // those answered OK: must be none
	probeStored   []string        // those found in etcd: must be none
	refusals      map[string]int  // how they were refused: code, and ErrorInfo reason
	notDeposed    int             // paused leaders that still said SERVING after resuming
	freezes       []time.Duration // failover times after a freeze
	// stalls are, by kind of cycle, how long after the next leader served
	// (or etcd had quorum again) every writer had a write acknowledged.
	stalls map[cycleKind][]time.Duration
	// stepDowns counts the coordinators' "stepped down" log lines by cause:
	// a lost election session, or a commit the fence refused.
	stepDowns map[string]int
}

func haLoop(ctx context.Context, cfg config, out io.Writer) (bool, error) {
	bin, tmp, cleanup, err := prepare(cfg, "snapcrash-ha-", out)
	if err != nil {
		return false, err
	}
	defer cleanup()
	rng := rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x9e3779b97f4a7c15))
	schedule := cfg.haSchedule
	if len(schedule) == 0 {
		schedule = haSchedule
	}
	fmt.Fprintf(out, "snapcrash --ha: %d cycles, 3 etcd members, %d coordinators (election TTL %s), %d runs × (%d ranks + %d environment workers) stepping every %s, after %s..%s of service cycling through %s, seed %d\n",
		cfg.cycles, cfg.coordinators, cfg.electionTTL, cfg.runs, cfg.ranks, cfg.envs, cfg.stepEvery, cfg.minUp, cfg.maxUp, describeSchedule(schedule), cfg.seed)

	etcd, err := etcdtest.Launch(ctx, filepath.Join(tmp, "etcd"), 3)
	if err != nil {
		return false, fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()
	h, err := startCoordinators(ctx, cfg, bin, tmp, etcd.Endpoints())
	if err != nil {
		return false, err
	}
	defer h.stop()
	if err := h.findLeader(ctx); err != nil {
		return false, err
	}
	admin, err := client.Dial(h.addrs(), client.WithInsecure())
	if err != nil {
		return false, err
	}
	defer admin.Close()
	probe, err := newProbeRun(ctx, admin, h.addrs())
	if err != nil {
		return false, err
	}

	f, err := startFleet(ctx, h.addrs(), cfg)
	if err != nil {
		return false, err
	}
	defer f.close()

	s := haSummary{summary: summary{lost: map[string]bool{}, unread: map[string]bool{}, failovers: true}, refusals: map[string]int{},
		stalls: map[cycleKind][]time.Duration{}}
	for cycle := 1; cycle <= cfg.cycles; cycle++ {
		up := cfg.minUp + time.Duration(rng.Int64N(int64(cfg.maxUp-cfg.minUp)+1))
		if err := serveFor(ctx, up, f.runs); err != nil {
			return false, err
		}
		old := h.leader
		ackedAt := f.log.counts().writes()
		var line string
		var served time.Time
		kind := schedule[(cycle-1)%len(schedule)]
		switch kind {
		case cyclePause:
			line, served, err = h.pauseCycle(ctx, admin, probe, cycle, &s)
		case cycleFreeze:
			line, served, err = h.freezeCycle(ctx, &s)
		case cycleQuorum:
			line, served, err = h.quorumCycle(ctx, etcd, rng)
		default:
			line, served, err = h.killCycle(ctx, &s)
		}
		if err != nil {
			return false, fmt.Errorf("cycle %d: %w", cycle, err)
		}
		// From the new leader's SERVING: what the clients add to the failover.
		resumed, silent, v := f.settle(ctx, admin, served, cfg.resumeTimeout, cycle, &s.summary)
		s.stalls[kind] = append(s.stalls[kind], resumed)
		state := "ok"
		if len(v.lost) > 0 || len(v.unread) > 0 || len(silent) > 0 || strings.Contains(line, "FAILED") {
			state = "FAILED"
		}
		fmt.Fprintf(out, "cycle %2d: leader %d after %4d ms with %6d writes acknowledged: %s; coordinator %d leads; writers resumed %4d ms after%s; %6d writes verified, %d lost%s  %s\n",
			cycle, old, up.Milliseconds(), ackedAt, line, h.leader, resumed.Milliseconds(), silentNote(silent), v.checked, len(v.lost), unreadNote(v.unread), state)
		s.record(out, v)
	}

	f.finish(ctx, admin, &s.summary, out)
	s.stepDowns = h.stepDowns()
	return haReport(out, s), nil
}

// cycleKind is what a cycle does to the group.
type cycleKind string

const (
	cycleKill   cycleKind = "SIGKILL"     // the leader killed and restarted
	cyclePause  cycleKind = "SIGSTOP"     // the leader paused until another serves, sent writes, resumed
	cycleFreeze cycleKind = "freeze"      // the leader paused 2× its TTL while the writers' snapshots are in flight
	cycleQuorum cycleKind = "quorum loss" // two of the three etcd members paused for quorumOutage
)

// haSchedule is the cycles' order, repeated: a run of three cycles (CI)
// kills, pauses and freezes the leader; one of five adds a quorum loss.
var haSchedule = []cycleKind{cycleKill, cyclePause, cycleFreeze, cycleKill, cycleQuorum}

func describeSchedule(kinds []cycleKind) string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
}

// quorumOutage is how long a quorum-loss cycle keeps etcd without quorum.
const quorumOutage = 3 * time.Second

func startCoordinators(ctx context.Context, cfg config, bin, tmp string, endpoints []string) (*haCluster, error) {
	h := &haCluster{ttl: cfg.electionTTL}
	for i := range cfg.coordinators {
		p, err := coordproc.Start(ctx, coordproc.Config{Bin: bin, LogPath: filepath.Join(tmp, fmt.Sprintf("snapcoord-%d.log", i)),
			Args: []string{"--store", "etcd", "--etcd-endpoints", strings.Join(endpoints, ","), "--etcd-prefix", "/snapcrash",
				"--election-ttl", cfg.electionTTL.String(),
				// As in the bbolt loop: every checkpoint's events are read back.
				"--metrics-listen", "", "--log-format", "json", "--max-events-per-run", "100000000"}})
		if err != nil {
			h.stop()
			return nil, fmt.Errorf("coordinator %d: %w", i, err)
		}
		h.procs = append(h.procs, p)
	}
	return h, nil
}

// killCycle SIGKILLs the leader, times the failover to the next leader's
// SERVING, and restarts the dead one (as a follower: the new leader holds
// the election).
func (h *haCluster) killCycle(ctx context.Context, s *haSummary) (string, time.Time, error) {
	wait, err := h.watchLeaders(ctx)
	if err != nil {
		return "", time.Time{}, err
	}
	dead := h.procs[h.leader]
	killed := time.Now()
	if err := dead.Kill(); err != nil {
		return "", time.Time{}, err
	}
	next, at, err := wait(h.failoverWait())
	if err != nil {
		return "", time.Time{}, err
	}
	failover := at.Sub(killed)
	s.kills = append(s.kills, failover)
	if h.procs[h.leader], err = dead.Restart(ctx); err != nil {
		return "", time.Time{}, fmt.Errorf("restart: %w", err)
	}
	h.leader = next
	return fmt.Sprintf("SIGKILL, next leader SERVING in %5d ms", failover.Milliseconds()), at, nil
}

// pauseCycle SIGSTOPs the leader until another has taken over (its session
// lease must lapse first), sends it writes it can answer only once it runs
// again, SIGCONTs it, and checks that it refused every one, stored none,
// and stepped down.
func (h *haCluster) pauseCycle(ctx context.Context, admin *client.Client, probe *probeRun, cycle int, s *haSummary) (string, time.Time, error) {
	oldIndex := h.leader
	old := h.procs[oldIndex]
	// Registered again through the leader, so that the probe trainer is
	// live: a refusal must come from the fence, not from a lapsed lease.
	if err := probe.register(ctx); err != nil {
		return "", time.Time{}, err
	}
	direct, err := probe.dialReady(ctx, old.Addr)
	if err != nil {
		return "", time.Time{}, err
	}
	defer direct.Close()
	st, err := h.stopLeader(ctx)
	if err != nil {
		return "", time.Time{}, err
	}
	next, at, oldHealth, paused := st.next, st.at, st.oldHealth, st.stopped
	failover := at.Sub(paused)
	s.pauses = append(s.pauses, failover)
	answers := probe.send(ctx, direct, cycle)
	if err := syscall.Kill(old.Pid(), syscall.SIGCONT); err != nil {
		return "", time.Time{}, err
	}
	stopped := time.Since(paused)
	h.leader = next
	acked := 0
	for a := range answers {
		s.probes++
		if a.err == nil {
			acked++
			s.probeAcked = append(s.probeAcked, fmt.Sprintf("cycle %d: %s", cycle, a.what))
			continue
		}
		s.refusals[refusal(a.err)]++
	}
	deposed, err := h.awaitStepDown(ctx, oldIndex, oldHealth)
	if err != nil {
		return "", time.Time{}, err
	}
	if deposed == "" {
		s.notDeposed++
	}
	stored, err := probe.stored(ctx, admin, cycle)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("read the probe run back: %w", err)
	}
	for _, w := range stored {
		s.probeStored = append(s.probeStored, fmt.Sprintf("cycle %d: %s", cycle, w))
	}
	verdict := "ok"
	if acked > 0 || len(stored) > 0 || deposed == "" {
		verdict, deposed = "FAILED", "did NOT step down"
	}
	return fmt.Sprintf("SIGSTOP for %5d ms, next leader SERVING in %5d ms; ex-leader acknowledged %d of %d writes, %d stored, %s (%s)",
		stopped.Milliseconds(), failover.Milliseconds(), acked, probesPerPause+1, len(stored), deposed, verdict), at, nil
}

// stoppedLeader is a leader SIGSTOPped until another served.
type stoppedLeader struct {
	stopped time.Time
	next    int       // the coordinator that took over
	at      time.Time // when it reported SERVING
	// oldHealth watches the stopped leader from before its stop: its
	// step-down must show as a change away from SERVING.
	oldHealth <-chan healthpb.HealthCheckResponse_ServingStatus
}

// stopLeader SIGSTOPs the leader and waits for another to serve (its
// session lease must lapse first).
func (h *haCluster) stopLeader(ctx context.Context) (stoppedLeader, error) {
	old := h.procs[h.leader]
	wait, err := h.watchLeaders(ctx)
	if err != nil {
		return stoppedLeader{}, err
	}
	var st stoppedLeader
	if st.oldHealth, err = old.WatchHealth(ctx, leaderService); err != nil {
		return stoppedLeader{}, err
	}
	st.stopped = time.Now()
	if err := syscall.Kill(old.Pid(), syscall.SIGSTOP); err != nil {
		return stoppedLeader{}, err
	}
	if st.next, st.at, err = wait(h.failoverWait()); err != nil {
		_ = syscall.Kill(old.Pid(), syscall.SIGCONT)
		return stoppedLeader{}, err
	}
	return st, nil
}

// freezeCycle SIGSTOPs the leader for twice its election TTL, as a long GC
// pause or a frozen VM would, while the writers' snapshots are in flight
// (every checkpoint issues one): the writers' calls sent to it sit in its
// sockets until it runs again. Another coordinator must take over, the
// ex-leader must step down once resumed, and every writer must go on; the
// time the writers take after the next leader serves is the stall a freeze
// costs them.
func (h *haCluster) freezeCycle(ctx context.Context, s *haSummary) (string, time.Time, error) {
	oldIndex := h.leader
	old := h.procs[oldIndex]
	st, err := h.stopLeader(ctx)
	if err != nil {
		return "", time.Time{}, err
	}
	next, at, oldHealth, frozen := st.next, st.at, st.oldHealth, st.stopped
	s.freezes = append(s.freezes, at.Sub(frozen))
	time.Sleep(time.Until(frozen.Add(2 * h.ttl))) // the freeze itself
	if err := syscall.Kill(old.Pid(), syscall.SIGCONT); err != nil {
		return "", time.Time{}, err
	}
	h.leader = next
	deposed, err := h.awaitStepDown(ctx, oldIndex, oldHealth)
	if err != nil {
		return "", time.Time{}, err
	}
	if deposed == "" {
		s.notDeposed++
		deposed = "did NOT step down (FAILED)"
	}
	return fmt.Sprintf("frozen %5d ms, next leader SERVING in %5d ms; ex-leader %s", time.Since(frozen).Milliseconds(),
		at.Sub(frozen).Milliseconds(), deposed), at, nil
}

// quorumCycle SIGSTOPs two of the three etcd members for quorumOutage: no
// coordinator can commit, and no election lease can be renewed or expire.
// Once they run again, the group must serve (the same leader, or another if
// its session was given up meanwhile) and every writer go on; the time from
// quorum's return is the stall.
func (h *haCluster) quorumCycle(ctx context.Context, etcd *etcdtest.Cluster, rng *rand.Rand) (string, time.Time, error) {
	keep := rng.IntN(etcd.Size())
	var stopped []int
	for i := range etcd.Size() {
		if i != keep {
			if err := etcd.Stop(i); err != nil {
				return "", time.Time{}, err
			}
			stopped = append(stopped, i)
		}
	}
	time.Sleep(quorumOutage) // the outage itself
	for _, i := range stopped {
		if err := etcd.Cont(i); err != nil {
			return "", time.Time{}, err
		}
	}
	back := time.Now()
	if err := h.findLeader(ctx); err != nil {
		return "", time.Time{}, err
	}
	return fmt.Sprintf("etcd quorum lost %5d ms (members %v paused), a leader SERVING %4d ms after", quorumOutage.Milliseconds(),
		stopped, time.Since(back).Milliseconds()), back, nil
}

// awaitStepDown reads the resumed ex-leader's health watch until it
// reports anything but SERVING for the leader's service: it found itself
// deposed and serves as a follower. A coordinator that exits instead has
// stepped down too; it is restarted, as a follower. It returns how it
// stepped down, or "" if it still claimed to lead after failoverWait.
func (h *haCluster) awaitStepDown(ctx context.Context, i int, ch <-chan healthpb.HealthCheckResponse_ServingStatus) (string, error) {
	t := time.NewTimer(h.failoverWait())
	defer t.Stop()
	p := h.procs[i]
	for {
		select {
		case st, ok := <-ch:
			if ok && st == healthpb.HealthCheckResponse_SERVING {
				continue
			}
			if ok {
				return "stepped down", nil
			}
			// The watch ended: the process exited, or the watch failed.
			select {
			case <-p.Exited():
			case <-t.C:
				return "", nil
			}
			q, err := p.Restart(ctx)
			if err != nil {
				return "", fmt.Errorf("restart coordinator %d: %w", i, err)
			}
			h.procs[i] = q
			return "exited (restarted)", nil
		case <-t.C:
			return "", nil
		}
	}
}

// probeRun is a run written to only by the fencing probes: one trainer rank
// whose decisions a deposed leader must never store, and workers it must
// never register.
type probeRun struct {
	addrs    string // every coordinator, as the writers have them
	token    string
	workerID string
	inc      int64
}

const probeRunID = "fence-probe"

func newProbeRun(ctx context.Context, admin *client.Client, addrs string) (*probeRun, error) {
	resp, err := admin.Runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: probeRunID, Spec: &v1.RunSpec{
		TrainerWorldSize: 1,
		Checkpointing:    &v1.CheckpointingSpec{CheckpointMustSaveBy: "30:00:00:00"},
		RolloutRecovery:  &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN},
	}})
	if err != nil {
		return nil, fmt.Errorf("CreateRun %s: %w", probeRunID, err)
	}
	return &probeRun{addrs: addrs, token: resp.RunToken}, nil
}

func (p *probeRun) register(ctx context.Context) error {
	cl, err := client.Dial(p.addrs, client.WithInsecure(), client.WithRunToken(p.token))
	if err != nil {
		return err
	}
	defer cl.Close()
	return until(ctx, func(ctx context.Context) error {
		resp, err := cl.Workers.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: probeRunID,
			Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "probe-rank-0", Rank: 0})
		if err == nil {
			p.workerID, p.inc = resp.WorkerId, resp.Incarnation
		}
		return err
	})
}

// dialReady connects to one coordinator only, with no retries (a refusal
// must be seen as given), and waits until the connection is up, so that
// writes sent while it is paused sit in its socket, to be read the moment
// it runs again.
func (p *probeRun) dialReady(ctx context.Context, addr string) (*client.Client, error) {
	cl, err := client.Dial(addr, client.WithInsecure(), client.WithRunToken(p.token), client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(cl.Conn()).Check(hctx, &healthpb.HealthCheckRequest{}); err != nil {
		_ = cl.Close()
		return nil, fmt.Errorf("connect to the leader at %s: %w", addr, err)
	}
	return cl, nil
}

type probeAnswer struct {
	what string
	err  error
}

// probeStep is the step the probe of cycle asks about: fresh each time, so
// that an answer could only come from a new, durable decision.
func probeStep(cycle int) int64 { return int64(cycle) }

func probeName(cycle, i int) string { return fmt.Sprintf("fenced-%d-%d", cycle, i) }

// send starts the probe writes on cl (a paused coordinator) and returns
// their answers; the channel is closed once all are in.
func (p *probeRun) send(ctx context.Context, cl *client.Client, cycle int) <-chan probeAnswer {
	out := make(chan probeAnswer, probesPerPause+1)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	done := make(chan struct{}, probesPerPause+1)
	for i := range probesPerPause {
		go func() {
			name := probeName(cycle, i)
			_, err := cl.Workers.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: probeRunID,
				Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: name})
			out <- probeAnswer{"RegisterWorker " + name, err}
			done <- struct{}{}
		}()
	}
	go func() {
		step := probeStep(cycle)
		_, err := cl.Workers.CompleteStep(ctx, &v1.CompleteStepRequest{RunId: probeRunID, WorkerId: p.workerID,
			Incarnation: p.inc, Step: step, IterationSeconds: 1})
		out <- probeAnswer{fmt.Sprintf("CompleteStep(%d)", step), err}
		done <- struct{}{}
	}()
	go func() {
		for range probesPerPause + 1 {
			<-done
		}
		cancel()
		close(out)
	}()
	return out
}

// stored reads the probe run back from the current leader and lists what
// of cycle's probes it holds: a worker registered, or the step decided.
func (p *probeRun) stored(ctx context.Context, admin *client.Client, cycle int) ([]string, error) {
	var found []string
	workers, err := admin.RunWorkers(ctx, probeRunID)
	if err != nil {
		return nil, err
	}
	for _, w := range workers {
		for i := range probesPerPause {
			if w.GetName() == probeName(cycle, i) {
				found = append(found, "worker "+w.GetName())
			}
		}
	}
	err = admin.WatchEvents(ctx, probeRunID, 0, false, func(ev *v1.RunEvent) error {
		if ev.Type == v1.RunEventType_RUN_EVENT_TYPE_DECISION && ev.Step == probeStep(cycle) {
			found = append(found, fmt.Sprintf("decision of step %d", ev.Step))
		}
		return nil
	})
	return found, err
}

func haReport(out io.Writer, s haSummary) bool {
	ok := printSummary(out, s.summary)
	fmt.Fprintf(out, "failover after SIGKILL: %s\n", fmtFailovers(s.kills))
	fmt.Fprintf(out, "failover after SIGSTOP: %s\n", fmtFailovers(s.pauses))
	fmt.Fprintf(out, "failover after freeze:  %s\n", fmtFailovers(s.freezes))
	for _, k := range []cycleKind{cycleKill, cyclePause, cycleFreeze, cycleQuorum} {
		if d := s.stalls[k]; len(d) > 0 {
			fmt.Fprintf(out, "writers resumed after %-11s %s (from the next leader's SERVING, or quorum's return)\n", string(k)+":", fmtFailovers(d))
		}
	}
	var how []string
	for r, n := range s.refusals {
		how = append(how, fmt.Sprintf("%d %s", n, r))
	}
	slices.Sort(how)
	fmt.Fprintf(out, "deposed leaders:      %d writes sent, %d acknowledged, %d stored (refused: %s); %d did not step down\n",
		s.probes, len(s.probeAcked), len(s.probeStored), strings.Join(how, ", "), s.notDeposed)
	for cause, n := range s.stepDowns {
		fmt.Fprintf(out, "leaders stepped down: %d, %s\n", n, cause)
	}
	for _, a := range s.probeAcked {
		fmt.Fprintf(out, "acknowledged by a deposed leader: %s\n", a)
	}
	for _, a := range s.probeStored {
		fmt.Fprintf(out, "stored from a deposed leader:     %s\n", a)
	}
	ok = ok && len(s.probeAcked) == 0 && len(s.probeStored) == 0 && s.notDeposed == 0
	printVerdict(out, ok)
	return ok
}

// stepDowns reads every coordinator's log for its step-downs, by cause.
func (h *haCluster) stepDowns() map[string]int {
	causes := map[string]int{}
	for _, p := range h.procs {
		for line := range strings.SplitSeq(p.Log(), "\n") {
			var l struct{ Msg, Cause string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "stepped down" {
				causes[l.Cause]++
			}
		}
	}
	return causes
}

// refusal names how a write was refused: its code, and the reason of its
// ErrorInfo detail if it has one (NOT_LEADER: by the follower gate; a
// commit the fence refused has none).
func refusal(err error) string {
	st := status.Convert(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return st.Code().String() + " " + info.GetReason()
		}
	}
	return st.Code().String()
}

// fmtFailovers is "p50 X ms, max Y ms over N".
func fmtFailovers(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	sorted := slices.Clone(d)
	slices.Sort(sorted)
	return fmt.Sprintf("p50 %d ms, max %d ms over %d", sorted[(len(sorted)-1)/2].Milliseconds(), sorted[len(sorted)-1].Milliseconds(), len(sorted))
}
