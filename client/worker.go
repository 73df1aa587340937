package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// ErrRunEnded is Worker.Err when the run ended without the worker seeing a
// Stop (it was issued before the worker's first sequence number).
var ErrRunEnded = errors.New("client: the run ended")

// ErrSuperseded is Worker.Err when another process registered under the
// worker's name (a replacement started while this process still ran): the
// coordinator no longer serves this process, and it must stop rather than
// register again, or the two would take the name from each other in turn.
// The worker's reports, steps and FinishRun then fail with an error that
// wraps it, and change nothing.
var ErrSuperseded = errors.New("client: another process registered under this worker's name")

// WorkerConfig describes a worker process to the coordinator.
type WorkerConfig struct {
	// RunID is the run to join.
	RunID string
	// Role is WORKER_ROLE_TRAINER or WORKER_ROLE_ENVIRONMENT.
	Role v1.WorkerRole
	// Name is stable for the process ("rank-3", "host:slot"): registering
	// again under it is the same worker with a new incarnation.
	Name string
	// Rank is the trainer rank; 0 for environment workers.
	Rank int32
	// Poll long-polls for commands instead of streaming them. The worker
	// also switches to polling by itself when streaming fails.
	Poll bool
	// PollWait bounds one long poll; the server answers as soon as a
	// command is issued, and may cap the wait lower. The API counts it in
	// whole seconds, up to an hour: it is rounded up to at least 1 s (0 s
	// would be answered at once, and the worker would poll in a busy loop)
	// and capped at 1 h. Default 30 s.
	PollWait time.Duration
	// Replay delivers the commands issued before the worker registered too.
	// By default delivery starts where the coordinator says: at the end of
	// the command log at registration (older commands concern snapshots
	// that did not expect this worker), or, if a snapshot in flight still
	// waits for this worker's report (its previous process died in the
	// middle of it), at that snapshot's command.
	Replay bool
	// Logger receives reconnects, re-registrations and fallbacks. Default:
	// slog.Default().
	Logger *slog.Logger
}

func (c WorkerConfig) withDefaults() WorkerConfig {
	c.PollWait = pollWait(c.PollWait)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Logger = c.Logger.With("run_id", c.RunID, "worker", c.Name)
	return c
}

// maxPollWait is PollCommandsRequest.wait_seconds' upper bound: a longer
// wait is refused, and would stop the worker.
const maxPollWait = time.Hour

// pollWait is the wait that PollCommands can take: whole seconds, from 1 s
// to maxPollWait; 30 s if none was given.
func pollWait(d time.Duration) time.Duration {
	if d <= 0 {
		return 30 * time.Second
	}
	d = min(d, maxPollWait) // before rounding up, which could overflow
	return (d + time.Second - 1).Truncate(time.Second)
}

// Worker is a registered worker: it heartbeats in the background and
// delivers the commands for its role on Commands, streaming or polling,
// resuming after the last delivered sequence number across disconnects and
// coordinator restarts, and registering again when its lease lapsed or the
// coordinator dropped it. A coordinator that no longer knows its run (it
// lost its data) is one out of reach to it: see runLost.
type Worker struct {
	c    *Client
	cfg  WorkerConfig
	log  *slog.Logger
	cmds chan *v1.Command

	stop      context.CancelCauseFunc
	done      chan struct{} // closed once both background loops returned
	closeOnce sync.Once
	closeErr  error

	// regMu is held across a re-register, so that a stream refused for a
	// stale incarnation tells this process's own re-register (reopen) from
	// another process's (stop).
	regMu sync.Mutex

	mu       sync.Mutex
	reg      *v1.RegisterWorkerResponse
	lastAck  time.Time // the last registration or acknowledged heartbeat
	runState v1.RunState
	lastSeq  int64
	seen     *seenLog // the commands delivered, by seq, for a resync
	polling  bool
	err      error
	lost     error // why the coordinator no longer knows the run; nil while it does
}

// StartWorker registers a worker and starts its heartbeats and command
// delivery. ctx bounds the registration only; the worker runs until Close
// or until its commands end (after a Stop).
//
// Workers started from one Client share its connection. A process hosting
// many workers should start them from one Client: each connection costs the
// coordinator goroutines and buffers of its own, and a broadcast to many
// streams on few connections is several times faster than to one stream
// per connection.
func (c *Client) StartWorker(ctx context.Context, cfg WorkerConfig) (*Worker, error) {
	cfg = cfg.withDefaults()
	w := &Worker{c: c, cfg: cfg, log: cfg.Logger, cmds: make(chan *v1.Command), done: make(chan struct{}), polling: cfg.Poll,
		seen: newSeenLog()}
	if err := w.register(ctx, 0); err != nil {
		return nil, fmt.Errorf("client: register %q in run %q: %w", cfg.Name, cfg.RunID, err)
	}
	if !cfg.Replay {
		w.lastSeq = w.reg.GetResumeAfterSeq()
	}
	loopCtx, stop := context.WithCancelCause(context.WithoutCancel(ctx))
	w.stop = stop
	var wg sync.WaitGroup
	wg.Go(func() {
		w.receive(loopCtx)
		stop(nil) // a worker whose commands ended has nothing to stay alive for
	})
	wg.Go(func() { w.heartbeats(loopCtx) })
	go func() { wg.Wait(); close(w.done) }()
	return w, nil
}

// Commands delivers the commands for the worker's role in sequence order,
// each once per process. It is closed after a Stop, on Close, or when the
// worker cannot go on (see Err).
func (w *Worker) Commands() <-chan *v1.Command { return w.cmds }

// Err is why Commands was closed: nil after a Stop or Close, otherwise the
// error that retrying could not fix (ErrRunEnded, ErrSuperseded, a
// refusal such as PERMISSION_DENIED). A wrong run or token fails
// StartWorker; a coordinator that later no longer knows the run or its
// token does not end the worker.
func (w *Worker) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// ID is the coordinator's id for the worker.
func (w *Worker) ID() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reg.GetWorkerId()
}

// Incarnation counts the registrations under the worker's name.
func (w *Worker) Incarnation() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reg.GetIncarnation()
}

// RunState is the run's state as last heard (registration, heartbeat, poll).
func (w *Worker) RunState() v1.RunState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.runState
}

// LastSeq is the sequence number of the last command delivered, where
// delivery resumes after a disconnect.
func (w *Worker) LastSeq() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastSeq
}

// Polling reports whether commands are polled (asked for, or fallen back to).
func (w *Worker) Polling() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.polling
}

// ReportSnapshot reports how this environment worker's part of a snapshot
// ended. Safe to repeat: the coordinator keeps the first report. While the
// coordinator is unreachable (UNAVAILABLE: down, restarting, or no leader
// yet in a failover) the report is made again, with the client's backoff,
// until it is answered or ctx ends, however long that takes and whatever
// the policy's MaxAttempts: a report given up on leaves the snapshot
// incomplete though the worker saved, and a coordinator that comes back
// still counts a report within its restart grace. Bound the wait with ctx.
func (w *Worker) ReportSnapshot(ctx context.Context, snapshotID string, outcome v1.SnapshotOutcome, took time.Duration, message string) (v1.RunState, error) {
	var resp *v1.ReportSnapshotResponse
	report := func(inc int64) (err error) {
		resp, err = w.c.Workers.ReportSnapshot(ctx, &v1.ReportSnapshotRequest{
			RunId: w.cfg.RunID, WorkerId: w.ID(), SnapshotId: snapshotID,
			Outcome: outcome, DurationSeconds: took.Seconds(), Message: message, Incarnation: inc,
		}, noRetry)
		return err
	}
	for attempt := uint(1); ; attempt++ {
		err := w.fenced(ctx, report)
		if err == nil {
			return resp.GetRunState(), nil
		}
		if leaderMoved(err) {
			continue // the new leader serves: report there at once
		}
		if status.Code(err) != codes.Unavailable || !pause(ctx, w.c.conn, w.c.retry.backoff(attempt)) {
			return 0, fmt.Errorf("client: report snapshot %s: %w", snapshotID, err)
		}
	}
}

// Close stops the background work and deregisters the worker, so that no
// snapshot waits for it; a superseded worker is not deregistered (the name
// belongs to another process now). Later calls return the first call's
// result.
func (w *Worker) Close(ctx context.Context) error {
	w.closeOnce.Do(func() {
		w.stop(nil)
		select {
		case <-w.done:
		case <-ctx.Done():
		}
		if errors.Is(w.Err(), ErrSuperseded) {
			return
		}
		_, err := w.c.Workers.DeregisterWorker(ctx, &v1.DeregisterWorkerRequest{RunId: w.cfg.RunID, WorkerId: w.ID(),
			Incarnation: w.Incarnation()})
		if err != nil && !superseded(err) { // superseded meanwhile: nothing of ours to deregister
			w.closeErr = fmt.Errorf("client: deregister %s: %w", w.ID(), err)
		}
	})
	return w.closeErr
}

// register registers the worker. incarnation is the one it holds, 0 for a
// process starting: see RegisterWorkerRequest.incarnation.
func (w *Worker) register(ctx context.Context, incarnation int64, opts ...grpc.CallOption) error {
	resp, err := w.c.Workers.RegisterWorker(ctx, &v1.RegisterWorkerRequest{
		RunId: w.cfg.RunID, Role: w.cfg.Role, Name: w.cfg.Name, Rank: w.cfg.Rank, Incarnation: incarnation,
	}, opts...)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.reg, w.lastAck, w.runState = resp, time.Now(), resp.GetRunState()
	w.mu.Unlock()
	w.runKnown()
	return nil
}

// reregister registers again under the incarnation the worker holds. If
// another process took the name meanwhile, the worker stops with
// ErrSuperseded.
func (w *Worker) reregister(ctx context.Context, why string) error {
	w.regMu.Lock()
	defer w.regMu.Unlock()
	return w.reregisterLocked(ctx, why)
}

func (w *Worker) reregisterLocked(ctx context.Context, why string) error {
	w.log.Log(ctx, w.quietWhileLost(slog.LevelInfo), "registering again", "why", why)
	if err := w.register(ctx, w.Incarnation(), noRetry); err != nil {
		if superseded(err) {
			w.log.Error("another process registered under this worker's name: stopping", "err", err)
			w.stop(fmt.Errorf("%w: %w", ErrSuperseded, err))
			return err
		}
		if c := status.Code(err); c == codes.NotFound || c == codes.Unauthenticated {
			w.runLost(err) // it registered this worker before: it lost the run
			return err
		}
		w.log.Log(ctx, w.quietWhileLost(slog.LevelWarn), "registering again failed", "err", err)
		return err
	}
	w.log.Info("registered again", "worker_id", w.ID(), "incarnation", w.Incarnation())
	return nil
}

// runLost notes that the coordinator no longer knows the run, or its
// token: its data directory was lost, or restored from a copy older than
// the run. It registered this worker, so the run and the token were right
// (a wrong one fails StartWorker): the worker goes on as while the
// coordinator is out of reach, following and heartbeating at its backoff,
// so that what saves without the coordinator still can (a sidecar's
// backstop, a trainer's fail-safe plan), and so that it resumes if the
// coordinator knows the run again (its data restored). One WARNING, not
// one per retry.
func (w *Worker) runLost(err error) {
	w.mu.Lock()
	first := w.lost == nil
	w.lost = err
	w.mu.Unlock()
	if first {
		w.log.Log(context.Background(), w.lostLevel(), "the coordinator no longer knows this run or its token "+
			"(its data lost or restored from an older copy, or the token reissued for a new allocation): going on as while it is out of reach, until it knows the run again", "err", err)
	}
}

// runKnown notes an answer for the run: after runLost, one line says the
// coordinator knows it again.
func (w *Worker) runKnown() {
	w.mu.Lock()
	was := w.lost
	w.lost = nil
	w.mu.Unlock()
	if was != nil {
		w.log.Log(context.Background(), w.lostLevel(), "the coordinator knows this run again")
	}
}

// lostLevel is WARNING, but INFO for a trainer rank: its fail-safe plan
// warns about the same coordinator (see Trainer.goLocal).
func (w *Worker) lostLevel() slog.Level {
	if w.cfg.Role == v1.WorkerRole_WORKER_ROLE_TRAINER {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

// quietWhileLost is level, or DEBUG while the coordinator does not know
// the run: the attempts to register again then fail each time (refused, or
// unanswered while it restarts), and runLost said so once.
func (w *Worker) quietWhileLost(level slog.Level) slog.Level {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lost != nil {
		return slog.LevelDebug
	}
	return level
}

// refused handles a call refused for the stale incarnation sent: this
// process registered again since (repeat the call under the new one), or
// another process did. A re-register settles which: the coordinator answers
// a repeat of this process's own (whose answer was lost) with its
// registration, and stops a superseded process.
func (w *Worker) refused(ctx context.Context, sent int64, err error) error {
	w.regMu.Lock()
	defer w.regMu.Unlock()
	if w.Incarnation() != sent {
		return nil
	}
	return w.reregisterLocked(ctx, "call refused: "+status.Convert(err).Message())
}

// fenced makes a call that carries the worker's incarnation, so that a
// process another one has replaced changes nothing. Refused as superseded,
// it is made once more if this process holds a newer incarnation by then
// (it registered again meanwhile); if another process does, the worker
// stops and the error wraps ErrSuperseded.
func (w *Worker) fenced(ctx context.Context, call func(incarnation int64) error) error {
	sent := w.Incarnation()
	err := call(sent)
	if !superseded(err) {
		return err
	}
	if rerr := w.refused(ctx, sent, err); superseded(rerr) {
		return fmt.Errorf("%w: %w", ErrSuperseded, err)
	}
	if inc := w.Incarnation(); inc != sent {
		return call(inc)
	}
	return err
}

// superseded reports whether the coordinator refused a call because another
// process registered under the worker's name.
func superseded(err error) bool {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain && info.GetReason() == reasonSuperseded {
			return true
		}
	}
	return false
}

// The coordinator's ErrorInfo for a superseded worker.
const (
	errorDomain      = "snapcoord.v1"
	reasonSuperseded = "WORKER_SUPERSEDED"
)

// heartbeats renews the lease every heartbeat_interval until ctx ends.
func (w *Worker) heartbeats(ctx context.Context) {
	for sleep(ctx, w.interval()) {
		w.beat(ctx)
	}
}

// beat sends one heartbeat, or registers again when the lease must be
// presumed lost: nothing acknowledged for longer than lease_ttl (a network
// partition), or the coordinator refused the heartbeat (the worker was
// deregistered, or the coordinator does not know it).
func (w *Worker) beat(ctx context.Context) {
	w.mu.Lock()
	silent, ttl := time.Since(w.lastAck), durationOf(w.reg.GetLeaseTtl())
	w.mu.Unlock()
	if ttl > 0 && silent > ttl {
		_ = w.reregister(ctx, fmt.Sprintf("no heartbeat acknowledged for %s (lease %s)", silent.Round(time.Millisecond), ttl))
		return
	}
	callCtx, cancel := context.WithTimeout(ctx, w.interval())
	defer cancel()
	resp, err := w.c.Workers.Heartbeat(callCtx, &v1.HeartbeatRequest{RunId: w.cfg.RunID, WorkerId: w.ID(),
		Incarnation: w.Incarnation()}, noRetry)
	switch status.Code(err) {
	case codes.OK:
		w.mu.Lock()
		w.lastAck, w.runState = time.Now(), resp.GetRunState()
		w.mu.Unlock()
		w.runKnown()
	case codes.FailedPrecondition, codes.NotFound:
		_ = w.reregister(ctx, "heartbeat refused: "+status.Convert(err).Message())
	default:
		if ctx.Err() == nil {
			w.log.Debug("heartbeat failed", "err", err)
		}
	}
}

func (w *Worker) interval() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if d := durationOf(w.reg.GetHeartbeatInterval()); d > 0 {
		return d
	}
	return 5 * time.Second
}

func durationOf(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.AsDuration()
}

// sleep waits d or until ctx ends; it reports whether the wait ran out.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
