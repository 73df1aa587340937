package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

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
}

// Trainer is a registered trainer rank. Its Commands carry
// PublishCheckpoint (deferred finalize) and Stop.
type Trainer struct {
	*Worker
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
	return &Trainer{Worker: w}, nil
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
func (t *Trainer) CompleteStep(ctx context.Context, step int64, iteration time.Duration) (*v1.Decision, error) {
	var resp *v1.CompleteStepResponse
	err := t.fenced(ctx, func(inc int64) (err error) {
		resp, err = t.c.Workers.CompleteStep(ctx, &v1.CompleteStepRequest{
			RunId: t.cfg.RunID, WorkerId: t.ID(), Step: step, IterationSeconds: iteration.Seconds(), Incarnation: inc,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("client: complete step %d: %w", step, err)
	}
	d := resp.GetDecision()
	if d == nil {
		d = &v1.Decision{Step: resp.GetStep(), Action: resp.GetAction(), Explanation: resp.GetExplanation()}
	}
	switch d.GetAction() {
	case v1.StepAction_STEP_ACTION_CONTINUE, v1.StepAction_STEP_ACTION_SAVE_AND_STOP,
		v1.StepAction_STEP_ACTION_STOP, v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE:
		return d, nil
	}
	return d, fmt.Errorf("client: step %d: action %d (%s): %w", step, d.GetAction(), d.GetExplanation(), ErrUnknownAction)
}

// ReportCheckpoint reports this rank's checkpoint of step: SAVED after
// writing it (save is how long that took; it feeds C), PUBLISHED once
// step_N is visible (deferred finalize only). Safe to repeat.
func (t *Trainer) ReportCheckpoint(ctx context.Context, step int64, phase v1.CheckpointPhase, save time.Duration) (v1.RunState, error) {
	var resp *v1.ReportCheckpointResponse
	err := t.fenced(ctx, func(inc int64) (err error) {
		resp, err = t.c.Workers.ReportCheckpoint(ctx, &v1.ReportCheckpointRequest{
			RunId: t.cfg.RunID, WorkerId: t.ID(), Step: step, Phase: phase, SaveSeconds: save.Seconds(), Incarnation: inc,
		})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("client: report checkpoint of step %d: %w", step, err)
	}
	return resp.GetRunState(), nil
}

// FinishRun says training ended normally: the run becomes COMPLETED.
func (t *Trainer) FinishRun(ctx context.Context) (v1.RunState, error) {
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
