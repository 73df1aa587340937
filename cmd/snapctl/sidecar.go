package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/cmd/internal/durations"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// sidecarConfig is `snapctl sidecar`'s flags.
type sidecarConfig struct {
	runID, runToken, runTokenFile string
	name                          string
	workers                       int
	onSnapshot, onStop            string
	poll                          bool
	pollInterval, hookTimeout     time.Duration
	logLevel                      slog.Level
	backstop                      backstopSignal
}

func setupSidecar(fs *flag.FlagSet, c *cli) func(context.Context, []string) error {
	var s sidecarConfig
	host, _ := os.Hostname()
	fs.StringVar(&s.runID, "run", "", "the run's `id` (required)")
	fs.StringVar(&s.runToken, "run-token", "", "the run's `token`, from run create")
	fs.StringVar(&s.runTokenFile, "run-token-file", "", "read the run token from `file`")
	fs.StringVar(&s.name, "name", host, "stable worker `name`; give each sidecar on a host its own")
	fs.IntVar(&s.workers, "workers", 1, "environment workers this sidecar runs over one connection, `N` of them: NAME-0 … NAME-(N-1), each with its own hooks")
	fs.StringVar(&s.onSnapshot, "on-snapshot", "", "`command` (/bin/sh -c) that saves the environment state (required)")
	fs.StringVar(&s.onStop, "on-stop", "", "`command` (/bin/sh -c) to run when the run stops")
	fs.BoolVar(&s.poll, "poll", false, "long-poll for commands instead of streaming them")
	durations.Var(fs, &s.pollInterval, "poll-interval", 30*time.Second, durations.Options{}, "with --poll, the longest wait of one poll, rounded up to whole seconds, at most 1h (a command ends it at once)")
	durations.Var(fs, &s.hookTimeout, "hook-timeout", 10*time.Minute, durations.Options{}, "kill a Snapshot hook after this long (SaveAtDeadline: at must_finish_by)")
	fs.TextVar(&s.logLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn or error")
	s.backstop.sig = syscall.SIGUSR1
	fs.Var(&s.backstop, "backstop-signal", "on this `signal` (USR1, USR2, HUP, ALRM or none), if the coordinator cannot be reached or lost the run, run --on-snapshot for a local deadline snapshot (Slurm's --signal)")
	return func(ctx context.Context, args []string) error {
		if err := wantArgs(args); err != nil {
			return err
		}
		switch {
		case s.runID == "":
			return usageErr(errors.New("--run (or SNAPCOORD_RUN_ID) is required"))
		case s.onSnapshot == "":
			return usageErr(errors.New("--on-snapshot is required"))
		case s.workers < 1 || s.workers > maxSidecarWorkers:
			return usageErr(fmt.Errorf("--workers must be between 1 and %d", maxSidecarWorkers))
		}
		tok, err := c.runToken(s)
		if err != nil {
			return err
		}
		s.runToken = tok
		return c.sidecar(ctx, s)
	}
}

// runToken is --run-token's, or the one in --run-token-file: eval "$(snapctl
// run create ...)" exports SNAPCOORD_RUN_TOKEN, which --run-token-file
// overrides.
func (c *cli) runToken(s sidecarConfig) (string, error) {
	return c.pickToken("run-token", s.runToken, "run-token-file", s.runTokenFile)
}

// maxSidecarWorkers bounds --workers: a node's environment workers, not a
// cluster's.
const maxSidecarWorkers = 1024

// sidecar is one environment worker of a running `snapctl sidecar`.
type sidecar struct {
	c     *cli
	cfg   sidecarConfig
	name  string
	index int
	w     *client.Worker
	rep   *reporter // reports w's snapshots
	log   *slog.Logger

	backstop     chan string // a local backstop snapshot's id, from watchBackstop
	backstopDone atomic.Pointer[backstopTaken]
	// Kept by serve: the deadline snapshot whose hook this process ran
	// (the coordinator's or a backstop), and the anchor step of the last
	// snapshot command, the best a backstop knows of the trainer's step.
	deadlineID string
	lastAnchor int64
}

// sidecar registers --workers environment workers over one connection,
// follows their commands, and deregisters each when it returns (after a
// Stop, on SIGTERM, or on an error).
func (c *cli) sidecar(ctx context.Context, cfg sidecarConfig) error {
	sigs, stopSigs := notifyBackstop(cfg.backstop.sig)
	defer stopSigs()
	cl, err := c.dial(cfg.runToken)
	if err != nil {
		return err
	}
	defer cl.Close()
	log := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	// Beside the registrations, which wait for the same connection.
	warned := make(chan struct{})
	go func() {
		defer close(warned)
		c.warnIfUnanswered(ctx, cl.Conn(), log)
	}()
	defer func() { <-warned }()
	workers := make([]*sidecar, 0, cfg.workers)
	for i := range cfg.workers {
		s, err := c.startSidecarWorker(ctx, cl, cfg, i, log)
		if err != nil {
			for _, s := range workers {
				s.leave(ctx)
			}
			return err
		}
		workers = append(workers, s)
	}
	errs := make([]error, len(workers))
	var wg sync.WaitGroup
	for i, s := range workers {
		wg.Go(func() {
			errs[i] = s.serve(ctx)
			s.leave(ctx)
		})
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		watchBackstop(watchCtx, cfg.backstop.String(), sigs, cl, cfg.runID, workers, log)
	}()
	wg.Wait()
	stopWatch()
	<-watched
	return errors.Join(errs...)
}

// startSidecarWorker registers the index-th worker: named --name alone, or
// NAME-index when the sidecar runs several.
func (c *cli) startSidecarWorker(ctx context.Context, cl *client.Client, cfg sidecarConfig, index int, log *slog.Logger) (*sidecar, error) {
	name := cfg.name
	if cfg.workers > 1 {
		name = fmt.Sprintf("%s-%d", cfg.name, index)
	}
	log = log.With("worker", name)
	regCtx, cancel := c.call(ctx)
	defer cancel()
	w, err := cl.StartWorker(regCtx, client.WorkerConfig{
		RunID: cfg.runID, Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: name,
		Poll: cfg.poll, PollWait: cfg.pollInterval, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	log.Info("registered", "run_id", cfg.runID, "worker_id", w.ID(), "incarnation", w.Incarnation())
	return &sidecar{c: c, cfg: cfg, name: name, index: index, w: w, rep: newReporter(w, log), log: log,
		backstop: make(chan string, 1)}, nil
}

// leave deregisters the worker, even while the sidecar is being stopped.
func (s *sidecar) leave(ctx context.Context) {
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.w.Close(closeCtx); err != nil {
		s.log.Warn("deregistering failed", "err", err)
	} else {
		s.log.Info("deregistered")
	}
}

// serve follows the worker's commands until a Stop, until ctx ends, or
// until the commands end. A snapshot hook runs in the background, so that
// commands are still read while it runs: a SaveAtDeadline must not wait
// behind a regular snapshot's hook (killed only at --hook-timeout) and
// miss B.
func (s *sidecar) serve(ctx context.Context) error {
	var running *hookRun // the last snapshot hook started; nil: none yet
	for {
		select {
		case <-ctx.Done():
			return s.leaveOnSignal(running)
		case id := <-s.backstop:
			running = s.takeBackstop(ctx, running, id)
		case cmd, ok := <-s.w.Commands():
			switch {
			case !ok:
				running.wait()
				return s.w.Err()
			case ctx.Err() != nil:
				// select may pick a queued command over ctx.Done: no new
				// hook once the sidecar is being stopped.
				return s.leaveOnSignal(running)
			case cmd.GetStop() != nil:
				// The run is terminal: the coordinator would refuse a report.
				running.kill(errRunStopped)
				return s.stop(ctx, cmd.GetStop().GetReason())
			}
			running = s.next(ctx, running, cmd)
		}
	}
}

// leaveOnSignal waits for the running hook, which ctx killed, to be reported.
func (s *sidecar) leaveOnSignal(running *hookRun) error {
	s.log.Info("signal received: leaving the run")
	running.wait()
	return nil
}

// next starts the hook of a snapshot command at once, killing the one still
// running, if any: serve waits for no hook but when it leaves, so that a
// SaveAtDeadline or a Stop is never read late. Issuing a SaveAtDeadline
// completed the coordinator's snapshot in flight as superseded. The
// coordinator issues no regular snapshot while another is in flight, so a
// hook still running at a Snapshot belongs to one it completed without
// this worker (timed out): it is killed as overtaken. A command for the
// snapshot whose hook runs is a repeat delivery: that hook goes on.
func (s *sidecar) next(ctx context.Context, running *hookRun, cmd *v1.Command) *hookRun {
	o, ok := orderOf(cmd, time.Now(), s.cfg.hookTimeout)
	switch {
	case !ok:
		return running // PublishCheckpoint is for trainers
	case running.runs(o.id):
		s.log.Info("snapshot delivered again: its hook already runs", "snapshot_id", o.id)
		return running
	case cmd.GetSaveAtDeadline() != nil:
		running.kill(errSuperseded)
	default:
		running.kill(errOvertaken)
	}
	if ctx.Err() != nil {
		return running // ended during the kill: serve leaves
	}
	// After the kill: --hook-timeout counts from the hook's start.
	o, _ = orderOf(cmd, time.Now(), s.cfg.hookTimeout)
	s.lastAnchor = o.anchorStep
	if cmd.GetSaveAtDeadline() != nil {
		s.deadlineID = o.id
	}
	return s.start(ctx, o)
}

// hookRun is a snapshot hook running in the background.
type hookRun struct {
	id     string // the snapshot's
	cancel context.CancelCauseFunc
	done   chan struct{} // closed once the hook ended and was reported
}

// start runs the snapshot hook for o in the background, under a context of
// its own so that serve can kill it with a cause (see killed).
func (s *sidecar) start(ctx context.Context, o snapshotOrder) *hookRun {
	hctx, cancel := context.WithCancelCause(ctx)
	r := &hookRun{id: o.id, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		defer cancel(nil)
		s.snapshot(hctx, o)
	}()
	return r
}

// wait waits until the hook, if any, has ended and been reported.
func (r *hookRun) wait() {
	if r != nil {
		<-r.done
	}
}

// runs says whether the hook of snapshot id has not yet ended and been
// reported.
func (r *hookRun) runs(id string) bool {
	if r == nil || r.id != id {
		return false
	}
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// kill kills the hook, if it still runs, for cause, and waits for it: for
// its end, and for its report, which then takes at most killedReportTimeout
// (see reporter.attempt).
func (r *hookRun) kill(cause error) {
	if r != nil {
		r.cancel(cause)
		<-r.done
	}
}

// hookEnv is what every hook of this worker is told about it.
func (s *sidecar) hookEnv() []string {
	return []string{"SNAPCOORD_RUN_ID=" + s.cfg.runID, "SNAPCOORD_WORKER_NAME=" + s.name,
		"SNAPCOORD_WORKER_INDEX=" + strconv.Itoa(s.index)}
}

// snapshotOrder is a Snapshot or SaveAtDeadline command.
type snapshotOrder struct {
	id, reason   string
	anchorStep   int64
	forced       bool
	backstop     bool      // a local deadline snapshot: the coordinator was unreachable
	mustFinishBy time.Time // the hook is killed then; zero: never
}

func orderOf(cmd *v1.Command, now time.Time, hookTimeout time.Duration) (snapshotOrder, bool) {
	if sd := cmd.GetSaveAtDeadline(); sd != nil {
		o := snapshotOrder{id: sd.GetSnapshotId(), reason: "deadline", anchorStep: sd.GetAnchorStep(), forced: true}
		if sd.GetMustFinishBy() != nil {
			o.mustFinishBy = sd.GetMustFinishBy().AsTime()
		}
		return o, true
	}
	if sn := cmd.GetSnapshot(); sn != nil {
		o := snapshotOrder{id: sn.GetSnapshotId(), reason: apifacts.EnumLower(sn.GetReason()),
			anchorStep: sn.GetAnchorStep(), forced: sn.GetForced()}
		if hookTimeout > 0 {
			o.mustFinishBy = now.Add(hookTimeout)
		}
		return o, true
	}
	return snapshotOrder{}, false // PublishCheckpoint is for trainers
}

// snapshot runs the hook and reports its outcome and duration, unless a
// Stop killed it. The report is retried while the coordinator is
// unreachable (see reporter); one refused (the run ended meanwhile) is
// logged: the next command decides.
func (s *sidecar) snapshot(ctx context.Context, o snapshotOrder) {
	s.log.Info("snapshot", "snapshot_id", o.id, "reason", o.reason, "anchor_step", o.anchorStep, "forced", o.forced)
	res := hook{cmdline: s.cfg.onSnapshot, env: append(s.hookEnv(), snapshotEnv(o)...), killAt: o.mustFinishBy,
		stdout: s.c.stdout, stderr: s.c.stderr}.run(ctx)
	outcome := apifacts.EnumName(res.outcome)
	s.log.Info("snapshot done", "snapshot_id", o.id, "outcome", outcome, "took", res.took.Round(time.Millisecond), "message", res.message)
	switch {
	case errors.Is(context.Cause(ctx), errRunStopped):
		return // the run is terminal: the coordinator would refuse the report
	case o.backstop:
		s.keepBackstop(o, res)
		return
	}
	s.rep.report(ctx, o.id, s.withBackstopNote(o, res))
}

// stop runs --on-stop; the sidecar then exits 0, or 10 if the hook failed.
func (s *sidecar) stop(ctx context.Context, reason string) error {
	s.log.Info("stop", "reason", reason)
	if s.cfg.onStop == "" {
		return nil
	}
	// No control characters in the environment: a NUL there would keep the
	// hook from starting. (Coordinators store reasons without them, but
	// one's data may predate that.)
	reason = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, reason)
	res := hook{cmdline: s.cfg.onStop, env: append(s.hookEnv(), "SNAPCOORD_STOP_REASON="+reason),
		stdout: s.c.stdout, stderr: s.c.stderr}.run(ctx)
	if res.outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		return withExit(exitStopHook, fmt.Errorf("--on-stop: %s", res.message))
	}
	return nil
}
