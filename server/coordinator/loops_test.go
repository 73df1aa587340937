package coordinator

import (
	"errors"
	"testing"
	"time"
)

// fakeHealth answers each Healthy call with the next value the test sends,
// so the test knows which tick saw which answer.
type fakeHealth struct{ answers chan error }

func (f fakeHealth) Healthy() error { return <-f.answers }

type fakeMarker struct{ marked chan error }

func (f fakeMarker) MarkUnhealthy(err error) { f.marked <- err }

// The watcher marks the server unhealthy at the first tick after the
// engine reports a failed commit, once, and then stops asking.
func TestHealthWatchMarksUnhealthy(t *testing.T) {
	eng := fakeHealth{answers: make(chan error)}
	srv := fakeMarker{marked: make(chan error, 2)}
	tick := make(chan time.Time)
	stop := startHealthWatch(eng, srv, tick)
	defer stop()
	tick <- time.Now()
	eng.answers <- nil // healthy: nothing happens
	failure := errors.New("store: commit failed")
	tick <- time.Now()
	eng.answers <- failure
	if err := <-srv.marked; !errors.Is(err, failure) {
		t.Errorf("MarkUnhealthy(%v), want %v", err, failure)
	}
	stop() // the watcher has returned; stop must not hang, and may be called again
	select {
	case err := <-srv.marked:
		t.Errorf("marked twice: %v", err)
	default:
	}
}
