package grpcserver_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/coordtest"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
	"github.com/snapcoord/snapcoord/server/grpcserver"
)

// grpc-go's own tests check for leaked goroutines; so do these: a stream or
// timer left running after Shutdown and Close is a bug.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testServer is the assembled coordinator on loopback (a bbolt file, the
// engine, this package's server behind the production interceptor chain)
// and clients over a real connection. Its WorkerService calls carry the
// token of the run createRun last created.
type testServer struct {
	*coordtest.Instance
	srv     *grpcserver.Server
	runs    v1.RunServiceClient
	workers v1.WorkerServiceClient
	health  healthpb.HealthClient
	conn    *grpc.ClientConn
	logs    *logsink.Buffer

	mu       sync.Mutex
	runToken string
}

func newTestServer(t testing.TB) *testServer {
	t.Helper()
	return startTestServer(t, t.TempDir())
}

// startTestServer serves the store in dir; a second call on the same dir,
// after Stop, is a coordinator restart.
func startTestServer(t testing.TB, dir string) *testServer {
	t.Helper()
	ts := &testServer{logs: &logsink.Buffer{}}
	cfg := coordtest.Config(dir)
	cfg.Logger = slog.New(slog.NewTextHandler(ts.logs, nil))
	ts.Instance = coordtest.Start(t, cfg)
	ts.srv = ts.Server()
	conn, err := grpc.NewClient(ts.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(ts.bearerUnary), grpc.WithChainStreamInterceptor(ts.bearerStream))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	// Registered after Start's cleanup, so it runs first: clients go, then
	// the coordinator.
	t.Cleanup(func() { _ = conn.Close() })
	ts.conn = conn
	ts.runs, ts.workers, ts.health = v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn), healthpb.NewHealthClient(conn)
	return ts
}

// withToken adds the run token to WorkerService calls (RunService refuses
// run tokens).
func (ts *testServer) withToken(ctx context.Context, method string) context.Context {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.runToken == "" || !strings.HasPrefix(method, "/"+v1.WorkerService_ServiceDesc.ServiceName+"/") {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+ts.runToken)
}

func (ts *testServer) bearerUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(ts.withToken(ctx, method), method, req, reply, cc, opts...)
}

func (ts *testServer) bearerStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(ts.withToken(ctx, method), desc, cc, method, opts...)
}

func testSpec(worldSize int32) *v1.RunSpec {
	return spectest.Checkpointed(worldSize, "00:03:45:00")
}

// createRun creates run id; later WorkerService calls carry its token.
func createRun(t *testing.T, ts *testServer, id string) *v1.CreateRunResponse {
	t.Helper()
	resp, err := ts.runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: id, Spec: testSpec(2)})
	if err != nil {
		t.Fatalf("CreateRun(%s): %v", id, err)
	}
	ts.mu.Lock()
	ts.runToken = resp.GetRunToken()
	ts.mu.Unlock()
	return resp
}

func shutdown(t *testing.T, srv *grpcserver.Server) { grpcserver.ShutdownWithin(t, srv) }
