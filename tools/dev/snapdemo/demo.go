package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
)

const (
	runID      = "demo"
	worldSize  = 2
	envWorkers = 3
)

// run plays the whole demo and checks its outcome.
func run(ctx context.Context, cfg config) (err error) {
	dir, err := os.MkdirTemp("", "snapcoord-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	out := newTimeline()
	coord, err := coordproc.Start(ctx, coordproc.Config{
		Bin: cfg.snapcoord, DataDir: filepath.Join(dir, "data"), LogPath: filepath.Join(dir, "coordinator.log"),
		Args: []string{"--log-format", "json", "--metrics-listen", "", "--heartbeat-interval", "1s", "--lease-ttl", "5s"},
	})
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := coord.Stop(15 * time.Second); stopErr != nil && err == nil {
			err = stopErr
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s\n", coord.Tail(40))
		}
	}()
	out.say("demo", "coordinator on %s, data in %s", coord.Addr, filepath.Join(dir, "data"))

	d := &demo{cfg: cfg, dir: dir, addr: coord.Addr, out: out, steps: newBarrier(worldSize)}
	if err := d.createRun(ctx); err != nil {
		return err
	}
	return d.play(ctx)
}

// demo is one run of the demo against a running coordinator.
type demo struct {
	cfg   config
	dir   string
	addr  string
	out   *timeline
	token string
	admin *client.Client
	steps *barrier  // the trainer ranks' end of step
	b     time.Time // the deadline B
}

// createRun creates the run the way a launch script does, with snapctl.
func (d *demo) createRun(ctx context.Context) error {
	budget := fmt.Sprintf("00:00:00:%02d", int(d.cfg.budget.Seconds()))
	args := []string{"run", "create", runID, "--world-size", fmt.Sprint(worldSize), "--budget", budget,
		"--target-level", "turn", "--margin", "1"}
	stdout, err := d.snapctl(ctx, args...)
	if err != nil {
		return err
	}
	m := regexp.MustCompile(`export SNAPCOORD_RUN_TOKEN='([^']+)'`).FindStringSubmatch(stdout)
	if m == nil {
		return fmt.Errorf("snapctl run create printed no token: %q", stdout)
	}
	d.token = m[1]
	d.admin, err = client.Dial(d.addr, client.WithInsecure())
	if err != nil {
		return err
	}
	resp, err := d.admin.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: runID})
	if err != nil {
		return fmt.Errorf("get run: %w", err)
	}
	d.out.start = resp.GetRun().GetSpec().GetStartedAt().AsTime()
	d.b = resp.GetRun().GetDeadline().GetMustSaveBy().AsTime()
	d.out.say("demo", "run %q: %d trainer ranks, %d environment workers, turn level, budget %s: B = %s",
		runID, worldSize, envWorkers, budget, d.out.rel(d.b))
	return nil
}

// play runs the workers to the end of the run and checks the outcome.
func (d *demo) play(ctx context.Context) error {
	defer d.admin.Close()
	watched := make(chan error, 1)
	go func() { watched <- d.admin.WatchEvents(ctx, runID, 0, true, d.out.event) }()

	sidecars, err := d.startSidecars()
	if err != nil {
		return err
	}
	if err := d.awaitWorkers(ctx, envWorkers); err != nil {
		return err
	}
	var wg sync.WaitGroup
	trainerErrs := make([]error, worldSize)
	for rank := range worldSize {
		wg.Go(func() { trainerErrs[rank] = d.train(ctx, int32(rank)) })
	}
	wg.Wait()
	errs := append(trainerErrs, <-watched)
	for _, sc := range sidecars {
		errs = append(errs, sc.wait(ctx))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return d.verdict(ctx)
}

// awaitWorkers waits until n environment workers are live: the trainers
// start after them, so that every snapshot expects all three.
func (d *demo) awaitWorkers(ctx context.Context, n int) error {
	for {
		workers, err := d.admin.RunWorkers(ctx, runID)
		if err != nil {
			return err
		}
		live := 0
		for _, w := range workers {
			if w.GetState() == v1.WorkerState_WORKER_STATE_LIVE {
				live++
			}
		}
		if live >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d environment workers: %w", n, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// verdict checks that the run stopped with its deadline snapshot saved
// before B, and shows `snapctl run explain` for the fired step.
func (d *demo) verdict(ctx context.Context) error {
	runResp, err := d.admin.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: runID})
	if err != nil {
		return fmt.Errorf("get run: %w", err)
	}
	snaps, err := d.admin.Snapshots(ctx, runID)
	if err != nil {
		return err
	}
	r := runResp.GetRun()
	var last *v1.Snapshot
	for _, s := range snaps {
		if s.GetReason() == v1.SnapshotReason_SNAPSHOT_REASON_DEADLINE {
			last = s
		}
	}
	fmt.Println()
	d.out.say("demo", "explain the fired step: snapctl run explain %s --step %d", runID, r.GetFiredAtStep())
	explained, err := d.snapctl(ctx, "run", "explain", runID, "--step", fmt.Sprint(r.GetFiredAtStep()))
	if err != nil {
		return err
	}
	fmt.Print(explained)
	fmt.Println()
	return d.check(r, last)
}

func (d *demo) check(r *v1.Run, deadlineSnap *v1.Snapshot) error {
	switch {
	case r.GetState() != v1.RunState_RUN_STATE_STOPPED:
		return fmt.Errorf("the run ended %s, want STOPPED (%s)", r.GetState(), r.GetFailureMessage())
	case deadlineSnap == nil:
		return errors.New("no deadline snapshot was taken")
	case deadlineSnap.GetOutcome() != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED:
		return fmt.Errorf("deadline snapshot %s ended %s: %s", deadlineSnap.GetSnapshotId(), deadlineSnap.GetOutcome(), deadlineSnap.GetMessage())
	case !deadlineSnap.GetCompletedAt().AsTime().Before(d.b):
		return fmt.Errorf("deadline snapshot %s saved at %s, not before B = %s", deadlineSnap.GetSnapshotId(),
			d.out.rel(deadlineSnap.GetCompletedAt().AsTime()), d.out.rel(d.b))
	}
	done := deadlineSnap.GetCompletedAt().AsTime()
	d.out.say("demo", "run STOPPED: checkpoint of step %d and deadline snapshot %s saved at %s, %.1f s before B (%s)",
		r.GetFiredAtStep(), deadlineSnap.GetSnapshotId(), d.out.rel(done), d.b.Sub(done).Seconds(), d.out.rel(d.b))
	return nil
}
