package grpcserver_test

// Fuzzing of each RPC's request handling through the coordinator as built
// (package coordinator): a bbolt file, the engine, and the production
// interceptor chain (logging, auth, drain, protovalidate, recovery) in front
// of the handlers, over a loopback connection. RunService is open (no admin
// token); a WorkerService request carries the run token of the fixture run
// it names, or, naming another run, a fixture's token, so that every request
// that names its own run reaches validation and the engine.
//
// Properties, for any bytes that unmarshal into the request:
//   - no panic and no INTERNAL, UNKNOWN or UNIMPLEMENTED status;
//   - a WorkerService request naming a run other than its token's gets
//     PERMISSION_DENIED;
//   - otherwise, a request protovalidate rejects gets INVALID_ARGUMENT; one it accepts
//     gets OK or a domain status (NOT_FOUND, FAILED_PRECONDITION, ...), and
//     never hangs;
//   - after an accepted request the state is consistent: the run it named
//     reads back (GetRun, ListWorkers, ListSnapshots), bbolt's consistency
//     check passes, every stored record decodes, and, now and then, the
//     coordinator restarts on its file.
//
// The seeds live in testdata/fuzz/<target>/ and are generated from
// fuzzSeeds below: go test ./server/grpcserver/ -run TestFuzzCorpus -update-fuzz-corpus

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"buf.build/go/protovalidate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
	"github.com/snapcoord/snapcoord/internal/testkit/coordtest"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
	"github.com/snapcoord/snapcoord/server/coordinator"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/store"
)

// FuzzCreateRun fuzzes run-spec validation through CreateRun: protovalidate
// field rules, then the engine's cross-field rules. An accepted spec makes a
// run that reads back, and creating it again with the same spec is
// idempotent.
func FuzzCreateRun(f *testing.F) {
	env := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, data []byte, _ uint8) {
		req := &v1.CreateRunRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		resp, err := env.runs.CreateRun(ctx, req)
		valid := env.validate(req)
		env.checkCode(t, "CreateRun", req, err, valid, false)
		switch status.Code(err) {
		case codes.OK:
		case codes.InvalidArgument, codes.AlreadyExists, codes.ResourceExhausted:
			return // the engine's cross-field rules, an id taken by another spec, max runs
		default:
			t.Fatalf("CreateRun(%v) = %v: not an answer a run spec can get", req, err)
		}
		if resp.GetRun().GetRunId() != req.RunId {
			t.Fatalf("CreateRun(%s) returned run %q", req.RunId, resp.GetRun().GetRunId())
		}
		if _, err := env.runs.CreateRun(ctx, req); err != nil {
			t.Fatalf("CreateRun(%s) again with the same spec: %v, want OK (idempotent)", req.RunId, err)
		}
		env.checkState(t, req.RunId)
	})
}

// FuzzWorkerService fuzzes every WorkerService RPC: which one is chosen by
// method, and anchor can point the request at a live fixture run and worker
// so that the fuzzer reaches past NOT_FOUND.
func FuzzWorkerService(f *testing.F) {
	env := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, data []byte, method uint8, anchor uint8) {
		env.fuzzRPC(t, workerRPCs, data, method, anchor)
	})
}

// FuzzRunService fuzzes every RunService RPC but CreateRun (FuzzCreateRun's).
func FuzzRunService(f *testing.F) {
	env := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, data []byte, method uint8, anchor uint8) {
		env.fuzzRPC(t, runRPCs, data, method, anchor)
	})
}

// rpc is one method under fuzz.
type rpc struct {
	name string
	req  func() proto.Message
	// waits: the method may legitimately run until its deadline (streams,
	// long polls).
	waits bool
	call  func(ctx context.Context, e *fuzzEnv, req proto.Message) error
}

func unaryRPC[Req proto.Message, Resp any](name string, newReq func() Req, call func(e *fuzzEnv) func(context.Context, Req, ...grpc.CallOption) (Resp, error)) rpc {
	return rpc{name: name, req: func() proto.Message { return newReq() }, call: func(ctx context.Context, e *fuzzEnv, m proto.Message) error {
		_, err := call(e)(ctx, m.(Req))
		return err
	}}
}

// drainStream receives until the stream ends or fails; io.EOF is a clean end.
func drainStream[T any](s grpc.ServerStreamingClient[T], err error) error {
	if err != nil {
		return err
	}
	for {
		if _, err := s.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

var workerRPCs = []rpc{
	unaryRPC("RegisterWorker", func() *v1.RegisterWorkerRequest { return &v1.RegisterWorkerRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.RegisterWorkerRequest, ...grpc.CallOption) (*v1.RegisterWorkerResponse, error) {
			return e.workers.RegisterWorker
		}),
	unaryRPC("Heartbeat", func() *v1.HeartbeatRequest { return &v1.HeartbeatRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.HeartbeatRequest, ...grpc.CallOption) (*v1.HeartbeatResponse, error) {
			return e.workers.Heartbeat
		}),
	unaryRPC("DeregisterWorker", func() *v1.DeregisterWorkerRequest { return &v1.DeregisterWorkerRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.DeregisterWorkerRequest, ...grpc.CallOption) (*v1.DeregisterWorkerResponse, error) {
			return e.workers.DeregisterWorker
		}),
	unaryRPC("CompleteStep", func() *v1.CompleteStepRequest { return &v1.CompleteStepRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.CompleteStepRequest, ...grpc.CallOption) (*v1.CompleteStepResponse, error) {
			return e.workers.CompleteStep
		}),
	unaryRPC("ReportCheckpoint", func() *v1.ReportCheckpointRequest { return &v1.ReportCheckpointRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.ReportCheckpointRequest, ...grpc.CallOption) (*v1.ReportCheckpointResponse, error) {
			return e.workers.ReportCheckpoint
		}),
	unaryRPC("ReportSnapshot", func() *v1.ReportSnapshotRequest { return &v1.ReportSnapshotRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.ReportSnapshotRequest, ...grpc.CallOption) (*v1.ReportSnapshotResponse, error) {
			return e.workers.ReportSnapshot
		}),
	unaryRPC("FinishRun", func() *v1.FinishRunRequest { return &v1.FinishRunRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.FinishRunRequest, ...grpc.CallOption) (*v1.FinishRunResponse, error) {
			return e.workers.FinishRun
		}),
	{name: "StreamCommands", waits: true, req: func() proto.Message { return &v1.StreamCommandsRequest{} },
		call: func(ctx context.Context, e *fuzzEnv, m proto.Message) error {
			return drainStream(e.workers.StreamCommands(ctx, m.(*v1.StreamCommandsRequest)))
		}},
	func() rpc {
		r := unaryRPC("PollCommands", func() *v1.PollCommandsRequest { return &v1.PollCommandsRequest{} },
			func(e *fuzzEnv) func(context.Context, *v1.PollCommandsRequest, ...grpc.CallOption) (*v1.PollCommandsResponse, error) {
				return e.workers.PollCommands
			})
		r.waits = true
		return r
	}(),
}

var runRPCs = []rpc{
	unaryRPC("GetRun", func() *v1.GetRunRequest { return &v1.GetRunRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.GetRunRequest, ...grpc.CallOption) (*v1.GetRunResponse, error) {
			return e.runs.GetRun
		}),
	unaryRPC("ListRuns", func() *v1.ListRunsRequest { return &v1.ListRunsRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.ListRunsRequest, ...grpc.CallOption) (*v1.ListRunsResponse, error) {
			return e.runs.ListRuns
		}),
	unaryRPC("UpdateDeadline", func() *v1.UpdateDeadlineRequest { return &v1.UpdateDeadlineRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.UpdateDeadlineRequest, ...grpc.CallOption) (*v1.UpdateDeadlineResponse, error) {
			return e.runs.UpdateDeadline
		}),
	unaryRPC("TriggerDeadline", func() *v1.TriggerDeadlineRequest { return &v1.TriggerDeadlineRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.TriggerDeadlineRequest, ...grpc.CallOption) (*v1.TriggerDeadlineResponse, error) {
			return e.runs.TriggerDeadline
		}),
	unaryRPC("CancelRun", func() *v1.CancelRunRequest { return &v1.CancelRunRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.CancelRunRequest, ...grpc.CallOption) (*v1.CancelRunResponse, error) {
			return e.runs.CancelRun
		}),
	{name: "WatchRun", waits: true, req: func() proto.Message { return &v1.WatchRunRequest{} },
		call: func(ctx context.Context, e *fuzzEnv, m proto.Message) error {
			return drainStream(e.runs.WatchRun(ctx, m.(*v1.WatchRunRequest)))
		}},
	unaryRPC("ListWorkers", func() *v1.ListWorkersRequest { return &v1.ListWorkersRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.ListWorkersRequest, ...grpc.CallOption) (*v1.ListWorkersResponse, error) {
			return e.runs.ListWorkers
		}),
	unaryRPC("ListSnapshots", func() *v1.ListSnapshotsRequest { return &v1.ListSnapshotsRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.ListSnapshotsRequest, ...grpc.CallOption) (*v1.ListSnapshotsResponse, error) {
			return e.runs.ListSnapshots
		}),
	unaryRPC("ReissueRunToken", func() *v1.ReissueRunTokenRequest { return &v1.ReissueRunTokenRequest{} },
		func(e *fuzzEnv) func(context.Context, *v1.ReissueRunTokenRequest, ...grpc.CallOption) (*v1.ReissueRunTokenResponse, error) {
			return e.runs.ReissueRunToken
		}),
}

// fuzzEnv is one coordinator per fuzz target (and fuzzing process), kept
// across inputs so that state accumulates as it would in production.
type fuzzEnv struct {
	dir       string
	validator protovalidate.Validator

	coord   *coordtest.Instance
	db      *store.DB // the coordinator's, for consistency checks
	conn    *grpc.ClientConn
	runs    v1.RunServiceClient
	workers v1.WorkerServiceClient

	fixtures [fixtureRuns]*fixture
	tokens   map[string]string // fixture run tokens, by run id
	accepted int               // requests answered OK, for the periodic deeper checks
}

const fixtureRuns = 3

// fixture is a live run with two trainer ranks, two environment workers and
// one snapshot ("snap-1") issued after the checkpoint of step 1.
type fixture struct {
	id      string
	workers []string // rank-0, rank-1, env-0, env-1
}

func newFuzzEnv(f *testing.F) *fuzzEnv {
	f.Helper()
	v, err := protovalidate.New()
	if err != nil {
		f.Fatal(err)
	}
	e := &fuzzEnv{dir: f.TempDir(), validator: v, tokens: map[string]string{}}
	e.start(f)
	f.Cleanup(func() { e.stop() })
	return e
}

func (e *fuzzEnv) start(t testing.TB) {
	t.Helper()
	cfg := coordtest.Config(e.dir)
	cfg.LeaseTTL = time.Hour
	e.coord = coordtest.Serve(t, cfg, coordinator.WithEngine(func(o *engine.Options) { o.MaxPollWait = 20 * time.Millisecond }))
	conn, err := grpc.NewClient(e.coord.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	e.db, e.conn = e.coord.Store(), conn
	e.runs, e.workers = v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn)
}

func (e *fuzzEnv) stop() {
	_ = e.conn.Close()
	e.coord.Stop()
}

// restart is a coordinator restart on the fuzzed file: it must load.
func (e *fuzzEnv) restart(t *testing.T) {
	t.Helper()
	e.stop()
	e.start(t) // fails the test if the fuzzed state does not load
}

func (e *fuzzEnv) validate(m proto.Message) bool { return e.validator.Validate(m) == nil }

// fixture returns live fixture run k, making a new one when the fuzzer
// ended the last (cancelled, finished or fired it).
func (e *fuzzEnv) fixture(t *testing.T, k int) *fixture {
	t.Helper()
	ctx := t.Context()
	if fx := e.fixtures[k]; fx != nil {
		resp, err := e.runs.GetRun(ctx, &v1.GetRunRequest{RunId: fx.id})
		if err == nil && resp.Run.FiredAt == nil && !apifacts.Terminal(resp.Run.State) {
			return fx
		}
	}
	fx := &fixture{id: fmt.Sprintf("fixture-%d-%d", k, time.Now().UnixNano())}
	created, err := e.runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: fx.id, Spec: spectest.Turn(2, "01:00:00:00")})
	if err != nil {
		t.Fatalf("fixture CreateRun: %v", err)
	}
	e.tokens[fx.id] = created.GetRunToken()
	ctx = withRunToken(ctx, created.GetRunToken())
	for i, name := range []string{"rank-0", "rank-1", "env-0", "env-1"} {
		req := &v1.RegisterWorkerRequest{RunId: fx.id, Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: name, Rank: int32(i)}
		if i >= 2 {
			req.Role, req.Rank = v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, 0
		}
		resp, err := e.workers.RegisterWorker(ctx, req)
		if err != nil {
			t.Fatalf("fixture RegisterWorker(%s): %v", name, err)
		}
		fx.workers = append(fx.workers, resp.WorkerId)
	}
	for _, w := range fx.workers[:2] {
		if _, err := e.workers.ReportCheckpoint(ctx, &v1.ReportCheckpointRequest{RunId: fx.id, WorkerId: w, Step: 1,
			Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 1}); err != nil {
			t.Fatalf("fixture ReportCheckpoint: %v", err)
		}
	}
	e.fixtures[k] = fx
	return fx
}

// anchorTo points the request at a fixture: bit 0 sets run_id, bit 1
// worker_id (chosen by bits 2-3), bit 4 snapshot_id "snap-1".
func (e *fuzzEnv) anchorTo(t *testing.T, m proto.Message, anchor uint8) {
	t.Helper()
	if anchor&0x13 == 0 {
		return
	}
	fx := e.fixture(t, int(anchor>>5)%fixtureRuns)
	r := m.ProtoReflect()
	set := func(name protoreflect.Name, v string) {
		if fd := r.Descriptor().Fields().ByName(name); fd != nil && fd.Kind() == protoreflect.StringKind && fd.Cardinality() != protoreflect.Repeated {
			r.Set(fd, protoreflect.ValueOfString(v))
		}
	}
	if anchor&1 != 0 {
		set("run_id", fx.id)
	}
	if anchor&2 != 0 {
		set("worker_id", fx.workers[int(anchor>>2)%len(fx.workers)])
	}
	if anchor&0x10 != 0 {
		set("snapshot_id", "snap-1")
	}
}

func (e *fuzzEnv) fuzzRPC(t *testing.T, rpcs []rpc, data []byte, method, anchor uint8) {
	m := rpcs[int(method)%len(rpcs)]
	req := m.req()
	if proto.Unmarshal(data, req) != nil {
		return
	}
	e.anchorTo(t, req, anchor)
	timeout := 10 * time.Second
	if m.waits {
		timeout = 100 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	ctx, own := e.credential(t, ctx, m.name, req)
	err := m.call(ctx, e, req)
	cancel()
	if !own {
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("%s(%v) with another run's token = %v, want PERMISSION_DENIED", m.name, req, err)
		}
		return
	}
	e.checkCode(t, m.name, req, err, e.validate(req), m.waits)
	if err == nil {
		if id, ok := stringField(req, "run_id"); ok {
			e.checkState(t, id)
		}
	}
}

// credential gives a WorkerService call the run token a worker of the run
// it names would send: its own for a fixture run (own is true), otherwise
// fixture 0's. RunService calls need none (own is true).
func (e *fuzzEnv) credential(t *testing.T, ctx context.Context, method string, req proto.Message) (_ context.Context, own bool) {
	if !workerMethod(method) {
		return ctx, true
	}
	runID, _ := stringField(req, "run_id")
	if tok, ok := e.tokens[runID]; ok {
		return withRunToken(ctx, tok), true
	}
	return withRunToken(ctx, e.tokens[e.fixture(t, 0).id]), false
}

func workerMethod(name string) bool {
	desc := v1.WorkerService_ServiceDesc
	for _, m := range desc.Methods {
		if m.MethodName == name {
			return true
		}
	}
	for _, s := range desc.Streams {
		if s.StreamName == name {
			return true
		}
	}
	return false
}

func withRunToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// checkCode is the property every answer must have.
func (e *fuzzEnv) checkCode(t *testing.T, method string, req proto.Message, err error, valid, waits bool) {
	t.Helper()
	code := status.Code(err)
	switch {
	case code == codes.Internal || code == codes.Unknown || code == codes.Unimplemented || code == codes.DataLoss:
		t.Fatalf("%s(%v) = %v: a fault, not an answer", method, req, err)
	case !valid && code != codes.InvalidArgument:
		t.Fatalf("%s(%v) = %v: protovalidate rejects the request, want INVALID_ARGUMENT", method, req, err)
	case code == codes.DeadlineExceeded && !waits:
		t.Fatalf("%s(%v) hung: %v", method, req, err)
	case code == codes.Unavailable:
		t.Fatalf("%s(%v) = %v: the coordinator stopped accepting work (a commit failed?)", method, req, err)
	}
}

func stringField(m proto.Message, name protoreflect.Name) (string, bool) {
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(name)
	if fd == nil || fd.Kind() != protoreflect.StringKind {
		return "", false
	}
	return r.Get(fd).String(), true
}

// checkState: after an accepted request, the run it named reads back, the
// file passes bbolt's check, and now and then every record decodes and the
// coordinator restarts on the file.
func (e *fuzzEnv) checkState(t *testing.T, runID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := e.runs.GetRun(ctx, &v1.GetRunRequest{RunId: runID}); err != nil {
		t.Fatalf("GetRun(%s) after an accepted request: %v", runID, err)
	}
	if _, err := e.runs.ListWorkers(ctx, &v1.ListWorkersRequest{RunId: runID}); err != nil {
		t.Fatalf("ListWorkers(%s) after an accepted request: %v", runID, err)
	}
	if _, err := e.runs.ListSnapshots(ctx, &v1.ListSnapshotsRequest{RunId: runID}); err != nil {
		t.Fatalf("ListSnapshots(%s) after an accepted request: %v", runID, err)
	}
	if err := e.db.Check(); err != nil {
		t.Fatalf("after an accepted request on run %s: %v", runID, err)
	}
	e.accepted++
	if e.accepted%64 == 0 {
		if _, err := e.db.Load(ctx, store.Everything); err != nil {
			t.Fatalf("stored state does not load: %v", err)
		}
	}
	if e.accepted%512 == 0 {
		e.restart(t)
	}
}

// ---------------------------------------------------------------------------
// Seed corpus.

var updateCorpus = flag.Bool("update-fuzz-corpus", false, "rewrite testdata/fuzz from fuzzSeeds")

// seed is one committed corpus entry.
type seed struct {
	name   string
	req    proto.Message
	method string // for the service targets
	anchor uint8
}

// Anchor bits (see anchorTo).
const (
	aRun    = 1
	aWorker = 2
	aSnap   = 0x10
)

func worker(k uint8) uint8 { return aRun | aWorker | k<<2 }

func fuzzSeeds() map[string][]seed {
	at := timestamppb.New(time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC))
	turn := &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN}
	return map[string][]seed{
		"FuzzCreateRun": {
			{name: "design-example", req: &v1.CreateRunRequest{RunId: "grpo-7b-0042", Spec: &v1.RunSpec{
				TrainerWorldSize: 8, StartedAt: at,
				Checkpointing:        &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:03:45:00"},
				RolloutCheckpointing: &v1.RolloutCheckpointingSpec{SnapshotAttemptIntervalS: proto.Int32(300), SnapshotOnTrainerCheckpoint: proto.Bool(true), MaxConsecutiveFailures: 3, SnapshotTimeoutS: 600},
				RolloutRecovery:      turn,
				Reserve:              &v1.ReserveSpec{Window: 5, MarginSeconds: 30, ExpectedCheckpointSeconds: proto.Float64(120), ExpectedSnapshotSeconds: proto.Float64(60)},
			}}},
			{name: "absolute-deadline", req: &v1.CreateRunRequest{RunId: "abs", Spec: &v1.RunSpec{TrainerWorldSize: 1,
				Checkpointing: &v1.CheckpointingSpec{MustSaveBy: at}}}},
			{name: "no-deadline-sibling", req: &v1.CreateRunRequest{RunId: "sib", Spec: &v1.RunSpec{TrainerWorldSize: 2,
				RolloutRecovery: &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_SIBLING}}}},
			{name: "both-deadlines", req: &v1.CreateRunRequest{RunId: "both", Spec: &v1.RunSpec{TrainerWorldSize: 1,
				Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00", MustSaveBy: at}}}},
			{name: "bad-budget", req: &v1.CreateRunRequest{RunId: "bad", Spec: &v1.RunSpec{TrainerWorldSize: 1,
				Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "1:2:3"}}}},
			{name: "never-saves", req: &v1.CreateRunRequest{RunId: "never", Spec: &v1.RunSpec{TrainerWorldSize: 1,
				RolloutCheckpointing: &v1.RolloutCheckpointingSpec{SnapshotOnTrainerCheckpoint: proto.Bool(false)}, RolloutRecovery: turn}}},
			{name: "deferred-with-interval", req: &v1.CreateRunRequest{RunId: "deferred", Spec: &v1.RunSpec{TrainerWorldSize: 1,
				Checkpointing:        &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00", DeferredFinalize: true},
				RolloutCheckpointing: &v1.RolloutCheckpointingSpec{SnapshotAttemptIntervalS: proto.Int32(60), SnapshotOnTrainerCheckpoint: proto.Bool(false)}}}},
			{name: "deferred-deadline-only", req: &v1.CreateRunRequest{RunId: "deferred-ok", Spec: &v1.RunSpec{TrainerWorldSize: 4,
				Checkpointing:        &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:01:00:00", DeferredFinalize: true},
				RolloutCheckpointing: &v1.RolloutCheckpointingSpec{SnapshotOnTrainerCheckpoint: proto.Bool(false)}, RolloutRecovery: turn}}},
			{name: "zero-world", req: &v1.CreateRunRequest{RunId: "zero", Spec: &v1.RunSpec{}}},
			{name: "no-spec", req: &v1.CreateRunRequest{RunId: "nospec"}},
			{name: "bad-run-id", req: &v1.CreateRunRequest{RunId: "Bad Id", Spec: &v1.RunSpec{TrainerWorldSize: 1}}},
		},
		"FuzzWorkerService": {
			{name: "register-trainer", method: "RegisterWorker", anchor: aRun, req: &v1.RegisterWorkerRequest{Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-1", Rank: 1}},
			{name: "register-env", method: "RegisterWorker", anchor: aRun, req: &v1.RegisterWorkerRequest{Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "host:7"}},
			{name: "register-rank-out-of-world", method: "RegisterWorker", anchor: aRun, req: &v1.RegisterWorkerRequest{Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-9", Rank: 9}},
			{name: "register-unknown-run", method: "RegisterWorker", req: &v1.RegisterWorkerRequest{RunId: "nope", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "x"}},
			{name: "heartbeat", method: "Heartbeat", anchor: worker(2), req: &v1.HeartbeatRequest{}},
			{name: "heartbeat-stale-incarnation", method: "Heartbeat", anchor: worker(2), req: &v1.HeartbeatRequest{Incarnation: 7}},
			{name: "register-again-as-holder", method: "RegisterWorker", anchor: aRun, req: &v1.RegisterWorkerRequest{Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "host:7", Incarnation: 1}},
			{name: "deregister", method: "DeregisterWorker", anchor: worker(3), req: &v1.DeregisterWorkerRequest{}},
			{name: "complete-step", method: "CompleteStep", anchor: worker(0), req: &v1.CompleteStepRequest{Step: 2, IterationSeconds: 41.5}},
			{name: "complete-step-env", method: "CompleteStep", anchor: worker(2), req: &v1.CompleteStepRequest{Step: 2, IterationSeconds: 1}},
			{name: "complete-step-huge-iteration", method: "CompleteStep", anchor: worker(1), req: &v1.CompleteStepRequest{Step: 3, IterationSeconds: 86400}},
			{name: "checkpoint-saved", method: "ReportCheckpoint", anchor: worker(0), req: &v1.ReportCheckpointRequest{Step: 2, Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 30.2}},
			{name: "checkpoint-published-early", method: "ReportCheckpoint", anchor: worker(1), req: &v1.ReportCheckpointRequest{Step: 5, Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED}},
			{name: "snapshot-saved", method: "ReportSnapshot", anchor: worker(2) | aSnap, req: &v1.ReportSnapshotRequest{Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, DurationSeconds: 12.5}},
			{name: "snapshot-invariant-failure", method: "ReportSnapshot", anchor: worker(3) | aSnap, req: &v1.ReportSnapshotRequest{Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_INVARIANT_FAILURE, Message: "turn 7 lost"}},
			{name: "snapshot-unknown", method: "ReportSnapshot", anchor: worker(2), req: &v1.ReportSnapshotRequest{SnapshotId: "snap-99", Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR}},
			{name: "snapshot-stale-incarnation", method: "ReportSnapshot", anchor: worker(3) | aSnap, req: &v1.ReportSnapshotRequest{Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, Incarnation: 7}},
			{name: "complete-step-stale-incarnation", method: "CompleteStep", anchor: worker(1), req: &v1.CompleteStepRequest{Step: 4, IterationSeconds: 2, Incarnation: 7}},
			{name: "finish-run", method: "FinishRun", anchor: worker(0), req: &v1.FinishRunRequest{}},
			{name: "stream", method: "StreamCommands", anchor: worker(2), req: &v1.StreamCommandsRequest{}},
			{name: "poll", method: "PollCommands", anchor: worker(3), req: &v1.PollCommandsRequest{WaitSeconds: 1}},
			{name: "poll-after-end", method: "PollCommands", anchor: worker(2), req: &v1.PollCommandsRequest{AfterSeq: 1 << 40}},
		},
		"FuzzRunService": {
			{name: "get", method: "GetRun", anchor: aRun, req: &v1.GetRunRequest{}},
			{name: "get-unknown", method: "GetRun", req: &v1.GetRunRequest{RunId: "nope"}},
			{name: "list", method: "ListRuns", req: &v1.ListRunsRequest{PageSize: 2}},
			{name: "list-bad-token", method: "ListRuns", req: &v1.ListRunsRequest{PageToken: "!!"}},
			{name: "list-state", method: "ListRuns", req: &v1.ListRunsRequest{State: v1.RunState_RUN_STATE_PENDING}},
			{name: "update-budget", method: "UpdateDeadline", anchor: aRun, req: &v1.UpdateDeadlineRequest{CheckpointMustSaveBy: "02:00:00:00"}},
			{name: "update-absolute", method: "UpdateDeadline", anchor: aRun, req: &v1.UpdateDeadlineRequest{MustSaveBy: at}},
			{name: "update-nothing", method: "UpdateDeadline", anchor: aRun, req: &v1.UpdateDeadlineRequest{}},
			{name: "trigger", method: "TriggerDeadline", anchor: aRun, req: &v1.TriggerDeadlineRequest{Reason: "operator"}},
			{name: "cancel", method: "CancelRun", anchor: aRun | 1<<5, req: &v1.CancelRunRequest{Reason: "bad data"}},
			{name: "watch", method: "WatchRun", anchor: aRun, req: &v1.WatchRunRequest{NoFollow: true}},
			{name: "watch-follow", method: "WatchRun", anchor: aRun, req: &v1.WatchRunRequest{AfterSeq: 3}},
			{name: "workers", method: "ListWorkers", anchor: aRun, req: &v1.ListWorkersRequest{}},
			{name: "workers-page", method: "ListWorkers", anchor: aRun, req: &v1.ListWorkersRequest{PageSize: 1, PageToken: "MSAwIHJhbmstMA"}},
			{name: "workers-bad-token", method: "ListWorkers", anchor: aRun, req: &v1.ListWorkersRequest{PageToken: "!!"}},
			{name: "snapshots", method: "ListSnapshots", anchor: aRun, req: &v1.ListSnapshotsRequest{}},
			{name: "snapshots-page", method: "ListSnapshots", anchor: aRun, req: &v1.ListSnapshotsRequest{PageSize: 1, PageToken: "c25hcC0x"}},
			{name: "snapshots-bad-token", method: "ListSnapshots", anchor: aRun, req: &v1.ListSnapshotsRequest{PageToken: "!!"}},
			{name: "reissue-token", method: "ReissueRunToken", anchor: aRun, req: &v1.ReissueRunTokenRequest{Reason: "job 42 requeued"}},
			{name: "reissue-token-unknown", method: "ReissueRunToken", req: &v1.ReissueRunTokenRequest{RunId: "nope"}},
		},
	}
}

func methodIndex(rpcs []rpc, name string) (uint8, bool) {
	for i, r := range rpcs {
		if r.name == name {
			return uint8(i), true
		}
	}
	return 0, false
}

// corpusFile renders a seed in the go test fuzz v1 format.
func corpusFile(target string, s seed) (string, error) {
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.req)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("go test fuzz v1\n")
	fmt.Fprintf(&b, "[]byte(%q)\n", data)
	if target == "FuzzCreateRun" {
		fmt.Fprintf(&b, "byte(%q)\n", s.anchor)
		return b.String(), nil
	}
	rpcs := workerRPCs
	if target == "FuzzRunService" {
		rpcs = runRPCs
	}
	i, ok := methodIndex(rpcs, s.method)
	if !ok {
		return "", fmt.Errorf("%s: unknown method %q", target, s.method)
	}
	fmt.Fprintf(&b, "byte(%q)\nbyte(%q)\n", i, s.anchor)
	return b.String(), nil
}

// TestFuzzCorpus keeps testdata/fuzz in step with fuzzSeeds (which the
// fuzz targets run as seeds in every go test): a changed request message
// or method table shows up here. -update-fuzz-corpus rewrites the files.
func TestFuzzCorpus(t *testing.T) {
	for target, seeds := range fuzzSeeds() {
		for _, s := range seeds {
			want, err := corpusFile(target, s)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "fuzz", target, s.name)
			if *updateCorpus {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got, err := os.ReadFile(path)
			if err != nil || string(got) != want {
				t.Errorf("%s is missing or stale (err %v); run: go test ./server/grpcserver/ -run TestFuzzCorpus -update-fuzz-corpus", path, err)
			}
		}
	}
}
