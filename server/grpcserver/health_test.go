package grpcserver

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
)

// healthServices are the names health reports on.
var healthServices = append([]string{""}, leaderServices...)

func checkAll(t *testing.T, ts *unitServer, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	for _, name := range healthServices {
		resp, err := ts.health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != want {
			t.Errorf("Check(%q) = %v, %v; want %v", name, resp.GetStatus(), err, want)
		}
	}
}

// A follower of a coordinator group is a healthy process, so "" stays
// SERVING, but load balancers must send RunService and WorkerService
// calls to the leader: those two say NOT_SERVING until it leads again.
func TestHealthOfServicesFollowsLeadership(t *testing.T) {
	ts := newUnitServer(t, Config{}, nil)
	ts.srv.SetLeading(false)
	check := func(name string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		resp, err := ts.health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != want {
			t.Errorf("following: Check(%q) = %v, %v; want %v", name, resp.GetStatus(), err, want)
		}
	}
	check("", healthpb.HealthCheckResponse_SERVING)
	for _, name := range leaderServices {
		check(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	ts.srv.SetLeading(true)
	checkAll(t, ts, healthpb.HealthCheckResponse_SERVING)
	// Unhealthy wins over leading.
	ts.srv.MarkUnhealthy(errors.New("disk full"))
	ts.srv.SetLeading(true)
	checkAll(t, ts, healthpb.HealthCheckResponse_NOT_SERVING)
}

// A coordinator whose store cannot commit says so to its probes, and for
// good: only a restart helps.
func TestMarkUnhealthyReportsNotServing(t *testing.T) {
	ts := newUnitServer(t, Config{}, nil)
	checkAll(t, ts, healthpb.HealthCheckResponse_SERVING)
	ts.srv.MarkUnhealthy(errors.New("disk full"))
	ts.srv.MarkUnhealthy(errors.New("again")) // idempotent
	checkAll(t, ts, healthpb.HealthCheckResponse_NOT_SERVING)
	if n := countLines(ts.logs.String(), "reporting NOT_SERVING"); n != 1 {
		t.Errorf("%d NOT_SERVING log lines, want 1:\n%s", n, ts.logs)
	}
}

// Marked before Serve (the store failed while starting), Serve must not
// flip it back to SERVING.
func TestMarkUnhealthyBeforeServeSticks(t *testing.T) {
	logs := &logsink.Buffer{}
	srv, err := newServer(Config{}, slog.New(slog.NewTextHandler(logs, nil)), func(r grpc.ServiceRegistrar) {
		v1.RegisterRunServiceServer(r, v1.UnimplementedRunServiceServer{})
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.MarkUnhealthy(errors.New("disk full"))
	ts := serveUnitServer(t, srv, logs)
	checkAll(t, ts, healthpb.HealthCheckResponse_NOT_SERVING)
}

func TestReflectionCanBeDisabled(t *testing.T) {
	ts := newUnitServer(t, Config{DisableReflection: true}, nil)
	stream, err := reflectionpb.NewServerReflectionClient(ts.conn).ServerReflectionInfo(t.Context())
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("reflection with DisableReflection: %v, want UNIMPLEMENTED", err)
	}
}

func countLines(s, sub string) int {
	n := 0
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}
