package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
)

// checkpointEvery: a trainer checkpoint every this many steps, as a
// training config's save_period would ask.
const checkpointEvery = 3

// compute is one rank's share of a step: about 2 s, rank 1 a little
// slower, with some variation. The step itself ends at the barrier.
func compute(rank int32, step int64) time.Duration {
	return 1600*time.Millisecond + time.Duration(rank)*150*time.Millisecond + time.Duration(step%4)*100*time.Millisecond
}

// checkpointSave is how long a checkpoint takes to write.
func checkpointSave(step int64) time.Duration {
	return 700*time.Millisecond + time.Duration(step)*20*time.Millisecond
}

// train is one trainer rank's step loop, through the Go client.
func (d *demo) train(ctx context.Context, rank int32) error {
	cl, err := client.Dial(d.addr, client.WithInsecure(), client.WithRunToken(d.token))
	if err != nil {
		return err
	}
	defer cl.Close()
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tr, err := cl.StartTrainer(ctx, client.TrainerConfig{RunID: runID, Rank: rank, Logger: quiet})
	if err != nil {
		return fmt.Errorf("rank %d: %w", rank, err)
	}
	defer tr.Close(context.WithoutCancel(ctx))
	who := fmt.Sprintf("rank-%d", rank)
	for step := int64(1); ; step++ {
		began := time.Now()
		if err := pause(ctx, compute(rank, step)); err != nil {
			return err
		}
		if err := d.steps.wait(ctx); err != nil {
			return err
		}
		dec, err := tr.CompleteStep(ctx, step, time.Since(began))
		if err != nil {
			return fmt.Errorf("%s: %w", who, err)
		}
		switch dec.GetAction() {
		case v1.StepAction_STEP_ACTION_CONTINUE:
			if step%checkpointEvery == 0 {
				if err := d.checkpoint(ctx, tr, who, step); err != nil {
					return err
				}
			}
			continue
		case v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE:
			// A safety save (a run with reserve.safety_saves; not this
			// demo's): the checkpoint now, then more training.
			d.out.say(who, "step %d: SAVE_AND_CONTINUE: writing a safety checkpoint", step)
			if err := d.checkpoint(ctx, tr, who, step); err != nil {
				return err
			}
			continue
		case v1.StepAction_STEP_ACTION_SAVE_AND_STOP:
			d.out.say(who, "step %d: SAVE_AND_STOP: writing the final checkpoint", step)
			if err := d.checkpoint(ctx, tr, who, step); err != nil {
				return err
			}
		}
		return d.awaitStop(ctx, tr, who)
	}
}

func (d *demo) checkpoint(ctx context.Context, tr *client.Trainer, who string, step int64) error {
	took := checkpointSave(step)
	if err := pause(ctx, took); err != nil {
		return err
	}
	if _, err := tr.ReportCheckpoint(ctx, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, took); err != nil {
		return fmt.Errorf("%s: %w", who, err)
	}
	d.out.say(who, "checkpoint of step %d written in %.2f s", step, took.Seconds())
	return nil
}

// awaitStop waits for the coordinator's Stop: the run is over only once
// the environment workers saved too.
func (d *demo) awaitStop(ctx context.Context, tr *client.Trainer, who string) error {
	for {
		select {
		case cmd, ok := <-tr.Commands():
			if !ok {
				return fmt.Errorf("%s: commands ended without a Stop: %v", who, tr.Err())
			}
			if stop := cmd.GetStop(); stop != nil {
				d.out.say(who, "Stop received: exiting")
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("%s: waiting for Stop: %w", who, ctx.Err())
		}
	}
}

func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// barrier holds each rank at the end of a step until all ranks got there,
// as the collectives of a real training step do: ranks move in lockstep.
type barrier struct {
	mu      sync.Mutex
	n       int
	waiting int
	release chan struct{}
}

func newBarrier(n int) *barrier { return &barrier{n: n, release: make(chan struct{})} }

func (b *barrier) wait(ctx context.Context) error {
	b.mu.Lock()
	release := b.release
	if b.waiting++; b.waiting == b.n {
		b.waiting = 0
		close(b.release)
		b.release = make(chan struct{})
	}
	b.mu.Unlock()
	select {
	case <-release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
