package grpcserver

import (
	"time"

	"google.golang.org/grpc"
)

// Config tunes the gRPC server. The zero value is usable: every zero field
// takes the default documented on it.
type Config struct {
	// MaxRecvMsgSize bounds one request message, in bytes. Default 1 MiB:
	// the largest legitimate request (a CreateRun) is a few hundred bytes.
	MaxRecvMsgSize int
	// MaxHeaderListSize bounds one call's metadata (its HTTP/2 header list,
	// uncompressed), in bytes. Default 32 KiB: a call carries a token and
	// trace headers. grpc-go's own default, 16 MiB, let a client with no
	// token hold 16 MiB of decoded metadata per call (HPACK makes it a few
	// KiB on the wire) by never sending the request: no interceptor, auth
	// included, runs before the message arrives.
	MaxHeaderListSize uint32
	// MaxConcurrentStreams bounds the RPCs open at once on one connection.
	// Default 1024: one sidecar holds one stream, so this is generous.
	MaxConcurrentStreams uint32

	// KeepaliveMinTime is the shortest client ping interval tolerated;
	// clients pinging more often are disconnected. Default 10s.
	KeepaliveMinTime time.Duration
	// RejectPingsWithoutStream disconnects clients that ping with no RPC
	// open. Off by default: idle workers between polls ping legitimately.
	RejectPingsWithoutStream bool
	// MaxConnectionIdle closes connections idle this long. Default 0:
	// never, since workers may be idle for hours between commands.
	MaxConnectionIdle time.Duration
	// KeepaliveTime is how long a connection may be silent before the
	// server pings it, to notice dead workers. Default 30s.
	KeepaliveTime time.Duration
	// KeepaliveTimeout is how long the server waits for that ping's ack
	// before closing the connection. Default 10s.
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

func (c Config) withDefaults() Config {
	setDefault(&c.MaxRecvMsgSize, 1<<20)
	setDefault(&c.MaxHeaderListSize, 32<<10)
	setDefault(&c.MaxConcurrentStreams, 1024)
	setDefault(&c.KeepaliveMinTime, 10*time.Second)
	setDefault(&c.KeepaliveTime, 30*time.Second)
	setDefault(&c.KeepaliveTimeout, 10*time.Second)
	return c
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}
