package engine

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// A requeued Slurm job keeps its SLURM_JOB_ID, so its launcher finds its
// run again: ReissueRunToken gives the new allocation a token, cuts off the
// old one, and the run goes on where it was, its ranks taking their names
// back.
func TestReissueRunTokenResumesARequeuedRun(t *testing.T) {
	h := newHarness(t)
	created, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: turnSpec(2, "00:01:00:00")})
	if err != nil {
		t.Fatal(err)
	}
	ranks := h.trainers("r", 2)
	for step := int64(1); step <= 3; step++ {
		h.advance(10*time.Second, "r", ranks...)
		if a := h.stepAll("r", ranks, step, 10); a != v1.StepAction_STEP_ACTION_CONTINUE {
			t.Fatalf("step %d: %v", step, a)
		}
	}
	before := h.get("r")

	resp, err := h.e.ReissueRunToken(h.ctx, &v1.ReissueRunTokenRequest{RunId: "r", Reason: "job 42 requeued,\nrestart 1"})
	if err != nil {
		t.Fatalf("ReissueRunToken: %v", err)
	}
	if resp.RunToken == "" || resp.RunToken == created.RunToken {
		t.Fatalf("token %q, want a new one", resp.RunToken)
	}
	if _, ok := h.e.RunForToken(created.RunToken); ok {
		t.Fatal("the earlier allocation's token still works")
	}
	if id, ok := h.e.RunForToken(resp.RunToken); !ok || id != "r" {
		t.Fatalf("the new token gives run %q, %v", id, ok)
	}
	// Nothing but the token changed: state, steps, deadline and estimates.
	after := h.get("r")
	if !proto.Equal(resp.Run, after) {
		t.Fatalf("response run %v, GetRun %v", resp.Run, after)
	}
	after.LastEventSeq = before.LastEventSeq
	if !proto.Equal(after, before) {
		t.Fatalf("the run changed:\nbefore %v\nafter  %v", before, after)
	}
	warnings := h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_WARNING)
	if len(warnings) != 1 || !strings.Contains(warnings[0].Message, "job 42 requeued, restart 1") ||
		!strings.Contains(warnings[0].Message, "earlier token no longer works") {
		t.Fatalf("warnings %v, want one naming the reason (on one line)", warnings)
	}

	// Durable: after a restart the new token opens the run, the old does not.
	h.restart()
	if id, ok := h.e.RunForToken(resp.RunToken); !ok || id != "r" {
		t.Fatalf("after a restart the new token gives run %q, %v", id, ok)
	}
	if _, ok := h.e.RunForToken(created.RunToken); ok {
		t.Fatal("after a restart the earlier token works again")
	}

	// The new allocation's ranks register under the same names and carry on
	// from the next step; the earlier processes are superseded.
	for i := range 2 {
		if re := h.registerAgain("r", "rank-"+itoa(i), int32(i)); re.WorkerId != ranks[i] || re.Incarnation != 2 {
			t.Fatalf("rank %d registered as %s incarnation %d, want %s incarnation 2", i, re.WorkerId, re.Incarnation, ranks[i])
		}
	}
	_, err = h.e.CompleteStep(h.ctx, &v1.CompleteStepRequest{RunId: "r", WorkerId: ranks[0], Incarnation: 1, Step: 4, IterationSeconds: 10})
	if !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("the earlier allocation's rank stepping: %v, want FAILED_PRECONDITION (superseded)", err)
	}
	h.advance(10*time.Second, "r", ranks...)
	if a := h.stepAll("r", ranks, 4, 10); a != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 4 after the requeue: %v", a)
	}
}

// A run whose deadline fired, or was triggered, or that is over, keeps its
// token: that save was the earlier allocation's, and a new allocation
// resuming it would stop at its first step.
func TestReissueRunTokenRefused(t *testing.T) {
	h := newHarness(t)
	_, err := h.e.ReissueRunToken(h.ctx, &v1.ReissueRunTokenRequest{RunId: "nope"})
	wantErr(t, err, ErrNotFound, `"nope"`)

	reissue := func(run, want string) {
		t.Helper()
		tokens := len(h.eventsOf(run, v1.RunEventType_RUN_EVENT_TYPE_WARNING))
		_, err := h.e.ReissueRunToken(h.ctx, &v1.ReissueRunTokenRequest{RunId: run})
		wantErr(t, err, ErrFailedPrecondition, want)
		if n := len(h.eventsOf(run, v1.RunEventType_RUN_EVENT_TYPE_WARNING)); n != tokens {
			t.Fatalf("refused, yet %d warnings were added", n-tokens)
		}
	}

	h.create("pending", turnSpec(1, "00:01:00:00"))
	rank := h.trainers("pending", 1)
	h.stepAll("pending", rank, 1, 10)
	if _, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "pending"}); err != nil {
		t.Fatal(err)
	}
	reissue("pending", "deadline trigger pending")
	if a := h.stepAll("pending", rank, 2, 10); a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 2 after the trigger: %v", a)
	}
	reissue("pending", "deadline fired")

	h.create("cancelled", turnSpec(1, "00:01:00:00"))
	if _, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "cancelled"}); err != nil {
		t.Fatal(err)
	}
	reissue("cancelled", "CANCELLED")
}
