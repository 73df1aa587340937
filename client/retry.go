package client

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// RetryPolicy is how unary calls that are safe to repeat are retried: on
// UNAVAILABLE only (the coordinator is unreachable, restarting or shutting
// down), with exponential backoff and jitter, until MaxAttempts or the
// call's context ends.
//
// A wait ends early when the connection gets a coordinator to send the call
// to (over several addresses: a leader serving; over one: the coordinator
// back up), so a failover or a restart costs a call no more than it takes
// the coordinator to serve again (see pause).
//
// A worker following its commands re-opens its stream (or polls again) with
// the same backoff, but at most 1 s apart, whatever Max says; an event
// watch and Worker.ReportSnapshot wait alike.
//
// Not retried: RESOURCE_EXHAUSTED (a limit such as max runs does not lift
// by itself), DEADLINE_EXCEEDED (the caller's own deadline), and every other
// code, which a repeat would only answer again.
type RetryPolicy struct {
	// MaxAttempts counts the first attempt: 1 disables retries.
	MaxAttempts uint
	// Base is the first wait; each further wait doubles, up to Max.
	Base, Max time.Duration
	// Jitter spreads each wait by ± this fraction, so the ranks of a job
	// that lost the coordinator together do not come back together.
	Jitter float64
	// AttemptTimeout bounds each attempt of a unary call (not a long poll,
	// not a stream), so that a call sent to a coordinator that froze is
	// made again rather than wait out the pause. 0 takes the default's;
	// a negative value leaves attempts unbounded.
	AttemptTimeout time.Duration
}

// DefaultRetryPolicy waits 0.1, 0.2, 0.4 … 5 s between 10 attempts: about
// 20 s, enough to ride out a coordinator restart (a call with a deadline:
// until its deadline). Each attempt may take 10 s: every unary call but
// the long poll is answered in milliseconds by a coordinator that runs
// (an etcd commit included), so 10 s means one that does not, and twice
// the default --election-ttl leaves a slow commit on a loaded etcd alone.
// With several addresses, a call on a frozen leader is cut sooner, the
// moment another coordinator serves as leader (see leaderPolicy).
var DefaultRetryPolicy = RetryPolicy{MaxAttempts: 10, Base: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2,
	AttemptTimeout: 10 * time.Second}

// backoff is the wait before retry number attempt (from 1).
func (p RetryPolicy) backoff(attempt uint) time.Duration {
	return retry.BackoffExponentialWithJitterBounded(p.Base, p.Jitter, p.Max)(context.Background(), attempt)
}

// followMaxWait caps the wait between a worker's attempts to re-open its
// command stream or poll again, whatever the policy's Max: a command issued
// as the coordinator comes back (a deadline that fires then) must reach the
// worker within about a second, not after a wait grown through the outage.
// While the connection is down an attempt fails on the client at once, so
// a short wait costs the coordinator nothing (see dial.go's connectParams).
const followMaxWait = time.Second

// followWait is the wait after failures failed attempts in a row (from 1)
// to follow a worker's commands: the policy's backoff, capped at
// followMaxWait. Below the cap the jitter spreads the workers that lost the
// coordinator together; at it, their phases stay as spread.
func (p RetryPolicy) followWait(failures uint) time.Duration {
	return min(p.backoff(failures), followMaxWait)
}

// retried lists the unary methods the policy applies to: those the API
// declares retry_safe (proto/snapcoord/v1, where each says why a repeat
// after a lost reply does no harm). The Python client reads the same facts.
var retried = apifacts.Set(apifacts.RetrySafe)

// unaryInterceptor retries, with the policy, the unary calls that are safe
// to make again: those in retried on every UNAVAILABLE (OutcomeUnknown
// among them: the repeat answers what the first attempt did), and every
// other call that a follower refused (NotLeader), since it refused it
// before doing anything, so a repeat cannot do twice what was done once.
// Between attempts it waits as pause does: the backoff, cut short when the
// connection gets a coordinator to send the call to; an attempt cut
// because another coordinator took over is made again at once.
//
// Each attempt is bounded (see attempt), so that no call waits on a frozen
// coordinator. A call with a deadline of its own is retried until that
// deadline, however many attempts it takes: a loss of quorum or an
// election may last longer than MaxAttempts' backoffs (about 20 s), and the
// caller said how long it can wait: it then fails DEADLINE_EXCEEDED.
// MaxAttempts bounds the calls without one.
//
// Once an attempt's outcome was unknown, a call that ends without an
// answer from a later attempt (retries run out, or its context ends) fails
// with that OutcomeUnknown error, not the last one: the change may still
// have taken effect, and a bare UNAVAILABLE, NOT_LEADER or
// DEADLINE_EXCEEDED would say otherwise.
func (p RetryPolicy) unaryInterceptor(w *leaderWatch) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		once := p.MaxAttempts <= 1 || slices.ContainsFunc(opts, func(o grpc.CallOption) bool { _, ok := o.(noRetryOption); return ok })
		_, bounded := ctx.Deadline()
		var unknown error // the first attempt whose outcome was unknown
		for attempt := uint(1); ; attempt++ {
			err := p.attempt(ctx, w, method, func(ctx context.Context) error { return invoker(ctx, method, req, reply, cc, opts...) })
			if unknown == nil && OutcomeUnknown(err) {
				unknown = err
			}
			if err == nil || once || (!bounded && attempt >= p.MaxAttempts) || !retriable(method, err) {
				return stillUnknown(unknown, err)
			}
			if leaderMoved(err) {
				continue // the new leader serves: no wait
			}
			if !pause(ctx, cc, p.backoff(attempt)) {
				return stillUnknown(unknown, status.FromContextError(ctx.Err()).Err())
			}
		}
	}
}

// attempt makes one attempt of a unary call, bounded: it is cut when
// another coordinator takes over as leader while it waits on the previous
// one (several addresses), and, unless the method is a long poll, after
// the policy's AttemptTimeout. Either way it fails UNAVAILABLE, which the
// caller's retry resolves.
func (p RetryPolicy) attempt(ctx context.Context, w *leaderWatch, method string, call func(context.Context) error) error {
	actx, r, stop := w.guard(ctx)
	defer stop()
	timeout := p.AttemptTimeout
	if timeout > 0 && !longLived[method] {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeoutCause(actx, timeout, errAttemptTimeout)
		defer cancel()
	}
	err := InWords(cut(ctx, actx, call(actx), timeout, readOnly[method]))
	if _, ok := NotLeader(err); ok {
		w.refused(r)
	}
	return err
}

// errNoLeader is how a call fails that finds no coordinator leading among
// several (each one's health NOT_SERVING), in place of grpc-go's words for
// it ("pickfirst: health check failure: connection active but health
// check failed. status=NOT_SERVING"), which name the balancer, not the
// cause.
var errNoLeader = status.Error(codes.Unavailable,
	"no coordinator leads at the moment (each one answers as a follower): an election is under way, or the coordinators cannot reach etcd")

// InWords replaces grpc-go's words for a call that found no leader among
// several coordinators (the balancer's "health check failure ...
// status=NOT_SERVING") with the cause; any other error is returned as is.
// The client's own calls fail so; it is for errors seen below its retries
// (an interceptor passed to WithDialOptions).
func InWords(err error) error {
	if status.Code(err) == codes.Unavailable && strings.Contains(status.Convert(err).Message(), "health check fail") {
		return errNoLeader
	}
	return err
}

// longLived lists the methods whose calls may rightly stay open long: the
// long poll (PollCommands, bounded by its wait_seconds) and the streams.
var longLived = apifacts.Set(apifacts.LongLived)

// readOnly lists the methods that change nothing: an attempt of one that
// was cut did nothing either.
var readOnly = apifacts.Set(apifacts.ReadOnly)

// retriable reports whether method may be made again after failing with
// err: a retry_safe method after any UNAVAILABLE, any method after
// NOT_LEADER; never after OUTCOME_UNKNOWN unless retry_safe.
func retriable(method string, err error) bool {
	if retried[method] {
		return status.Code(err) == codes.Unavailable
	}
	_, ok := NotLeader(err)
	return ok
}

// stillUnknown is a call's final error err, or unknown (an earlier
// attempt's OutcomeUnknown) if err is no answer that settles it: one that
// says the call did nothing or ended unanswered.
func stillUnknown(unknown, err error) error {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		if unknown != nil {
			return unknown
		}
	}
	return err
}

// pause waits d before a failed attempt is made again, or less: until the
// connection turns READY after it was not, during the wait. READY means a
// coordinator to send calls to: over several addresses, one whose health is
// SERVING, i.e. the leader (leaderServiceConfig); over one address, a
// connection made. So the attempt after a failover or a restart goes out the
// moment a coordinator can answer it, not up to a backoff later (a backoff
// grown through the outage), while attempts during the outage stay as far
// apart as before: pause never waits longer than d, nor makes an attempt
// sooner unless the connection came up. A connection READY throughout (the
// coordinator itself answered UNAVAILABLE: draining, its store failing) waits
// all of d. It reports whether ctx is still live.
//
// Why not grpc.WaitForReady on the next attempt instead: the attempt would
// need a deadline of its own to keep the wait bounded, and that deadline
// would also cut the call short once sent (a long poll, a slow commit); and
// the loops that follow streams and polls are not unary retries.
func pause(ctx context.Context, conn *grpc.ClientConn, d time.Duration) bool {
	waitCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	state := conn.GetState()
	down := state != connectivity.Ready
	for {
		if state == connectivity.Idle {
			conn.Connect() // one address: reconnect now, not at the next attempt
		}
		if !conn.WaitForStateChange(waitCtx, state) {
			return ctx.Err() == nil
		}
		state = conn.GetState()
		if state == connectivity.Ready && down {
			return true
		}
		down = state != connectivity.Ready
	}
}

// noRetry is for the worker helper's periodic calls (heartbeats, polls,
// re-registration): the next tick is their retry, and an interceptor that
// held one for 20 s would delay everything behind it.
var noRetry grpc.CallOption = noRetryOption{}

// noRetryOption marks a call unaryInterceptor makes once; gRPC ignores it.
type noRetryOption struct{ grpc.EmptyCallOption }
