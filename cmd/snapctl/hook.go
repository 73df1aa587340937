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

// Hook exit statuses (README.md, "snapctl sidecar"): 0 saved, these two,
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

// killGrace is how long the hook's output may still drain after a kill:
// a grandchild holding the pipe must not hold the sidecar.
const killGrace = 2 * time.Second

// run runs the hook. At killAt, or when ctx ends, its whole process group
// is killed: the shell and whatever it started.
func (h hook) run(ctx context.Context) hookResult {
	hctx, cancel := ctx, context.CancelFunc(func() {})
	if !h.killAt.IsZero() {
		hctx, cancel = context.WithDeadline(ctx, h.killAt)
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
	res.outcome, res.message = classify(err, hctx, ctx, h.killAt)
	if msg := tail.String(); msg != "" && res.outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		res.message += ": " + msg
	}
	return res
}

// classify maps how the hook ended to a snapshot outcome.
func classify(err error, hctx, ctx context.Context, killAt time.Time) (v1.SnapshotOutcome, string) {
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, ""
	case ctx.Err() != nil:
		return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, "hook killed: the sidecar is shutting down"
	case errors.Is(hctx.Err(), context.DeadlineExceeded):
		return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT, "hook killed at its deadline " + killAt.UTC().Format(time.RFC3339)
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
		"SNAPCOORD_MUST_FINISH_BY=" + mustFinish,
	}
}
