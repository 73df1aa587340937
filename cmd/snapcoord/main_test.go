package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/snapcoord/snapcoord/internal/logsink"
)

// binPath is the snapcoord binary TestMain builds once for the process tests.
var (
	binPath    string
	buildFlags []string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "snapcoord-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binPath = filepath.Join(dir, "snapcoord")
	args := append(append([]string{"build"}, buildFlags...), "-o", binPath, ".")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go %s: %v\n%s", strings.Join(args, " "), err, out)
		return 1
	}
	return m.Run()
}

// serverProc is a `snapcoord serve` process.
type serverProc struct {
	cmd    *exec.Cmd
	logs   *logsink.Watcher
	addr   string
	exited chan struct{} // closed once Wait returned
}

// startServer runs the binary on a free loopback port with dataDir and
// waits until its health service reports SERVING.
func startServer(t *testing.T, dataDir string) *serverProc {
	t.Helper()
	p := &serverProc{logs: logsink.NewWatcher(), exited: make(chan struct{})}
	p.cmd = exec.Command(binPath, "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--data-dir", dataDir, "--log-format", "json")
	p.cmd.Env = envWithoutSnapcoord()
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start: %v", err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	select {
	case p.addr = <-p.logs.Serving():
	case <-p.exited:
		t.Fatalf("server exited before serving: %v\n%s", p.cmd.ProcessState, p.logs)
	case <-time.After(60 * time.Second):
		t.Fatalf("server did not log \"serving\" within 60s:\n%s", p.logs)
	}
	p.waitServing(t)
	return p
}

// waitServing polls the health RPC of the process, a bounded number of times.
func (p *serverProc) waitServing(t *testing.T) {
	t.Helper()
	conn := dial(t, p.addr)
	health := healthpb.NewHealthClient(conn)
	var last error
	for range 200 {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		last = fmt.Errorf("status %v, err %v", resp.GetStatus(), err)
		select {
		case <-p.exited:
			t.Fatalf("server exited while waiting for SERVING:\n%s", p.logs)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("health never SERVING (last: %v):\n%s", last, p.logs)
}

// stop sends sig and returns the exit code, failing if it takes too long.
func (p *serverProc) stop(t *testing.T, sig os.Signal) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal: %v", err)
	}
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(30 * time.Second):
		t.Fatalf("server still running 30s after %v:\n%s", sig, p.logs)
		return -1
	}
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// envWithoutSnapcoord keeps the developer's SNAPCOORD_* settings out of the
// processes under test.
func envWithoutSnapcoord() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) {
			env = append(env, kv)
		}
	}
	return env
}

func lines(s string) []string {
	var out []string
	// Not bufio.Scanner: it stops without a word at a line over 64 KiB.
	for line := range strings.Lines(s) {
		out = append(out, strings.TrimSuffix(line, "\n"))
	}
	return out
}
