package engine

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// benchDecide measures one decision as the engine makes it (the run's
// policy, its observations, the estimates, the rule and the Decision with
// its inputs), without the commit around it: the run has completed step
// 40 of iterations 100 s, checkpoints 50 s and snapshots 25 s, and step 41
// is decided `before` ahead of B. The answer must be CONTINUE, so that
// every iteration decides the same way (a fire would change the run): it
// is checked on a copy of the run.
func benchDecide(b *testing.B, spec *v1.RunSpec, before time.Duration) {
	h := newHarnessWith(b, Options{HeartbeatInterval: time.Hour})
	h.create("bench", spec)
	ranks, envs := h.trainers("bench", 1), h.envs("bench", 1)
	for step := int64(1); step <= 40; step++ {
		h.clk.Advance(100 * time.Second)
		h.stepAll("bench", ranks, step, 100)
		if step%5 == 0 {
			h.checkpoint("bench", ranks, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 50)
			h.clk.Advance(25 * time.Second)
			h.reportAll("bench", envs, h.lastSnapshot("bench").SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
		}
	}
	r, err := h.e.run("bench")
	if err != nil {
		b.Fatal(err)
	}
	bb, _ := r.mustSaveBy()
	now := bb.Add(-before)
	r.mu.Lock()
	defer r.mu.Unlock()
	probe := newRunState(proto.Clone(r.rec).(*storagev1.RunRecord)) // the clock stands: no timer it arms runs
	if d := (&mut{e: h.e, r: probe, now: now}).steps().decide(41, localAction{}); d.Action != v1.StepAction_STEP_ACTION_CONTINUE {
		b.Fatalf("%s before B: %v (%s), want CONTINUE", before, d.Action, d.Explanation)
	}
	b.ReportAllocs()
	for b.Loop() {
		m := mut{e: h.e, r: r, now: now}
		m.steps().decide(41, localAction{})
	}
}

// benchSpec is a turn-level run of one rank with a budget of 2 h, priors C
// 50 s and R 25 s, M 60 s.
func benchSpec(policy v1.ReservePolicy) *v1.RunSpec {
	s := turnSpec(1, "00:02:00:00")
	s.Reserve = &v1.ReserveSpec{Policy: policy, MarginSeconds: 60, ExpectedCheckpointSeconds: ptr(50.0), ExpectedSnapshotSeconds: ptr(25.0)}
	return s
}

// BenchmarkDecide: far from B (the worst case fits) and near it, where
// ExpectedLoss weighs the losses; with a regular save to follow the step
// (checkpoint_every_steps 41) or with safety saves, its costliest cases. The bar for the worst case: under 100 µs.
func BenchmarkDecide(b *testing.B) {
	for _, bc := range []struct {
		name   string
		policy v1.ReservePolicy
		every  int32
		safety bool
		before time.Duration
	}{
		{"Max/far", v1.ReservePolicy_RESERVE_POLICY_UNSPECIFIED, 0, false, time.Hour},
		{"ExpectedLoss/far", v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS, 0, false, time.Hour},
		{"ExpectedLoss/near", v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS, 0, false, 330 * time.Second},
		{"ExpectedLoss/near-regular-save", v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS, 41, false, 500 * time.Second},
		{"ExpectedLoss/near-safety-saves", v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS, 0, true, 400 * time.Second},
	} {
		b.Run(bc.name, func(b *testing.B) {
			spec := benchSpec(bc.policy)
			spec.Checkpointing.CheckpointEverySteps = bc.every
			spec.Reserve.SafetySaves = bc.safety
			benchDecide(b, spec, bc.before)
		})
	}
}
