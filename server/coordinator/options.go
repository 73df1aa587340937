package coordinator

import (
	"google.golang.org/grpc"

	"github.com/snapcoord/snapcoord/server/clock"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/server/grpcserver"
)

// An Option adds to the assembly what a test needs and `snapcoord serve`
// never sets: a fake clock, shorter engine waits, an interceptor that
// counts or fails calls. It adds to the production parts; it never
// replaces one, so tests run the production chain.
type Option func(*extras)

type extras struct {
	engine []func(*engine.Options)
	outer  []grpcserver.Layer
	server []grpc.ServerOption
}

// WithClock runs every engine on clk (server/clock's fake).
func WithClock(clk clock.Clock) Option {
	return WithEngine(func(o *engine.Options) { o.Clock = clk })
}

// WithEngine edits the options of every engine before it is built (with
// etcd, one per term led), after the production values are set: e.g.
// a shorter MaxPollWait or RestartGrace.
func WithEngine(edit func(*engine.Options)) Option {
	return func(x *extras) { x.engine = append(x.engine, edit) }
}

// WithOuterLayer runs l outermost, before the production chain (see
// grpcserver.Config.Outer).
func WithOuterLayer(l grpcserver.Layer) Option {
	return func(x *extras) { x.outer = append(x.outer, l) }
}

// WithServerOptions adds to the gRPC server's options, e.g. TLS
// credentials built in memory.
func WithServerOptions(opts ...grpc.ServerOption) Option {
	return func(x *extras) { x.server = append(x.server, opts...) }
}
