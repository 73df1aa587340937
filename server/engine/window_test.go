package engine

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/store"
)

// A long run keeps only its latest steps in memory; older ones are read
// from the store. A rank asking again about an old step gets its stored
// decision, and a checkpoint of an old step saved late is recorded and
// published, across a restart too.
func TestOldStepsReadFromStore(t *testing.T) {
	h := newHarness(t)
	h.create("r", &v1.RunSpec{TrainerWorldSize: 2, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "10:00:00:00"}})
	ranks := h.trainers("r", 2)
	first := h.step("r", ranks[0], 1, 1)
	h.advance(time.Second, "r", ranks...)
	last := int64(3*stepsKept + 10)
	for s := int64(1); s <= last; s++ {
		h.stepAll("r", ranks, s, 1)
	}
	decisions := len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DECISION))

	if d := h.step("r", ranks[1], 1, 1); !proto.Equal(d, first) {
		t.Fatalf("step 1 asked again: %v, first answer %v", d, first)
	}
	h.checkpoint("r", ranks[:1], 7, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 3)
	h.restart()
	if d := h.step("r", ranks[0], 1, 1); !proto.Equal(d, first) {
		t.Fatalf("step 1 asked after a restart: %v, first answer %v", d, first)
	}
	h.checkpoint("r", ranks[:1], 7, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 3) // a retry
	if n := len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_CHECKPOINT_PUBLISHED)); n != 0 {
		t.Fatalf("checkpoint of step 7 published with one rank of two saved (%d events)", n)
	}
	h.checkpoint("r", ranks[1:], 7, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 3)
	if run := h.get("r"); run.LastPublishedStep != 7 || run.LastStep != last {
		t.Fatalf("after both ranks saved step 7: last published %d, last step %d", run.LastPublishedStep, run.LastStep)
	}
	if n := len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_DECISION)); n != decisions {
		t.Fatalf("%d DECISION events after old steps were asked again, %d before", n, decisions)
	}
}

// A watcher of a long run gets every kept event in order, the ones that
// left memory read from the store, before and after a restart; events
// beyond --max-events-per-run are gone.
func TestWatchLongRun(t *testing.T) {
	const maxEvents = 3*eventsKept + 100
	h := newHarnessWith(t, Options{HeartbeatInterval: 5 * time.Second, MaxEventsPerRun: maxEvents})
	h.create("r", &v1.RunSpec{TrainerWorldSize: 1, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "10:00:00:00"}})
	ranks := h.trainers("r", 1)
	for s := int64(1); s <= 4*eventsKept; s++ {
		h.stepAll("r", ranks, s, 1)
	}
	check := func(when string) {
		t.Helper()
		last := h.get("r").LastEventSeq
		evs := h.events("r")
		var want []int64
		for seq := last - maxEvents + 1; seq <= last; seq++ {
			want = append(want, seq)
		}
		if got := seqs(evs); !slices.Equal(got, want) {
			t.Fatalf("%s: watched %d events %d…%d, want the last %d of %d in order", when, len(got), got[0], got[len(got)-1], maxEvents, last)
		}
	}
	check("live")
	h.restart()
	check("after a restart")
}

func seqs(evs []*v1.RunEvent) []int64 {
	var out []int64
	for _, ev := range evs {
		out = append(out, ev.Seq)
	}
	return out
}

// A step read back from the store waits for the run's commits in flight:
// a put of that step may be one of them. Here one rank's SAVED of an old
// step is put but not yet committed when the step leaves memory; the other
// rank's SAVED must still find it, or it would overwrite it and the
// checkpoint would never be published.
func TestOldStepReadWaitsForItsPut(t *testing.T) {
	var holding atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	h := newHarnessStore(t, Options{HeartbeatInterval: 5 * time.Second}, store.Options{OnCommit: func(int, time.Duration) {
		if holding.CompareAndSwap(true, false) {
			close(held)
			<-release // this commit's callers, and every later commit, wait
		}
	}})
	h.create("r", &v1.RunSpec{TrainerWorldSize: 2, Checkpointing: &v1.CheckpointingSpec{CheckpointMustSaveBy: "10:00:00:00"}})
	ranks := h.trainers("r", 2)
	last := int64(3 * stepsKept)
	for s := int64(1); s <= last; s++ {
		h.stepAll("r", ranks, s, 1)
	}
	h.step("r", ranks[0], 5, 1) // read back into memory
	r, err := h.e.run("r")
	if err != nil {
		t.Fatal(err)
	}

	saved := func(rank int, step int64) func() error {
		return func() error {
			_, err := h.e.ReportCheckpoint(h.ctx, &v1.ReportCheckpointRequest{RunId: "r", WorkerId: ranks[rank], Step: step,
				Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 1})
			return err
		}
	}
	holding.Store(true)
	errs := make(chan error, 2)
	go func() { errs <- saved(0, last)() }()
	<-held
	// Rank 0's SAVED of step 5, put behind the held commit; then step 5
	// leaves memory, as trimSteps drops it.
	r.mu.Lock()
	m := &mut{e: h.e, r: r, now: h.clk.Now()}
	st, err := m.steps().step(h.ctx, 5)
	if err == nil {
		err = m.steps().checkpointSaved(5, st, 0, 1)
	}
	m.flush()
	delete(r.steps, 5)
	r.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	go func() { errs <- saved(1, 5)() }()
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}

	if n := len(h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_CHECKPOINT_PUBLISHED)); n != 1 {
		t.Fatalf("%d CHECKPOINT_PUBLISHED events after both ranks saved step 5, want 1", n)
	}
}
