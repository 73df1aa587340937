package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/cmd/internal/durations"
)

// Exit statuses, documented in `snapctl help` and docs/snapctl.md.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitConflict    = 4
	exitUnavailable = 5
	exitAuth        = 6
	exitInvalid     = 7
	exitLimit       = 8
	exitRunFailed   = 9
	exitStopHook    = 10
	// exitInterrupted: run watch was stopped by SIGINT or SIGTERM before it
	// saw the run end. One small code next to the others, rather than the
	// shell's 128+signal (130, 143): the table stays one range, and both
	// signals mean the same thing to a script (the run's outcome is unknown).
	exitInterrupted = 11
)

// exitError carries an exit status chosen by the command itself.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withExit(code int, err error) error { return &exitError{code: code, err: err} }

func usageErr(err error) error { return withExit(exitUsage, err) }

// inputErr is bad input that is not a command-line mistake: a YAML file, a
// time, a Slurm variable.
func inputErr(format string, args ...any) error {
	return withExit(exitInvalid, fmt.Errorf(format, args...))
}

// codeExits classifies the coordinator's answers.
var codeExits = map[codes.Code]int{
	codes.NotFound:           exitNotFound,
	codes.AlreadyExists:      exitConflict,
	codes.FailedPrecondition: exitConflict,
	codes.Aborted:            exitConflict,
	codes.Unavailable:        exitUnavailable,
	codes.DeadlineExceeded:   exitUnavailable,
	codes.Unauthenticated:    exitAuth,
	codes.PermissionDenied:   exitAuth,
	codes.InvalidArgument:    exitInvalid,
	codes.OutOfRange:         exitInvalid,
	codes.ResourceExhausted:  exitLimit,
}

// exitCode picks the status for err.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	if ee, ok := errors.AsType[*exitError](err); ok {
		return ee.code
	}
	if st, ok := status.FromError(err); ok {
		if code, ok := codeExits[st.Code()]; ok {
			return code
		}
	}
	return exitFailure
}

// fail prints err (if any) and returns its exit status. gRPC errors are
// shown as "Code: message", without grpc-go's "rpc error: code = " prefix.
func (c *cli) fail(err error) int {
	code := exitCode(err)
	if err != nil {
		msg := describe(err)
		// grpc-go's own words name neither the coordinator nor the bound,
		// nor, once retries ran out of time, what the attempts met.
		if code := status.Code(err); code == codes.DeadlineExceeded || code == codes.Unavailable {
			msg += fmt.Sprintf(" (coordinator %s, --timeout %s", c.conn.addr, durations.Format(c.conn.timeout))
			if last := c.lastUnavailable.lastError(); code == codes.DeadlineExceeded && last != nil {
				msg += "; the last attempt: " + connectCause(status.Convert(client.InWords(last)).Message())
			}
			msg += ")"
		}
		if c.jsonErrors {
			c.printJSONError(msg, code, err)
			return code
		}
		fmt.Fprintf(c.stderr, "snapctl: %s\n", msg)
		if code == exitUsage {
			fmt.Fprintln(c.stderr, "run 'snapctl help' for usage")
		}
	}
	return code
}

// jsonError is an error under -o json: one object on one line, on stderr
// like every error, so that stdout holds only results (a script piping
// `snapctl -o json run get` into jq never reads an error as a run).
type jsonError struct {
	Error      string `json:"error"`               // as the text form says it, without "snapctl: "
	ExitStatus int    `json:"exit_status"`         // the process's exit status
	GRPCCode   string `json:"grpc_code,omitempty"` // the coordinator's answer, when it gave one
}

func (c *cli) printJSONError(msg string, code int, err error) {
	e := jsonError{Error: msg, ExitStatus: code}
	if st, ok := status.FromError(err); ok { // it unwraps
		e.GRPCCode = st.Code().String()
	}
	b, _ := json.Marshal(e) // strings and an int: cannot fail
	fmt.Fprintf(c.stderr, "%s\n", b)
}

// wantsJSONErrors reads -o from the arguments themselves (the last one
// given wins, as in the flag package), so that an error found before -o
// is parsed, such as a bad flag ahead of it, is JSON too.
func wantsJSONErrors(args []string) bool {
	out := ""
	for i, a := range args {
		if a == "--" {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || (name != "o" && name != "output") {
			continue
		}
		if !hasValue && i+1 < len(args) {
			value = args[i+1]
		}
		out = value
	}
	return out == "json"
}

// describe shows a gRPC status as "Code: message" in place of grpc-go's
// "rpc error: code = Code desc = message", keeping any context around it.
func describe(err error) string {
	gs, ok := errors.AsType[interface {
		error
		GRPCStatus() *status.Status
	}](err)
	if !ok || gs.GRPCStatus() == nil {
		return err.Error()
	}
	st := gs.GRPCStatus()
	return strings.Replace(err.Error(), st.Err().Error(), st.Code().String()+": "+st.Message(), 1)
}
