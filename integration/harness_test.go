package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
	"github.com/snapcoord/snapcoord/internal/testkit/coordtest"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
	"github.com/snapcoord/snapcoord/server/coordinator"
)

// testTimeout bounds every test: a missed wake-up or a lost command shows as
// a failure naming what was still awaited, never as a hung test binary.
const testTimeout = 50 * time.Second

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// ---------------------------------------------------------------------------
// In-process coordinator: the assembled coordinator (store, engine, the
// production interceptor chain), on a loopback port kept across restarts so
// that clients see the same address.

type inproc struct {
	t    *testing.T
	cfg  coordinator.Config
	opts []coordinator.Option
	addr string
	logs *logsink.Buffer

	instance *coordtest.Instance // nil when stopped
}

// startInproc serves a fresh data directory with tune's changes to the
// test configuration, and opts. A fake clock (coordinator.WithClock) is
// kept across restarts.
func startInproc(t *testing.T, tune func(*coordinator.Config), opts ...coordinator.Option) *inproc {
	t.Helper()
	c := &inproc{t: t, cfg: coordtest.Config(t.TempDir()), opts: opts, logs: &logsink.Buffer{}}
	c.cfg.Logger = slog.New(slog.NewTextHandler(c.logs, nil))
	if tune != nil {
		tune(&c.cfg)
	}
	c.start()
	t.Cleanup(c.stop)
	return c
}

// hourlyHeartbeats puts heartbeats an hour apart (leases of three), for
// tests that move a fake clock by hand.
func hourlyHeartbeats(c *coordinator.Config) {
	c.HeartbeatInterval, c.LeaseTTL = time.Hour, 3*time.Hour
}

func (c *inproc) start() {
	c.t.Helper()
	c.instance = coordtest.Serve(c.t, c.cfg, c.opts...)
	c.addr = c.instance.Addr()
	c.cfg.Listen = c.addr
}

// stop shuts the server down gracefully (streams and polls end UNAVAILABLE),
// then the engine and the store. Safe to call when stopped; start again is
// a coordinator restart on the same data file and address.
func (c *inproc) stop() {
	if c.instance == nil {
		return
	}
	c.instance.Stop()
	c.instance = nil
}

// ---------------------------------------------------------------------------
// The snapcoord binary as a child process, for SIGKILL.

type proc struct {
	t *testing.T
	p *coordproc.Proc
	// addr is where it serves, the same after every restart.
	addr string
	// dataDir is its --data-dir.
	dataDir string
}

// startProc runs `snapcoord serve` on a fresh data directory and waits until
// it is SERVING. Leases are long: these tests are about crashes, not leases.
func startProc(t *testing.T) *proc {
	t.Helper()
	dataDir := filepath.Join(t.TempDir(), "data")
	p := coordproc.ForTest(t, coordproc.Config{Bin: binPath, DataDir: dataDir,
		Args: []string{"--metrics-listen", "", "--log-format", "json", "--heartbeat-interval", "5s", "--lease-ttl", "5m"}})
	return &proc{t: t, p: p, addr: p.Addr, dataDir: dataDir}
}

// kill is kill -9: no drain, no deferred close, nothing flushed. The
// process must have been running, and free of data races.
func (p *proc) kill() {
	p.t.Helper()
	if err := p.p.Kill(); err != nil {
		p.t.Fatal(err)
	}
	if p.p.Race() {
		p.t.Fatalf("data race in snapcoord:\n%s", p.p.Log())
	}
}

// restart starts the binary again on the same data directory and port.
func (p *proc) restart() {
	p.t.Helper()
	p.p = p.p.RestartForTest(p.t)
}

// ---------------------------------------------------------------------------
// Clients. A connection outlives coordinator restarts: it reconnects with a
// short backoff, and every call waits for it to be ready, as a worker
// process's client would.

func dial(t *testing.T, addr, token string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 250 * time.Millisecond},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)),
	}
	if token != "" {
		b := bearer(token)
		opts = append(opts, grpc.WithChainUnaryInterceptor(b.unary), grpc.WithChainStreamInterceptor(b.stream))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// bearer sends `authorization: Bearer <run token>` with every call, the
// WorkerService credential of docs/design.md. An interceptor rather than per-RPC
// credentials: grpc-go refuses those on a plaintext connection.
type bearer string

func (b bearer) ctx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+string(b))
}

func (b bearer) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(b.ctx(ctx), method, req, reply, cc, opts...)
}

func (b bearer) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(b.ctx(ctx), desc, cc, method, opts...)
}

// cluster is the clients of one coordinator address.
type cluster struct {
	t    *testing.T
	addr string
	runs v1.RunServiceClient
}

func newCluster(t *testing.T, addr string) *cluster {
	t.Helper()
	return &cluster{t: t, addr: addr, runs: v1.NewRunServiceClient(dial(t, addr, ""))}
}

// run is one run and the WorkerService client its workers use (its token).
type run struct {
	c   *cluster
	id  string
	tok string
	ws  v1.WorkerServiceClient
}

func (c *cluster) createRun(ctx context.Context, id string, spec *v1.RunSpec) *run {
	c.t.Helper()
	resp, err := c.runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: id, Spec: spec})
	if err != nil {
		c.t.Fatalf("CreateRun %s: %v", id, err)
	}
	if resp.RunToken == "" {
		c.t.Fatalf("CreateRun %s returned no run token", id)
	}
	return &run{c: c, id: id, tok: resp.RunToken, ws: v1.NewWorkerServiceClient(dial(c.t, c.addr, resp.RunToken))}
}

func (r *run) get(ctx context.Context) *v1.Run {
	r.c.t.Helper()
	resp, err := r.c.runs.GetRun(ctx, &v1.GetRunRequest{RunId: r.id})
	if err != nil {
		r.c.t.Fatalf("GetRun %s: %v", r.id, err)
	}
	return resp.Run
}

func (r *run) snapshots(ctx context.Context) []*v1.Snapshot {
	r.c.t.Helper()
	resp, err := r.c.runs.ListSnapshots(ctx, &v1.ListSnapshotsRequest{RunId: r.id})
	if err != nil {
		r.c.t.Fatalf("ListSnapshots %s: %v", r.id, err)
	}
	return resp.Snapshots
}

func (r *run) workers(ctx context.Context) []*v1.Worker {
	r.c.t.Helper()
	resp, err := r.c.runs.ListWorkers(ctx, &v1.ListWorkersRequest{RunId: r.id})
	if err != nil {
		r.c.t.Fatalf("ListWorkers %s: %v", r.id, err)
	}
	return resp.Workers
}

// events returns the run's whole durable event log.
func (r *run) events(ctx context.Context) []*v1.RunEvent {
	r.c.t.Helper()
	stream, err := r.c.runs.WatchRun(ctx, &v1.WatchRunRequest{RunId: r.id, NoFollow: true})
	if err != nil {
		r.c.t.Fatalf("WatchRun %s: %v", r.id, err)
	}
	var evs []*v1.RunEvent
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return evs
		}
		if err != nil {
			r.c.t.Fatalf("WatchRun %s: %v", r.id, err)
		}
		evs = append(evs, resp.Event)
	}
}

func (r *run) register(ctx context.Context, role v1.WorkerRole, name string, rank int32) *v1.RegisterWorkerResponse {
	r.c.t.Helper()
	resp, err := r.ws.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: r.id, Role: role, Name: name, Rank: rank})
	if err != nil {
		r.c.t.Fatalf("RegisterWorker %s/%s: %v", r.id, name, err)
	}
	return resp
}

func (r *run) trainers(ctx context.Context, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = r.register(ctx, v1.WorkerRole_WORKER_ROLE_TRAINER, fmt.Sprintf("rank-%d", i), int32(i)).WorkerId
	}
	return ids
}

func (r *run) envs(ctx context.Context, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = r.register(ctx, v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, fmt.Sprintf("env-%d", i), 0).WorkerId
	}
	return ids
}

// stepAll has every rank complete step at once and checks that they were
// all told the identical decision, which it returns.
func (r *run) stepAll(ctx context.Context, ranks []string, step int64, iterSeconds float64) *v1.Decision {
	t := r.c.t
	t.Helper()
	decisions := make([]*v1.Decision, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, id := range ranks {
		wg.Go(func() {
			resp, err := r.ws.CompleteStep(ctx, &v1.CompleteStepRequest{RunId: r.id, WorkerId: id, Step: step, IterationSeconds: iterSeconds})
			decisions[i], errs[i] = resp.GetDecision(), err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("CompleteStep(step %d) by %s: %v", step, ranks[i], err)
		}
		if decisions[i] == nil || decisions[i].Step != step {
			t.Fatalf("CompleteStep(step %d) by %s: decision %v", step, ranks[i], decisions[i])
		}
	}
	for i := range decisions {
		if !protoEqual(decisions[i], decisions[0]) {
			t.Fatalf("step %d: rank %s was told %v, rank %s was told %v", step, ranks[i], decisions[i], ranks[0], decisions[0])
		}
	}
	return decisions[0]
}

func (r *run) step(ctx context.Context, rank string, step int64, iterSeconds float64) *v1.Decision {
	r.c.t.Helper()
	resp, err := r.ws.CompleteStep(ctx, &v1.CompleteStepRequest{RunId: r.id, WorkerId: rank, Step: step, IterationSeconds: iterSeconds})
	if err != nil {
		r.c.t.Fatalf("CompleteStep(step %d) by %s: %v", step, rank, err)
	}
	return resp.Decision
}

func (r *run) saved(ctx context.Context, rank string, step int64, seconds float64) {
	r.c.t.Helper()
	_, err := r.ws.ReportCheckpoint(ctx, &v1.ReportCheckpointRequest{RunId: r.id, WorkerId: rank, Step: step,
		Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: seconds})
	if err != nil {
		r.c.t.Fatalf("ReportCheckpoint(step %d SAVED) by %s: %v", step, rank, err)
	}
}

func (r *run) reportSnapshot(ctx context.Context, worker, snapID string, outcome v1.SnapshotOutcome) error {
	_, err := r.ws.ReportSnapshot(ctx, &v1.ReportSnapshotRequest{RunId: r.id, WorkerId: worker, SnapshotId: snapID,
		Outcome: outcome, DurationSeconds: 1.5})
	return err
}

func (r *run) heartbeat(ctx context.Context, worker string) {
	r.c.t.Helper()
	if _, err := r.ws.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: r.id, WorkerId: worker}); err != nil {
		r.c.t.Fatalf("Heartbeat %s: %v", worker, err)
	}
}
