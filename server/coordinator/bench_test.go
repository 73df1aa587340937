package coordinator_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/coordtest"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
)

// BenchmarkCompleteStepRPC is snapbench's CompleteStep figure in one
// process, for profiles of the whole server (`-cpuprofile`,
// `-memprofile`): 8 runs × 8 ranks call CompleteStep back to back through
// the assembled coordinator (production chain, a bbolt file) over
// loopback, and, as the floor, through a bare grpc.Server answering from
// memory. Both include the client's cost; their ratio is the figure's.
func BenchmarkCompleteStepRPC(b *testing.B) {
	const runs, ranks = 8, 8
	b.Run("coordinator", func(b *testing.B) {
		c := coordtest.Start(b, coordtest.Config(b.TempDir()))
		stepRanks(b, dialBench(b, c.Addr()), runs, ranks)
	})
	b.Run("floor", func(b *testing.B) {
		stepRanks(b, dialBench(b, serveFloor(b)), runs, ranks)
	})
}

func dialBench(b *testing.B, addr string) *grpc.ClientConn {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return conn
}

// benchRank is one trainer rank: its run, its id and the context that
// carries the run token.
type benchRank struct {
	ctx         context.Context
	run, worker string
	step        int64
}

// stepRanks creates runs × ranks trainer ranks and has runs × ranks
// goroutines step them back to back for b.N calls in all.
func stepRanks(b *testing.B, conn *grpc.ClientConn, runs, ranks int) {
	rs, ws := v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn)
	var all []*benchRank
	for i := range runs {
		id := fmt.Sprintf("bench-%d", i)
		created, err := rs.CreateRun(b.Context(), &v1.CreateRunRequest{RunId: id, Spec: spectest.Checkpointed(int32(ranks), "10:00:00:00")})
		if err != nil {
			b.Fatalf("CreateRun: %v", err)
		}
		ctx := metadata.AppendToOutgoingContext(b.Context(), "authorization", "Bearer "+created.GetRunToken())
		for r := range ranks {
			w, err := ws.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: id, Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Rank: int32(r), Name: fmt.Sprintf("rank-%d", r)})
			if err != nil {
				b.Fatalf("RegisterWorker: %v", err)
			}
			all = append(all, &benchRank{ctx: ctx, run: id, worker: w.GetWorkerId()})
		}
	}
	var next atomic.Int64
	b.SetParallelism((len(all) + 1) / 2) // GOMAXPROCS 2: a goroutine per rank
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime(b)
	defer func() { b.ReportMetric(float64((cpuTime(b)-cpu).Microseconds())/float64(b.N), "cpu-µs/op") }()
	b.RunParallel(func(pb *testing.PB) {
		r := all[int(next.Add(1)-1)%len(all)]
		for pb.Next() {
			r.step++
			if _, err := ws.CompleteStep(r.ctx, &v1.CompleteStepRequest{RunId: r.run, WorkerId: r.worker, Step: r.step, IterationSeconds: 10}); err != nil {
				b.Errorf("CompleteStep: %v", err)
				return
			}
		}
	})
}

// cpuTime is the CPU this process has used (server and clients alike): a
// figure that a busy machine disturbs less than the time per call.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// floorWorkers answers CompleteStep at once; CreateRun and RegisterWorker
// are answered enough for stepRanks.
type floorWorkers struct {
	v1.UnimplementedWorkerServiceServer
	v1.UnimplementedRunServiceServer
}

func (floorWorkers) CreateRun(_ context.Context, req *v1.CreateRunRequest) (*v1.CreateRunResponse, error) {
	return &v1.CreateRunResponse{RunToken: "floor"}, nil
}

func (floorWorkers) RegisterWorker(_ context.Context, req *v1.RegisterWorkerRequest) (*v1.RegisterWorkerResponse, error) {
	return &v1.RegisterWorkerResponse{WorkerId: req.GetName()}, nil
}

func (floorWorkers) CompleteStep(_ context.Context, req *v1.CompleteStepRequest) (*v1.CompleteStepResponse, error) {
	return &v1.CompleteStepResponse{Step: req.GetStep(), Action: v1.StepAction_STEP_ACTION_CONTINUE}, nil
}

func serveFloor(b *testing.B) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	v1.RegisterWorkerServiceServer(srv, floorWorkers{})
	v1.RegisterRunServiceServer(srv, floorWorkers{})
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	return lis.Addr().String()
}
