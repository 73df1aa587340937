package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

func setupRunWatch(fs *flag.FlagSet, c *cli) func(context.Context, []string) error {
	fromNow := fs.Bool("from-now", false, "skip the run's history: show its state and last decision, then only new events")
	return func(ctx context.Context, args []string) error {
		if err := wantArgs(args, "RUN_ID"); err != nil {
			return err
		}
		run, err := c.watchRun(ctx, args[0], *fromNow)
		if err != nil && ctx.Err() != nil {
			return interrupted(args[0])
		}
		if err != nil {
			return err
		}
		return c.runEnded(run)
	}
}

// watchRun prints the run's state, then its history, then its new events
// until it ends (as events --follow does), and returns its final state.
// fromNow skips the history: the state and the last decision stand for
// it. Interrupted, it fails: the last call finds ctx cancelled.
func (c *cli) watchRun(ctx context.Context, runID string, fromNow bool) (*v1.Run, error) {
	cl, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	run, err := c.getRun(ctx, cl, runID)
	if err != nil {
		return nil, err
	}
	after := int64(0)
	if fromNow {
		after = run.GetLastEventSeq()
	}
	if c.output != "json" {
		c.printState(run)
	}
	if c.output != "json" && fromNow {
		if err := c.printLastDecision(ctx, cl, run); err != nil {
			return nil, err
		}
		c.printMissed(run)
	}
	if err := c.printEvents(ctx, cl, runID, after, true); err != nil {
		return nil, err
	}
	return c.getRun(ctx, cl, runID)
}

// printState: "run r1 is RUNNING at step 12; B = ... (in 9 min)", so that
// a watch says where the run stands before any event.
func (c *cli) printState(run *v1.Run) {
	state := apifacts.EnumName(run.GetState())
	if run.GetLastStep() != 0 {
		state += fmt.Sprintf(" at step %d", run.GetLastStep())
	}
	fmt.Fprintf(c.stdout, "run %s is %s; %s\n", run.GetRunId(), state, describeDeadline(run, time.Now()))
}

// printLastDecision says the last decision in words, so that a watch
// --from-now started mid-run does not wait for the next event to say why
// the run goes on.
func (c *cli) printLastDecision(ctx context.Context, cl *client.Client, run *v1.Run) error {
	d, err := lastDecision(ctx, c, cl, run)
	if err != nil {
		return err
	}
	if d == nil {
		fmt.Fprintln(c.stdout, "no step decided yet")
		return nil
	}
	fmt.Fprintf(c.stdout, "last decision, step %d at %s: %s\n", d.GetStep(), stamp(d.GetDecidedAt()), verdict(d))
	return nil
}

// decisionWindow is how many of the latest events lastDecision reads
// first: every step's decision is an event, so it is almost always among
// them, and a long run's backlog (up to --max-events-per-run) need not be
// read to find it.
const decisionWindow = 1000

// lastDecision is the run's latest decision up to its last_event_seq; nil
// before the first step.
func lastDecision(ctx context.Context, c *cli, cl *client.Client, run *v1.Run) (*v1.Decision, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	upTo := run.GetLastEventSeq()
	for after := max(0, upTo-decisionWindow); ; after = 0 {
		var found *v1.Decision
		err := cl.WatchEvents(ctx, run.GetRunId(), after, false, func(ev *v1.RunEvent) error {
			if ev.GetSeq() <= upTo && ev.GetType() == v1.RunEventType_RUN_EVENT_TYPE_DECISION && ev.GetDecision() != nil {
				found = ev.GetDecision()
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("read the events of run %s: %w", run.GetRunId(), err)
		}
		if found != nil || after == 0 {
			return found, nil
		}
	}
}

// interrupted is a watch stopped by SIGINT or SIGTERM before it read the
// run's final state: exit 0 is only for a run seen STOPPED or COMPLETED, so
// that `snapctl run watch $RUN && mark_done` does not take it for success.
func interrupted(runID string) error {
	return withExit(exitInterrupted, fmt.Errorf("interrupted before run %s was seen to end", runID))
}

func (c *cli) getRun(ctx context.Context, cl *client.Client, runID string) (*v1.Run, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := cl.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: runID})
	if err != nil {
		return nil, fmt.Errorf("get run %s: %w", runID, err)
	}
	return resp.GetRun(), nil
}

// printMissed says, on a line of its own, that the run missed its deadline.
func (c *cli) printMissed(run *v1.Run) {
	if run.GetDeadlineMissed() {
		fmt.Fprintf(c.stdout, "DEADLINE MISSED: %s\n", describeMissed(run))
	}
}

// runEnded reports the final state; FAILED and CANCELLED exit non-zero so
// that a launch script can tell.
func (c *cli) runEnded(run *v1.Run) error {
	state := apifacts.EnumName(run.GetState())
	if c.output != "json" {
		fmt.Fprintf(c.stdout, "run %s ended %s at %s\n", run.GetRunId(), state, stamp(run.GetEndedAt()))
		c.printMissed(run)
	}
	switch run.GetState() {
	case v1.RunState_RUN_STATE_FAILED, v1.RunState_RUN_STATE_CANCELLED:
		return withExit(exitRunFailed, fmt.Errorf("run %s ended %s: %s", run.GetRunId(), state, run.GetFailureMessage()))
	}
	return nil
}
