package grpcserver_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Open streams must not hold shutdown for the whole drain timeout: they end
// UNAVAILABLE at once, so their clients resume elsewhere or later.
func TestShutdownEndsStreamsWithUnavailable(t *testing.T) {
	ts := newTestServer(t)
	createRun(t, ts, "watched")
	watch, err := ts.runs.WatchRun(t.Context(), &v1.WatchRunRequest{RunId: "watched"})
	if err != nil {
		t.Fatalf("WatchRun: %v", err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatalf("WatchRun first event: %v", err)
	}
	reg, err := ts.workers.RegisterWorker(t.Context(), &v1.RegisterWorkerRequest{
		RunId: "watched", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-0",
	})
	if err != nil {
		t.Fatalf("RegisterWorker: %v", err)
	}
	cmds, err := ts.workers.StreamCommands(t.Context(), &v1.StreamCommandsRequest{RunId: "watched", WorkerId: reg.GetWorkerId(),
		AfterSeq: reg.GetLastCommandSeq()})
	if err != nil {
		t.Fatalf("StreamCommands: %v", err)
	}
	// health Watch is ended by the drainer, the engine's streams by the engine.
	healthWatch, err := ts.health.Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health Watch: %v", err)
	}
	if _, err := healthWatch.Recv(); err != nil {
		t.Fatalf("health Watch first status: %v", err)
	}

	shutdown(t, ts.srv)

	for name, recv := range map[string]func() error{
		"WatchRun":       func() error { _, err := watch.Recv(); return err },
		"StreamCommands": func() error { _, err := cmds.Recv(); return err },
		"health Watch":   func() error { _, err := healthWatch.Recv(); return err },
	} {
		for {
			err := recv()
			if err == nil {
				continue // sent before the shutdown (a backlog, NOT_SERVING)
			}
			if status.Code(err) != codes.Unavailable {
				t.Errorf("%s after Shutdown: %v, want UNAVAILABLE", name, err)
			}
			break
		}
	}
}

func TestReflectionListsServices(t *testing.T) {
	ts := newTestServer(t)
	stream, err := reflectionpb.NewServerReflectionClient(ts.conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatalf("ServerReflectionInfo: %v", err)
	}
	req := &reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: "*"},
	}
	if err := stream.Send(req); err != nil {
		t.Fatalf("Send: %v", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	got := map[string]bool{}
	for _, s := range resp.GetListServicesResponse().GetService() {
		got[s.GetName()] = true
	}
	for _, want := range []string{"snapcoord.v1.RunService", "snapcoord.v1.WorkerService", "grpc.health.v1.Health"} {
		if !got[want] {
			t.Errorf("reflection lists %v, missing %s", got, want)
		}
	}
	_ = stream.CloseSend()
}

func TestBadRunIDIsInvalidArgumentNamingTheField(t *testing.T) {
	ts := newTestServer(t)
	_, err := ts.runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "Bad ID!", Spec: testSpec(1)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "run_id") {
		t.Errorf("CreateRun(bad run_id) = %v, want INVALID_ARGUMENT naming run_id", err)
	}
	// Streams are validated too.
	watch, err := ts.runs.WatchRun(t.Context(), &v1.WatchRunRequest{RunId: "Bad ID!"})
	if err == nil {
		_, err = watch.Recv()
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "run_id") {
		t.Errorf("WatchRun(bad run_id) = %v, want INVALID_ARGUMENT naming run_id", err)
	}
}

func TestUnknownRunIsNotFound(t *testing.T) {
	ts := newTestServer(t)
	_, err := ts.runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "no-such-run"})
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "no-such-run") {
		t.Errorf("GetRun(unknown) = %v, want NOT_FOUND naming the run", err)
	}
}

func TestOversizedRequestIsRejected(t *testing.T) {
	ts := newTestServer(t)
	big := strings.Repeat("x", 2<<20)
	_, err := ts.runs.CancelRun(t.Context(), &v1.CancelRunRequest{RunId: "r", Reason: big})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("CancelRun(2 MiB) = %v, want RESOURCE_EXHAUSTED", err)
	}
}

// A call whose metadata passes the header list limit is refused, naming
// the limit, and the connection goes on serving.
func TestOversizedMetadataIsRejected(t *testing.T) {
	ts := newTestServer(t)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-padding", strings.Repeat("x", 40<<10))
	_, err := ts.runs.GetRun(ctx, &v1.GetRunRequest{RunId: "r"})
	if err == nil || !strings.Contains(err.Error(), "32768") {
		t.Errorf("GetRun with 40 KiB of metadata = %v, want refused at the 32768-byte limit", err)
	}
	_, err = ts.runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "r"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("GetRun after it = %v, want NOT_FOUND", err)
	}
}

// Calls that cannot see the drain must not hold shutdown for the drain
// timeout (after which every call, short writes included, is cut): an idle
// reflection stream, blocked reading its next request, and a call whose
// request never arrived, for which no interceptor has run.
func TestShutdownIsNotHeldByCallsOutsideTheDrain(t *testing.T) {
	ts := newTestServer(t)
	refl, err := reflectionpb.NewServerReflectionClient(ts.conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := refl.Recv(); err != nil {
		t.Fatalf("reflection: %v", err)
	}
	unsent, err := ts.conn.NewStream(t.Context(), &grpc.StreamDesc{ClientStreams: true}, v1.RunService_GetRun_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ts.runs.ListRuns(t.Context(), &v1.ListRunsRequest{}); err != nil { // the unsent call's headers are in
		t.Fatal(err)
	}

	began := time.Now()
	shutdown(t, ts.srv) // fails if the 10 s drain ran out
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("Shutdown took %v", took)
	}
	if err := unsent.RecvMsg(new(v1.GetRunResponse)); status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
		t.Errorf("the call whose request never came: %v, want it cut off", err)
	}
}

// A long poll must not hold shutdown for the drain timeout either.
func TestShutdownEndsLongPoll(t *testing.T) {
	ts := newTestServer(t)
	createRun(t, ts, "polled")
	reg, err := ts.workers.RegisterWorker(t.Context(), &v1.RegisterWorkerRequest{
		RunId: "polled", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-0",
	})
	if err != nil {
		t.Fatalf("RegisterWorker: %v", err)
	}
	polled := make(chan error, 1)
	go func() {
		resp, err := ts.workers.PollCommands(t.Context(), &v1.PollCommandsRequest{
			RunId: "polled", WorkerId: reg.GetWorkerId(), AfterSeq: reg.GetLastCommandSeq(), WaitSeconds: 3600,
		})
		if err == nil && len(resp.GetCommands()) > 0 {
			err = errors.New("got commands, want none")
		}
		polled <- err
	}()

	shutdown(t, ts.srv)

	// Whether the poll was cut off in flight or never got in, the client
	// is told to retry.
	if err := <-polled; err != nil && status.Code(err) != codes.Unavailable {
		t.Errorf("PollCommands during Shutdown: %v, want UNAVAILABLE or an empty answer", err)
	}
}
