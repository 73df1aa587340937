package engine

import (
	"fmt"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// A safety save (reserve.safety_saves, issue 15 part 3) is a step answered
// SAVE_AND_CONTINUE: the ranks save the step's checkpoint and report it as
// any checkpoint, the environment workers snapshot after it at turn/prefix
// level, and training goes on. The run record holds its step while it is
// in flight, so that no second one is issued before the first is durable
// (the policy would see the same work at stake and ask again).

// safetySavesNow: the policy may answer SAVE_AND_CONTINUE at the next step.
func safetySavesNow(r *runState) bool {
	return r.rec.Run.Spec.GetReserve().GetSafetySaves() && r.rec.SafetySaveStep == 0
}

// checkSafetySaves rejects safety saves the engine cannot carry out.
func checkSafetySaves(s *v1.RunSpec) error {
	res := s.Reserve
	switch {
	case !res.SafetySaves:
		return nil
	case res.Policy != v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS:
		return errorf(ErrInvalidArgument, "spec.reserve.safety_saves: only with reserve.policy RESERVE_POLICY_EXPECTED_LOSS (the policy is %s)", res.Policy)
	case s.Checkpointing.DeferredFinalize:
		// The trainers publish such a checkpoint when they like, so the
		// save could not be known durable in time to matter.
		return errorf(ErrInvalidArgument, "spec.reserve.safety_saves: not with checkpointing.deferred_finalize")
	}
	return nil
}

// startSafetySave records the safety save of step, decided just now.
func (m safetyMut) startSafetySave(step int64) {
	m.r.rec.SafetySaveStep = step
	m.dirty()
}

// safetyCheckpointPublished goes on with the safety save once its
// checkpoint (or a newer one) is published: done where no snapshot is
// needed; else the snapshot, which a trainer-checkpoint snapshot already
// is when the spec asks for those. It reports whether published should
// issue one.
func (m safetyMut) safetyCheckpointPublished(step int64) (snapshot bool) {
	r := m.r
	if r.rec.SafetySaveStep == 0 || step < r.rec.SafetySaveStep {
		return false
	}
	if !needsSnapshots(r.rec.Run.Spec.RolloutRecovery.TargetLevel) {
		m.endSafetySave()
		return false
	}
	return true
}

// safetySavedBeforeAsked goes on with a safety save whose checkpoint was
// published before the step was decided (ranks that checkpoint a step
// before asking about it): no publication is still to come.
func (m safetyMut) safetySavedBeforeAsked(st *storagev1.StepRecord) {
	if st.Decision.GetAction() != v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE || !st.Published || m.r.fired() {
		return
	}
	if m.safetyCheckpointPublished(st.Step) {
		m.snapshots().trySnapshot(v1.SnapshotReason_SNAPSHOT_REASON_TRAINER_CHECKPOINT, st.Step)
		m.safetySnapshotIssued(st.Step)
	}
}

// safetySnapshotIssued ends the safety save when its snapshot could not be
// issued (another in flight, no environment worker live): it can never be
// durable, and the policy may ask for another.
func (m safetyMut) safetySnapshotIssued(step int64) {
	if a := m.snapshots().activeSnapshot(); a == nil || a.AnchorStep != step {
		m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_WARNING, Step: step,
			Message: fmt.Sprintf("safety save of step %d: no snapshot could be issued, so it is not a durable save", step)})
		m.endSafetySave()
	}
}

// safetySnapshotCompleted ends the safety save with its snapshot (or a
// newer one), whatever the outcome.
func (m safetyMut) safetySnapshotCompleted(s *v1.Snapshot) {
	if step := m.r.rec.SafetySaveStep; step != 0 && s.AnchorStep >= step {
		m.endSafetySave()
	}
}

// endSafetySave: the safety save in flight is over (its checkpoint and
// snapshot events say how); the policy may ask for another.
func (m safetyMut) endSafetySave() {
	m.r.rec.SafetySaveStep = 0
	m.dirty()
}
