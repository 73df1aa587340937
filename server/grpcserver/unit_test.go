package grpcserver

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
)

// The tests in this package (package grpcserver) are unit tests of the
// server's own parts (drain, health, recovery, reflection switch) around a
// stand-in service. Tests of the coordinator as built, on the production
// interceptor chain, are in package grpcserver_test (harness_test.go).

// unitServer is a Server over stand-in services on loopback, with clients.
type unitServer struct {
	srv    *Server
	runs   v1.RunServiceClient
	health healthpb.HealthClient
	conn   *grpc.ClientConn
	logs   *logsink.Buffer
	// stop shuts the server down; safe to call again.
	stop func()
}

// newUnitServer serves register's services (an unimplemented RunService
// when nil) with cfg.
func newUnitServer(t *testing.T, cfg Config, register func(grpc.ServiceRegistrar)) *unitServer {
	t.Helper()
	if register == nil {
		register = func(r grpc.ServiceRegistrar) { v1.RegisterRunServiceServer(r, v1.UnimplementedRunServiceServer{}) }
	}
	logs := &logsink.Buffer{}
	srv, err := newServer(cfg, slog.New(slog.NewTextHandler(logs, nil)), register)
	if err != nil {
		t.Fatalf("newServer: %v", err)
	}
	return serveUnitServer(t, srv, logs)
}

// serveUnitServer serves srv on a loopback port and dials it.
func serveUnitServer(t *testing.T, srv *Server, logs *logsink.Buffer) *unitServer {
	t.Helper()
	lis := listenLoopback(t)
	srv.SetLeading(true) // a lone coordinator leads
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	us := &unitServer{
		srv: srv, conn: conn, logs: logs,
		runs:   v1.NewRunServiceClient(conn),
		health: healthpb.NewHealthClient(conn),
	}
	us.stop = sync.OnceFunc(func() {
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
	t.Cleanup(us.stop)
	return us
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	return lis
}

// ShutdownWithin drains srv within 10 s, failing t otherwise; the
// coordinator tests (package grpcserver_test) use it too.
func ShutdownWithin(t *testing.T, srv *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v (streams held the drain?)", err)
	}
}
