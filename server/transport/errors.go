package transport

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/snapcoord/snapcoord/internal/apifacts"
	"github.com/snapcoord/snapcoord/server/engine"
)

// ErrInternal is what a client sees for any failure the server did not
// anticipate: a fixed message, so no internal detail ever leaves the process.
var ErrInternal = status.Error(codes.Internal, "internal error")

// kindCodes is the one table from engine error kinds to status codes.
var kindCodes = []struct {
	kind error
	code codes.Code
}{
	{engine.ErrInvalidArgument, codes.InvalidArgument},
	{engine.ErrNotFound, codes.NotFound},
	{engine.ErrAlreadyExists, codes.AlreadyExists},
	{engine.ErrFailedPrecondition, codes.FailedPrecondition},
	{engine.ErrPermissionDenied, codes.PermissionDenied},
	{engine.ErrResourceExhausted, codes.ResourceExhausted},
	{engine.ErrUnavailable, codes.Unavailable},
	{engine.ErrOutOfRange, codes.OutOfRange},
}

// sendError marks a failure of stream.Send: it is already a gRPC status
// (usually the client went away), not a server fault, so it passes through.
type sendError struct{ err error }

func (e sendError) Error() string { return e.err.Error() }
func (e sendError) Unwrap() error { return e.err }

// toStatus turns an engine error into the status a client sees. Only
// engine.Error messages are shown; anything unexpected is logged here, the
// single place that sees it, and answered with ErrInternal.
func toStatus(ctx context.Context, log *slog.Logger, err error) error {
	if err == nil {
		return nil
	}
	for _, kc := range kindCodes {
		if errors.Is(err, kc.kind) {
			return withReason(status.New(kc.code, safeMessage(err, kc.kind)), err)
		}
	}
	if se, ok := errors.AsType[sendError](err); ok {
		return se.err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, context.Canceled.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, context.DeadlineExceeded.Error())
	}
	method, _ := grpc.Method(ctx)
	log.ErrorContext(ctx, "internal error", "method", method, "err", err)
	return ErrInternal
}

// ErrorDomain is the ErrorInfo domain of the reasons snapcoord gives.
const ErrorDomain = "snapcoord.v1"

// withReason attaches an engine.Error's Reason as google.rpc.ErrorInfo, so
// that clients act on it without parsing the message.
func withReason(st *status.Status, err error) error {
	ee, ok := errors.AsType[*engine.Error](err)
	if !ok || ee.Reason == "" {
		return st.Err()
	}
	if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: ee.Reason, Domain: ErrorDomain}); derr == nil {
		st = d
	}
	return st.Err()
}

// safeMessage returns the engine's client-safe message. A bare kind (not
// inside an *engine.Error) may sit under wrapping text that was never meant
// for clients, so only the kind's own text is shown then.
func safeMessage(err, kind error) string {
	if ee, ok := errors.AsType[*engine.Error](err); ok {
		return ee.Msg
	}
	return kind.Error()
}

// ReasonNotLeader is the ErrorInfo reason of NotLeader: the call was
// refused before it did anything (a follower's gate, a term that had ended,
// a commit the fence refused), so any call may be made again.
const ReasonNotLeader = "NOT_LEADER"

// ReasonOutcomeUnknown is the ErrorInfo reason of an UNAVAILABLE call whose
// change may still take effect (engine.ReasonOutcomeUnknown): only a
// retry_safe call may be repeated blindly, and the repeat answers what the
// first attempt did.
const ReasonOutcomeUnknown = engine.ReasonOutcomeUnknown

// Reason is the ErrorInfo reason of snapcoord's domain in a status error,
// or "".
func Reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// answerMarginMax caps answerInTime's margin.
const answerMarginMax = time.Second

// longCalls are the unary RPCs that wait by design (long polls): they are
// meant to use their whole deadline.
var longCalls = apifacts.Set(apifacts.LongPoll)

// answerInTime ends a unary call's work a tenth of its time (at most
// answerMarginMax) before the caller's deadline, so that the caller hears
// the server's answer rather than its own DEADLINE_EXCEEDED: a change whose
// commit is still waiting then (etcd without quorum, say) is answered
// UNAVAILABLE with ReasonOutcomeUnknown, which tells the client that a
// repeat will resolve it. Long polls keep their whole deadline.
func answerInTime(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if method, _ := grpc.Method(ctx); !ok || longCalls[method] {
		return ctx, func() {}
	}
	margin := min(time.Until(dl)/10, answerMarginMax)
	return context.WithDeadline(ctx, dl.Add(-max(margin, 0)))
}

// OutcomeUnknown is UNAVAILABLE with ReasonOutcomeUnknown: the call's
// change may be stored, and a repeat answers what it did.
func OutcomeUnknown(msg string) error {
	st := status.New(codes.Unavailable, msg)
	d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonOutcomeUnknown, Domain: ErrorDomain})
	if err != nil {
		return st.Err()
	}
	return d.Err()
}

// NotLeader is the answer of a coordinator that does not lead its group to
// a RunService or WorkerService call: UNAVAILABLE, so clients retry, with
// the leader's address (empty while none is known) in the message and in
// ErrorInfo metadata "leader", so that they retry there.
func NotLeader(leader string) error {
	st := status.New(codes.Unavailable, "not the leader; the leader is at "+leader)
	d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonNotLeader, Domain: ErrorDomain, Metadata: map[string]string{"leader": leader}})
	if err != nil {
		return st.Err()
	}
	return d.Err()
}
