package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/store"
)

// A worker that reconnects after it already received its Stop gets an
// empty stream that ends, rather than one that waits forever; one that
// reconnects from before the Stop gets the Stop and then the end.
func TestStreamOfFinishedRunEnds(t *testing.T) { synctest.Test(t, testStreamOfFinishedRunEnds) }

func testStreamOfFinishedRunEnds(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{TrainerWorldSize: 1})
	env := h.envs("r", 1)[0]
	if _, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	h.settle("r")
	stop := h.poll("r", env, 0)
	if len(stop) != 1 || stop[0].GetStop() == nil {
		t.Fatalf("commands %v, want one Stop", stop)
	}
	// The timeout only turns a hang (the bug) into a failure; in the
	// bubble it passes as soon as every goroutine is blocked.
	ctx, cancel := context.WithTimeout(h.ctx, 30*time.Second)
	defer cancel()
	for _, after := range []int64{0, stop[0].Seq} {
		var got []*v1.Command
		err := h.e.StreamCommands(ctx, &v1.StreamCommandsRequest{RunId: "r", WorkerId: env, AfterSeq: after},
			func(c *v1.Command) error { got = append(got, c); return nil })
		if err != nil {
			t.Fatalf("after %d: %v", after, err)
		}
		if want := int(stop[0].Seq - after); len(got) != min(want, 1) {
			t.Fatalf("after %d: streamed %v", after, got)
		}
	}
}

// A cursor past the end of a log is refused, naming after_seq and the last
// seq, so that a worker that saw another coordinator's log starts over
// instead of waiting, deaf, for the log to catch up with it. A cursor at the
// end is fine, and so is 0 on an empty log.
func TestCursorPastTheLogIsOutOfRange(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{TrainerWorldSize: 1})
	env := h.envs("r", 1)[0]
	if got := h.poll("r", env, 0); len(got) != 0 {
		t.Fatalf("fresh run: commands %v, want none", got)
	}
	_, err := h.e.PollCommands(h.ctx, &v1.PollCommandsRequest{RunId: "r", WorkerId: env, AfterSeq: 1})
	wantErr(t, err, ErrOutOfRange, "after_seq 1 is past the run's last command (seq 0)")

	if _, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	h.settle("r")
	cmds := h.poll("r", env, 0)
	if len(cmds) == 0 {
		t.Fatal("no command after the deadline fired")
	}
	last := h.lastCommandSeq("r")
	if got := h.poll("r", env, last); len(got) != 0 {
		t.Fatalf("at the end: commands %v, want none", got)
	}
	_, err = h.e.PollCommands(h.ctx, &v1.PollCommandsRequest{RunId: "r", WorkerId: env, AfterSeq: last + 1})
	wantErr(t, err, ErrOutOfRange, fmt.Sprintf("after_seq %d is past the run's last command (seq %d)", last+1, last))
	err = h.e.StreamCommands(h.ctx, &v1.StreamCommandsRequest{RunId: "r", WorkerId: env, AfterSeq: last + 5},
		func(c *v1.Command) error { t.Errorf("streamed %v past the end", c); return nil })
	wantErr(t, err, ErrOutOfRange, fmt.Sprintf("after_seq %d is past the run's last command (seq %d)", last+5, last))

	evs := h.events("r")
	lastEv := evs[len(evs)-1].Seq
	var got []*v1.RunEvent
	watch := func(after int64) error {
		return h.e.WatchRun(h.ctx, &v1.WatchRunRequest{RunId: "r", AfterSeq: after, NoFollow: true},
			func(ev *v1.RunEvent) error { got = append(got, ev); return nil })
	}
	if err := watch(lastEv); err != nil || len(got) != 0 {
		t.Fatalf("watch at the end: events %v, err %v; want none, no error", got, err)
	}
	wantErr(t, watch(lastEv+1), ErrOutOfRange, fmt.Sprintf("after_seq %d is past the run's last event (seq %d)", lastEv+1, lastEv))
	if len(got) != 0 {
		t.Fatalf("watch past the end sent %v", got)
	}
}

// The end of the log is the last seq issued, not the last durable one: a
// command being committed right now is part of the log, so a cursor at it
// (which a reader of another coordinator may hold) waits for it rather than
// failing, and a stream that is at the end when a command is appended gets
// it.
func TestCursorAtACommandInFlightIsNotOutOfRange(t *testing.T) {
	var holding atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	h := newHarnessStore(t, Options{HeartbeatInterval: 5 * time.Second}, store.Options{OnCommit: func(int, time.Duration) {
		if holding.CompareAndSwap(true, false) {
			close(held)
			<-release
		}
	}})
	h.create("r", &v1.RunSpec{TrainerWorldSize: 1})
	env := h.envs("r", 1)[0]
	streamed := make(chan *v1.Command, 10)
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	streamErr := make(chan error, 1)
	go func() {
		streamErr <- h.e.StreamCommands(ctx, &v1.StreamCommandsRequest{RunId: "r", WorkerId: env},
			func(c *v1.Command) error { streamed <- c; return nil })
	}()

	holding.Store(true)
	triggered := make(chan error, 1)
	go func() {
		_, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r"})
		triggered <- err
	}()
	<-held
	last := h.lastCommandSeq("r")
	if last == 0 {
		t.Fatal("no command issued by the trigger")
	}
	polled := make(chan error, 1)
	go func() {
		_, err := h.e.PollCommands(h.ctx, &v1.PollCommandsRequest{RunId: "r", WorkerId: env, AfterSeq: last, WaitSeconds: 1})
		polled <- err
	}()
	close(release)
	if err := <-triggered; err != nil {
		t.Fatal(err)
	}
	if err := <-polled; err != nil {
		t.Fatalf("poll at a command in flight: %v", err)
	}
	var c *v1.Command
	select {
	case c = <-streamed:
	case err := <-streamErr: // after its sends, if any (a Stop ends it)
		if len(streamed) == 0 {
			t.Fatalf("stream at the end ended with %v and no command when one was appended", err)
		}
		c = <-streamed
	}
	if c.Seq == 0 || c.Seq > last {
		t.Fatalf("streamed seq %d, want one of 1..%d", c.Seq, last)
	}
}

// lastCommandSeq is the run's last issued command seq, durable or not.
func (h *harness) lastCommandSeq(run string) int64 {
	h.t.Helper()
	r, err := h.e.run(run)
	if err != nil {
		h.t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec.LastCommandSeq
}
