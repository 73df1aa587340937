package coordinator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/coordtest"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
	"github.com/snapcoord/snapcoord/server/coordinator"
)

// Shutdown stops every loop, listener and stream the coordinator started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Started, the coordinator serves SERVING with the production chain (auth
// refuses a WorkerService call without a token); shut down, it releases
// the data directory, and a new one on it has the runs of the first.
func TestStartShutdownRestart(t *testing.T) {
	cfg := coordtest.Config(t.TempDir())
	first := coordtest.Serve(t, cfg)
	conn := dial(t, first.Addr())
	if resp, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil ||
		resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING", resp.GetStatus(), err)
	}
	runs := v1.NewRunServiceClient(conn)
	if _, err := runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "kept", Spec: spectest.Checkpointed(1, "00:01:00:00")}); err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	_, err := v1.NewWorkerServiceClient(conn).Heartbeat(t.Context(), &v1.HeartbeatRequest{RunId: "kept", WorkerId: "w"})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("Heartbeat without a run token = %v, want UNAUTHENTICATED from the auth interceptor", err)
	}
	first.Stop()

	cfg.Listen = first.Addr()
	second := coordtest.Start(t, cfg)
	got, err := v1.NewRunServiceClient(dial(t, second.Addr())).GetRun(t.Context(), &v1.GetRunRequest{RunId: "kept"})
	if err != nil || got.GetRun().GetRunId() != "kept" {
		t.Errorf("GetRun after restart = %v, %v; want the run", got.GetRun(), err)
	}
}

// A second coordinator on a data directory in use fails in New, naming the
// directory, and leaves nothing running (goleak checks).
func TestNewFailsOnADirectoryInUse(t *testing.T) {
	cfg := coordtest.Config(t.TempDir())
	coordtest.Start(t, cfg)
	cfg.LockTimeout = 50 * time.Millisecond
	_, err := coordinator.New(t.Context(), cfg)
	if err == nil || !strings.Contains(err.Error(), "open store") {
		t.Fatalf("New on a locked directory = %v, want the store's lock error", err)
	}
}

// Run serves until its context ends, then drains and returns nil.
func TestRunStopsWhenTheContextEnds(t *testing.T) {
	cfg := coordtest.Config(t.TempDir())
	c, err := coordinator.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil after the context ended", err)
	}
}

// Run reports a listener it cannot open, and releases the rest.
func TestRunFailsOnABusyAddress(t *testing.T) {
	busy := coordtest.Start(t, coordtest.Config(t.TempDir()))
	cfg := coordtest.Config(t.TempDir())
	cfg.Listen = busy.Addr()
	c, err := coordinator.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Errorf("Run on a busy address = %v, want a listen error", err)
	}
	// The store was released: the directory opens again at once.
	cfg.Listen, cfg.LockTimeout = "127.0.0.1:0", 50*time.Millisecond
	coordtest.Start(t, cfg)
}

// Defaults is what `snapcoord serve` documents (its --help reads them).
func TestDefaultsAreValid(t *testing.T) {
	d := coordinator.Defaults()
	if d.LeaseTTL <= d.HeartbeatInterval {
		t.Errorf("default lease %v not longer than the heartbeat interval %v", d.LeaseTTL, d.HeartbeatInterval)
	}
	if serve, open := d.ReflectionAccess(); !serve || !open {
		t.Errorf("default reflection on %s: serve %v open %v, want open on loopback", d.Listen, serve, open)
	}
}
