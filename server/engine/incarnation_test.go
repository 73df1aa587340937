package engine

import (
	"errors"
	"testing"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// wantSuperseded: the call was refused because its incarnation is no longer
// current, with the reason a client acts on.
func wantSuperseded(t *testing.T, what string, err error) {
	t.Helper()
	wantErr(t, err, ErrFailedPrecondition, "incarnation")
	if ee, ok := errors.AsType[*Error](err); !ok || ee.Reason != ReasonWorkerSuperseded {
		t.Fatalf("%s: %v has no reason %s", what, err, ReasonWorkerSuperseded)
	}
}

// Once another process registers under a worker's name, calls that name the
// old incarnation are refused: an old process still running (a node thought
// dead) gets no commands, cannot deregister the new one, and cannot take the
// name back by registering again. Calls that name no incarnation (grpcurl)
// are not checked; a process starting (incarnation 0) takes the name over.
func TestStaleIncarnationIsFenced(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, ""))
	env := v1.WorkerRole_WORKER_ROLE_ENVIRONMENT
	register := func(inc int64) (*v1.RegisterWorkerResponse, error) {
		return h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: env, Name: "env-a", Incarnation: inc})
	}
	old, err := register(0)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := register(0) // a new process under the same name
	if err != nil || cur.Incarnation != old.Incarnation+1 || cur.WorkerId != old.WorkerId {
		t.Fatalf("second process: %v, %v; want incarnation %d of %s", cur, err, old.Incarnation+1, old.WorkerId)
	}
	id := cur.WorkerId

	_, err = h.e.Heartbeat(h.ctx, &v1.HeartbeatRequest{RunId: "r", WorkerId: id, Incarnation: old.Incarnation})
	wantSuperseded(t, "Heartbeat", err)
	_, err = h.e.PollCommands(h.ctx, &v1.PollCommandsRequest{RunId: "r", WorkerId: id, Incarnation: old.Incarnation})
	wantSuperseded(t, "PollCommands", err)
	err = h.e.StreamCommands(h.ctx, &v1.StreamCommandsRequest{RunId: "r", WorkerId: id, Incarnation: old.Incarnation},
		func(*v1.Command) error { return nil })
	wantSuperseded(t, "StreamCommands", err)
	_, err = h.e.DeregisterWorker(h.ctx, &v1.DeregisterWorkerRequest{RunId: "r", WorkerId: id, Incarnation: old.Incarnation})
	wantSuperseded(t, "DeregisterWorker", err)
	_, err = register(old.Incarnation)
	wantSuperseded(t, "RegisterWorker", err)

	for _, inc := range []int64{cur.Incarnation, 0} {
		if _, err := h.e.Heartbeat(h.ctx, &v1.HeartbeatRequest{RunId: "r", WorkerId: id, Incarnation: inc}); err != nil {
			t.Fatalf("heartbeat of incarnation %d: %v", inc, err)
		}
	}
	workers, err := h.e.ListWorkers(h.ctx, &v1.ListWorkersRequest{RunId: "r"})
	if err != nil || len(workers.Workers) != 1 || workers.Workers[0].Incarnation != cur.Incarnation ||
		workers.Workers[0].State != v1.WorkerState_WORKER_STATE_LIVE {
		t.Fatalf("after the old process's calls: %v, %v; want incarnation %d LIVE", workers, err, cur.Incarnation)
	}

	// The current process registering again (its lease lapsed) names the
	// incarnation it holds, and may.
	next, err := register(cur.Incarnation)
	if err != nil || next.Incarnation != cur.Incarnation+1 {
		t.Fatalf("re-register of the current incarnation: %v, %v", next, err)
	}
	// Its answer was lost and it asks again: the same registration, not
	// "superseded" (it would stop) nor a third incarnation.
	if again, err := register(cur.Incarnation); err != nil || again.Incarnation != next.Incarnation {
		t.Fatalf("repeated re-register: %v, %v; want incarnation %d again", again, err, next.Incarnation)
	}
	_, err = register(old.Incarnation)
	wantSuperseded(t, "RegisterWorker of an older incarnation", err)
	if _, err := h.e.DeregisterWorker(h.ctx, &v1.DeregisterWorkerRequest{RunId: "r", WorkerId: id, Incarnation: next.Incarnation}); err != nil {
		t.Fatal(err)
	}
	// A name the coordinator does not know (its state was reset) registers
	// whatever incarnation the process held.
	if _, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: env, Name: "env-b", Incarnation: 7}); err != nil {
		t.Fatalf("re-register of an unknown name: %v", err)
	}
	h.restart() // incarnations are durable
	_, err = h.e.Heartbeat(h.ctx, &v1.HeartbeatRequest{RunId: "r", WorkerId: id, Incarnation: cur.Incarnation})
	wantSuperseded(t, "Heartbeat after a restart", err)

	// Once the run is over, a superseded process still hears that it was
	// superseded, not that the run takes no new workers.
	if _, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "r", Reason: "done"}); err != nil {
		t.Fatal(err)
	}
	_, err = register(old.Incarnation)
	wantSuperseded(t, "RegisterWorker into a terminal run", err)
}

// A worker process that restarts in the middle of a snapshot resumes just
// before that snapshot's command, so that it still does its part; once it
// reported, or for a worker the snapshot does not expect, delivery starts at
// the end of the log.
func TestRestartedWorkerResumesAtPendingSnapshot(t *testing.T) {
	h := newHarness(t)
	_, envs := h.snapshotInFlight("r", 2)
	s := h.lastSnapshot("r")
	cmds := h.commands("r", envs[0])
	snapCmd := cmds[len(cmds)-1]
	if snapCmd.GetSnapshot().GetSnapshotId() != s.SnapshotId {
		t.Fatalf("last command %v, want the snapshot %s", snapCmd, s.SnapshotId)
	}
	register := func(name string) *v1.RegisterWorkerResponse {
		t.Helper()
		resp, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if err := h.report("r", envs[1], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1); err != nil {
		t.Fatal(err)
	}

	if got := register("env-aa"); got.ResumeAfterSeq != snapCmd.Seq-1 { // envs[0], not reported yet
		t.Fatalf("restarted mid-snapshot: resume_after_seq %d, want %d (before the snapshot's command)", got.ResumeAfterSeq, snapCmd.Seq-1)
	}
	if got := register("env-ab"); got.ResumeAfterSeq != got.LastCommandSeq { // envs[1], reported
		t.Fatalf("restarted after reporting: resume_after_seq %d, want the end %d", got.ResumeAfterSeq, got.LastCommandSeq)
	}
	if got := register("env-new"); got.ResumeAfterSeq != got.LastCommandSeq {
		t.Fatalf("a worker the snapshot does not expect: resume_after_seq %d, want the end %d", got.ResumeAfterSeq, got.LastCommandSeq)
	}
	if err := h.report("r", envs[0], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1); err != nil {
		t.Fatal(err)
	}
	if got := register("env-aa"); got.ResumeAfterSeq != got.LastCommandSeq {
		t.Fatalf("after its report: resume_after_seq %d, want the end %d", got.ResumeAfterSeq, got.LastCommandSeq)
	}
}

// A superseded process's reports are refused too, and change nothing: its
// snapshot report does not count as its replacement's, its step and
// checkpoint reports record nothing, and it cannot finish the run.
func TestStaleReportsAreFenced(t *testing.T) {
	h := newHarness(t)
	ranks, envs := h.snapshotInFlight("r", 1)
	s := h.lastSnapshot("r")
	oldEnv, oldRank := int64(1), int64(1)
	env, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: "r", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-aa"})
	if err != nil {
		t.Fatal(err)
	}
	rank := h.registerAgain("r", "rank-aa", 0)
	if env.WorkerId != envs[0] || rank.WorkerId != ranks[0] || env.Incarnation != oldEnv+1 || rank.Incarnation != oldRank+1 {
		t.Fatalf("replacements: %v, %v", env, rank)
	}

	_, err = h.e.ReportSnapshot(h.ctx, &v1.ReportSnapshotRequest{RunId: "r", WorkerId: envs[0], SnapshotId: s.SnapshotId,
		Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, Message: "old process", Incarnation: oldEnv})
	wantSuperseded(t, "ReportSnapshot", err)
	_, err = h.e.CompleteStep(h.ctx, &v1.CompleteStepRequest{RunId: "r", WorkerId: ranks[0], Step: 2, IterationSeconds: 9999, Incarnation: oldRank})
	wantSuperseded(t, "CompleteStep", err)
	_, err = h.e.ReportCheckpoint(h.ctx, &v1.ReportCheckpointRequest{RunId: "r", WorkerId: ranks[0], Step: 2,
		Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, Incarnation: oldRank})
	wantSuperseded(t, "ReportCheckpoint", err)
	_, err = h.e.FinishRun(h.ctx, &v1.FinishRunRequest{RunId: "r", WorkerId: ranks[0], Incarnation: oldRank})
	wantSuperseded(t, "FinishRun", err)

	if run := h.get("r"); run.State != v1.RunState_RUN_STATE_RUNNING || run.LastStep != 1 {
		t.Fatalf("after the old processes' calls: %v at step %d", run.State, run.LastStep)
	}
	if n := len(h.lastSnapshot("r").Reports); n != 0 {
		t.Fatalf("the old process's report was recorded: %d reports", n)
	}
	if _, err := h.e.ReportSnapshot(h.ctx, &v1.ReportSnapshotRequest{RunId: "r", WorkerId: envs[0], SnapshotId: s.SnapshotId,
		Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, Incarnation: env.Incarnation}); err != nil {
		t.Fatal(err)
	}
	if got := h.lastSnapshot("r"); got.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Fatalf("after the replacement reported: %v, want SAVED", got.Outcome)
	}
	d, err := h.e.CompleteStep(h.ctx, &v1.CompleteStepRequest{RunId: "r", WorkerId: ranks[0], Step: 2, IterationSeconds: 10, Incarnation: rank.Incarnation})
	if err != nil || d.Decision.Inputs.GetIterationSeconds() != 10 {
		t.Fatalf("the replacement's step 2: %v, %v; want a decision from 10 s iterations", d, err)
	}
}
