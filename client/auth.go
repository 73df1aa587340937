package client

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// workerPrefix starts every WorkerService method name.
var workerPrefix = "/" + v1.WorkerService_ServiceDesc.ServiceName + "/"

// bearer adds `authorization: Bearer <token>`: the run token to
// WorkerService calls, the admin token to everything else. An interceptor
// rather than per-RPC credentials, because grpc-go refuses per-RPC
// credentials on a plaintext connection, and a loopback coordinator in
// development is plaintext.
type bearer struct{ admin, run string }

func (b bearer) token(method string) string {
	if strings.HasPrefix(method, workerPrefix) {
		return b.run
	}
	return b.admin
}

func (b bearer) attach(ctx context.Context, method string) context.Context {
	tok := b.token(method)
	if tok == "" {
		return ctx
	}
	// A caller that set its own authorization for this call keeps it.
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get("authorization")) > 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

func (b bearer) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(b.attach(ctx, method), method, req, reply, cc, opts...)
}

func (b bearer) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(b.attach(ctx, method), desc, cc, method, opts...)
}
