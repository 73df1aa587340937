package engine

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// missObserver records the causes of missed deadlines, by run.
type missObserver struct {
	nopObserver
	mu     sync.Mutex
	causes map[string][]MissCause
}

func (o *missObserver) DeadlineMissed(_ context.Context, runID string, cause MissCause) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.causes == nil {
		o.causes = map[string][]MissCause{}
	}
	o.causes[runID] = append(o.causes[runID], cause)
}

func (o *missObserver) of(run string) []MissCause {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]MissCause(nil), o.causes[run]...)
}

// newMissHarness is a harness with a missObserver and the given heartbeat
// interval (the lease is three, and so is the restart grace).
func newMissHarness(t *testing.T, beat time.Duration) (*harness, *missObserver) {
	obs := &missObserver{}
	return newHarnessWith(t, Options{HeartbeatInterval: beat, Observer: obs}), obs
}

// warnings splits the run's WARNING events into the deadline-missed ones
// and the others.
func (h *harness) warnings(run string) (others, missed []*v1.RunEvent) {
	h.t.Helper()
	for _, ev := range h.eventsOf(run, v1.RunEventType_RUN_EVENT_TYPE_WARNING) {
		if strings.HasPrefix(ev.Message, "DEADLINE MISSED: ") {
			missed = append(missed, ev)
		} else {
			others = append(others, ev)
		}
	}
	return others, missed
}

// wantMissed checks that the run is marked deadline_missed, for a reason
// that says what, with exactly one DEADLINE MISSED warning.
func (h *harness) wantMissed(run, what string) *v1.Run {
	h.t.Helper()
	got := h.get(run)
	if !got.DeadlineMissed || got.DeadlineMissedAt == nil || !strings.Contains(got.DeadlineMissedReason, what) {
		h.t.Fatalf("run %s: deadline_missed %v at %v, reason %q; want missed, %q", run, got.DeadlineMissed,
			got.DeadlineMissedAt, got.DeadlineMissedReason, what)
	}
	_, missed := h.warnings(run)
	if len(missed) != 1 || missed[0].Message != "DEADLINE MISSED: "+got.DeadlineMissedReason || !missed[0].At.AsTime().Equal(got.DeadlineMissedAt.AsTime()) {
		h.t.Fatalf("run %s: DEADLINE MISSED warnings %v, want one saying %q", run, missed, got.DeadlineMissedReason)
	}
	return got
}

func wantCauses(t *testing.T, obs *missObserver, run string, want ...MissCause) {
	t.Helper()
	if got := obs.of(run); !slices.Equal(got, want) {
		t.Fatalf("run %s: missed deadlines observed %v, want %v", run, got, want)
	}
}

// promptGroupSpec is one rank at prompt-group level (no snapshots) with
// B = t0 + 10 min.
func promptGroupSpec() *v1.RunSpec {
	return &v1.RunSpec{TrainerWorldSize: 1, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:00:10:00"}}
}

// A first step completing 5 min after B (the run was PENDING at B, which
// misses nothing: nothing was trained) is decided late, whatever the
// answer: marked once, and the save that follows adds no second mark.
func TestDeadlineMissedWhenAStepIsDecidedAfterB(t *testing.T) {
	h, obs := newMissHarness(t, 5*time.Second)
	h.create("r", promptGroupSpec())
	ranks := h.trainers("r", 1)
	h.clk.Advance(15 * time.Minute)
	if h.get("r").DeadlineMissed {
		t.Fatal("a PENDING run marked at B")
	}
	if a := h.stepAll("r", ranks, 1, 60); a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("step 1 after B: %v", a)
	}
	run := h.wantMissed("r", "step 1 was decided at 2026-11-30T08:15:00Z, 5m0s after B = 2026-11-30T08:10:00Z")
	if run.State != v1.RunState_RUN_STATE_SAVING {
		t.Fatalf("run is %v, want SAVING: a missed deadline changes nothing else", run.State)
	}
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 30)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
	h.wantMissed("r", "step 1 was decided")
	wantCauses(t, obs, "r", MissedDecidedAfterB)
}

// The deadline fired by hand before the first step, after B: as late as
// a step decided then.
func TestDeadlineMissedWhenTriggeredAfterB(t *testing.T) {
	h, obs := newMissHarness(t, 5*time.Second)
	h.create("r", promptGroupSpec())
	h.clk.Advance(11 * time.Minute)
	if _, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r", Reason: "operator"}); err != nil {
		t.Fatal(err)
	}
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED) // nothing to save before the first step
	h.wantMissed("r", "the deadline fired before the first step at 2026-11-30T08:11:00Z, 1m0s after B")
	wantCauses(t, obs, "r", MissedDecidedAfterB)
}

// B passing while the run is RUNNING (its last step continued, and the
// next has not completed) marks it at B; the late step then adds nothing.
func TestDeadlineMissedWhenBFindsTheRunRunning(t *testing.T) {
	h, obs := newMissHarness(t, 5*time.Second)
	h.create("r", promptGroupSpec())
	ranks := h.trainers("r", 1)
	h.clk.Advance(time.Minute)
	h.stepAll("r", ranks, 1, 60)
	h.clk.Advance(9*time.Minute - time.Millisecond)
	if run := h.get("r"); run.DeadlineMissed {
		t.Fatalf("marked before B: %q", run.DeadlineMissedReason)
	}
	h.clk.Advance(time.Millisecond)
	run := h.wantMissed("r", "the run was still RUNNING at B = 2026-11-30T08:10:00Z: no deadline save had begun (last step 1)")
	if !run.DeadlineMissedAt.AsTime().Equal(t0.Add(10 * time.Minute)) {
		t.Fatalf("deadline_missed_at %v, want B", run.DeadlineMissedAt.AsTime())
	}
	h.clk.Advance(time.Minute)
	h.stepAll("r", ranks, 2, 600)
	h.wantMissed("r", "still RUNNING")
	wantCauses(t, obs, "r", MissedRunningAtB)
}

// Trainer ranks still saving the fired step's checkpoint at B: the run is
// marked, and FAILED by the save's own bound at the same instant.
func TestDeadlineMissedWhenBFindsTheSaveGoing(t *testing.T) {
	h, obs := newMissHarness(t, 5*time.Second)
	h.create("r", turnSpec(2, "00:01:00:00"))
	ranks := h.trainers("r", 2)
	h.fireAtStep1("r", ranks)
	h.checkpoint("r", ranks[:1], 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 30)
	h.clk.Advance(59 * time.Minute)
	run := h.wantMissed("r", "the trainer ranks were still saving the checkpoint of step 1 at B")
	if run.State != v1.RunState_RUN_STATE_FAILED {
		t.Fatalf("run is %v, want FAILED by the save's bound", run.State)
	}
	wantCauses(t, obs, "r", MissedSavingAtB)
}

// The usual deadline sequence, done before B: nothing is marked, at B or
// after it.
func TestDeadlineNotMissedWhenSavedBeforeB(t *testing.T) {
	h, obs := newMissHarness(t, 5*time.Second)
	h.create("r", turnSpec(1, "00:01:00:00"))
	ranks, envs := h.trainers("r", 1), h.envs("r", 1)
	h.fireAtStep1("r", ranks, envs...)
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 30)
	h.reportAll("r", envs, h.saveAtDeadline("r", envs...).SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	h.clk.Advance(2 * time.Hour)
	if run := h.wantState("r", v1.RunState_RUN_STATE_STOPPED); run.DeadlineMissed || run.DeadlineMissedAt != nil || run.DeadlineMissedReason != "" {
		t.Fatalf("deadline_missed %v at %v (%q) for a save done before B", run.DeadlineMissed, run.DeadlineMissedAt, run.DeadlineMissedReason)
	}
	if _, missed := h.warnings("r"); len(missed) != 0 {
		t.Fatalf("DEADLINE MISSED warnings %v", missed)
	}
	wantCauses(t, obs, "r")
}

// The check at B is armed again by a restart, and the mark is stored with
// the run: after another restart it reads the same, and is not made twice.
func TestDeadlineMissedSurvivesRestart(t *testing.T) {
	h, obs := newMissHarness(t, 5*time.Second)
	h.create("r", promptGroupSpec())
	ranks := h.trainers("r", 1)
	h.stepAll("r", ranks, 1, 60)
	h.restart()
	h.clk.Advance(10 * time.Minute)
	before := h.wantMissed("r", "still RUNNING at B")

	h.restart()
	h.clk.Advance(time.Hour)
	after := h.wantMissed("r", "still RUNNING at B")
	if !proto.Equal(after.DeadlineMissedAt, before.DeadlineMissedAt) || after.DeadlineMissedReason != before.DeadlineMissedReason {
		t.Fatalf("after a restart: missed at %v, %q; before: %v, %q", after.DeadlineMissedAt, after.DeadlineMissedReason,
			before.DeadlineMissedAt, before.DeadlineMissedReason)
	}
	h.stepAll("r", ranks, 2, 60)
	h.wantMissed("r", "still RUNNING at B")
	wantCauses(t, obs, "r", MissedRunningAtB)
}

// UpdateDeadline moving B later moves the check: the old B passes
// unmarked, the new one marks.
func TestDeadlineMissedFollowsAMovedB(t *testing.T) {
	h, _ := newMissHarness(t, 5*time.Second)
	h.create("r", promptGroupSpec())
	ranks := h.trainers("r", 1)
	h.stepAll("r", ranks, 1, 60)
	if _, err := h.e.UpdateDeadline(h.ctx, &v1.UpdateDeadlineRequest{RunId: "r", CheckpointMustSaveBy: "00:00:20:00"}); err != nil {
		t.Fatal(err)
	}
	h.clk.Advance(15 * time.Minute)
	if h.get("r").DeadlineMissed {
		t.Fatal("marked at the old B")
	}
	h.clk.Advance(5 * time.Minute)
	h.wantMissed("r", "still RUNNING at B = 2026-11-30T08:20:00Z")
}

// Down across B with the deadline snapshot in flight and no report coming:
// at the end of the restart grace the snapshot's bound and the check at B
// fall due together. Whichever runs first, the run is marked once.
func TestDeadlineMissedOnceWhenTheGraceEnds(t *testing.T) {
	h, obs := newMissHarness(t, time.Hour) // the environment worker outlives the outage
	h.create("r", turnSpec(1, "00:01:00:00"))
	ranks, envs := h.trainers("r", 1), h.envs("r", 1)
	h.fireAtStep1("r", ranks)
	h.checkpoint("r", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 30)
	h.down(time.Hour)
	h.clk.Advance(h.e.opts.RestartGrace - time.Millisecond)
	if h.get("r").DeadlineMissed {
		t.Fatal("marked within the restart grace")
	}
	h.beat("r", envs...)
	h.clk.Advance(time.Millisecond)
	h.wantState("r", v1.RunState_RUN_STATE_STOPPED)
	h.wantMissed("r", "") // the reason depends on which ran first
	if got := obs.of("r"); len(got) != 1 || got[0] != MissedSavingAtB && got[0] != MissedSaveEndedAfterB {
		t.Fatalf("missed deadlines observed %v, want one, the save's", got)
	}
}
