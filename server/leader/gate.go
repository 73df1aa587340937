// Package leader is high availability for a coordinator group on one
// store (the etcd store, store/etcdstore): the election of the leader and
// its terms (election.go, leasehold.go), and the follower gate (gate.go):
// only the coordinator that leads serves RunService and WorkerService, each
// call with the engine of the term it arrived in. A leader deposed before
// it noticed may still let calls in, but commits nothing: the store fences
// every commit by the term, and a refused one ends it.
package leader

import (
	"context"
	"errors"
	"strings"
	"sync"

	middleware "github.com/grpc-ecosystem/go-grpc-middleware/v2"
	"google.golang.org/grpc"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/server/transport"
	"github.com/snapcoord/snapcoord/store"
)

// errDeposed cancels the calls of a term that ended; clients never see it.
var errDeposed = errors.New("leadership lost")

// Gate lets RunService and WorkerService calls through while this
// coordinator leads, each to the engine of its term, and answers them
// transport.NotLeader while it follows. It also stands for the current
// engine towards authentication, telemetry and the status page.
type Gate struct {
	// health is told whether this coordinator leads, under mu, so that the
	// serving status and the gate never disagree in their order.
	health func(leading bool)

	mu     sync.Mutex
	term   *term  // nil while following
	leader string // the leader's address; "" while none is known
	ending bool   // EndLongCalls was called: the server shuts down
}

// term is one period of leadership with its engine.
type term struct {
	eng *engine.Engine
	// hold says whether the term is still held: a coordinator that was
	// paused (or cut off from etcd) past its lease may have been replaced
	// before it notices, and must then answer nothing from its memory.
	// nil: held for good (a store of its own).
	hold Hold
	ctx  context.Context // cancelled with errDeposed when the term ends
	end  context.CancelCauseFunc
	// calls are those let through in this term; StepDown waits for them.
	calls sync.WaitGroup
}

// New returns a closed gate (following, no leader known). health is told
// each change of leadership.
func New(health func(leading bool)) *Gate {
	return &Gate{health: health}
}

// Hold proves a term is still held.
type Hold interface {
	// Held reports, at once, whether the term is known to be held now.
	Held() bool
	// Confirm asks the store whether it is, waiting for its answer until
	// ctx ends; false when the term is over or no answer came.
	Confirm(ctx context.Context) bool
}

// Lead opens the gate on eng for a term this coordinator won; self is the
// address clients reach it at. hold proves the term is still held (see
// term.hold); nil for a coordinator alone on its store.
func (g *Gate) Lead(eng *engine.Engine, self string, hold Hold) {
	ctx, end := context.WithCancelCause(context.Background())
	g.mu.Lock()
	defer g.mu.Unlock()
	g.term, g.leader = &term{eng: eng, ctx: ctx, end: end, hold: hold}, self
	if g.ending {
		eng.EndLongCalls()
	}
	g.health(true)
}

// Follow records the leader's address as observed ("" when there is none).
// It is ignored while this coordinator leads.
func (g *Gate) Follow(leader string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.term == nil {
		g.leader = leader
	}
}

// StepDown ends the current term: health turns NOT_SERVING and the gate
// refuses new calls first, then the calls of the term are cancelled (they
// end UNAVAILABLE with NOT_LEADER, or OUTCOME_UNKNOWN if their change was
// still waiting on the store) and StepDown waits for them to return.
// It returns the term's engine, for the caller to close, or nil if this
// coordinator did not lead.
func (g *Gate) StepDown() *engine.Engine {
	g.mu.Lock()
	t := g.term
	if t == nil {
		g.mu.Unlock()
		return nil
	}
	g.term, g.leader = nil, ""
	g.health(false)
	g.mu.Unlock()
	t.end(errDeposed)
	t.eng.EndLongCalls()
	t.calls.Wait()
	return t.eng
}

// EndLongCalls ends the long calls of this term and of any later one: the
// server is shutting down (see grpcserver.Server.Shutdown).
func (g *Gate) EndLongCalls() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ending = true
	if g.term != nil {
		g.term.eng.EndLongCalls()
	}
}

// Leader is the leader's address: this coordinator's own while it leads,
// "" while no leader is known.
func (g *Gate) Leader() (addr string, self bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.leader, g.term != nil
}

// Current is the engine of the current term, or nil while following.
func (g *Gate) Current() *engine.Engine {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.term == nil {
		return nil
	}
	return g.term.eng
}

// For is the engine of the term a call was let in by the interceptors; it
// is for the handlers behind them (transport.Engines).
func (g *Gate) For(ctx context.Context) *engine.Engine {
	return ctx.Value(termKey{}).(*term).eng
}

type termKey struct{}

// enter admits a call into the current term, or returns the leader's
// address to send it to.
func (g *Gate) enter() (*term, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.term == nil {
		return nil, g.leader
	}
	g.term.calls.Add(1)
	return g.term, ""
}

// refused is the answer to a call whose term ended under it. A term whose
// commit was refused may not have ended yet: this coordinator does not
// name itself then, as it is the leader no more.
func (g *Gate) refused() error {
	addr, self := g.Leader()
	if self {
		addr = ""
	}
	return transport.NotLeader(addr)
}

// gated reports whether a method is one only the leader serves.
func gated(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/"+v1.RunService_ServiceDesc.ServiceName+"/") ||
		strings.HasPrefix(fullMethod, "/"+v1.WorkerService_ServiceDesc.ServiceName+"/")
}

// bind derives a call's context: it carries the term, and is cancelled
// when the term ends.
func (t *term) bind(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.WithValue(parent, termKey{}, t))
	stop := context.AfterFunc(t.ctx, func() { cancel(errDeposed) })
	return ctx, func() {
		stop()
		cancel(nil)
		t.calls.Done()
	}
}

// bindCommandStream derives the context of a command stream: it carries
// the term, and nothing cancels it. The stream reads only the engine's
// memory and waits only in the engine, and StepDown ends those waits
// (Engine.EndLongCalls, right after it ends the term), as shutdown does;
// the cancellable context of bind would be a second signal for the same
// end. Per parked stream that context costs about 0.7 KiB of heap (the
// cancelCtx, its entry in grpc's stream context, the AfterFunc on the
// term and a Done channel), and every environment worker keeps a stream.
// WatchRun keeps bind: it may read old events from the store, and a read
// of a deposed leader's store must end with the term.
func (t *term) bindCommandStream(parent context.Context) (context.Context, func()) {
	return context.WithValue(parent, termKey{}, t), t.calls.Done
}

// confirmed reports whether the term is held now: known to be, or
// confirmed by the store (see Hold), which it asks until ctx or the term
// ends: a command stream's ctx does not end with the term (see
// bindCommandStream), and StepDown waits for the calls of its term.
func (t *term) confirmed(ctx context.Context) bool {
	if t.hold == nil || t.hold.Held() {
		return true
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(t.ctx, cancel)()
	return t.hold.Confirm(ctx)
}

// over reports whether the term ended, or is ending because the store
// refused a commit of its engine (another coordinator took over; this one
// steps down within moments). A failed call of such a term is answered
// NOT_LEADER, whatever the engine said about the cancellation or refusal,
// unless its change may still commit (answered): see answer.
func (t *term) over() bool {
	return t.ctx.Err() != nil || errors.Is(t.eng.Healthy(), store.ErrFenced)
}

// UnaryServerInterceptor gates unary RunService and WorkerService calls.
func (g *Gate) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !gated(info.FullMethod) {
			return handler(ctx, req)
		}
		t, leader := g.enter()
		if t == nil {
			return nil, transport.NotLeader(leader)
		}
		ctx, done := t.bind(ctx)
		defer done()
		if !t.confirmed(ctx) {
			// This coordinator may have been replaced already.
			return nil, transport.NotLeader("")
		}
		resp, err := handler(ctx, req)
		if err != nil && t.over() {
			return nil, g.answer(err)
		}
		if !t.confirmed(ctx) {
			// An answer given after the term may have passed to another
			// coordinator could come from this one's stale memory (a
			// read, a heartbeat's lease renewal): unless the store
			// confirms the term, it is withheld, and the client asks the
			// leader.
			return nil, g.withheld(info.FullMethod, err)
		}
		return resp, err
	}
}

// readOnly are the RPCs that change nothing the coordinator keeps.
var readOnly = apifacts.Set(apifacts.ReadOnly)

// withheld answers a call whose term could not be confirmed once its
// handler was done. A change the handler made was committed through the
// fence, so it may be stored: its caller hears OUTCOME_UNKNOWN and repeats
// it at the leader. A read, or a call its handler refused (which changed
// nothing), is refused NOT_LEADER as any call of a lapsed term.
func (g *Gate) withheld(method string, err error) error {
	if err != nil || readOnly[method] {
		return g.answer(err)
	}
	return transport.OutcomeUnknown("this coordinator cannot confirm that it still leads (it was paused): its answer is withheld, and the change may be stored: repeat the call at the leader")
}

// answer is the answer to a call that failed in a term that is over: err
// itself if it says that the call's change may still commit (the term
// ended while the commit waited on the store; a fence may still refuse
// it, or it may land), since NOT_LEADER would tell the client that the
// call did nothing; NOT_LEADER otherwise, the call having changed nothing
// or been refused by the fence.
func (g *Gate) answer(err error) error {
	if transport.Reason(err) == transport.ReasonOutcomeUnknown {
		return err
	}
	return g.refused()
}

// StreamServerInterceptor gates RunService and WorkerService streams. A
// stream of a term that ended is answered NOT_LEADER even if it ended
// cleanly: the client resumes on the leader, which knows.
func (g *Gate) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !gated(info.FullMethod) {
			return handler(srv, ss)
		}
		t, leader := g.enter()
		if t == nil {
			return transport.NotLeader(leader)
		}
		var ctx context.Context
		var done func()
		if info.FullMethod == v1.WorkerService_StreamCommands_FullMethodName {
			ctx, done = t.bindCommandStream(ss.Context())
		} else {
			ctx, done = t.bind(ss.Context())
		}
		defer done()
		if !t.confirmed(ctx) {
			return transport.NotLeader("")
		}
		wrapped := middleware.WrapServerStream(ss)
		wrapped.WrappedContext = ctx
		err := handler(srv, wrapped)
		if t.over() {
			return g.refused()
		}
		return err
	}
}
