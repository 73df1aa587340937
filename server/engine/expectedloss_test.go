package engine

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/deadline"
)

// elSpec is a turn-level run of two ranks under EXPECTED_LOSS: B = t0 + 1 h,
// priors C 60 s and R 30 s, M 10 s, τ 10 min, a regular save every 10 steps.
func elSpec() *v1.RunSpec {
	s := turnSpec(2, "00:01:00:00")
	s.Checkpointing.CheckpointEverySteps = 10
	s.Reserve = &v1.ReserveSpec{Policy: v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS, MaxLossSeconds: 600,
		MarginSeconds: 10, ExpectedCheckpointSeconds: ptr(60.0), ExpectedSnapshotSeconds: ptr(30.0)}
	return s
}

// elMirror is what the run should have recorded, kept by the test on its
// own: the pure policy decides from it, and the engine must decide alike.
type elMirror struct {
	p deadline.ExpectedLoss
	h deadline.History
	b time.Time
}

func newELMirror() *elMirror {
	h := deadline.NewHistory()
	h.PriorCheckpointSeconds, h.PriorSnapshotSeconds, h.MarginSeconds = 60, 30, 10
	h.LastDurableSave = t0
	return &elMirror{p: deadline.ExpectedLoss{TauSeconds: 600}, h: h, b: t0.Add(time.Hour)}
}

// want is the pure policy's verdict at now for step.
func (m *elMirror) want(now time.Time, step int64) deadline.Verdict {
	return m.p.Assess(now, m.b, step%10 == 0, &m.h).Verdict()
}

// firesAt is the pure policy's earliest firing time for step.
func (m *elMirror) firesAt(step int64) time.Time {
	return m.p.FiresAt(m.b, m.p.Estimate(deadline.Observations{History: &m.h, RegularSaveFollows: step%10 == 0}))
}

// elIterations are the steps' durations, seconds: uneven, with a slow one.
var elIterations = []float64{190, 95, 100, 105, 98, 102, 160, 99, 101, 97}

// elStep completes step after iter seconds, checks the decision against the
// mirror and records the step in it.
func elStep(t *testing.T, h *harness, m *elMirror, ranks, envs []string, step int64) *v1.Decision {
	t.Helper()
	iter := elIterations[int(step-1)%len(elIterations)]
	shown := h.get("el").Deadline
	if want := m.firesAt(step); !shown.FiresAt.AsTime().Equal(want) {
		t.Fatalf("before step %d: fires_at %v, want %v", step, shown.FiresAt.AsTime(), want)
	}
	h.advance(time.Duration(iter*float64(time.Second)), "el", append(ranks, envs...)...)
	m.h.Iterations.Push(iter)
	want := m.want(h.clk.Now(), step)
	h.stepAll("el", ranks, step, iter)
	d := h.step("el", ranks[0], step, iter) // a repeat: the stored decision
	fired := d.Action == v1.StepAction_STEP_ACTION_SAVE_AND_STOP
	if fired != want.Fire || d.Explanation != want.Explanation {
		t.Fatalf("step %d at %v: %v %q, the policy says fire %v %q", step, h.clk.Now(), d.Action, d.Explanation, want.Fire, want.Explanation)
	}
	if fired && h.clk.Now().Before(shown.FiresAt.AsTime()) {
		t.Fatalf("step %d fired at %v, before the fires_at %v shown", step, h.clk.Now(), shown.FiresAt.AsTime())
	}
	in := d.Inputs
	if l := want.Loss; (l == nil) != (in.ExpectedLossNowSeconds == nil) ||
		l != nil && (in.GetExpectedLossNowSeconds() != l.NowSeconds || in.GetExpectedLossNextSeconds() != l.NextSeconds ||
			in.GetMissProbabilityNow() != l.MissNow || in.GetMissProbabilityNext() != l.MissNext) {
		t.Fatalf("step %d: inputs %v, want the losses %+v", step, in, l)
	}
	if !in.LastDurableSave.AsTime().Equal(m.h.LastDurableSave) {
		t.Fatalf("step %d: last_durable_save %v, want %v", step, in.LastDurableSave.AsTime(), m.h.LastDurableSave)
	}
	return d
}

// regularSave has the ranks save step's checkpoint in 50 s and the
// environment the trainer-checkpoint snapshot that follows in 25 s.
func regularSave(t *testing.T, h *harness, m *elMirror, ranks, envs []string, step int64) {
	t.Helper()
	h.advance(50*time.Second, "el", append(ranks, envs...)...)
	h.checkpoint("el", ranks, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 50)
	s := h.lastSnapshot("el")
	if s.AnchorStep != step || s.Reason != v1.SnapshotReason_SNAPSHOT_REASON_TRAINER_CHECKPOINT {
		t.Fatalf("after the checkpoint of step %d: snapshot %v", step, s)
	}
	h.advance(25*time.Second, "el", append(ranks, envs...)...)
	h.reportAll("el", envs, s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	m.h.Checkpoints.Push(50)
	m.h.Snapshots.Push(25)
	m.h.LastDurableSave = h.clk.Now()
}

// A run under EXPECTED_LOSS decides every step as the pure policy does from
// the durations the run reported (its regular saves included), shows the
// losses it weighed, gives every rank the same answer, fires once and then
// answers STOP.
func TestExpectedLossDecidesAsThePolicy(t *testing.T) {
	h := newHarnessWith(t, Options{HeartbeatInterval: time.Minute})
	h.create("el", elSpec())
	ranks, envs := h.trainers("el", 2), h.envs("el", 1)
	m := newELMirror()
	var fired *v1.Decision
	weighed := 0
	for step := int64(1); fired == nil; step++ {
		if step > 60 {
			t.Fatal("no step fired in 60")
		}
		d := elStep(t, h, m, ranks, envs, step)
		if d.Inputs.ExpectedLossNowSeconds != nil {
			weighed++
		}
		switch {
		case d.Action == v1.StepAction_STEP_ACTION_SAVE_AND_STOP:
			fired = d
		case step%10 == 0:
			regularSave(t, h, m, ranks, envs, step)
		}
	}
	if weighed == 0 || !strings.Contains(fired.Explanation, "saving now: expected loss") {
		t.Fatalf("the firing decision %q (and %d weighed): want the losses weighed", fired.Explanation, weighed)
	}
	run := h.wantState("el", v1.RunState_RUN_STATE_SAVING)
	if run.FiredAtStep != fired.Step || run.FireKind != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_STEP {
		t.Fatalf("fired at step %d (%v), decided at %d", run.FiredAtStep, run.FireKind, fired.Step)
	}
	// Latched: a rank asking again gets the same decision; the next step stops.
	if d := h.step("el", ranks[1], fired.Step, 1); !proto.Equal(d, fired) {
		t.Fatalf("step %d asked again: %v, want %v", fired.Step, d, fired)
	}
	if a := h.stepAll("el", ranks, fired.Step+1, 1); a != v1.StepAction_STEP_ACTION_STOP {
		t.Fatalf("the step after the fired one: %v", a)
	}
	evs := h.decisionEvents("el")
	if last := evs[len(evs)-2]; !proto.Equal(last.Decision, fired) {
		t.Fatalf("the decision event of step %d carries %v, want %v", fired.Step, last.Decision, fired)
	}
}

// The histories and the last durable save survive a restart: the run shows
// the same deadline, and goes on deciding as the policy does from all it
// recorded before.
func TestExpectedLossAcrossARestart(t *testing.T) {
	h := newHarnessWith(t, Options{HeartbeatInterval: time.Minute})
	h.create("el", elSpec())
	ranks, envs := h.trainers("el", 2), h.envs("el", 1)
	m := newELMirror()
	step := int64(1)
	for ; step <= 10; step++ {
		elStep(t, h, m, ranks, envs, step)
	}
	regularSave(t, h, m, ranks, envs, 10)
	before := h.get("el").Deadline
	if !before.LastDurableSave.AsTime().Equal(m.h.LastDurableSave) || m.h.LastDurableSave.Equal(t0) {
		t.Fatalf("last_durable_save %v, want the end of step 10's snapshot %v", before.LastDurableSave.AsTime(), m.h.LastDurableSave)
	}

	h.restart()
	if after := h.get("el").Deadline; !proto.Equal(after, before) {
		t.Fatalf("after a restart Run.deadline is\n%v\nwas\n%v", after, before)
	}
	for ; ; step++ {
		if step > 60 {
			t.Fatal("no step fired in 60")
		}
		if d := elStep(t, h, m, ranks, envs, step); d.Action == v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
			break
		} else if step%10 == 0 {
			regularSave(t, h, m, ranks, envs, step)
		}
	}
}

// The histories are bounded: after many steps the record holds at most the
// policy's capacities.
func TestExpectedLossHistoryIsBounded(t *testing.T) {
	h := newHarnessWith(t, Options{HeartbeatInterval: time.Minute})
	spec := elSpec()
	spec.Checkpointing.CheckpointMustSaveBy = "" // no deadline: it never fires
	spec.Checkpointing.CheckpointEverySteps = 0
	spec.TrainerWorldSize = 1
	h.create("el", spec)
	ranks, envs := h.trainers("el", 1), h.envs("el", 1)
	for step := int64(1); step <= 3*deadline.IterationHistory; step++ {
		h.advance(time.Second, "el", append(ranks, envs...)...)
		h.stepAll("el", ranks, step, float64(step))
		h.checkpoint("el", ranks, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, float64(step))
		h.reportAll("el", envs, h.lastSnapshot("el").SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	}
	r, err := h.e.run("el")
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	it, ck, sn := r.rec.RecentIterationSeconds, r.rec.RecentCheckpointSeconds, r.rec.RecentSnapshotSeconds
	if len(it) != deadline.IterationHistory || it[len(it)-1] != 3*deadline.IterationHistory ||
		len(ck) != deadline.CheckpointHistory || ck[len(ck)-1] != 3*deadline.IterationHistory || len(sn) != deadline.SnapshotHistory {
		t.Fatalf("histories of %d, %d and %d values (latest iteration %v, checkpoint %v)", len(it), len(ck), len(sn), it, ck)
	}
	if r.rec.LastDurableStep != 3*deadline.IterationHistory {
		t.Fatalf("last durable step %d", r.rec.LastDurableStep)
	}
}

// A Max run records no history: its hot path and record are as before.
func TestMaxRecordsNoHistory(t *testing.T) {
	h := newHarness(t)
	h.create("max", turnSpec(1, "00:01:00:00"))
	ranks, envs := h.trainers("max", 1), h.envs("max", 1)
	h.stepAll("max", ranks, 1, 10)
	h.checkpoint("max", ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	h.reportAll("max", envs, h.lastSnapshot("max").SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	r, _ := h.e.run("max")
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec := r.rec; len(rec.RecentIterationSeconds)+len(rec.RecentCheckpointSeconds)+len(rec.RecentSnapshotSeconds) != 0 ||
		rec.LastDurableSave != nil || rec.Run.Deadline.LastDurableSave != nil {
		t.Fatalf("a Max run recorded a history: %v", rec)
	}
}

// τ without the policy that reads it is refused, naming the field.
func TestMaxLossNeedsExpectedLoss(t *testing.T) {
	h := newHarness(t)
	spec := turnSpec(1, "00:01:00:00")
	spec.Reserve = &v1.ReserveSpec{MaxLossSeconds: 600}
	_, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "r", Spec: spec})
	wantErr(t, err, ErrInvalidArgument, "spec.reserve.max_loss_seconds")
}

// What counts as the last durable save: at turn level a published
// checkpoint only once a snapshot of it is SAVED, as of its publication
// when that is an interval snapshot (the trainers went on meanwhile); at
// prompt-group level the published checkpoint alone.
func TestLastDurableSave(t *testing.T) {
	h := newHarnessWith(t, Options{HeartbeatInterval: time.Minute})
	turn := turnSpec(1, "00:01:00:00")
	turn.RolloutCheckpointing = &v1.RolloutCheckpointingSpec{SnapshotOnTrainerCheckpoint: ptr(false), SnapshotAttemptIntervalS: ptr[int32](60)}
	turn.Reserve = &v1.ReserveSpec{Policy: v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS}
	group := turnSpec(1, "00:01:00:00")
	group.RolloutRecovery.TargetLevel = v1.TargetLevel_TARGET_LEVEL_PROMPT_GROUP
	group.Reserve = &v1.ReserveSpec{Policy: v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS}
	h.create("turn", turn)
	h.create("group", group)
	tr, te := h.trainers("turn", 1), h.envs("turn", 1)
	gr := h.trainers("group", 1)
	durable := func(run string) time.Time { return h.get(run).Deadline.LastDurableSave.AsTime() }

	h.advance(20*time.Second, "turn", append(tr, te...)...)
	h.beat("group", gr...)
	h.stepAll("turn", tr, 1, 20)
	h.stepAll("group", gr, 1, 20)
	h.checkpoint("turn", tr, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	h.checkpoint("group", gr, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	published := h.clk.Now()
	if got := durable("group"); !got.Equal(published) {
		t.Fatalf("prompt-group level: last durable save %v, want the publication %v", got, published)
	}
	if got := durable("turn"); !got.Equal(t0) {
		t.Fatalf("turn level before any snapshot: last durable save %v, want the run's start %v", got, t0)
	}
	h.advance(40*time.Second, "turn", append(tr, te...)...) // the interval snapshot, anchored to step 1
	s := h.lastSnapshot("turn")
	if s.Reason != v1.SnapshotReason_SNAPSHOT_REASON_INTERVAL || s.AnchorStep != 1 {
		t.Fatalf("snapshot %v, want an interval one anchored to step 1", s)
	}
	h.advance(10*time.Second, "turn", append(tr, te...)...)
	h.reportAll("turn", te, s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	if got := durable("turn"); !got.Equal(published) {
		t.Fatalf("turn level after the interval snapshot: last durable save %v, want the checkpoint's publication %v", got, published)
	}
}
