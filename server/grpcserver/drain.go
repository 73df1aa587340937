package grpcserver

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	middleware "github.com/grpc-ecosystem/go-grpc-middleware/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// errDrained marks a context cancelled by shutdown; clients never see it.
var errDrained = errors.New("server is shutting down")

// errUnavailable tells a client whose RPC shutdown cut off to retry: its
// stream or poll resumes from the last sequence number it saw.
var errUnavailable = status.Error(codes.Unavailable, "server is shutting down; retry")

// longPolls are the unary methods that may wait for a long time (declared
// long_lived in the proto). Like streams, they would hold GracefulStop for
// the whole drain timeout.
var longPolls = apifacts.Set(apifacts.LongPoll)

// engineLongCalls are the long-lived RPCs the engine itself ends at
// shutdown (Engine.EndLongCalls): the API's long_lived streams and long
// polls. With thousands of command streams open, a cancellable context per
// stream costs about 1 KiB each.
var engineLongCalls = apifacts.Set(apifacts.LongLived)

// drainer ends long-lived RPCs when shutdown starts. GracefulStop waits for
// every open RPC, and streams (WatchRun, StreamCommands, health Watch) never
// end by themselves, so without this every shutdown would take the whole
// drain timeout and then cut the short RPCs off too. Methods in exempt end
// by other means.
type drainer struct {
	ctx    context.Context
	start  func()
	exempt map[string]bool
	calls  inFlight
}

func newDrainer() *drainer {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &drainer{ctx: ctx, start: func() { cancel(errDrained) }, calls: inFlight{idle: make(chan struct{})}}
}

// inFlight counts the calls in progress that shutdown waits for: every
// unary call and the engine's long calls, from the arrival of their
// request to the end of the RPC, after its answer went out. It is a stats
// handler, since an interceptor returns before the answer is written.
// Shutdown cuts the rest once these are done: a reflection stream (blocked
// reading its next request, it cannot see a cancelled context) and a call
// whose request never arrived. GracefulStop would wait for them until the
// drain timeout, and then cut every call, short writes included.
type inFlight struct {
	calls    atomic.Int64
	draining atomic.Bool
	idleOnce sync.Once
	idle     chan struct{}
}

type callKey struct{}

// call is one RPC as inFlight sees it.
type call struct {
	method  string
	counts  atomic.Bool // a call shutdown waits for
	counted atomic.Bool // its request arrived: in calls
}

func (f *inFlight) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, callKey{}, &call{method: info.FullMethodName})
}

func (f *inFlight) HandleRPC(ctx context.Context, st stats.RPCStats) {
	c, ok := ctx.Value(callKey{}).(*call)
	if !ok {
		return
	}
	switch st := st.(type) {
	case *stats.Begin:
		c.counts.Store(!st.IsClientStream && !st.IsServerStream || engineLongCalls[c.method])
	case *stats.InPayload:
		if c.counts.Load() && c.counted.CompareAndSwap(false, true) {
			f.calls.Add(1)
		}
	case *stats.End:
		if c.counted.Load() && f.calls.Add(-1) == 0 && f.draining.Load() {
			f.idleOnce.Do(func() { close(f.idle) })
		}
	}
}

func (f *inFlight) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (f *inFlight) HandleConn(context.Context, stats.ConnStats)                       {}

// quiet returns a channel closed once no call that shutdown waits for is
// in progress; from the first call on, the last call to end closes it.
func (f *inFlight) quiet() <-chan struct{} {
	f.draining.Store(true)
	if f.calls.Load() == 0 {
		f.idleOnce.Do(func() { close(f.idle) })
	}
	return f.idle
}

func (d *drainer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !longPolls[info.FullMethod] || d.exempt[info.FullMethod] {
		return handler(ctx, req)
	}
	ctx, release := d.bind(ctx)
	defer release()
	resp, err := handler(ctx, req)
	if err != nil && context.Cause(ctx) == errDrained {
		return nil, errUnavailable
	}
	return resp, err
}

func (d *drainer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if d.exempt[info.FullMethod] {
		return handler(srv, ss)
	}
	ctx, release := d.bind(ss.Context())
	defer release()
	wrapped := middleware.WrapServerStream(ss)
	wrapped.WrappedContext = ctx
	err := handler(srv, wrapped)
	// Even a clean end is reported as UNAVAILABLE: for WatchRun a clean end
	// means "the run is over", which a drained stream must not claim.
	if context.Cause(ctx) == errDrained {
		return errUnavailable
	}
	return err
}

// bind derives a context that is also cancelled when draining starts.
func (d *drainer) bind(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	stop := context.AfterFunc(d.ctx, func() { cancel(errDrained) })
	return ctx, func() {
		stop()
		cancel(nil)
	}
}
