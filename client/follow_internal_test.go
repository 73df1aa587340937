package client

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// A call out under one leader is cut once another leads and the call has
// been out leaderSettle, not before: a health status that flips for a
// moment (a coordinator starting) and flips back cuts nothing, while a
// call waiting on a leader that froze is cut the moment it is old enough.
func TestGuardCutsOnlyCallsLeftUnderAnotherLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newLeaderWatch()
		w.moveTo(1)
		ctx, r, stop := w.guard(t.Context())
		defer stop()
		r.set(1) // the call went out under leader 1

		time.Sleep(100 * time.Millisecond)
		w.moveTo(2) // a flip for a moment...
		time.Sleep(100 * time.Millisecond)
		w.moveTo(1) // ...and back
		time.Sleep(2 * leaderSettle)
		synctest.Wait()
		if ctx.Err() != nil {
			t.Fatalf("a call out under the leader that still leads was cut: %v", context.Cause(ctx))
		}

		w.moveTo(2) // for good: the call has been out long enough
		synctest.Wait()
		if !errors.Is(context.Cause(ctx), errLeaderMoved) {
			t.Fatalf("a call left under a previous leader: cause %v, want errLeaderMoved", context.Cause(ctx))
		}

		young, r2, stop2 := w.guard(t.Context())
		defer stop2()
		r2.set(2)
		w.moveTo(3)
		synctest.Wait()
		if young.Err() != nil {
			t.Fatal("a call out for less than leaderSettle was cut at once")
		}
		time.Sleep(leaderSettle)
		synctest.Wait()
		if !errors.Is(context.Cause(young), errLeaderMoved) {
			t.Fatalf("after leaderSettle: cause %v, want errLeaderMoved", context.Cause(young))
		}
	})
}
