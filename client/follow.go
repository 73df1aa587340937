package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// leaderPolicy is the load-balancing policy of a client given several
// addresses: every call goes to the coordinator whose health turned
// SERVING last, the newest leader.
//
// Why not round_robin over the SERVING ones: a leader frozen by SIGSTOP (a
// long GC pause, a stuck disk, a VM stall) still counts as SERVING, its
// health stream frozen rather than closed, and stays so until it runs
// again or keepalive drops its connection (15 s + 5 s). Once another
// coordinator has taken over, both look SERVING; round_robin would send
// every other call to the frozen one, where it waits out the pause. Two
// coordinators cannot both lead, so the one that turned SERVING last is
// the leader and the other a deposed one that has not said so yet.
const leaderPolicy = "snapcoord_leader"

func init() { balancer.Register(leaderBuilder{}) }

type leaderBuilder struct{}

func (leaderBuilder) Name() string { return leaderPolicy }

// Build shards the addresses into one pick_first child each, as round_robin
// does, with client-side health checking in each; leaderCC then picks.
func (leaderBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	lc := &leaderCC{ClientConn: cc, since: map[string]uint64{}}
	return &leaderBalancer{
		Balancer: endpointsharding.NewBalancer(lc, opts, balancer.Get(pickfirst.Name).Build, endpointsharding.Options{}),
		lc:       lc,
	}
}

type leaderBalancer struct {
	balancer.Balancer
	lc *leaderCC
}

func (b *leaderBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	if w, ok := s.ResolverState.Attributes.Value(leaderWatchKey{}).(*leaderWatch); ok {
		b.lc.setWatch(w)
	}
	return b.Balancer.UpdateClientConnState(balancer.ClientConnState{ResolverState: pickfirst.EnableHealthListener(s.ResolverState)})
}

// leaderCC sits between the endpoints' children and the channel: of the
// children READY (connected, health SERVING), it hands the channel the
// picker of the one that turned READY last.
type leaderCC struct {
	balancer.ClientConn

	mu      sync.Mutex
	watch   *leaderWatch
	turns   uint64            // READY transitions seen, the order of since
	since   map[string]uint64 // address -> its turn when it became READY; READY ones only
	refused uint64            // the turn of a READY one that answered NOT_LEADER
	last    balancer.State    // the children's, for a pick again after a refusal

	// update serializes UpdateState: the children's (under endpointsharding's
	// lock) and a refusal's, from a call's goroutine.
	update sync.Mutex
}

func (c *leaderCC) setWatch(w *leaderWatch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watch = w
	w.mu.Lock()
	w.refuse = c.refuse
	w.mu.Unlock()
}

// refuse passes over the coordinator of turn, which refused a call as not
// the leader while its health still said SERVING (a deposed leader that
// has not yet said so), until it turns READY anew; if it was the one
// picked, the next newest is.
func (c *leaderCC) refuse(turn uint64) {
	c.update.Lock()
	defer c.update.Unlock()
	c.mu.Lock()
	c.refused = turn
	last := c.last
	c.mu.Unlock()
	if last.Picker != nil {
		c.apply(last)
	}
}

func (c *leaderCC) UpdateState(s balancer.State) {
	c.update.Lock()
	defer c.update.Unlock()
	c.mu.Lock()
	c.last = s
	c.mu.Unlock()
	c.apply(s)
}

// apply hands the channel the leader's picker, or s's when none is READY.
func (c *leaderCC) apply(s balancer.State) {
	lead, turn, w := c.newest(endpointsharding.ChildStatesFromPicker(s.Picker))
	if lead == nil {
		c.ClientConn.UpdateState(s) // none READY: the aggregate state and its picker
		return
	}
	c.ClientConn.UpdateState(balancer.State{ConnectivityState: connectivity.Ready, Picker: leaderPicker{child: lead, turn: turn}})
	w.moveTo(turn) // after the picker is in place: a call retried now goes to the new leader
}

// newest notes which children are READY since when, and returns the picker
// of the newest (nil if none is READY) with its turn.
func (c *leaderCC) newest(children []endpointsharding.ChildState) (balancer.Picker, uint64, *leaderWatch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var lead balancer.Picker
	var leadTurn uint64
	ready := map[string]bool{}
	for _, ch := range children {
		if ch.State.ConnectivityState != connectivity.Ready || len(ch.Endpoint.Addresses) == 0 {
			continue
		}
		key := ch.Endpoint.Addresses[0].Addr
		ready[key] = true
		turn, ok := c.since[key]
		if !ok {
			c.turns++
			turn = c.turns
			c.since[key] = turn
		}
		fresh := turn != c.refused
		if lead == nil || fresh && (turn > leadTurn || leadTurn == c.refused) {
			lead, leadTurn = ch.State.Picker, turn
		}
	}
	for key := range c.since {
		if !ready[key] {
			delete(c.since, key) // when it is READY again, it is so anew
		}
	}
	return lead, leadTurn, c.watch
}

// leaderPicker picks the leader's connection, and notes in the call's
// route under which leader the call went out.
type leaderPicker struct {
	child balancer.Picker
	turn  uint64
}

func (p leaderPicker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	if r, ok := info.Ctx.Value(routeKey{}).(*route); ok {
		r.set(p.turn)
	}
	return p.child.Pick(info)
}

// leaderWatchKey carries a client's leaderWatch from Dial to its balancer,
// in the resolver state's attributes.
type leaderWatchKey struct{}

// leaderWatch tells the calls of one client when the leader changed, so
// that a call sent to a coordinator no longer leading is cut and made
// again at once, rather than waiting on a frozen coordinator.
type leaderWatch struct {
	mu    sync.Mutex
	turn  uint64        // the leader's turn; 0 before the first
	moved chan struct{} // closed, and replaced, when turn changes
	// refuse is the balancer's leaderCC.refuse, set once it is built.
	refuse func(turn uint64)
}

// refused tells the balancer that the coordinator a call went to (r)
// answered NOT_LEADER.
func (w *leaderWatch) refused(r *route) {
	if w == nil || r == nil {
		return
	}
	w.mu.Lock()
	refuse := w.refuse
	w.mu.Unlock()
	if turn := r.turn.Load(); refuse != nil && turn != 0 {
		refuse(turn)
	}
}

func newLeaderWatch() *leaderWatch { return &leaderWatch{moved: make(chan struct{})} }

func (w *leaderWatch) attributes() *attributes.Attributes {
	return attributes.New(leaderWatchKey{}, w)
}

func (w *leaderWatch) moveTo(turn uint64) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if turn != w.turn {
		w.turn = turn
		close(w.moved)
		w.moved = make(chan struct{})
	}
}

func (w *leaderWatch) current() (uint64, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.turn, w.moved
}

// routeKey keys a call's route in its context, where leaderPicker finds it.
type routeKey struct{}

// route is the leader a call (an attempt, or a stream) went out under.
type route struct {
	turn   atomic.Uint64
	picked chan struct{} // signalled at each pick
}

func (r *route) set(turn uint64) {
	r.turn.Store(turn)
	select {
	case r.picked <- struct{}{}:
	default:
	}
}

// The causes of an attempt cut short by the client, and how the caller
// hears them: UNAVAILABLE, which the retry then resolves like any other.
var (
	errLeaderMoved    = errors.New("another coordinator took over as leader while the call waited on the previous one (paused or cut off)")
	errAttemptTimeout = errors.New("no answer within the attempt timeout")
)

// leaderSettle is how long a call must have been out before a change of
// leader cuts it. A call waiting on a frozen leader has waited about the
// election TTL by the time another one serves, while one sent a moment
// before the change was most likely answered already or about to be: a
// health status that flips for a moment (a coordinator starting) must
// not cut it, since a call cut after it took effect is a repeat.
const leaderSettle = time.Second

// guard returns ctx, cut with errLeaderMoved once another coordinator
// than the one the call went out under is the leader, and the call has
// been out leaderSettle. A call not yet sent (waiting for a
// leader) is left alone: it goes to the new one. stop ends the watch.
func (w *leaderWatch) guard(ctx context.Context) (context.Context, *route, func()) {
	if w == nil {
		return ctx, nil, func() {}
	}
	r := &route{picked: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancelCause(context.WithValue(ctx, routeKey{}, r))
	began := time.Now()
	go func() {
		for {
			turn, moved := w.current()
			if sent := r.turn.Load(); sent != 0 && sent != turn {
				young := time.Until(began.Add(leaderSettle))
				if young <= 0 {
					cancel(errLeaderMoved)
					return
				}
				if !sleep(ctx, young) {
					return
				}
				continue // look again: the leader may be the same as before
			}
			select {
			case <-moved:
			case <-r.picked:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx, r, func() { cancel(nil) }
}

// cut is err as the caller hears it: UNAVAILABLE naming the cause when the
// client cut the attempt (ctx, the attempt's, ended by guard or the
// attempt timeout while parent, the caller's, still runs).
func cut(parent, ctx context.Context, err error, timeout time.Duration, readOnly bool) error {
	if err == nil || parent.Err() != nil {
		return err
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errLeaderMoved):
		return cutStatus(cause.Error(), readOnly)
	case errors.Is(cause, errAttemptTimeout):
		return cutStatus(fmt.Sprintf("the coordinator did not answer within %s (paused, overloaded or cut off): %v", timeout, status.Convert(err).Message()), readOnly)
	}
	return err
}

// cutStatus is UNAVAILABLE saying why an attempt was cut. A call that may
// change something was perhaps applied before the cut: it is of unknown
// outcome, which only a retry-safe call's repeat resolves.
func cutStatus(msg string, readOnly bool) error {
	st := status.New(codes.Unavailable, msg)
	if readOnly {
		return st.Err()
	}
	d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reasonOutcomeUnknown, Domain: errorDomain})
	if err != nil {
		return st.Err()
	}
	return d.Err()
}

// leaderMoved reports whether err is an attempt cut because another
// coordinator leads now: it is made again at once.
func leaderMoved(err error) bool {
	return status.Code(err) == codes.Unavailable && status.Convert(err).Message() == errLeaderMoved.Error()
}

// streamInterceptor re-opens nothing itself: it cuts a stream (a command
// stream, an event watch) that went out under a leader that is no longer
// one, with UNAVAILABLE, and the loops that follow streams resume at the
// new leader from their last seq. Keepalive would notice a frozen
// coordinator only after 20 s; a stream may stay idle for hours.
func (w *leaderWatch) streamInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if w == nil {
		return streamer(ctx, desc, cc, method, opts...)
	}
	gctx, _, stop := w.guard(ctx)
	s, err := streamer(gctx, desc, cc, method, opts...)
	if err != nil {
		stop()
		return nil, InWords(cut(ctx, gctx, err, 0, true)) // the API's streams change nothing
	}
	return &guardedStream{ClientStream: s, parent: ctx, ctx: gctx, stop: stop}, nil
}

type guardedStream struct {
	grpc.ClientStream
	parent, ctx context.Context
	stop        func()
}

func (s *guardedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.stop()
	}
	return InWords(cut(s.parent, s.ctx, err, 0, true))
}
