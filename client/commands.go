package client

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// errNoStop: a poll found the run terminal and no command after the last
// delivered one. The coordinator answers a terminal state only once the
// run's Stop is durable, so the Stop lies before this worker's resume point
// (it registered after the run ended, or replay was off): the run is over.
var errNoStop = errors.New("the run is over but no Stop was delivered")

// receive runs follow and closes Commands when it returns.
func (w *Worker) receive(ctx context.Context) {
	err := w.follow(ctx)
	if cause := context.Cause(ctx); err == nil && errors.Is(cause, ErrSuperseded) {
		err = cause
	}
	w.mu.Lock()
	w.err = err
	w.mu.Unlock()
	close(w.cmds)
}

// follow delivers commands until a Stop, until ctx ends (nil), or until an
// error that retrying cannot fix. Failed fetches are retried with the
// client's backoff, capped at followMaxWait; a fetch that delivered
// something resets it.
func (w *Worker) follow(ctx context.Context) error {
	var failures uint
	for {
		inc := w.Incarnation()
		stopped, progressed, err := w.fetch(ctx, inc)
		switch {
		case stopped, ctx.Err() != nil:
			return nil
		case progressed:
			failures = 0
		}
		if err == nil {
			continue
		}
		if err := w.recover(ctx, err, inc); err != nil {
			return err
		}
		if leaderMoved(err) {
			continue // the new leader serves: resume there at once
		}
		failures++
		if !pause(ctx, w.c.conn, w.c.retry.followWait(failures)) {
			return nil
		}
	}
}

// fetch streams or polls the commands as incarnation inc.
func (w *Worker) fetch(ctx context.Context, inc int64) (stopped, progressed bool, err error) {
	if w.Polling() {
		return w.poll(ctx, inc)
	}
	return w.stream(ctx, inc)
}

// recover says what a failed fetch as incarnation inc means: nil to try
// again after a backoff, or the error that ends the worker.
func (w *Worker) recover(ctx context.Context, err error, inc int64) error {
	if errors.Is(err, errNoStop) {
		return ErrRunEnded
	}
	code := status.Code(err)
	switch code {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted:
		return nil // the coordinator restarts, drains or is busy: resume
	case codes.FailedPrecondition:
		if superseded(err) {
			// Another process took the name (then the worker stops, and
			// ctx ends), or this one registered again: the next stream
			// opens for the current incarnation.
			_ = w.refused(ctx, inc, err)
		}
		return nil
	case codes.NotFound:
		// The coordinator does not know the worker (its state was reset).
		// If it lost the run too, registering notes that (see runLost).
		_ = w.reregister(ctx, "the coordinator does not know this worker")
		return nil
	case codes.Unauthenticated:
		// It registered this worker with the same token: it lost the run.
		w.runLost(err)
		return nil
	case codes.OutOfRange:
		w.resync(ctx, err)
		return nil
	case codes.PermissionDenied, codes.InvalidArgument:
		return err
	}
	// Unimplemented, Internal, Unknown: typically a proxy in the way that
	// does not pass server streams. Long polls are plain unary calls, and as
	// prompt: the coordinator answers one as soon as a command is issued.
	if w.Polling() {
		if code == codes.Unimplemented {
			return err
		}
		return nil
	}
	w.log.Warn("command stream failed; falling back to polling", "err", err)
	w.mu.Lock()
	w.polling = true
	w.mu.Unlock()
	return nil
}

func (w *Worker) stream(ctx context.Context, inc int64) (stopped, progressed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := w.c.Workers.StreamCommands(ctx, &v1.StreamCommandsRequest{RunId: w.cfg.RunID, WorkerId: w.ID(),
		AfterSeq: w.LastSeq(), Incarnation: inc})
	if err != nil {
		return false, false, err
	}
	for {
		resp, err := s.Recv()
		if errors.Is(err, io.EOF) {
			// The coordinator ends a stream without a Stop only when the run
			// is over and the Stop lies before our resume point. One poll
			// (answered at once for a finished run) tells that apart from
			// anything unexpected, which it then simply continues.
			stopped, polled, err := w.poll(ctx, inc)
			return stopped, progressed || polled, err
		}
		if err != nil {
			return false, progressed, err
		}
		w.runKnown()
		progressed = true
		if stopped, err := w.deliver(ctx, resp.GetCommand()); stopped || err != nil {
			return stopped, progressed, err
		}
	}
}

func (w *Worker) poll(ctx context.Context, inc int64) (stopped, progressed bool, err error) {
	// PollWait is whole seconds, 1 to 3600 (see pollWait): exact, and valid.
	resp, err := w.c.Workers.PollCommands(ctx, &v1.PollCommandsRequest{
		RunId: w.cfg.RunID, WorkerId: w.ID(), AfterSeq: w.LastSeq(), WaitSeconds: int32(w.cfg.PollWait.Seconds()),
		Incarnation: inc,
	}, noRetry)
	if err != nil {
		return false, false, err
	}
	w.runKnown()
	w.mu.Lock()
	w.runState = resp.GetRunState()
	w.mu.Unlock()
	for _, cmd := range resp.GetCommands() {
		if stopped, err := w.deliver(ctx, cmd); stopped || err != nil {
			return stopped, true, err
		}
	}
	if len(resp.GetCommands()) == 0 && apifacts.Terminal(resp.GetRunState()) {
		return false, false, errNoStop // polls of a terminal run return at once: must not spin
	}
	return false, true, nil
}

// resync moves the resume point back after the coordinator said it lies
// past the end of the command log (OUT_OF_RANGE): its state was restored
// from a backup or replaced, and waiting for the log to catch up would
// skip every command issued meanwhile. The worker then reads the log again
// from where a new process would start: with Replay from 0, otherwise from
// the resume point of a new registration (the end of the log, or the
// command still waiting for this worker: a SaveAtDeadline issued since the
// restore). The commands it delivered before are not delivered again (see
// seenLog). If registering fails, the next fetch meets OUT_OF_RANGE again
// and resync tries again.
func (w *Worker) resync(ctx context.Context, cause error) {
	w.log.Warn("the coordinator's command log ends before this worker's resume point (its state was restored or replaced): reading it again",
		"last_seq", w.LastSeq(), "err", status.Convert(cause).Message())
	from := int64(0)
	if !w.cfg.Replay {
		if err := w.reregister(ctx, "command log behind the resume point"); err != nil {
			return
		}
		w.mu.Lock()
		from = w.reg.GetResumeAfterSeq()
		w.mu.Unlock()
	}
	w.mu.Lock()
	w.lastSeq = from
	w.mu.Unlock()
}

// deliver hands one command to the consumer, unless it was delivered
// before a resync, and advances the resume point.
func (w *Worker) deliver(ctx context.Context, cmd *v1.Command) (stopped bool, err error) {
	if cmd.GetSeq() <= w.LastSeq() {
		return false, nil // already delivered before a reconnect
	}
	if !w.seen.has(cmd.GetSeq(), cmd) {
		select {
		case w.cmds <- cmd:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		w.seen.add(cmd.GetSeq(), cmd)
	}
	w.mu.Lock()
	w.lastSeq = cmd.GetSeq()
	w.mu.Unlock()
	return cmd.GetStop() != nil, nil
}
