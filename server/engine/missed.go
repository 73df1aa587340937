package engine

import (
	"context"
	"fmt"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// MissCause says how a run missed its deadline; a metric label.
type MissCause string

// The ways a run can miss its deadline B.
const (
	// A step was decided, or the deadline fired before the first step, at
	// or after B: no save begun then can be durable by B.
	MissedDecidedAfterB MissCause = "decided_after_deadline"
	// B passed with the run RUNNING: its deadline had not fired.
	MissedRunningAtB MissCause = "running_at_deadline"
	// B passed while the deadline save (SAVING, SNAPSHOTTING) was going.
	MissedSavingAtB MissCause = "saving_at_deadline"
	// The deadline save ended at or after B.
	MissedSaveEndedAfterB MissCause = "save_ended_after_deadline"
)

// MissCauses lists every MissCause, so that a counter by cause can start
// each at 0: a series that first appears at 1 shows Prometheus no increase.
func MissCauses() []MissCause {
	return []MissCause{MissedDecidedAfterB, MissedRunningAtB, MissedSavingAtB, MissedSaveEndedAfterB}
}

// missDeadline marks the run's deadline missed, once per run: a WARNING
// event, Run.deadline_missed (stored with the run, so it survives a
// restart) and the observer's count. A late save used to show only as
// ended_at > must_save_by, which nobody looks at.
func (m missMut) missDeadline(cause MissCause, step int64, why string) {
	run := m.r.rec.Run
	if run.DeadlineMissed {
		return
	}
	run.DeadlineMissed, run.DeadlineMissedAt, run.DeadlineMissedReason = true, m.ts(), why
	m.dirty()
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_WARNING, Step: step,
		Message: "DEADLINE MISSED: " + why})
	runID := m.r.id
	m.observe(func(ctx context.Context) { m.e.obs.DeadlineMissed(ctx, runID, cause) })
}

// missedBy is how far past B now is, in words: "at 12:00:05Z, 5s after B =
// 12:00:00Z".
func missedBy(now, b time.Time) string {
	return fmt.Sprintf("at %s, %s after B = %s", now.UTC().Format(time.RFC3339), now.Sub(b).Round(time.Second), b.UTC().Format(time.RFC3339))
}

// decidedLate marks the deadline missed when step is decided, or the
// deadline fires before the first step (step 0), at or after B; what says
// which in the reason.
func (m missMut) decidedLate(step int64, what string) {
	if b, ok := m.r.mustSaveBy(); ok && !m.now.Before(b) {
		m.missDeadline(MissedDecidedAfterB, step, what+" "+missedBy(m.now, b))
	}
}

// armMissed arms the check at B: a run still RUNNING then, or still saving,
// missed it. After a restart the check waits for the restart grace, as the
// bounds of the save do (afterGrace): a save that ended in time may have
// its last report held up by the outage.
func (m missMut) armMissed() {
	r := m.r
	b, ok := r.mustSaveBy()
	if !ok || r.terminal() || r.rec.Run.DeadlineMissed {
		m.disarm(timerMissed)
		return
	}
	m.arm(timerMissed, m.afterGrace(b), func(m *mut) {
		if !m.r.terminal() {
			m.missed().stillGoingAtB(b)
		}
	})
}

// stillGoingAtB marks a live run that B found RUNNING or saving.
func (m missMut) stillGoingAtB(b time.Time) {
	r := m.r
	at := "at B = " + b.UTC().Format(time.RFC3339)
	switch r.state() {
	case v1.RunState_RUN_STATE_RUNNING:
		m.missDeadline(MissedRunningAtB, r.rec.Run.LastStep, fmt.Sprintf("the run was still RUNNING %s: no deadline save had begun (last step %d)", at, r.rec.Run.LastStep))
	case v1.RunState_RUN_STATE_SAVING:
		m.missDeadline(MissedSavingAtB, r.rec.Run.FiredAtStep, fmt.Sprintf("the trainer ranks were still saving the checkpoint of step %d %s", r.rec.Run.FiredAtStep, at))
	case v1.RunState_RUN_STATE_SNAPSHOTTING:
		m.missDeadline(MissedSavingAtB, r.rec.Run.FiredAtStep, fmt.Sprintf("the environment workers were still saving deadline snapshot %s %s", r.rec.DeadlineSnapshotId, at))
	}
}

// savedLate marks the deadline missed when the deadline sequence ends (to
// state s) at or after B, past any restart grace. Mostly the check at B has
// marked it already; at B itself the bounds of the save may end the run
// before that check runs.
func (m missMut) savedLate(s v1.RunState) {
	r := m.r
	b, ok := r.mustSaveBy()
	if !ok || !r.fired() || m.now.Before(m.afterGrace(b)) {
		return
	}
	m.missDeadline(MissedSaveEndedAfterB, r.rec.Run.FiredAtStep, fmt.Sprintf("the deadline save ended (%s) %s", stateName(s), missedBy(m.now, b)))
}
