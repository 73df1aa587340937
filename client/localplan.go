package client

import (
	"fmt"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// localPlan is how a trainer rank decides a step by itself while it cannot
// reach the coordinator (docs/design.md, "the fail-safe plan"), from the
// last decision it received: the anchor. It reads no clock and makes no
// call, so that ranks anchored on the same decision, with the same wait and
// probe, decide the same step whatever their own timings.
type localPlan struct {
	step      int64         // s, the anchor's step
	action    v1.StepAction // the anchor's action
	decidedAt time.Time     // t₀, on the coordinator's clock
	b         time.Time     // B; zero when the run has no deadline
	// I, C, R and M as they stood at the anchor.
	iter, ckpt, reserve, margin time.Duration
	// W and P: a rank's first call waits W for the coordinator, each later
	// one P (FailSafeConfig).
	wait, probe time.Duration
}

// newLocalPlan anchors a plan on d, the last decision a rank received.
func newLocalPlan(d *v1.Decision, wait, probe time.Duration) localPlan {
	in := d.GetInputs()
	p := localPlan{
		step: d.GetStep(), action: d.GetAction(), decidedAt: d.GetDecidedAt().AsTime(),
		iter: seconds(in.GetIterationSeconds()), ckpt: seconds(in.GetCheckpointSeconds()),
		reserve: seconds(in.GetSaveReserveSeconds()), margin: seconds(in.GetMarginSeconds()),
		wait: wait, probe: probe,
	}
	if in.GetMustSaveBy() != nil {
		p.b = in.GetMustSaveBy().AsTime()
	}
	return p
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// localDecision is what the plan says of one step.
type localDecision struct {
	action v1.StepAction
	// emergency: the rank fired on its own clock, the projection having
	// fallen so far behind it that the save itself no longer fits.
	emergency   bool
	explanation string
}

// decide decides step n after the rank saved saves checkpoints since the
// anchor, now being the rank's clock (read only for the emergency rule).
//
// It projects the end of step n as
//
//	tₙ = t₀ + (n − s)·I + k·C + W + (n − s − 1)·P
//
// and answers SAVE_AND_STOP when tₙ + I + C + R + M ≥ B, the coordinator's
// own rule, or when now + C + R + M ≥ B (iterations slower than any the
// coordinator saw), else CONTINUE. After an anchor that fired (SAVE_AND_STOP
// or STOP) every later step is STOP, as the coordinator would answer.
func (p localPlan) decide(n int64, saves int, now time.Time) localDecision {
	switch {
	case n < p.step:
		return localDecision{action: v1.StepAction_STEP_ACTION_CONTINUE,
			explanation: fmt.Sprintf("step %d is before step %d, the last decided: continue", n, p.step)}
	case n == p.step:
		return localDecision{action: p.action, explanation: fmt.Sprintf("step %d was decided %s", n, apifacts.EnumName(p.action))}
	case p.action == v1.StepAction_STEP_ACTION_SAVE_AND_STOP || p.action == v1.StepAction_STEP_ACTION_STOP:
		return localDecision{action: v1.StepAction_STEP_ACTION_STOP,
			explanation: fmt.Sprintf("the deadline fired at step %d or before: stop", p.step)}
	case p.b.IsZero():
		return localDecision{action: v1.StepAction_STEP_ACTION_CONTINUE, explanation: "the run has no deadline: continue"}
	}
	ahead := time.Duration(n - p.step)
	end := p.decidedAt.Add(ahead*p.iter + time.Duration(saves)*p.ckpt + p.wait + (ahead-1)*p.probe)
	save := p.ckpt + p.reserve + p.margin
	if projected := end.Add(p.iter + save); !projected.Before(p.b) {
		return localDecision{action: v1.StepAction_STEP_ACTION_SAVE_AND_STOP, explanation: fmt.Sprintf(
			"projected from step %d: step %d ends by %s, + I+C+R+M = %s >= B = %s: save now and stop",
			p.step, n, stamp(end), stamp(projected), stamp(p.b))}
	}
	if late := now.Add(save); !late.Before(p.b) {
		return localDecision{action: v1.StepAction_STEP_ACTION_SAVE_AND_STOP, emergency: true, explanation: fmt.Sprintf(
			"this rank's clock: now + C+R+M = %s >= B = %s, though the projection from step %d said step %d ends by %s (iterations slower than the coordinator saw): save now and stop",
			stamp(late), stamp(p.b), p.step, n, stamp(end))}
	}
	return localDecision{action: v1.StepAction_STEP_ACTION_CONTINUE, explanation: fmt.Sprintf(
		"projected from step %d: step %d ends by %s, + I+C+R+M = %s < B = %s: continue",
		p.step, n, stamp(end), stamp(end.Add(p.iter+save)), stamp(p.b))}
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }
