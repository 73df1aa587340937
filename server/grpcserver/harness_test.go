package grpcserver

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/logsink"
	"github.com/snapcoord/snapcoord/server/clock"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/store"
)

// grpc-go's own tests check for leaked goroutines; so do these: a stream or
// timer left running after Shutdown and Close is a bug.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testServer is a real coordinator on loopback: a bbolt file, the engine,
// this package's server, and clients over a real connection.
type testServer struct {
	srv     *Server
	runs    v1.RunServiceClient
	workers v1.WorkerServiceClient
	health  healthpb.HealthClient
	conn    *grpc.ClientConn
	logs    *logsink.Buffer
	// stop shuts the server, engine and store down; safe to call again.
	stop func()
}

func newTestServer(t *testing.T) *testServer {
	t.Helper()
	return startTestServer(t, t.TempDir())
}

// startTestServer serves the store in dir; a second call on the same dir,
// after stop, is a coordinator restart.
func startTestServer(t *testing.T, dir string) *testServer {
	t.Helper()
	logs := &logsink.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	db, err := store.Open(filepath.Join(dir, "snapcoord.db"), store.Options{})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	eng, err := engine.New(t.Context(), db, engine.Options{Clock: clock.Real{}, Logger: logger})
	if err != nil {
		_ = db.Close()
		t.Fatalf("engine.New: %v", err)
	}
	srv, err := New(Config{}, eng, logger)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := serveTestServer(t, srv, logs)
	stopServer := ts.stop
	ts.stop = sync.OnceFunc(func() {
		stopServer()
		eng.Close()
		if err := db.Close(); err != nil {
			t.Errorf("store Close: %v", err)
		}
	})
	t.Cleanup(ts.stop)
	return ts
}

// serveTestServer serves srv on a loopback port and dials it.
func serveTestServer(t *testing.T, srv *Server, logs *logsink.Buffer) *testServer {
	t.Helper()
	lis := listenLoopback(t)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	ts := &testServer{
		srv: srv, conn: conn, logs: logs,
		runs:    v1.NewRunServiceClient(conn),
		workers: v1.NewWorkerServiceClient(conn),
		health:  healthpb.NewHealthClient(conn),
	}
	ts.stop = sync.OnceFunc(func() {
		_ = conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	t.Cleanup(ts.stop)
	return ts
}

func testSpec(worldSize int32) *v1.RunSpec {
	return &v1.RunSpec{
		TrainerWorldSize: worldSize,
		Checkpointing:    &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:03:45:00"},
	}
}

func createRun(t *testing.T, ts *testServer, id string) *v1.CreateRunResponse {
	t.Helper()
	resp, err := ts.runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: id, Spec: testSpec(2)})
	if err != nil {
		t.Fatalf("CreateRun(%s): %v", id, err)
	}
	return resp
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	return lis
}
