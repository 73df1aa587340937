package client

import (
	"context"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/snapcoord/snapcoord/rpcfacts"
)

// RetryPolicy is how unary calls that are safe to repeat are retried: on
// UNAVAILABLE only (the coordinator is unreachable, restarting or shutting
// down), with exponential backoff and jitter, until MaxAttempts or the
// call's context ends.
//
// A worker following its commands re-opens its stream (or polls again) with
// the same backoff, but at most 1 s apart, whatever Max says.
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
}

// DefaultRetryPolicy waits 0.1, 0.2, 0.4 … 5 s between 10 attempts: about
// 20 s, enough to ride out a coordinator restart.
var DefaultRetryPolicy = RetryPolicy{MaxAttempts: 10, Base: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}

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
var retried = rpcfacts.Set(rpcfacts.RetrySafe)

// unaryInterceptor applies the policy to the methods in retried only.
func (p RetryPolicy) unaryInterceptor() grpc.UnaryClientInterceptor {
	if p.MaxAttempts <= 1 {
		return passUnary
	}
	r := retry.UnaryClientInterceptor(
		retry.WithMax(p.MaxAttempts),
		retry.WithCodes(codes.Unavailable),
		retry.WithBackoff(retry.BackoffExponentialWithJitterBounded(p.Base, p.Jitter, p.Max)),
	)
	return selector.UnaryClientInterceptor(r, selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return retried[c.FullMethod()]
	}))
}

// notLeaderInterceptor retries, with the policy, the unary calls outside
// retried that a follower refused (NotLeader): it refused them before doing
// anything, so a repeat cannot do twice what was done once. The calls in
// retried are retried on every UNAVAILABLE, NOT_LEADER included, by
// unaryInterceptor.
func notLeaderInterceptor(p RetryPolicy) grpc.UnaryClientInterceptor {
	if p.MaxAttempts <= 1 {
		return passUnary
	}
	r := retry.UnaryClientInterceptor(
		retry.WithMax(p.MaxAttempts),
		retry.WithRetriable(func(err error) bool { _, ok := NotLeader(err); return ok }),
		retry.WithBackoff(retry.BackoffExponentialWithJitterBounded(p.Base, p.Jitter, p.Max)),
	)
	return selector.UnaryClientInterceptor(r, selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return !retried[c.FullMethod()]
	}))
}

func passUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(ctx, method, req, reply, cc, opts...)
}

// noRetry is for the worker helper's periodic calls (heartbeats, polls,
// re-registration): the next tick is their retry, and an interceptor that
// held one for 20 s would delay everything behind it.
var noRetry = retry.Disable()
