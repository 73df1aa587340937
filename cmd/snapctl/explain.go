package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

func setupRunExplain(fs *flag.FlagSet, c *cli) func(context.Context, []string) error {
	step := fs.Int64("step", 0, "explain this `step`'s decision (default: the latest)")
	return func(ctx context.Context, args []string) error {
		if err := wantArgs(args, "RUN_ID"); err != nil {
			return err
		}
		return c.withClient(ctx, func(ctx context.Context, cl *client.Client) error {
			run, err := c.getRun(ctx, cl, args[0])
			if err != nil {
				return err
			}
			d, err := findDecision(ctx, cl, args[0], *step)
			if err != nil {
				return err
			}
			if c.output == "json" {
				if d == nil {
					d = &v1.Decision{}
				}
				return c.printJSON(d, "  ")
			}
			if d == nil {
				explainNoStep(c.stdout, run)
				return nil
			}
			explainDecision(c.stdout, run, d)
			return nil
		})
	}
}

// findDecision returns the decision of step from the run's events, or the
// latest when step is 0; nil when no step was decided yet.
func findDecision(ctx context.Context, cl *client.Client, runID string, step int64) (*v1.Decision, error) {
	var found *v1.Decision
	err := cl.WatchEvents(ctx, runID, 0, false, func(ev *v1.RunEvent) error {
		if d := ev.GetDecision(); ev.GetType() == v1.RunEventType_RUN_EVENT_TYPE_DECISION && d != nil && (step == 0 || d.GetStep() == step) {
			found = d
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the events of run %s: %w", runID, err)
	}
	if found == nil && step != 0 {
		return nil, withExit(exitNotFound, fmt.Errorf("run %s has no decision for step %d", runID, step))
	}
	return found, nil
}

// explainDecision says what was decided and why, in words:
// "continued: 41 s + 120 s + 60 s + 30 s would end at 11:38:12 CET,
// 7 min before the deadline".
func explainDecision(w io.Writer, run *v1.Run, d *v1.Decision) {
	in := d.GetInputs()
	fmt.Fprintf(w, "run %s, step %d, decided %s:\n", run.GetRunId(), d.GetStep(), stamp(d.GetDecidedAt()))
	if expectedLoss(run) {
		explainExpectedLoss(w, d)
		explainNow(w, run)
		return
	}
	fmt.Fprintf(w, "%s\n\n", verdict(d))
	if in.GetMustSaveBy() != nil {
		window := run.GetSpec().GetReserve().GetWindow()
		if in.RegularSaveSeconds != nil {
			fmt.Fprintf(w, "  S  %8s  the regular save after this step, before the next iteration (C, plus R when a snapshot follows each checkpoint)\n", secs(in.GetRegularSaveSeconds()))
		}
		fmt.Fprintf(w, "  I  %8s  iteration: the longest so far (per step, the slowest rank)\n", secs(in.GetIterationSeconds()))
		fmt.Fprintf(w, "  C  %8s  trainer checkpoint: the longest save so far (the spec's prior until one is measured)\n", secs(in.GetCheckpointSeconds()))
		fmt.Fprintf(w, "  R  %8s  save reserve: the longest of the last %d saved environment snapshots (or the prior)\n", secs(in.GetSaveReserveSeconds()), window)
		fmt.Fprintf(w, "  M  %8s  safety margin from the spec\n", secs(in.GetMarginSeconds()))
		fmt.Fprintf(w, "  B  %s  the deadline\n\n", stamp(in.GetMustSaveBy()))
		fmt.Fprintf(w, "Rule: continue while decision time + I + C + R + M < B (+ S at a step a regular save follows), else save now and stop.\n")
	}
	fmt.Fprintf(w, "Coordinator: %s\n", d.GetExplanation())
	explainNow(w, run)
}

// explainNow says what changed since the decision: the deadline fired, the
// run ended, or a trigger by hand is waiting, so that the next step saves
// and stops although this decision (continued) says otherwise.
func explainNow(w io.Writer, run *v1.Run) {
	switch {
	case run.GetFiredAt() != nil || run.GetEndedAt() != nil:
		fmt.Fprintf(w, "Now: the run is %s", apifacts.EnumName(run.GetState()))
		if run.GetFiredAt() != nil {
			fmt.Fprintf(w, "; the deadline fired %s", describeFire(run))
		}
		fmt.Fprintln(w, ".")
	case run.GetDeadline().GetTriggerPending() != "":
		fmt.Fprintf(w, "Now: the deadline was triggered by hand (%s): the next completed step saves and stops.\n",
			run.GetDeadline().GetTriggerPending())
	}
}

// verdict is the decision in one sentence.
func verdict(d *v1.Decision) string {
	in := d.GetInputs()
	if in.GetMustSaveBy() == nil {
		return actionWord(d.GetAction()) + ": " + d.GetExplanation()
	}
	b := in.GetMustSaveBy().AsTime()
	// fires_at is B - (S + I + C + R + M) as the coordinator added them, so
	// the sum's end is the coordinator's own to the nanosecond.
	total := seconds(in.GetRegularSaveSeconds() + in.GetIterationSeconds() + in.GetCheckpointSeconds() +
		in.GetSaveReserveSeconds() + in.GetMarginSeconds())
	if in.GetFiresAt() != nil {
		total = b.Sub(in.GetFiresAt().AsTime())
	}
	end := d.GetDecidedAt().AsTime().Add(total)
	sum := fmt.Sprintf("%s + %s + %s + %s", secs(in.GetIterationSeconds()), secs(in.GetCheckpointSeconds()),
		secs(in.GetSaveReserveSeconds()), secs(in.GetMarginSeconds()))
	if in.RegularSaveSeconds != nil {
		sum = secs(in.GetRegularSaveSeconds()) + " + " + sum
	}
	fine := (b.Sub(end)).Abs() < 10*time.Second
	switch {
	case d.GetAction() == v1.StepAction_STEP_ACTION_CONTINUE && end.Before(b):
		return fmt.Sprintf("continued: %s would end at %s, %s before the deadline (B = %s)",
			sum, clockTime(end, fine), span(b.Sub(end)), clockTime(b, fine))
	case d.GetAction() == v1.StepAction_STEP_ACTION_SAVE_AND_STOP && !end.Before(b):
		ahead := "another step, then the save"
		if in.RegularSaveSeconds != nil {
			ahead = "this step's regular save, another step, then the save"
		}
		return fmt.Sprintf("saved and stopped: %s (%s), would end at %s, %s past the deadline (B = %s)",
			ahead, sum, clockTime(end, fine), span(end.Sub(b)), clockTime(b, fine))
	}
	// A manual trigger, a step after the deadline fired, a terminal run.
	return actionWord(d.GetAction()) + ": " + d.GetExplanation()
}

func actionWord(a v1.StepAction) string {
	switch a {
	case v1.StepAction_STEP_ACTION_CONTINUE:
		return "continued"
	case v1.StepAction_STEP_ACTION_SAVE_AND_STOP:
		return "saved and stopped"
	case v1.StepAction_STEP_ACTION_STOP:
		return "stopped"
	case v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE:
		return "saved and continued (a safety save)"
	}
	return a.String()
}

// explainNoStep says what will happen before the first decision.
func explainNoStep(w io.Writer, run *v1.Run) {
	in := run.GetDeadline()
	fmt.Fprintf(w, "run %s is %s: no step has been decided.\n", run.GetRunId(), apifacts.EnumName(run.GetState()))
	if run.GetFiredAt() != nil {
		fmt.Fprintf(w, "The deadline fired %s.\n", describeFire(run))
		return
	}
	if in.GetMustSaveBy() == nil {
		fmt.Fprintln(w, "It has no deadline: every step continues until training finishes.")
		return
	}
	b := in.GetMustSaveBy().AsTime()
	fmt.Fprintf(w, "B = %s. With I %s, C %s, R %s, M %s", stamp(in.GetMustSaveBy()), secs(in.GetIterationSeconds()),
		secs(in.GetCheckpointSeconds()), secs(in.GetSaveReserveSeconds()), secs(in.GetMarginSeconds()))
	switch f := in.GetFiresAt(); {
	case f != nil && expectedLoss(run):
		fmt.Fprintf(w, " (the policy's worst cases), no step completing before %s saves and stops", stamp(f))
	case f != nil:
		fmt.Fprintf(w, ", a step completing from %s on saves and stops", stamp(f))
	}
	fmt.Fprintln(w, ".")
	preStep := b.Add(-seconds(in.GetCheckpointSeconds() + in.GetSaveReserveSeconds() + in.GetMarginSeconds()))
	fmt.Fprintf(w, "If snapshots are on and no step completes by B - (C + R + M) = %s (%s), the environment\n"+
		"workers save the bootstrap state and the run stops.\n", stamp(timestamppb.New(preStep)), relative(preStep, time.Now()))
}

// seconds converts an API's seconds to a duration, for display.
func seconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }
