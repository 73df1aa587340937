package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/cmd/internal/durations"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// withClient runs fn with a connection bounded by --timeout.
func (c *cli) withClient(ctx context.Context, fn func(ctx context.Context, cl *client.Client) error) error {
	cl, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := c.call(ctx)
	defer cancel()
	return fn(ctx, cl)
}

// oneRun is the shape of the commands that take RUN_ID and print a run.
func oneRun(c *cli, call func(ctx context.Context, cl *client.Client, runID string) (*v1.Run, error)) func(context.Context, []string) error {
	return func(ctx context.Context, args []string) error {
		if err := wantArgs(args, "RUN_ID"); err != nil {
			return err
		}
		return c.withClient(ctx, func(ctx context.Context, cl *client.Client) error {
			run, err := call(ctx, cl, args[0])
			if err != nil {
				return err
			}
			return c.printRun(run)
		})
	}
}

func setupRunGet(_ *flag.FlagSet, c *cli) func(context.Context, []string) error {
	return oneRun(c, func(ctx context.Context, cl *client.Client, runID string) (*v1.Run, error) {
		resp, err := cl.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: runID})
		if err != nil {
			return nil, fmt.Errorf("get run %s: %w", runID, err)
		}
		return resp.GetRun(), nil
	})
}

func setupRunTrigger(fs *flag.FlagSet, c *cli) func(context.Context, []string) error {
	reason := fs.String("reason", "", "why, recorded in the run's events")
	return oneRun(c, func(ctx context.Context, cl *client.Client, runID string) (*v1.Run, error) {
		resp, err := cl.Runs.TriggerDeadline(ctx, &v1.TriggerDeadlineRequest{RunId: runID, Reason: *reason})
		if err != nil {
			return nil, fmt.Errorf("trigger the deadline of run %s: %w", runID, err)
		}
		return resp.GetRun(), nil
	})
}

func setupRunCancel(fs *flag.FlagSet, c *cli) func(context.Context, []string) error {
	reason := fs.String("reason", "", "why, recorded in the run and sent with Stop")
	return oneRun(c, func(ctx context.Context, cl *client.Client, runID string) (*v1.Run, error) {
		resp, err := cl.Runs.CancelRun(ctx, &v1.CancelRunRequest{RunId: runID, Reason: *reason})
		if err != nil {
			return nil, fmt.Errorf("cancel run %s: %w", runID, err)
		}
		return resp.GetRun(), nil
	})
}

func setupRunExtend(fs *flag.FlagSet, c *cli) func(context.Context, []string) error {
	var budget, add time.Duration
	durations.Var(fs, &budget, "budget", 0, budgetGrammar, "new budget from the run's started_at: a `duration` (3h45m, Slurm's 1-12:00:00, DD:HH:MM:SS)")
	mustSaveBy := fs.String("must-save-by", "", "new B: RFC 3339 `time`, \"slurm\" (the job's current end, from squeue: after scontrol update) or \"slurm-10m\"")
	durations.Var(fs, &add, "add", 0, durations.Options{Negative: true}, "move B by this `duration` (30m, 1-00:00:00; negative moves it earlier)")
	return oneRun(c, func(ctx context.Context, cl *client.Client, runID string) (*v1.Run, error) {
		req := &v1.UpdateDeadlineRequest{RunId: runID}
		var err error
		switch given := countSet(c, "budget", "must-save-by", "add"); {
		case given != 1:
			return nil, usageErr(errors.New("give exactly one of --budget, --must-save-by and --add"))
		case c.setFlags["budget"]:
			err = positiveBudget(budget)
			req.CheckpointMustSaveBy = durations.FormatDHMS(budget)
		case c.setFlags["must-save-by"]:
			req.MustSaveBy, err = c.parseTime("must-save-by", *mustSaveBy, slurmEnd, true)
		case c.setFlags["add"]:
			req.MustSaveBy, err = currentDeadlinePlus(ctx, cl, runID, add)
		}
		if err != nil {
			return nil, err
		}
		resp, err := cl.Runs.UpdateDeadline(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("move the deadline of run %s: %w", runID, err)
		}
		return resp.GetRun(), nil
	})
}

func countSet(c *cli, names ...string) int {
	n := 0
	for _, name := range names {
		if c.setFlags[name] {
			n++
		}
	}
	return n
}

// currentDeadlinePlus is B + d, sent as an absolute time: repeating the
// call (a retry) sets the same B rather than adding d twice.
func currentDeadlinePlus(ctx context.Context, cl *client.Client, runID string, d time.Duration) (*timestamppb.Timestamp, error) {
	resp, err := cl.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: runID})
	if err != nil {
		return nil, fmt.Errorf("get run %s: %w", runID, err)
	}
	b := resp.GetRun().GetDeadline().GetMustSaveBy()
	if b == nil {
		return nil, withExit(exitConflict, fmt.Errorf("run %s has no deadline to move; give --budget or --must-save-by", runID))
	}
	return timestamppb.New(b.AsTime().Add(d)), nil
}

func setupRunList(fs *flag.FlagSet, c *cli) func(context.Context, []string) error {
	state := fs.String("state", "", "only runs in this `state` (running, stopped, ...)")
	return func(ctx context.Context, args []string) error {
		if err := wantArgs(args); err != nil {
			return err
		}
		filter, err := parseRunState(*state)
		if err != nil {
			return err
		}
		return c.withClient(ctx, func(ctx context.Context, cl *client.Client) error {
			runs, err := cl.AllRuns(ctx, filter)
			if err != nil {
				return err
			}
			if c.output == "json" {
				return c.printJSON(&v1.ListRunsResponse{Runs: runs}, "  ")
			}
			return c.printRunTable(runs)
		})
	}
}

func parseRunState(s string) (v1.RunState, error) {
	if s == "" {
		return v1.RunState_RUN_STATE_UNSPECIFIED, nil
	}
	if v, ok := apifacts.ParseEnum[v1.RunState](s); ok {
		return v, nil
	}
	return 0, inputErr("--state %q: want pending, running, saving, snapshotting, stopped, completed, failed or cancelled", s)
}

func (c *cli) printRunTable(runs []*v1.Run) error {
	now := time.Now()
	rows := make([][]string, 0, len(runs))
	for _, r := range runs {
		b := "-"
		if ts := r.GetDeadline().GetMustSaveBy(); ts != nil {
			b = stamp(ts) + " (" + relative(ts.AsTime(), now) + ")"
		}
		rows = append(rows, []string{r.GetRunId(), apifacts.EnumName(r.GetState()),
			strconv.FormatInt(r.GetLastStep(), 10), b, stamp(r.GetCreatedAt())})
	}
	return table(c.stdout, "RUN\tSTATE\tSTEP\tDEADLINE B\tCREATED", rows)
}

func (c *cli) printRun(r *v1.Run) error {
	if c.output == "json" {
		return c.printJSON(r, "  ")
	}
	now := time.Now()
	d := r.GetDeadline()
	rows := [][]string{
		{"run", r.GetRunId()},
		{"state", apifacts.EnumName(r.GetState())},
	}
	if r.GetDeadlineMissed() {
		rows = append(rows, []string{"DEADLINE MISSED", describeMissed(r)})
	}
	rows = append(rows, [][]string{
		{"trainer ranks", strconv.Itoa(int(r.GetSpec().GetTrainerWorldSize()))},
		{"recovery level", apifacts.EnumLower(r.GetSpec().GetRolloutRecovery().GetTargetLevel())},
		{"created", stamp(r.GetCreatedAt())},
		{"started at", stamp(r.GetSpec().GetStartedAt())},
		{"deadline", describeDeadline(r, now)},
		{"regular saves", describeRegularSaves(r.GetSpec().GetCheckpointing().GetCheckpointEverySteps())},
		{"policy", describePolicy(r)},
		{"estimates", describeEstimates(r)},
		{"last step", fmt.Sprintf("%d (last published checkpoint: step %d)", r.GetLastStep(), r.GetLastPublishedStep())},
	}...)
	switch {
	case d.GetTriggerPending() != "": // set only until the deadline fires
		rows = append(rows, []string{"fires at", describePending(d.GetTriggerPending())})
	case d.GetFiresAt() != nil && r.GetFiredAt() == nil:
		rows = append(rows, []string{"fires at", describeFiresAt(r)})
	}
	if t := d.GetLastDurableSave(); t != nil {
		rows = append(rows, []string{"last durable save", stamp(t) + ": a miss would lose the work since"})
	}
	if r.GetFiredAt() != nil {
		rows = append(rows, []string{"fired", describeFire(r)})
	}
	if r.GetEndedAt() != nil {
		rows = append(rows, []string{"ended", stamp(r.GetEndedAt())})
	}
	if m := r.GetFailureMessage(); m != "" {
		rows = append(rows, []string{"reason", m})
	}
	return table(c.stdout, "", rows)
}

// describeEstimates: "I 41 s, C 120 s, R 60 s, M 30 s", and ", S 180 s
// (the regular save after step 20)" when one follows the next step.
func describeEstimates(r *v1.Run) string {
	d := r.GetDeadline()
	out := ""
	if expectedLoss(r) {
		out = "at their longest: "
	}
	out += fmt.Sprintf("I %s, C %s, R %s, M %s", secs(d.GetIterationSeconds()), secs(d.GetCheckpointSeconds()),
		secs(d.GetSaveReserveSeconds()), secs(d.GetMarginSeconds()))
	if d.RegularSaveSeconds != nil {
		out += fmt.Sprintf(", S %s (the regular save after step %d)", secs(d.GetRegularSaveSeconds()), r.GetLastStep()+1)
	}
	return out
}

// describeRegularSaves is checkpoint_every_steps in words.
func describeRegularSaves(every int32) string {
	if every <= 0 {
		return "none declared (checkpoint_every_steps 0): the rule counts no regular save"
	}
	return fmt.Sprintf("after every step that is a multiple of %d, counted as S in the look-ahead", every)
}

// describeMissed: how the run missed its deadline, and when that was found.
func describeMissed(r *v1.Run) string {
	return r.GetDeadlineMissedReason() + " (found " + stamp(r.GetDeadlineMissedAt()) + ")"
}

// describeDeadline: "B = 2026-11-30 11:45:00 CET (in 3 h 45 min)"; for a
// run that ended, no countdown but how its end stood to B: "B = ...
// (the run ended 1 min 12 s before B)".
func describeDeadline(r *v1.Run, now time.Time) string {
	b := r.GetDeadline().GetMustSaveBy()
	switch {
	case b == nil:
		return "none: the run never fires by itself"
	case r.GetEndedAt() != nil:
		ended, bt := r.GetEndedAt().AsTime(), b.AsTime()
		side := "before"
		if ended.After(bt) {
			side = "after"
		}
		return fmt.Sprintf("B = %s (the run ended %s %s B)", stamp(b), span(bt.Sub(ended)), side)
	}
	return fmt.Sprintf("B = %s (%s)", stamp(b), relative(b.AsTime(), now))
}

// describePending is a TriggerDeadline after the first step, waiting for
// the next step: that step saves and stops whatever fires_at says.
func describePending(reason string) string {
	return "the next completed step, which saves and stops: the deadline was triggered by hand (" + reason + ")"
}

func describeFire(r *v1.Run) string {
	at := stamp(r.GetFiredAt())
	switch r.GetFireKind() {
	case v1.DeadlineFireKind_DEADLINE_FIRE_KIND_PRE_STEP:
		return at + ", before the first step"
	case v1.DeadlineFireKind_DEADLINE_FIRE_KIND_MANUAL:
		if r.GetFiredAtStep() == 0 {
			return at + ", by hand, before the first step"
		}
		return fmt.Sprintf("%s, by hand, at step %d", at, r.GetFiredAtStep())
	case v1.DeadlineFireKind_DEADLINE_FIRE_KIND_LOCAL:
		return fmt.Sprintf("%s, by the trainer ranks on their own while the coordinator was out of reach, at step %d", at, r.GetFiredAtStep())
	}
	return fmt.Sprintf("%s, at step %d", at, r.GetFiredAtStep())
}
