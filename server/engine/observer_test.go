package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/store"
)

// countingObserver counts decisions and deadline fires.
type countingObserver struct {
	nopObserver
	mu               sync.Mutex
	decisions, fires int
}

func (o *countingObserver) Decision(context.Context, string, int64, v1.StepAction) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.decisions++
}

func (o *countingObserver) DeadlineFired(context.Context, string, int64, v1.DeadlineFireKind) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.fires++
}

func (o *countingObserver) counts() (decisions, fires int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.decisions, o.fires
}

// A caller that gives up while its commit is slow does not stop the change
// (it becomes durable, and a retry finds it stored), so it does not stop it
// from being counted either: the decision and the fire reach the metrics.
func TestObserverCountsACallWhoseCallerGaveUp(t *testing.T) {
	synctest.Test(t, testObserverCountsACallWhoseCallerGaveUp)
}

func testObserverCountsACallWhoseCallerGaveUp(t *testing.T) {
	obs := &countingObserver{}
	var slow atomic.Pointer[chan struct{}] // while set, commits wait for it to close
	h := newHarnessStore(t, Options{HeartbeatInterval: 5 * time.Second, Observer: obs},
		store.Options{OnCommit: func(int, time.Duration) {
			if c := slow.Load(); c != nil {
				<-*c
			}
		}})
	h.create("r", turnSpec(1, ""))
	ranks := h.trainers("r", 1)
	h.step("r", ranks[0], 1, 1)
	if _, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	decisions, fires := obs.counts()

	release := make(chan struct{})
	slow.Store(&release) // the next commit takes its time
	ctx, cancel := context.WithCancel(h.ctx)
	cancel() // the caller has already given up
	_, err := h.e.CompleteStep(ctx, &v1.CompleteStepRequest{RunId: "r", WorkerId: ranks[0], Step: 2, IterationSeconds: 1})
	wantErr(t, err, context.Canceled, "")
	slow.Store(nil)
	close(release)
	if d := h.step("r", ranks[0], 2, 1); d.Action != v1.StepAction_STEP_ACTION_SAVE_AND_STOP { // the retry
		t.Fatalf("retry of step 2: %v", d.Action)
	}
	// Counted once the commit is done, after the call returned: wait for
	// every goroutine of the bubble to be done.
	synctest.Wait()
	if d, f := obs.counts(); d != decisions+1 || f != fires+1 {
		t.Fatalf("decisions %d → %d, fires %d → %d; want one more of each", decisions, d, fires, f)
	}
}

// Workers of a finished run that go away without deregistering lapse to
// LOST like any others, before and after a restart, rather than count as
// LIVE for good.
func TestWorkersOfAFinishedRunLapse(t *testing.T) {
	h := newHarness(t)
	live := func() int {
		s := h.e.Stats()
		return s.Workers[v1.WorkerRole_WORKER_ROLE_TRAINER][v1.WorkerState_WORKER_STATE_LIVE] +
			s.Workers[v1.WorkerRole_WORKER_ROLE_ENVIRONMENT][v1.WorkerState_WORKER_STATE_LIVE]
	}
	cancelled := func(id string) {
		h.create(id, turnSpec(1, ""))
		h.trainers(id, 1)
		h.envs(id, 1)
		if _, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: id}); err != nil {
			t.Fatal(err)
		}
	}
	cancelled("r")
	h.clk.Advance(time.Hour)
	if n := live(); n != 0 {
		t.Fatalf("an hour after the run ended, no heartbeat: %d workers LIVE", n)
	}
	h.wantState("r", v1.RunState_RUN_STATE_CANCELLED)

	cancelled("later") // its workers LIVE when the coordinator stops
	h.restart()
	h.clk.Advance(time.Hour)
	if n := live(); n != 0 {
		t.Fatalf("an hour after a restart: %d workers LIVE in finished runs", n)
	}
	h.wantState("later", v1.RunState_RUN_STATE_CANCELLED)
}
