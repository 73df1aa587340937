package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
	"github.com/snapcoord/snapcoord/server/engine"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const secret = "scr_do-not-log-this-token"

type fakeWorkers struct {
	v1.UnimplementedWorkerServiceServer
}

func (fakeWorkers) Heartbeat(context.Context, *v1.HeartbeatRequest) (*v1.HeartbeatResponse, error) {
	return &v1.HeartbeatResponse{}, nil
}

func (fakeWorkers) CompleteStep(context.Context, *v1.CompleteStepRequest) (*v1.CompleteStepResponse, error) {
	return nil, status.Error(codes.FailedPrecondition, "the run is stopped")
}

func (fakeWorkers) StreamCommands(_ *v1.StreamCommandsRequest, s grpc.ServerStreamingServer[v1.StreamCommandsResponse]) error {
	return s.Send(&v1.StreamCommandsResponse{Command: &v1.Command{Seq: 1}})
}

// serveWorkers serves fakeWorkers with opts and returns a client and a
// function that stops the server once every RPC, interceptors included,
// has finished.
func serveWorkers(t *testing.T, opts ...grpc.ServerOption) (v1.WorkerServiceClient, func()) {
	t.Helper()
	srv := grpc.NewServer(opts...)
	v1.RegisterWorkerServiceServer(srv, fakeWorkers{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	stop := sync.OnceFunc(func() {
		_ = conn.Close()
		srv.GracefulStop()
	})
	t.Cleanup(stop)
	return v1.NewWorkerServiceClient(conn), stop
}

func TestOneLogLinePerRPCWithIDsAndNoToken(t *testing.T) {
	logs := &logsink.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, stop := serveWorkers(t, grpc.UnaryInterceptor(RPCLoggingUnary(log, CallLog{})), grpc.StreamInterceptor(RPCLoggingStream(log, CallLog{})))
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+secret)

	if _, err := c.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: "run-1", WorkerId: "w-1"}); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	if _, err := c.CompleteStep(ctx, &v1.CompleteStepRequest{RunId: "run-1", WorkerId: "w-2", Step: 3}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("CompleteStep: %v", err)
	}
	stream, err := c.StreamCommands(ctx, &v1.StreamCommandsRequest{RunId: "run-1", WorkerId: "w-3"})
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = stream.Recv()
	}
	if err != io.EOF {
		t.Fatalf("StreamCommands: %v", err)
	}
	// A call's line is written when its handler returns, which the client
	// may not wait for: the graceful stop does.
	stop()
	lines := parseLines(t, logs.String())

	want := map[string]struct{ code, worker string }{
		"Heartbeat":      {"OK", "w-1"},
		"CompleteStep":   {"FailedPrecondition", "w-2"},
		"StreamCommands": {"OK", "w-3"},
	}
	for _, l := range lines {
		if l["msg"] != "finished call" {
			t.Errorf("unexpected line %v: want only finished-call lines", l)
			continue
		}
		method, _ := l["grpc.method"].(string)
		w, ok := want[method]
		if !ok {
			t.Errorf("line for unexpected method %q", method)
			continue
		}
		delete(want, method)
		if l["grpc.code"] != w.code || l[FieldRunID] != "run-1" || l[FieldWorkerID] != w.worker || l["grpc.time_ms"] == nil {
			t.Errorf("%s line = %v; want code %s, run_id run-1, worker_id %s and grpc.time_ms", method, l, w.code, w.worker)
		}
	}
	if len(lines) != 3 || len(want) > 0 {
		t.Errorf("%d lines, none for %v", len(lines), want)
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("the token appears in the logs:\n%s", logs)
	}
}

func parseLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	// Not bufio.Scanner: it stops without a word at a line over 64 KiB,
	// and an unbounded log line is one thing these tests look for.
	for line := range strings.Lines(logs) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not JSON: %s", line)
		}
		lines = append(lines, m)
	}
	return lines
}

func newTelemetry(t *testing.T, env map[string]string) *Telemetry {
	t.Helper()
	tel, err := New(t.Context(), Options{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := tel.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return tel
}

func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the value of the series of family name with labels (a
// subset match), summing counters and histogram counts over matches.
func value(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	var sum float64
	found := false
outer:
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		for k, v := range labels {
			if got[k] != v {
				continue outer
			}
		}
		found = true
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, found
}

func TestMetricsExposeTheNamedSeries(t *testing.T) {
	tel := newTelemetry(t, nil)
	err := tel.ObserveEngine(func() engine.Stats {
		return engine.Stats{
			Runs: map[v1.RunState]int{v1.RunState_RUN_STATE_RUNNING: 2, v1.RunState_RUN_STATE_STOPPED: 1},
			Workers: map[v1.WorkerRole]map[v1.WorkerState]int{
				v1.WorkerRole_WORKER_ROLE_TRAINER: {v1.WorkerState_WORKER_STATE_LIVE: 8},
			},
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var obs engine.Observer = tel
	obs.Decision(ctx, "r", 1, v1.StepAction_STEP_ACTION_CONTINUE)
	obs.Decision(ctx, "r", 2, v1.StepAction_STEP_ACTION_CONTINUE)
	obs.Decision(ctx, "r", 3, v1.StepAction_STEP_ACTION_SAVE_AND_STOP)
	obs.DeadlineFired(ctx, "r", 3, v1.DeadlineFireKind_DEADLINE_FIRE_KIND_STEP)
	obs.DeadlineMissed(ctx, "r", engine.MissedSavingAtB)
	obs.CommandIssued(ctx, "save_at_deadline")
	obs.CommandDelivered(ctx, "save_at_deadline", 30*time.Millisecond)
	obs.SnapshotCompleted(ctx, "r", "snap-1", v1.SnapshotReason_SNAPSHOT_REASON_DEADLINE, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 12.5)
	tel.OnCommit(3, 2*time.Millisecond)

	fams := scrape(t, tel.Handler(false))
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"snapcoord_runs", map[string]string{"state": "running"}, 2},
		{"snapcoord_runs", map[string]string{"state": "stopped"}, 1},
		{"snapcoord_runs", map[string]string{"state": "cancelled"}, 0},
		{"snapcoord_workers", map[string]string{"role": "trainer", "state": "live"}, 8},
		{"snapcoord_workers", map[string]string{"role": "environment", "state": "live"}, 0},
		{"snapcoord_decisions_total", map[string]string{"action": "continue"}, 2},
		{"snapcoord_decisions_total", map[string]string{"action": "save_and_stop"}, 1},
		{"snapcoord_deadline_fires_total", map[string]string{"kind": "step"}, 1},
		{"snapcoord_deadline_missed_total", map[string]string{"cause": "saving_at_deadline"}, 1},
		{"snapcoord_commands_issued_total", map[string]string{"kind": "save_at_deadline"}, 1},
		{"snapcoord_command_delivery_duration_seconds", map[string]string{"kind": "save_at_deadline"}, 1},
		{"snapcoord_snapshot_duration_seconds", map[string]string{"reason": "deadline", "outcome": "saved"}, 1},
		{"snapcoord_store_commit_duration_seconds", nil, 1},
		{"snapcoord_store_commit_batches", nil, 1},
	}
	for _, c := range checks {
		got, ok := value(fams, c.name, c.labels)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if h := fams["snapcoord_snapshot_duration_seconds"].GetMetric()[0].GetHistogram(); h.GetSampleSum() != 12.5 {
		t.Errorf("snapshot duration sum = %v, want 12.5", h.GetSampleSum())
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}
}

func TestPprofOnlyWhenAsked(t *testing.T) {
	tel := newTelemetry(t, nil)
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline"} {
		for _, on := range []bool{false, true} {
			rec := httptest.NewRecorder()
			tel.Handler(on).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			if want := map[bool]int{false: http.StatusNotFound, true: http.StatusOK}[on]; rec.Code != want {
				t.Errorf("pprof %v: GET %s = %d, want %d", on, path, rec.Code, want)
			}
			if on && path == "/debug/pprof/" && !strings.Contains(rec.Body.String(), "goroutine") {
				t.Errorf("pprof index lists no goroutine profile:\n%s", rec.Body)
			}
		}
	}
}

// collector is a fake OTLP trace receiver.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu      sync.Mutex
	names   []string
	parents map[string]string            // span name -> hex parent span id
	attrs   map[string]map[string]string // span name -> attribute -> value, as text
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.names = append(c.names, s.GetName())
				if c.parents == nil {
					c.parents, c.attrs = map[string]string{}, map[string]map[string]string{}
				}
				c.parents[s.GetName()] = fmt.Sprintf("%x", s.GetParentSpanId())
				c.attrs[s.GetName()] = map[string]string{}
				for _, kv := range s.GetAttributes() {
					c.attrs[s.GetName()][kv.GetKey()] = attrText(kv.GetValue())
				}
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func attrText(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	}
	return v.String()
}

func (c *collector) spanNames() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.names...)
}

func TestTracesOffWithoutEndpoint(t *testing.T) {
	if tel := newTelemetry(t, map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}); tel.TracesExported() {
		t.Error("traces exported with no OTLP endpoint set")
	}
	if tel := newTelemetry(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"}); tel.TracesExported() {
		t.Error("traces exported with OTEL_TRACES_EXPORTER=none")
	}
}

func TestTracesExportedWithOTLP(t *testing.T) {
	col := &collector{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, col)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	// The exporter reads its endpoint from the process environment.
	endpoint := "http://" + lis.Addr().String()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)

	tel, err := New(t.Context(), Options{LookupEnv: func(k string) (string, bool) {
		if k == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			return endpoint, true
		}
		return "", false
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !tel.TracesExported() {
		t.Fatal("traces not exported with OTEL_EXPORTER_OTLP_ENDPOINT set")
	}
	c, stop := serveWorkers(t, grpc.StatsHandler(tel.StatsHandler()))
	if _, err := c.Heartbeat(t.Context(), &v1.HeartbeatRequest{RunId: "r", WorkerId: "w"}); err != nil {
		t.Fatal(err)
	}
	tel.OnCommit(2, time.Millisecond)
	// A decision is a child of the call that made it (the engine passes
	// the RPC's context); a timer's fire has no caller and is a root.
	callCtx, call := tel.Tracer().Start(t.Context(), "CompleteStep call")
	tel.Decision(callCtx, "r", 7, v1.StepAction_STEP_ACTION_SAVE_AND_STOP)
	call.End()
	tel.DeadlineFired(t.Context(), "r", 7, v1.DeadlineFireKind_DEADLINE_FIRE_KIND_STEP)
	tel.SnapshotCompleted(t.Context(), "r", "snap-2", v1.SnapshotReason_SNAPSHOT_REASON_DEADLINE, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 3)
	stop() // the server span ends after the client has its answer
	// Shutdown flushes the batch processor: the spans are exported by the
	// time it returns.
	if err := tel.Shutdown(t.Context()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	col.mu.Lock()
	decisionParent, fireParent := col.parents["deadline.decision"], col.parents["deadline.fire"]
	col.mu.Unlock()
	if want := call.SpanContext().SpanID().String(); decisionParent != want {
		t.Errorf("deadline.decision parent %q, want the call's span %q", decisionParent, want)
	}
	if fireParent != "" {
		t.Errorf("deadline.fire parent %q, want a root span", fireParent)
	}
	got := strings.Join(col.spanNames(), ",")
	for _, want := range []string{"snapcoord.v1.WorkerService/Heartbeat", "store.commit", "deadline.decision", "deadline.fire", "snapshot"} {
		if !strings.Contains(got, want) {
			t.Errorf("exported spans %q lack %q", got, want)
		}
	}
	// Each span says which run (worker, step, snapshot) it is about.
	col.mu.Lock()
	defer col.mu.Unlock()
	for span, want := range map[string]map[string]string{
		"snapcoord.v1.WorkerService/Heartbeat": {AttrRunID: "r", AttrWorkerID: "w"},
		"deadline.decision":                    {AttrRunID: "r", AttrStep: "7"},
		"deadline.fire":                        {AttrRunID: "r", AttrStep: "7"},
		"snapshot":                             {AttrRunID: "r", AttrSnapshotID: "snap-2"},
	} {
		for k, v := range want {
			if got := col.attrs[span][k]; got != v {
				t.Errorf("span %s: %s = %q, want %q", span, k, got, v)
			}
		}
	}
}

// With debug on, a routine call that succeeds logs at debug; one that
// fails keeps its level (a NOT_FOUND heartbeat is info, like any other
// call's), and other calls log at info.
func TestRoutineCallsLogAtDebug(t *testing.T) {
	var buf bytes.Buffer
	intercept := RPCLoggingUnary(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), CallLog{})
	for _, c := range []struct {
		method string
		err    error
	}{
		{"Heartbeat", nil},
		{"PollCommands", status.Error(codes.Unavailable, "shutting down")},
		{"CompleteStep", nil},
		{"RegisterWorker", nil},
		{"Heartbeat", status.Error(codes.NotFound, "worker_id: not registered")},
	} {
		info := &grpc.UnaryServerInfo{FullMethod: "/snapcoord.v1.WorkerService/" + c.method}
		_, _ = intercept(t.Context(), &v1.HeartbeatRequest{}, info, func(context.Context, any) (any, error) { return nil, c.err })
	}
	var levels []string
	for _, l := range parseLines(t, buf.String()) {
		levels = append(levels, fmt.Sprint(l["level"]))
	}
	if want := []string{"DEBUG", "WARN", "DEBUG", "INFO", "INFO"}; !slices.Equal(levels, want) {
		t.Fatalf("levels %v, want %v", levels, want)
	}
}

// With debug off, a routine call that succeeds quickly writes nothing; one
// that fails, or takes --slow-call or longer, is logged like any other
// call, with its own start and duration. The handlers run in a synctest
// bubble, so their seconds take no time.
func TestRoutineCallsSkipLoggingUnlessTheyFailOrAreSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		intercept := RPCLoggingUnary(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), CallLog{Slow: 2 * time.Second})
		call := func(method string, took time.Duration, err error) {
			info := &grpc.UnaryServerInfo{FullMethod: "/snapcoord.v1.WorkerService/" + method}
			req := &v1.PollCommandsRequest{RunId: "run-1", WorkerId: "w-1"}
			_, got := intercept(t.Context(), req, info, func(context.Context, any) (any, error) {
				time.Sleep(took)
				return nil, err
			})
			if got != err {
				t.Fatalf("%s returned %v, want %v", method, got, err)
			}
		}
		start := time.Now()
		call("Heartbeat", 1500*time.Millisecond, nil)
		call("PollCommands", 1500*time.Millisecond, nil)
		call("CompleteStep", 1500*time.Millisecond, nil)
		if buf.Len() != 0 {
			t.Fatalf("successful routine calls quicker than --slow-call logged at info:\n%s", &buf)
		}
		polled := time.Now()
		call("PollCommands", 1500*time.Millisecond, status.Error(codes.Unavailable, "the coordinator is shutting down"))
		call("CompleteStep", 2500*time.Millisecond, nil)

		lines := parseLines(t, buf.String())
		if len(lines) != 2 {
			t.Fatalf("%d lines, want the failed poll's and the slow step's:\n%s", len(lines), &buf)
		}
		for _, field := range []string{`"grpc.time_ms"`, `"grpc.start_time"`} {
			if n := strings.Count(buf.String(), field); n != 2 {
				t.Errorf("%s appears %d times in %s", field, n, &buf)
			}
		}
		l := lines[0]
		if l["level"] != "WARN" || l["grpc.method"] != "PollCommands" || l["grpc.code"] != "Unavailable" || l[FieldRunID] != "run-1" || l[FieldWorkerID] != "w-1" {
			t.Errorf("line = %v; want a WARN for PollCommands, Unavailable, run-1, w-1", l)
		}
		if l["grpc.time_ms"] != "1500" {
			t.Errorf("grpc.time_ms = %v, want the call's 1500", l["grpc.time_ms"])
		}
		if want := polled.Format(time.RFC3339); l["grpc.start_time"] != want || !polled.After(start) {
			t.Errorf("grpc.start_time = %v, want the call's start %s", l["grpc.start_time"], want)
		}
		if l := lines[1]; l["level"] != "INFO" || l["grpc.method"] != "CompleteStep" || l["grpc.code"] != "OK" || l["grpc.time_ms"] != "2500" {
			t.Errorf("line = %v; want an INFO for the 2.5 s CompleteStep", l)
		}
	})
}

// --log-calls all logs every successful routine call at info.
func TestLogCallsAllLogsRoutineSuccesses(t *testing.T) {
	var buf bytes.Buffer
	intercept := RPCLoggingUnary(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), CallLog{All: true, Slow: time.Hour})
	for _, method := range []string{"CompleteStep", "Heartbeat", "ReportSnapshot"} {
		info := &grpc.UnaryServerInfo{FullMethod: "/snapcoord.v1.WorkerService/" + method}
		_, _ = intercept(t.Context(), &v1.HeartbeatRequest{}, info, func(context.Context, any) (any, error) { return nil, nil })
	}
	var got []string
	for _, l := range parseLines(t, buf.String()) {
		got = append(got, fmt.Sprint(l["level"], " ", l["grpc.method"]))
	}
	if want := []string{"INFO CompleteStep", "INFO Heartbeat", "INFO ReportSnapshot"}; !slices.Equal(got, want) {
		t.Fatalf("lines %v, want %v", got, want)
	}
}

// fakeServerStream is a server stream whose one request is req.
type fakeServerStream struct {
	grpc.ServerStream // nil: calls other than these would panic
	ctx               context.Context
	req               *v1.StreamCommandsRequest
}

func (s *fakeServerStream) Context() context.Context { return s.ctx }

func (s *fakeServerStream) RecvMsg(m any) error {
	proto.Merge(m.(proto.Message), s.req)
	return nil
}

// A stream's line is written when it ends, with its own start time and
// duration and the ids of its first request. The stream runs in a synctest
// bubble, so its 2.5 s take no time.
func TestStreamLoggedWhenItEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		intercept := RPCLoggingStream(slog.New(slog.NewJSONHandler(&buf, nil)), CallLog{})
		info := &grpc.StreamServerInfo{FullMethod: "/snapcoord.v1.WorkerService/StreamCommands", IsServerStream: true}
		ss := &fakeServerStream{ctx: t.Context(), req: &v1.StreamCommandsRequest{RunId: "run-1", WorkerId: "w-1"}}
		start := time.Now()
		ended := status.Error(codes.FailedPrecondition, "superseded")
		err := intercept(nil, ss, info, func(_ any, s grpc.ServerStream) error {
			if err := s.RecvMsg(&v1.StreamCommandsRequest{}); err != nil {
				return err
			}
			time.Sleep(2500 * time.Millisecond)
			if buf.Len() != 0 {
				t.Errorf("logged before the stream ended:\n%s", &buf)
			}
			return ended
		})
		if err != ended {
			t.Fatalf("interceptor returned %v, want the handler's %v", err, ended)
		}
		lines := parseLines(t, buf.String())
		if len(lines) != 1 {
			t.Fatalf("%d lines, want 1:\n%s", len(lines), &buf)
		}
		l := lines[0]
		if l["grpc.method"] != "StreamCommands" || l["grpc.code"] != "FailedPrecondition" || l[FieldRunID] != "run-1" || l[FieldWorkerID] != "w-1" {
			t.Errorf("line = %v; want StreamCommands, FailedPrecondition, run-1, w-1", l)
		}
		if l["grpc.time_ms"] != "2500" || l["grpc.start_time"] != start.Format(time.RFC3339) {
			t.Errorf("grpc.time_ms %v, grpc.start_time %v; want the stream's 2500 and %s", l["grpc.time_ms"], l["grpc.start_time"], start.Format(time.RFC3339))
		}
	})
}

// Every worker's command stream ends when its run stops, thousands at
// once: one that ends well is not logged at info (unless --log-calls all);
// an operator's WatchRun is.
func TestRoutineStreamsThatEndWellAreQuiet(t *testing.T) {
	for _, c := range []struct {
		method string
		all    bool
		lines  int
	}{
		{"/snapcoord.v1.WorkerService/StreamCommands", false, 0},
		{"/snapcoord.v1.WorkerService/StreamCommands", true, 1},
		{"/snapcoord.v1.RunService/WatchRun", false, 1},
	} {
		var buf bytes.Buffer
		intercept := RPCLoggingStream(slog.New(slog.NewJSONHandler(&buf, nil)), CallLog{All: c.all})
		ss := &fakeServerStream{ctx: t.Context(), req: &v1.StreamCommandsRequest{RunId: "run-1"}}
		err := intercept(nil, ss, &grpc.StreamServerInfo{FullMethod: c.method, IsServerStream: true}, func(any, grpc.ServerStream) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		if n := len(parseLines(t, buf.String())); n != c.lines {
			t.Errorf("%s (all %v) ending OK: %d lines at info, want %d:\n%s", c.method, c.all, n, c.lines, &buf)
		}
	}
}
