package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// TrainerConfig describes one trainer rank.
type TrainerConfig struct {
	// RunID is the run to join.
	RunID string
	// Rank is 0..trainer_world_size-1.
	Rank int32
	// Name is stable for the process; default "rank-<Rank>".
	Name string
	// Poll, PollWait and Logger are as in WorkerConfig.
	Poll     bool
	PollWait time.Duration
	Logger   *slog.Logger
	// FailSafe is the plan the rank follows when it cannot reach the
	// coordinator; nil is the default plan (W 5 s, P 0.5 s), and
	// &FailSafeConfig{Off: true} turns it off. See FailSafeConfig.
	FailSafe *FailSafeConfig
}

// Trainer is a registered trainer rank. Its Commands carry
// PublishCheckpoint (deferred finalize) and Stop.
type Trainer struct {
	*Worker
	fs *failSafe // nil when the plan is off
}

// StartTrainer registers a trainer rank; see StartWorker.
func (c *Client) StartTrainer(ctx context.Context, cfg TrainerConfig) (*Trainer, error) {
	if cfg.Name == "" {
		cfg.Name = fmt.Sprintf("rank-%d", cfg.Rank)
	}
	w, err := c.StartWorker(ctx, WorkerConfig{
		RunID: cfg.RunID, Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: cfg.Name, Rank: cfg.Rank,
		Poll: cfg.Poll, PollWait: cfg.PollWait, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return &Trainer{Worker: w, fs: newFailSafe(cfg.FailSafe)}, nil
}

// LastCheckpointStep is the run's newest checkpoint saved by every rank
// (and published, with deferred finalize) as of this rank's registration,
// 0 if none. A loop that resumes from its newest checkpoint without
// knowing its step (a Slurm requeue) numbers its next step
// LastCheckpointStep()+1.
func (t *Trainer) LastCheckpointStep() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reg.GetLastCheckpointStep()
}

// ErrUnknownAction: the coordinator answered a step with an action this
// client does not know (a newer coordinator). CompleteStep returns it with
// the decision rather than let the loop read the answer as CONTINUE: an
// action it does not know may ask for a save.
var ErrUnknownAction = errors.New("client: the coordinator answered an action this client does not know; upgrade it")

// CompleteStep reports that step (from 1) finished after iteration and
// returns what to do: keep training (CONTINUE); save the checkpoint of this
// step, report it, and stop (SAVE_AND_STOP); save and report it, then keep
// training (SAVE_AND_CONTINUE, a safety save: only in runs with
// reserve.safety_saves); or stop (STOP). Every rank gets the same decision
// for the same step. Any other action comes with ErrUnknownAction.
//
// iteration is the step's training alone: from when the previous
// CompleteStep returned (or the save it asked for ended) to the end of this
// step. Leave out the time before the first step, the saves (reported by
// ReportCheckpoint) and the time spent in this call: the coordinator takes
// the longest iteration as I, and an outage counted into one would make the
// run stop early for the rest of its life.
//
// With the fail-safe plan on (the default, see FailSafeConfig), once a step
// was answered, a call that cannot reach the coordinator within the plan's
// wait returns the rank's own decision, with no error and an explanation
// that starts "decided by this rank"; the first such call logs a WARNING,
// and the rank reports the steps it so decided when the coordinator
// answers again. Before the first answered step there is nothing to plan
// from, and the call fails as it would without the plan.
func (t *Trainer) CompleteStep(ctx context.Context, step int64, iteration time.Duration) (*v1.Decision, error) {
	if t.fs == nil {
		d, err := t.sendStep(ctx, 0, step, iteration, v1.StepAction_STEP_ACTION_UNSPECIFIED)
		return checkAction(d, err)
	}
	t.fs.mu.Lock()
	defer t.fs.mu.Unlock()
	if err := t.flush(ctx, t.fs.wait()); err != nil && noAnswer(ctx, err) {
		return t.decideLocally(step, iteration), nil
	}
	d, err := t.sendStep(ctx, t.fs.wait(), step, iteration, v1.StepAction_STEP_ACTION_UNSPECIFIED)
	switch {
	case noAnswer(ctx, err) && t.fs.anchor != nil:
		t.goLocal(err)
		return t.decideLocally(step, iteration), nil
	case err == nil:
		t.answered()
		t.fs.anchorOn(d)
	}
	return checkAction(d, err)
}

// sendStep asks the coordinator about step; local is what the rank already
// did at it by itself, or UNSPECIFIED. A wait above 0 bounds the call, and
// it then waits for the connection to be ready rather than fail at once.
func (t *Trainer) sendStep(ctx context.Context, wait time.Duration, step int64, iteration time.Duration, local v1.StepAction) (*v1.Decision, error) {
	ctx, cancel, opts := waitFor(ctx, wait)
	defer cancel()
	var resp *v1.CompleteStepResponse
	err := t.fenced(ctx, func(inc int64) (err error) {
		resp, err = t.c.Workers.CompleteStep(ctx, &v1.CompleteStepRequest{
			RunId: t.cfg.RunID, WorkerId: t.ID(), Step: step, IterationSeconds: iteration.Seconds(), Incarnation: inc,
			LocalAction: local,
		}, opts...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("client: complete step %d: %w", step, err)
	}
	d := resp.GetDecision()
	if d == nil {
		d = &v1.Decision{Step: resp.GetStep(), Action: resp.GetAction(), Explanation: resp.GetExplanation()}
	}
	return d, nil
}

// waitFor bounds a call to wait, with the connection awaited, when wait is
// above 0 (the fail-safe plan's W or P).
func waitFor(ctx context.Context, wait time.Duration) (context.Context, context.CancelFunc, []grpc.CallOption) {
	if wait <= 0 {
		return ctx, func() {}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	return ctx, cancel, []grpc.CallOption{grpc.WaitForReady(true)}
}

// checkAction passes a decision on, with ErrUnknownAction for an action
// this client does not know.
func checkAction(d *v1.Decision, err error) (*v1.Decision, error) {
	if err != nil {
		return d, err
	}
	switch d.GetAction() {
	case v1.StepAction_STEP_ACTION_CONTINUE, v1.StepAction_STEP_ACTION_SAVE_AND_STOP,
		v1.StepAction_STEP_ACTION_STOP, v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE:
		return d, nil
	}
	return d, fmt.Errorf("client: step %d: action %d (%s): %w", d.GetStep(), d.GetAction(), d.GetExplanation(), ErrUnknownAction)
}

// ReportCheckpoint reports this rank's checkpoint of step: SAVED after
// writing it (save is how long that took; it feeds C), PUBLISHED once
// step_N is visible (deferred finalize only). Safe to repeat.
//
// With the fail-safe plan on, once a step was answered, a report that
// cannot reach the coordinator within the plan's wait is queued and sent,
// in order with the steps, when it answers again: the call returns the run
// state last heard and no error. A queued SAVED checkpoint counts in the
// plan (the k·C of docs/design.md).
func (t *Trainer) ReportCheckpoint(ctx context.Context, step int64, phase v1.CheckpointPhase, save time.Duration) (v1.RunState, error) {
	if t.fs == nil {
		return t.sendCheckpoint(ctx, 0, step, phase, save)
	}
	t.fs.mu.Lock()
	defer t.fs.mu.Unlock()
	if phase == v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED {
		t.fs.saves++
	}
	queued := localReport{step: step, phase: phase, save: save}
	if err := t.flush(ctx, t.fs.wait()); err != nil && noAnswer(ctx, err) {
		t.fs.pending = append(t.fs.pending, queued)
		return t.RunState(), nil
	}
	state, err := t.sendCheckpoint(ctx, t.fs.wait(), step, phase, save)
	switch {
	case noAnswer(ctx, err) && t.fs.anchor != nil:
		t.goLocal(err)
		t.fs.pending = append(t.fs.pending, queued)
		return t.RunState(), nil
	case err == nil:
		t.answered()
	}
	return state, err
}

func (t *Trainer) sendCheckpoint(ctx context.Context, wait time.Duration, step int64, phase v1.CheckpointPhase, save time.Duration) (v1.RunState, error) {
	ctx, cancel, opts := waitFor(ctx, wait)
	defer cancel()
	var resp *v1.ReportCheckpointResponse
	err := t.fenced(ctx, func(inc int64) (err error) {
		resp, err = t.c.Workers.ReportCheckpoint(ctx, &v1.ReportCheckpointRequest{
			RunId: t.cfg.RunID, WorkerId: t.ID(), Step: step, Phase: phase, SaveSeconds: save.Seconds(), Incarnation: inc,
		}, opts...)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("client: report checkpoint of step %d: %w", step, err)
	}
	return resp.GetRunState(), nil
}

// FinishRun says training ended normally: the run becomes COMPLETED. What
// the rank did while the coordinator was out of reach is reported first.
func (t *Trainer) FinishRun(ctx context.Context) (v1.RunState, error) {
	if t.fs != nil {
		t.fs.mu.Lock()
		err := t.flush(ctx, t.fs.cfg.Wait)
		t.fs.mu.Unlock()
		if err != nil {
			return 0, fmt.Errorf("client: finish run: %w", err)
		}
	}
	var resp *v1.FinishRunResponse
	err := t.fenced(ctx, func(inc int64) (err error) {
		resp, err = t.c.Workers.FinishRun(ctx, &v1.FinishRunRequest{RunId: t.cfg.RunID, WorkerId: t.ID(), Incarnation: inc})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("client: finish run: %w", err)
	}
	return resp.GetRunState(), nil
}

// Close reports what the rank did while the coordinator was out of reach,
// waiting for it at most the plan's W, logs an ERROR naming what it could
// still not report, and closes the worker (see Worker.Close).
func (t *Trainer) Close(ctx context.Context) error {
	if t.fs != nil {
		t.fs.mu.Lock()
		if err := t.flush(ctx, t.fs.cfg.Wait); err != nil {
			t.log.Error("exiting with what this rank did while the coordinator was out of reach unreported", "addr", t.c.addr,
				"unreported", t.fs.unreported(), "err", err)
		}
		t.fs.mu.Unlock()
	}
	return t.Worker.Close(ctx)
}
