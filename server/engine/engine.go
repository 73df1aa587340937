// Package engine is the coordinator's domain: runs, the deadline rule, the
// deadline sequence, snapshots, workers and the command log. It imports no
// gRPC package and reads time only through an injected clock.Clock.
//
// Concurrency and durability: each run has a mutex. A mutation computes its
// effect in memory under that mutex, hands the changed records to the store's
// group committer, releases the mutex, and only then waits for the commit.
// Every call, reads included, waits for the latest commit of the run it
// looked at, so nothing a client is told is ahead of the disk. Commands and
// events reach streams and polls only once durable.
package engine

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/snapcoord/snapcoord/server/clock"
	"github.com/snapcoord/snapcoord/server/deadline"
	"github.com/snapcoord/snapcoord/store"
)

// Options configure an Engine. Zero values take the documented defaults.
type Options struct {
	Clock             clock.Clock // default clock.Real{}
	Logger            *slog.Logger
	Policy            deadline.Policy // default deadline.Max{}
	HeartbeatInterval time.Duration   // default 5s
	LeaseTTL          time.Duration   // default 3 × HeartbeatInterval
	RestartGrace      time.Duration   // default LeaseTTL
	MaxPollWait       time.Duration   // default 60s
	MaxRuns           int             // default 10000
	MaxWorkersPerRun  int             // default 10000
	MaxEventsPerRun   int             // default 100000
	// FinishedRunRetention is how long a terminal run is kept after it
	// ended; then it and everything stored under it are deleted. 0 keeps
	// finished runs.
	FinishedRunRetention time.Duration
	Observer             Observer // default: observes nothing
}

func (o *Options) setDefaults() {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Policy == nil {
		o.Policy = deadline.Max{}
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = 5 * time.Second
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 3 * o.HeartbeatInterval
	}
	if o.RestartGrace <= 0 {
		o.RestartGrace = o.LeaseTTL
	}
	if o.MaxPollWait <= 0 {
		o.MaxPollWait = 60 * time.Second
	}
	if o.MaxRuns <= 0 {
		o.MaxRuns = 10000
	}
	if o.MaxWorkersPerRun <= 0 {
		o.MaxWorkersPerRun = 10000
	}
	if o.MaxEventsPerRun <= 0 {
		o.MaxEventsPerRun = 100000
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
}

// Engine coordinates every run of one coordinator.
//
// Its exported methods named after the RPCs are its whole surface. Each
// takes the RPC's request message (already checked field by field by
// protovalidate) and returns its response, so a gRPC handler is one call
// plus error mapping. Every method that changes state returns only after
// the change is durable.
type Engine struct {
	opts   Options
	clk    clock.Clock
	st     store.Store
	log    *slog.Logger
	policy deadline.Policy
	obs    Observer

	mu   sync.RWMutex
	runs map[string]*runState
	ids  []string // sorted run ids, for ListRuns

	// tokensMu guards tokens. It is taken last, after mu or a run's lock,
	// and nothing is locked while it is held: a run's token changes under
	// the run's lock (createAgain), the map with it.
	tokensMu sync.Mutex
	tokens   map[string]string // sha256(token) -> run id

	failed atomic.Pointer[error] // set once a commit failed
	// illegal is the latest state change the state machine refused: an
	// engine bug (see states.go), which the tests check for.
	illegal atomic.Pointer[error]
	closed  atomic.Bool
	// stopWaiting is closed by EndLongCalls (and Close) or the first
	// failed commit: every wait for a change ends (see await).
	stopWaiting chan struct{}
	stopOnce    sync.Once
	sweep       clock.Timer // the next purge of finished runs; guarded by mu
}

// New loads every run from st and re-arms its timers.
func New(ctx context.Context, st store.Store, opts Options) (*Engine, error) {
	opts.setDefaults()
	e := &Engine{
		opts: opts, clk: opts.Clock, st: st, log: opts.Logger, policy: opts.Policy, obs: opts.Observer,
		runs: map[string]*runState{}, tokens: map[string]string{}, stopWaiting: make(chan struct{}),
	}
	data, err := st.Load(ctx, store.Window{Steps: stepsKept, Events: eventsKept})
	if err != nil {
		return nil, err
	}
	for _, d := range data {
		r := loadRun(d)
		e.runs[r.id] = r
		e.ids = append(e.ids, r.id)
		e.setToken(nil, r.rec.GetTokenHash(), r.id)
	}
	sort.Strings(e.ids)
	for _, id := range e.ids {
		e.resume(e.runs[id])
	}
	if opts.FinishedRunRetention > 0 {
		e.purgeFinished()
	}
	return e, nil
}

// Close stops every timer and ends every stream and poll. Calls after Close
// fail with ErrUnavailable.
func (e *Engine) Close() {
	if e.closed.Swap(true) {
		return
	}
	e.EndLongCalls()
	e.mu.RLock()
	if e.sweep != nil {
		e.sweep.Stop()
	}
	runs := e.allRuns()
	e.mu.RUnlock()
	for _, r := range runs {
		r.mu.Lock()
		r.stopTimers()
		r.mu.Unlock()
	}
}

// allRuns copies the runs map's values; the caller holds mu. A run's lock
// is taken after mu is released: a run whose lock is held across a commit
// (mut.step) would otherwise hold mu too, and behind it every call of
// every run.
func (e *Engine) allRuns() []*runState {
	runs := make([]*runState, 0, len(e.runs))
	for _, r := range e.runs {
		runs = append(runs, r)
	}
	return runs
}

// EndLongCalls ends every command stream, long poll and run watch, open or
// started later, with ErrUnavailable; other calls go on. A graceful
// shutdown calls it first, since the gRPC server waits for every open call.
// The engine ends its own waits so that the gRPC layer need not wrap each
// of thousands of streams in a cancellable context for the purpose.
func (e *Engine) EndLongCalls() { e.stopWaits() }

func (e *Engine) stopWaits() { e.stopOnce.Do(func() { close(e.stopWaiting) }) }

// Healthy is nil while the engine can commit; after a failed commit it is
// the cause, and every call fails with ErrUnavailable.
func (e *Engine) Healthy() error {
	if p := e.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// RunForToken returns the run a run token belongs to.
func (e *Engine) RunForToken(token string) (string, bool) {
	h := hashToken(token)
	e.tokensMu.Lock()
	defer e.tokensMu.Unlock()
	id, ok := e.tokens[string(h)]
	return id, ok
}

// setToken replaces a run's token hash old (nil: none) by hash new (nil:
// none) in the tokens map.
func (e *Engine) setToken(old, new []byte, runID string) {
	e.tokensMu.Lock()
	defer e.tokensMu.Unlock()
	if old != nil {
		delete(e.tokens, string(old))
	}
	if new != nil {
		e.tokens[string(new)] = runID
	}
}

func (e *Engine) usable() error {
	if e.closed.Load() {
		return errorf(ErrUnavailable, "the coordinator is shutting down")
	}
	if err := e.Healthy(); err != nil {
		return unusable(err)
	}
	return nil
}

// unusable says why a coordinator whose store failed takes no more calls. A
// fenced commit (etcd) means another coordinator leads now: the clients go
// to it, and this one's term ends without a restart. Any other failed
// commit leaves the data directory in doubt until a restart reloads it.
func unusable(err error) error {
	if errors.Is(err, store.ErrFenced) {
		return errorf(ErrUnavailable, "this coordinator is no longer the leader (another one holds the store): retry on the leader")
	}
	return errorf(ErrUnavailable, "the coordinator cannot write to its data directory; it must be restarted")
}

func (e *Engine) run(id string) (*runState, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	e.mu.RLock()
	r := e.runs[id]
	e.mu.RUnlock()
	if r == nil {
		return nil, errorf(ErrNotFound, "run %q not found", id)
	}
	return r, nil
}

// mutate runs fn on the run under its lock, submits what fn changed, and
// waits until it (and everything fn saw) is durable. fn must check before it
// changes anything: an error return must leave the run untouched.
func (e *Engine) mutate(ctx context.Context, runID string, fn func(m *mut) error) error {
	r, err := e.run(runID)
	if err != nil {
		return err
	}
	return e.mutateRun(ctx, r, fn)
}

func (e *Engine) mutateRun(ctx context.Context, r *runState, fn func(m *mut) error) error {
	r.mu.Lock()
	if err := r.gone(); err != nil {
		r.mu.Unlock()
		return err
	}
	// A call whose context ended while it waited for the run (its term
	// ended, or its caller gave up) is refused before it changes anything:
	// its answer can then say that it did nothing.
	if err := ctx.Err(); err != nil {
		r.mu.Unlock()
		return err
	}
	m := &mut{e: e, r: r, now: e.clk.Now()}
	err := fn(m)
	own := m.flush()
	last := r.last
	r.mu.Unlock()
	if werr := e.settle(ctx, m, last, own); werr != nil {
		return werr
	}
	return err
}

// settle waits for the commit of a call's changes (own, nil if it made none;
// p, the run's latest commit, follows it), then reports what they did to the
// Observer, before the caller hears back. A caller that stops waiting (its
// context ended) does not stop the changes: they still become durable, and
// then they still count, or a decision or a fire that a retry finds stored
// would never be counted at all. Such a caller, and one whose commit failed
// without the store knowing whether it applied, is answered
// ReasonOutcomeUnknown (see outcome).
func (e *Engine) settle(ctx context.Context, m *mut, p, own *store.Pending) error {
	err := e.wait(ctx, p)
	if err != nil && own != nil {
		err = e.outcome(ctx, own)
	}
	switch {
	case err == nil:
		m.observed(ctx)
	case ctx.Err() != nil && len(m.after) > 0:
		go func() {
			if e.wait(context.Background(), p) == nil {
				m.observed(context.WithoutCancel(ctx))
			}
		}()
	}
	return err
}

// outcome is the answer to a call whose own changes are in p when waiting
// for the run's commits failed. A commit refused by the fence (a
// successor leads) or never attempted (the store closed) certainly did not
// apply: the gate answers NOT_LEADER. One that committed as
// the wait ended is a success. Otherwise the change may still land (the
// caller's deadline or the term's end came first: an etcd transaction
// waiting out a quorum loss is still retried; or the store gave up on a
// transaction whose answer was lost).
func (e *Engine) outcome(ctx context.Context, p *store.Pending) error {
	select {
	case <-p.Done():
	default:
		return &Error{Kind: ErrUnavailable, Reason: ReasonOutcomeUnknown,
			Msg: "the change was made but its commit was not confirmed before " + unconfirmedWhy(ctx) +
				"; it may still take effect: repeat the same call to learn the outcome"}
	}
	cerr := p.Err()
	if cerr == nil {
		return nil
	}
	e.fail(cerr) // as wait does, should the call's context have ended first
	if errors.Is(cerr, store.ErrFenced) || errors.Is(cerr, store.ErrClosed) {
		return unusable(cerr)
	}
	return &Error{Kind: ErrUnavailable, Reason: ReasonOutcomeUnknown,
		Msg: unusable(cerr).Error() + "; this call's change may or may not have been stored: repeat the same call to learn the outcome"}
}

// unconfirmedWhy says what ended the wait of a call whose commit is still
// pending.
func unconfirmedWhy(ctx context.Context) string {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, context.DeadlineExceeded):
		return "the call's deadline"
	case cause == nil, errors.Is(cause, context.Canceled):
		return "the call ended"
	default:
		return "the call ended (" + cause.Error() + ")"
	}
}

// view runs fn under the run's lock without changing anything, then waits
// for the commit of the state fn saw.
func (e *Engine) view(ctx context.Context, runID string, fn func(r *runState) error) error {
	r, err := e.run(runID)
	if err != nil {
		return err
	}
	r.mu.Lock()
	err = r.gone()
	if err == nil {
		err = fn(r)
	}
	last := r.last
	r.mu.Unlock()
	if werr := e.wait(ctx, last); werr != nil {
		return werr
	}
	return err
}

func (e *Engine) wait(ctx context.Context, p *store.Pending) error {
	if p == nil {
		return nil
	}
	if err := p.Wait(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		e.fail(err)
		return unusable(err)
	}
	return nil
}

func (e *Engine) fail(err error) {
	if e.failed.CompareAndSwap(nil, &err) {
		e.stopWaits()
		if errors.Is(err, store.ErrFenced) {
			// Routine in a group on etcd: another coordinator was elected.
			e.log.Warn("a commit was fenced: another coordinator leads now; this one takes no more changes", "err", err)
			return
		}
		e.log.Error("store commit failed; refusing further changes until restart", "err", err)
	}
}

// onTimer runs a timer callback as a mutation; nobody waits for its commit
// but the commands and events it makes are published once durable.
func (e *Engine) onTimer(r *runState, fn func(m *mut)) {
	if e.usable() != nil {
		return
	}
	err := e.mutateRun(context.Background(), r, func(m *mut) error { fn(m); return nil })
	// NOT_FOUND: the run was deleted after its retention while the
	// callback waited for its lock; nothing is left to do.
	if err != nil && !errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrNotFound) {
		e.log.Error("timer", "run_id", r.id, "err", err)
	}
}
