package engine

import (
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/deadline"
)

// The expected-loss policy (reserve.policy EXPECTED_LOSS) decides from
// bounded histories of the run's durations and from when its last durable
// save ended. The engine keeps them in the run record, persisted with it
// like every estimate, and only for runs under that policy: a Max run
// records nothing more than before.

// policyOf is the rule that decides r's steps.
func (e *Engine) policyOf(r *runState) deadline.Policy {
	if expectedLoss(r) {
		return deadline.ExpectedLoss{TauSeconds: r.rec.Run.Spec.GetReserve().GetMaxLossSeconds(), SafetySaves: safetySavesNow(r)}
	}
	return e.policy
}

func expectedLoss(r *runState) bool {
	return r.rec.Run.Spec.GetReserve().GetPolicy() == v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS
}

// checkPolicy rejects τ without the policy that reads it: the operator
// would believe a bound that nothing enforces.
func checkPolicy(s *v1.RunSpec) error {
	res := s.Reserve
	if res.MaxLossSeconds != 0 && res.Policy != v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS {
		return errorf(ErrInvalidArgument, "spec.reserve.max_loss_seconds: only with reserve.policy RESERVE_POLICY_EXPECTED_LOSS (the policy is %s)", res.Policy)
	}
	return nil
}

// history is r's deadline.History, rebuilt from the run record: a few
// hundred bytes copied, at a decision or a read of Run.deadline.
func (r *runState) history() *deadline.History {
	res := r.rec.Run.Spec.Reserve
	return &deadline.History{
		Iterations:             deadline.NewRing(deadline.IterationHistory, r.rec.RecentIterationSeconds...),
		Checkpoints:            deadline.NewRing(deadline.CheckpointHistory, r.rec.RecentCheckpointSeconds...),
		Snapshots:              deadline.NewRing(deadline.SnapshotHistory, r.rec.RecentSnapshotSeconds...),
		PriorCheckpointSeconds: res.GetExpectedCheckpointSeconds(),
		PriorSnapshotSeconds:   res.GetExpectedSnapshotSeconds(),
		MarginSeconds:          res.MarginSeconds,
		LastDurableSave:        r.lastDurableSave(),
	}
}

// lastDurableSave is when the newest save a restart could resume from
// ended, or the run's start until there is one.
func (r *runState) lastDurableSave() time.Time {
	if t := r.rec.LastDurableSave; t != nil {
		return t.AsTime()
	}
	return r.rec.Run.Spec.StartedAt.AsTime()
}

// pushBounded appends v and keeps the latest n values.
func pushBounded(vs []float64, v float64, n int) []float64 {
	vs = append(vs, v)
	if len(vs) > n {
		vs = append([]float64(nil), vs[len(vs)-n:]...)
	}
	return vs
}

// recordIteration keeps one value per step, the max over its ranks. A rank
// that reports an older step than the latest recorded adds nothing: the
// history is of the latest steps.
func (m historyMut) recordIteration(step int64, sec float64) {
	rec := m.r.rec
	if !expectedLoss(m.r) {
		return
	}
	switch n := len(rec.RecentIterationSeconds); {
	case n > 0 && step == rec.RecentIterationStep:
		if sec <= rec.RecentIterationSeconds[n-1] {
			return
		}
		rec.RecentIterationSeconds[n-1] = sec
	case step > rec.RecentIterationStep:
		rec.RecentIterationSeconds = pushBounded(rec.RecentIterationSeconds, sec, deadline.IterationHistory)
		rec.RecentIterationStep = step
	default:
		return
	}
	m.dirty()
}

// recordCheckpoint records a checkpoint every rank saved: its slowest rank.
func (m historyMut) recordCheckpoint(sec float64) {
	if !expectedLoss(m.r) {
		return
	}
	m.r.rec.RecentCheckpointSeconds = pushBounded(m.r.rec.RecentCheckpointSeconds, sec, deadline.CheckpointHistory)
	m.dirty()
}

// recordSnapshot records a SAVED snapshot's duration (what R is fed).
func (m historyMut) recordSnapshot(sec float64) {
	if !expectedLoss(m.r) {
		return
	}
	m.r.rec.RecentSnapshotSeconds = pushBounded(m.r.rec.RecentSnapshotSeconds, sec, deadline.SnapshotHistory)
	m.dirty()
}

// durableOnPublish: a checkpoint just published as the newest. Where the
// target level needs no environment snapshot (prompt group, sibling), a
// restart resumes from the checkpoint alone, so it is the durable save.
func (m historyMut) durableOnPublish(step int64) {
	r := m.r
	if !expectedLoss(r) {
		return
	}
	r.rec.LastPublishedAt = m.ts()
	m.dirty()
	if !needsSnapshots(r.rec.Run.Spec.RolloutRecovery.TargetLevel) {
		m.setDurable(step, m.now)
	}
}

// durableOnSnapshot: a snapshot was SAVED. At turn/prefix level a restart
// needs the checkpoint and a snapshot anchored to it. After a
// trainer-checkpoint snapshot, which the trainers wait for before their next
// iteration, the save ended now; an interval or manual snapshot of the
// newest checkpoint makes that checkpoint durable as of its publication
// (the trainers went on meanwhile, and a restart redoes that). A snapshot of
// an older checkpoint, whose publication time is no longer kept, changes
// nothing: the work at stake is then overstated, never understated.
func (m historyMut) durableOnSnapshot(s *v1.Snapshot) {
	r := m.r
	anchor := s.AnchorStep
	if !needsSnapshots(r.rec.Run.Spec.RolloutRecovery.TargetLevel) || anchor <= 0 || anchor <= r.rec.LastDurableStep {
		return
	}
	switch {
	case s.Reason == v1.SnapshotReason_SNAPSHOT_REASON_TRAINER_CHECKPOINT:
		m.setDurable(anchor, m.now)
	case anchor == r.rec.Run.LastPublishedStep && r.rec.LastPublishedAt != nil:
		m.setDurable(anchor, r.rec.LastPublishedAt.AsTime())
	}
}

func (m historyMut) setDurable(step int64, at time.Time) {
	if !expectedLoss(m.r) {
		return
	}
	m.r.rec.LastDurableSave = timestamppb.New(at)
	m.r.rec.LastDurableStep = step
	m.dirty()
}

// withLoss adds the expected-loss figures of a verdict to a decision's
// inputs.
func withLoss(d *v1.Deadline, l *deadline.Loss) {
	if l == nil {
		return
	}
	d.ExpectedLossNowSeconds = proto.Float64(l.NowSeconds)
	d.ExpectedLossNextSeconds = proto.Float64(l.NextSeconds)
	d.MissProbabilityNow = proto.Float64(l.MissNow)
	d.MissProbabilityNext = proto.Float64(l.MissNext)
	if l.Safety {
		d.ExpectedLossSafetySeconds = proto.Float64(l.SafetySeconds)
	}
}
