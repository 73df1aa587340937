package deadline

import (
	"fmt"
	"math"
	"time"
)

// ExpectedLoss decides by comparing expected losses instead of adding up
// maxima. With slack x = B − M − now and D = C + R the save's duration,
//
//	F(y) = E[y + M − D ; D ≤ y] + P(D > y) · cost(work lost on a miss)
//
// is the expected loss of starting the save with slack y: the walltime
// left unused when the save fits, the work since the last durable save
// (and a penalty) when it does not. It fires when F(x) ≤ E_I[F(x − I)],
// saving now costing no more than saving after one more iteration I. When
// even the worst case of one more step and the save fits, continuing is
// strictly better and no expected loss is computed.
//
// The zero value uses the defaults below. It is pure and deterministic.
type ExpectedLoss struct {
	// MissPenaltySeconds is added to the work lost by any miss: a restart,
	// its queueing and warm-up. 0 means DefaultMissPenalty.
	MissPenaltySeconds float64
	// TauSeconds is the operator's "never lose more than τ". 0 means
	// DefaultTau.
	TauSeconds float64
	// TauPenaltySeconds is added to a miss that loses more than τ. 0 means
	// DefaultTauPenalty.
	TauPenaltySeconds float64
	// SafetySaves lets the policy answer "save and continue" (issue 15,
	// part 3) at a step no regular save follows, when a save now, counted
	// as lost time, and continuing from it is expected to cost less than
	// going on with everything since the last durable save at stake.
	SafetySaves bool
}

// Defaults of ExpectedLoss, chosen from the simulation (docs/simulation.md).
const (
	DefaultMissPenalty = 20 * time.Minute
	DefaultTau         = 25 * time.Minute
	DefaultTauPenalty  = 4 * time.Hour
)

// Defaults returns p with every unset knob at its default.
func (p ExpectedLoss) Defaults() ExpectedLoss {
	def := func(v float64, d time.Duration) float64 {
		if v > 0 {
			return v
		}
		return d.Seconds()
	}
	return ExpectedLoss{
		MissPenaltySeconds: def(p.MissPenaltySeconds, DefaultMissPenalty),
		TauSeconds:         def(p.TauSeconds, DefaultTau),
		TauPenaltySeconds:  def(p.TauPenaltySeconds, DefaultTauPenalty),
		SafetySaves:        p.SafetySaves,
	}
}

// missCost is the cost of a miss that loses lost seconds of work.
func (p ExpectedLoss) missCost(lost float64) float64 {
	c := lost + p.MissPenaltySeconds
	if lost > p.TauSeconds {
		c += p.TauPenaltySeconds
	}
	return c
}

// Assessment is a decision of the expected-loss policy with its figures.
type Assessment struct {
	Fire bool
	// SafetySave: continue, but save first (only with SafetySaves, never
	// with Fire).
	SafetySave  bool
	Explanation string
	// WorstCase: when set, one more step and the save fit even at their
	// longest (WorstCaseSeconds, the largest support points) and nothing
	// else was computed.
	WorstCase        bool
	WorstCaseSeconds float64
	// SlackSeconds is x = B − M − now.
	SlackSeconds float64
	// Expected loss, seconds, and probability of a miss: of saving now, and
	// of saving after one more step.
	LossNowSeconds, LossNextSeconds float64
	MissNow, MissNext               float64
	// LossSafetySeconds: the expected loss of a safety save and one more
	// step, the save's duration included; computed only with SafetySaves.
	LossSafetySeconds float64
}

// Verdict is the assessment as the engine records it, with the losses
// weighed unless the worst case fit (or no iteration was measured).
func (a Assessment) Verdict() Verdict {
	v := Verdict{Fire: a.Fire, SafetySave: a.SafetySave, Explanation: a.Explanation}
	if a.LossNowSeconds != 0 || a.LossNextSeconds != 0 {
		v.Loss = &Loss{NowSeconds: a.LossNowSeconds, NextSeconds: a.LossNextSeconds, MissNow: a.MissNow, MissNext: a.MissNext,
			SafetySeconds: a.LossSafetySeconds, Safety: a.LossSafetySeconds != 0}
	}
	return v
}

// model is the predictive side of one decision.
type model struct {
	iter, save support // I and D = C + R
	hasIter    bool
}

func newModel(h *History) model {
	c := modelSave(&h.Checkpoints, h.PriorCheckpointSeconds).dist()
	r := modelSave(&h.Snapshots, h.PriorSnapshotSeconds).dist()
	m := model{save: convolve(&c, &r), hasIter: h.Iterations.Len() > 0}
	if m.hasIter {
		m.iter = iterationDist(&h.Iterations)
	}
	return m
}

// Assess decides at a completed step. saveFollows says the trainer saves a
// regular checkpoint (and its snapshot) after this step anyway: continuing
// then costs that save too, and firing makes it the deadline save.
func (p ExpectedLoss) Assess(now, mustSaveBy time.Time, saveFollows bool, h *History) Assessment {
	p = p.Defaults()
	m := newModel(h)
	a := Assessment{SlackSeconds: mustSaveBy.Sub(now).Seconds() - h.MarginSeconds}
	if !m.hasIter {
		// No iteration measured, no look-ahead: save once the worst case
		// of the save alone no longer fits. The engine decides only after
		// an iteration, so this is a guard.
		a.Fire = a.SlackSeconds < m.save.hi()
		a.Explanation = fmt.Sprintf("no iteration measured; the save takes at most %s, %s left before B − M: %s",
			minutes(m.save.hi()), minutes(a.SlackSeconds), action(a.Fire, false))
		return a
	}
	// A save that follows (regular, or a safety save the policy may choose)
	// is one more save in the look-ahead.
	a.WorstCaseSeconds = m.iter.hi() + m.save.hi()
	if saveFollows || p.SafetySaves {
		a.WorstCaseSeconds += m.save.hi()
	}
	if a.SlackSeconds >= a.WorstCaseSeconds {
		a.WorstCase = true
		a.Explanation = fmt.Sprintf("even the worst case fits: one more step and the save take at most %s, %s left before B − M: continue",
			minutes(a.WorstCaseSeconds), minutes(a.SlackSeconds))
		return a
	}
	lost := now.Sub(h.LastDurableSave).Seconds()
	a.LossNowSeconds, a.MissNow = p.saveLoss(&m.save, a.SlackSeconds, lost, h.MarginSeconds)
	if saveFollows {
		a.LossNextSeconds, a.MissNext = p.afterSaveAndStep(&m, a.SlackSeconds, lost, h.MarginSeconds)
	} else {
		a.LossNextSeconds, a.MissNext = p.afterStep(&m, a.SlackSeconds, lost, h.MarginSeconds)
	}
	// Ties fire, rounding included: when both surely miss, saving now is
	// the only chance the model does not see (the save may beat B itself).
	a.Fire = a.LossNowSeconds <= a.LossNextSeconds*(1+1e-12)
	a.Explanation = fmt.Sprintf("saving now: expected loss %s (P(miss) %s); one more step: %s (P(miss) %s)",
		minutes(a.LossNowSeconds), percent(a.MissNow), minutes(a.LossNextSeconds), percent(a.MissNext))
	if p.SafetySaves && !saveFollows {
		l, _ := p.afterSaveAndStep(&m, a.SlackSeconds, lost, h.MarginSeconds)
		a.LossSafetySeconds = l + m.save.mean()
		a.Explanation += fmt.Sprintf("; a safety save first: %s", minutes(a.LossSafetySeconds))
		a.SafetySave = a.LossSafetySeconds < min(a.LossNowSeconds, a.LossNextSeconds)
		a.Fire = !a.SafetySave && a.Fire
	}
	a.Explanation += ": " + action(a.Fire, a.SafetySave)
	return a
}

// saveLoss is F(y) and P(D > y) for a save started with slack y, lost
// seconds after the last durable save.
func (p ExpectedLoss) saveLoss(d *support, y, lost, margin float64) (loss, miss float64) {
	fits, partial := d.upTo(y)
	miss = 1 - fits
	if miss < 1e-12 {
		miss = 0
	}
	return fits*(y+margin) - partial + miss*p.missCost(lost+y+margin), miss
}

// afterStep is E_I[F(x − I)]: one more iteration, then the save.
func (p ExpectedLoss) afterStep(m *model, x, lost, margin float64) (loss, miss float64) {
	for i := range m.iter.n {
		l, q := p.saveLoss(&m.save, x-m.iter.v[i], lost+m.iter.v[i], margin)
		loss += m.iter.p[i] * l
		miss += m.iter.p[i] * q
	}
	return loss, miss
}

// afterSaveAndStep is the expected loss of continuing when a regular save
// follows the step: the regular save D₁ (a miss if it overruns, as the
// deadline save would), then one more iteration, then the save, losing only
// what came after D₁.
func (p ExpectedLoss) afterSaveAndStep(m *model, x, lost, margin float64) (loss, miss float64) {
	for j := range m.save.n {
		d1, w := m.save.v[j], m.save.p[j]
		if d1 > x {
			loss += w * p.missCost(lost+x+margin)
			miss += w
			continue
		}
		l, q := p.afterStep(m, x-d1, 0, margin)
		loss += w * l
		miss += w * q
	}
	return loss, miss
}

// WorstCase is the look-ahead at its longest: the largest support point of
// each of I, C and R, and M. Until B − (I + C + R + M) (Max's FiresAt of
// these estimates) continuing is strictly better than saving, so that is
// the earliest the policy can fire at a step no regular save follows (one
// that does adds its C + R); the engine shows these in Run.deadline.
func (p ExpectedLoss) WorstCase(h *History) Estimates {
	c := modelSave(&h.Checkpoints, h.PriorCheckpointSeconds).dist()
	r := modelSave(&h.Snapshots, h.PriorSnapshotSeconds).dist()
	est := Estimates{Checkpoint: c.hi(), Reserve: r.hi(), Margin: h.MarginSeconds}
	if h.Iterations.Len() > 0 {
		it := iterationDist(&h.Iterations)
		est.Iteration = it.hi()
	}
	return est
}

func action(fire, safety bool) string {
	switch {
	case fire:
		return "save now and stop"
	case safety:
		return "save now and continue"
	}
	return "continue"
}

func minutes(s float64) string { return fmt.Sprintf("%.1f min", s/60) }

func percent(q float64) string {
	switch {
	case q == 0:
		return "0 %"
	case q < 0.001:
		return "< 0.1 %"
	case q < 0.1:
		return fmt.Sprintf("%.1f %%", 100*q)
	}
	return fmt.Sprintf("%.0f %%", math.Round(100*q))
}

// Estimate implements Policy: the worst case of o.History. A regular save
// that follows the step counts as a whole save, C + R, as Assess models it
// whether or not a snapshot follows the checkpoint, so that FiresAt stays a
// lower bound.
func (p ExpectedLoss) Estimate(o Observations) Estimates {
	est := p.WorstCase(o.history())
	if o.RegularSaveFollows {
		est.RegularSave, est.RegularSaveFollows = est.Checkpoint+est.Reserve, true
	}
	return est
}

// Judge implements Policy with Assess.
func (p ExpectedLoss) Judge(now, mustSaveBy time.Time, o Observations, _ Estimates) Verdict {
	return p.Assess(now, mustSaveBy, o.RegularSaveFollows, o.history()).Verdict()
}

// FiresAt implements Policy: B − (S + I + C + R + M) of the worst case.
// Before it, one more step and the save fit even at their longest and Assess
// continues; from it on, Assess weighs the losses, and may still continue.
func (ExpectedLoss) FiresAt(mustSaveBy time.Time, est Estimates) time.Time {
	return Max{}.FiresAt(mustSaveBy, est)
}

// PreStepFiresAt implements Policy: B − (C + R + M) of the worst case, no
// later than Assess's guard without an iteration (the save's longest
// support point).
func (ExpectedLoss) PreStepFiresAt(mustSaveBy time.Time, est Estimates) time.Time {
	return Max{}.PreStepFiresAt(mustSaveBy, est)
}

// history is o.History, or an empty one.
func (o Observations) history() *History {
	if o.History != nil {
		return o.History
	}
	h := NewHistory()
	return &h
}
