package engine

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/deadline"
)

// safetySpec is a turn-level run of two ranks under EXPECTED_LOSS with
// safety saves: B = t0 + 4 h, priors C 120 s and R 60 s, M 60 s, no
// regular saves, and no snapshot after a trainer checkpoint (a safety
// save's snapshot is issued anyway).
func safetySpec() *v1.RunSpec {
	s := turnSpec(2, "00:04:00:00")
	s.RolloutCheckpointing = &v1.RolloutCheckpointingSpec{SnapshotOnTrainerCheckpoint: ptr(false)}
	s.Reserve = &v1.ReserveSpec{Policy: v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS, SafetySaves: true,
		MarginSeconds: 60, ExpectedCheckpointSeconds: ptr(120.0), ExpectedSnapshotSeconds: ptr(60.0)}
	return s
}

// safetyIteration: 10-minute steps, one in eight twice as long: near B one
// more step risks hours of work, and a 3-minute save first is cheaper.
func safetyIteration(step int64) float64 { return 600 * float64(1+int(step)%8/7) }

// safetyRun is a run of safetySpec and what the test knows of it: the
// history the run should have recorded, and B.
type safetyRun struct {
	h            *harness
	ranks, alive []string
	m            deadline.History
	b            time.Time
}

func newSafetyRun(t *testing.T) *safetyRun {
	h := newHarnessWith(t, Options{HeartbeatInterval: time.Hour})
	h.create("s", safetySpec())
	ranks, envs := h.trainers("s", 2), h.envs("s", 1)
	s := &safetyRun{h: h, ranks: ranks, alive: append(append([]string{}, ranks...), envs...), m: deadline.NewHistory(), b: t0.Add(4 * time.Hour)}
	s.m.PriorCheckpointSeconds, s.m.PriorSnapshotSeconds, s.m.MarginSeconds, s.m.LastDurableSave = 120, 60, 60, t0
	return s
}

// next lets step's iteration pass and records it.
func (s *safetyRun) next(step int64) (iter float64) {
	iter = safetyIteration(step)
	s.h.advance(time.Duration(iter)*time.Second, "s", s.alive...)
	s.m.Iterations.Push(iter)
	return iter
}

// A run with safety saves answers SAVE_AND_CONTINUE where the pure policy
// does, to every rank; the run stays RUNNING, its checkpoint is followed
// by a snapshot, and once both are saved (across a coordinator restart) it
// is the run's last durable save, from which the next steps are decided as
// usual until the deadline fires.
func TestSafetySave(t *testing.T) {
	s := newSafetyRun(t)
	h, ranks, alive := s.h, s.ranks, s.alive
	envs := alive[len(ranks):]
	p := deadline.ExpectedLoss{SafetySaves: true}
	safety := int64(0)
	for step := int64(1); ; step++ {
		if step > 40 {
			t.Fatal("no step fired in 40")
		}
		iter := s.next(step)
		want := p.Assess(h.clk.Now(), s.b, false, &s.m)
		h.stepAll("s", ranks, step, iter)
		d := h.step("s", ranks[0], step, iter)
		if d.Explanation != want.Explanation {
			t.Fatalf("step %d: %v %q, the policy says %q", step, d.Action, d.Explanation, want.Explanation)
		}
		if want.Fire {
			if d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
				t.Fatalf("step %d: %v, want SAVE_AND_STOP", step, d.Action)
			}
			break
		}
		if !want.SafetySave {
			continue
		}
		if d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE || d.Inputs.ExpectedLossSafetySeconds == nil ||
			d.Inputs.GetExpectedLossSafetySeconds() != want.LossSafetySeconds {
			t.Fatalf("step %d: %v, inputs %v; want SAVE_AND_CONTINUE with the safety loss %v", step, d.Action, d.Inputs, want.LossSafetySeconds)
		}
		if safety != 0 {
			continue // a later one: the first is enough to follow through
		}
		safety = step
		h.wantState("s", v1.RunState_RUN_STATE_RUNNING)
		h.advance(2*time.Minute, "s", alive...)
		h.checkpoint("s", ranks, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 120)
		snap := h.lastSnapshot("s")
		if snap.AnchorStep != step || snap.Reason != v1.SnapshotReason_SNAPSHOT_REASON_TRAINER_CHECKPOINT {
			t.Fatalf("after the safety save's checkpoint: snapshot %v, want one anchored to step %d", snap, step)
		}
		h.advance(time.Minute, "s", alive...)
		h.restart() // the safety save in flight survives it
		h.beat("s", alive...)
		h.reportAll("s", envs, snap.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
		s.m.Checkpoints.Push(120)
		s.m.Snapshots.Push(1) // issued before the restart: the duration the worker reported
		s.m.LastDurableSave = h.clk.Now()
		if got := h.get("s").Deadline.LastDurableSave.AsTime(); !got.Equal(s.m.LastDurableSave) {
			t.Fatalf("after the safety save: last durable save %v, want %v", got, s.m.LastDurableSave)
		}
		h.wantState("s", v1.RunState_RUN_STATE_RUNNING)
	}
	if safety == 0 {
		t.Fatal("no safety save before the deadline fired")
	}
}

// While a safety save is in flight no other is issued: the next steps are
// decided without them, as the pure policy decides with them off.
func TestSafetySaveInFlightIssuesNoOther(t *testing.T) {
	s := newSafetyRun(t)
	h, ranks := s.h, s.ranks
	on, off := deadline.ExpectedLoss{SafetySaves: true}, deadline.ExpectedLoss{}
	inFlight := false
	for step := int64(1); ; step++ {
		if step > 40 {
			t.Fatal("no step fired in 40")
		}
		iter := s.next(step)
		p := on
		if inFlight {
			p = off
		}
		want := p.Assess(h.clk.Now(), s.b, false, &s.m)
		d := h.step("s", ranks[0], step, iter)
		if d.Explanation != want.Explanation {
			t.Fatalf("step %d (a safety save in flight: %v): %q, the policy says %q", step, inFlight, d.Explanation, want.Explanation)
		}
		if inFlight && d.Action == v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE {
			t.Fatalf("step %d: a second safety save while the first is in flight", step)
		}
		h.step("s", ranks[1], step, iter)
		if d.Action == v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
			if !inFlight {
				t.Fatal("the deadline fired before any safety save")
			}
			break
		}
		inFlight = inFlight || d.Action == v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE
		// The ranks never report the safety save's checkpoint.
	}
}

// Safety saves need the expected-loss policy, and published checkpoints.
func TestSafetySavesSpec(t *testing.T) {
	h := newHarness(t)
	spec := safetySpec()
	spec.Reserve.Policy = v1.ReservePolicy_RESERVE_POLICY_MAX
	_, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "max", Spec: spec})
	wantErr(t, err, ErrInvalidArgument, "spec.reserve.safety_saves")
	spec = safetySpec()
	spec.Checkpointing.DeferredFinalize = true
	_, err = h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: "deferred", Spec: spec})
	wantErr(t, err, ErrInvalidArgument, "spec.reserve.safety_saves")
	if err == nil || !strings.Contains(err.Error(), "deferred_finalize") {
		t.Fatalf("error %v does not name deferred_finalize", err)
	}
	h.create("ok", safetySpec())
	want := safetySpec().Reserve
	want.Window = defaultReserveWindow
	if got := h.get("ok").Spec.Reserve; !proto.Equal(got, want) {
		t.Fatalf("reserve %v", got)
	}
}
