package grpcserver

import (
	"time"

	"google.golang.org/grpc"
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

	// The slots below are for the cross-cutting layers added outside this
	// package (auth, per-RPC logging, OpenTelemetry) so that they need no
	// change here. Interceptors listed here run, in order, outside the
	// drain, validation and recovery interceptors, as go-grpc-middleware's
	// examples/server orders them: logging first, then auth.

	// UnaryInterceptors run first for unary RPCs.
	UnaryInterceptors []grpc.UnaryServerInterceptor
	// StreamInterceptors run first for streaming RPCs.
	StreamInterceptors []grpc.StreamServerInterceptor
	// ServerOptions are appended to the server's options: a stats handler
	// (otelgrpc.NewServerHandler()) or TLS credentials.
	ServerOptions []grpc.ServerOption
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
