package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Hook exit statuses (docs/sidecar.md): 0 saved, these two,
// anything else an I/O error; a hook killed at its deadline timed out.
const (
	hookExitSkipped   = 3
	hookExitInvariant = 4
)

// hook is one run of a user command through /bin/sh -c.
type hook struct {
	cmdline string
	env     []string  // added to the sidecar's environment
	killAt  time.Time // zero: no deadline
	stdout  io.Writer
	stderr  io.Writer
}

// hookResult is what the sidecar reports.
type hookResult struct {
	outcome v1.SnapshotOutcome
	took    time.Duration
	message string
}

// killGrace is how long the hook's output may still drain after a kill, or
// after the hook exited: a process it started that holds the pipe must not
// hold the sidecar.
const killGrace = 2 * time.Second

// killed is the cause a hook's context is cancelled with when the sidecar
// kills it before its end: what to report for it.
type killed struct {
	outcome v1.SnapshotOutcome
	message string
}

func (k *killed) Error() string { return k.message }

// Why the sidecar kills a hook, besides its deadline; any other end of the
// context is the sidecar shutting down. A hook killed because the run
// stopped is only logged: the coordinator takes no report after a Stop.
var (
	errSuperseded = &killed{v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED, "hook killed: superseded by the deadline snapshot"}
	errOvertaken  = &killed{v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT, "hook killed: the coordinator issued a newer snapshot (this one had timed out)"}
	errRunStopped = &killed{v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, "hook killed: the run stopped"}
)

// run runs the hook. At killAt, or when ctx ends, its whole process group
// is killed: the shell and whatever it started.
func (h hook) run(ctx context.Context) hookResult {
	if res, late := h.tooLate(time.Now()); late {
		return res
	}
	hctx, cancel := ctx, context.CancelFunc(func() {})
	if !h.killAt.IsZero() {
		hctx, cancel = context.WithDeadlineCause(ctx, h.killAt, &killed{v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT,
			"hook killed at its deadline " + h.killAt.UTC().Format(time.RFC3339)})
	}
	defer cancel()
	tail := &tailWriter{max: 1024}
	cmd := exec.CommandContext(hctx, "/bin/sh", "-c", h.cmdline)
	cmd.Env = append(hookBaseEnv(), h.env...)
	cmd.Stdout, cmd.Stderr = h.stdout, io.MultiWriter(h.stderr, tail)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = killGrace
	began := time.Now()
	err := cmd.Run()
	res := hookResult{took: time.Since(began)}
	res.outcome, res.message = classify(err, cmd.ProcessState != nil && cmd.ProcessState.Success(), hctx)
	if msg := tail.String(); msg != "" && res.outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		res.message += ": " + msg
	}
	return res
}

// tooLate reports a hook whose killAt has passed when it would start: a
// SaveAtDeadline that arrived after its must_finish_by (held up by an
// outage, say). Started, it would be killed at once and reported as if it
// had run out of time; saying it never ran tells the operator where the
// time went.
func (h hook) tooLate(now time.Time) (hookResult, bool) {
	if h.killAt.IsZero() || now.Before(h.killAt) {
		return hookResult{}, false
	}
	return hookResult{outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT, message: fmt.Sprintf(
		"hook not started: the command arrived after its must_finish_by %s (it would have started at %s)",
		h.killAt.UTC().Format(timeMillis), now.UTC().Format(timeMillis))}, true
}

// timeMillis shows the times of a hook that was not started to the
// millisecond: a command late by less than a second must not read as on time.
const timeMillis = "2006-01-02T15:04:05.000Z07:00"

// heldOutput is the message of a hook that exited 0 while a process it
// started still held its output: the reported duration includes the wait.
var heldOutput = fmt.Sprintf("hook exited 0, but a process it started kept its output open: "+
	"the sidecar stopped reading it after %s, included in the duration", killGrace)

// classify maps how the hook ended to a snapshot outcome. exited0: the
// shell exited with status 0; hctx is the context it ran under.
func classify(err error, exited0 bool, hctx context.Context) (v1.SnapshotOutcome, string) {
	var k *killed
	switch {
	case err == nil:
		return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, ""
	case errors.Is(err, exec.ErrWaitDelay) && exited0:
		// The hook exited on its own (a kill is reported instead of
		// ErrWaitDelay) and saved; only the output's end was not seen.
		return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, heldOutput
	case hctx.Err() == nil:
		return byExitStatus(err)
	case errors.As(context.Cause(hctx), &k):
		return k.outcome, k.message
	}
	return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, "hook killed: the sidecar is shutting down"
}

// byExitStatus maps the status of a hook that ended on its own.
func byExitStatus(err error) (v1.SnapshotOutcome, string) {
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr) && exitErr.ExitCode() == hookExitSkipped:
		return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED, "hook exit status 3: nothing to save"
	case errors.As(err, &exitErr) && exitErr.ExitCode() == hookExitInvariant:
		return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_INVARIANT_FAILURE, "hook exit status 4: invariant failure"
	}
	return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, "hook failed: " + err.Error()
}

// hookBaseEnv is the sidecar's environment without its credentials: a hook
// needs no token, so it gets none.
func hookBaseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "SNAPCOORD_TOKEN", "SNAPCOORD_RUN_TOKEN":
			continue
		}
		out = append(out, kv)
	}
	return out
}

// tailWriter keeps the last max bytes written, for the report's message
// (which the API bounds at 4096 characters).
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = t.buf[over:]
	}
	return len(p), nil
}

func (t *tailWriter) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(strings.Fields(strings.ToValidUTF8(string(t.buf), "?")), " ")
}

// snapshotEnv is what a snapshot hook learns about its snapshot.
func snapshotEnv(s snapshotOrder) []string {
	mustFinish := ""
	if !s.mustFinishBy.IsZero() {
		mustFinish = s.mustFinishBy.UTC().Format(time.RFC3339)
	}
	return []string{
		"SNAPCOORD_SNAPSHOT_ID=" + s.id,
		"SNAPCOORD_REASON=" + s.reason,
		fmt.Sprintf("SNAPCOORD_ANCHOR_STEP=%d", s.anchorStep),
		fmt.Sprintf("SNAPCOORD_FORCED=%t", s.forced),
		fmt.Sprintf("SNAPCOORD_BACKSTOP=%t", s.backstop),
		"SNAPCOORD_MUST_FINISH_BY=" + mustFinish,
	}
}
