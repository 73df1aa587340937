package grpcserver

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
)

func TestHealthServingThenNotServingAfterShutdown(t *testing.T) {
	ts := newUnitServer(t, Config{}, nil)
	for _, name := range healthServices {
		resp, err := ts.health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check(%q) = %v, %v; want SERVING", name, resp.GetStatus(), err)
		}
	}
	watch, err := ts.health.Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch first = %v, %v; want SERVING", resp.GetStatus(), err)
	}

	ShutdownWithin(t, ts.srv)

	// The listener is closed now, so ask the health service in-process.
	for _, name := range healthServices {
		resp, err := ts.srv.health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("after Shutdown, Check(%q) = %v, %v; want NOT_SERVING", name, resp.GetStatus(), err)
		}
	}
	// A watcher learns it either from the update or from the stream ending
	// UNAVAILABLE: shutdown ends every stream, and both may race.
	resp, err := watch.Recv()
	if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("Watch after Shutdown = %v, want NOT_SERVING", resp.GetStatus())
	}
	if err != nil && status.Code(err) != codes.Unavailable {
		t.Errorf("Watch after Shutdown: %v, want UNAVAILABLE", err)
	}
}

func TestShutdownIsIdempotentAndServeAfterwardReturns(t *testing.T) {
	ts := newUnitServer(t, Config{}, nil)
	ShutdownWithin(t, ts.srv)
	ShutdownWithin(t, ts.srv)
	lis := listenLoopback(t)
	if err := ts.srv.Serve(lis); err != nil {
		t.Errorf("Serve after Shutdown = %v, want nil", err)
	}
}

func TestShutdownDeadlineCutsOff(t *testing.T) {
	ts := newUnitServer(t, Config{}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := ts.srv.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown(done ctx) = %v, want context.Canceled", err)
	}
}

// panickingRuns stands in for a handler with a bug.
type panickingRuns struct {
	v1.UnimplementedRunServiceServer
}

func (panickingRuns) GetRun(context.Context, *v1.GetRunRequest) (*v1.GetRunResponse, error) {
	panic("secret detail: nil map in run r1")
}

func (panickingRuns) WatchRun(*v1.WatchRunRequest, grpc.ServerStreamingServer[v1.WatchRunResponse]) error {
	panic("secret detail: stream")
}

func TestPanicBecomesInternalAndServerSurvives(t *testing.T) {
	logs := &logsink.Buffer{}
	srv, err := newServer(Config{}, slog.New(slog.NewTextHandler(logs, nil)), func(r grpc.ServiceRegistrar) {
		v1.RegisterRunServiceServer(r, panickingRuns{})
	})
	if err != nil {
		t.Fatalf("newServer: %v", err)
	}
	ts := serveUnitServer(t, srv, logs)

	_, err = ts.runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "r1"})
	checkInternal(t, "GetRun", err)
	watch, err := ts.runs.WatchRun(t.Context(), &v1.WatchRunRequest{RunId: "r1"})
	if err == nil {
		_, err = watch.Recv()
	}
	checkInternal(t, "WatchRun", err)

	if log := logs.String(); !strings.Contains(log, "panic in RPC handler") || !strings.Contains(log, "server_internal_test.go") {
		t.Errorf("log lacks the panic and its stack:\n%s", log)
	}
	if resp, err := ts.health.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("after a panic, Check = %v, %v; want SERVING", resp.GetStatus(), err)
	}
}

func checkInternal(t *testing.T, rpc string, err error) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.Internal || st.Message() != "internal error" {
		t.Errorf("%s after a panic = %v, want INTERNAL %q", rpc, err, "internal error")
	}
}
