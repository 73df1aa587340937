package integration

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// A Slurm job requeued with --requeue keeps its SLURM_JOB_ID, so the new
// allocation's launcher finds the run the first one created. Over gRPC:
// ReissueRunToken gives it a new token (the old one is refused from then
// on, across a coordinator killed and restarted), the new allocation's workers register
// under the same names, and the run goes on to its deadline save.
func TestRequeuedJobResumesItsRun(t *testing.T) {
	ctx := testContext(t)
	// The real binary: its auth layer checks run tokens.
	srv := startProc(t)
	c := newCluster(t, srv.addr)
	first := c.createRun(ctx, "grpo-42", deadlineSpec(2, time.Now().Add(time.Hour), false))
	ranks := first.trainers(ctx, 2)
	env := first.envs(ctx, 1)[0]
	if d := first.stepAll(ctx, ranks, 1, shortIteration); d.Action != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 1: %v", d.Action)
	}

	// The job is requeued: its launcher runs again and asks for a token.
	resp, err := c.runs.ReissueRunToken(ctx, &v1.ReissueRunTokenRequest{RunId: "grpo-42", Reason: "job 42 requeued (restart 1)"})
	if err != nil {
		t.Fatalf("ReissueRunToken: %v", err)
	}
	if resp.RunToken == "" || resp.RunToken == first.tok || resp.Run.GetLastStep() != 1 {
		t.Fatalf("ReissueRunToken: token %q (the first was %q), run at step %d; want a new token, step 1", resp.RunToken, first.tok, resp.Run.GetLastStep())
	}
	// A process of the first allocation that is still running can do
	// nothing more.
	_, err = first.ws.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: first.id, WorkerId: env})
	wantCode(t, "Heartbeat with the earlier token", err, codes.Unauthenticated)

	srv.kill()
	srv.restart()
	_, err = first.ws.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: first.id, WorkerId: ranks[0]})
	wantCode(t, "Heartbeat with the earlier token after a restart", err, codes.Unauthenticated)

	// The new allocation: same names, new incarnations, the same workers.
	second := &run{c: c, id: first.id, tok: resp.RunToken, ws: v1.NewWorkerServiceClient(dial(t, srv.addr, resp.RunToken))}
	for i, name := range []string{"rank-0", "rank-1"} {
		re := second.register(ctx, v1.WorkerRole_WORKER_ROLE_TRAINER, name, int32(i))
		if re.WorkerId != ranks[i] || re.Incarnation != 2 {
			t.Fatalf("%s registered again as %s incarnation %d, want %s incarnation 2", name, re.WorkerId, re.Incarnation, ranks[i])
		}
	}
	if re := second.register(ctx, v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, "env-0", 0); re.WorkerId != env {
		t.Fatalf("env-0 registered again as %s, want %s", re.WorkerId, env)
	}
	rd := second.startReader(ctx, "env-0", env, false, 0)

	// It goes on to the deadline, saves and stops.
	if d := second.stepAll(ctx, ranks, 2, fireIteration); d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 2: %v, want SAVE_AND_STOP", d.Action)
	}
	for _, id := range ranks {
		second.saved(ctx, id, 2, 1)
	}
	snap := rd.expect(ctx, "SaveAtDeadline").GetSaveAtDeadline().SnapshotId
	if err := second.reportSnapshot(ctx, env, snap, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED); err != nil {
		t.Fatalf("ReportSnapshot: %v", err)
	}
	waitStopped(ctx, t, rd)
	if run := second.get(ctx); run.State != v1.RunState_RUN_STATE_STOPPED || run.FiredAtStep != 2 {
		t.Fatalf("run %v fired at step %d, want STOPPED at step 2", run.State, run.FiredAtStep)
	}
	var reissued bool
	for _, ev := range eventsOf(second.events(ctx), v1.RunEventType_RUN_EVENT_TYPE_WARNING) {
		reissued = reissued || strings.Contains(ev.Message, "run token reissued: job 42 requeued (restart 1)")
	}
	if !reissued {
		t.Error("no WARNING event records the reissued token and its reason")
	}

	// Once the run is over its token is not reissued; bad requests name
	// the field.
	_, err = c.runs.ReissueRunToken(ctx, &v1.ReissueRunTokenRequest{RunId: "grpo-42"})
	wantCode(t, "ReissueRunToken of a stopped run", err, codes.FailedPrecondition)
	_, err = c.runs.ReissueRunToken(ctx, &v1.ReissueRunTokenRequest{RunId: "grpo-43"})
	wantCode(t, "ReissueRunToken of an unknown run", err, codes.NotFound)
	_, err = c.runs.ReissueRunToken(ctx, &v1.ReissueRunTokenRequest{RunId: "Grpo 42"})
	wantCode(t, "ReissueRunToken with a bad run_id", err, codes.InvalidArgument)
	if err == nil || !strings.Contains(err.Error(), "run_id") {
		t.Errorf("bad run_id: %v, want the field named", err)
	}
	_, err = c.runs.ReissueRunToken(ctx, &v1.ReissueRunTokenRequest{RunId: "grpo-42", Reason: strings.Repeat("x", 1025)})
	wantCode(t, "ReissueRunToken with a 1025-byte reason", err, codes.InvalidArgument)
}
