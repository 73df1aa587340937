package engine

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/store"
)

// With a retention, a finished run is deleted that long after it ended,
// records and all: GET is NOT_FOUND, ListRuns leaves it out, the id can be
// used again from scratch, and the data file stays consistent. A run still
// live is untouched, and a run past its retention while the coordinator was
// down goes at the next start.
func TestFinishedRunsDeletedAfterRetention(t *testing.T) {
	h := newHarnessWith(t, Options{HeartbeatInterval: 5 * time.Second, FinishedRunRetention: time.Hour})
	h.create("done", turnSpec(1, ""))
	h.create("live", turnSpec(1, ""))
	h.envs("done", 2)
	if _, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "done", Reason: "bad data"}); err != nil {
		t.Fatal(err)
	}

	h.clk.Advance(59 * time.Minute)
	h.wantState("done", v1.RunState_RUN_STATE_CANCELLED)
	h.clk.Advance(2 * time.Minute)
	_, err := h.e.GetRun(h.ctx, &v1.GetRunRequest{RunId: "done"})
	wantErr(t, err, ErrNotFound, `"done"`)
	runs, err := h.e.ListRuns(h.ctx, &v1.ListRunsRequest{})
	if err != nil || len(runs.Runs) != 1 || runs.Runs[0].RunId != "live" {
		t.Fatalf("ListRuns after the retention: %v, %v; want only live", runs, err)
	}
	h.wantState("live", v1.RunState_RUN_STATE_PENDING)

	again := h.create("done", turnSpec(1, ""))
	if again.State != v1.RunState_RUN_STATE_PENDING || again.LastEventSeq != 1 {
		t.Fatalf("run created again under a deleted id: %v, want a fresh PENDING run", again)
	}
	if workers, err := h.e.ListWorkers(h.ctx, &v1.ListWorkersRequest{RunId: "done"}); err != nil || len(workers.Workers) != 0 {
		t.Fatalf("the new run has workers %v, %v", workers, err)
	}
	if err := h.db.Check(); err != nil {
		t.Fatal(err)
	}

	// Past its retention while the coordinator was down.
	if _, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "live", Reason: "done"}); err != nil {
		t.Fatal(err)
	}
	h.close()
	h.clk.Advance(2 * time.Hour)
	h.open()
	if _, err := h.e.GetRun(h.ctx, &v1.GetRunRequest{RunId: "live"}); err == nil {
		t.Fatal("a run past its retention at start is still there")
	}
	h.wantState("done", v1.RunState_RUN_STATE_PENDING)
}

// A WatchRun paging through a finished run's stored events while the
// retention deletes it ends with NOT_FOUND: before, it skipped the events
// already deleted and ended as if the history were complete, or went on
// with the events of a run created again under the id.
func TestWatchAcrossPurgeEndsNotFound(t *testing.T) {
	h := newHarnessWith(t, Options{HeartbeatInterval: 5 * time.Second, FinishedRunRetention: time.Hour})
	h.create("r", turnSpec(1, "10:00:00:00"))
	ranks := h.trainers("r", 1)
	for s := int64(1); s <= 3*eventsKept; s++ {
		h.stepAll("r", ranks, s, 1)
	}
	if _, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: "r", Reason: "bad data"}); err != nil {
		t.Fatal(err)
	}
	r, err := h.e.run("r")
	if err != nil {
		t.Fatal(err)
	}
	var got []*v1.RunEvent
	err = h.e.WatchRun(h.ctx, &v1.WatchRunRequest{RunId: "r", NoFollow: true}, func(ev *v1.RunEvent) error {
		if len(got) == 0 { // between the first two pages
			h.e.purge(r)
			h.create("r", turnSpec(1, ""))
			again := h.trainers("r", 1)
			for s := int64(1); s <= 2*eventsKept; s++ {
				h.stepAll("r", again, s, 1)
			}
		}
		got = append(got, ev)
		return nil
	})
	wantErr(t, err, ErrNotFound, `"r"`)
	for i, ev := range got {
		if ev.Seq != int64(i+1) || strings.Contains(ev.Message, "no deadline") {
			t.Fatalf("event %d of the watch: seq %d %q: not the deleted run's next", i, ev.Seq, ev.Message)
		}
	}
}

// After a commit fails nothing changes until a restart: a call waiting for
// a change ends with UNAVAILABLE, as every other call does, instead of
// waiting for ever.
func TestWaitersEndWhenACommitFails(t *testing.T) { synctest.Test(t, testWaitersEndWhenACommitFails) }

func testWaitersEndWhenACommitFails(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, ""))
	ranks := h.trainers("r", 1)
	h.stepAll("r", ranks, 1, 1)
	first := make(chan struct{})
	ended := make(chan error, 1)
	go func() {
		ended <- h.e.WatchRun(h.ctx, &v1.WatchRunRequest{RunId: "r", AfterSeq: h.get("r").LastEventSeq - 1},
			func(*v1.RunEvent) error {
				close(first) // one event: the watch follows the run from here
				return nil
			})
	}()
	<-first

	var bad store.Batch
	bad.PutEvent("r\x00", &v1.RunEvent{Seq: 1}) // a run id the store refuses: the commit fails, and every later one
	if err := h.db.Submit(&bad).Wait(h.ctx); err == nil {
		t.Fatal("the invalid batch committed")
	}
	_, err := h.e.CompleteStep(h.ctx, &v1.CompleteStepRequest{RunId: "r", WorkerId: ranks[0], Step: 2, IterationSeconds: 1})
	wantErr(t, err, ErrUnavailable, "")
	synctest.Wait() // every goroutine of the bubble has done what it can
	select {
	case err := <-ended:
		wantErr(t, err, ErrUnavailable, "cannot write")
	default:
		t.Fatal("WatchRun still waits after the store failed")
	}
}
