package client_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
)

// outageServer is a WorkerService whose ReportSnapshot is unavailable
// until a time (a coordinator down, or no leader elected yet): a stand-in
// for a coordinator, in a synctest bubble where a minute of outage passes
// at once.
type outageServer struct {
	v1.UnimplementedWorkerServiceServer

	mu       sync.Mutex
	until    time.Time
	attempts int
	reported []string
}

func (s *outageServer) RegisterWorker(context.Context, *v1.RegisterWorkerRequest) (*v1.RegisterWorkerResponse, error) {
	return &v1.RegisterWorkerResponse{WorkerId: "w-1", Incarnation: 1, RunState: v1.RunState_RUN_STATE_RUNNING,
		HeartbeatInterval: durationpb.New(time.Hour), LeaseTtl: durationpb.New(2 * time.Hour)}, nil
}

func (s *outageServer) StreamCommands(_ *v1.StreamCommandsRequest, ss grpc.ServerStreamingServer[v1.StreamCommandsResponse]) error {
	<-ss.Context().Done()
	return ss.Context().Err()
}

func (s *outageServer) ReportSnapshot(_ context.Context, req *v1.ReportSnapshotRequest) (*v1.ReportSnapshotResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts++
	if time.Now().Before(s.until) {
		return nil, status.Error(codes.Unavailable, "outage")
	}
	s.reported = append(s.reported, req.GetSnapshotId())
	return &v1.ReportSnapshotResponse{RunState: v1.RunState_RUN_STATE_RUNNING}, nil
}

// A snapshot report is made again until it is answered, however long the
// coordinator is away: here a minute, three times what the client's
// default retry policy (10 attempts, about 20 s) would have waited.
func TestReportSnapshotOutlastsALongOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const outage = time.Minute
		start := time.Now()
		srv := &outageServer{until: start.Add(outage)}
		lis := bufconn.Listen(1 << 20)
		gs := grpc.NewServer()
		v1.RegisterWorkerServiceServer(gs, srv)
		go func() { _ = gs.Serve(lis) }()
		defer gs.Stop()

		cl, err := client.Dial("passthrough:///outage", client.WithInsecure(), client.WithDialOptions(
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		w, err := cl.StartWorker(t.Context(), client.WorkerConfig{RunID: "r1", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-0"})
		if err != nil {
			t.Fatalf("StartWorker: %v", err)
		}
		defer func() { _ = w.Close(context.Background()) }()

		if _, err := w.ReportSnapshot(t.Context(), "snap-1", v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, time.Second, ""); err != nil {
			t.Fatalf("ReportSnapshot across a %s outage: %v", outage, err)
		}
		if took := time.Since(start); took < outage {
			t.Fatalf("answered after %s, before the outage ended", took)
		}
		srv.mu.Lock()
		reported, attempts := srv.reported, srv.attempts
		srv.until = time.Now().Add(time.Hour) // the next outage
		srv.mu.Unlock()
		if len(reported) != 1 || attempts <= int(client.DefaultRetryPolicy.MaxAttempts) {
			t.Fatalf("reported %v in %d attempts; want snap-1 once, after more than the policy's %d attempts",
				reported, attempts, client.DefaultRetryPolicy.MaxAttempts)
		}

		// The caller's context still bounds the wait.
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		_, err = w.ReportSnapshot(ctx, "snap-2", v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, time.Second, "")
		if status.Code(err) != codes.Unavailable || ctx.Err() == nil {
			t.Fatalf("ReportSnapshot in an outage longer than its context: %v; want the last UNAVAILABLE once the context ended", err)
		}
	})
}
