package client_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/coordtest"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
	coord "github.com/snapcoord/snapcoord/server/coordinator"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/server/grpcserver"
)

// The worker helper runs goroutines; after Close none may be left.
func TestMain(m *testing.M) { goleak.VerifyTestMain(withBinRemoved{m}) }

// withBinRemoved removes the snapcoord binary the freeze tests built.
type withBinRemoved struct{ *testing.M }

func (m withBinRemoved) Run() int {
	defer snapcoord.Remove()
	return m.M.Run()
}

// coordinator is the assembled snapcoord coordinator in this process (the
// production interceptor chain, bbolt in a temp dir) on a loopback port that
// stays the same across restarts, plus a gate in front of it that tests use
// to count, fail or record calls.
type coordinator struct {
	t    *testing.T
	cfg  coord.Config
	opts []coord.Option
	addr string
	gate *gate

	mu       sync.Mutex
	instance *coordtest.Instance // nil when stopped
}

// adminToken opens RunService on test coordinators.
const adminToken = "client-tests-admin-token"

func startCoordinator(t *testing.T) *coordinator {
	t.Helper()
	return startCoordinatorWith(t, nil)
}

// startCoordinatorWith adds opts (TLS credentials) to the gRPC server's.
func startCoordinatorWith(t *testing.T, opts []grpc.ServerOption) *coordinator {
	t.Helper()
	return startCoordinatorLease(t, opts, 500*time.Millisecond) // short enough for leases to lapse within a test
}

// startRestartable is startCoordinator for tests that stop the coordinator
// and start it again while workers run: its lease outlasts a restart (the
// drain, up to a second, then the client's reconnect, up to a second more:
// followMaxWait), as a production lease does. With the short lease, every
// restart on a loaded machine also lapsed the workers' leases: they were
// declared LOST (a snapshot then completed without them) and registered
// again, which is another test's subject.
func startRestartable(t *testing.T) *coordinator {
	t.Helper()
	return startCoordinatorLease(t, nil, 10*time.Second)
}

func startCoordinatorLease(t *testing.T, opts []grpc.ServerOption, lease time.Duration) *coordinator {
	t.Helper()
	g := newGate()
	cfg := coordtest.Config(t.TempDir())
	cfg.AdminTokens = []string{adminToken}
	cfg.HeartbeatInterval, cfg.LeaseTTL = 100*time.Millisecond, lease
	c := &coordinator{t: t, cfg: cfg, gate: g, opts: []coord.Option{
		coord.WithEngine(func(o *engine.Options) { o.MaxPollWait = 2 * time.Second }),
		coord.WithOuterLayer(grpcserver.Layer{Unary: g.unary, Stream: g.stream}),
		coord.WithServerOptions(opts...),
	}}
	c.serve()
	c.addr = c.instance.Addr()
	c.cfg.Listen = c.addr
	t.Cleanup(c.shutdown)
	return c
}

// serve starts an instance over the data directory.
func (c *coordinator) serve() {
	in := coordtest.Serve(c.t, c.cfg, c.opts...)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.instance = in
}

func (c *coordinator) shutdown() {
	c.mu.Lock()
	in := c.instance
	c.instance = nil
	c.mu.Unlock()
	if in != nil {
		in.Stop()
	}
}

// restart stops the coordinator and starts it again on the same data
// directory and address, as a restarted process would.
func (c *coordinator) restart() {
	c.shutdown()
	c.serve()
}

// moveTo stops the coordinator and starts it again on the same data
// directory at addr, as if another machine took over its data.
func (c *coordinator) moveTo(addr string) {
	c.shutdown()
	c.addr, c.cfg.Listen = addr, addr
	c.serve()
}

// dial returns a client with the admin token and the run token (may be
// empty), closed at cleanup.
func (c *coordinator) dial(runToken string, opts ...client.Option) *client.Client {
	c.t.Helper()
	return dialList(c.t, c.addr, runToken, opts...)
}

// dialList is dial to a comma-separated address list.
func dialList(t *testing.T, list, runToken string, opts ...client.Option) *client.Client {
	t.Helper()
	opts = append([]client.Option{client.WithInsecure(), client.WithRunToken(runToken), client.WithToken(adminToken)}, opts...)
	cl, err := client.Dial(list, opts...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// gate sits in front of the coordinator's handlers.
type gate struct {
	mu        sync.Mutex
	calls     map[string]int    // by method name ("GetRun")
	auth      map[string]string // the last authorization header, by method name
	failNext  map[string]int    // calls still to fail with UNAVAILABLE, by method name
	loseReply map[string]int    // calls still to run whose answer is then lost (UNAVAILABLE), by method name
	// unknownOutcome counts calls still to run that are then answered
	// UNAVAILABLE OUTCOME_UNKNOWN, as by a coordinator that lost its
	// leadership while their commit waited, by method name.
	unknownOutcome map[string]int
	rejectStreams  bool          // StreamCommands answers UNIMPLEMENTED
	streamed       chan struct{} // closed at the first StreamCommands
	partitioned    bool          // Heartbeat and RegisterWorker answer UNAVAILABLE
	// registerRefused is closed at the first RegisterWorker the partition
	// refused: a worker has presumed its lease lost.
	registerRefused chan struct{}
	// alter, if set, changes a unary call's answer, as a newer coordinator
	// might give it.
	alter func(name string, resp any)
}

func newGate() *gate {
	return &gate{calls: map[string]int{}, auth: map[string]string{}, failNext: map[string]int{}, loseReply: map[string]int{},
		unknownOutcome: map[string]int{}, streamed: make(chan struct{}), registerRefused: make(chan struct{})}
}

func (g *gate) admit(ctx context.Context, fullMethod string) error {
	name := fullMethod[strings.LastIndex(fullMethod, "/")+1:]
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls[name]++
	if name == "StreamCommands" && g.calls[name] == 1 {
		close(g.streamed)
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		g.auth[name] = strings.Join(md.Get("authorization"), ",")
	}
	switch {
	case g.failNext[name] > 0:
		g.failNext[name]--
		return status.Error(codes.Unavailable, "gate: injected failure")
	case g.rejectStreams && name == "StreamCommands":
		return status.Error(codes.Unimplemented, "gate: no streaming here")
	case g.partitioned && (name == "Heartbeat" || name == "RegisterWorker"):
		if name == "RegisterWorker" && g.registerRefused != nil {
			close(g.registerRefused)
			g.registerRefused = nil
		}
		return status.Error(codes.Unavailable, "gate: partitioned")
	}
	return nil
}

func (g *gate) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := g.admit(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	resp, err := handler(ctx, req)
	g.mu.Lock()
	defer g.mu.Unlock()
	name := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	if g.loseReply[name] > 0 {
		g.loseReply[name]--
		return nil, status.Error(codes.Unavailable, "gate: the answer was lost")
	}
	if g.unknownOutcome[name] > 0 {
		g.unknownOutcome[name]--
		st, _ := status.New(codes.Unavailable, "gate: the commit was not confirmed").WithDetails(
			&errdetails.ErrorInfo{Reason: "OUTCOME_UNKNOWN", Domain: "snapcoord.v1"})
		return nil, st.Err()
	}
	if g.alter != nil && err == nil {
		g.alter(name, resp)
	}
	return resp, err
}

func (g *gate) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := g.admit(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

func (g *gate) count(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[name]
}

func (g *gate) lastAuth(name string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.auth[name]
}

func (g *gate) set(f func(g *gate)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f(g)
}

// turnSpec: environment snapshots on, a deadline an hour away, so nothing
// fires unless a test fires it.
func turnSpec(worldSize int32) *v1.RunSpec { return spectest.Turn(worldSize, "00:01:00:00") }

// createRun creates a run and returns a client holding its token.
func (c *coordinator) createRun(id string, spec *v1.RunSpec) *client.Client {
	c.t.Helper()
	admin := c.dial("")
	resp, err := admin.Runs.CreateRun(c.t.Context(), &v1.CreateRunRequest{RunId: id, Spec: spec})
	if err != nil {
		c.t.Fatalf("CreateRun: %v", err)
	}
	return c.dial(resp.GetRunToken())
}

// awaitEvent follows the run's events until one satisfies match.
func awaitEvent(t *testing.T, admin *client.Client, runID, what string, match func(*v1.RunEvent) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	found := errors.New("found")
	err := admin.WatchEvents(ctx, runID, 0, true, func(ev *v1.RunEvent) error {
		if match(ev) {
			return found
		}
		return nil
	})
	if !errors.Is(err, found) {
		t.Fatalf("no event: %s (%v)", what, err)
	}
}

// nextCommand receives one command or fails the test.
func nextCommand(t *testing.T, w *client.Worker) *v1.Command {
	t.Helper()
	select {
	case cmd, ok := <-w.Commands():
		if !ok {
			t.Fatalf("commands closed early: %v", w.Err())
		}
		return cmd
	case <-time.After(15 * time.Second):
		t.Fatal("no command within 15 s")
	}
	return nil
}

func workerState(t *testing.T, admin *client.Client, runID, workerID string) *v1.Worker {
	t.Helper()
	resp, err := admin.Runs.ListWorkers(t.Context(), &v1.ListWorkersRequest{RunId: runID})
	if err != nil {
		t.Fatalf("ListWorkers: %v", err)
	}
	for _, w := range resp.GetWorkers() {
		if w.GetWorkerId() == workerID {
			return w
		}
	}
	t.Fatalf("worker %s not listed", workerID)
	return nil
}

// testLogger shows the worker helper's log with the test's output.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

func closeWorker(t *testing.T, w interface{ Close(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}
