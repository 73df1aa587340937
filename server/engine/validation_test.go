package engine

import (
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// One row per rule of docs/grpcurl.md "What a run spec must satisfy" (the
// rules that span fields; single-field bounds and enum values are
// protovalidate's, in the transport).
func TestCreateRunValidation(t *testing.T) {
	const (
		budgetField   = "spec.checkpointing.checkpoint_must_save_by"
		absField      = "spec.checkpointing.must_save_by"
		onCkptField   = "spec.rollout_checkpointing.snapshot_on_trainer_checkpoint"
		intervalField = "spec.rollout_checkpointing.snapshot_attempt_interval_s"
		worldField    = "spec.trainer_world_size"
	)
	turn := v1.TargetLevel_TARGET_LEVEL_TURN
	spec := func(level v1.TargetLevel, budget string, abs *timestamppb.Timestamp, deferred bool, onCkpt *bool, interval *int32) *v1.RunSpec {
		return &v1.RunSpec{
			TrainerWorldSize: 2,
			Checkpointing:    &v1.CheckpointingSpec{CheckpointMustSaveBy: budget, MustSaveBy: abs, DeferredFinalize: deferred},
			RolloutCheckpointing: &v1.RolloutCheckpointingSpec{
				SnapshotOnTrainerCheckpoint: onCkpt, SnapshotAttemptIntervalS: interval},
			RolloutRecovery: &v1.RolloutRecoverySpec{TargetLevel: level},
		}
	}
	abs := timestamppb.New(t0.Add(time.Hour))
	for _, tc := range []struct {
		name  string
		spec  *v1.RunSpec
		field string // "" = accepted
	}{
		{"budget not DD:HH:MM:SS", spec(turn, "3h", nil, false, nil, nil), budgetField},
		{"budget with three fields", spec(turn, "1:2:3", nil, false, nil, nil), budgetField},
		{"budget with letters", spec(turn, "a:b:c:d", nil, false, nil, nil), budgetField},
		{"negative budget", spec(turn, "-1:00:00:00", nil, false, nil, nil), budgetField},
		{"budget with a space", spec(turn, " 1:00:00:00", nil, false, nil, nil), budgetField},
		{"budget over ten years", spec(turn, "99999:00:00:00", nil, false, nil, nil), budgetField},
		{"budget and must_save_by", spec(turn, "00:01:00:00", abs, false, nil, nil), budgetField},
		{"must_save_by not a valid timestamp", spec(turn, "", &timestamppb.Timestamp{Seconds: 1 << 62}, false, nil, nil), absField},
		{"must_save_by alone", spec(turn, "", abs, false, nil, nil), ""},
		{"budget with hours over 24", spec(turn, "00:48:00:00", nil, false, nil, nil), ""},
		{"neither form at prompt_group level", spec(v1.TargetLevel_TARGET_LEVEL_PROMPT_GROUP, "", nil, false, nil, nil), ""},
		{"neither form at turn level, snapshot after each checkpoint", spec(turn, "", nil, false, nil, nil), ""},
		{"turn, no snapshot on checkpoint, no interval, no deadline: never saves",
			spec(turn, "", nil, false, ptr(false), nil), onCkptField},
		{"prefix, no snapshot on checkpoint, no interval, no deadline: never saves",
			spec(v1.TargetLevel_TARGET_LEVEL_PREFIX, "", nil, false, ptr(false), nil), onCkptField},
		{"turn, no snapshot on checkpoint, deadline only", spec(turn, "00:01:00:00", nil, false, ptr(false), nil), ""},
		{"turn, no snapshot on checkpoint, absolute deadline only", spec(turn, "", abs, false, ptr(false), nil), ""},
		{"turn, no snapshot on checkpoint, interval only", spec(turn, "", nil, false, ptr(false), ptr[int32](300)), ""},
		{"sibling, no snapshot on checkpoint, no deadline (nothing to save)",
			spec(v1.TargetLevel_TARGET_LEVEL_SIBLING, "", nil, false, ptr(false), nil), ""},
		{"deferred finalize with an interval", spec(v1.TargetLevel_TARGET_LEVEL_SIBLING, "00:01:00:00", nil, true, nil, ptr[int32](300)), intervalField},
		{"deferred finalize, turn, snapshot on checkpoint by default", spec(turn, "00:01:00:00", nil, true, nil, nil), onCkptField},
		{"deferred finalize, turn, snapshot on checkpoint set", spec(turn, "00:01:00:00", nil, true, ptr(true), nil), onCkptField},
		{"deferred finalize, prefix, snapshot on checkpoint by default", spec(v1.TargetLevel_TARGET_LEVEL_PREFIX, "00:01:00:00", nil, true, nil, nil), onCkptField},
		{"deferred finalize, turn, deadline-only snapshots", spec(turn, "00:01:00:00", nil, true, ptr(false), nil), ""},
		{"deferred finalize, turn, no snapshot on checkpoint, no deadline: never saves",
			spec(turn, "", nil, true, ptr(false), nil), onCkptField},
		{"deferred finalize at sibling level (snapshot_on_trainer_checkpoint ignored)",
			spec(v1.TargetLevel_TARGET_LEVEL_SIBLING, "00:01:00:00", nil, true, nil, nil), ""},
		{"trainer_world_size 0", &v1.RunSpec{TrainerWorldSize: 0}, worldField},
		{"trainer_world_size negative", &v1.RunSpec{TrainerWorldSize: -4}, worldField},
		{"no spec", nil, "spec"},
		{"started_at not a valid timestamp", startingAt(spec(turn, "", nil, false, nil, nil), &timestamppb.Timestamp{Seconds: 1 << 62}), "spec.started_at"},
		{"started_at in year 9999", startingAt(spec(turn, "02:00:00:00", nil, false, nil, nil),
			timestamppb.New(time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC))), "spec.started_at"},
		{"started_at in year 1 (a zero time.Time)", startingAt(spec(turn, "02:00:00:00", nil, false, nil, nil),
			timestamppb.New(time.Time{})), "spec.started_at"},
		{"started_at a day ago", startingAt(spec(turn, "02:00:00:00", nil, false, nil, nil), timestamppb.New(t0.Add(-24*time.Hour))), ""},
		{"must_save_by in year 1 (a zero time.Time)", spec(turn, "", timestamppb.New(time.Time{}), false, nil, nil), absField},
		{"must_save_by before started_at", startingAt(spec(turn, "", abs, false, nil, nil), timestamppb.New(t0.Add(2*time.Hour))), absField},
		{"more ranks than max_workers_per_run", &v1.RunSpec{TrainerWorldSize: 10001}, worldField},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			resp, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: tc.spec})
			if tc.field == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				if resp.RunToken == "" || h.get("r").State != v1.RunState_RUN_STATE_PENDING {
					t.Fatalf("accepted run: %v", resp)
				}
				return
			}
			wantErr(t, err, ErrInvalidArgument, tc.field)
			// Nothing was written, in memory or on disk.
			for round := range 2 {
				if _, err := h.e.GetRun(h.ctx, &v1.GetRunRequest{RunId: "r"}); err == nil {
					t.Fatalf("round %d: GetRun found the rejected run", round)
				} else {
					wantErr(t, err, ErrNotFound, `"r"`)
				}
				list, err := h.e.ListRuns(h.ctx, &v1.ListRunsRequest{})
				if err != nil || len(list.Runs) != 0 {
					t.Fatalf("round %d: ListRuns = %v, %v; want no runs", round, list, err)
				}
				h.restart()
			}
		})
	}
}

func startingAt(s *v1.RunSpec, t *timestamppb.Timestamp) *v1.RunSpec {
	s.StartedAt = t
	return s
}

func TestCreateRunIdempotent(t *testing.T) {
	h := newHarness(t)
	spec := turnSpec(2, "00:01:00:00")
	first, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: spec})
	if err != nil || first.RunToken == "" {
		t.Fatalf("CreateRun: %v, token %q", err, first.GetRunToken())
	}
	h.advance(time.Minute, "r")

	// Before any worker registered, a repeat gets a new token (the first
	// answer may have been lost), and the token before it stops working.
	withStart := proto.Clone(spec).(*v1.RunSpec)
	withStart.StartedAt = timestamppb.New(t0) // what the server filled in
	tok := first.RunToken
	for i, s := range []*v1.RunSpec{spec, withStart} {
		again, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: s})
		if err != nil {
			t.Fatalf("retry %d: %v", i, err)
		}
		if again.RunToken == "" || again.RunToken == tok || !again.TokenReissued {
			t.Fatalf("retry %d before any worker: token %q, want a new one", i, again.RunToken)
		}
		if _, ok := h.e.RunForToken(tok); ok {
			t.Fatalf("retry %d: the earlier token still works", i)
		}
		tok = again.RunToken
		if !proto.Equal(again.Run, h.get("r")) || !proto.Equal(again.Run.Spec, first.Run.Spec) {
			t.Fatalf("retry %d returned %v, want the run %v", i, again.Run, first.Run)
		}
	}
	h.restart()
	if id, ok := h.e.RunForToken(tok); !ok || id != "r" {
		t.Fatalf("after a restart the reissued token gives run %q, %v", id, ok)
	}
	// Once a worker registered, the token is in use: a repeat returns none.
	h.envs("r", 1)
	again, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: spec})
	if err != nil || again.RunToken != "" {
		t.Fatalf("retry after a worker registered: %v, token %q; want none", err, again.GetRunToken())
	}
	if _, ok := h.e.RunForToken(tok); !ok {
		t.Fatal("the token in use stopped working")
	}
	events := len(h.events("r"))

	otherBudget := proto.Clone(spec).(*v1.RunSpec)
	otherBudget.Checkpointing.CheckpointMustSaveBy = "00:02:00:00"
	otherStart := proto.Clone(withStart).(*v1.RunSpec)
	otherStart.StartedAt = timestamppb.New(t0.Add(time.Second))
	otherLevel := proto.Clone(spec).(*v1.RunSpec)
	otherLevel.RolloutRecovery.TargetLevel = v1.TargetLevel_TARGET_LEVEL_PREFIX
	for _, s := range []*v1.RunSpec{otherBudget, otherStart, otherLevel} {
		_, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: s})
		wantErr(t, err, ErrAlreadyExists, `"r"`)
	}
	if got := h.get("r"); !proto.Equal(got.Spec, first.Run.Spec) {
		t.Fatalf("a conflicting CreateRun changed the spec: %v", got.Spec)
	}
	if n := len(h.events("r")); n != events {
		t.Fatalf("retries and conflicts added %d events", n-events)
	}

	// After a restart the retry is still recognised.
	h.restart()
	again, err = h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: spec})
	if err != nil || again.RunToken != "" {
		t.Fatalf("retry after restart: %v, token %q", err, again.GetRunToken())
	}
}

// A launcher that passed started_at may retry without it.
func TestCreateRunIdempotentWithoutStartedAt(t *testing.T) {
	h := newHarness(t)
	spec := turnSpec(1, "00:01:00:00")
	spec.StartedAt = timestamppb.New(t0.Add(-10 * time.Minute))
	h.create("r", spec)
	h.advance(time.Minute, "r")
	spec.StartedAt = nil
	again, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: spec})
	if err != nil {
		t.Fatalf("retry without started_at: %v", err)
	}
	if !again.Run.Spec.StartedAt.AsTime().Equal(t0.Add(-10 * time.Minute)) {
		t.Fatalf("started_at %v", again.Run.Spec.StartedAt.AsTime())
	}
}

func TestCreateRunDefaults(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{TrainerWorldSize: 3})
	s := h.get("r").Spec
	want := &v1.RunSpec{
		TrainerWorldSize: 3,
		StartedAt:        timestamppb.New(t0),
		Checkpointing:    &v1.CheckpointingSpec{},
		RolloutCheckpointing: &v1.RolloutCheckpointingSpec{
			SnapshotOnTrainerCheckpoint: ptr(true), MaxConsecutiveFailures: 3, SnapshotTimeoutS: 600},
		RolloutRecovery: &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_PROMPT_GROUP},
		Reserve:         &v1.ReserveSpec{Window: 5},
	}
	if !proto.Equal(s, want) {
		t.Fatalf("spec with defaults\n got %v\nwant %v", s, want)
	}
	if d := h.get("r").Deadline; d.MustSaveBy != nil || d.FiresAt != nil {
		t.Fatalf("a run without a deadline shows one: %v", d)
	}

	// Values given are kept.
	given := &v1.RunSpec{
		TrainerWorldSize: 1,
		RolloutCheckpointing: &v1.RolloutCheckpointingSpec{
			SnapshotOnTrainerCheckpoint: ptr(false), MaxConsecutiveFailures: 7, SnapshotTimeoutS: 30,
			SnapshotAttemptIntervalS: ptr[int32](120)},
		RolloutRecovery: &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN},
		Reserve:         &v1.ReserveSpec{Window: 2, MarginSeconds: 9, ExpectedSnapshotSeconds: ptr(4.0)},
	}
	h.create("given", given)
	got := h.get("given").Spec
	given.StartedAt = timestamppb.New(t0)
	given.Checkpointing = &v1.CheckpointingSpec{}
	if !proto.Equal(got, given) {
		t.Fatalf("spec as given\n got %v\nwant %v", got, given)
	}
}

// The budget counts from started_at; must_save_by is absolute.
func TestCreateRunStartedAt(t *testing.T) {
	h := newHarness(t)
	spec := turnSpec(1, "00:01:00:00")
	spec.StartedAt = timestamppb.New(t0.Add(-30 * time.Minute))
	h.create("budget", spec)
	if b := h.get("budget").Deadline.MustSaveBy.AsTime(); !b.Equal(t0.Add(30 * time.Minute)) {
		t.Fatalf("B = %v, want started_at + 1h = t0 + 30m", b)
	}

	h.create("default", turnSpec(1, "00:01:00:00"))
	if b := h.get("default").Deadline.MustSaveBy.AsTime(); !b.Equal(t0.Add(time.Hour)) {
		t.Fatalf("B = %v, want creation + 1h", b)
	}

	abs := turnSpec(1, "")
	abs.StartedAt = timestamppb.New(t0.Add(-30 * time.Minute))
	abs.Checkpointing.MustSaveBy = timestamppb.New(t0.Add(2 * time.Hour))
	h.create("abs", abs)
	if b := h.get("abs").Deadline.MustSaveBy.AsTime(); !b.Equal(t0.Add(2 * time.Hour)) {
		t.Fatalf("B = %v, want must_save_by", b)
	}

	// The decision uses that B: with started_at 30 minutes ago and a
	// 40-minute iteration, step 1 already fires.
	ranks := h.trainers("budget", 1)
	if d := h.step("budget", ranks[0], 1, 40*60); d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 1: %v (%s)", d.Action, d.Explanation)
	}
}

// Repeats of a CreateRun racing each other leave exactly one working token,
// the run's, and none survives the run's deletion (its id may be created
// again, and an old token must not open the new run).
func TestConcurrentCreateRunRepeatsLeaveOneToken(t *testing.T) {
	h := newHarnessWith(t, Options{HeartbeatInterval: 5 * time.Second, FinishedRunRetention: time.Hour})
	spec := turnSpec(1, "")
	first, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]string, 8)
	var wg sync.WaitGroup
	for i := range tokens {
		wg.Go(func() {
			resp, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: spec})
			if err != nil {
				t.Error(err)
				return
			}
			tokens[i] = resp.RunToken
		})
	}
	wg.Wait()
	tokens = append(tokens, first.RunToken)
	working := 0
	for _, tok := range tokens {
		if _, ok := h.e.RunForToken(tok); ok {
			working++
		}
	}
	if working != 1 {
		t.Fatalf("%d of the %d tokens issued work, want 1", working, len(tokens))
	}

	if _, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	h.clk.Advance(2 * time.Hour) // deleted after its retention
	h.create("r", spec)
	for _, tok := range tokens {
		if id, ok := h.e.RunForToken(tok); ok {
			t.Fatalf("a token of the deleted run opens run %q, created again", id)
		}
	}
}

// A repeat of a CreateRun is judged against the run as created: once B has
// passed (with started_at left to the server, "now" has moved past B) or
// the worker limit was lowered, the same spec still returns the run.
func TestCreateRunRepeatAfterBStillReturnsTheRun(t *testing.T) {
	h := newHarnessWith(t, Options{HeartbeatInterval: 5 * time.Second, MaxWorkersPerRun: 4})
	spec := turnSpec(4, "")
	spec.Checkpointing = &v1.CheckpointingSpec{MustSaveBy: timestamppb.New(t0.Add(time.Hour))}
	first := h.create("r", spec)
	h.clk.Advance(2 * time.Hour)
	h.opts.MaxWorkersPerRun = 2
	h.restart()
	again, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: spec})
	if err != nil || again.Run.RunId != "r" || !proto.Equal(again.Run.Spec, first.Spec) {
		t.Fatalf("repeat after B and a lower limit: %v, %v", again, err)
	}
}

// An invalid spec is INVALID_ARGUMENT naming the field even under the id
// of a run that exists: the spec is wrong whatever the run.
func TestCreateRunInvalidSpecForAnExistingRun(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, "00:01:00:00"))
	_, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: turnSpec(1, "3h")})
	wantErr(t, err, ErrInvalidArgument, "spec.checkpointing.checkpoint_must_save_by")
}

// A hand trigger that was waiting for a step is not shown as pending once
// the run has ended without one.
func TestTriggerPendingClearedWhenTheRunEnds(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, ""))
	ranks := h.trainers("r", 1)
	h.stepAll("r", ranks, 1, 10)
	if _, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r", Reason: "drain"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	if p := h.get("r").Deadline.TriggerPending; p != "" {
		t.Fatalf("a cancelled run shows trigger_pending %q", p)
	}
}
