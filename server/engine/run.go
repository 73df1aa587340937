package engine

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/clock"
	"github.com/snapcoord/snapcoord/store"
)

// timer kinds, each with at most one armed timer per run.
const (
	timerPreStep = iota
	timerInterval
	timerSnapshot
	timerSave
	timerSaveLate
	timerMissed
	numTimers
)

// runState is one run in memory. Everything but the atomics and the notify
// channel is guarded by mu.
type runState struct {
	id string
	mu sync.Mutex

	// The stored run. Its state changes only through states.go; each of
	// its other fields is written by the part of mut named for it.
	rec *storagev1.RunRecord

	// Written by mut.steps().
	steps map[int64]*storagev1.StepRecord // the latest; see stepMut.step
	// lastAnswer is when the latest rank heard each recent step's decision,
	// in memory; see stepMut.iterationOnly.
	lastAnswer map[int64]time.Time
	// Steps numbered up to stepsOnDiskThrough may be in the store only.
	stepsOnDiskThrough int64

	// Written by mut.workers().
	workers map[string]*workerState // by worker id
	byName  map[string]*workerState

	// Written by mut.snapshots().
	snapshots map[string]*v1.Snapshot
	snapOrder []*v1.Snapshot
	reportIdx map[string]*reportIndex // by snapshot id; see reportIndex

	// Written by mut.log().
	events []*v1.RunEvent // the latest, by seq; see trimEvents
	// Events up to here are deleted from the store (--max-events-per-run).
	eventsDeletedThrough int64
	commands             []*v1.Command // the whole command log, by seq

	timers   [numTimers]clock.Timer
	timerGen [numTimers]uint64

	last *store.Pending // the latest batch submitted for this run

	// graceUntil is the end of the restart grace (Options.RestartGrace from
	// the start that loaded the run): until then no bound on reports falls
	// due. See afterGrace.
	graceUntil time.Time
	// loadedAt is when this process loaded the run from the store; zero
	// for a run it created. See reserveSeconds.
	loadedAt time.Time
	// jumpAdmissible: the run was loaded from the store and no step past
	// its last recorded one was admitted since. See stepMut.admit.
	jumpAdmissible bool

	purged bool // deleted after its retention; callers that found it first get NOT_FOUND

	// Highest sequence numbers known durable; streams deliver up to these.
	durableCmd   atomic.Int64
	durableEvent atomic.Int64
	notifyMu     sync.Mutex
	notify       chan struct{} // closed and replaced when an event becomes durable
	// cmdNotify is closed and replaced when a command becomes durable or a
	// worker registers again: all that command streams and polls wait for.
	// Apart from notify, so that the event of each of 10,000 workers
	// registering does not wake the streams of all the others.
	cmdNotify chan struct{}
}

type workerState struct {
	w     *v1.Worker
	lease time.Time // in memory: heartbeats are not fsynced
	timer clock.Timer
	// A rank's last CompleteStep, in memory: storing it would add a write to
	// every rank's every step, for a figure only the status page shows.
	lastStep   int64
	lastStepAt time.Time
}

// view is the worker as ListWorkers shows it.
func (w *workerState) view() *v1.Worker {
	v := proto.CloneOf(w.w)
	if w.lastStep > 0 {
		v.LastStep, v.LastStepAt = w.lastStep, timestamppb.New(w.lastStepAt)
	}
	return v
}

func newRunState(rec *storagev1.RunRecord) *runState {
	return &runState{
		id: rec.Run.RunId, rec: rec,
		steps: map[int64]*storagev1.StepRecord{}, lastAnswer: map[int64]time.Time{}, workers: map[string]*workerState{},
		byName: map[string]*workerState{}, snapshots: map[string]*v1.Snapshot{},
		notify: make(chan struct{}), cmdNotify: make(chan struct{}),
	}
}

func loadRun(d *store.RunData) *runState {
	r := newRunState(d.Record)
	for _, s := range d.Steps {
		r.steps[s.Step] = s
	}
	r.stepsOnDiskThrough = r.rec.Run.LastStep - stepsKept
	for _, w := range d.Workers {
		ws := &workerState{w: w}
		r.workers[w.WorkerId] = ws
		r.byName[w.Name] = ws
	}
	for _, s := range d.Snapshots {
		r.snapshots[s.SnapshotId] = s
		r.snapOrder = append(r.snapOrder, s)
	}
	sort.SliceStable(r.snapOrder, func(i, j int) bool {
		return snapshotNum(r.snapOrder[i].SnapshotId) < snapshotNum(r.snapOrder[j].SnapshotId)
	})
	r.events = d.Events
	r.commands = d.Commands
	r.durableCmd.Store(r.rec.LastCommandSeq)
	r.durableEvent.Store(r.rec.Run.LastEventSeq)
	return r
}

func (r *runState) state() v1.RunState { return r.rec.Run.State }

func (r *runState) terminal() bool { return isTerminal(r.state()) }

func (r *runState) fired() bool { return r.rec.Run.FiredAt != nil }

// changed returns the channel closed when the next event becomes durable.
func (r *runState) changed() <-chan struct{} {
	r.notifyMu.Lock()
	defer r.notifyMu.Unlock()
	return r.notify
}

// commandsChanged returns the channel closed when the next command becomes
// durable or a worker registers again.
func (r *runState) commandsChanged() <-chan struct{} {
	r.notifyMu.Lock()
	defer r.notifyMu.Unlock()
	return r.cmdNotify
}

// broadcast wakes the waiters on events, commands, or both.
func (r *runState) broadcast(w wake) {
	r.notifyMu.Lock()
	defer r.notifyMu.Unlock()
	if w.events {
		close(r.notify)
		r.notify = make(chan struct{})
	}
	if w.commands {
		close(r.cmdNotify)
		r.cmdNotify = make(chan struct{})
	}
}

// wake says whom a commit concerns.
type wake struct{ events, commands bool }

func (r *runState) stopTimers() {
	for k, t := range r.timers {
		if t != nil {
			t.Stop()
			r.timers[k] = nil
		}
		r.timerGen[k]++
	}
	for _, w := range r.workers {
		if w.timer != nil {
			w.timer.Stop()
			w.timer = nil
		}
	}
}

// mut is one mutation of one run, made under the run's lock. Its core
// (this file) collects the records to commit (flush), the observer calls
// to make once they are durable (observe) and the run's timers (arm); the
// run's state changes only through the state machine (states.go). The rest
// is split into parts, each the only writer of its share of the run:
//
//   - log (log.go): the event log and the command log, and the sequence
//     numbers of both;
//   - workers (workers.go): registrations, ranks and leases;
//   - steps (steps.go, checkpoint.go): steps, their decisions and the
//     trainers' checkpoints, and the timers of the pre-step deadline and
//     of the trainers' deadline save;
//   - snapshots (snapshot.go): snapshots, their reports and outcomes, the
//     interval and snapshot timers, and R's window;
//   - safety (safety.go): the safety save in flight;
//   - history (history.go): the history of iterations, saves and durable
//     points the policy and the status page read;
//   - missed (missed.go): whether and why the run missed its deadline.
//
// A part calls another through its accessor (m.snapshots().issueSnapshot),
// so every crossing between parts is visible at the call.
type mut struct {
	e        *Engine
	r        *runState
	now      time.Time
	b        store.Batch
	runDirty bool
	notify   wake
	after    []func(context.Context) // observer calls, made after the lock is released
}

// The parts of a mutation; see mut.
type (
	logMut      struct{ *mut }
	workerMut   struct{ *mut }
	stepMut     struct{ *mut }
	snapshotMut struct{ *mut }
	safetyMut   struct{ *mut }
	historyMut  struct{ *mut }
	missMut     struct{ *mut }
)

func (m *mut) log() logMut            { return logMut{m} }
func (m *mut) workers() workerMut     { return workerMut{m} }
func (m *mut) steps() stepMut         { return stepMut{m} }
func (m *mut) snapshots() snapshotMut { return snapshotMut{m} }
func (m *mut) safety() safetyMut      { return safetyMut{m} }
func (m *mut) history() historyMut    { return historyMut{m} }
func (m *mut) missed() missMut        { return missMut{m} }

func (m *mut) ts() *timestamppb.Timestamp { return timestamppb.New(m.now) }

func (m *mut) dirty() { m.runDirty = true }

func (m *mut) observe(f func(context.Context)) { m.after = append(m.after, f) }

// flush submits what the mutation changed, and returns its pending commit
// (nil if it changed nothing). Called with the run locked.
func (m *mut) flush() *store.Pending {
	r := m.r
	if m.runDirty {
		m.log().trimEvents()
		r.rec.Run.Deadline = m.e.deadlineView(r)
		m.b.PutRun(r.rec)
	}
	if m.b.Len() == 0 {
		return nil
	}
	p := m.e.st.Submit(&m.b)
	r.last = p
	if m.notify != (wake{}) {
		go m.e.publish(r, p, r.rec.LastCommandSeq, r.rec.Run.LastEventSeq, m.notify)
	}
	return p
}

// observed makes the mutation's observer calls. Called once the run is
// unlocked and the commit waited for, so that metrics reflect a change by the
// time its caller hears of it.
func (m *mut) observed(ctx context.Context) {
	for _, f := range m.after {
		f(ctx)
	}
}

// publish makes commands and events visible to streams once durable.
func (e *Engine) publish(r *runState, p *store.Pending, cmdSeq, eventSeq int64, w wake) {
	<-p.Done()
	if err := p.Err(); err != nil {
		e.fail(err)
		r.broadcast(wake{events: true, commands: true}) // waiters re-check, and a poll waiting for this commit finds the engine failed
		return
	}
	raise(&r.durableCmd, cmdSeq)
	raise(&r.durableEvent, eventSeq)
	r.broadcast(w)
}

func raise(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// arm (re)schedules the run's timer of the given kind; the callback runs only
// if no later arm or stop superseded it.
func (m *mut) arm(kind int, at time.Time, fn func(m *mut)) {
	r := m.r
	m.disarm(kind)
	gen := r.timerGen[kind]
	r.timers[kind] = m.e.clk.AfterFunc(at.Sub(m.now), func() {
		m.e.onTimer(r, func(m *mut) {
			if r.timerGen[kind] != gen {
				return
			}
			r.timers[kind] = nil
			fn(m)
		})
	})
}

func (m *mut) disarm(kind int) {
	r := m.r
	if r.timers[kind] != nil {
		r.timers[kind].Stop()
		r.timers[kind] = nil
	}
	r.timerGen[kind]++
}

// afterGrace is when a bound on reports (a snapshot's, the trainers' save)
// that falls due at at is enforced: at, but after a restart not before the
// restart grace ends. Ranks and workers that finished their save in time
// retry the report the outage held up; judging it missing the moment the
// coordinator is back would fail a run that saved, or time out a snapshot
// that was taken, because the coordinator had crashed.
func (m *mut) afterGrace(at time.Time) time.Time {
	if at.Before(m.r.graceUntil) {
		return m.r.graceUntil
	}
	return at
}

// view returns a copy of the run safe to hand out after the lock is released.
func (r *runState) view() *v1.Run { return proto.Clone(r.rec.Run).(*v1.Run) }
