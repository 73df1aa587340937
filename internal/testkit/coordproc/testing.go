package coordproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// Build compiles cmd/snapcoord into dir with the go build flags (-race
// when the tests run with it). Test binaries call it once, from TestMain.
func Build(dir string, flags ...string) (string, error) {
	bin := filepath.Join(dir, "snapcoord")
	args := append(append([]string{"build"}, flags...), "-o", bin, "github.com/snapcoord/snapcoord/cmd/snapcoord")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return bin, nil
}

// ForTest starts cfg for t (LogPath defaults to a file in t.TempDir()). At
// cleanup a coordinator still running is killed, and the log of a failed
// test is printed, so that it outlives the temporary directory.
func ForTest(t testing.TB, cfg Config) *Proc {
	t.Helper()
	if cfg.LogPath == "" {
		cfg.LogPath = filepath.Join(t.TempDir(), "snapcoord.log")
	}
	p, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start the coordinator: %v", err)
	}
	p.cleanupFor(t)
	return p
}

// RestartForTest is Restart for t, with ForTest's cleanup.
func (p *Proc) RestartForTest(t testing.TB) *Proc {
	t.Helper()
	return p.RestartAtForTest(t, p.Addr)
}

// RestartAtForTest is RestartAt for t, with ForTest's cleanup.
func (p *Proc) RestartAtForTest(t testing.TB, addr string) *Proc {
	t.Helper()
	q, err := p.RestartAt(context.Background(), addr)
	if err != nil {
		t.Fatalf("restart the coordinator: %v", err)
	}
	q.cleanupFor(t)
	return q
}

func (p *Proc) cleanupFor(t testing.TB) {
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.kill()
		}
		if t.Failed() {
			t.Logf("coordinator log %s:\n%s", p.cfg.LogPath, p.Log())
		}
	})
}

// Race reports whether the log holds a race detector report.
func (p *Proc) Race() bool { return strings.Contains(p.Log(), "WARNING: DATA RACE") }

// Main is TestMain for a package whose tests run the binary: it builds it
// (with the go build flags) into a temporary directory, sets *bin, runs the
// tests, and fails them if goroutines outlive them. It returns the exit
// code.
func Main(m *testing.M, bin *string, flags ...string) int {
	dir, err := os.MkdirTemp("", "snapcoord-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if *bin, err = Build(dir, flags...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	// A stream, poll or timer goroutine still running after every server
	// and client was shut down is a delivery bug (or a test that forgot to
	// stop a worker), as grpc-go's own tests hold.
	if err := goleak.Find(); code == 0 && err != nil {
		fmt.Fprintf(os.Stderr, "goroutines leaked: %v\n", err)
		code = 1
	}
	return code
}
