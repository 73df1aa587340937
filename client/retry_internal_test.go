package client

import (
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// After a long outage a worker re-opens its command stream at most a second
// after the coordinator is back, whatever the retry policy's Max, and the
// connection under it reconnects as soon: a deadline that fires just after
// a restart reaches the worker in time.
func TestFollowWaitIsCappedAtASecond(t *testing.T) {
	slow := RetryPolicy{MaxAttempts: 3, Base: 2 * time.Second, Max: time.Minute, Jitter: 0.2}
	for _, p := range []RetryPolicy{DefaultRetryPolicy, slow} {
		for failures := uint(1); failures <= 100; failures++ {
			if w := p.followWait(failures); w <= 0 || w > time.Second {
				t.Fatalf("policy %+v: wait %v after %d failures, want (0, 1s]", p, w, failures)
			}
		}
	}
	// The first retries stay as quick as the policy's.
	if w := DefaultRetryPolicy.followWait(1); w > 120*time.Millisecond {
		t.Errorf("wait %v after one failure, want the policy's 100ms ±20%%", w)
	}
	if d := connectParams.Backoff.MaxDelay; d > time.Second {
		t.Errorf("the connection's reconnect backoff reaches %v, want at most 1s", d)
	}
	// A call waiting through an outage, or a trainer's next step, must be
	// answered within a second of the coordinator serving again: the
	// connection's last wait, jitter included, leaves time for the call.
	b := connectParams.Backoff
	if longest := time.Duration(float64(b.MaxDelay) * (1 + b.Jitter)); longest > 600*time.Millisecond {
		t.Errorf("the connection may wait %v between attempts to reconnect, want at most 0.6s", longest)
	}
}

// Worker.ReportSnapshot repeats its call until answered: the API must
// declare it safe to repeat, in the one list of such calls (internal/apifacts).
func TestReportSnapshotIsDeclaredRetrySafe(t *testing.T) {
	if !retried[v1.WorkerService_ReportSnapshot_FullMethodName] {
		t.Fatal("ReportSnapshot is not retry_safe in proto/snapcoord/v1, yet Worker.ReportSnapshot repeats it")
	}
}
