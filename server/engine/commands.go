package engine

import (
	"context"
	"fmt"
	"sort"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// pending returns the durable commands after seq meant for role, and whether
// the run is terminal. Called with r.mu held.
func (r *runState) pending(after int64, role v1.WorkerRole) []*v1.Command {
	upTo := r.durableCmd.Load()
	i := sort.Search(len(r.commands), func(i int) bool { return r.commands[i].Seq > after })
	var out []*v1.Command
	for _, c := range r.commands[i:] {
		if c.Seq > upTo {
			break
		}
		if c.Audience == v1.WorkerRole_WORKER_ROLE_UNSPECIFIED || c.Audience == role {
			out = append(out, c)
		}
	}
	return out
}

// beyond refuses a cursor past the end of a log whose last seq is last.
// Called with r.mu held, and last is the seq last issued, durable or not: a
// reader can only have seen durable entries, all at or below it, so a
// command being appended at this moment never makes a valid cursor fail.
func beyond(after, last int64, what string) error {
	if after <= last {
		return nil
	}
	return errorf(ErrOutOfRange, "after_seq %d is past the run's last %s (seq %d): read again from after_seq 0", after, what, last)
}

// cursor is one reader of a worker's commands (a stream or a poll).
type cursor struct {
	e           *Engine
	r           *runState
	workerID    string
	role        v1.WorkerRole
	incarnation int64
}

func (e *Engine) openCursor(runID, workerID string, incarnation int64) (*cursor, error) {
	r, err := e.run(runID)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.gone(); err != nil {
		return nil, err
	}
	w, err := r.worker(workerID, incarnation, v1.WorkerRole_WORKER_ROLE_UNSPECIFIED, "StreamCommands")
	if err != nil {
		return nil, err
	}
	return &cursor{e: e, r: r, workerID: workerID, role: w.w.Role, incarnation: w.w.Incarnation}, nil
}

// next returns the commands after seq, or a channel that closes at the next
// durable change when there are none. settled reports whether every command
// issued so far is durable, and so visible to pending.
func (c *cursor) next(after int64) (cmds []*v1.Command, changed <-chan struct{}, state v1.RunState, settled bool, err error) {
	changed = c.r.commandsChanged() // taken first, so no change slips between the read and the wait
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	if err := c.r.gone(); err != nil {
		return nil, nil, 0, false, err
	}
	w := c.r.workers[c.workerID]
	if err := w.current(c.incarnation); err != nil {
		return nil, nil, 0, false, err
	}
	if err := c.r.displaced(w); err != nil {
		return nil, nil, 0, false, err
	}
	if err := beyond(after, c.r.rec.LastCommandSeq, "command"); err != nil {
		return nil, nil, 0, false, err
	}
	settled = c.r.durableCmd.Load() >= c.r.rec.LastCommandSeq
	return c.r.pending(after, c.role), changed, c.r.state(), settled, nil
}

func (c *cursor) delivered(ctx context.Context, cmds []*v1.Command) {
	now := c.e.clk.Now()
	for _, cmd := range cmds {
		c.e.obs.CommandDelivered(ctx, commandKind(cmd), now.Sub(cmd.IssuedAt.AsTime()))
	}
}

// StreamCommands calls send for each command for the worker's role after
// req.after_seq, then for new ones, until a Stop was sent, the worker
// re-registers (ErrFailedPrecondition), or ctx ends. An after_seq past the
// run's last command is ErrOutOfRange, here and in PollCommands.
func (e *Engine) StreamCommands(ctx context.Context, req *v1.StreamCommandsRequest, send func(*v1.Command) error) error {
	c, err := e.openCursor(req.RunId, req.WorkerId, req.Incarnation)
	if err != nil {
		return err
	}
	after := req.AfterSeq
	for {
		cmds, changed, state, settled, err := c.next(after)
		if err != nil {
			return err
		}
		if len(cmds) == 0 && isTerminal(state) && settled {
			return nil // the run is over and this worker already has its Stop
		}
		for _, cmd := range cmds {
			c.delivered(ctx, []*v1.Command{cmd}) // counted before Send returns, so a reader who has it sees it counted
			if err := send(cmd); err != nil {
				return err
			}
			after = cmd.Seq
			if cmd.GetStop() != nil {
				return nil // nothing follows a Stop
			}
		}
		if len(cmds) > 0 {
			continue
		}
		if err := e.await(ctx, changed); err != nil {
			return err
		}
	}
}

// await blocks until changed closes, ctx ends, or waits end: long calls
// end (shutdown), or a commit failed (nothing will change until a restart,
// and a waiter must hear so rather than wait for ever). One channel for
// both keeps the select at three cases: with 10,000 streams waiting, each
// wake-up locks every channel of its select.
func (e *Engine) await(ctx context.Context, changed <-chan struct{}) error {
	select {
	case <-changed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.stopWaiting:
		if err := e.Healthy(); err != nil {
			return e.usable()
		}
		return errorf(ErrUnavailable, "the coordinator is shutting down; resume from your last seq")
	}
}

// PollCommands returns pending commands at once, or waits up to the capped
// wait for the first one.
func (e *Engine) PollCommands(ctx context.Context, req *v1.PollCommandsRequest) (*v1.PollCommandsResponse, error) {
	c, err := e.openCursor(req.RunId, req.WorkerId, req.Incarnation)
	if err != nil {
		return nil, err
	}
	wait := min(time.Duration(req.WaitSeconds)*time.Second, e.opts.MaxPollWait)
	waitCtx, expire := context.WithCancel(ctx)
	defer expire()
	t := e.clk.AfterFunc(wait, expire)
	defer t.Stop()
	for {
		cmds, changed, state, settled, err := c.next(req.AfterSeq)
		if err != nil {
			return nil, err
		}
		if isTerminal(state) && !settled {
			// The run ended in a commit that is not durable yet, and its
			// Stop is in that commit. Answering the terminal state now,
			// without the Stop, would tell the worker of an end it cannot
			// see yet (and that a crash could still undo). So wait for that
			// commit, already under way, whatever the poll's wait: a
			// non-waiting poll (wait_seconds 0) or one whose wait just ran
			// out must not answer the state either.
			if err := e.usable(); err != nil {
				return nil, err
			}
			if err := e.await(ctx, changed); err != nil {
				return nil, err
			}
			continue
		}
		if len(cmds) > 0 || wait <= 0 || isTerminal(state) || waitCtx.Err() != nil {
			c.delivered(ctx, cmds)
			return &v1.PollCommandsResponse{Commands: cmds, RunState: state}, nil
		}
		if err := e.await(waitCtx, changed); err != nil && (ctx.Err() != nil || waitCtx.Err() == nil) {
			return nil, err // the caller went away, or the engine is closing
		}
	}
}

// WatchRun calls send for each event after req.after_seq until the run is
// terminal and every event was sent, ctx ends, or (with no_follow) the
// backlog was sent. An after_seq past the run's last event is
// ErrOutOfRange.
func (e *Engine) WatchRun(ctx context.Context, req *v1.WatchRunRequest, send func(*v1.RunEvent) error) error {
	r, err := e.run(req.RunId)
	if err != nil {
		return err
	}
	after := req.AfterSeq
	for {
		changed := r.changed()
		evs, done, err := e.eventsAfter(r, after)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if err := send(ev); err != nil {
				return err
			}
			after = ev.Seq
		}
		if done || req.NoFollow && len(evs) == 0 {
			return nil
		}
		if len(evs) > 0 {
			continue
		}
		if err := e.await(ctx, changed); err != nil {
			return err
		}
	}
}

// eventsAfter returns up to a page of durable events after seq, and whether
// the run is terminal with every event durable and returned. Events older
// than the ones kept in memory are read from the store, under the run's
// lock so that none leaves memory between the two reads; those dropped
// beyond --max-events-per-run are skipped.
func (e *Engine) eventsAfter(r *runState, after int64) ([]*v1.RunEvent, bool, error) {
	const page = 256
	upTo := r.durableEvent.Load()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.gone(); err != nil {
		// Deleted after its retention between two pages: the store no
		// longer holds its events, or holds those of a run created again
		// under its id.
		return nil, false, err
	}
	if err := beyond(after, r.rec.Run.LastEventSeq, "event"); err != nil {
		return nil, false, err
	}
	oldest := r.rec.Run.LastEventSeq + 1
	if len(r.events) > 0 {
		oldest = r.events[0].Seq
	}
	var out []*v1.RunEvent
	if stored := min(upTo, oldest-1); after < stored {
		var err error
		if out, err = e.st.Events(r.id, after, stored, page); err != nil {
			return nil, false, fmt.Errorf("run %q: %w", r.id, err)
		}
	}
	if len(out) == 0 {
		i := sort.Search(len(r.events), func(i int) bool { return r.events[i].Seq > after })
		for _, ev := range r.events[i:] {
			if ev.Seq > upTo || len(out) == page {
				break
			}
			out = append(out, ev)
		}
	}
	last := after
	if len(out) > 0 {
		last = out[len(out)-1].Seq
	}
	done := r.terminal() && upTo == r.rec.Run.LastEventSeq && last >= upTo
	return out, done, nil
}

// Snapshot pages: a snapshot carries a report from every environment
// worker, about 100 bytes each, so a page is bounded in bytes too. With
// 10,000 workers one snapshot is about 1 MiB, and a page of all a run's
// snapshots would soon pass the 4 MiB that gRPC clients accept by default.
const (
	maxSnapshotPage   = 1000
	snapshotPageBytes = 1 << 20
)

func (e *Engine) ListSnapshots(ctx context.Context, req *v1.ListSnapshotsRequest) (*v1.ListSnapshotsResponse, error) {
	after, err := decodeSnapshotToken(req.PageToken)
	if err != nil {
		return nil, err
	}
	size := int(req.PageSize)
	if size == 0 {
		size = maxSnapshotPage
	}
	// The ids come from memory; the snapshots from the store (completed ones
	// are summaries in memory), read once the run's commits are done.
	var ids []string
	var run *runState
	err = e.view(ctx, req.RunId, func(r *runState) error {
		run = r
		i := sort.Search(len(r.snapOrder), func(i int) bool { return snapshotNum(r.snapOrder[i].SnapshotId) > after })
		for _, s := range r.snapOrder[i:min(i+size+1, len(r.snapOrder))] {
			ids = append(ids, s.SnapshotId)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	more := len(ids) > size
	ids = ids[:min(len(ids), size)]
	resp := &v1.ListSnapshotsResponse{}
	bytes := 0
	err = e.st.Snapshots(ctx, req.RunId, ids, func(s *v1.Snapshot) bool {
		n := proto.Size(s)
		if len(resp.Snapshots) > 0 && bytes+n > snapshotPageBytes {
			more = true
			return false
		}
		bytes += n
		resp.Snapshots = append(resp.Snapshots, s)
		return true
	})
	// A run deleted after its retention while we read, and perhaps created
	// again under its id: what the store gave is not this run's. A purge
	// takes the run out of the map before anyone can create it again.
	cur, gone := e.run(req.RunId)
	if gone == nil && cur != run {
		gone = errorf(ErrNotFound, "run %q not found", req.RunId)
	}
	if gone != nil {
		return nil, gone
	}
	if err != nil {
		return nil, fmt.Errorf("run %q: %w", req.RunId, err)
	}
	if more {
		resp.NextPageToken = encodePageToken(resp.Snapshots[len(resp.Snapshots)-1].SnapshotId)
	}
	return resp, nil
}

// decodeSnapshotToken returns the number of the last snapshot of the
// previous page; 0 for the first page.
func decodeSnapshotToken(tok string) (int64, error) {
	id, err := decodePageToken(tok, "ListSnapshots", func(id string) bool {
		n := snapshotNum(id)
		return n > 0 && id == snapshotID(n)
	})
	return snapshotNum(id), err
}
