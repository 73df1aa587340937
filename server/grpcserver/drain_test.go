package grpcserver

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
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

// slowRuns answers GetRun with a big run once released.
type slowRuns struct {
	v1.UnimplementedRunServiceServer
	entered, release chan struct{}
}

func (s slowRuns) GetRun(context.Context, *v1.GetRunRequest) (*v1.GetRunResponse, error) {
	close(s.entered)
	<-s.release
	return &v1.GetRunResponse{Run: &v1.Run{RunId: strings.Repeat("x", 1<<20)}}, nil
}

// A call that answers while shutdown waits gets its whole answer: shutdown
// must not cut the connection while the answer is still being written.
func TestShutdownKeepsAnAnswerBeingWritten(t *testing.T) {
	for range 3 {
		logs := &logsink.Buffer{}
		h := slowRuns{entered: make(chan struct{}), release: make(chan struct{})}
		srv, err := newServer(Config{}, slog.New(slog.NewTextHandler(logs, nil)), func(r grpc.ServiceRegistrar) {
			v1.RegisterRunServiceServer(r, h)
		})
		if err != nil {
			t.Fatal(err)
		}
		ts := serveUnitServer(t, srv, logs)
		answered := make(chan error, 1)
		go func() {
			_, err := ts.runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "r1"})
			answered <- err
		}()
		<-h.entered
		stopped := make(chan error, 1)
		go func() { stopped <- srv.Shutdown(t.Context()) }()
		for !srv.drain.calls.draining.Load() { // Shutdown waits for the call
			runtime.Gosched()
		}
		close(h.release)
		if err := <-answered; err != nil {
			t.Fatalf("the answered GetRun was cut by Shutdown: %v", err)
		}
		if err := <-stopped; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		ts.stop()
	}
}
