package engine

import (
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
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
