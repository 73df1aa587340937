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
