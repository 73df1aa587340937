package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/clock"
)

// peekClock is a fake clock that also tells when the engine's next timer is
// due, so that a simulation can stop at every tick and see each command at
// the instant it was issued.
type peekClock struct {
	*clock.Fake
	mu     sync.Mutex
	timers map[*peekTimer]bool
}

type peekTimer struct {
	c  *peekClock
	at time.Time
	t  clock.Timer
}

func (c *peekClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	pt := &peekTimer{c: c, at: c.Now().Add(d)}
	c.mu.Lock()
	c.timers[pt] = true
	c.mu.Unlock()
	pt.t = c.Fake.AfterFunc(d, func() {
		c.mu.Lock()
		delete(c.timers, pt)
		c.mu.Unlock()
		f()
	})
	return pt
}

func (t *peekTimer) Stop() bool {
	t.c.mu.Lock()
	delete(t.c.timers, t)
	t.c.mu.Unlock()
	return t.t.Stop()
}

// next is when the earliest armed timer is due.
func (c *peekClock) next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var at time.Time
	for t := range c.timers {
		if at.IsZero() || t.at.Before(at) {
			at = t.at
		}
	}
	return at, !at.IsZero()
}

// The simulation: many random runs, each with random but bounded step,
// checkpoint and snapshot durations. Whenever the durations at the deadline
// stay within what the run recorded (the first step takes the longest
// iteration; the deadline checkpoint and snapshot take at most C and R as
// they stood when the deadline fired), the deadline save - trainer
// checkpoint and environment snapshot - completes by B.
func TestSimulationDeadlineSaveCompletesByB(t *testing.T) {
	runs := 150
	if testing.Short() {
		runs = 30
	}
	fake := clock.NewFake(t0)
	pc := &peekClock{Fake: fake, timers: map[*peekTimer]bool{}}
	h := &harness{t: t, ctx: context.Background(), clk: fake, dir: t.TempDir(),
		opts: Options{Clock: pc, HeartbeatInterval: 24 * time.Hour}} // no lease lapses within a run
	h.open()
	t.Cleanup(h.close)

	var unused, budget time.Duration
	kinds := map[v1.DeadlineFireKind]int{}
	steps := 0
	for i := range runs {
		s := newSim(t, h, pc, fmt.Sprintf("sim-%03d", i), rand.New(rand.NewPCG(20261130, uint64(i))))
		s.run()
		unused += s.b.Sub(s.endedAt)
		budget += s.b.Sub(s.start)
		kinds[s.fireKind]++
		steps += int(s.lastStep)
	}
	t.Logf("%d runs, %d steps; fired: %d at a step, %d before the first step; walltime left unused: %.1f s on average (%.2f%% of the budget)",
		runs, steps, kinds[v1.DeadlineFireKind_DEADLINE_FIRE_KIND_STEP], kinds[v1.DeadlineFireKind_DEADLINE_FIRE_KIND_PRE_STEP],
		(unused / time.Duration(runs)).Seconds(), 100*unused.Seconds()/budget.Seconds())
	if kinds[v1.DeadlineFireKind_DEADLINE_FIRE_KIND_STEP] == 0 || kinds[v1.DeadlineFireKind_DEADLINE_FIRE_KIND_PRE_STEP] == 0 {
		t.Errorf("the simulation did not exercise both paths: %v", kinds)
	}
}

type simEvent struct {
	at  time.Time
	seq int
	fn  func()
}

type simSnap struct {
	id       string
	deadline bool
	pending  int
	maxDur   time.Duration
	outcomes []v1.SnapshotOutcome
	done     bool // completed, or superseded by the deadline snapshot
}

type sim struct {
	t   *testing.T
	h   *harness
	pc  *peekClock
	rng *rand.Rand
	id  string

	// Parameters.
	ranks, envs             []string
	maxIter, maxCkpt        time.Duration
	maxSnap                 time.Duration
	margin                  float64
	ckptPrior, snapPrior    float64
	window                  int
	ckptEvery               int
	deferred, snapshots     bool
	start, b                time.Time
	desc                    string
	iterMax, ckptMax        float64 // the oracle: what the run recorded
	ckptMeasured            bool
	saved                   []float64
	queue                   []simEvent
	seq                     int
	envCursor, trainerAfter int64
	snaps                   map[string]*simSnap
	ckptPending, stopped    bool
	fired                   bool
	cFire, rFire            float64
	rBefore                 float64 // R before this instant's events
	lastStep                int64

	// Results.
	endedAt  time.Time
	fireKind v1.DeadlineFireKind
}

func (s *sim) dur(max time.Duration, minFrac float64) time.Duration {
	if s.rng.IntN(4) == 0 {
		return max // the boundary
	}
	f := minFrac + (1-minFrac)*s.rng.Float64()
	return time.Duration(float64(max) * f).Truncate(time.Millisecond)
}

func newSim(t *testing.T, h *harness, pc *peekClock, id string, rng *rand.Rand) *sim {
	s := &sim{t: t, h: h, pc: pc, rng: rng, id: id, snaps: map[string]*simSnap{}}
	s.maxIter = time.Duration(30_000+rng.IntN(870_000)) * time.Millisecond
	s.maxCkpt = time.Duration(1_000+rng.IntN(299_000)) * time.Millisecond
	s.maxSnap = time.Duration(500+rng.IntN(199_500)) * time.Millisecond
	s.margin = float64(rng.IntN(4) * rng.IntN(30))
	s.window = 1 + rng.IntN(6)
	s.ckptEvery = 1 + rng.IntN(5)
	// Priors: what a launcher would guess; measurements replace them.
	s.ckptPrior = float64(s.maxCkpt.Milliseconds()*int64(5+rng.IntN(6))/10) / 1000
	s.snapPrior = float64(s.maxSnap.Milliseconds()*int64(5+rng.IntN(6))/10) / 1000

	spec := &v1.RunSpec{
		TrainerWorldSize:     int32(1 + rng.IntN(4)),
		Checkpointing:        &v1.CheckpointingSpec{},
		RolloutCheckpointing: &v1.RolloutCheckpointingSpec{MaxConsecutiveFailures: 1000},
		RolloutRecovery:      &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN},
		Reserve: &v1.ReserveSpec{Window: int32(s.window), MarginSeconds: s.margin,
			ExpectedCheckpointSeconds: &s.ckptPrior, ExpectedSnapshotSeconds: &s.snapPrior},
	}
	rc := spec.RolloutCheckpointing
	interval := func() { rc.SnapshotAttemptIntervalS = ptr(int32(30 + rng.IntN(1200))) }
	switch mode := rng.IntN(6); mode {
	case 0: // turn level, snapshot after each checkpoint (the default)
		s.desc = "turn"
	case 1: // and on a timer
		s.desc = "turn+interval"
		interval()
	case 2: // only at the deadline
		s.desc = "turn, deadline only"
		rc.SnapshotOnTrainerCheckpoint = ptr(false)
	case 3: // only at the deadline, deferred finalize
		s.desc = "turn, deadline only, deferred"
		rc.SnapshotOnTrainerCheckpoint = ptr(false)
		spec.Checkpointing.DeferredFinalize = true
		s.deferred = true
	case 4: // sibling level, snapshots on a timer
		s.desc = "sibling+interval"
		spec.RolloutRecovery.TargetLevel = v1.TargetLevel_TARGET_LEVEL_SIBLING
		interval()
	case 5: // sibling level, no snapshots at all
		s.desc = "sibling, no snapshots"
		spec.RolloutRecovery.TargetLevel = v1.TargetLevel_TARGET_LEVEL_SIBLING
		spec.Reserve.ExpectedSnapshotSeconds = nil
		s.snapPrior = 0
	}
	s.snapshots = rc.SnapshotAttemptIntervalS != nil || spec.RolloutRecovery.TargetLevel == v1.TargetLevel_TARGET_LEVEL_TURN

	// The budget: usually many iterations; sometimes (with snapshots) less
	// than one iteration plus the save, so the pre-step deadline fires.
	save := time.Duration((s.ckptPrior + s.snapPrior + s.margin) * float64(time.Second))
	var budget time.Duration
	if s.snapshots && rng.IntN(8) == 0 {
		budget = save + time.Duration(rng.Float64()*float64(s.maxIter))
	} else {
		budget = save + time.Duration((1+14*rng.Float64())*float64(s.maxIter))
	}
	budget = budget.Truncate(time.Second) + time.Second
	spec.Checkpointing.CheckpointMustSaveBy = fmt.Sprintf("0:0:0:%d", int64(budget/time.Second))

	s.start = h.clk.Now()
	s.b = s.start.Add(budget)
	s.desc = fmt.Sprintf("%s: %s, %d ranks, budget %v, max iteration %v, checkpoint %v (prior %g), snapshot %v (prior %g), M %g, window %d, every %d",
		id, s.desc, spec.TrainerWorldSize, budget, s.maxIter, s.maxCkpt, s.ckptPrior, s.maxSnap, s.snapPrior, s.margin, s.window, s.ckptEvery)
	h.create(id, spec)
	s.ranks = h.trainers(id, int(spec.TrainerWorldSize))
	s.envs = h.envs(id, 1+rng.IntN(3))
	return s
}

func (s *sim) fatalf(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("%s\n%s", fmt.Sprintf(format, args...), s.desc)
}

func (s *sim) at(at time.Time, fn func()) {
	s.seq++
	s.queue = append(s.queue, simEvent{at: at, seq: s.seq, fn: fn})
}

func (s *sim) now() time.Time { return s.h.clk.Now() }

func (s *sim) oracleC() float64 {
	if s.ckptMeasured {
		return s.ckptMax
	}
	return s.ckptPrior
}

func (s *sim) oracleR() float64 {
	if len(s.saved) == 0 {
		return s.snapPrior
	}
	return slices.Max(s.saved)
}

func (s *sim) run() {
	// Step 1 takes the longest iteration of the run.
	s.at(s.start.Add(s.maxIter), func() { s.step(1, s.maxIter) })
	for range 100_000 {
		run := s.h.get(s.id)
		if isTerminal(run.State) {
			s.finish(run)
			return
		}
		next, ok := s.pc.next()
		sort.Slice(s.queue, func(i, j int) bool {
			if !s.queue[i].at.Equal(s.queue[j].at) {
				return s.queue[i].at.Before(s.queue[j].at)
			}
			return s.queue[i].seq < s.queue[j].seq
		})
		if len(s.queue) > 0 && (!ok || s.queue[0].at.Before(next)) {
			next, ok = s.queue[0].at, true
		}
		if !ok {
			s.fatalf("nothing left to happen in state %v", run.State)
		}
		s.rBefore = s.oracleR()
		s.h.clk.Advance(max(0, next.Sub(s.now())))
		for len(s.queue) > 0 && !s.queue[0].at.After(s.now()) {
			ev := s.queue[0]
			s.queue = s.queue[1:]
			ev.fn()
		}
		s.scanCommands()
	}
	s.fatalf("the run never ended")
}

// step: every rank completes the step, in random order, and gets the same
// answer.
func (s *sim) step(n int64, took time.Duration) {
	if s.stopped {
		return
	}
	s.lastStep = n
	iter := took.Seconds()
	s.iterMax = max(s.iterMax, iter)
	var first *v1.Decision
	for _, i := range s.rng.Perm(len(s.ranks)) {
		d := s.h.step(s.id, s.ranks[i], n, iter)
		if first == nil {
			first = d
		} else if d.Action != first.Action || !d.DecidedAt.AsTime().Equal(first.DecidedAt.AsTime()) {
			s.fatalf("step %d: ranks disagree: %v vs %v", n, d, first)
		}
	}
	switch first.Action {
	case v1.StepAction_STEP_ACTION_CONTINUE:
		if n == 1 || n%int64(s.ckptEvery) == 0 {
			s.regularCheckpoint(n)
		}
		took := s.dur(s.maxIter, 0.3)
		s.at(s.now().Add(took), func() { s.step(n+1, took) })
	case v1.StepAction_STEP_ACTION_SAVE_AND_STOP:
		in := first.Inputs
		if in.IterationSeconds != s.iterMax || in.CheckpointSeconds != s.oracleC() || in.SaveReserveSeconds != s.oracleR() || in.MarginSeconds != s.margin {
			s.fatalf("step %d fired with inputs %v; the run recorded I %g, C %g, R %g (window %v)", n, in, s.iterMax, s.oracleC(), s.oracleR(), s.saved)
		}
		s.fired, s.stopped = true, true
		s.cFire, s.rFire = s.oracleC(), s.oracleR()
		took := s.dur(time.Duration(s.cFire*float64(time.Second)).Truncate(time.Millisecond), 0)
		s.at(s.now().Add(took), func() { s.checkpoint(n, took, true) })
	case v1.StepAction_STEP_ACTION_STOP:
		if !s.fired {
			s.fatalf("step %d: STOP before the deadline fired", n)
		}
	}
}

func (s *sim) regularCheckpoint(n int64) {
	if s.ckptPending {
		return // the previous asynchronous save is still running
	}
	s.ckptPending = true
	took := s.maxCkpt // the first checkpoint is the longest
	if n > 1 {
		took = s.dur(s.maxCkpt, 0.1)
	}
	s.at(s.now().Add(took), func() {
		s.ckptPending = false
		s.checkpoint(n, took, false)
	})
}

// checkpoint: every rank reports SAVED; the slowest took `took`.
func (s *sim) checkpoint(n int64, took time.Duration, atDeadline bool) {
	slowest := s.rng.IntN(len(s.ranks))
	for i, w := range s.ranks {
		sec := took.Seconds()
		if i != slowest {
			sec *= s.rng.Float64()
		}
		_, err := s.h.e.ReportCheckpoint(s.h.ctx, &v1.ReportCheckpointRequest{RunId: s.id, WorkerId: w, Step: n,
			Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: sec})
		if err != nil {
			if !atDeadline && errors.Is(err, ErrFailedPrecondition) && isTerminal(s.h.get(s.id).State) {
				return // a late regular save into a run that already stopped
			}
			s.fatalf("ReportCheckpoint step %d: %v", n, err)
		}
		s.ckptMeasured = true
		s.ckptMax = max(s.ckptMax, sec)
	}
	if s.deferred && !atDeadline {
		s.publish(n) // the trainers publish regular checkpoints themselves
	}
}

func (s *sim) publish(n int64) {
	_, err := s.h.e.ReportCheckpoint(s.h.ctx, &v1.ReportCheckpointRequest{RunId: s.id, WorkerId: s.ranks[0], Step: n,
		Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED})
	if err != nil && !(errors.Is(err, ErrFailedPrecondition) && isTerminal(s.h.get(s.id).State)) {
		s.fatalf("PUBLISHED step %d: %v", n, err)
	}
}

// scanCommands reacts to commands issued since the last scan, at the
// instant they were issued.
func (s *sim) scanCommands() {
	for s.scanOnce() {
	}
}

// scanOnce handles the commands visible now; the reactions may issue more.
func (s *sim) scanOnce() bool {
	s.h.settle(s.id)
	seen := false
	for _, c := range s.h.poll(s.id, s.ranks[0], s.trainerAfter) {
		s.trainerAfter, seen = c.Seq, true
		if p := c.GetPublishCheckpoint(); p != nil {
			s.publish(p.Step) // publishing is a rename: immediate
		}
	}
	for _, c := range s.h.poll(s.id, s.envs[0], s.envCursor) {
		seen = true
		s.envCursor = c.Seq
		if !c.IssuedAt.AsTime().Equal(s.now()) {
			s.fatalf("command %v seen at %v, issued at %v", c, s.now(), c.IssuedAt.AsTime())
		}
		switch {
		case c.GetSnapshot() != nil:
			s.snapshot(c.GetSnapshot().SnapshotId, false)
		case c.GetSaveAtDeadline() != nil:
			if !s.fired { // the pre-step deadline fired
				s.fired, s.stopped = true, true
				s.rFire = s.rBefore
			}
			for _, o := range s.snaps {
				o.done = true // superseded
			}
			s.snapshot(c.GetSaveAtDeadline().SnapshotId, true)
		}
	}
	return seen
}

// snapshot schedules every environment worker's report.
func (s *sim) snapshot(id string, deadline bool) {
	sn := &simSnap{id: id, deadline: deadline, pending: len(s.envs)}
	s.snaps[id] = sn
	bound := s.maxSnap
	if deadline {
		bound = time.Duration(s.rFire * float64(time.Second)).Truncate(time.Millisecond)
	}
	slowest := s.rng.IntN(len(s.envs))
	for i, w := range s.envs {
		took := s.dur(bound, 0)
		if i == slowest && deadline {
			took = s.dur(bound, 0.5)
		}
		outcome := v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED
		if !deadline {
			switch r := s.rng.IntN(50); {
			case r == 0:
				outcome = v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR
			case r < 5:
				outcome = v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED
			}
		}
		s.at(s.now().Add(took), func() { s.report(sn, w, outcome, took) })
	}
}

func (s *sim) report(sn *simSnap, w string, outcome v1.SnapshotOutcome, took time.Duration) {
	err := s.h.report(s.id, w, sn.id, outcome, took.Seconds())
	if err != nil {
		if !sn.deadline && errors.Is(err, ErrFailedPrecondition) && isTerminal(s.h.get(s.id).State) {
			return // a superseded snapshot's late report into a stopped run
		}
		s.fatalf("ReportSnapshot %s: %v", sn.id, err)
	}
	sn.pending--
	sn.maxDur = max(sn.maxDur, took)
	sn.outcomes = append(sn.outcomes, outcome)
	if sn.pending > 0 || sn.done {
		return
	}
	sn.done = true
	// The snapshot's outcome as docs/design.md defines it; only SAVED feeds R.
	if slices.Contains(sn.outcomes, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR) ||
		!slices.Contains(sn.outcomes, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED) ||
		sn.deadline && slices.Contains(sn.outcomes, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED) {
		return
	}
	s.saved = append(s.saved, sn.maxDur.Seconds())
	if len(s.saved) > s.window {
		s.saved = s.saved[len(s.saved)-s.window:]
	}
}

func (s *sim) finish(run *v1.Run) {
	s.fireKind = run.FireKind
	s.endedAt = run.EndedAt.AsTime()
	if run.State != v1.RunState_RUN_STATE_STOPPED {
		s.fatalf("ended %v (%s)", run.State, run.FailureMessage)
	}
	if s.endedAt.After(s.b) {
		s.fatalf("the deadline save ended at %v, %v after B = %v (fired %v at step %d, C %g, R %g)",
			s.endedAt, s.endedAt.Sub(s.b), s.b, run.FireKind, run.FiredAtStep, s.cFire, s.rFire)
	}
	if w := s.h.eventsOf(s.id, v1.RunEventType_RUN_EVENT_TYPE_WARNING); len(w) != 0 {
		s.fatalf("warnings: %v", w)
	}
	if run.FireKind == v1.DeadlineFireKind_DEADLINE_FIRE_KIND_STEP && run.LastPublishedStep != run.FiredAtStep {
		s.fatalf("stopped with step %d published, fired at %d", run.LastPublishedStep, run.FiredAtStep)
	}
	if s.snapshots {
		ds := s.h.lastSnapshot(s.id)
		if ds.Reason != v1.SnapshotReason_SNAPSHOT_REASON_DEADLINE || ds.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED ||
			ds.CompletedAt.AsTime().After(s.b) || ds.AnchorStep != run.FiredAtStep {
			s.fatalf("deadline snapshot %v", ds)
		}
	} else if n := len(s.h.snapshots(s.id)); n != 0 {
		s.fatalf("%d snapshots with snapshots disabled", n)
	}
}
