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
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// floorServerCmd is the hidden subcommand that serves the no-op floor: the
// same two services as snapcoord, answered at once from memory, with a
// bare grpc.NewServer() (no interceptors, no engine, no store; only the
// coordinator's keepalive enforcement). The bench
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
	// The coordinator's keepalive enforcement (its --keepalive-min-time
	// default): the Go client pings every 15 s, which a bare server's
	// default (5 min) answers with GOAWAY too_many_pings, cutting every
	// connection of a storm that lasts longer.
	srv := grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}))
	f := &floor{}
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

// floor keeps, per run, a command log in memory: TriggerDeadline appends to
// it and wakes every stream and poll of the run, which is all a broadcast
// needs. For the deadline storm it also keeps the least a run needs to
// make the same calls happen as on the coordinator (floorRun); a run that
// CreateRun did not make (the other phases' "floor") answers every step
// CONTINUE without taking a lock.
type floor struct {
	runs sync.Map // run id → *floorRun
}

func (f *floor) run(id string) *floorRun {
	if r, ok := f.runs.Load(id); ok {
		return r.(*floorRun)
	}
	r, _ := f.runs.LoadOrStore(id, &floorRun{notify: make(chan struct{})})
	return r.(*floorRun)
}

// floorRun is one run's command log and, once CreateRun made it, its
// deadline sequence reduced to counting: the deadline fires at the first
// step with now + I + C + R + M ≥ B (the Max rule, with the spec's priors
// for C and R), SaveAtDeadline goes out once every rank reported that step
// SAVED, and Stop once every environment worker reported the snapshot.
type floorRun struct {
	mu     sync.Mutex
	cmds   []*v1.Command
	notify chan struct{}

	created  bool
	world    int
	reserve  time.Duration // C + R + M: the spec's priors and margin
	b        time.Time     // zero until UpdateDeadline
	maxIter  time.Duration
	decided  int64 // the highest step decided
	fired    int64 // the step that fired; 0 before
	saved    map[string]bool
	envs     map[string]bool // registered environment workers
	reported map[string]bool
	state    v1.RunState
}

func (r *floorRun) after(seq int64) ([]*v1.Command, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if int(seq) < len(r.cmds) {
		return r.cmds[seq:], nil
	}
	return nil, r.notify
}

// issueLocked appends a command and wakes the run's streams and polls.
func (r *floorRun) issueLocked(c *v1.Command) {
	c.Seq, c.IssuedAt = int64(len(r.cmds)+1), timestamppb.Now()
	r.cmds = append(r.cmds, c)
	close(r.notify)
	r.notify = make(chan struct{})
}

func (r *floorRun) trigger(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := fmt.Sprintf("snap-%d", len(r.cmds)+1)
	if reason == warmupReason {
		r.issueLocked(&v1.Command{Kind: &v1.Command_Snapshot{Snapshot: &v1.SnapshotCommand{SnapshotId: id}}})
	} else {
		r.issueLocked(&v1.Command{Kind: &v1.Command_SaveAtDeadline{SaveAtDeadline: &v1.SaveAtDeadlineCommand{SnapshotId: id}}})
	}
}

func (r *floorRun) register(req *v1.RegisterWorkerRequest) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.created && req.Role == v1.WorkerRole_WORKER_ROLE_ENVIRONMENT {
		r.envs[req.Name] = true
	}
	return int64(len(r.cmds))
}

// decide is the Max rule at one step, decided once per run.
func (r *floorRun) decide(step int64, iteration time.Duration) v1.StepAction {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.maxIter = max(r.maxIter, iteration)
	// A step is decided by the first rank to ask about it; the others get
	// the same answer, as from the coordinator.
	if step > r.decided && r.fired == 0 {
		r.decided = step
		if !r.b.IsZero() && !time.Now().Add(r.maxIter+r.reserve).Before(r.b) {
			r.fired, r.state = step, v1.RunState_RUN_STATE_SAVING
		}
	}
	switch {
	case r.fired == 0 || step < r.fired:
		if r.state == v1.RunState_RUN_STATE_PENDING {
			r.state = v1.RunState_RUN_STATE_RUNNING
		}
		return v1.StepAction_STEP_ACTION_CONTINUE
	case step == r.fired:
		return v1.StepAction_STEP_ACTION_SAVE_AND_STOP
	}
	return v1.StepAction_STEP_ACTION_STOP
}

// deadlineSnapshot is the id of a run's SaveAtDeadline.
const deadlineSnapshot = "deadline"

func (r *floorRun) checkpointSaved(worker string, step int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fired == 0 || step != r.fired || r.saved[worker] {
		return
	}
	r.saved[worker] = true
	if len(r.saved) == r.world {
		r.state = v1.RunState_RUN_STATE_SNAPSHOTTING
		r.issueLocked(&v1.Command{Kind: &v1.Command_SaveAtDeadline{SaveAtDeadline: &v1.SaveAtDeadlineCommand{
			SnapshotId: deadlineSnapshot, AnchorStep: step, MustFinishBy: timestamppb.New(r.b)}}})
	}
}

func (r *floorRun) snapshotReported(worker, snapshot string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != v1.RunState_RUN_STATE_SNAPSHOTTING || snapshot != deadlineSnapshot || !r.envs[worker] {
		return
	}
	r.reported[worker] = true
	if len(r.reported) == len(r.envs) {
		r.state = v1.RunState_RUN_STATE_STOPPED
		r.issueLocked(&v1.Command{Kind: &v1.Command_Stop{Stop: &v1.StopCommand{Reason: "the deadline save is complete"}}})
	}
}

func (r *floorRun) snapshot() *v1.Run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return &v1.Run{State: r.state, FiredAtStep: r.fired}
}

// warmupReason asks the floor for a Snapshot rather than a SaveAtDeadline.
const warmupReason = "warmup"

type floorWorkers struct {
	v1.UnimplementedWorkerServiceServer
	f *floor
}

func (w floorWorkers) RegisterWorker(_ context.Context, req *v1.RegisterWorkerRequest) (*v1.RegisterWorkerResponse, error) {
	seq := w.f.run(req.RunId).register(req)
	return &v1.RegisterWorkerResponse{WorkerId: req.Name, Incarnation: 1, LastCommandSeq: seq, ResumeAfterSeq: seq}, nil
}

func (floorWorkers) Heartbeat(context.Context, *v1.HeartbeatRequest) (*v1.HeartbeatResponse, error) {
	return &v1.HeartbeatResponse{}, nil
}

func (floorWorkers) DeregisterWorker(context.Context, *v1.DeregisterWorkerRequest) (*v1.DeregisterWorkerResponse, error) {
	return &v1.DeregisterWorkerResponse{}, nil
}

func (w floorWorkers) CompleteStep(_ context.Context, req *v1.CompleteStepRequest) (*v1.CompleteStepResponse, error) {
	action := v1.StepAction_STEP_ACTION_CONTINUE
	if r, ok := w.f.runs.Load(req.RunId); ok && r.(*floorRun).created {
		action = r.(*floorRun).decide(req.Step, time.Duration(req.IterationSeconds*float64(time.Second)))
	}
	return &v1.CompleteStepResponse{Step: req.Step, Action: action}, nil
}

func (w floorWorkers) ReportCheckpoint(_ context.Context, req *v1.ReportCheckpointRequest) (*v1.ReportCheckpointResponse, error) {
	if req.Phase == v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED {
		w.f.run(req.RunId).checkpointSaved(req.WorkerId, req.Step)
	}
	return &v1.ReportCheckpointResponse{}, nil
}

func (w floorWorkers) ReportSnapshot(_ context.Context, req *v1.ReportSnapshotRequest) (*v1.ReportSnapshotResponse, error) {
	w.f.run(req.RunId).snapshotReported(req.WorkerId, req.SnapshotId)
	return &v1.ReportSnapshotResponse{}, nil
}

func (w floorWorkers) StreamCommands(req *v1.StreamCommandsRequest, stream grpc.ServerStreamingServer[v1.StreamCommandsResponse]) error {
	r := w.f.run(req.RunId)
	after := req.AfterSeq
	for {
		cmds, changed := r.after(after)
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
	r := w.f.run(req.RunId)
	t := time.NewTimer(time.Duration(req.WaitSeconds) * time.Second)
	defer t.Stop()
	for {
		cmds, changed := r.after(req.AfterSeq)
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
	r.f.run(req.RunId).trigger(req.Reason)
	return &v1.TriggerDeadlineResponse{}, nil
}

func (r floorRuns) CreateRun(_ context.Context, req *v1.CreateRunRequest) (*v1.CreateRunResponse, error) {
	run := r.f.run(req.RunId)
	run.mu.Lock()
	defer run.mu.Unlock()
	res := req.GetSpec().GetReserve()
	run.created, run.world, run.state = true, int(req.GetSpec().GetTrainerWorldSize()), v1.RunState_RUN_STATE_PENDING
	run.reserve = time.Duration((res.GetExpectedCheckpointSeconds() + res.GetExpectedSnapshotSeconds() + res.GetMarginSeconds()) * float64(time.Second))
	run.saved, run.envs, run.reported = map[string]bool{}, map[string]bool{}, map[string]bool{}
	return &v1.CreateRunResponse{Run: &v1.Run{RunId: req.RunId, State: run.state}, RunToken: "floor-token"}, nil
}

func (r floorRuns) UpdateDeadline(_ context.Context, req *v1.UpdateDeadlineRequest) (*v1.UpdateDeadlineResponse, error) {
	run := r.f.run(req.RunId)
	run.mu.Lock()
	defer run.mu.Unlock()
	run.b = req.GetMustSaveBy().AsTime()
	return &v1.UpdateDeadlineResponse{}, nil
}

func (r floorRuns) GetRun(_ context.Context, req *v1.GetRunRequest) (*v1.GetRunResponse, error) {
	run := r.f.run(req.RunId).snapshot()
	run.RunId = req.RunId
	return &v1.GetRunResponse{Run: run}, nil
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
