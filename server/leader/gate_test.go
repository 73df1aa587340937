package leader

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/server/transport"
	"github.com/snapcoord/snapcoord/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newEngine is a real engine on a bbolt file in t.TempDir().
func newEngine(t *testing.T) *engine.Engine {
	t.Helper()
	db, err := store.Open(filepath.Join(t.TempDir(), "snapcoord.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(t.Context(), db, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		eng.Close()
		_ = db.Close()
	})
	return eng
}

const (
	createRun       = "/snapcoord.v1.RunService/CreateRun"
	triggerDeadline = "/snapcoord.v1.RunService/TriggerDeadline"
	heartbeat       = "/snapcoord.v1.WorkerService/Heartbeat"
	getRun          = "/snapcoord.v1.RunService/GetRun"
	healthChk       = "/grpc.health.v1.Health/Check"
)

// wantNotLeader checks err is UNAVAILABLE with the NOT_LEADER detail
// naming leader.
func wantNotLeader(t *testing.T, err error, leader string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || st.Message() != "not the leader; the leader is at "+leader {
		t.Fatalf("err = %v; want UNAVAILABLE \"not the leader; the leader is at %s\"", err, leader)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "NOT_LEADER" && info.GetDomain() == "snapcoord.v1" {
			if got, ok := info.GetMetadata()["leader"]; !ok || got != leader {
				t.Fatalf("ErrorInfo leader = %q (present %v), want %q", got, ok, leader)
			}
			return
		}
	}
	t.Fatalf("no NOT_LEADER ErrorInfo in %v", st.Details())
}

func unaryCall(g *Gate, method string, handler grpc.UnaryHandler) error {
	_, err := g.UnaryServerInterceptor()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: method}, handler)
	return err
}

func TestFollowerRefusesWithTheLeadersAddress(t *testing.T) {
	var leading []bool
	g := New(func(l bool) { leading = append(leading, l) })
	ran := false
	handler := func(context.Context, any) (any, error) { ran = true; return nil, nil }

	wantNotLeader(t, unaryCall(g, createRun, handler), "")
	g.Follow("10.0.0.2:7070")
	wantNotLeader(t, unaryCall(g, heartbeat, handler), "10.0.0.2:7070")
	if ran {
		t.Fatal("a follower ran a RunService or WorkerService handler")
	}
	// Other services (health, reflection) are not the gate's business.
	if err := unaryCall(g, healthChk, handler); err != nil || !ran {
		t.Fatalf("health call: err %v, ran %v; want it through", err, ran)
	}
	if len(leading) != 0 {
		t.Fatalf("health told %v without a change of leadership", leading)
	}
}

func TestLeaderServesWithItsTermsEngine(t *testing.T) {
	var leading []bool
	g := New(func(l bool) { leading = append(leading, l) })
	eng := newEngine(t)
	g.Lead(eng, "10.0.0.1:7070", nil)
	g.Follow("10.0.0.2:7070") // stale news while leading: ignored
	var got *engine.Engine
	err := unaryCall(g, createRun, func(ctx context.Context, _ any) (any, error) { got = g.For(ctx); return nil, nil })
	if err != nil || got != eng {
		t.Fatalf("leading: err %v, engine %p; want nil and the term's %p", err, got, eng)
	}
	if addr, self := g.Leader(); addr != "10.0.0.1:7070" || !self {
		t.Fatalf("Leader() = %q, %v; want itself", addr, self)
	}
	if g.StepDown() != eng {
		t.Fatal("StepDown did not return the term's engine")
	}
	if g.StepDown() != nil {
		t.Fatal("a second StepDown returned an engine")
	}
	wantNotLeader(t, unaryCall(g, createRun, func(context.Context, any) (any, error) { return nil, nil }), "")
	if len(leading) != 2 || !leading[0] || leading[1] {
		t.Fatalf("health told %v; want [true false]", leading)
	}
}

// A call in flight when the term ends is cancelled and answered
// NOT_LEADER, and StepDown returns only once it has: the engine is closed
// after no call of its term can still use it.
func TestStepDownEndsCallsInFlightFirst(t *testing.T) {
	g := New(func(bool) {})
	g.Lead(newEngine(t), "10.0.0.1:7070", nil)
	entered := make(chan struct{})
	var returned atomic.Bool
	errc := make(chan error, 1)
	go func() {
		errc <- unaryCall(g, heartbeat, func(ctx context.Context, _ any) (any, error) {
			close(entered)
			<-ctx.Done()
			returned.Store(true)
			return nil, ctx.Err()
		})
	}()
	<-entered
	g.StepDown()
	if !returned.Load() {
		t.Fatal("StepDown returned before the call in flight did")
	}
	wantNotLeader(t, <-errc, "")
}

func TestStreamOfAnEndedTermIsRefused(t *testing.T) {
	g := New(func(bool) {})
	g.Lead(newEngine(t), "10.0.0.1:7070", nil)
	entered := make(chan struct{})
	errc := make(chan error, 1)
	info := &grpc.StreamServerInfo{FullMethod: v1.RunService_WatchRun_FullMethodName, IsServerStream: true}
	go func() {
		errc <- g.StreamServerInterceptor()(nil, fakeStream{ctx: context.Background()}, info, func(_ any, ss grpc.ServerStream) error {
			close(entered)
			<-ss.Context().Done()
			return nil // even a clean end
		})
	}()
	<-entered
	g.StepDown()
	wantNotLeader(t, <-errc, "")
}

// A worker's command stream parked in the engine ends when the term does,
// answered NOT_LEADER, and StepDown returns once it has; the gate ends it
// through the engine, without a cancellable context of its own per stream
// (thousands of workers keep one each).
func TestCommandStreamEndsWithTheTerm(t *testing.T) {
	g := New(func(bool) {})
	eng := newEngine(t)
	g.Lead(eng, "10.0.0.1:7070", nil)
	if _, err := eng.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "r", Spec: &v1.RunSpec{TrainerWorldSize: 1}}); err != nil {
		t.Fatal(err)
	}
	reg, err := eng.RegisterWorker(t.Context(), &v1.RegisterWorkerRequest{RunId: "r", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-0"})
	if err != nil {
		t.Fatal(err)
	}
	client, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ownDone atomic.Bool
	entered := make(chan struct{})
	errc := make(chan error, 1)
	info := &grpc.StreamServerInfo{FullMethod: v1.WorkerService_StreamCommands_FullMethodName, IsServerStream: true}
	go func() {
		errc <- g.StreamServerInterceptor()(nil, fakeStream{ctx: client}, info, func(_ any, ss grpc.ServerStream) error {
			ownDone.Store(ss.Context().Done() != client.Done())
			close(entered)
			req := &v1.StreamCommandsRequest{RunId: "r", WorkerId: reg.GetWorkerId(), AfterSeq: reg.GetLastCommandSeq()}
			return g.For(ss.Context()).StreamCommands(ss.Context(), req, func(*v1.Command) error { return nil })
		})
	}()
	<-entered
	g.StepDown()
	wantNotLeader(t, <-errc, "")
	if ownDone.Load() {
		t.Error("the gate gave a command stream a cancellable context of its own; want the client stream's")
	}
}

// A command stream that arrives while the term is in doubt waits for the
// store to confirm it; when the term ends meanwhile, the stream is refused
// NOT_LEADER and StepDown returns, though nothing else ends that wait.
func TestCommandStreamConfirmingEndsWithTheTerm(t *testing.T) {
	g := New(func(bool) {})
	hold := &askedHold{asked: make(chan struct{})}
	g.Lead(newEngine(t), "10.0.0.1:7070", hold)
	errc := make(chan error, 1)
	info := &grpc.StreamServerInfo{FullMethod: v1.WorkerService_StreamCommands_FullMethodName, IsServerStream: true}
	go func() {
		errc <- g.StreamServerInterceptor()(nil, fakeStream{ctx: context.Background()}, info, func(any, grpc.ServerStream) error {
			return errors.New("a stream of an unconfirmed term reached its handler")
		})
	}()
	<-hold.asked
	stepped := make(chan struct{})
	go func() {
		g.StepDown()
		close(stepped)
	}()
	select {
	case <-stepped:
	case <-time.After(10 * time.Second):
		t.Fatal("StepDown still waits, after 10 s, for a command stream asking the store to confirm the term")
	}
	wantNotLeader(t, <-errc, "")
}

// askedHold is a term in doubt whose store never answers: Confirm waits
// until its context ends.
type askedHold struct{ asked chan struct{} }

func (h *askedHold) Held() bool { return false }
func (h *askedHold) Confirm(ctx context.Context) bool {
	close(h.asked)
	<-ctx.Done()
	return false
}

type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (f fakeStream) Context() context.Context { return f.ctx }

// A leader paused past its election lease may have been replaced before
// it notices: an answer its handler gave from memory once the term can no
// longer be confirmed is withheld (a read's is NOT_LEADER; a call that may
// have changed something, as a heartbeat that brought a LOST worker back
// does, is OUTCOME_UNKNOWN), and a call arriving then is not let in.
func TestAnswerAfterTheTermLapsedIsWithheld(t *testing.T) {
	g := New(func(bool) {})
	held := &fakeHold{}
	held.Store(true)
	g.Lead(newEngine(t), "10.0.0.1:7070", held)
	paused := func(context.Context, any) (any, error) {
		held.Store(false) // the process stopped here, and its lease lapsed
		return "answered from memory", nil
	}
	err := unaryCall(g, heartbeat, paused)
	if st := status.Convert(err); st.Code() != codes.Unavailable || transport.Reason(err) != transport.ReasonOutcomeUnknown {
		t.Fatalf("a heartbeat answered after the lease lapsed: %v; want UNAVAILABLE OUTCOME_UNKNOWN", err)
	}
	held.Store(true)
	wantNotLeader(t, unaryCall(g, getRun, paused), "")

	ran := false
	wantNotLeader(t, unaryCall(g, heartbeat, func(context.Context, any) (any, error) { ran = true; return nil, nil }), "")
	if ran {
		t.Fatal("a call was let into a term not known to be held")
	}
	if _, err := g.ListRuns(context.Background(), nil); !errors.Is(err, engine.ErrUnavailable) || !strings.Contains(err.Error(), "cannot confirm that it still leads") {
		t.Fatalf("a status page read in a lapsed term: %v; want ErrUnavailable saying leadership is unconfirmed", err)
	}

	held.confirms.Store(true) // etcd renews it after all: a short pause, or quorum back
	if err := unaryCall(g, heartbeat, func(context.Context, any) (any, error) { return nil, nil }); err != nil {
		t.Fatalf("a call whose term the store confirmed: %v", err)
	}
	held.Store(true)
	if err := unaryCall(g, heartbeat, func(context.Context, any) (any, error) { return nil, nil }); err != nil {
		t.Fatalf("a call once the lease was renewed: %v", err)
	}
}

// fakeHold is a term's Hold: Held as stored, Confirm as confirms.
type fakeHold struct {
	atomic.Bool
	confirms atomic.Bool
}

func (h *fakeHold) Held() bool                   { return h.Load() }
func (h *fakeHold) Confirm(context.Context) bool { return h.confirms.Load() }

// A call whose change is committing when the term ends is answered
// OUTCOME_UNKNOWN, not NOT_LEADER: the commit may still land (on etcd, a
// transaction waiting out a quorum loss does, unless a successor's fence
// refuses it). Here it lands, on a real engine behind the real transport.
func TestStepDownAnswersACommitInFlightOutcomeUnknown(t *testing.T) {
	var holding atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	db, err := store.Open(filepath.Join(t.TempDir(), "snapcoord.db"), store.Options{OnCommit: func(int, time.Duration) {
		if holding.CompareAndSwap(true, false) {
			close(held)
			<-release
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(t.Context(), db, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var released sync.Once
	unhold := func() { released.Do(func() { close(release) }) }
	t.Cleanup(func() {
		unhold()
		eng.Close()
		_ = db.Close()
	})
	g := New(func(bool) {})
	g.Lead(eng, "10.0.0.1:7070", nil)
	runs := transport.NewRunServer(g, slog.New(slog.DiscardHandler))
	call := func(method string, h func(ctx context.Context) error) error {
		return unaryCall(g, method, func(ctx context.Context, _ any) (any, error) { return nil, h(ctx) })
	}
	if err := call(createRun, func(ctx context.Context) error {
		_, err := runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: "r", Spec: &v1.RunSpec{TrainerWorldSize: 1}})
		return err
	}); err != nil {
		t.Fatal(err)
	}

	holding.Store(true)
	errc := make(chan error, 1)
	go func() {
		errc <- call(triggerDeadline, func(ctx context.Context) error {
			_, err := runs.TriggerDeadline(ctx, &v1.TriggerDeadlineRequest{RunId: "r"})
			return err
		})
	}()
	<-held
	g.StepDown()
	err = <-errc
	if st := status.Convert(err); st.Code() != codes.Unavailable || transport.Reason(err) != transport.ReasonOutcomeUnknown {
		t.Fatalf("a trigger committing when the term ended: %v; want UNAVAILABLE OUTCOME_UNKNOWN", err)
	}
	unhold()
	run, err := eng.GetRun(t.Context(), &v1.GetRunRequest{RunId: "r"})
	if err != nil || run.Run.FiredAt == nil {
		t.Fatalf("the trigger's commit: %v, %v; want it landed", run.GetRun(), err)
	}
}
