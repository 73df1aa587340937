package engine

// A run's state machine: the deadline sequence and the other ways a run
// ends. Every change of Run.state goes through setState or terminate below,
// which apply it only if a row of transitions allows it from the run's
// current state and that row's guard holds; a change that no row allows is
// an engine bug. It is refused (the run stays as it was), logged at ERROR and
// kept for the tests, which fail on it.
//
// PENDING, RUNNING, SAVING and SNAPSHOTTING are live; STOPPED, COMPLETED,
// FAILED and CANCELLED are terminal: nothing leaves them. A run is created
// PENDING. Every change is recorded as a RUN_EVENT_TYPE_STATE_CHANGED event;
// entering a terminal state also sets ended_at, closes the snapshot in flight
// as SKIPPED, drops a pending TriggerDeadline, sends Stop to every worker and
// stops the run's timers.
//
// The transitions (TestStateTableIsDocumented keeps this table and the code
// the same):
//
//	| from                                   | to           | when                                                                                       | guard                                                                              |
//	| -------------------------------------- | ------------ | ------------------------------------------------------------------------------------------ | ---------------------------------------------------------------------------------- |
//	| PENDING                                | RUNNING      | a trainer rank completes the first step (CompleteStep)                                     | a step is recorded (last_step > 0)                                                 |
//	| RUNNING                                | SAVING       | the deadline fires at a step: the rule answers SAVE_AND_STOP, or a pending TriggerDeadline | fired at a step (fired_at set, fired_at_step > 0)                                  |
//	| PENDING                                | SNAPSHOTTING | the deadline fires before the first step: the pre-step timer, or TriggerDeadline           | fired before the first step (fired_at_step = 0), rollout snapshots enabled         |
//	| PENDING                                | STOPPED      | the deadline fires before the first step: TriggerDeadline                                  | fired before the first step (fired_at_step = 0), rollout snapshots disabled        |
//	| SAVING                                 | SNAPSHOTTING | the fired step's checkpoint is published (all ranks SAVED; PUBLISHED if deferred)          | the checkpoint of fired_at_step is published, rollout snapshots enabled            |
//	| SAVING                                 | STOPPED      | the fired step's checkpoint is published (all ranks SAVED; PUBLISHED if deferred)          | the checkpoint of fired_at_step is published, rollout snapshots disabled           |
//	| SNAPSHOTTING                           | STOPPED      | the deadline snapshot completes: all live workers reported, or its timeout                 | the deadline snapshot completed, not INVARIANT_FAILURE (the checkpoint is durable) |
//	| SNAPSHOTTING                           | FAILED       | the deadline snapshot completes with INVARIANT_FAILURE                                     | failure_message set                                                                |
//	| SAVING                                 | FAILED       | the save bound passes before the checkpoint is published, or a snapshot INVARIANT_FAILURE  | failure_message set                                                                |
//	| PENDING, RUNNING                       | FAILED       | a snapshot INVARIANT_FAILURE, or max_consecutive_failures failed snapshots in a row        | failure_message set                                                                |
//	| PENDING, RUNNING                       | COMPLETED    | a trainer rank calls FinishRun                                                             | the deadline has not fired                                                         |
//	| PENDING, RUNNING, SAVING, SNAPSHOTTING | CANCELLED    | an operator calls CancelRun                                                                | none                                                                               |
//
// The save bound is B, or fired_at + snapshot_timeout_s when the deadline
// was triggered by hand with B unset or past; after a restart, no bound on
// reports falls due before the restart grace ends.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

const (
	pending      = v1.RunState_RUN_STATE_PENDING
	running      = v1.RunState_RUN_STATE_RUNNING
	saving       = v1.RunState_RUN_STATE_SAVING
	snapshotting = v1.RunState_RUN_STATE_SNAPSHOTTING
	stopped      = v1.RunState_RUN_STATE_STOPPED
	completed    = v1.RunState_RUN_STATE_COMPLETED
	failed       = v1.RunState_RUN_STATE_FAILED
	cancelled    = v1.RunState_RUN_STATE_CANCELLED
)

// transition is one row of the table: from any of from to to, when the run
// satisfies ok. when and guard say in words what the row's callers do and
// what ok checks; they are the documentation above.
type transition struct {
	from  []v1.RunState
	to    v1.RunState
	when  string
	guard string
	ok    func(r *runState) bool
}

var transitions = []transition{
	{from: states(pending), to: running,
		when:  "a trainer rank completes the first step (CompleteStep)",
		guard: "a step is recorded (last_step > 0)",
		ok:    func(r *runState) bool { return r.rec.Run.LastStep > 0 }},
	{from: states(running), to: saving,
		when:  "the deadline fires at a step: the rule answers SAVE_AND_STOP, or a pending TriggerDeadline",
		guard: "fired at a step (fired_at set, fired_at_step > 0)",
		ok:    func(r *runState) bool { return r.fired() && r.rec.Run.FiredAtStep > 0 }},
	{from: states(pending), to: snapshotting,
		when:  "the deadline fires before the first step: the pre-step timer, or TriggerDeadline",
		guard: "fired before the first step (fired_at_step = 0), rollout snapshots enabled",
		ok:    func(r *runState) bool { return firedBeforeFirstStep(r) && snapshotsEnabled(r.rec.Run.Spec) }},
	{from: states(pending), to: stopped,
		when:  "the deadline fires before the first step: TriggerDeadline",
		guard: "fired before the first step (fired_at_step = 0), rollout snapshots disabled",
		ok:    func(r *runState) bool { return firedBeforeFirstStep(r) && !snapshotsEnabled(r.rec.Run.Spec) }},
	{from: states(saving), to: snapshotting,
		when:  firedStepPublished,
		guard: "the checkpoint of fired_at_step is published, rollout snapshots enabled",
		ok:    func(r *runState) bool { return r.firedStepPublished() && snapshotsEnabled(r.rec.Run.Spec) }},
	{from: states(saving), to: stopped,
		when:  firedStepPublished,
		guard: "the checkpoint of fired_at_step is published, rollout snapshots disabled",
		ok:    func(r *runState) bool { return r.firedStepPublished() && !snapshotsEnabled(r.rec.Run.Spec) }},
	{from: states(snapshotting), to: stopped,
		when:  "the deadline snapshot completes: all live workers reported, or its timeout",
		guard: "the deadline snapshot completed, not INVARIANT_FAILURE (the checkpoint is durable)",
		ok: func(r *runState) bool {
			s := r.snapshots[r.rec.DeadlineSnapshotId]
			return s != nil && s.CompletedAt != nil && s.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_INVARIANT_FAILURE
		}},
	{from: states(snapshotting), to: failed,
		when:  "the deadline snapshot completes with INVARIANT_FAILURE",
		guard: failureMessageSet, ok: hasFailureMessage},
	{from: states(saving), to: failed,
		when:  "the save bound passes before the checkpoint is published, or a snapshot INVARIANT_FAILURE",
		guard: failureMessageSet, ok: hasFailureMessage},
	{from: states(pending, running), to: failed,
		when:  "a snapshot INVARIANT_FAILURE, or max_consecutive_failures failed snapshots in a row",
		guard: failureMessageSet, ok: hasFailureMessage},
	{from: states(pending, running), to: completed,
		when:  "a trainer rank calls FinishRun",
		guard: "the deadline has not fired",
		ok:    func(r *runState) bool { return !r.fired() }},
	{from: states(pending, running, saving, snapshotting), to: cancelled,
		when:  "an operator calls CancelRun",
		guard: "none",
		ok:    func(*runState) bool { return true }},
}

const (
	firedStepPublished = "the fired step's checkpoint is published (all ranks SAVED; PUBLISHED if deferred)"
	failureMessageSet  = "failure_message set"
)

func states(s ...v1.RunState) []v1.RunState { return s }

func hasFailureMessage(r *runState) bool { return r.rec.Run.FailureMessage != "" }

func firedBeforeFirstStep(r *runState) bool { return r.fired() && r.rec.Run.FiredAtStep == 0 }

// firedStepPublished: the checkpoint of the step the deadline fired at is
// published. That step stays in memory (trimSteps).
func (r *runState) firedStepPublished() bool {
	return r.rec.Run.FiredAtStep > 0 && r.steps[r.rec.Run.FiredAtStep].GetPublished()
}

// isTerminal: s is one of the states a run never leaves, which the API
// declares (the (snapcoord.v1.terminal) option on RunState's values).
func isTerminal(s v1.RunState) bool { return apifacts.Terminal(s) }

// errIllegalTransition marks a state change that no row of transitions
// allows: an engine bug.
var errIllegalTransition = errors.New("illegal run state transition")

// checkTransition returns nil if a row allows r's move to to now.
func checkTransition(r *runState, to v1.RunState) error {
	from := r.state()
	for _, t := range transitions {
		if t.to != to || !slices.Contains(t.from, from) {
			continue
		}
		if t.ok(r) {
			return nil
		}
		return fmt.Errorf("%w: run %q %s -> %s: guard does not hold: %s", errIllegalTransition, r.id, stateName(from), stateName(to), t.guard)
	}
	return fmt.Errorf("%w: run %q %s -> %s: no such transition", errIllegalTransition, r.id, stateName(from), stateName(to))
}

// allowed checks the move to to against the table; an illegal one is
// refused, logged and kept (Engine.illegal) for the tests.
func (m *mut) allowed(to v1.RunState) bool {
	err := checkTransition(m.r, to)
	if err == nil {
		return true
	}
	m.e.illegal.Store(&err)
	m.e.log.Error("engine bug: state change refused", "run_id", m.r.id, "err", err)
	return false
}

// transitionTaken, when set (by the tests), hears of every change applied.
var transitionTaken func(from, to v1.RunState)

func (m *mut) taken(to v1.RunState) {
	if transitionTaken != nil {
		transitionTaken(m.r.state(), to)
	}
}

// setState moves the live run to the live state s and records it.
func (m *mut) setState(s v1.RunState, why string) {
	if !m.allowed(s) {
		return
	}
	m.taken(s)
	m.r.rec.Run.State = s
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_STATE_CHANGED, State: s,
		Message: stateName(s) + ": " + why})
}

// terminate ends the run: final state, Stop to every worker, no more timers.
// A snapshot still in flight is closed as SKIPPED: its late outcome must not
// reach a run whose state is final (a last worker leaving would otherwise
// complete it, and a TIMEOUT could fail a COMPLETED run).
func (m *mut) terminate(s v1.RunState, reason string) {
	if !m.allowed(s) {
		return
	}
	m.taken(s)
	m.missed().savedLate(s)
	if a := m.snapshots().activeSnapshot(); a != nil {
		m.snapshots().closeSnapshot(a, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED,
			fmt.Sprintf("not complete when the run ended (%s: %s)", stateName(s), reason))
	}
	m.r.rec.Run.State = s
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_STATE_CHANGED, State: s,
		Message: stateName(s) + ": " + reason})
	m.r.rec.Run.EndedAt = m.ts()
	if m.r.rec.ManualFirePending { // a trigger waiting for a step that never comes; a fired one keeps its reason (triggeredBy)
		m.r.rec.ManualFirePending, m.r.rec.ManualFireReason = false, ""
	}
	m.log().command(v1.WorkerRole_WORKER_ROLE_UNSPECIFIED, &v1.Command{Kind: &v1.Command_Stop{
		Stop: &v1.StopCommand{Reason: stateName(s) + ": " + reason}}})
	for k := range m.r.timers {
		m.disarm(k)
	}
}

// firstStep: a PENDING run is RUNNING once its first step completed.
func (m *mut) firstStep(step int64) {
	if m.r.state() == pending {
		m.disarm(timerPreStep) // the first step overtook the pre-step deadline
		m.setState(running, fmt.Sprintf("step %d completed", step))
	}
}

// fire records that the deadline fired. At a step the trainers now save; the
// deadline snapshot follows their checkpoint (startDeadlineSave).
func (m *mut) fire(kind v1.DeadlineFireKind, step int64, why string) {
	r := m.r
	r.rec.Run.FiredAt = m.ts()
	r.rec.Run.FireKind = kind
	r.rec.Run.FiredAtStep = step
	r.rec.ManualFirePending = false
	m.missed().decidedLate(step, "the deadline fired "+firedWhere(r))
	m.disarm(timerPreStep)
	m.disarm(timerInterval)
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_FIRED, Step: step,
		Message: "deadline fired " + firedWhere(r) + ": " + why})
	runID := r.id
	m.observe(func(ctx context.Context) { m.e.obs.DeadlineFired(ctx, runID, step, kind) })
	if step > 0 {
		m.setState(saving, fmt.Sprintf("trainer ranks save the checkpoint of step %d", step))
		m.steps().armSaveTimeout()
	}
}

// startDeadlineSave runs once the fired step's checkpoint is published (or
// at once before the first step): the forced deadline snapshot if snapshots
// are enabled, else the run stops.
func (m *mut) startDeadlineSave(anchor int64) {
	r := m.r
	if !snapshotsEnabled(r.rec.Run.Spec) {
		if anchor == 0 {
			m.terminate(stopped, "deadline fired before the first step; nothing to save")
			return
		}
		m.terminate(stopped, fmt.Sprintf("deadline save complete: checkpoint of step %d published", anchor))
		return
	}
	m.disarm(timerSave) // the trainers' part is done
	m.setState(snapshotting, fmt.Sprintf("environment workers save the deadline snapshot (anchor step %d)", anchor))
	mustFinish := m.now.Add(m.snapshots().snapshotTimeout())
	if b, ok := r.mustSaveBy(); ok && b.After(m.now) {
		mustFinish = b
	}
	s := m.snapshots().issueSnapshot(v1.SnapshotReason_SNAPSHOT_REASON_DEADLINE, anchor, true, timestamppb.New(mustFinish))
	r.rec.DeadlineSnapshotId = s.SnapshotId
	m.snapshots().checkSnapshotDone(s)
}

// finishDeadline ends the deadline sequence from its snapshot's outcome.
func (m *mut) finishDeadline(s *v1.Snapshot) {
	switch s.Outcome {
	case v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED:
		m.terminate(stopped, fmt.Sprintf("deadline save complete: checkpoint of step %d and snapshot %s saved", s.AnchorStep, s.SnapshotId))
	case v1.SnapshotOutcome_SNAPSHOT_OUTCOME_INVARIANT_FAILURE:
		m.failRun("invariant failure in deadline snapshot " + s.SnapshotId + ": " + s.Message)
	default:
		m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_WARNING, SnapshotId: s.SnapshotId, Step: s.AnchorStep,
			Message: fmt.Sprintf("deadline snapshot %s %s (%s); the trainer checkpoint of step %d is durable, so checkpoint state is consistent",
				s.SnapshotId, outcomeName(s.Outcome), s.Message, s.AnchorStep)})
		m.terminate(stopped, fmt.Sprintf("deadline save ended with snapshot %s %s", s.SnapshotId, outcomeName(s.Outcome)))
	}
}

func (m *mut) failRun(msg string) {
	m.r.rec.Run.FailureMessage = msg
	m.terminate(failed, msg)
}

// stateName is how the engine names a run state: RUNNING.
func stateName(s v1.RunState) string { return apifacts.EnumName(s) }

// stateTable renders transitions as the table in this file's comment.
func stateTable() string {
	rows := [][4]string{{"from", "to", "when", "guard"}}
	for _, t := range transitions {
		from := make([]string, len(t.from))
		for i, s := range t.from {
			from[i] = stateName(s)
		}
		rows = append(rows, [4]string{strings.Join(from, ", "), stateName(t.to), t.when, t.guard})
	}
	var width [4]int
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len(c))
		}
	}
	var b strings.Builder
	line := func(cells [4]string) {
		for i, c := range cells {
			fmt.Fprintf(&b, "| %-*s ", width[i], c)
		}
		b.WriteString("|\n")
	}
	line(rows[0])
	var rule [4]string
	for i := range rule {
		rule[i] = strings.Repeat("-", width[i])
	}
	line(rule)
	for _, row := range rows[1:] {
		line(row)
	}
	return b.String()
}
