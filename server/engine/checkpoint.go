package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/deadline"
)

func (e *Engine) ReportCheckpoint(ctx context.Context, req *v1.ReportCheckpointRequest) (*v1.ReportCheckpointResponse, error) {
	var state v1.RunState
	err := e.mutate(ctx, req.RunId, func(m *mut) error {
		w, err := m.r.worker(req.WorkerId, req.Incarnation, v1.WorkerRole_WORKER_ROLE_TRAINER, "ReportCheckpoint")
		if err != nil {
			return err
		}
		if err := m.steps().admit(req.Step, w.w.Rank); err != nil {
			return err
		}
		st, err := m.steps().step(ctx, req.Step)
		if err != nil {
			return err
		}
		if req.Phase == v1.CheckpointPhase_CHECKPOINT_PHASE_PUBLISHED {
			err = m.steps().checkpointPublished(req.Step, st)
		} else {
			err = m.steps().checkpointSaved(req.Step, st, w.w.Rank, req.SaveSeconds)
		}
		state = m.r.state()
		return err
	})
	if err != nil {
		return nil, err
	}
	return &v1.ReportCheckpointResponse{RunState: state}, nil
}

// checkpointSaved records one rank's SAVED report; the last rank completes
// the checkpoint.
func (m stepMut) checkpointSaved(step int64, st *storagev1.StepRecord, rank int32, sec float64) error {
	r := m.r
	if st != nil && slices.Contains(st.SavedRanks, rank) {
		return nil // a retry
	}
	if r.terminal() {
		return errorf(ErrFailedPrecondition, "run %q is %s: no new checkpoint reports", r.id, stateName(r.state()))
	}
	if st == nil {
		st = &storagev1.StepRecord{Step: step}
	}
	st.SavedRanks = append(st.SavedRanks, rank)
	st.MaxSaveSeconds = max(st.MaxSaveSeconds, sec)
	if !r.rec.CheckpointMeasured || sec > r.rec.MaxCheckpointSeconds {
		r.rec.CheckpointMeasured = true
		r.rec.MaxCheckpointSeconds = max(r.rec.MaxCheckpointSeconds, sec)
		m.dirty()
	}
	if !st.Saved && len(st.SavedRanks) >= int(r.rec.Run.Spec.TrainerWorldSize) {
		st.Saved = true
		m.history().recordCheckpoint(st.MaxSaveSeconds)
	}
	// Put only now: a batch keeps the record as it was when put, and with
	// deferred finalize nothing puts it again until PUBLISHED, so a Saved
	// set after the put would be lost by a restart.
	m.putStep(st)
	if !st.Saved {
		return nil
	}
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_CHECKPOINT_SAVED, Step: step,
		Message: fmt.Sprintf("checkpoint of step %d saved by all %d ranks (slowest %.3g s)", step, len(st.SavedRanks), st.MaxSaveSeconds)})
	runID, slowest := r.id, st.MaxSaveSeconds
	m.observe(func(ctx context.Context) { m.e.obs.CheckpointSaved(ctx, runID, step, slowest) })
	switch {
	case !r.rec.Run.Spec.Checkpointing.DeferredFinalize:
		m.published(st)
	case m.isFiredStep(step):
		m.requestPublish(step)
	}
	return nil
}

// requestPublish asks the trainers to publish the fired step's checkpoint,
// saved by every rank (deferred finalize).
func (m stepMut) requestPublish(step int64) {
	m.r.rec.PublishRequested = true
	m.log().command(v1.WorkerRole_WORKER_ROLE_TRAINER, &v1.Command{Kind: &v1.Command_PublishCheckpoint{
		PublishCheckpoint: &v1.PublishCheckpointCommand{Step: step}}})
}

// savedBeforeAsked goes on with the deadline save of a step that fired
// after every rank had already saved its checkpoint: ranks that checkpoint
// a step before asking about it. No SAVED that would move the save on is
// still to come (a rank's second one is a retry), so it moves on now.
func (m stepMut) savedBeforeAsked(st *storagev1.StepRecord) {
	switch {
	case !m.isFiredStep(st.Step):
	case st.Published:
		m.startDeadlineSave(st.Step)
	case st.Saved: // deferred finalize
		m.requestPublish(st.Step)
	}
}

func (m stepMut) checkpointPublished(step int64, st *storagev1.StepRecord) error {
	r := m.r
	if st != nil && st.Published {
		return nil // a retry, or SAVED already meant published
	}
	if r.terminal() {
		return errorf(ErrFailedPrecondition, "run %q is %s: no new checkpoint reports", r.id, stateName(r.state()))
	}
	if st == nil || !st.Saved {
		return errorf(ErrFailedPrecondition, "step: the checkpoint of step %d is not saved by all ranks yet; report CHECKPOINT_PHASE_SAVED first", step)
	}
	m.published(st)
	return nil
}

// published makes a checkpoint visible and starts what follows it: the
// deadline snapshot at the fired step, else a trainer-checkpoint snapshot at
// turn/prefix level.
func (m stepMut) published(st *storagev1.StepRecord) {
	r := m.r
	st.Published = true
	m.putStep(st)
	newer := r.rec.Run.LastPublishedStep
	if st.Step > newer {
		r.rec.Run.LastPublishedStep = st.Step
		m.history().durableOnPublish(st.Step)
	}
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_CHECKPOINT_PUBLISHED, Step: st.Step,
		Message: fmt.Sprintf("checkpoint of step %d published", st.Step)})
	if m.isFiredStep(st.Step) {
		m.startDeadlineSave(st.Step)
		return
	}
	safety := m.safety().safetyCheckpointPublished(st.Step)
	if r.fired() || !snapshotAfterCheckpoint(r.rec.Run.Spec) && !safety {
		return
	}
	if st.Step < newer {
		// Finalized out of order: the environments have moved on past
		// this checkpoint, and the newer one already had its snapshot. A
		// snapshot anchored here would pair today's environment state with
		// an older model.
		m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_SNAPSHOT_TICK_SKIPPED, Step: st.Step,
			Message: fmt.Sprintf("trainer-checkpoint snapshot skipped: the checkpoint of step %d was published after the newer one of step %d", st.Step, newer)})
		return
	}
	m.snapshots().trySnapshot(v1.SnapshotReason_SNAPSHOT_REASON_TRAINER_CHECKPOINT, st.Step)
	if safety {
		m.safety().safetySnapshotIssued(st.Step)
	}
}

func (m stepMut) isFiredStep(step int64) bool {
	r := m.r
	return r.state() == v1.RunState_RUN_STATE_SAVING && r.rec.Run.FiredAtStep == step
}

// armSaveTimeout bounds the trainers' deadline save. A rank that has not
// saved (or, with deferred finalize, a checkpoint not published) by B fails
// the run with the late ranks named, instead of leaving it SAVING forever
// behind a rank that died mid-save.
func (m stepMut) armSaveTimeout() {
	r := m.r
	if r.state() != v1.RunState_RUN_STATE_SAVING {
		m.disarm(timerSave)
		m.disarm(timerSaveLate)
		return
	}
	at := m.saveDeadline()
	m.arm(timerSave, m.afterGrace(at), func(m *mut) {
		if m.r.state() == v1.RunState_RUN_STATE_SAVING {
			m.failRun(m.steps().lateSave(at))
		}
	})
	m.armSaveLate()
}

// armSaveLate warns of the ranks that have not reported the deadline
// checkpoint once the environment snapshot and the margin no longer fit
// before the save's bound (B - R - M, and not before C + M from the fire):
// the run would fail only at B, and a loop that saves but never reports (a
// forgotten checkpoint_saved() in the NeMo RL drop-in) deserves to hear why
// while there is time. After a restart past that moment it stays quiet: the
// bound at B still holds.
func (m stepMut) armSaveLate() {
	d := m.e.deadlineView(m.r)
	fired := m.r.rec.Run.FiredAt.AsTime()
	at := m.saveDeadline().Add(-deadline.Seconds(d.SaveReserveSeconds + d.MarginSeconds))
	if early := fired.Add(deadline.Seconds(d.CheckpointSeconds + d.MarginSeconds)); at.Before(early) {
		at = early
	}
	if !at.After(m.now) {
		return
	}
	m.arm(timerSaveLate, at, func(m *mut) {
		if m.r.state() == v1.RunState_RUN_STATE_SAVING {
			m.steps().warnUnsaved(m.steps().unsavedRanks(), func(rank string, step int64) string {
				return fmt.Sprintf("rank %s has not reported its checkpoint of step %d %s after the deadline fired, when the snapshot and the margin still had to follow it before %s",
					rank, step, at.Sub(fired).Round(time.Millisecond), m.steps().saveDeadline().UTC().Format(time.RFC3339))
			})
		}
	})
}

// unsavedRanks are the ranks that have not reported the fired step SAVED.
func (m stepMut) unsavedRanks() []int32 {
	r := m.r
	st := r.steps[r.rec.Run.FiredAtStep]
	var late []int32
	for rank := range r.rec.Run.Spec.TrainerWorldSize {
		if st == nil || !slices.Contains(st.SavedRanks, rank) {
			late = append(late, rank)
		}
	}
	return late
}

// warnUnsaved records a WARNING for each of ranks that has not reported the
// checkpoint of the fired step while the run waits for it; what says what
// the rank did, given its name and the step.
func (m stepMut) warnUnsaved(ranks []int32, what func(rank string, step int64) string) {
	r := m.r
	step := r.rec.Run.FiredAtStep
	if r.state() != v1.RunState_RUN_STATE_SAVING || step == 0 {
		return
	}
	st := r.steps[step]
	for _, rank := range ranks {
		if st != nil && slices.Contains(st.SavedRanks, rank) {
			continue
		}
		m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_WARNING, Step: step, Message: what(m.workers().rankName(rank), step) +
			": a rank reports CHECKPOINT_PHASE_SAVED once it has saved (checkpoint_saved() in the NeMo RL drop-in); without it the run fails at B"})
	}
}

// saveDeadline is B, or, when the deadline fired by hand with B already past
// or unset, fired_at + snapshot_timeout_s (as for the deadline snapshot).
// Counted from fired_at so that a restart arms the same time.
func (m stepMut) saveDeadline() time.Time {
	fired := m.r.rec.Run.FiredAt.AsTime()
	if b, ok := m.r.mustSaveBy(); ok && b.After(fired) {
		return b
	}
	return fired.Add(m.snapshots().snapshotTimeout())
}

// lateSave says which ranks held up the fired step's checkpoint.
func (m stepMut) lateSave(at time.Time) string {
	r := m.r
	step := r.rec.Run.FiredAtStep
	st := r.steps[step] // kept in memory: see trimSteps
	by := at.UTC().Format(time.RFC3339)
	if st != nil && st.Saved {
		return fmt.Sprintf("the checkpoint of step %d was saved by all ranks but not published by %s", step, by)
	}
	var late []string
	for _, rank := range m.unsavedRanks() {
		late = append(late, m.workers().rankName(rank))
	}
	return fmt.Sprintf("the checkpoint of step %d was not saved by %s: no CHECKPOINT_PHASE_SAVED from rank %s",
		step, by, strings.Join(late, ", "))
}
