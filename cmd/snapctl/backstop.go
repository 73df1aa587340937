package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// The backstop: Slurm's --signal (USR1 by default) reaches the sidecar a
// few minutes before the job is killed. With a live coordinator it changes
// nothing: the batch shell's trap fires the deadline, whose SaveAtDeadline
// reaches the sidecar as usual. With the coordinator gone, nothing else
// would save the environment's unfinished rollouts, so the sidecar runs the
// snapshot hook on its own (docs/sidecar.md, "The backstop signal").

// backstopSignals are the signals --backstop-signal accepts: those a job
// can be sent that mean nothing else to the sidecar (INT and TERM make it
// leave).
var backstopSignals = map[string]syscall.Signal{
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "HUP": syscall.SIGHUP, "ALRM": syscall.SIGALRM,
}

// backstopSignal is --backstop-signal's value; nil: no backstop.
type backstopSignal struct{ sig os.Signal }

func (b *backstopSignal) String() string {
	if b == nil || b.sig == nil {
		return "none"
	}
	for name, s := range backstopSignals {
		if s == b.sig {
			return name
		}
	}
	return b.sig.String()
}

func (b *backstopSignal) Set(v string) error {
	name := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(v)), "SIG")
	if name == "NONE" || name == "" {
		b.sig = nil
		return nil
	}
	s, ok := backstopSignals[name]
	if !ok {
		return fmt.Errorf("%q is not USR1, USR2, HUP, ALRM or none", v)
	}
	b.sig = s
	return nil
}

// Bounds of the backstop's look at the coordinator.
const (
	// backstopProbeTimeout bounds the call that decides whether the
	// coordinator is gone: long enough for a live one to answer a
	// heartbeat, short next to the minutes a --signal notice gives.
	backstopProbeTimeout = 2 * time.Second
	// backstopRecheckEvery: after a local snapshot, how often the sidecar
	// asks whether the coordinator is back, to say so.
	backstopRecheckEvery = time.Second
)

// backstopID names a local backstop snapshot: it sorts by time and is a
// valid file name, for hooks that save under SNAPCOORD_SNAPSHOT_ID.
func backstopID(now time.Time) string {
	return "backstop-" + now.UTC().Format("20060102T150405Z")
}

// notifyBackstop starts receiving sig before any worker registers, so that
// a signal sent once the sidecar says it registered is not lost (Go ignores
// an unwatched SIGUSR1). The channel holds one pending signal.
func notifyBackstop(sig os.Signal) (<-chan os.Signal, func()) {
	if sig == nil {
		return nil, func() {}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sig)
	return ch, func() { signal.Stop(ch) }
}

// watchBackstop acts on each signal on sigs until ctx ends: it asks the
// coordinator, and if it cannot be reached, has every worker take a local
// deadline snapshot, then says when the coordinator answers again.
func watchBackstop(ctx context.Context, name string, sigs <-chan os.Signal, cl *client.Client, runID string, workers []*sidecar, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
			err := probe(ctx, cl, runID, workers[0].w)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				log.Info("backstop signal: the coordinator answers, the deadline snapshot comes from it", "signal", name)
				continue
			}
			id := backstopID(time.Now())
			log.Warn("backstop signal: the coordinator cannot be reached, or lost this run; taking a local deadline snapshot",
				"signal", name, "snapshot_id", id, "err", describe(err))
			for _, s := range workers {
				select {
				case s.backstop <- id:
				default: // one is pending already
				}
			}
			awaitCoordinator(ctx, cl, runID, workers[0].w, id, log)
		}
	}
}

// probe sends one heartbeat for w, bounded by backstopProbeTimeout. An
// answer, a refusal included, shows a coordinator that can deliver the
// deadline; no answer is an error, and so is UNAUTHENTICATED or NOT_FOUND:
// it registered this worker, so it lost the run or the worker with its
// data, and may send no deadline (if it does, its hook runs too).
func probe(ctx context.Context, cl *client.Client, runID string, w *client.Worker) error {
	pctx, cancel := context.WithTimeout(ctx, backstopProbeTimeout)
	defer cancel()
	_, err := cl.Workers.Heartbeat(pctx, &v1.HeartbeatRequest{RunId: runID, WorkerId: w.ID(), Incarnation: w.Incarnation()})
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unauthenticated, codes.NotFound:
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// awaitCoordinator probes until the coordinator answers (or ctx ends), and
// then says what became of the local snapshot: it has no record of it, and
// a SaveAtDeadline it still sends runs the hook again.
func awaitCoordinator(ctx context.Context, cl *client.Client, runID string, w *client.Worker, id string, log *slog.Logger) {
	tick := time.NewTicker(backstopRecheckEvery)
	defer tick.Stop()
	for probe(ctx, cl, runID, w) != nil {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	log.Info("the coordinator answers again; the backstop snapshot was taken locally and is not reported "+
		"(the coordinator has no snapshot for it; a deadline snapshot it sends still runs the hook)", "snapshot_id", id)
}

// backstopTaken is a local backstop snapshot of this worker, named in the
// report of a deadline snapshot it could not take later.
type backstopTaken struct {
	id      string
	outcome v1.SnapshotOutcome
	at      time.Time
}

// errBackstop is the cause a regular hook is killed with by the backstop:
// its snapshot will not complete (the coordinator is gone), and the
// deadline snapshot must not wait behind it.
var errBackstop = &killed{v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED,
	"hook killed: superseded by the local backstop snapshot (the coordinator was unreachable)"}

// takeBackstop starts the hook of local snapshot id, unless this process
// has run a deadline snapshot's hook already (the coordinator's, or an
// earlier backstop): then the state is saved for the deadline. It kills a
// regular hook still running, as a SaveAtDeadline does.
func (s *sidecar) takeBackstop(ctx context.Context, running *hookRun, id string) *hookRun {
	if s.deadlineID != "" {
		s.log.Info("backstop signal: this worker's deadline snapshot was taken already", "snapshot_id", s.deadlineID)
		return running
	}
	running.kill(errBackstop)
	if ctx.Err() != nil {
		return running
	}
	now := time.Now()
	o := snapshotOrder{id: id, reason: "deadline", anchorStep: s.lastAnchor, forced: true, backstop: true}
	if s.cfg.hookTimeout > 0 {
		o.mustFinishBy = now.Add(s.cfg.hookTimeout)
	}
	s.deadlineID = id
	return s.start(ctx, o)
}

// keepBackstop records the outcome of a local snapshot instead of reporting
// it: the coordinator issued no such snapshot and would refuse the report.
func (s *sidecar) keepBackstop(o snapshotOrder, res hookResult) {
	s.backstopDone.Store(&backstopTaken{id: o.id, outcome: res.outcome, at: time.Now()})
	s.log.Warn("backstop snapshot taken locally: the coordinator knows nothing of it", "snapshot_id", o.id,
		"outcome", apifacts.EnumName(res.outcome))
}

// withBackstopNote adds to the report of a deadline snapshot this worker
// could not save (its SaveAtDeadline arrived late, say, after an outage)
// where the local backstop saved the state instead.
func (s *sidecar) withBackstopNote(o snapshotOrder, res hookResult) hookResult {
	b := s.backstopDone.Load()
	if b == nil || o.backstop || o.reason != "deadline" || res.outcome == v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		return res
	}
	res.message += fmt.Sprintf("; this worker's state was saved by the local backstop snapshot %s at %s (%s)",
		b.id, b.at.UTC().Format(timeMillis), apifacts.EnumName(b.outcome))
	return res
}
