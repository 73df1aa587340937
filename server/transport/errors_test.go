package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/snapcoord/snapcoord/server/engine"
)

func TestToStatusMapsEveryKind(t *testing.T) {
	tests := []struct {
		kind error
		want codes.Code
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
	if len(tests) != len(kindCodes) {
		t.Fatalf("table has %d kinds, test covers %d: add the new kind here", len(kindCodes), len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.want.String(), func(t *testing.T) {
			msg := fmt.Sprintf("run %q: %v", "r1", tt.kind)
			for _, err := range []error{
				&engine.Error{Kind: tt.kind, Msg: msg},
				fmt.Errorf("engine: create: %w", &engine.Error{Kind: tt.kind, Msg: msg}),
			} {
				st := status.Convert(toStatus(t.Context(), discard(), err))
				if st.Code() != tt.want || st.Message() != msg {
					t.Errorf("toStatus(%v) = %v %q, want %v %q", err, st.Code(), st.Message(), tt.want, msg)
				}
			}
		})
	}
}

// A bare kind under wrapping text must not show that text: only an
// engine.Error's Msg is written for clients.
func TestToStatusBareKindHidesWrapping(t *testing.T) {
	err := fmt.Errorf("bolt: /var/lib/secret: %w", engine.ErrNotFound)
	st := status.Convert(toStatus(t.Context(), discard(), err))
	if st.Code() != codes.NotFound || st.Message() != engine.ErrNotFound.Error() {
		t.Errorf("got %v %q, want NotFound %q", st.Code(), st.Message(), engine.ErrNotFound.Error())
	}
}

func TestToStatusUnknownErrorIsInternalAndLogged(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	secret := errors.New("bbolt: page 42 corrupt at /srv/snapcoord/data/snapcoord.db")
	for _, err := range []error{secret, fmt.Errorf("commit: %w", secret), &engine.Error{Msg: "no kind"}} {
		logs.Reset()
		st := status.Convert(toStatus(t.Context(), log, err))
		if st.Code() != codes.Internal || st.Message() != "internal error" {
			t.Errorf("toStatus(%v) = %v %q, want Internal %q", err, st.Code(), st.Message(), "internal error")
		}
		if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), err.Error()) {
			t.Errorf("log = %q, want an ERROR line with %q", logs.String(), err.Error())
		}
	}
}

func TestToStatusContextErrors(t *testing.T) {
	tests := []struct {
		err  error
		want codes.Code
	}{
		{context.Canceled, codes.Canceled},
		{fmt.Errorf("wait for commit: %w", context.Canceled), codes.Canceled},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{fmt.Errorf("wait for commit: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
	}
	for _, tt := range tests {
		st := status.Convert(toStatus(t.Context(), discard(), tt.err))
		if st.Code() != tt.want || strings.Contains(st.Message(), "commit") {
			t.Errorf("toStatus(%v) = %v %q, want %v without the wrapping text", tt.err, st.Code(), st.Message(), tt.want)
		}
	}
}

func TestToStatusPassesSendErrorsThrough(t *testing.T) {
	sendErr := status.Error(codes.Unavailable, "transport is closing")
	err := fmt.Errorf("watch: %w", sendError{sendErr})
	if got := toStatus(t.Context(), discard(), err); got != sendErr {
		t.Errorf("toStatus = %v, want the Send error unchanged", got)
	}
}

func TestToStatusNil(t *testing.T) {
	if err := toStatus(t.Context(), discard(), nil); err != nil {
		t.Errorf("toStatus(nil) = %v", err)
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// A Reason reaches the client as google.rpc.ErrorInfo next to the code.
func TestToStatusCarriesReason(t *testing.T) {
	err := fmt.Errorf("heartbeat: %w", &engine.Error{Kind: engine.ErrFailedPrecondition, Msg: "incarnation: 1 is not current",
		Reason: engine.ReasonWorkerSuperseded})
	st := status.Convert(toStatus(t.Context(), discard(), err))
	if st.Code() != codes.FailedPrecondition || st.Message() != "incarnation: 1 is not current" {
		t.Fatalf("got %v %q", st.Code(), st.Message())
	}
	details := st.Details()
	info, ok := details[0].(*errdetails.ErrorInfo)
	if len(details) != 1 || !ok || info.Reason != engine.ReasonWorkerSuperseded || info.Domain != ErrorDomain {
		t.Fatalf("details %v, want one ErrorInfo %s in %s", details, engine.ReasonWorkerSuperseded, ErrorDomain)
	}
	if got := status.Convert(toStatus(t.Context(), discard(), &engine.Error{Kind: engine.ErrNotFound, Msg: "m"})); len(got.Details()) != 0 {
		t.Fatalf("an error without a reason got details %v", got.Details())
	}
}

// A change whose commit is unconfirmed reaches the client as UNAVAILABLE
// with reason OUTCOME_UNKNOWN (which Reason reads back); NOT_LEADER stays
// the answer of a call refused before it did anything.
func TestOutcomeUnknownAndNotLeaderAreTold(t *testing.T) {
	err := toStatus(t.Context(), discard(), fmt.Errorf("trigger: %w", &engine.Error{Kind: engine.ErrUnavailable,
		Msg: "the change may still take effect", Reason: engine.ReasonOutcomeUnknown}))
	if st := status.Convert(err); st.Code() != codes.Unavailable || Reason(err) != "OUTCOME_UNKNOWN" {
		t.Fatalf("got %v, reason %q; want UNAVAILABLE OUTCOME_UNKNOWN", err, Reason(err))
	}
	if r := Reason(NotLeader("10.0.0.2:7070")); r != "NOT_LEADER" {
		t.Fatalf("NotLeader's reason = %q", r)
	}
	if r := Reason(status.Error(codes.Unavailable, "draining")); r != "" {
		t.Fatalf("a status without ErrorInfo has reason %q", r)
	}
}

// methodStream names the method of a fake server call.
type methodStream struct {
	grpc.ServerTransportStream
	method string
}

func (s methodStream) Method() string { return s.method }

// A unary call's work ends a tenth of its time (at most a second) before
// the caller's deadline, so that the caller hears the server's answer; a
// long poll keeps its whole deadline, and a call without one stays without.
func TestAnswerInTimeLeavesTheAnswerTimeToArrive(t *testing.T) {
	call := func(method string, timeout time.Duration) (time.Duration, bool) {
		ctx := grpc.NewContextWithServerTransportStream(t.Context(), methodStream{method: method})
		var cancel context.CancelFunc = func() {}
		if timeout > 0 {
			ctx, cancel = context.WithTimeout(ctx, timeout)
		}
		defer cancel()
		want, _ := ctx.Deadline()
		ctx, done := answerInTime(ctx)
		defer done()
		got, ok := ctx.Deadline()
		return want.Sub(got), ok
	}
	trigger, poll := "/snapcoord.v1.RunService/TriggerDeadline", "/snapcoord.v1.WorkerService/PollCommands"
	for _, tt := range []struct {
		method   string
		timeout  time.Duration
		min, max time.Duration
	}{
		{trigger, 2 * time.Second, 150 * time.Millisecond, 200 * time.Millisecond},
		{trigger, time.Minute, time.Second, time.Second},
		{poll, time.Minute, 0, 0},
	} {
		margin, ok := call(tt.method, tt.timeout)
		if !ok || margin < tt.min || margin > tt.max {
			t.Errorf("%s with %v: answers %v before the deadline; want %v..%v", tt.method, tt.timeout, margin, tt.min, tt.max)
		}
	}
	if _, ok := call(trigger, 0); ok {
		t.Error("a call without a deadline got one")
	}
}
