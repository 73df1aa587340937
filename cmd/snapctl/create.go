package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/cmd/internal/durations"
)

// specFlags are run create's flags. Set flags override --from-nemo-rl.
type specFlags struct {
	fromNemoRL                        string
	worldSize                         int
	budget                            time.Duration
	mustSaveBy, startedAt             string
	deferredFinalize                  bool
	snapshotInterval, snapshotTimeout time.Duration
	snapshotOnCheckpoint              bool
	maxFailures                       int
	targetLevel                       string
	window                            int
	margin, expCheckpoint, expSnap    time.Duration
	checkpointEvery                   int
	policy                            string
	maxLoss                           time.Duration
	safetySaves                       bool
}

// The grammars of the duration flags (cmd/internal/durations): those the
// API counts in seconds also take a bare number of seconds, as before;
// those it counts in whole seconds (and the budget) refuse a fraction.
var (
	budgetGrammar       = durations.Options{WholeSeconds: true}
	secondsGrammar      = durations.Options{BareSeconds: true}
	wholeSecondsGrammar = durations.Options{BareSeconds: true, WholeSeconds: true}
	// Flags new since the grammar was unified take no bare number.
	durationGrammar = durations.Options{}
)

// positiveBudget refuses --budget 0: B would be the run's start, a run
// already past its deadline. (A negative one the grammar refuses.)
func positiveBudget(d time.Duration) error {
	if d <= 0 {
		return usageErr(errors.New("--budget must be positive: 0 puts the deadline B at the run's start, already past " +
			"(to fire the deadline of a live run now: snapctl run trigger)"))
	}
	return nil
}

func setupRunCreate(fs *flag.FlagSet, c *cli) func(context.Context, []string) error {
	c.outputs = []string{"env", "json"}
	var f specFlags
	fs.StringVar(&f.fromNemoRL, "from-nemo-rl", "", "read the spec from a NeMo RL YAML config `file` (flags given too win)")
	fs.IntVar(&f.worldSize, "world-size", 0, "number of trainer ranks (required)")
	durations.Var(fs, &f.budget, "budget", 0, budgetGrammar, "budget from --started-at: a `duration` (3h45m, Slurm's 1-12:00:00, DD:HH:MM:SS)")
	fs.StringVar(&f.mustSaveBy, "must-save-by", "", "absolute deadline B: RFC 3339 `time`, \"slurm\" (the job's end, from squeue) or \"slurm-10m\"")
	fs.StringVar(&f.startedAt, "started-at", "", "when the budget clock starts: RFC 3339 `time` or \"slurm\" (the job's start, from squeue); default now")
	fs.BoolVar(&f.deferredFinalize, "deferred-finalize", false, "checkpoints are published after they are saved (PublishCheckpoint)")
	durations.Var(fs, &f.snapshotInterval, "snapshot-interval", 0, wholeSecondsGrammar, "also snapshot every this `duration` (300 or 5m)")
	fs.BoolVar(&f.snapshotOnCheckpoint, "snapshot-on-trainer-checkpoint", true, "at turn/prefix level, snapshot after every published checkpoint")
	fs.IntVar(&f.maxFailures, "max-consecutive-failures", 0, "failed snapshots in a row that fail the run (default 3)")
	durations.Var(fs, &f.snapshotTimeout, "snapshot-timeout", 0, wholeSecondsGrammar, "`duration` a snapshot may take (default 600 seconds)")
	fs.StringVar(&f.targetLevel, "target-level", "", "rollout recovery `level`: prompt_group, sibling, turn or prefix")
	fs.IntVar(&f.window, "reserve-window", 0, "R is the longest of the last this many saved snapshots (default 5)")
	durations.Var(fs, &f.margin, "margin", 0, secondsGrammar, "safety margin M, a `duration` (seconds, or 1m30s)")
	durations.Var(fs, &f.expCheckpoint, "expected-checkpoint", 0, secondsGrammar, "prior for C, a `duration` (seconds, or 2m), until a checkpoint is measured")
	durations.Var(fs, &f.expSnap, "expected-snapshot", 0, secondsGrammar, "prior for R, a `duration` (seconds, or 1m), until a snapshot is measured")
	fs.IntVar(&f.checkpointEvery, "checkpoint-every", 0, "the trainer saves a regular checkpoint after every `N`th step (NeMo RL's save_period), counted in the look-ahead")
	fs.StringVar(&f.policy, "policy", "", "the deadline `policy`: max (the default) or expected-loss")
	fs.BoolVar(&f.safetySaves, "safety-saves", false, "with --policy expected-loss: a step may be answered SAVE_AND_CONTINUE (every rank must handle it)")
	durations.Var(fs, &f.maxLoss, "max-loss", 0, durationGrammar, "τ for --policy expected-loss, a `duration`: a miss losing more work than this weighs as a disaster (default 25m)")
	return func(ctx context.Context, args []string) error {
		if err := wantArgs(args, "RUN_ID"); err != nil {
			return err
		}
		spec, err := c.buildSpec(f)
		if err != nil {
			return err
		}
		return c.createRun(ctx, args[0], spec)
	}
}

// buildSpec starts from the NeMo RL file, if any, and applies the flags
// that were given.
func (c *cli) buildSpec(f specFlags) (*v1.RunSpec, error) {
	spec := &v1.RunSpec{
		Checkpointing: &v1.CheckpointingSpec{}, RolloutCheckpointing: &v1.RolloutCheckpointingSpec{},
		RolloutRecovery: &v1.RolloutRecoverySpec{}, Reserve: &v1.ReserveSpec{},
	}
	if f.fromNemoRL != "" {
		if err := readNemoRL(f.fromNemoRL, spec); err != nil {
			return nil, err
		}
	}
	if !c.setFlags["world-size"] {
		return nil, usageErr(errors.New("--world-size is required"))
	}
	var err error
	if spec.TrainerWorldSize, err = int32Flag("world-size", f.worldSize); err != nil {
		return nil, err
	}
	if err := c.applyDeadlineFlags(f, spec); err != nil {
		return nil, err
	}
	return spec, c.applySnapshotFlags(f, spec)
}

func (c *cli) applyDeadlineFlags(f specFlags, spec *v1.RunSpec) error {
	ck := spec.Checkpointing
	if c.setFlags["budget"] && c.setFlags["must-save-by"] {
		return usageErr(errors.New("give --budget or --must-save-by, not both"))
	}
	if c.setFlags["budget"] {
		if err := positiveBudget(f.budget); err != nil {
			return err
		}
		ck.CheckpointMustSaveBy, ck.MustSaveBy = durations.FormatDHMS(f.budget), nil
	}
	if c.setFlags["must-save-by"] {
		b, err := c.parseTime("must-save-by", f.mustSaveBy, slurmEnd, false)
		if err != nil {
			return err
		}
		ck.CheckpointMustSaveBy, ck.MustSaveBy = "", b
	}
	if c.setFlags["started-at"] {
		t, err := c.parseTime("started-at", f.startedAt, slurmStart, false)
		if err != nil {
			return err
		}
		spec.StartedAt = t
	}
	if c.setFlags["deferred-finalize"] {
		ck.DeferredFinalize = f.deferredFinalize
	}
	return nil
}

func (c *cli) applySnapshotFlags(f specFlags, spec *v1.RunSpec) error {
	rc, res := spec.RolloutCheckpointing, spec.Reserve
	set := c.setFlags
	if err := c.applyInt32Flags(f, spec); err != nil {
		return err
	}
	if set["snapshot-on-trainer-checkpoint"] {
		rc.SnapshotOnTrainerCheckpoint = proto.Bool(f.snapshotOnCheckpoint)
	}
	if set["target-level"] {
		tl, err := parseTargetLevel(f.targetLevel)
		if err != nil {
			return inputErr("--target-level: %w", err)
		}
		spec.RolloutRecovery.TargetLevel = tl
	}
	if set["margin"] {
		res.MarginSeconds = f.margin.Seconds()
	}
	if set["expected-checkpoint"] {
		res.ExpectedCheckpointSeconds = proto.Float64(f.expCheckpoint.Seconds())
	}
	if set["expected-snapshot"] {
		res.ExpectedSnapshotSeconds = proto.Float64(f.expSnap.Seconds())
	}
	if set["policy"] {
		p, err := parsePolicy(f.policy)
		if err != nil {
			return inputErr("--policy: %w", err)
		}
		res.Policy = p
	}
	if set["max-loss"] {
		res.MaxLossSeconds = f.maxLoss.Seconds()
	}
	if set["safety-saves"] {
		res.SafetySaves = f.safetySaves
	}
	return nil
}

// applyInt32Flags sets the spec's int32 fields from the int flags that were
// given, each checked to fit first.
func (c *cli) applyInt32Flags(f specFlags, spec *v1.RunSpec) error {
	rc := spec.RolloutCheckpointing
	for _, fl := range []struct {
		name  string
		value int
		set   func(int32)
	}{
		{"snapshot-interval", int(f.snapshotInterval / time.Second), func(v int32) { rc.SnapshotAttemptIntervalS = proto.Int32(v) }},
		{"max-consecutive-failures", f.maxFailures, func(v int32) { rc.MaxConsecutiveFailures = v }},
		{"snapshot-timeout", int(f.snapshotTimeout / time.Second), func(v int32) { rc.SnapshotTimeoutS = v }},
		{"reserve-window", f.window, func(v int32) { spec.Reserve.Window = v }},
		{"checkpoint-every", f.checkpointEvery, func(v int32) { spec.Checkpointing.CheckpointEverySteps = v }},
	} {
		if !c.setFlags[fl.name] {
			continue
		}
		v, err := int32Flag(fl.name, fl.value)
		if err != nil {
			return err
		}
		fl.set(v)
	}
	return nil
}

// int32Flag converts an int flag for an int32 field. Unchecked, the
// conversion wraps: --world-size 4294967297 would create a run of 1 rank.
func int32Flag(name string, v int) (int32, error) {
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, usageErr(fmt.Errorf("--%s %d: out of range (%d to %d)", name, v, math.MinInt32, math.MaxInt32))
	}
	return int32(v), nil
}

// createRun creates the run and prints its token once: by default as shell
// assignments on stdout, for `eval "$(snapctl run create ...)"`, with a
// summary on stderr.
func (c *cli) createRun(ctx context.Context, runID string, spec *v1.RunSpec) error {
	cl, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := cl.Runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: runID, Spec: spec})
	if err != nil {
		return fmt.Errorf("create run %s: %w", runID, err)
	}
	if resp.GetRunToken() == "" {
		return withExit(exitConflict, fmt.Errorf("run %s already exists with this spec and its workers use its token, which is not shown again", runID))
	}
	what := "created run"
	if resp.GetTokenReissued() {
		what = "run already existed with this spec and no worker yet, so it has a new token (the earlier one no longer works):"
	}
	return c.printRunToken(resp, runID, resp.GetRunToken(), what, resp.GetRun())
}

// printRunToken prints a run token once: resp with -o json, else shell
// assignments on stdout, for eval, and what happened on stderr.
func (c *cli) printRunToken(resp proto.Message, runID, token, what string, run *v1.Run) error {
	if c.output == "json" {
		return c.printJSON(resp, "  ")
	}
	fmt.Fprintf(c.stdout, "export SNAPCOORD_RUN_ID='%s'\nexport SNAPCOORD_RUN_TOKEN='%s'\n", runID, token)
	fmt.Fprintf(c.stderr, "snapctl: %s %s: %s; its token is in SNAPCOORD_RUN_TOKEN\n", what, runID, describeDeadline(run, time.Now()))
	return nil
}

// setupRunReissueToken is the launcher's way back into its run after a
// requeue: the job keeps its id, so run create finds the run, and once
// workers registered it shows no token.
func setupRunReissueToken(fs *flag.FlagSet, c *cli) func(context.Context, []string) error {
	c.outputs = []string{"env", "json"}
	reason := fs.String("reason", "", "why, recorded in the run's events (e.g. \"job 42 requeued\")")
	return func(ctx context.Context, args []string) error {
		if err := wantArgs(args, "RUN_ID"); err != nil {
			return err
		}
		runID := args[0]
		return c.withClient(ctx, func(ctx context.Context, cl *client.Client) error {
			resp, err := cl.Runs.ReissueRunToken(ctx, &v1.ReissueRunTokenRequest{RunId: runID, Reason: *reason})
			if err != nil {
				return fmt.Errorf("reissue the token of run %s: %w", runID, err)
			}
			return c.printRunToken(resp, runID, resp.GetRunToken(), "new token (the earlier one no longer works) for run", resp.GetRun())
		})
	}
}
