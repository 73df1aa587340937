package client_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
)

// serveOn stops the coordinator and starts it again on the same address
// over the data directory dir: a fresh one is a coordinator that lost its
// data, the old one its data restored.
func (c *coordinator) serveOn(dir string) {
	c.shutdown()
	c.cfg.DataDir = dir
	c.serve()
}

// awaitCalls waits, at most 15 s, until the coordinator has had n calls of
// method; it fails at once if the worker stopped.
func awaitCalls(t *testing.T, g *gate, w *client.Worker, method string, n int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for g.count(method) < n {
		if err := w.Err(); err != nil {
			t.Fatalf("the worker stopped: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d %s after 15 s, want %d", g.count(method), method, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const (
	lostRunWarning  = "the coordinator no longer knows this run"
	knownRunWarning = "the coordinator knows this run again"
)

// The coordinator comes back on the same address with its data lost: it
// knows neither the run nor its token, and answers UNAUTHENTICATED. The
// worker registered with that token, so this is no misconfiguration: it
// goes on as while the coordinator is out of reach (so that a sidecar's
// backstop still saves), trying again at its backoff with one WARNING in
// all (its attempts to register again say nothing more), and once the
// coordinator has its data back it takes part in the deadline snapshot.
// A new process with the same token still fails at once: it was never
// answered, and for it the token is just wrong.
func TestWorkerGoesOnWhenTheCoordinatorLostTheRun(t *testing.T) {
	for _, poll := range []bool{false, true} {
		t.Run(map[bool]string{false: "stream", true: "poll"}[poll], func(t *testing.T) {
			co := startCoordinator(t) // leases lapse while the data is lost
			cl := co.createRun("r1", turnSpec(1))
			logs := &logsink.Recorder{}
			w, err := cl.StartWorker(t.Context(), client.WorkerConfig{RunID: "r1", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT,
				Name: "env-0", Poll: poll, Logger: logs.Logger()})
			if err != nil {
				t.Fatalf("StartWorker: %v", err)
			}
			t.Cleanup(func() { closeWorker(t, w) })
			fetch := map[bool]string{false: "StreamCommands", true: "PollCommands"}[poll]

			kept := co.cfg.DataDir
			co.serveOn(t.TempDir())
			// Five more attempts to follow the commands, and, the lease
			// presumed lapsed, three to register again, all refused.
			awaitCalls(t, co.gate, w, fetch, co.gate.count(fetch)+5)
			awaitCalls(t, co.gate, w, "RegisterWorker", co.gate.count("RegisterWorker")+3)
			select {
			case cmd, ok := <-w.Commands():
				t.Fatalf("commands while the coordinator does not know the run: %v, open %v (Err %v)", cmd, ok, w.Err())
			default:
			}
			if warns := logs.At(slog.LevelWarn); len(warns) != 1 || !strings.HasPrefix(warns[0], lostRunWarning) {
				t.Errorf("WARNINGs %q, want one: %q", warns, lostRunWarning)
			}
			_, err = cl.StartWorker(t.Context(), client.WorkerConfig{RunID: "r1", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-1"})
			if status.Code(err) != codes.Unauthenticated {
				t.Errorf("a new worker with the lost run's token: %v, want UNAUTHENTICATED at once", err)
			}

			co.serveOn(kept)
			saveAtDeadline(t, co.dial(""), "r1", w)
			warns := logs.At(slog.LevelWarn)
			if len(warns) != 2 || !strings.HasPrefix(warns[0], lostRunWarning) || warns[1] != knownRunWarning {
				t.Errorf("WARNINGs %q, want %q then %q", warns, lostRunWarning, knownRunWarning)
			}
		})
	}
}
