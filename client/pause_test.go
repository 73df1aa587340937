package client_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/fakefollower"
)

// attempts records the attempts of one method, as an interceptor inside the
// client's retries sees them.
type attempts struct {
	method string
	mu     sync.Mutex
	errs   []error
	failed chan struct{} // closed when the first attempt has failed
}

func newAttempts(method string) *attempts {
	return &attempts{method: method, failed: make(chan struct{})}
}

func (a *attempts) note(method string, err error) {
	if method != a.method {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, err)
	if len(a.errs) == 1 && err != nil {
		close(a.failed)
	}
}

func (a *attempts) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	a.note(method, err)
	return err
}

func (a *attempts) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	a.note(method, err)
	return s, err
}

func (a *attempts) all() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]error(nil), a.errs...)
}

// A call made while no coordinator in the list leads (a follower, and the
// leader stopped) is made again the moment the leader serves: with a
// backoff of an hour, only the connection turning READY can let the retry
// out before the test's minute is up. Waiting for the leader costs no
// attempts: exactly one retry is made. Unary retries, an event watch and a
// worker's snapshot report (which the worker repeats until answered) wait
// alike.
func TestRetryGoesOutWhenALeaderServes(t *testing.T) {
	hour := client.WithRetry(client.RetryPolicy{MaxAttempts: 2, Base: time.Hour, Max: time.Hour})
	for _, tc := range []struct {
		name   string
		method string
		// prepare runs while the leader serves; call once it is stopped.
		prepare func(t *testing.T, admin, runClient *client.Client) (call func(ctx context.Context) error)
	}{
		{name: "unary retry", method: v1.RunService_GetRun_FullMethodName,
			prepare: func(_ *testing.T, admin, _ *client.Client) func(context.Context) error {
				return func(ctx context.Context) error {
					_, err := admin.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: "r1"})
					return err
				}
			}},
		{name: "event watch", method: v1.RunService_WatchRun_FullMethodName,
			prepare: func(_ *testing.T, admin, _ *client.Client) func(context.Context) error {
				return func(ctx context.Context) error {
					return admin.WatchEvents(ctx, "r1", 0, false, func(*v1.RunEvent) error { return nil })
				}
			}},
		{name: "snapshot report", method: v1.WorkerService_ReportSnapshot_FullMethodName,
			prepare: func(t *testing.T, admin, runClient *client.Client) func(context.Context) error {
				w := startEnvWorker(t, runClient, "r1", false)
				if _, err := admin.Runs.TriggerDeadline(t.Context(), &v1.TriggerDeadlineRequest{RunId: "r1", Reason: "test"}); err != nil {
					t.Fatalf("TriggerDeadline: %v", err)
				}
				save := nextCommand(t, w).GetSaveAtDeadline()
				return func(ctx context.Context) error {
					_, err := w.ReportSnapshot(ctx, save.GetSnapshotId(), v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 0, "ok")
					return err
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			co := startCoordinator(t)
			f := fakefollower.Start(t, fakefollower.Options{})
			list := f.Addr() + "," + co.addr
			seen := newAttempts(tc.method)
			counted := client.WithDialOptions(grpc.WithChainUnaryInterceptor(seen.unary), grpc.WithChainStreamInterceptor(seen.stream))
			admin := dialList(t, list, "", hour, counted)
			created, err := admin.Runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "r1", Spec: turnSpec(1)})
			if err != nil {
				t.Fatalf("CreateRun: %v", err)
			}
			call := tc.prepare(t, admin, dialList(t, list, created.GetRunToken(), hour, counted))

			co.shutdown()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- call(ctx) }()
			select {
			case <-seen.failed:
			case err := <-done:
				t.Fatalf("with no leader serving, the call ended before its first attempt failed: %v", err)
			}
			co.serve()
			if err := <-done; err != nil {
				t.Fatalf("the call, once the leader served again: %v; want it made again then, not an hour later", err)
			}
			errs := seen.all()
			if len(errs) != 2 || status.Code(errs[0]) != codes.Unavailable || errs[1] != nil {
				t.Errorf("attempts: %v; want one UNAVAILABLE while no leader served, then one that succeeded", errs)
			}
		})
	}
}

// While no coordinator leads, waiting for one does not bring attempts
// closer together: a call fails after the policy's attempts and no sooner
// than its backoffs add up, with the connection's error, and the follower,
// which health checking keeps calls away from, sees none of them.
func TestNoLeaderCallFailsAfterTheBackoff(t *testing.T) {
	f := fakefollower.Start(t, fakefollower.Options{})
	const wait = 200 * time.Millisecond
	seen := newAttempts(v1.RunService_GetRun_FullMethodName)
	cl := dialList(t, f.Addr()+","+freeAddr(t), "",
		client.WithRetry(client.RetryPolicy{MaxAttempts: 3, Base: wait, Max: wait}),
		client.WithDialOptions(grpc.WithChainUnaryInterceptor(seen.unary)))
	start := time.Now()
	_, err := cl.Runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "r1"})
	took := time.Since(start)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("GetRun with no leader: %v; want UNAVAILABLE", err)
	}
	// Two waits of 200 ms -20% jitter at least.
	if n := len(seen.all()); n != 3 || took < 2*wait*8/10 {
		t.Errorf("%d attempts in %v; want the policy's 3, at least 320 ms apart in all", n, took)
	}
	if f.Calls() != 0 {
		t.Errorf("the follower got %d calls", f.Calls())
	}
}

// A watch that follows a run outlasts an outage however many attempts it
// takes (here more than the policy's two), resuming after the last event it
// delivered: `snapctl run watch` and `events --follow` are documented as
// unbounded, and a loss of etcd quorum may last minutes.
func TestFollowingWatchOutlastsTheRetryPolicy(t *testing.T) {
	co := startCoordinator(t)
	failed := make(chan error, 64)
	countFailures := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil && method == v1.RunService_WatchRun_FullMethodName {
			select {
			case failed <- err:
			default:
			}
		}
		return s, err
	}
	admin := co.dial("", client.WithRetry(client.RetryPolicy{MaxAttempts: 2, Base: 10 * time.Millisecond, Max: 10 * time.Millisecond}),
		client.WithDialOptions(grpc.WithChainStreamInterceptor(countFailures)))
	if _, err := admin.Runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "r1", Spec: turnSpec(1)}); err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	events := make(chan *v1.RunEvent, 16)
	done := make(chan error, 1)
	go func() {
		done <- admin.WatchEvents(ctx, "r1", 0, true, func(ev *v1.RunEvent) error { events <- ev; return nil })
	}()
	<-events // the run's creation: the watch is open

	co.shutdown()
	for range 5 {
		select {
		case <-failed:
		case err := <-done:
			t.Fatalf("the watch gave up during the outage: %v", err)
		}
	}
	co.serve()
	if _, err := admin.Runs.CancelRun(ctx, &v1.CancelRunRequest{RunId: "r1", Reason: "test"}); err != nil {
		t.Fatalf("CancelRun: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the watch, once the coordinator was back and the run cancelled: %v; want it to follow to the run's end", err)
	}
	cancelled := false
	for len(events) > 0 {
		ev := <-events
		cancelled = cancelled || ev.GetType() == v1.RunEventType_RUN_EVENT_TYPE_STATE_CHANGED && strings.Contains(ev.GetMessage(), "CANCELLED")
	}
	if !cancelled {
		t.Error("the watch did not deliver the run's cancellation")
	}
}
