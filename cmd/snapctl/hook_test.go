package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// A hook that saved and exited 0, leaving a process it started (an upload
// in the background) with its stderr: the snapshot is saved, the sidecar
// says why it took killGrace longer, and the process goes on.
func TestHookLeavingAProcessWithItsOutputSaves(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	res := hook{cmdline: fmt.Sprintf("sleep 60 >/dev/null & echo $! > %s; exit 0", pidFile),
		stdout: io.Discard, stderr: io.Discard}.run(t.Context())
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("background pid: %v", err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })

	if res.outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED || !strings.Contains(res.message, "kept its output open") {
		t.Errorf("hook exited 0: %v %q after %v, want SAVED saying a process kept its output open", res.outcome, res.message, res.took)
	}
	if !alive(pid) {
		t.Errorf("the hook's background process %d was killed", pid)
	}
}

// A SaveAtDeadline that arrives after its must_finish_by is not started:
// killed at once, it would be reported as a hook that ran out of time.
func TestHookPastItsDeadlineIsNotStarted(t *testing.T) {
	ran := filepath.Join(t.TempDir(), "ran")
	killAt := time.Now().Add(-time.Second)
	res := hook{cmdline: "touch " + ran, killAt: killAt, stdout: io.Discard, stderr: io.Discard}.run(t.Context())

	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Errorf("the hook ran (stat: %v)", err)
	}
	wantMsg := "hook not started: the command arrived after its must_finish_by " + killAt.UTC().Format(timeMillis)
	if res.outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT || !strings.HasPrefix(res.message, wantMsg) ||
		!strings.Contains(res.message, "it would have started at ") || res.took != 0 {
		t.Errorf("got %v %q after %v, want TIMEOUT %q… with the start time, after 0s", res.outcome, res.message, res.took, wantMsg)
	}
}
