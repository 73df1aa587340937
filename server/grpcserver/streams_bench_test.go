package grpcserver_test

import (
	"fmt"
	"runtime"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// BenchmarkParkedCommandStreams opens b.N command streams, 100 to a
// connection as workers hosted by one process share one, through the
// production interceptor chain, and proves each open with a snapshot it
// receives; then it reports what the open streams keep: retained-B/stream
// is the live heap after a full collection, and goroutines/stream the
// goroutines, both per stream and for both ends: client and server share
// this process, and the client's share does not move with the server's
// code (grpc-go's client keeps a goroutine per stream watching its
// context, so 2 is the server's one handler goroutine and no more).
// Run with a fixed count, e.g. -benchtime 2000x.
func BenchmarkParkedCommandStreams(b *testing.B) {
	ts := newTestServer(b)
	resp, err := ts.runs.CreateRun(b.Context(), &v1.CreateRunRequest{RunId: "parked", Spec: &v1.RunSpec{
		TrainerWorldSize: 1,
		Checkpointing:    &v1.CheckpointingSpec{CheckpointMustSaveBy: "30:00:00:00"},
		RolloutRecovery:  &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN},
	}})
	if err != nil {
		b.Fatalf("CreateRun: %v", err)
	}
	ts.mu.Lock()
	ts.runToken = resp.GetRunToken()
	ts.mu.Unlock()
	trainer, err := ts.workers.RegisterWorker(b.Context(), &v1.RegisterWorkerRequest{RunId: "parked", Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0"})
	if err != nil {
		b.Fatalf("RegisterWorker rank-0: %v", err)
	}
	clients := ts.sharedClients(b, b.N, 100)
	ids := make([]string, b.N)
	for i := range b.N {
		reg, err := clients[i].RegisterWorker(b.Context(), &v1.RegisterWorkerRequest{
			RunId: "parked", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: fmt.Sprintf("env-%d", i)})
		if err != nil {
			b.Fatalf("RegisterWorker env-%d: %v", i, err)
		}
		ids[i] = reg.GetWorkerId()
	}
	heap0, g0 := liveHeap()
	b.ResetTimer()
	streams := make([]grpc.ServerStreamingClient[v1.StreamCommandsResponse], b.N)
	for i := range b.N {
		if streams[i], err = clients[i].StreamCommands(b.Context(), &v1.StreamCommandsRequest{RunId: "parked", WorkerId: ids[i]}); err != nil {
			b.Fatalf("StreamCommands env-%d: %v", i, err)
		}
	}
	// A published checkpoint issues a snapshot to every environment worker.
	if _, err := ts.workers.ReportCheckpoint(b.Context(), &v1.ReportCheckpointRequest{RunId: "parked", WorkerId: trainer.GetWorkerId(),
		Step: 1, Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 1}); err != nil {
		b.Fatalf("ReportCheckpoint: %v", err)
	}
	for i, s := range streams {
		if m, err := s.Recv(); err != nil || m.GetCommand().GetSnapshot() == nil {
			b.Fatalf("env-%d: %v, %v; want its snapshot", i, m, err)
		}
	}
	b.StopTimer()
	heap1, g1 := liveHeap()
	b.ReportMetric(float64(heap1-heap0)/float64(b.N), "retained-B/stream")
	b.ReportMetric(float64(g1-g0)/float64(b.N), "goroutines/stream")
}

// sharedClients returns n WorkerService clients, per of them on each
// connection; the connections close at the end of the test.
func (ts *testServer) sharedClients(tb testing.TB, n, per int) []v1.WorkerServiceClient {
	out := make([]v1.WorkerServiceClient, n)
	for i := range out {
		if i%per != 0 {
			out[i] = out[i-1]
			continue
		}
		conn, err := grpc.NewClient(ts.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithChainUnaryInterceptor(ts.bearerUnary), grpc.WithChainStreamInterceptor(ts.bearerStream))
		if err != nil {
			tb.Fatalf("dial: %v", err)
		}
		tb.Cleanup(func() { _ = conn.Close() })
		out[i] = v1.NewWorkerServiceClient(conn)
	}
	return out
}

// liveHeap is the live heap after a full collection, and the goroutines.
func liveHeap() (int64, int) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc), runtime.NumGoroutine()
}
