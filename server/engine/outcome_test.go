package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/store"
)

// A call whose commit is still waiting when its context ends (its
// deadline; its term ended as the coordinator lost the leadership) is
// answered ReasonOutcomeUnknown, not as if it did nothing: the commit lands
// afterwards, and the repeat the client then makes answers what the first
// attempt did. A call whose context ended before it began changes nothing.
func TestUnconfirmedCommitIsAnsweredOutcomeUnknown(t *testing.T) {
	var holding atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	var released sync.Once
	unhold := func() { released.Do(func() { close(release) }) }
	h := newHarnessStore(t, Options{HeartbeatInterval: 5 * time.Second}, store.Options{OnCommit: func(int, time.Duration) {
		if holding.CompareAndSwap(true, false) {
			close(held)
			<-release
		}
	}})
	t.Cleanup(unhold) // before the harness closes (registered earlier, so run later), which waits for the commit
	h.create("r", &v1.RunSpec{TrainerWorldSize: 1})
	h.create("untouched", &v1.RunSpec{TrainerWorldSize: 1})

	holding.Store(true)
	ctx, end := context.WithCancelCause(h.ctx)
	answered := make(chan error, 1)
	go func() {
		_, err := h.e.TriggerDeadline(ctx, &v1.TriggerDeadlineRequest{RunId: "r", Reason: "drain"})
		answered <- err
	}()
	<-held // committed, not yet confirmed
	end(errors.New("leadership lost"))
	err := <-answered
	if ee, ok := errors.AsType[*Error](err); !ok || ee.Kind != ErrUnavailable || ee.Reason != ReasonOutcomeUnknown ||
		!strings.Contains(ee.Msg, "leadership lost") {
		t.Fatalf("trigger whose commit was unconfirmed when its call ended: %v; want UNAVAILABLE OUTCOME_UNKNOWN naming the cause", err)
	}
	unhold()
	first := h.get("r") // waits for the commit
	if first.FiredAt == nil {
		t.Fatal("the trigger's commit did not take effect")
	}
	again, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: "r", Reason: "drain"})
	if err != nil || !again.Run.FiredAt.AsTime().Equal(first.FiredAt.AsTime()) {
		t.Fatalf("the repeat: %v, %v; want OK with the first attempt's fire", again.GetRun(), err)
	}

	_, err = h.e.TriggerDeadline(ctx, &v1.TriggerDeadlineRequest{RunId: "untouched", Reason: "drain"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a trigger whose call had ended before it began: %v; want its context's error", err)
	}
	if h.get("untouched").FiredAt != nil {
		t.Fatal("a call that had ended before it began changed the run")
	}
	_, err = h.e.CreateRun(ctx, &v1.CreateRunRequest{RunId: "never", Spec: &v1.RunSpec{TrainerWorldSize: 1}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a CreateRun whose call had ended before it began: %v; want its context's error", err)
	}
	if _, err := h.e.GetRun(h.ctx, &v1.GetRunRequest{RunId: "never"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetRun of a run whose CreateRun had ended before it began: %v; want NOT_FOUND", err)
	}
}
