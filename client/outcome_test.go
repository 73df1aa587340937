package client_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
)

// A write answered OUTCOME_UNKNOWN (the coordinator lost its leadership or
// its etcd quorum while the commit waited) that took effect: the client
// repeats TriggerDeadline and CreateRun, and the repeat returns what the
// first attempt did, not "already fired" or ALREADY_EXISTS.
func TestWriteOfUnknownOutcomeIsRetriedToTheOriginalResult(t *testing.T) {
	co := startCoordinator(t)
	co.createRun("r1", turnSpec(1))
	admin := co.dial("", fastRetry)
	ctx := t.Context()

	co.gate.set(func(g *gate) { g.unknownOutcome["TriggerDeadline"] = 1 })
	resp, err := admin.Runs.TriggerDeadline(ctx, &v1.TriggerDeadlineRequest{RunId: "r1", Reason: "drain"})
	if err != nil {
		t.Fatalf("TriggerDeadline after OUTCOME_UNKNOWN: %v; want the first attempt's result", err)
	}
	got, err := admin.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	fired := got.GetRun().GetFiredAt()
	if fired == nil || !resp.GetRun().GetFiredAt().AsTime().Equal(fired.AsTime()) ||
		resp.GetRun().GetFireKind() != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_MANUAL {
		t.Fatalf("TriggerDeadline returned %v; want the run its first attempt fired (fired at %v)", resp.GetRun(), fired)
	}
	if n := co.gate.count("TriggerDeadline"); n != 2 {
		t.Errorf("TriggerDeadline attempts = %d, want 2", n)
	}

	co.gate.set(func(g *gate) { g.unknownOutcome["CreateRun"] = 1 })
	created, err := admin.Runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: "r2", Spec: turnSpec(1)})
	if err != nil || created.GetRunToken() == "" || !created.GetTokenReissued() {
		t.Fatalf("CreateRun after OUTCOME_UNKNOWN: %v (token %q, reissued %v); want the run with a new token", err,
			created.GetRunToken(), created.GetTokenReissued())
	}
	worker := co.dial(created.GetRunToken())
	if _, err := worker.Workers.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: "r2", Role: v1.WorkerRole_WORKER_ROLE_TRAINER,
		Name: "rank-0", Rank: 0}); err != nil {
		t.Fatalf("RegisterWorker with the token of the repeated CreateRun: %v", err)
	}
}

// A call that is not safe to repeat is not repeated after OUTCOME_UNKNOWN,
// and one whose later attempts settle nothing (its context ends) fails
// with the OUTCOME_UNKNOWN it got, not DEADLINE_EXCEEDED: the change may
// have taken effect.
func TestUnknownOutcomeIsReportedUnlessSettled(t *testing.T) {
	co := startCoordinator(t)
	co.createRun("r1", turnSpec(1))
	admin := co.dial("", fastRetry)
	co.gate.set(func(g *gate) { g.unknownOutcome["ReissueRunToken"] = 1 })
	_, err := admin.Runs.ReissueRunToken(t.Context(), &v1.ReissueRunTokenRequest{RunId: "r1"})
	if status.Code(err) != codes.Unavailable || !client.OutcomeUnknown(err) {
		t.Fatalf("ReissueRunToken answered OUTCOME_UNKNOWN: %v; want that error", err)
	}
	if n := co.gate.count("ReissueRunToken"); n != 1 {
		t.Errorf("ReissueRunToken attempts = %d, want 1 (not safe to repeat)", n)
	}

	// The backoff outlasts the call's context.
	slow := co.dial("", client.WithRetry(client.RetryPolicy{MaxAttempts: 3, Base: time.Hour, Max: time.Hour}))
	co.gate.set(func(g *gate) { g.unknownOutcome["CancelRun"] = 1 })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err = slow.Runs.CancelRun(ctx, &v1.CancelRunRequest{RunId: "r1"})
	if !client.OutcomeUnknown(err) {
		t.Fatalf("CancelRun whose context ended after OUTCOME_UNKNOWN: %v; want OUTCOME_UNKNOWN", err)
	}
}
