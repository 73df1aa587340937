package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
	"github.com/snapcoord/snapcoord/server/coordinator"
)

// restart: the time from starting the process to health SERVING, on a
// data directory holding runs × workers workers with their events and
// steps, against the same binary on an empty data directory. The data is
// written by the engine itself, in process, so the records are exactly what
// a coordinator stores; every worker is LIVE, so every one gets a lease
// timer again at startup.
func (b *bench) restart(ctx context.Context) error {
	emptyDir := filepath.Join(b.tmp, "restart-empty")
	floor, _, err := b.timeStarts(ctx, emptyDir)
	if err != nil {
		return err
	}

	dir := filepath.Join(b.tmp, "restart")
	dataDir := filepath.Join(dir, "data")
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return err
	}
	start := time.Now()
	events, err := prepareRestart(ctx, dataDir, b.cfg.restartRuns, b.cfg.restartWorkers, b.cfg.restartSteps)
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	st, err := os.Stat(filepath.Join(dataDir, "snapcoord.db"))
	if err != nil {
		return err
	}
	b.logf("  prepared %d runs, %d workers, %d events (%.0f MiB) in %.1f s", b.cfg.restartRuns, b.cfg.restartRuns*b.cfg.restartWorkers,
		events, float64(st.Size())/(1<<20), time.Since(start).Seconds())
	if b.cfg.pprofDir != "" {
		if err := b.profileLoad(ctx, dataDir); err != nil {
			return err
		}
	}
	full, samples, err := b.timeStarts(ctx, dir)
	if err != nil {
		return err
	}
	workers := b.cfg.restartRuns * b.cfg.restartWorkers
	r := row{
		ID: "restart", Figure: fmt.Sprintf("restart to SERVING, %d runs, %d workers, %d events", b.cfg.restartRuns, workers, events),
		Value: full.Seconds(), Unit: "s", Floor: floor.Seconds(), FloorWhat: "empty data dir",
		Target: "≤ 2 s at 1000 runs, 100000 workers",
		Note: fmt.Sprintf("median of %d starts (%s); %.0f MiB data file, in the page cache", len(samples), strings.Join(samples, ", "),
			float64(st.Size())/(1<<20)),
	}
	if b.cfg.restartRuns >= 1000 && workers >= 100000 {
		r.Met = met(full <= 2*time.Second)
	}
	b.add(r)
	return nil
}

// timeStarts starts and stops snapcoord on dir's data directory
// --restart-repeat times and returns the median time to SERVING.
func (b *bench) timeStarts(ctx context.Context, dir string) (time.Duration, []string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, nil, err
	}
	var times []time.Duration
	var samples []string
	for range b.cfg.restartRepeat {
		p, err := coordproc.Start(ctx, coordproc.Config{
			Bin: b.cfg.snapcoord, DataDir: filepath.Join(dir, "data"), LogPath: filepath.Join(dir, "snapcoord.log"),
			Args: append([]string{"--metrics-listen", ""}, b.cfg.serveArgs...),
		})
		if err != nil {
			return 0, nil, err
		}
		times = append(times, p.Ready)
		samples = append(samples, fmt.Sprintf("%.3f", p.Ready.Seconds()))
		if err := p.Stop(30 * time.Second); err != nil {
			return 0, nil, err
		}
	}
	slices.Sort(times)
	return times[len(times)/2], samples, nil
}

// prepareRestart fills dataDir through the engine of an assembled
// coordinator that does not listen (an RPC per record would take longer
// than the measurement): runs runs at turn level, each with one trainer
// rank that completed steps steps and workers-1 environment workers. It
// returns the number of events stored.
func prepareRestart(ctx context.Context, dataDir string, runs, workers, steps int) (_ int, err error) {
	cfg := coordinator.Defaults()
	cfg.DataDir, cfg.LeaseTTL, cfg.MaxRuns, cfg.MaxWorkersPerRun = dataDir, time.Hour, runs, workers
	c, err := coordinator.New(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, c.Shutdown(context.Background())) }()
	eng := c.Engine()
	events := make([]int64, runs)
	err = forEach(ctx, runs, 128, func(ctx context.Context, r int) error {
		id := fmt.Sprintf("run-%05d", r)
		if _, err := eng.CreateRun(ctx, &v1.CreateRunRequest{RunId: id, Spec: runSpec(1, v1.TargetLevel_TARGET_LEVEL_TURN)}); err != nil {
			return err
		}
		var trainer string
		for w := range workers {
			req := &v1.RegisterWorkerRequest{RunId: id, Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-" + strconv.Itoa(w)}
			if w == 0 {
				req.Role, req.Name = v1.WorkerRole_WORKER_ROLE_TRAINER, "rank-0"
			}
			resp, err := eng.RegisterWorker(ctx, req)
			if err != nil {
				return err
			}
			if w == 0 {
				trainer = resp.WorkerId
			}
		}
		for s := range steps {
			if _, err := eng.CompleteStep(ctx, &v1.CompleteStepRequest{RunId: id, WorkerId: trainer, Step: int64(s + 1), IterationSeconds: 10}); err != nil {
				return err
			}
		}
		run, err := eng.GetRun(ctx, &v1.GetRunRequest{RunId: id})
		if err != nil {
			return err
		}
		events[r] = run.Run.LastEventSeq
		return nil
	})
	var total int64
	for _, n := range events {
		total += n
	}
	return int(total), err
}

// profileLoad profiles, in process, what a restart does before serving:
// assemble the coordinator, which opens the store and loads every run into
// a new engine.
func (b *bench) profileLoad(ctx context.Context, dataDir string) error {
	stop, err := b.selfProfile("restart")
	if err != nil {
		return err
	}
	start := time.Now()
	cfg := coordinator.Defaults()
	cfg.DataDir = dataDir
	c, err := coordinator.New(ctx, cfg)
	if err == nil {
		err = c.Shutdown(ctx)
	}
	took := time.Since(start)
	stop()
	b.logf("  in-process open + load: %.3f s", took.Seconds())
	return err
}

// selfProfile starts a CPU profile of this process into name.cpu.pprof
// under --pprof; stop ends it.
func (b *bench) selfProfile(name string) (stop func(), err error) {
	path := filepath.Join(b.cfg.pprofDir, name+".cpu.pprof")
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.logf("  profile %s: %v", path, err)
			return
		}
		b.logf("  profile: %s", path)
	}, nil
}
