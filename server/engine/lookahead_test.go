package engine

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// lookaheadSpec is a turn-level run of one rank with B = t0 + 10 min and
// priors C 20 s, R 10 s, M 5 s; every is checkpoint_every_steps.
func lookaheadSpec(every int32) *v1.RunSpec {
	s := turnSpec(1, "00:00:10:00")
	s.Checkpointing.CheckpointEverySteps = every
	s.Reserve = &v1.ReserveSpec{MarginSeconds: 5, ExpectedCheckpointSeconds: ptr(20.0), ExpectedSnapshotSeconds: ptr(10.0)}
	return s
}

// The blind spot of issue 15, and its fix. Two runs, alike but for
// checkpoint_every_steps = 2, complete step 2 at B - 60 s with I 10 s,
// C 20 s, R 10 s, M 5 s. Without the field the rule sees 45 s and
// continues with 15 s to spare; the trainer's regular save of step 2
// (checkpoint and snapshot, 30 s) then runs first, the deadline fires at
// step 3, and B passes while the ranks save. With it, S = C + R = 30 s is
// counted, step 2 saves and stops, and the run stops before B.
func TestRegularSaveInTheLookahead(t *testing.T) {
	h := newHarnessWith(t, Options{HeartbeatInterval: time.Minute})
	b := t0.Add(10 * time.Minute)
	h.create("plain", lookaheadSpec(0))
	h.create("every2", lookaheadSpec(2))
	if s := h.get("every2").Deadline.RegularSaveSeconds; s != nil {
		t.Fatalf("before the first step (its number unknown): regular_save_seconds %v, want unset", *s)
	}
	pr, pe := h.trainers("plain", 1), h.envs("plain", 1)
	er, ee := h.trainers("every2", 1), h.envs("every2", 1)
	all := func() {
		h.beat("plain", append(pr, pe...)...)
		h.beat("every2", append(er, ee...)...)
	}

	h.clk.Advance(530 * time.Second)
	all()
	for run, ranks := range map[string][]string{"plain": pr, "every2": er} {
		if a := h.stepAll(run, ranks, 1, 10); a != v1.StepAction_STEP_ACTION_CONTINUE {
			t.Fatalf("%s step 1 at B - 70 s: %v", run, a)
		}
	}
	// Run.deadline is about step 2, which only every2 follows with a save.
	if d := h.get("plain").Deadline; d.RegularSaveSeconds != nil || !d.FiresAt.AsTime().Equal(b.Add(-45*time.Second)) {
		t.Fatalf("plain: regular_save_seconds %v, fires_at %v; want unset and B - 45 s", d.RegularSaveSeconds, d.FiresAt.AsTime())
	}
	if d := h.get("every2").Deadline; d.GetRegularSaveSeconds() != 30 || !d.FiresAt.AsTime().Equal(b.Add(-75*time.Second)) {
		t.Fatalf("every2: regular_save_seconds %v, fires_at %v; want 30 and B - 75 s", d.RegularSaveSeconds, d.FiresAt.AsTime())
	}

	h.clk.Advance(10 * time.Second)
	all()
	plain := h.step("plain", pr[0], 2, 10)
	if plain.Action != v1.StepAction_STEP_ACTION_CONTINUE || plain.Inputs.RegularSaveSeconds != nil ||
		!strings.Contains(plain.Explanation, "now+I+C+R+M") || !strings.Contains(plain.Explanation, "15s to spare") {
		t.Fatalf("plain step 2: %v, S %v, %q; want continue with 15 s to spare, no S", plain.Action, plain.Inputs.RegularSaveSeconds, plain.Explanation)
	}
	d := h.step("every2", er[0], 2, 10)
	if d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP || d.Inputs.GetRegularSaveSeconds() != 30 {
		t.Fatalf("every2 step 2: %v with S %v, want SAVE_AND_STOP with S 30 s (%s)", d.Action, d.Inputs.RegularSaveSeconds, d.Explanation)
	}
	for _, want := range []string{"now+S+I+C+R+M", "(30 + 10 + 20 + 10 + 5 s)", "the regular save after this step is the deadline save"} {
		if !strings.Contains(d.Explanation, want) {
			t.Errorf("explanation %q does not say %q", d.Explanation, want)
		}
	}
	if evs := h.decisionEvents("every2"); len(evs) != 2 || !proto.Equal(evs[1].Decision, d) {
		t.Fatalf("decision events %v, want step 2's to carry the decision with S", evs)
	}
	if s := h.get("every2").Deadline.RegularSaveSeconds; s != nil {
		t.Fatalf("after step 2: regular_save_seconds %v for step 3, want unset", *s)
	}

	// every2: the regular save is the deadline save, done before B.
	h.clk.Advance(20 * time.Second)
	all()
	h.checkpoint("every2", er, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 20)
	h.clk.Advance(10 * time.Second)
	all()
	h.reportAll("every2", ee, h.saveAtDeadline("every2", ee...).SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	if run := h.wantState("every2", v1.RunState_RUN_STATE_STOPPED); !run.EndedAt.AsTime().Before(b) || run.FiredAtStep != 2 {
		t.Fatalf("every2 fired at step %d, ended %v, want step 2 and before B %v", run.FiredAtStep, run.EndedAt.AsTime(), b)
	}

	// plain: the regular save of step 2 runs, then step 3 fires too late.
	h.checkpoint("plain", pr, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 20)
	h.clk.Advance(10 * time.Second)
	all()
	h.reportAll("plain", pe, h.lastSnapshot("plain").SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.clk.Advance(10 * time.Second)
	all()
	if a := h.stepAll("plain", pr, 3, 10); a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("plain step 3 at B - 20 s: %v", a)
	}
	h.clk.Advance(20 * time.Second)
	h.wantMissed("plain", "still saving the checkpoint of step 3")
	if h.get("every2").DeadlineMissed {
		t.Fatal("every2 marked deadline_missed")
	}
}

func (h *harness) decisionEvents(run string) []*v1.RunEvent {
	h.t.Helper()
	return h.eventsOf(run, v1.RunEventType_RUN_EVENT_TYPE_DECISION)
}

// S is the trainer checkpoint alone when no snapshot follows it: the
// environment workers then go on serving rollouts while the ranks save.
func TestRegularSaveWithoutTrainerCheckpointSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec func(*v1.RunSpec)
		want float64
	}{
		{"turn level", func(*v1.RunSpec) {}, 30},
		{"turn level, no snapshot after checkpoints", func(s *v1.RunSpec) {
			s.RolloutCheckpointing = &v1.RolloutCheckpointingSpec{SnapshotOnTrainerCheckpoint: proto.Bool(false), SnapshotAttemptIntervalS: ptr[int32](60)}
		}, 20},
		{"prompt-group level", func(s *v1.RunSpec) {
			s.RolloutRecovery.TargetLevel = v1.TargetLevel_TARGET_LEVEL_PROMPT_GROUP
		}, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			spec := lookaheadSpec(1)
			tc.spec(spec)
			h.create("r", spec)
			ranks := h.trainers("r", 1)
			d := h.step("r", ranks[0], 7, 10)
			if d.Inputs.GetRegularSaveSeconds() != tc.want {
				t.Fatalf("step 7 (every step saves): S %v, want %v", d.Inputs.RegularSaveSeconds, tc.want)
			}
			if got := h.get("r").Deadline.GetRegularSaveSeconds(); got != tc.want {
				t.Fatalf("Run.deadline for step 8: S %v, want %v", got, tc.want)
			}
		})
	}
}
