package engine

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/runstate"
	"github.com/snapcoord/snapcoord/server/clock"
	"github.com/snapcoord/snapcoord/store"
)

// timer kinds, each with at most one armed timer per run.
const (
	timerPreStep = iota
	timerInterval
	timerSnapshot
	timerSave
	timerMissed
	numTimers
)

// runState is one run in memory. Everything but the atomics and the notify
// channel is guarded by mu.
type runState struct {
	id string
	mu sync.Mutex

	rec   *storagev1.RunRecord
	steps map[int64]*storagev1.StepRecord // the latest; see mut.step
	// Steps numbered up to stepsOnDiskThrough may be in the store only.
	stepsOnDiskThrough int64
	workers            map[string]*workerState // by worker id
	byName             map[string]*workerState
	snapshots          map[string]*v1.Snapshot
	snapOrder          []*v1.Snapshot
	reportIdx          map[string]*reportIndex // by snapshot id; see reportIndex
	events             []*v1.RunEvent          // the latest, by seq; see trimEvents
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
}

func newRunState(rec *storagev1.RunRecord) *runState {
	return &runState{
		id: rec.Run.RunId, rec: rec,
		steps: map[int64]*storagev1.StepRecord{}, workers: map[string]*workerState{},
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

// isTerminal is runstate.Terminal: the API declares which states are.
func isTerminal(s v1.RunState) bool { return runstate.Terminal(s) }

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

// mut is one mutation of one run, made under the run's lock.
type mut struct {
	e        *Engine
	r        *runState
	now      time.Time
	b        store.Batch
	runDirty bool
	notify   wake
	after    []func(context.Context) // observer calls, made after the lock is released
}

func (m *mut) ts() *timestamppb.Timestamp { return timestamppb.New(m.now) }

func (m *mut) dirty() { m.runDirty = true }

func (m *mut) observe(f func(context.Context)) { m.after = append(m.after, f) }

func (m *mut) putStep(s *storagev1.StepRecord) {
	m.r.steps[s.Step] = s
	m.b.PutStep(m.r.id, s)
}

// stepsKept is how many of a run's latest steps stay in memory. Ranks ask
// about the latest step, and report checkpoints of recent ones; a run that
// steps every second for three days has 260,000 steps, which would
// otherwise all stay in memory for the life of the process (about 600 bytes
// each, with their decisions).
const stepsKept = 64

// step returns the run's record of step; nil if it has none. A step older
// than the ones kept in memory is read from the store once every commit of
// the run is done, so the read finds the latest put of it.
func (m *mut) step(ctx context.Context, step int64) (*storagev1.StepRecord, error) {
	r := m.r
	if st, ok := r.steps[step]; ok || step > r.stepsOnDiskThrough {
		return st, nil
	}
	if err := m.e.wait(ctx, r.last); err != nil {
		return nil, err
	}
	st, err := m.e.st.Step(r.id, step)
	if err != nil {
		return nil, fmt.Errorf("run %q: %w", r.id, err)
	}
	if st != nil {
		r.steps[step] = st
	}
	return st, nil
}

// trimSteps drops the steps older than the latest stepsKept from memory,
// once twice that many are held; their records stay in the store. The
// step the deadline fired at stays: its save is what the run waits for.
func (m *mut) trimSteps() {
	r := m.r
	if len(r.steps) <= 2*stepsKept {
		return
	}
	through := r.rec.Run.LastStep - stepsKept
	for s := range r.steps {
		if s <= through && s != r.rec.Run.FiredAtStep {
			delete(r.steps, s)
		}
	}
	r.stepsOnDiskThrough = max(r.stepsOnDiskThrough, through)
}

func (m *mut) putWorker(w *workerState) { m.b.PutWorker(m.r.id, w.w) }

func (m *mut) putSnapshot(s *v1.Snapshot) { m.b.PutSnapshot(m.r.id, s) }

// event appends a run event.
func (m *mut) event(ev *v1.RunEvent) {
	run := m.r.rec.Run
	run.LastEventSeq++
	ev.Seq = run.LastEventSeq
	ev.At = m.ts()
	m.r.events = append(m.r.events, ev)
	m.b.PutEvent(m.r.id, ev)
	m.dirty()
	m.notify.events = true
}

// command appends to the command log, and records that it did.
func (m *mut) command(audience v1.WorkerRole, c *v1.Command) *v1.Command {
	m.r.rec.LastCommandSeq++
	c.Seq = m.r.rec.LastCommandSeq
	c.IssuedAt = m.ts()
	c.Audience = audience
	m.r.commands = append(m.r.commands, c)
	m.b.PutCommand(m.r.id, c)
	m.notify.commands = true
	kind := commandKind(c)
	m.event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_COMMAND_ISSUED, CommandSeq: c.Seq,
		Message: "command " + kind + " issued to " + audienceName(audience)})
	m.observe(func(ctx context.Context) { m.e.obs.CommandIssued(ctx, kind) })
	return c
}

// flush submits what the mutation changed. Called with the run locked.
func (m *mut) flush() {
	r := m.r
	if m.runDirty {
		m.trimEvents()
		r.rec.Run.Deadline = m.e.deadlineView(r)
		m.b.PutRun(r.rec)
	}
	if m.b.Len() > 0 {
		p := m.e.st.Submit(&m.b)
		r.last = p
		if m.notify != (wake{}) {
			go m.e.publish(r, p, r.rec.LastCommandSeq, r.rec.Run.LastEventSeq, m.notify)
		}
	}
}

// observed makes the mutation's observer calls. Called once the run is
// unlocked and the commit waited for, so that metrics reflect a change by the
// time its caller hears of it.
func (m *mut) observed(ctx context.Context) {
	for _, f := range m.after {
		f(ctx)
	}
}

// eventsKept is how many of a run's latest events stay in memory, for
// watchers following the run; older ones, up to --max-events-per-run, are
// read from the store by a watcher that asks for them. With a decision event
// per step, a long run would otherwise hold 100,000 of them (about 90 MB).
const eventsKept = 256

// trimEvents deletes the events beyond --max-events-per-run from the store,
// and drops the ones older than the latest eventsKept from memory once
// twice that many are held.
func (m *mut) trimEvents() {
	r := m.r
	through := r.rec.Run.LastEventSeq - int64(m.e.opts.MaxEventsPerRun)
	if through > r.eventsDeletedThrough {
		m.b.DeleteEventsThrough(r.id, through)
		r.eventsDeletedThrough = through
	}
	n := len(r.events)
	if n == 0 || (n <= 2*eventsKept && r.events[0].Seq > through) {
		return
	}
	from := max(through, r.rec.Run.LastEventSeq-eventsKept)
	i := sort.Search(n, func(i int) bool { return r.events[i].Seq > from })
	r.events = append([]*v1.RunEvent(nil), r.events[i:]...)
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

// view returns a copy of the run safe to hand out after the lock is released.
func (r *runState) view() *v1.Run { return proto.Clone(r.rec.Run).(*v1.Run) }

func commandKind(c *v1.Command) string {
	switch c.Kind.(type) {
	case *v1.Command_SaveAtDeadline:
		return "save_at_deadline"
	case *v1.Command_Snapshot:
		return "snapshot"
	case *v1.Command_PublishCheckpoint:
		return "publish_checkpoint"
	case *v1.Command_Stop:
		return "stop"
	}
	return "unknown"
}

func audienceName(r v1.WorkerRole) string {
	switch r {
	case v1.WorkerRole_WORKER_ROLE_TRAINER:
		return "trainers"
	case v1.WorkerRole_WORKER_ROLE_ENVIRONMENT:
		return "environment workers"
	}
	return "all workers"
}
