package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// The countdown: steps continue while now + I + C + R + M < B; the first
// step that completes at B - (I + C + R + M) or later saves and stops.
// GetRun shows the terms and fires_at, and each DECISION event carries the
// inputs of its decision.
func TestCountdownBoundary(t *testing.T) {
	h := newHarness(t)
	spec := turnSpec(2, "00:01:00:00") // B = t0 + 1h
	spec.Reserve = &v1.ReserveSpec{MarginSeconds: 30, ExpectedCheckpointSeconds: ptr(120.0), ExpectedSnapshotSeconds: ptr(60.0)}
	h.create("r", spec)
	ranks := h.trainers("r", 2)
	b := t0.Add(time.Hour)

	d := h.get("r").Deadline
	if d.IterationSeconds != 0 || d.CheckpointSeconds != 120 || d.SaveReserveSeconds != 60 || d.MarginSeconds != 30 ||
		!d.MustSaveBy.AsTime().Equal(b) || !d.FiresAt.AsTime().Equal(b.Add(-210*time.Second)) {
		t.Fatalf("deadline before any step: %v", d)
	}

	var decisions []*v1.Decision
	h.advance(10*time.Minute, "r", ranks...)
	if a := h.stepAll("r", ranks, 1, 600); a != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 1: %v", a)
	}
	decisions = append(decisions, h.step("r", ranks[0], 1, 600))

	// I = 600 now: fires_at = B - (600 + 120 + 60 + 30) s.
	firesAt := b.Add(-810 * time.Second)
	d = h.get("r").Deadline
	if d.IterationSeconds != 600 || d.CheckpointSeconds != 120 || d.SaveReserveSeconds != 60 || d.MarginSeconds != 30 ||
		!d.MustSaveBy.AsTime().Equal(b) || !d.FiresAt.AsTime().Equal(firesAt) {
		t.Fatalf("deadline after step 1: %v, want fires_at %v", d, firesAt)
	}

	// One nanosecond before fires_at: continue.
	h.advance(firesAt.Add(-time.Nanosecond).Sub(h.clk.Now()), "r", ranks...)
	if a := h.stepAll("r", ranks, 2, 600); a != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 2 at fires_at - 1ns: %v", a)
	}
	decisions = append(decisions, h.step("r", ranks[0], 2, 600))
	if !strings.Contains(decisions[1].Explanation, "< B") {
		t.Fatalf("continue explanation %q", decisions[1].Explanation)
	}

	// Exactly at fires_at: now + I + C + R + M == B fires.
	h.advance(time.Nanosecond, "r", ranks...)
	if a := h.stepAll("r", ranks, 3, 600); a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 3 at fires_at: %v", a)
	}
	decisions = append(decisions, h.step("r", ranks[0], 3, 600))
	run := h.get("r")
	if run.State != v1.RunState_RUN_STATE_SAVING || run.FiredAtStep != 3 || run.FireKind != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_STEP ||
		!run.FiredAt.AsTime().Equal(firesAt) {
		t.Fatalf("after firing: %v", run)
	}
	if d := h.step("r", ranks[0], 4, 600); d.Action != v1.StepAction_STEP_ACTION_STOP {
		t.Fatalf("step 4 after the fire: %v", d.Action)
	}

	// One DECISION event per step (not per rank), carrying the decision and
	// its inputs (now, I, C, R, M, B).
	evs := h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DECISION)
	if len(evs) != 4 {
		t.Fatalf("%d DECISION events, want 4 (steps 1-4)", len(evs))
	}
	for i, want := range decisions {
		ev := evs[i]
		if ev.Step != want.Step || !proto.Equal(ev.Decision, want) {
			t.Fatalf("DECISION event %d: %v, want %v", i, ev.Decision, want)
		}
		in := ev.Decision.Inputs
		if in.IterationSeconds != 600 || in.CheckpointSeconds != 120 || in.SaveReserveSeconds != 60 ||
			in.MarginSeconds != 30 || !in.MustSaveBy.AsTime().Equal(b) || ev.Decision.DecidedAt == nil {
			t.Fatalf("DECISION event %d inputs %v", i, in)
		}
	}
	if !evs[2].Decision.DecidedAt.AsTime().Equal(firesAt) {
		t.Fatalf("decided_at %v, want %v", evs[2].Decision.DecidedAt.AsTime(), firesAt)
	}
	if len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_FIRED)) != 1 {
		t.Fatal("want one DEADLINE_FIRED event")
	}
}

// I is the longest iteration recorded: per step the max over ranks, then the
// max over steps. A step's decision is made with what was known when the
// first rank asked.
func TestIterationIsMaxOverRanksAndSteps(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{TrainerWorldSize: 2, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "01:00:00:00"}})
	ranks := h.trainers("r", 2)

	d1 := h.step("r", ranks[0], 1, 100)
	if d1.Inputs.IterationSeconds != 100 {
		t.Fatalf("step 1 decided with I = %v", d1.Inputs.IterationSeconds)
	}
	if d := h.step("r", ranks[1], 1, 300); !proto.Equal(d, d1) {
		t.Fatalf("rank 1 got %v, rank 0 %v", d, d1)
	}
	if i := h.get("r").Deadline.IterationSeconds; i != 300 {
		t.Fatalf("I after step 1 = %v, want 300 (max over ranks)", i)
	}
	h.step("r", ranks[1], 2, 50)
	if d := h.step("r", ranks[0], 2, 60); d.Inputs.IterationSeconds != 300 {
		t.Fatalf("step 2 decided with I = %v, want 300 (max over steps)", d.Inputs.IterationSeconds)
	}
	if i := h.get("r").Deadline.IterationSeconds; i != 300 {
		t.Fatalf("I after step 2 = %v", i)
	}
	if d := h.step("r", ranks[1], 3, 400); d.Inputs.IterationSeconds != 400 {
		t.Fatalf("step 3 decided with I = %v, want 400", d.Inputs.IterationSeconds)
	}
	h.restart()
	if i := h.get("r").Deadline.IterationSeconds; i != 400 {
		t.Fatalf("I after restart = %v", i)
	}
}

// C is the prior until a checkpoint is measured, then the longest save any
// rank reported, smaller than the prior or not.
func TestCheckpointEstimate(t *testing.T) {
	h := newHarness(t)
	spec := &v1.RunSpec{TrainerWorldSize: 2, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "01:00:00:00"},
		Reserve: &v1.ReserveSpec{ExpectedCheckpointSeconds: ptr(100.0)}}
	h.create("r", spec)
	h.create("noprior", &v1.RunSpec{TrainerWorldSize: 1})
	ranks := h.trainers("r", 2)
	if c := h.get("r").Deadline.CheckpointSeconds; c != 100 {
		t.Fatalf("C before any checkpoint = %v, want the prior 100", c)
	}
	if c := h.get("noprior").Deadline.CheckpointSeconds; c != 0 {
		t.Fatalf("C without a prior = %v, want 0", c)
	}

	ckpt := func(step int64, secs ...float64) {
		for i, w := range ranks {
			if _, err := h.e.ReportCheckpoint(h.ctx, &v1.ReportCheckpointRequest{RunId: "r", WorkerId: w, Step: step,
				Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: secs[i]}); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.stepAll("r", ranks, 1, 10)
	ckpt(1, 20, 25)
	if c := h.get("r").Deadline.CheckpointSeconds; c != 25 {
		t.Fatalf("C after a 25 s checkpoint = %v (the measurement replaces the prior)", c)
	}
	h.stepAll("r", ranks, 2, 10)
	ckpt(2, 10, 5)
	if c := h.get("r").Deadline.CheckpointSeconds; c != 25 {
		t.Fatalf("C after a shorter checkpoint = %v, want 25", c)
	}
	h.stepAll("r", ranks, 3, 10)
	if d := h.step("r", ranks[0], 3, 10); d.Inputs.CheckpointSeconds != 25 {
		t.Fatalf("step 3 decided with C = %v", d.Inputs.CheckpointSeconds)
	}
	ckpt(3, 40, 1)
	if c := h.get("r").Deadline.CheckpointSeconds; c != 40 {
		t.Fatalf("C after a 40 s checkpoint = %v", c)
	}
	h.restart()
	if c := h.get("r").Deadline.CheckpointSeconds; c != 40 {
		t.Fatalf("C after restart = %v", c)
	}
}

// R is the longest of the last `window` SAVED snapshot durations (issue to
// last report); the prior until one SAVED. Other outcomes do not feed it.
func TestReserveWindow(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{
		TrainerWorldSize:     1,
		Checkpointing:        &v1.CheckpointingSpec{CheckpointMustSaveBy: "01:00:00:00"},
		RolloutCheckpointing: &v1.RolloutCheckpointingSpec{SnapshotAttemptIntervalS: ptr[int32](100), MaxConsecutiveFailures: 10},
		Reserve:              &v1.ReserveSpec{Window: 2, ExpectedSnapshotSeconds: ptr(50.0), MarginSeconds: 7},
	})
	env := h.envs("r", 1)
	b := t0.Add(24 * time.Hour)
	wantR := func(r float64) {
		t.Helper()
		d := h.get("r").Deadline
		if d.SaveReserveSeconds != r {
			t.Fatalf("R = %v, want %v", d.SaveReserveSeconds, r)
		}
		if want := b.Add(-time.Duration((r + 7) * float64(time.Second))); !d.FiresAt.AsTime().Equal(want) {
			t.Fatalf("fires_at %v, want B - (R + M) = %v", d.FiresAt.AsTime(), want)
		}
	}
	wantR(50)

	// Each tick issues a snapshot at t0 + k*100s; it takes `took` seconds.
	for i, tc := range []struct {
		took    time.Duration
		outcome v1.SnapshotOutcome
		r       float64
	}{
		{30 * time.Second, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 30},    // replaces the prior
		{10 * time.Second, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 30},    // window [30 10]
		{45 * time.Second, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, 30}, // not SAVED: ignored
		{60 * time.Second, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED, 30},  // not SAVED: ignored
		{5 * time.Second, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 10},     // window [10 5]: 30 fell out
		{20 * time.Second, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 20},    // window [5 20]
	} {
		tick := t0.Add(time.Duration(i+1) * 100 * time.Second)
		h.advance(tick.Sub(h.clk.Now()), "r", env...)
		s := h.lastSnapshot("r")
		if s.SnapshotId != fmt.Sprintf("snap-%d", i+1) || !s.IssuedAt.AsTime().Equal(tick) {
			t.Fatalf("tick %d: last snapshot %v", i+1, s)
		}
		h.advance(tc.took, "r", env...)
		if err := h.report("r", env[0], s.SnapshotId, tc.outcome, 1); err != nil {
			t.Fatal(err)
		}
		if got := h.lastSnapshot("r"); got.Outcome != tc.outcome || got.DurationSeconds != tc.took.Seconds() {
			t.Fatalf("snapshot %d: outcome %v duration %v, want %v %v", i+1, got.Outcome, got.DurationSeconds, tc.outcome, tc.took.Seconds())
		}
		wantR(tc.r)
	}
	h.restart()
	wantR(20)
}
