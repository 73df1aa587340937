package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
)

// retryable says whether a failed write is worth repeating: the coordinator
// was down, restarting, or did not answer in time. Anything else is a bug
// the tool reports.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// until calls fn until it succeeds, ctx ends, or it fails for a reason a
// retry cannot fix. Each attempt has its own timeout.
func until(ctx context.Context, fn func(ctx context.Context) error) error {
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := fn(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !retryable(err) {
			if ctx.Err() != nil && err != nil {
				return ctx.Err()
			}
			return err
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// run is one run's writers: trainer ranks that complete steps and save
// checkpoints in lockstep, and environment workers that report every
// snapshot they are sent. Every acknowledged write goes into the log.
type runWriters struct {
	id       string
	log      *acks
	cl       *client.Client
	trainers []*client.Trainer
	envs     []*client.Worker
	wg       sync.WaitGroup
	fatal    chan error // writer errors that retrying cannot fix
	// stepEvery paces the trainers: a step begins at most this often
	// (0: as soon as the previous one is saved).
	stepEvery time.Duration
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startRun creates the run and starts its writers. Half the environment
// workers poll, half stream.
func startRun(ctx context.Context, addr, id string, ranks, envs int, log *acks) (*runWriters, error) {
	admin, err := client.Dial(addr, client.WithInsecure())
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	resp, err := admin.Runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: id, Spec: &v1.RunSpec{
		TrainerWorldSize: int32(ranks),
		Checkpointing:    &v1.CheckpointingSpec{CheckpointMustSaveBy: "30:00:00:00"},
		RolloutRecovery:  &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN},
	}})
	if err != nil {
		return nil, fmt.Errorf("CreateRun %s: %w", id, err)
	}
	log.run(id, ranks)
	cl, err := client.Dial(addr, client.WithInsecure(), client.WithRunToken(resp.RunToken))
	if err != nil {
		return nil, err
	}
	r := &runWriters{id: id, log: log, cl: cl, fatal: make(chan error, ranks+envs+1)}
	for i := range ranks {
		// No fail-safe plan: a step it decided by itself would count as a
		// write the coordinator acknowledged, and the check would look for
		// it in a store that never had it.
		t, err := cl.StartTrainer(ctx, client.TrainerConfig{RunID: id, Rank: int32(i), Logger: quietLogger(),
			FailSafe: &client.FailSafeConfig{Off: true}})
		if err != nil {
			r.close()
			return nil, err
		}
		log.registered(id, t.ID(), t.Incarnation())
		log.writer(r.trainerName(i))
		r.trainers = append(r.trainers, t)
		go drain(t.Commands()) // ends when the trainer is closed
	}
	for i := range envs {
		w, err := cl.StartWorker(ctx, client.WorkerConfig{RunID: id, Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT,
			Name: fmt.Sprintf("env-%d", i), Poll: i%2 == 1, PollWait: 5 * time.Second, Logger: quietLogger()})
		if err != nil {
			r.close()
			return nil, err
		}
		log.registered(id, w.ID(), w.Incarnation())
		log.writer(r.envName(i))
		r.envs = append(r.envs, w)
	}
	return r, nil
}

func (r *runWriters) trainerName(i int) string { return fmt.Sprintf("%s/rank-%d", r.id, i) }
func (r *runWriters) envName(i int) string     { return fmt.Sprintf("%s/env-%d", r.id, i) }

func drain(ch <-chan *v1.Command) {
	for range ch {
	}
}

// start runs the writers until ctx ends. The trainers stop at a step
// boundary: every step they began is acknowledged by every rank.
func (r *runWriters) start(ctx context.Context) {
	r.wg.Go(func() { r.train(ctx) })
	for i, w := range r.envs {
		r.wg.Go(func() { r.environment(ctx, i, w) })
	}
}

// wait waits for the writers to return after their ctx ended.
func (r *runWriters) wait() { r.wg.Wait() }

func (r *runWriters) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, t := range r.trainers {
		_ = t.Close(ctx)
	}
	for _, w := range r.envs {
		_ = w.Close(ctx)
	}
	_ = r.cl.Close()
}

func (r *runWriters) fail(err error) {
	select {
	case r.fatal <- err:
	default:
	}
}

// train: for each step, every rank completes it, then every rank saves its
// checkpoint. A write that fails for a retryable reason is repeated until
// acknowledged; a step is begun only when the previous one is finished.
func (r *runWriters) train(ctx context.Context) {
	pace := time.NewTicker(max(r.stepEvery, time.Nanosecond))
	defer pace.Stop()
	for step := int64(1); ctx.Err() == nil; step++ {
		if r.stepEvery > 0 && step > 1 {
			select {
			case <-pace.C:
			case <-ctx.Done():
				return
			}
		}
		// A step is finished even if ctx ends meanwhile, so that no step is
		// left half-saved; the writes still have a bound.
		stepCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		err := r.eachRank(stepCtx, func(ctx context.Context, i int, t *client.Trainer) error {
			var d *v1.Decision
			err := until(ctx, func(ctx context.Context) (err error) {
				d, err = t.CompleteStep(ctx, step, 10*time.Millisecond)
				return err
			})
			if err != nil {
				return fmt.Errorf("rank %d CompleteStep(%d): %w", i, step, err)
			}
			r.log.decision(r.id, r.trainerName(i), d)
			return nil
		})
		if err == nil {
			err = r.eachRank(stepCtx, func(ctx context.Context, i int, t *client.Trainer) error {
				err := until(ctx, func(ctx context.Context) error {
					_, err := t.ReportCheckpoint(ctx, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5*time.Millisecond)
					return err
				})
				if err != nil {
					return fmt.Errorf("rank %d ReportCheckpoint(%d): %w", i, step, err)
				}
				r.log.checkpointSaved(r.id, r.trainerName(i), step, int32(i))
				return nil
			})
		}
		cancel()
		if err != nil {
			r.fail(fmt.Errorf("run %s: %w", r.id, err))
			return
		}
	}
}

func (r *runWriters) eachRank(ctx context.Context, fn func(ctx context.Context, i int, t *client.Trainer) error) error {
	errs := make([]error, len(r.trainers))
	var wg sync.WaitGroup
	for i, t := range r.trainers {
		wg.Go(func() { errs[i] = fn(ctx, i, t) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// environment reports SAVED for every snapshot the worker is sent.
func (r *runWriters) environment(ctx context.Context, i int, w *client.Worker) {
	name := r.envName(i)
	for {
		var cmd *v1.Command
		select {
		case cmd = <-w.Commands():
		case <-ctx.Done():
			return
		}
		if cmd == nil {
			if err := w.Err(); err != nil {
				r.fail(fmt.Errorf("%s: commands ended: %w", name, err))
			}
			return
		}
		r.log.heard(name)
		id := cmd.GetSnapshot().GetSnapshotId()
		if id == "" {
			id = cmd.GetSaveAtDeadline().GetSnapshotId()
		}
		if id == "" {
			continue
		}
		err := until(ctx, func(ctx context.Context) error {
			_, err := w.ReportSnapshot(ctx, id, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 3*time.Millisecond, "")
			return err
		})
		if err != nil {
			if ctx.Err() == nil {
				r.fail(fmt.Errorf("%s: ReportSnapshot(%s): %w", name, id, err))
			}
			return
		}
		r.log.snapshotReported(r.id, name, id, w.ID(), v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	}
}
