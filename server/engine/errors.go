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

// ReasonOutcomeUnknown is the Reason (kind ErrUnavailable) of a call whose
// change was handed to the store but whose commit was not confirmed when the
// call had to be answered: its context ended first (the caller's deadline, or
// the term ended as the coordinator lost its leadership) or the store failed
// without saying whether the write applied (an etcd transaction whose answer
// was lost). The change may still take effect. Unlike NOT_LEADER (refused
// before anything was done), only a call that is safe to repeat may be
// repeated blindly; the repeat answers what the first attempt did.
const ReasonOutcomeUnknown = "OUTCOME_UNKNOWN"

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
