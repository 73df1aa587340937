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
)

// Over a real server with a fake clock: checkpoint_every_steps makes the
// regular save count at step 2, whose SAVE_AND_STOP every rank hears with S
// in its inputs; the ranks then save too slowly, B passes while they save,
// and GetRun shows deadline_missed, also after a restart.
func TestRegularSaveAndMissedDeadlineOverGRPC(t *testing.T) {
	ctx := testContext(t)
	clk := clock.NewFake(time.Now())
	srv := startInproc(t, hourlyHeartbeats, coordinator.WithClock(clk))
	c := newCluster(t, srv.addr)
	b := clk.Now().Add(10 * time.Minute)
	spec := &v1.RunSpec{
		TrainerWorldSize: 2,
		Checkpointing:    &v1.CheckpointingSpec{MustSaveBy: timestamppb.New(b), CheckpointEverySteps: -1},
		RolloutRecovery:  &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN},
		Reserve:          &v1.ReserveSpec{MarginSeconds: 5, ExpectedCheckpointSeconds: proto.Float64(20), ExpectedSnapshotSeconds: proto.Float64(10)},
	}
	_, err := c.runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: "every2", Spec: spec})
	wantCode(t, "CreateRun with checkpoint_every_steps -1", err, codes.InvalidArgument)
	if !strings.Contains(err.Error(), "checkpoint_every_steps") {
		t.Fatalf("error %q does not name checkpoint_every_steps", err)
	}
	spec.Checkpointing.CheckpointEverySteps = 2
	r := c.createRun(ctx, "every2", spec)
	if got := r.get(ctx).Spec.Checkpointing.CheckpointEverySteps; got != 2 {
		t.Fatalf("GetRun: checkpoint_every_steps %d, want 2", got)
	}
	ranks := r.trainers(ctx, 2)

	clk.Advance(530 * time.Second)
	if d := r.stepAll(ctx, ranks, 1, 10); d.Action != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 1: %v (%s)", d.Action, d.Explanation)
	}
	if d := r.get(ctx).Deadline; d.GetRegularSaveSeconds() != 30 || !d.FiresAt.AsTime().Equal(b.Add(-75*time.Second)) {
		t.Fatalf("Run.deadline for step 2: S %v, fires_at %v; want 30 s, B - 75 s", d.RegularSaveSeconds, d.FiresAt.AsTime())
	}
	clk.Advance(10 * time.Second)
	d := r.stepAll(ctx, ranks, 2, 10)
	if d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP || d.Inputs.GetRegularSaveSeconds() != 30 || !strings.Contains(d.Explanation, "now+S+I+C+R+M") {
		t.Fatalf("step 2 at B - 60 s: %v, S %v (%s); want SAVE_AND_STOP counting S = 30 s", d.Action, d.Inputs.RegularSaveSeconds, d.Explanation)
	}

	r.saved(ctx, ranks[0], 2, 20)
	clk.Advance(60 * time.Second) // rank 1 never saves
	run := r.get(ctx)
	if run.State != v1.RunState_RUN_STATE_FAILED || !run.DeadlineMissed || !run.DeadlineMissedAt.AsTime().Equal(b) ||
		!strings.Contains(run.DeadlineMissedReason, "still saving the checkpoint of step 2") {
		t.Fatalf("after B: state %v, deadline_missed %v at %v (%q); want FAILED, missed at B", run.State, run.DeadlineMissed,
			run.DeadlineMissedAt.AsTime(), run.DeadlineMissedReason)
	}
	var missed []*v1.RunEvent
	for _, ev := range eventsOf(r.events(ctx), v1.RunEventType_RUN_EVENT_TYPE_WARNING) {
		if strings.HasPrefix(ev.Message, "DEADLINE MISSED: ") {
			missed = append(missed, ev)
		}
	}
	if len(missed) != 1 {
		t.Fatalf("DEADLINE MISSED warnings %v, want one", missed)
	}

	srv.stop()
	srv.start()
	if again := r.get(ctx); !again.DeadlineMissed || !proto.Equal(again.DeadlineMissedAt, run.DeadlineMissedAt) || again.DeadlineMissedReason != run.DeadlineMissedReason {
		t.Fatalf("after a restart: deadline_missed %v at %v (%q), want it as before", again.DeadlineMissed, again.DeadlineMissedAt, again.DeadlineMissedReason)
	}
}
