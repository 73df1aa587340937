package grpcserver

import (
	"context"
	"runtime/debug"

	"google.golang.org/grpc"

	"github.com/snapcoord/snapcoord/server/transport"
)

// recoverPanic keeps one bad request from taking the coordinator (and every
// run it coordinates) down. The stack goes to the log, never to the client.
func (s *Server) recoverPanic(ctx context.Context, p any) error {
	method, _ := grpc.Method(ctx)
	s.log.ErrorContext(ctx, "panic in RPC handler", "method", method, "panic", p, "stack", string(debug.Stack()))
	return transport.ErrInternal
}
