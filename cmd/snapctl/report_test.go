package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// fakeReporter stands in for *client.Worker. Each call runs answer with
// the call's number (from 1); a nil answer, or none, acknowledges.
type fakeReporter struct {
	answer  func(ctx context.Context, call int) error
	calls   int
	ended   []error  // each call's ctx.Err() when made
	reports []string // each call's "snapshot-id OUTCOME: message"
}

func (f *fakeReporter) ReportSnapshot(ctx context.Context, id string, outcome v1.SnapshotOutcome, _ time.Duration, msg string) (v1.RunState, error) {
	f.calls++
	f.ended = append(f.ended, ctx.Err())
	f.reports = append(f.reports, fmt.Sprintf("%s %s: %s", id, apifacts.EnumName(outcome), msg))
	if f.answer != nil {
		if err := f.answer(ctx, f.calls); err != nil {
			return 0, err
		}
	}
	return v1.RunState_RUN_STATE_RUNNING, nil
}

// failing answers the first n calls with code, wrapped as the client does.
func failing(n int, code codes.Code) func(context.Context, int) error {
	return func(_ context.Context, call int) error {
		if call > n {
			return nil
		}
		return fmt.Errorf("client: report snapshot snap-1: %w", status.Error(code, "connection refused"))
	}
}

// testReporter retries every millisecond and logs into the buffer returned.
func testReporter(f *fakeReporter) (*reporter, *bytes.Buffer) {
	var logs bytes.Buffer
	r := newReporter(f, slog.New(slog.NewTextHandler(&logs, nil)))
	r.retryInterval = time.Millisecond
	return r, &logs
}

var savedResult = hookResult{outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, took: time.Second}

// A report is retried while the coordinator is unreachable, however long,
// and the outage is logged once, not at every attempt.
func TestReportRetriedWhileTheCoordinatorIsUnreachable(t *testing.T) {
	// An attempt that the coordinator never answers times out, as a
	// connection to a host that went away does.
	timingOut := func(n int) func(context.Context, int) error {
		return func(ctx context.Context, call int) error {
			if call > n {
				return nil
			}
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	for _, tc := range []struct {
		name   string
		answer func(context.Context, int) error
	}{
		{"unavailable", failing(5, codes.Unavailable)},
		{"attempts time out", timingOut(5)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeReporter{answer: tc.answer}
			r, logs := testReporter(f)
			r.attemptTimeout = time.Millisecond
			r.report(t.Context(), "snap-1", savedResult)

			if f.calls != 6 {
				t.Errorf("%d attempts, want 6: retried until acknowledged", f.calls)
			}
			if n := strings.Count(logs.String(), "retrying until it answers"); n != 1 {
				t.Errorf("the outage logged %d times, want once:\n%s", n, logs)
			}
			if !strings.Contains(logs.String(), `msg="report delivered" snapshot_id=snap-1 outcome=SAVED attempts=6`) {
				t.Errorf("the delivery is not logged:\n%s", logs)
			}
		})
	}
}

// Any other error is an answer: logged, not retried.
func TestReportNotRetriedWhenRefused(t *testing.T) {
	for _, code := range []codes.Code{codes.FailedPrecondition, codes.DeadlineExceeded, codes.NotFound} {
		t.Run(code.String(), func(t *testing.T) {
			f := &fakeReporter{answer: failing(100, code)}
			r, logs := testReporter(f)
			r.report(t.Context(), "snap-1", savedResult)

			if f.calls != 1 {
				t.Errorf("%d attempts, want 1", f.calls)
			}
			if !strings.Contains(logs.String(), `msg="report failed" snapshot_id=snap-1 outcome=SAVED err="client: report snapshot snap-1: `+code.String()) {
				t.Errorf("the refusal is not logged:\n%s", logs)
			}
		})
	}
}

// The retries end with the hook's context: nobody waits for the report of
// a snapshot that was superseded, of a run that stopped, or of a sidecar
// that leaves. The attempt in flight is cut short too.
func TestReportRetriesEndWithTheHook(t *testing.T) {
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	unavailable := failing(100, codes.Unavailable)
	f := &fakeReporter{answer: func(actx context.Context, call int) error {
		if call == 3 {
			cancel(errSuperseded)
			if actx.Err() == nil {
				t.Error("the attempt in flight went on after the hook's context ended")
			}
		}
		return unavailable(actx, call)
	}}
	r, logs := testReporter(f)
	r.report(ctx, "snap-1", savedResult)

	if f.calls != 3 {
		t.Errorf("%d attempts, want 3: none after the context ended", f.calls)
	}
	if !strings.Contains(logs.String(), `msg="report abandoned" snapshot_id=snap-1 outcome=SAVED attempts=3 cause="hook killed: superseded`) {
		t.Errorf("the end of the retries is not logged:\n%s", logs)
	}
}

// A hook killed because its snapshot was superseded, or because the sidecar
// leaves, is still reported once, under a context the kill did not end.
func TestReportOfAKilledHookIsMadeOnce(t *testing.T) {
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(errSuperseded)
	f := &fakeReporter{answer: failing(100, codes.Unavailable)}
	r, _ := testReporter(f)
	r.report(ctx, "snap-1", hookResult{outcome: errSuperseded.outcome, message: errSuperseded.message})

	if f.calls != 1 || f.ended[0] != nil {
		t.Errorf("%d attempts (the first's context: %v), want 1 under a live context", f.calls, f.ended[0])
	}
}

// The report of a hook the sidecar killed, killed before the report or
// while it is made, ends killedTimeout after the kill: the next hook waits
// for it, and must not wait through an outage (the client's retries, up to
// reportAttemptTimeout) and start too late.
func TestReportOfAKilledHookIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name   string
		during bool // killed while the first attempt is made
	}{{"killed before", false}, {"killed during", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			if !tc.during {
				cancel(errSuperseded)
			}
			f := &fakeReporter{answer: func(actx context.Context, _ int) error {
				if tc.during {
					cancel(errSuperseded)
				}
				<-actx.Done() // the coordinator does not answer
				return status.Error(codes.Unavailable, "connection refused")
			}}
			r, logs := testReporter(f)
			r.attemptTimeout, r.killedTimeout = time.Hour, time.Millisecond
			within(t, "the report of the killed hook", func() { r.report(ctx, "snap-1", savedResult) })

			if f.calls != 1 || f.ended[0] != nil {
				t.Errorf("%d attempts (the first's context: %v), want 1 under a live context", f.calls, f.ended[0])
			}
			if !strings.Contains(logs.String(), `msg="report abandoned" snapshot_id=snap-1 outcome=SAVED attempts=1`) {
				t.Errorf("the end of the report is not logged:\n%s", logs)
			}
		})
	}
}

// within runs f, failing the test unless it returns within 10 s: for calls
// that must not wait for a hook or a report (without the bound, they would
// wait a minute or more).
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still waits after 10 s", what)
	}
}
