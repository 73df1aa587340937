package engine

import (
	"errors"
	"fmt"
)

// Error kinds. The transport maps each kind to one gRPC status code; an error
// of no kind is an internal error whose text is never shown to a client.
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnavailable        = errors.New("unavailable")
	// ErrOutOfRange: a cursor (after_seq) past the end of a run's log. The
	// reader saw a log this coordinator does not have (its state was
	// restored or replaced), so answering nothing would make it skip every
	// new entry until the log caught up; it must start again from 0.
	ErrOutOfRange = errors.New("out of range")
)

// ReasonWorkerSuperseded is the Reason of a call from a worker process whose
// name another process has registered since: that process must stop, not
// register again (two processes would take turns superseding each other).
const ReasonWorkerSuperseded = "WORKER_SUPERSEDED"

// Error is a domain error whose message is safe to show a client: it names
// the field or the object concerned and never carries internal detail.
// Reason, when set, is a machine-readable cause a client acts on.
type Error struct {
	Kind   error
	Msg    string
	Reason string
}

func (e *Error) Error() string { return e.Msg }

// Unwrap lets errors.Is match the kind.
func (e *Error) Unwrap() error { return e.Kind }

func errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}
