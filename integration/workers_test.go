package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
)

// reader is one worker's command receiver, written the way docs/design.md tells
// a worker to be: a stream that, after UNAVAILABLE (a coordinator restart
// or drain), reopens from the last sequence number it saw; or a long-poll
// loop that advances after_seq. It ends at Stop. It checks the delivery
// contract as it goes: strictly increasing sequence numbers (no duplicate,
// nothing out of order, on one stream or across reconnects), and no poll
// that tells of a terminal run without the Stop that ended it.
type reader struct {
	t        *testing.T
	run      *run
	name     string
	workerID string
	poll     bool
	pollWait int32 // wait_seconds of each poll

	cmds   chan *v1.Command // every command received, in order
	done   chan struct{}    // closed when the loop has ended
	cancel context.CancelFunc

	mu         sync.Mutex
	got        []*v1.Command
	last       int64
	violations []string
	reconnects int
	err        error // why the loop ended; nil after a Stop
}

// startReader receives worker's commands after seq after until Stop, ctx's
// end or r.disconnect. It is stopped when the test ends.
func (r *run) startReader(ctx context.Context, name, workerID string, poll bool, after int64) *reader {
	return r.startReaderWait(ctx, name, workerID, poll, after, 10)
}

// startReaderWait is startReader with the polls' wait_seconds: 0 polls
// without waiting, as fast as the server answers.
func (r *run) startReaderWait(ctx context.Context, name, workerID string, poll bool, after int64, wait int32) *reader {
	ctx, cancel := context.WithCancel(ctx)
	rd := &reader{t: r.c.t, run: r, name: name, workerID: workerID, poll: poll, pollWait: wait, last: after,
		cmds: make(chan *v1.Command, 1024), done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(rd.done)
		var err error
		if poll {
			err = rd.pollLoop(ctx)
		} else {
			err = rd.streamLoop(ctx)
		}
		rd.mu.Lock()
		rd.err = err
		rd.mu.Unlock()
	}()
	r.c.t.Cleanup(func() {
		cancel()
		<-rd.done
	})
	return rd
}

func (rd *reader) String() string {
	kind := "stream"
	if rd.poll {
		kind = "poll"
	}
	return fmt.Sprintf("%s/%s (%s, %s)", rd.run.id, rd.name, rd.workerID, kind)
}

// retryable: the coordinator is gone or going; a worker retries from its
// last seq. A short pause keeps a dead server from being hammered; it is a
// retry backoff, not synchronisation.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil || status.Code(err) != codes.Unavailable {
		return false
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(10 * time.Millisecond):
		return true
	}
}

func (rd *reader) streamLoop(ctx context.Context) error {
	for {
		stream, err := rd.run.ws.StreamCommands(ctx, &v1.StreamCommandsRequest{RunId: rd.run.id, WorkerId: rd.workerID, AfterSeq: rd.lastSeq()})
		if err == nil {
			for {
				var resp *v1.StreamCommandsResponse
				resp, err = stream.Recv()
				if err != nil {
					break
				}
				if rd.deliver(resp.Command) {
					return nil
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return errors.New("stream ended without a Stop")
		}
		if !retryable(ctx, err) {
			return err
		}
		rd.mu.Lock()
		rd.reconnects++
		rd.mu.Unlock()
	}
}

func (rd *reader) pollLoop(ctx context.Context) error {
	terminalWithoutStop := 0
	for {
		after := rd.lastSeq()
		resp, err := rd.run.ws.PollCommands(ctx, &v1.PollCommandsRequest{RunId: rd.run.id, WorkerId: rd.workerID, AfterSeq: after, WaitSeconds: rd.pollWait})
		if err != nil {
			if !retryable(ctx, err) {
				return err
			}
			rd.mu.Lock()
			rd.reconnects++
			rd.mu.Unlock()
			continue
		}
		for _, c := range resp.Commands {
			if rd.deliver(c) {
				return nil
			}
		}
		if apifacts.Terminal(resp.RunState) {
			// The Stop is issued in the same commit as the terminal
			// state, so a poll that reports the state must carry it.
			rd.violate("poll after seq %d reported run_state %v without delivering the Stop", after, resp.RunState)
			if terminalWithoutStop++; terminalWithoutStop > 100 {
				return errors.New("run is terminal but no Stop was ever delivered")
			}
		}
	}
}

func (rd *reader) lastSeq() int64 {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	return rd.last
}

// deliver records c and reports whether it was the Stop.
func (rd *reader) deliver(c *v1.Command) bool {
	rd.mu.Lock()
	if c.Seq <= rd.last {
		rd.violations = append(rd.violations, fmt.Sprintf("command seq %d (%s) delivered after seq %d: duplicate or out of order",
			c.Seq, kindOf(c), rd.last))
		rd.mu.Unlock()
		return false
	}
	rd.last = c.Seq
	rd.got = append(rd.got, c)
	rd.mu.Unlock()
	select {
	case rd.cmds <- c:
	default:
		rd.violate("command channel full")
	}
	return c.GetStop() != nil
}

func (rd *reader) violate(format string, args ...any) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.violations = append(rd.violations, fmt.Sprintf(format, args...))
}

// next returns the next command received, failing the test if none comes
// before ctx ends.
func (rd *reader) next(ctx context.Context) *v1.Command {
	rd.t.Helper()
	select {
	case c := <-rd.cmds:
		return c
	case <-rd.done:
		select {
		case c := <-rd.cmds:
			return c
		default:
		}
		rd.t.Fatalf("%s ended (%v) while a command was awaited; received %s", rd, rd.endErr(), kinds(rd.log()))
	case <-ctx.Done():
		rd.t.Fatalf("%s: no command before the test timeout; received %s", rd, kinds(rd.log()))
	}
	return nil
}

// expect returns the next command and checks its kind.
func (rd *reader) expect(ctx context.Context, kind string) *v1.Command {
	rd.t.Helper()
	c := rd.next(ctx)
	if kindOf(c) != kind {
		rd.t.Fatalf("%s: got %s (seq %d), want %s; received %s", rd, kindOf(c), c.Seq, kind, kinds(rd.log()))
	}
	return c
}

// disconnect cancels the reader's RPC, as a worker whose connection dropped,
// and returns once its loop has ended.
func (rd *reader) disconnect() {
	rd.cancel()
	<-rd.done
}

// wait returns once the loop ended, with why (nil after a Stop).
func (rd *reader) wait(ctx context.Context) error {
	rd.t.Helper()
	select {
	case <-rd.done:
		return rd.endErr()
	case <-ctx.Done():
		rd.t.Fatalf("%s still running at the test timeout; received %s", rd, kinds(rd.log()))
		return nil
	}
}

func (rd *reader) endErr() error {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	return rd.err
}

func (rd *reader) log() []*v1.Command {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	return append([]*v1.Command(nil), rd.got...)
}

func (rd *reader) reconnectCount() int {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	return rd.reconnects
}

// checkClean fails the test for every contract violation the reader saw.
func (rd *reader) checkClean() {
	rd.t.Helper()
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for _, v := range rd.violations {
		rd.t.Errorf("%s: %s", rd, v)
	}
}

// waitStopped waits for every reader to end at a Stop and checks that none
// saw a violation.
func waitStopped(ctx context.Context, t *testing.T, readers ...*reader) {
	t.Helper()
	for _, rd := range readers {
		if err := rd.wait(ctx); err != nil {
			t.Errorf("%s ended with %v, want a Stop; received %s", rd, err, kinds(rd.log()))
		}
		rd.checkClean()
	}
}

// ---------------------------------------------------------------------------

func kindOf(c *v1.Command) string {
	switch c.Kind.(type) {
	case *v1.Command_SaveAtDeadline:
		return "SaveAtDeadline"
	case *v1.Command_Snapshot:
		return "Snapshot"
	case *v1.Command_PublishCheckpoint:
		return "PublishCheckpoint"
	case *v1.Command_Stop:
		return "Stop"
	}
	return "unknown"
}

func kinds(cmds []*v1.Command) string {
	parts := make([]string, len(cmds))
	for i, c := range cmds {
		parts[i] = fmt.Sprintf("%d:%s", c.Seq, kindOf(c))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// sameCommands fails unless got is exactly want: the same commands, in the
// same order, field for field.
func sameCommands(t *testing.T, who string, got, want []*v1.Command) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s received %s, want %s", who, kinds(got), kinds(want))
		return
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("%s: command %d is %v, want %v", who, i, got[i], want[i])
		}
	}
}

func protoEqual(a, b proto.Message) bool { return proto.Equal(a, b) }

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: %v (code %v), want %v", what, err, got, want)
	}
}

// deadlineSpec is a turn-level run (environment snapshots enabled) whose
// deadline B is at b. With B an hour away the real clock never fires it on
// its own: a step that reports a 2-hour iteration makes now+I >= B, so the
// deadline fires exactly at the step the test chooses, without waiting.
// afterCheckpoint keeps snapshot_on_trainer_checkpoint (a Snapshot after
// every published checkpoint); otherwise the only environment commands are
// SaveAtDeadline and Stop.
func deadlineSpec(world int32, b time.Time, afterCheckpoint bool) *v1.RunSpec {
	return spectest.TurnUntil(world, b, afterCheckpoint)
}

const (
	shortIteration = 1.0    // s: now + 1 s is far before B
	fireIteration  = 7200.0 // s: now + 2 h is past B = now + 1 h
)

// eventsOf returns the events of one type.
func eventsOf(evs []*v1.RunEvent, typ v1.RunEventType) []*v1.RunEvent {
	var out []*v1.RunEvent
	for _, ev := range evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// checkEventLog checks that seqs run 1..n without a gap, and that before
// (events read earlier) is a prefix of it, unchanged.
func checkEventLog(t *testing.T, evs, before []*v1.RunEvent) {
	t.Helper()
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d: the log has a gap or a duplicate", i, ev.Seq)
		}
	}
	if len(before) > len(evs) {
		t.Fatalf("%d events before, only %d now: acknowledged events were lost", len(before), len(evs))
	}
	for i := range before {
		if !proto.Equal(before[i], evs[i]) {
			t.Fatalf("event %d changed: was %v, now %v", i+1, before[i], evs[i])
		}
	}
}
