package grpcserver

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// Config tunes the gRPC server. A zero field leaves grpc-go's own default;
// the coordinator's values, and why, are in coordinator.Defaults, which is
// what `snapcoord serve` and the tests of the assembled coordinator run.
type Config struct {
	// MaxRecvMsgSize bounds one request message, in bytes.
	MaxRecvMsgSize int
	// MaxHeaderListSize bounds one call's metadata (its HTTP/2 header list,
	// uncompressed), in bytes.
	MaxHeaderListSize uint32
	// MaxConcurrentStreams bounds the RPCs open at once on one connection.
	MaxConcurrentStreams uint32

	// KeepaliveMinTime is the shortest client ping interval tolerated;
	// clients pinging more often are disconnected.
	KeepaliveMinTime time.Duration
	// RejectPingsWithoutStream disconnects clients that ping with no RPC
	// open.
	RejectPingsWithoutStream bool
	// MaxConnectionIdle closes connections idle this long (0: never).
	MaxConnectionIdle time.Duration
	// KeepaliveTime is how long a connection may be silent before the
	// server pings it, to notice dead workers.
	KeepaliveTime time.Duration
	// KeepaliveTimeout is how long the server waits for that ping's ack
	// before closing the connection.
	KeepaliveTimeout time.Duration

	// DisableReflection leaves server reflection unregistered. It is on by
	// default so that grpcurl works with no proto files; who may use it is
	// the auth interceptor's business.
	DisableReflection bool

	// The layers below are built outside this package; chain puts them in
	// their place in the one chain every call passes through. A zero
	// Layer is left out.

	// Telemetry is the stats handler that sees every call first and last
	// (otelgrpc).
	Telemetry stats.Handler
	// Outer layers run outermost, before logging: a test's interceptors
	// that count, fail or record calls. Production has none.
	Outer []Layer
	// Logging logs each call with its final status.
	Logging Layer
	// Gate lets RunService and WorkerService calls through only while
	// this coordinator leads (leader.Gate).
	Gate Layer
	// Auth authenticates the caller (auth.Authenticator).
	Auth Layer
	// ServerOptions are appended to the server's options: TLS credentials.
	ServerOptions []grpc.ServerOption
}

// Layer is one cross-cutting layer, for unary and streaming calls alike.
type Layer struct {
	Unary  grpc.UnaryServerInterceptor
	Stream grpc.StreamServerInterceptor
}

// sizeOptions are the size limits that are set; grpc-go reads a zero
// limit as "nothing fits", not as its default.
func (c Config) sizeOptions() []grpc.ServerOption {
	var opts []grpc.ServerOption
	if c.MaxRecvMsgSize > 0 {
		opts = append(opts, grpc.MaxRecvMsgSize(c.MaxRecvMsgSize))
	}
	if c.MaxHeaderListSize > 0 {
		opts = append(opts, grpc.MaxHeaderListSize(c.MaxHeaderListSize))
	}
	if c.MaxConcurrentStreams > 0 {
		opts = append(opts, grpc.MaxConcurrentStreams(c.MaxConcurrentStreams))
	}
	return opts
}
