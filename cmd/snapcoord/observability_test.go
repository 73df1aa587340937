package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// scenario drives a short life through the real server: a run whose
// deadline is triggered by hand and saved (trainer checkpoint, then the
// environment snapshot), and a run cancelled. It returns every token it
// saw, for the log check.
func scenario(t *testing.T, c *served) (tokens []string) {
	t.Helper()
	conn := dialWith(t, c.addr, nil)
	runs, workers := v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn)
	admin := bearer(t.Context(), adminToken)

	spec := runSpec(1)
	spec.RolloutRecovery = &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN}
	created, err := runs.CreateRun(admin, &v1.CreateRunRequest{RunId: "saved", Spec: spec})
	if err != nil {
		t.Fatalf("CreateRun(saved): %v", err)
	}
	tokens = append(tokens, created.GetRunToken())
	asRun := bearer(t.Context(), created.GetRunToken())
	trainer, err := workers.RegisterWorker(asRun, &v1.RegisterWorkerRequest{RunId: "saved", Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0"})
	if err != nil {
		t.Fatalf("RegisterWorker(trainer): %v", err)
	}
	env, err := workers.RegisterWorker(asRun, &v1.RegisterWorkerRequest{RunId: "saved", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-0"})
	if err != nil {
		t.Fatalf("RegisterWorker(env): %v", err)
	}
	step := func(n int64, want v1.StepAction) {
		t.Helper()
		resp, err := workers.CompleteStep(asRun, &v1.CompleteStepRequest{RunId: "saved", WorkerId: trainer.GetWorkerId(), Step: n, IterationSeconds: 2})
		if err != nil || resp.GetDecision().GetAction() != want {
			t.Fatalf("CompleteStep(%d) = %v, %v; want %v", n, resp.GetDecision().GetAction(), err, want)
		}
	}
	step(1, v1.StepAction_STEP_ACTION_CONTINUE)
	if _, err := runs.TriggerDeadline(admin, &v1.TriggerDeadlineRequest{RunId: "saved", Reason: "test"}); err != nil {
		t.Fatalf("TriggerDeadline: %v", err)
	}
	step(2, v1.StepAction_STEP_ACTION_SAVE_AND_STOP)
	if _, err := workers.ReportCheckpoint(asRun, &v1.ReportCheckpointRequest{RunId: "saved", WorkerId: trainer.GetWorkerId(), Step: 2,
		Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 1.5}); err != nil {
		t.Fatalf("ReportCheckpoint: %v", err)
	}
	poll, err := workers.PollCommands(asRun, &v1.PollCommandsRequest{RunId: "saved", WorkerId: env.GetWorkerId(),
		AfterSeq: env.GetLastCommandSeq(), WaitSeconds: 30})
	if err != nil {
		t.Fatalf("PollCommands: %v", err)
	}
	var snapshotID string
	for _, cmd := range poll.GetCommands() {
		if s := cmd.GetSaveAtDeadline(); s != nil {
			snapshotID = s.GetSnapshotId()
		}
	}
	if snapshotID == "" {
		t.Fatalf("PollCommands = %v, want a SaveAtDeadline", poll.GetCommands())
	}
	if _, err := workers.ReportSnapshot(asRun, &v1.ReportSnapshotRequest{RunId: "saved", WorkerId: env.GetWorkerId(), SnapshotId: snapshotID,
		Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, DurationSeconds: 2}); err != nil {
		t.Fatalf("ReportSnapshot: %v", err)
	}
	// The trainer's stream delivers everything, ending with Stop.
	stream, err := workers.StreamCommands(asRun, &v1.StreamCommandsRequest{RunId: "saved", WorkerId: trainer.GetWorkerId()})
	if err != nil {
		t.Fatalf("StreamCommands: %v", err)
	}
	for {
		if _, err := stream.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("StreamCommands: %v", err)
		}
	}
	if got, err := runs.GetRun(admin, &v1.GetRunRequest{RunId: "saved"}); err != nil || got.GetRun().GetState() != v1.RunState_RUN_STATE_STOPPED {
		t.Fatalf("run saved = %v, %v; want STOPPED", got.GetRun().GetState(), err)
	}

	cancelled, err := runs.CreateRun(admin, &v1.CreateRunRequest{RunId: "cancelled", Spec: runSpec(1)})
	if err != nil {
		t.Fatalf("CreateRun(cancelled): %v", err)
	}
	tokens = append(tokens, cancelled.GetRunToken())
	if _, err := workers.RegisterWorker(bearer(t.Context(), cancelled.GetRunToken()), &v1.RegisterWorkerRequest{
		RunId: "cancelled", Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0"}); err != nil {
		t.Fatalf("RegisterWorker(cancelled): %v", err)
	}
	if _, err := runs.CancelRun(admin, &v1.CancelRunRequest{RunId: "cancelled"}); err != nil {
		t.Fatalf("CancelRun: %v", err)
	}
	// Refused calls are logged too; their tokens must not be.
	_, _ = runs.ListRuns(bearer(t.Context(), created.GetRunToken()), &v1.ListRunsRequest{})
	_, _ = workers.Heartbeat(bearer(t.Context(), cancelled.GetRunToken()), &v1.HeartbeatRequest{RunId: "saved", WorkerId: trainer.GetWorkerId()})
	return tokens
}

type series struct {
	name   string
	labels map[string]string
	min    float64 // at least
	max    float64 // at most; 0: same as min
}

func (s series) String() string { return fmt.Sprintf("%s%v", s.name, s.labels) }

// The named series exist with plausible values after the scenario. The
// engine's own series are updated before the RPC that caused them returns,
// but otelgrpc records a call's duration only after its response is on the
// wire, so the last call may trail by a moment: the scrape of the real
// process is retried until the values match, within a bound.
func TestMetricsAfterScenario(t *testing.T) {
	c := startCoordinator(t, map[string]string{adminTokenEnv: adminToken})
	if c.metricsAddr == "" {
		t.Fatalf("no \"metrics listening\" line:\n%s", c.logs)
	}
	scenario(t, c)

	want := []series{
		{"snapcoord_runs", map[string]string{"state": "stopped"}, 1, 0},
		{"snapcoord_runs", map[string]string{"state": "cancelled"}, 1, 0},
		{"snapcoord_runs", map[string]string{"state": "running"}, 0, 0},
		{"snapcoord_workers", map[string]string{"role": "trainer"}, 2, 0},
		{"snapcoord_workers", map[string]string{"role": "environment"}, 1, 0},
		{"snapcoord_decisions_total", map[string]string{"action": "continue"}, 1, 0},
		{"snapcoord_decisions_total", map[string]string{"action": "save_and_stop"}, 1, 0},
		{"snapcoord_deadline_fires_total", map[string]string{"kind": "manual"}, 1, 0},
		{"snapcoord_commands_issued_total", map[string]string{"kind": "save_at_deadline"}, 1, 0},
		{"snapcoord_commands_issued_total", map[string]string{"kind": "stop"}, 2, 10},
		{"snapcoord_command_delivery_duration_seconds", map[string]string{"kind": "save_at_deadline"}, 1, 0},
		{"snapcoord_command_delivery_duration_seconds", map[string]string{"kind": "stop"}, 1, 10},
		{"snapcoord_snapshot_duration_seconds", map[string]string{"reason": "deadline", "outcome": "saved"}, 1, 0},
		{"snapcoord_store_commit_duration_seconds", nil, 1, 1000},
		{"rpc_server_call_duration_seconds", map[string]string{"rpc_method": "snapcoord.v1.WorkerService/CompleteStep"}, 2, 0},
	}
	var fams map[string]*dto.MetricFamily
	var bad []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		fams = scrapeMetrics(t, c.metricsAddr)
		bad = bad[:0]
		for _, s := range want {
			hi := s.max
			if hi == 0 {
				hi = s.min
			}
			if _, ok := fams[s.name]; !ok {
				bad = append(bad, s.name+" missing")
			} else if v := seriesValue(fams, s.name, s.labels); v < s.min || v > hi {
				bad = append(bad, fmt.Sprintf("%s = %v, want %v..%v", s, v, s.min, hi))
			}
		}
		if len(bad) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // see above: otelgrpc's series trail the RPC
	}
	for _, b := range bad {
		t.Error(b)
	}
	if t.Failed() {
		names := make([]string, 0, len(fams))
		for n := range fams {
			names = append(names, n)
		}
		t.Logf("families: %v", names)
	}
	// A histogram's sum is plausible: the snapshot reported 2 s.
	for _, m := range fams["snapcoord_snapshot_duration_seconds"].GetMetric() {
		if sum := m.GetHistogram().GetSampleSum(); sum <= 0 || sum > 3600 {
			t.Errorf("snapshot duration sum %v: implausible", sum)
		}
	}
	resp, err := http.Get("http://" + c.metricsAddr + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --pprof: %s, want 404", resp.Status)
	}
}

func TestPprofFlag(t *testing.T) {
	c := startCoordinator(t, nil, "--pprof")
	resp, err := http.Get("http://" + c.metricsAddr + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/debug/pprof/ with --pprof: %s, want 200", resp.Status)
	}
}

// One line per finished RPC with its method, code, duration and ids, and
// no token anywhere in the logs, debug level included.
func TestLogsCarryRPCsButNeverTokens(t *testing.T) {
	c := startCoordinator(t, map[string]string{adminTokenEnv: adminToken})
	tokens := append(scenario(t, c), adminToken)
	c.stop() // every RPC's line is written before serve returns

	logs := c.logs.String()
	for _, tok := range tokens {
		if tok == "" || strings.Contains(logs, tok) {
			t.Errorf("token %.8s... appears in the logs", tok)
		}
	}
	perMethod := map[string]int{}
	for _, l := range lines(logs) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("not a JSON line: %s", l)
		}
		if rec["msg"] != "finished call" {
			continue
		}
		method, _ := rec["grpc.method"].(string)
		perMethod[method]++
		if rec["grpc.code"] == nil || rec["grpc.time_ms"] == nil {
			t.Errorf("RPC line lacks code or duration: %s", l)
		}
		if strings.HasPrefix(rec["grpc.service"].(string), "snapcoord.v1.") && method != "ListRuns" && rec["run_id"] == nil {
			t.Errorf("RPC line lacks run_id: %s", l)
		}
		switch method {
		case "CompleteStep", "ReportCheckpoint", "ReportSnapshot", "PollCommands", "StreamCommands", "Heartbeat":
			if rec["worker_id"] == nil {
				t.Errorf("%s line lacks worker_id: %s", method, l)
			}
		}
	}
	for method, n := range map[string]int{"CreateRun": 2, "RegisterWorker": 3, "CompleteStep": 2, "StreamCommands": 1, "ListRuns": 1, "Heartbeat": 1} {
		if perMethod[method] != n {
			t.Errorf("%d %s lines, want %d (one per call)", perMethod[method], method, n)
		}
	}
}
