package grpcserver_test

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

func TestCreateGetCancelRun(t *testing.T) {
	ts := newTestServer(t)
	created := createRun(t, ts, "grpo-7b-0042")
	if created.GetRunToken() == "" || created.GetRun().GetState() != v1.RunState_RUN_STATE_PENDING {
		t.Fatalf("CreateRun = state %v, token %q; want PENDING and a token", created.GetRun().GetState(), created.GetRunToken())
	}

	// No worker yet: the repeat gets a new token, in case the first answer
	// was lost.
	again, err := ts.runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "grpo-7b-0042", Spec: testSpec(2)})
	if err != nil || again.GetRunToken() == "" || again.GetRunToken() == created.GetRunToken() || !again.GetTokenReissued() {
		t.Errorf("CreateRun(same spec) = token %q (reissued %v), %v; want OK with a new token", again.GetRunToken(), again.GetTokenReissued(), err)
	}
	_, err = ts.runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "grpo-7b-0042", Spec: testSpec(4)})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("CreateRun(other spec) = %v, want ALREADY_EXISTS", err)
	}

	got, err := ts.runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "grpo-7b-0042"})
	if err != nil || !proto.Equal(got.GetRun(), again.GetRun()) {
		t.Errorf("GetRun = %v, %v; want the created run %v", got.GetRun(), err, again.GetRun())
	}

	cancelled, err := ts.runs.CancelRun(t.Context(), &v1.CancelRunRequest{RunId: "grpo-7b-0042", Reason: "test"})
	if err != nil || cancelled.GetRun().GetState() != v1.RunState_RUN_STATE_CANCELLED {
		t.Errorf("CancelRun = %v, %v; want CANCELLED", cancelled.GetRun().GetState(), err)
	}
}

func TestListRunsPagesAndFilters(t *testing.T) {
	ts := newTestServer(t)
	ids := []string{"run-a", "run-b", "run-c", "run-d", "run-e"}
	for _, id := range slices.Backward(ids) { // created out of order
		createRun(t, ts, id)
	}
	if _, err := ts.runs.CancelRun(t.Context(), &v1.CancelRunRequest{RunId: "run-c"}); err != nil {
		t.Fatalf("CancelRun: %v", err)
	}

	if got := listRunIDs(t, ts, 2, v1.RunState_RUN_STATE_UNSPECIFIED); !slices.Equal(got, ids) {
		t.Errorf("ListRuns pages = %v, want %v", got, ids)
	}
	if got := listRunIDs(t, ts, 0, v1.RunState_RUN_STATE_CANCELLED); !slices.Equal(got, []string{"run-c"}) {
		t.Errorf("ListRuns(CANCELLED) = %v, want [run-c]", got)
	}
	want := []string{"run-a", "run-b", "run-d", "run-e"}
	if got := listRunIDs(t, ts, 3, v1.RunState_RUN_STATE_PENDING); !slices.Equal(got, want) {
		t.Errorf("ListRuns(PENDING) = %v, want %v", got, want)
	}
}

// listRunIDs follows next_page_token to the end, checking page sizes.
func listRunIDs(t *testing.T, ts *testServer, pageSize int32, state v1.RunState) []string {
	t.Helper()
	var ids []string
	req := &v1.ListRunsRequest{PageSize: pageSize, State: state}
	for range 100 {
		resp, err := ts.runs.ListRuns(t.Context(), req)
		if err != nil {
			t.Fatalf("ListRuns(%v): %v", req, err)
		}
		if pageSize > 0 && len(resp.GetRuns()) > int(pageSize) {
			t.Errorf("ListRuns page has %d runs, page_size %d", len(resp.GetRuns()), pageSize)
		}
		for _, r := range resp.GetRuns() {
			ids = append(ids, r.GetRunId())
		}
		if resp.GetNextPageToken() == "" {
			return ids
		}
		req.PageToken = resp.GetNextPageToken()
	}
	t.Fatal("ListRuns never returned a last page")
	return nil
}

func TestRestartKeepsRuns(t *testing.T) {
	dir := t.TempDir()
	first := startTestServer(t, dir)
	created := createRun(t, first, "kept")
	if _, err := first.runs.CancelRun(t.Context(), &v1.CancelRunRequest{RunId: "kept"}); err != nil {
		t.Fatalf("CancelRun: %v", err)
	}
	first.Stop()

	second := startTestServer(t, dir)
	got, err := second.runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "kept"})
	if err != nil {
		t.Fatalf("GetRun after restart: %v", err)
	}
	if got.GetRun().GetState() != v1.RunState_RUN_STATE_CANCELLED || !proto.Equal(got.GetRun().GetSpec(), created.GetRun().GetSpec()) {
		t.Errorf("after restart run = %v, want CANCELLED with the created spec", got.GetRun())
	}
}

// The worker side end to end: register, step, and a Stop command delivered
// on the stream when the run is cancelled.
func TestWorkerStreamsStopOnCancel(t *testing.T) {
	ts := newTestServer(t)
	createRun(t, ts, "workers")
	reg, err := ts.workers.RegisterWorker(t.Context(), &v1.RegisterWorkerRequest{
		RunId: "workers", Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0",
	})
	if err != nil {
		t.Fatalf("RegisterWorker: %v", err)
	}
	step, err := ts.workers.CompleteStep(t.Context(), &v1.CompleteStepRequest{
		RunId: "workers", WorkerId: reg.GetWorkerId(), Step: 1, IterationSeconds: 1,
	})
	if err != nil || step.GetAction() != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("CompleteStep = %v, %v; want CONTINUE", step.GetAction(), err)
	}
	stream, err := ts.workers.StreamCommands(t.Context(), &v1.StreamCommandsRequest{RunId: "workers", WorkerId: reg.GetWorkerId()})
	if err != nil {
		t.Fatalf("StreamCommands: %v", err)
	}
	if _, err := ts.runs.CancelRun(t.Context(), &v1.CancelRunRequest{RunId: "workers", Reason: "test"}); err != nil {
		t.Fatalf("CancelRun: %v", err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("StreamCommands ended before a Stop: %v", err)
		}
		if resp.GetCommand().GetStop() != nil {
			break
		}
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("after Stop, stream = %v, want a clean end", err)
	}
}

// A cursor past the log's end answers OUT_OF_RANGE on every reader of a
// log, naming after_seq and the last seq, so a client knows to start over.
func TestCursorPastTheLogIsOutOfRange(t *testing.T) {
	ts := newTestServer(t)
	createRun(t, ts, "ahead")
	reg, err := ts.workers.RegisterWorker(t.Context(), &v1.RegisterWorkerRequest{
		RunId: "ahead", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-0",
	})
	if err != nil {
		t.Fatalf("RegisterWorker: %v", err)
	}
	last := reg.GetLastCommandSeq()
	wantOutOfRange := func(rpc string, err error, want string) {
		t.Helper()
		if status.Code(err) != codes.OutOfRange || !strings.Contains(status.Convert(err).Message(), want) {
			t.Fatalf("%s: %v; want OUT_OF_RANGE naming %q", rpc, err, want)
		}
	}
	_, err = ts.workers.PollCommands(t.Context(), &v1.PollCommandsRequest{RunId: "ahead", WorkerId: reg.GetWorkerId(), AfterSeq: last + 1})
	wantOutOfRange("PollCommands", err, fmt.Sprintf("after_seq %d is past the run's last command (seq %d)", last+1, last))

	stream, err := ts.workers.StreamCommands(t.Context(), &v1.StreamCommandsRequest{RunId: "ahead", WorkerId: reg.GetWorkerId(), AfterSeq: last + 1})
	if err == nil {
		_, err = stream.Recv()
	}
	wantOutOfRange("StreamCommands", err, fmt.Sprintf("after_seq %d is past the run's last command (seq %d)", last+1, last))

	run, err := ts.runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "ahead"})
	if err != nil {
		t.Fatalf("GetRun: %v", err)
	}
	lastEv := run.GetRun().GetLastEventSeq()
	watch, err := ts.runs.WatchRun(t.Context(), &v1.WatchRunRequest{RunId: "ahead", AfterSeq: lastEv + 1, NoFollow: true})
	if err == nil {
		_, err = watch.Recv()
	}
	wantOutOfRange("WatchRun", err, fmt.Sprintf("after_seq %d is past the run's last event (seq %d)", lastEv+1, lastEv))
}
