package integration

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/clock"
	"github.com/snapcoord/snapcoord/server/coordinator"
	"github.com/snapcoord/snapcoord/server/deadline"
)

// Over a real server with a fake clock: a run under EXPECTED_LOSS (bad
// policy values refused, naming the field) decides every step as the pure
// policy does from what the ranks reported, its published checkpoint
// included as the last durable save; every rank hears the same answer with
// the losses weighed; the run fires once, and a coordinator restart
// changes nothing it shows or answers.
func TestExpectedLossOverGRPC(t *testing.T) {
	ctx := testContext(t)
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	srv := startInproc(t, hourlyHeartbeats, coordinator.WithClock(clk))
	c := newCluster(t, srv.addr)
	start := clk.Now()
	b := start.Add(30 * time.Minute)
	spec := &v1.RunSpec{
		TrainerWorldSize: 2,
		StartedAt:        timestamppb.New(start),
		Checkpointing:    &v1.CheckpointingSpec{MustSaveBy: timestamppb.New(b)},
		Reserve: &v1.ReserveSpec{MarginSeconds: 10,
			ExpectedCheckpointSeconds: proto.Float64(60)},
	}
	for field, bad := range map[string]func(*v1.ReserveSpec){
		"spec.reserve.policy": func(r *v1.ReserveSpec) { r.Policy = 7 },
		"spec.reserve.max_loss_seconds": func(r *v1.ReserveSpec) {
			r.Policy, r.MaxLossSeconds = v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS, -1
		},
	} {
		bad(spec.Reserve)
		_, err := c.runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: "el", Spec: spec})
		wantCode(t, "CreateRun with a bad "+field, err, codes.InvalidArgument)
		if !strings.Contains(err.Error(), field) {
			t.Fatalf("error %q does not name %s", err, field)
		}
	}
	spec.Reserve.Policy, spec.Reserve.MaxLossSeconds = v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS, 600
	r := c.createRun(ctx, "el", spec)
	ranks := r.trainers(ctx, 2)

	p := deadline.ExpectedLoss{TauSeconds: 600}
	h := deadline.NewHistory()
	h.PriorCheckpointSeconds, h.MarginSeconds, h.LastDurableSave = 60, 10, start
	var fired *v1.Decision
	for step := int64(1); fired == nil; step++ {
		if step > 30 {
			t.Fatal("no step fired in 30")
		}
		iter := 120.0 + float64(step%3)*10
		clk.Advance(time.Duration(iter) * time.Second)
		h.Iterations.Push(iter)
		want := p.Assess(clk.Now(), b, false, &h).Verdict()
		d := r.stepAll(ctx, ranks, step, iter)
		if (d.Action == v1.StepAction_STEP_ACTION_SAVE_AND_STOP) != want.Fire || d.Explanation != want.Explanation {
			t.Fatalf("step %d: %v %q; the policy says fire %v, %q", step, d.Action, d.Explanation, want.Fire, want.Explanation)
		}
		if (want.Loss != nil) != (d.Inputs.ExpectedLossNowSeconds != nil) || !d.Inputs.LastDurableSave.AsTime().Equal(h.LastDurableSave) {
			t.Fatalf("step %d: inputs %v, want losses %+v and last durable save %v", step, d.Inputs, want.Loss, h.LastDurableSave)
		}
		switch {
		case want.Fire:
			fired = d
		case step == 3: // a checkpoint, saved by both ranks in 60 s, published at once
			clk.Advance(time.Minute)
			r.saved(ctx, ranks[0], 3, 60)
			r.saved(ctx, ranks[1], 3, 60)
			h.Checkpoints.Push(60)
			h.LastDurableSave = clk.Now()
		}
	}
	if fired.Inputs.ExpectedLossNowSeconds == nil || !strings.Contains(fired.Explanation, "expected loss") {
		t.Fatalf("the fired step %d: %q, inputs %v; want the losses weighed", fired.Step, fired.Explanation, fired.Inputs)
	}
	before := r.get(ctx)
	if before.State != v1.RunState_RUN_STATE_SAVING || before.FiredAtStep != fired.Step {
		t.Fatalf("after the fire: %v at step %d", before.State, before.FiredAtStep)
	}

	srv.stop()
	srv.start()
	if after := r.get(ctx); !proto.Equal(after.Deadline, before.Deadline) || after.FiredAtStep != fired.Step {
		t.Fatalf("after a restart: deadline %v, fired at %d; was %v at %d", after.Deadline, after.FiredAtStep, before.Deadline, fired.Step)
	}
	if again := r.step(ctx, ranks[1], fired.Step, 1); !proto.Equal(again, fired) {
		t.Fatalf("step %d asked again after a restart: %v, want %v", fired.Step, again, fired)
	}
}
