package grpcserver

import (
	"context"
	"testing"

	"google.golang.org/grpc/stats"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Shutdown waits for a call from its request's arrival to the end of the
// RPC (stats.End comes after the answer went out, unlike an interceptor's
// return), and for no call that cannot see the drain: one whose request
// never came, or a stream other than the engine's (reflection).
func TestInFlightCountsCallsUntilTheirAnswerIsOut(t *testing.T) {
	f := &inFlight{idle: make(chan struct{})}
	rpc := func(method string, stream bool) context.Context {
		ctx := f.TagRPC(context.Background(), &stats.RPCTagInfo{FullMethodName: method})
		f.HandleRPC(ctx, &stats.Begin{IsClientStream: stream, IsServerStream: stream})
		return ctx
	}
	unary := rpc(v1.RunService_GetRun_FullMethodName, false)
	f.HandleRPC(unary, &stats.InPayload{})
	engineStream := rpc(v1.WorkerService_StreamCommands_FullMethodName, true)
	f.HandleRPC(engineStream, &stats.InPayload{})
	unsent := rpc(v1.RunService_CancelRun_FullMethodName, false) // its request never comes
	reflection := rpc("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", true)
	f.HandleRPC(reflection, &stats.InPayload{})

	quiet := f.quiet()
	for _, end := range []context.Context{unary, engineStream} {
		select {
		case <-quiet:
			t.Fatal("quiet while a call that reached the server is still answering")
		default:
		}
		f.HandleRPC(end, &stats.End{})
	}
	select {
	case <-quiet:
	default:
		t.Fatal("not quiet once the counted calls ended: the unsent call or the reflection stream holds shutdown")
	}
	f.HandleRPC(unsent, &stats.End{}) // ends uncounted: no effect
	if n := f.calls.Load(); n != 0 {
		t.Fatalf("%d calls counted after they all ended", n)
	}
}
