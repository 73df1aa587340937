package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// callbackError carries fn's error out of WatchEvents untouched.
type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }
func (e callbackError) Unwrap() error { return e.err }

// WatchEvents calls fn for each event of the run with seq > afterSeq, in
// order. Without follow it returns once the events recorded so far were
// delivered; with follow it goes on until the run is terminal and all its
// events were delivered. A disconnect or a coordinator restart is resumed
// after the last delivered seq, with the client's backoff: when following,
// however long the coordinator stays out of reach (see watchGivesUp). If the
// coordinator's event log then ends before that seq (OUT_OF_RANGE: its
// state was restored or replaced), the watch reads the log again from
// afterSeq, skipping the events it delivered (the same event at the same
// seq; see seenLog). An afterSeq past the end of the log from the start is
// the caller's, and so is that OUT_OF_RANGE: it is returned. It returns
// fn's error as is, or the status that ended the watch.
func (c *Client) WatchEvents(ctx context.Context, runID string, afterSeq int64, follow bool, fn func(*v1.RunEvent) error) error {
	var failures uint
	start := afterSeq
	seen := newSeenLog()
	deliver := func(ev *v1.RunEvent) error {
		if seen.has(ev.GetSeq(), ev) {
			return nil
		}
		seen.add(ev.GetSeq(), ev)
		return fn(ev)
	}
	for {
		last, err := c.watchOnce(ctx, &v1.WatchRunRequest{RunId: runID, AfterSeq: afterSeq, NoFollow: !follow}, deliver)
		if last > afterSeq {
			afterSeq, failures = last, 0
		}
		var cb callbackError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &cb):
			return cb.err
		case status.Code(err) == codes.OutOfRange && afterSeq > start:
			afterSeq = start // read the log again
			continue
		case status.Code(err) != codes.Unavailable || ctx.Err() != nil:
			return fmt.Errorf("client: watch run %s: %w", runID, err)
		}
		if leaderMoved(err) {
			continue // the new leader serves: resume there at once
		}
		failures++
		if c.watchGivesUp(ctx, follow, failures) || !pause(ctx, c.conn, c.retry.backoff(failures)) {
			return fmt.Errorf("client: watch run %s: %w", runID, err)
		}
	}
}

// watchGivesUp says whether a watch stops resuming after failures
// failures in a row: a follow never does (it is ended by ctx, or by the
// run's end), so that an outage, an election or a loss of etcd quorum of
// any length is only a pause in it; a read of the events so far stops at
// ctx's deadline, or, without one, after the policy's attempts.
func (c *Client) watchGivesUp(ctx context.Context, follow bool, failures uint) bool {
	_, bounded := ctx.Deadline()
	return !follow && !bounded && failures >= c.retry.MaxAttempts
}

func (c *Client) watchOnce(ctx context.Context, req *v1.WatchRunRequest, fn func(*v1.RunEvent) error) (last int64, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.Runs.WatchRun(ctx, req)
	if err != nil {
		return 0, err
	}
	for {
		resp, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return last, nil
		}
		if err != nil {
			return last, err
		}
		if err := fn(resp.GetEvent()); err != nil {
			return last, callbackError{err}
		}
		last = resp.GetEvent().GetSeq()
	}
}
