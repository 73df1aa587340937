package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// floorServerCmd is the hidden subcommand that serves the no-op floor: the
// same two services as snapcoord, answered at once from memory, with a
// bare grpc.NewServer() (no interceptors, no engine, no store). The bench
// runs it as a child process like the coordinator, so both are measured
// across the same process boundary with the same client.
const floorServerCmd = "floor-server"

func runFloorServer(args []string) int {
	fs := flag.NewFlagSet(floorServerCmd, flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "gRPC address")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := grpc.NewServer()
	f := &floor{notify: make(chan struct{})}
	v1.RegisterWorkerServiceServer(srv, floorWorkers{f: f})
	v1.RegisterRunServiceServer(srv, floorRuns{f: f})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	if err := srv.Serve(lis); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// floor is a command log in memory: TriggerDeadline appends to it and
// wakes every stream and poll, which is all a broadcast needs.
type floor struct {
	mu     sync.Mutex
	cmds   []*v1.Command
	notify chan struct{}
}

func (f *floor) after(seq int64) ([]*v1.Command, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if int(seq) < len(f.cmds) {
		return f.cmds[seq:], nil
	}
	return nil, f.notify
}

func (f *floor) issue(reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := &v1.Command{Seq: int64(len(f.cmds) + 1), IssuedAt: timestamppb.Now()}
	if reason == warmupReason {
		c.Kind = &v1.Command_Snapshot{Snapshot: &v1.SnapshotCommand{SnapshotId: fmt.Sprintf("snap-%d", c.Seq)}}
	} else {
		c.Kind = &v1.Command_SaveAtDeadline{SaveAtDeadline: &v1.SaveAtDeadlineCommand{SnapshotId: fmt.Sprintf("snap-%d", c.Seq)}}
	}
	f.cmds = append(f.cmds, c)
	close(f.notify)
	f.notify = make(chan struct{})
}

// warmupReason asks the floor for a Snapshot rather than a SaveAtDeadline.
const warmupReason = "warmup"

type floorWorkers struct {
	v1.UnimplementedWorkerServiceServer
	f *floor
}

func (floorWorkers) RegisterWorker(_ context.Context, req *v1.RegisterWorkerRequest) (*v1.RegisterWorkerResponse, error) {
	return &v1.RegisterWorkerResponse{WorkerId: req.Name, Incarnation: 1}, nil
}

func (floorWorkers) Heartbeat(context.Context, *v1.HeartbeatRequest) (*v1.HeartbeatResponse, error) {
	return &v1.HeartbeatResponse{}, nil
}

func (floorWorkers) CompleteStep(_ context.Context, req *v1.CompleteStepRequest) (*v1.CompleteStepResponse, error) {
	return &v1.CompleteStepResponse{Step: req.Step, Action: v1.StepAction_STEP_ACTION_CONTINUE}, nil
}

func (floorWorkers) ReportCheckpoint(context.Context, *v1.ReportCheckpointRequest) (*v1.ReportCheckpointResponse, error) {
	return &v1.ReportCheckpointResponse{}, nil
}

func (floorWorkers) ReportSnapshot(context.Context, *v1.ReportSnapshotRequest) (*v1.ReportSnapshotResponse, error) {
	return &v1.ReportSnapshotResponse{}, nil
}

func (w floorWorkers) StreamCommands(req *v1.StreamCommandsRequest, stream grpc.ServerStreamingServer[v1.StreamCommandsResponse]) error {
	after := req.AfterSeq
	for {
		cmds, changed := w.f.after(after)
		for _, c := range cmds {
			if err := stream.Send(&v1.StreamCommandsResponse{Command: c}); err != nil {
				return err
			}
			after = c.Seq
		}
		if changed == nil {
			continue
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

func (w floorWorkers) PollCommands(ctx context.Context, req *v1.PollCommandsRequest) (*v1.PollCommandsResponse, error) {
	t := time.NewTimer(time.Duration(req.WaitSeconds) * time.Second)
	defer t.Stop()
	for {
		cmds, changed := w.f.after(req.AfterSeq)
		if changed == nil {
			return &v1.PollCommandsResponse{Commands: cmds}, nil
		}
		select {
		case <-changed:
		case <-t.C:
			return &v1.PollCommandsResponse{}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

type floorRuns struct {
	v1.UnimplementedRunServiceServer
	f *floor
}

func (r floorRuns) TriggerDeadline(_ context.Context, req *v1.TriggerDeadlineRequest) (*v1.TriggerDeadlineResponse, error) {
	r.f.issue(req.Reason)
	return &v1.TriggerDeadlineResponse{}, nil
}

// boltFloor writes values of size bytes into a fresh bbolt file from
// writers goroutines for the window: one Update per write, or db.Batch with
// MaxBatchSize = writers (the best setting for that many writers; see
// ENGINEERING.md). Every write is a new key.
func boltFloor(ctx context.Context, path string, writers, size int, batch bool, w window) (loopResult, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{FreelistType: bolt.FreelistMapType})
	if err != nil {
		return loopResult{}, err
	}
	defer os.Remove(path)
	defer db.Close()
	db.MaxBatchSize = writers
	bucket := []byte("floor")
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket(bucket); return err }); err != nil {
		return loopResult{}, err
	}
	val := make([]byte, size)
	write := db.Update
	if batch {
		write = db.Batch
	}
	return closedLoop(ctx, writers, w, nil, func(_ context.Context, i int, k int64) error {
		var key [12]byte
		binary.BigEndian.PutUint32(key[:4], uint32(i))
		binary.BigEndian.PutUint64(key[4:], uint64(k))
		return write(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put(key[:], val) })
	})
}
