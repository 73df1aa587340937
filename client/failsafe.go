package client

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// FailSafeConfig is a trainer rank's fail-safe plan (docs/design.md, "When
// a trainer cannot reach the coordinator"): once the rank has had a step
// answered, a CompleteStep or ReportCheckpoint that cannot reach the
// coordinator within Wait is not an error. The rank decides the step by
// itself, from the last decision it received, and reports what it did
// when the coordinator answers again. Every rank of a run must use the
// same Wait and Probe, since both enter the plan: ranks that lost the
// coordinator after the same decision then decide the same step.
type FailSafeConfig struct {
	// Off turns the plan off: a call that cannot reach the coordinator
	// returns its error once the retry policy gives up, as clients before
	// the plan did.
	Off bool
	// Wait is W: how long a call waits for the coordinator (for the
	// connection to be ready, and the retries) before the rank decides by
	// itself, so that a coordinator that restarts within it answers as
	// usual. Default 5 s.
	Wait time.Duration
	// Probe is P: how long each later call waits for the coordinator while
	// the rank decides by itself. Default 0.5 s.
	Probe time.Duration
}

// The plan's defaults, as docs/design.md and the Python client have them.
const (
	defaultFailSafeWait  = 5 * time.Second
	defaultFailSafeProbe = 500 * time.Millisecond
)

// newFailSafe is the plan's state for cfg; nil when it is off.
func newFailSafe(cfg *FailSafeConfig) *failSafe {
	c := FailSafeConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Off {
		return nil
	}
	if c.Wait <= 0 {
		c.Wait = defaultFailSafeWait
	}
	if c.Probe <= 0 {
		c.Probe = defaultFailSafeProbe
	}
	return &failSafe{cfg: c}
}

// failSafe is a trainer's state for its plan. mu is held through each step
// and checkpoint call, and through a resync, so that the coordinator hears
// what the rank did in the order it did it.
type failSafe struct {
	cfg FailSafeConfig

	mu      sync.Mutex
	anchor  *v1.Decision // the last decision received; nil before the first
	saves   int          // checkpoints saved (CHECKPOINT_PHASE_SAVED) since
	local   error        // why the coordinator is out of reach; nil while it answers
	firedAt int64        // the step this rank decided SAVE_AND_STOP by itself, 0 if none
	pending []localReport
}

// localReport is a step a rank decided, or a checkpoint it saved, while
// the coordinator was out of reach, to report when it answers again.
type localReport struct {
	step int64
	// action is what the rank did at the step; UNSPECIFIED for a checkpoint.
	action    v1.StepAction
	iteration time.Duration
	phase     v1.CheckpointPhase
	save      time.Duration
}

func (r localReport) String() string {
	if r.action == v1.StepAction_STEP_ACTION_UNSPECIFIED {
		return fmt.Sprintf("checkpoint of step %d %s", r.step, apifacts.EnumName(r.phase))
	}
	return fmt.Sprintf("step %d %s", r.step, apifacts.EnumName(r.action))
}

// anchorOn makes d, just received, the plan's anchor.
func (f *failSafe) anchorOn(d *v1.Decision) {
	f.anchor, f.saves = d, 0
}

// wait is how long the next call waits for the coordinator: W, or P while
// the rank decides by itself.
func (f *failSafe) wait() time.Duration {
	if f.local != nil {
		return f.cfg.Probe
	}
	return f.cfg.Wait
}

// noAnswer reports whether err says the coordinator cannot answer for
// this rank, rather than refused the call, or the caller's own context
// ended: it could not be reached within the call's wait, or it no longer
// knows the run or the rank (NOT_FOUND, UNAUTHENTICATED: its data directory
// was lost, or restored from a copy made before the rank registered). The
// rank then goes on by its plan rather than end the job for what the
// coordinator lost. Before the first answer there is no plan, so a wrong
// run or token still fails the first step.
func noAnswer(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.NotFound, codes.Unauthenticated:
		return true
	}
	return false
}

// goLocal starts deciding by the plan: one WARNING, until the coordinator
// answers again.
func (t *Trainer) goLocal(cause error) {
	if t.fs.local != nil {
		return
	}
	t.fs.local = cause
	t.log.Warn("the coordinator cannot answer (out of reach, or it no longer knows this run): this rank decides its steps by the fail-safe plan from the last decision it received, and reports them when the coordinator answers again",
		"addr", t.c.addr, "err", cause, "anchor_step", t.fs.anchor.GetStep(), "anchor_action", apifacts.EnumName(t.fs.anchor.GetAction()))
}

// answered notes a call the coordinator answered: if the rank was deciding
// by itself, one WARNING says it is back.
func (t *Trainer) answered() {
	if t.fs.local == nil {
		return
	}
	t.fs.local = nil
	t.log.Warn("the coordinator answers again: reporting what this rank did meanwhile", "addr", t.c.addr, "reports", len(t.fs.pending))
}

// decideLocally decides step by the plan, and queues it for the
// coordinator.
func (t *Trainer) decideLocally(step int64, iteration time.Duration) *v1.Decision {
	f := t.fs
	var ld localDecision
	if f.firedAt > 0 && step > f.firedAt {
		ld = localDecision{action: v1.StepAction_STEP_ACTION_STOP,
			explanation: fmt.Sprintf("this rank saved for the deadline at step %d: stop", f.firedAt)}
	} else {
		ld = newLocalPlan(f.anchor, f.cfg.Wait, f.cfg.Probe).decide(step, f.saves, time.Now())
	}
	if ld.emergency {
		t.log.Warn("the fail-safe plan fires on this rank's own clock", "step", step, "why", ld.explanation)
	}
	if step > f.anchor.GetStep() && ld.action != v1.StepAction_STEP_ACTION_STOP {
		f.pending = append(f.pending, localReport{step: step, action: ld.action, iteration: iteration})
		if ld.action == v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
			f.firedAt = step
		}
	}
	return &v1.Decision{Step: step, Action: ld.action, Inputs: f.anchor.GetInputs(),
		Explanation: "decided by this rank, the coordinator out of reach: " + ld.explanation}
}

// flush reports, in order, what the rank did while the coordinator was out
// of reach; the first call waits first at most. It returns the error of a
// report that still could not reach the coordinator (the rest stays
// queued). A report the coordinator refuses is logged and dropped: sending
// it again would be refused again.
func (t *Trainer) flush(ctx context.Context, first time.Duration) error {
	f := t.fs
	wait := first
	for len(f.pending) > 0 {
		r := f.pending[0]
		err := t.report(ctx, wait, r)
		if noAnswer(ctx, err) {
			t.goLocal(err) // out of reach again before all was reported
			return err
		}
		if err != nil && ctx.Err() != nil {
			return err
		}
		if err != nil {
			t.log.Error("the coordinator refused what this rank did while it was out of reach", "report", r.String(), "err", err)
		}
		f.pending = f.pending[1:]
		wait = f.cfg.Wait
	}
	return nil
}

// report sends one queued report.
func (t *Trainer) report(ctx context.Context, wait time.Duration, r localReport) error {
	if r.action == v1.StepAction_STEP_ACTION_UNSPECIFIED {
		_, err := t.sendCheckpoint(ctx, wait, r.step, r.phase, r.save)
		if err == nil {
			t.answered()
		}
		return err
	}
	d, err := t.sendStep(ctx, wait, r.step, r.iteration, r.action)
	if err != nil {
		return err
	}
	t.answered()
	if d.GetAction() != r.action {
		t.log.Error("the coordinator had decided a step otherwise than this rank did while it could not reach it",
			"step", r.step, "rank_did", apifacts.EnumName(r.action), "decision", apifacts.EnumName(d.GetAction()), "explanation", d.GetExplanation())
	}
	t.fs.anchorOn(d)
	return nil
}

// unreported names what could not be reported, for a rank that exits while
// the coordinator is out of reach.
func (f *failSafe) unreported() string {
	var s []string
	for _, r := range f.pending {
		s = append(s, r.String())
	}
	return strings.Join(s, ", ")
}
