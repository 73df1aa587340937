package engine

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
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
