package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// snapshotReporter is the call that reports a snapshot's outcome:
// *client.Worker's, or in tests a fake that fails the way an outage does.
type snapshotReporter interface {
	ReportSnapshot(ctx context.Context, snapshotID string, outcome v1.SnapshotOutcome, took time.Duration, message string) (v1.RunState, error)
}

// Defaults of a reporter.
const (
	// reportRetryInterval is the wait between two attempts. An attempt
	// already holds the client's own retries (Worker.ReportSnapshot retries
	// until the attempt's timeout, waits growing to 5 s), so the wait after
	// it needs no growth of its own; kept short,
	// it adds at most a second to a report's delay once the coordinator is
	// back, well within the grace a restarted coordinator gives reports
	// (--lease-ttl).
	reportRetryInterval = time.Second
	// reportAttemptTimeout bounds one attempt, the client's retries
	// included: a call the coordinator never answers is made again.
	reportAttemptTimeout = 30 * time.Second
	// killedReportTimeout bounds the report of a hook the sidecar killed
	// (superseded, overtaken, or the sidecar leaving), counted from when
	// the killed hook ended (at once, or up to killGrace later if a process
	// it started holds its output): the next hook, or the exit, waits for
	// it (hookRun.kill), and a
	// deadline hook held up for reportAttemptTimeout by an unreachable
	// coordinator would miss B. That report is informational (the
	// coordinator has completed the snapshot, or gets no more reports from
	// a leaving worker), so it is worth a reachable coordinator's answer,
	// not the client's retries through an outage.
	killedReportTimeout = 2 * time.Second
	// reportLogEvery: a long outage logs its failed attempts this rarely.
	reportLogEvery = time.Minute
)

// reporter delivers a hook's outcome to the coordinator, across an outage
// of any length: the coordinator judges a snapshot only after its restart
// grace, so a report that arrives then still counts, while one given up on
// leaves the snapshot TIMEOUT (or fails the run) though the hook saved.
type reporter struct {
	to             snapshotReporter
	log            *slog.Logger
	retryInterval  time.Duration // between attempts
	attemptTimeout time.Duration // of one attempt
	killedTimeout  time.Duration // of the attempt in flight once the hook's context ended
}

func newReporter(to snapshotReporter, log *slog.Logger) *reporter {
	return &reporter{to: to, log: log, retryInterval: reportRetryInterval, attemptTimeout: reportAttemptTimeout,
		killedTimeout: killedReportTimeout}
}

// report sends the outcome of snapshot id until the coordinator
// acknowledges it, as long as it is unreachable (UNAVAILABLE, or an attempt
// timed out) and ctx, the hook's, lasts: ctx ends when the run stops, the
// snapshot is superseded or overtaken or the sidecar leaves, and then
// nobody waits for the report. Any other error is logged and ends it: a
// repeat would only be refused again.
func (r *reporter) report(ctx context.Context, id string, res hookResult) {
	log := r.log.With("snapshot_id", id, "outcome", apifacts.EnumName(res.outcome))
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		again, err := r.attempt(ctx, attempt == 1, id, res)
		switch {
		case err == nil:
			if attempt > 1 {
				log.Info("report delivered", "attempts", attempt)
			}
			return
		case !again:
			log.Warn("report failed", "err", describe(err))
			return
		}
		if time.Since(lastLog) >= reportLogEvery {
			log.Warn("report failed: the coordinator is unreachable; retrying until it answers",
				"attempts", attempt, "err", describe(err))
			lastLog = time.Now()
		}
		select {
		case <-time.After(r.retryInterval):
		case <-ctx.Done():
			// The run stopped, the snapshot was superseded or overtaken or
			// the sidecar is leaving: nobody waits for this report any more.
			log.Warn("report abandoned", "attempts", attempt, "cause", context.Cause(ctx))
			return
		}
	}
}

// attempt makes one report and says whether to try again. The first is made
// even if ctx has ended, and is not cut short at once by its end: a hook
// killed as superseded or by a leaving sidecar is reported, and so is one
// that saved just before SIGTERM. But the sidecar waits for that report, so
// it ends killedTimeout after ctx did. Later attempts end with ctx.
func (r *reporter) attempt(ctx context.Context, first bool, id string, res hookResult) (again bool, err error) {
	parent := ctx
	if first {
		parent = context.WithoutCancel(ctx)
	}
	actx, cancel := context.WithTimeout(parent, r.attemptTimeout)
	defer cancel()
	if first {
		// Once ctx ends, the attempt has killedTimeout left; the timer
		// stops with the attempt.
		stop := context.AfterFunc(ctx, func() {
			t := time.AfterFunc(r.killedTimeout, cancel)
			context.AfterFunc(actx, func() { t.Stop() })
		})
		defer stop()
	}
	_, err = r.to.ReportSnapshot(actx, id, res.outcome, res.took, res.message)
	if err == nil {
		return false, nil
	}
	// DEADLINE_EXCEEDED is retried only as this attempt's own timeout: from
	// the coordinator it would be an answer.
	timedOut := errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
	return status.Code(err) == codes.Unavailable || timedOut, err
}
