package engine

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

func (e *Engine) CompleteStep(ctx context.Context, req *v1.CompleteStepRequest) (*v1.CompleteStepResponse, error) {
	var d *v1.Decision
	err := e.mutate(ctx, req.RunId, func(m *mut) error {
		w, err := m.r.worker(req.WorkerId, req.Incarnation, v1.WorkerRole_WORKER_ROLE_TRAINER, "CompleteStep")
		if err != nil {
			return err
		}
		local := localAction{action: req.LocalAction, rank: w.w.Rank}
		d, err = m.steps().completeStep(ctx, req.Step, req.IterationSeconds, local)
		if err == nil {
			w.lastStep, w.lastStepAt = req.Step, m.now
			m.steps().answered(req.Step)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &v1.CompleteStepResponse{Step: d.Step, Action: d.Action, Explanation: d.Explanation, Decision: d}, nil
}

// localAction is what a rank did at a step on its own while it could not
// reach the coordinator (CompleteStepRequest.local_action): UNSPECIFIED for
// an ordinary question.
type localAction struct {
	action v1.StepAction
	rank   int32
}

// completeStep records the iteration and returns the step's decision: the
// stored one if a rank already asked, else a new one, stored before any rank
// hears it. A terminal run answers STOP without recording anything.
func (m stepMut) completeStep(ctx context.Context, step int64, iterSeconds float64, local localAction) (*v1.Decision, error) {
	r := m.r
	st, err := m.step(ctx, step)
	if err != nil {
		return nil, err
	}
	iterSeconds = m.iterationOnly(step, iterSeconds)
	if st != nil && st.Decision != nil {
		if !r.terminal() {
			m.observeIteration(st, iterSeconds)
		}
		return st.Decision, nil
	}
	if r.terminal() {
		// Not stored, so made from what no longer changes (the end time and
		// the final estimates): every rank gets the identical answer, before
		// or after a restart.
		return &v1.Decision{Step: step, Action: v1.StepAction_STEP_ACTION_STOP, DecidedAt: r.rec.Run.EndedAt,
			Inputs: proto.Clone(r.rec.Run.Deadline).(*v1.Deadline), Explanation: "the run is " + stateName(r.state()) + ": stop"}, nil
	}
	if err := m.admit(step, local.rank); err != nil {
		return nil, err
	}
	if st == nil {
		st = &storagev1.StepRecord{Step: step}
	}
	m.observeIteration(st, iterSeconds)
	if step > r.rec.Run.LastStep {
		r.rec.Run.LastStep = step
	}
	m.firstStep(step)
	st.Decision = m.decide(step, local)
	m.putStep(st)
	m.trimSteps()
	d := st.Decision
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_DECISION, Step: step, Decision: d,
		Message: fmt.Sprintf("step %d: %s", step, d.Explanation)})
	runID := m.r.id
	m.observe(func(ctx context.Context) { m.e.obs.Decision(ctx, runID, step, d.Action) })
	m.savedBeforeAsked(st)
	m.safety().safetySavedBeforeAsked(st)
	return d, nil
}

// admit refuses a step more than one past the run's last: ranks ask
// about every step, in order, and checkpoint a step they completed (at most
// the one they are about to ask about). A wrong step number (a sample
// count, a global batch index) would otherwise fire the deadline at a step
// no rank reaches, leaving the others told to continue to it, or publish a
// checkpoint that every real one after it seems older than. The first step
// may be any: a run resumed from a checkpoint starts past 1.
//
// One jump is admitted: the first step past the last recorded one that
// this process hears after loading the run (see admitJump).
func (m stepMut) admit(step int64, rank int32) error {
	r := m.r
	last := r.rec.Run.LastStep
	switch {
	case step <= last:
		return nil
	case last == 0 || step == last+1:
		r.jumpAdmissible = false
		return nil
	case r.jumpAdmissible && !r.terminal():
		m.admitJump(step, rank)
		return nil
	}
	return errorf(ErrFailedPrecondition, "step: %d is more than one past the run's last step %d: ranks ask about every step, in order", step, last)
}

// admitJump takes step, the first past the run's last recorded one since
// this process loaded the run, and more than one past it, for the run's
// step after its state went back: the store was restored from an older
// copy (a backup), while the ranks kept training and got decisions this
// state never recorded. Refused, the ranks' every later step would be
// refused too, and the job would end for what the coordinator lost. The
// steps between are not recorded (a rank that still reports one of them
// gets it decided as any step no rank asked about). The first step to
// arrive is taken, under the run's lock: every other rank asks about it or
// a neighbour and gets the same stored decisions, and the jump is taken
// once. After that a jump is refused as before: a step number that is
// wrong from the start is refused at its second step.
func (m stepMut) admitJump(step int64, rank int32) {
	r := m.r
	last := r.rec.Run.LastStep
	r.jumpAdmissible = false
	r.rec.Run.LastStep = step
	m.dirty()
	msg := fmt.Sprintf("rank %d is at step %d and the run's last recorded step is %d: this coordinator's state is older than the ranks' "+
		"(restored from an older copy of its data?); steps %d to %d are not recorded, the run goes on from step %d",
		rank, step, last, last+1, step-1, step)
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_WARNING, Step: step, Message: msg})
	m.e.log.Warn("a rank is ahead of the run's recorded steps: the coordinator's state went back", "run_id", r.id,
		"rank", rank, "step", step, "last_recorded_step", last)
}

// iterationOnly takes out of a rank's iteration the time it may have spent
// waiting at the step's collectives for the last rank to hear the previous
// step's decision: the spread between the first and the last answer of that
// step. When the coordinator was away (a restart, a slow commit), the ranks
// that heard before it went waited for those that heard after, and an
// outage is not an iteration. The last rank's own report, measured from its
// answer, is whole; a rank that was merely slower carries its full time in
// its own report, which the estimate's maximum keeps.
func (m stepMut) iterationOnly(step int64, sec float64) float64 {
	prev := m.r.steps[step-1]
	last, ok := m.r.lastAnswer[step-1]
	if !ok || prev == nil || prev.Decision.GetDecidedAt() == nil {
		return sec
	}
	spread := last.Sub(prev.Decision.DecidedAt.AsTime()).Seconds()
	return max(0, sec-max(0, spread))
}

// answered notes when a rank heard step's decision, keeping the latest two
// steps.
func (m stepMut) answered(step int64) {
	r := m.r
	if at, ok := r.lastAnswer[step]; !ok || m.now.After(at) {
		r.lastAnswer[step] = m.now
	}
	for s := range r.lastAnswer {
		if s < step-1 {
			delete(r.lastAnswer, s)
		}
	}
}

func (m stepMut) observeIteration(st *storagev1.StepRecord, sec float64) {
	if sec <= st.MaxIterationSeconds {
		return
	}
	st.MaxIterationSeconds = sec
	m.putStep(st)
	m.history().recordIteration(st.Step, sec)
	if sec > m.r.rec.MaxIterationSeconds {
		m.r.rec.MaxIterationSeconds = sec
		m.dirty()
	}
}

// decide applies the rule to a step no rank asked about yet, and fires the
// deadline if it says so. A step a rank already acted on by itself is
// decided as it acted, unless the deadline fired meanwhile.
func (m stepMut) decide(step int64, local localAction) *v1.Decision {
	r := m.r
	m.missed().decidedLate(step, fmt.Sprintf("step %d was decided", step))
	p, o := m.e.policyOf(r), r.observations(step)
	est := p.Estimate(o)
	d := &v1.Decision{Step: step, DecidedAt: m.ts(), Inputs: m.e.deadlineOf(r, est)}
	switch {
	case r.fired() && r.rec.Run.FireKind != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_PRE_STEP && step < r.rec.Run.FiredAtStep:
		// A late first question about an earlier step: the ranks must still
		// reach the fired step together, or the save's collectives hang.
		d.Action = v1.StepAction_STEP_ACTION_CONTINUE
		d.Explanation = fmt.Sprintf("the deadline fired at step %d: continue to it", r.rec.Run.FiredAtStep)
	case r.fired():
		d.Action = v1.StepAction_STEP_ACTION_STOP
		d.Explanation = "the deadline already fired (" + firedWhere(r) + "): stop"
	case local.action != v1.StepAction_STEP_ACTION_UNSPECIFIED:
		m.decideAsActed(d, local)
	case r.rec.ManualFirePending:
		d.Action = v1.StepAction_STEP_ACTION_SAVE_AND_STOP
		d.Explanation = "deadline triggered by hand (" + r.rec.ManualFireReason + "): save now and stop"
		m.fire(v1.DeadlineFireKind_DEADLINE_FIRE_KIND_MANUAL, step, r.rec.ManualFireReason)
	default:
		b, ok := r.mustSaveBy()
		if !ok {
			d.Action = v1.StepAction_STEP_ACTION_CONTINUE
			d.Explanation = "the run has no deadline: continue"
			break
		}
		v := p.Judge(m.now, b, o, est)
		withLoss(d.Inputs, v.Loss)
		d.Explanation = v.Explanation
		d.Action = v1.StepAction_STEP_ACTION_CONTINUE
		switch {
		case v.Fire:
			d.Action = v1.StepAction_STEP_ACTION_SAVE_AND_STOP
			m.fire(v1.DeadlineFireKind_DEADLINE_FIRE_KIND_STEP, step, v.Explanation)
		case v.SafetySave:
			d.Action = v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE
			m.safety().startSafetySave(step)
		}
	}
	return d
}

// decideAsActed records what a rank already did at a step while the
// coordinator was out of its reach: it cannot be undone, and the other ranks,
// which followed the same plan from the same last decision, did the same.
// A hand trigger still pending waits for the next step.
func (m stepMut) decideAsActed(d *v1.Decision, local localAction) {
	d.Action = local.action
	if local.action == v1.StepAction_STEP_ACTION_CONTINUE {
		d.Explanation = fmt.Sprintf("rank %d could not reach the coordinator and went on, by its plan from the run's last decision: continue", local.rank)
		return
	}
	d.Explanation = fmt.Sprintf("rank %d could not reach the coordinator and saved by its plan from the run's last decision: the deadline save", local.rank)
	m.fire(v1.DeadlineFireKind_DEADLINE_FIRE_KIND_LOCAL, d.Step, d.Explanation)
}

func firedWhere(r *runState) string {
	if r.rec.Run.FireKind == v1.DeadlineFireKind_DEADLINE_FIRE_KIND_PRE_STEP || r.rec.Run.FiredAtStep == 0 {
		return "before the first step"
	}
	return fmt.Sprintf("at step %d", r.rec.Run.FiredAtStep)
}

// armPreStep arms the pre-step deadline: with snapshots enabled and no step
// completed, the bootstrap state is saved at B - (C + R + M).
func (m stepMut) armPreStep() {
	r := m.r
	b, ok := r.mustSaveBy()
	if !ok || r.fired() || r.state() != v1.RunState_RUN_STATE_PENDING || !snapshotsEnabled(r.rec.Run.Spec) {
		m.disarm(timerPreStep)
		return
	}
	p := m.e.policyOf(r)
	at := p.PreStepFiresAt(b, p.Estimate(r.observations(0)))
	m.arm(timerPreStep, at, func(m *mut) {
		// A first step that completed while this callback waited for the
		// lock makes it stale: it saves nothing.
		if m.r.state() != v1.RunState_RUN_STATE_PENDING || m.r.fired() {
			return
		}
		m.fire(v1.DeadlineFireKind_DEADLINE_FIRE_KIND_PRE_STEP, 0,
			fmt.Sprintf("no step completed by B - (C + R + M) = %s", at.UTC().Format("2006-01-02T15:04:05Z07:00")))
		m.startDeadlineSave(0)
	})
}

func (m stepMut) putStep(s *storagev1.StepRecord) {
	m.r.steps[s.Step] = s
	m.b.PutStep(m.r.id, s)
}

// stepsKept is how many of a run's latest steps stay in memory. Ranks ask
// about the latest step, and report checkpoints of recent ones; a run that
// steps every second for three days has 260,000 steps, which would
// otherwise all stay in memory for the life of the process (about 600 bytes
// each, with their decisions).
const stepsKept = 64

// step returns the run's record of step; nil if it has none. A step older
// than the ones kept in memory is read from the store once every commit of
// the run is done, so the read finds the latest put of it.
func (m stepMut) step(ctx context.Context, step int64) (*storagev1.StepRecord, error) {
	r := m.r
	if st, ok := r.steps[step]; ok || step > r.stepsOnDiskThrough {
		return st, nil
	}
	if err := m.e.wait(ctx, r.last); err != nil {
		return nil, err
	}
	st, err := m.e.st.Step(r.id, step)
	if err != nil {
		return nil, fmt.Errorf("run %q: %w", r.id, err)
	}
	if st != nil {
		r.steps[step] = st
	}
	return st, nil
}

// trimSteps drops the steps older than the latest stepsKept from memory,
// once twice that many are held; their records stay in the store. The
// step the deadline fired at stays: its save is what the run waits for.
func (m stepMut) trimSteps() {
	r := m.r
	if len(r.steps) <= 2*stepsKept {
		return
	}
	through := r.rec.Run.LastStep - stepsKept
	for s := range r.steps {
		if s <= through && s != r.rec.Run.FiredAtStep {
			delete(r.steps, s)
		}
	}
	r.stepsOnDiskThrough = max(r.stepsOnDiskThrough, through)
}
