package main

import (
	"bytes"
	"crypto/tls"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
	"github.com/snapcoord/snapcoord/internal/testkit/testpki"
)

// The tests run the built binaries: snapctl against a real snapcoord.
var bin struct{ snapcoord, snapctl string }

func TestMain(m *testing.M) {
	os.Exit(coordproc.Main(m, &bin.snapcoord,
		coordproc.Binary{Pkg: "github.com/snapcoord/snapcoord/cmd/snapctl", Path: &bin.snapctl}))
}

// adminToken is every test server's admin token.
const adminToken = "test-admin-token"

// baseEnv is the test process's environment without SNAPCOORD_* and
// SLURM_* (a developer's own settings must not leak in), in a time zone
// that is not UTC, so that "local time with the zone" shows.
func baseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SNAPCOORD_") || strings.HasPrefix(kv, "SLURM_") || strings.HasPrefix(kv, "TZ=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "TZ=Europe/Paris")
}

// server is a snapcoord process on a free loopback port.
type server struct {
	t       *testing.T
	addr    string
	coord   *coordproc.Proc
	dataDir string // the coordinator's --data-dir
}

// startServer starts snapcoord serve with flags added to the tests' own.
func startServer(t *testing.T, flags ...string) *server {
	t.Helper()
	return startServerWith(t, nil, flags...)
}

// startTLSServer serves TLS with cert, issued by ca.
func startTLSServer(t *testing.T, ca *testpki.CA, cert testpki.Leaf) *server {
	t.Helper()
	creds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12})
	return startServerWith(t, creds, "--tls-cert", cert.CertFile, "--tls-key", cert.KeyFile)
}

func startServerWith(t *testing.T, creds credentials.TransportCredentials, flags ...string) *server {
	t.Helper()
	dataDir := t.TempDir()
	p := coordproc.ForTest(t, coordproc.Config{Bin: bin.snapcoord, DataDir: dataDir, Creds: creds,
		Env: []string{"SNAPCOORD_ADMIN_TOKEN=" + adminToken},
		Args: append([]string{"--metrics-listen", "", "--log-format", "json", "--heartbeat-interval", "200ms", "--lease-ttl", "1s"},
			flags...)})
	return &server{t: t, addr: p.Addr, coord: p, dataDir: dataDir}
}

// env is what snapctl sees: this server, plaintext, the admin token.
func (s *server) env(extra ...string) []string {
	return append(baseEnv(), append([]string{
		"SNAPCOORD_ADDR=" + s.addr, "SNAPCOORD_PLAINTEXT=1", "SNAPCOORD_TOKEN=" + adminToken,
	}, extra...)...)
}

// result is one finished snapctl invocation.
type result struct {
	stdout, stderr string
	code           int
}

// snapctl runs snapctl to completion with the server's environment.
func (s *server) snapctl(args ...string) result {
	s.t.Helper()
	return s.snapctlEnv(nil, args...)
}

func (s *server) snapctlEnv(extraEnv []string, args ...string) result {
	s.t.Helper()
	cmd := exec.Command(bin.snapctl, args...)
	cmd.Env = s.env(extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		s.t.Fatalf("snapctl %v: %v", args, err)
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}

// ok runs snapctl and fails the test unless it exits 0.
func (s *server) ok(args ...string) string {
	s.t.Helper()
	r := s.snapctl(args...)
	if r.code != 0 {
		s.t.Fatalf("snapctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// wantExit runs snapctl and checks its exit status.
func (s *server) wantExit(code int, args ...string) result {
	s.t.Helper()
	r := s.snapctl(args...)
	if r.code != code {
		s.t.Errorf("snapctl %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, code, r.stdout, r.stderr)
	}
	return r
}

// createRun runs `snapctl run create` and returns the run token from its
// eval-able output.
func (s *server) createRun(runID string, flags ...string) string {
	s.t.Helper()
	out := s.ok(append([]string{"run", "create", runID}, flags...)...)
	m := regexp.MustCompile(`(?m)^export SNAPCOORD_RUN_TOKEN='([^']+)'$`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "export SNAPCOORD_RUN_ID='"+runID+"'\n") {
		s.t.Fatalf("run create printed %q, want export lines for eval", out)
	}
	return m[1]
}

// getJSON runs a snapctl command with -o json into msg.
func (s *server) getJSON(msg proto.Message, args ...string) {
	s.t.Helper()
	out := s.ok(append(args, "-o", "json")...)
	if err := protojson.Unmarshal([]byte(out), msg); err != nil {
		s.t.Fatalf("snapctl %v -o json printed %q: %v", args, out, err)
	}
}

// proc is a background process whose output tests wait on.
type proc struct {
	cmd  *exec.Cmd
	out  *logsink.Buffer // stdout and stderr
	done chan struct{}
}

func startProc(t *testing.T, env []string, name string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(name, args...), out: &logsink.Buffer{}, done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("output of %s:\n%s", filepath.Base(name), p.out.String())
		}
	})
	return p
}

// waitFor polls the process's output (a real process's output: no other
// way to wait on it) until cond holds, for at most 15 s.
func (p *proc) waitFor(t *testing.T, what string, cond func(out string) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond(p.out.String()) {
		select {
		case <-p.done:
			if cond(p.out.String()) {
				return
			}
			t.Fatalf("process exited before %s:\n%s", what, p.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s:\n%s", what, p.out.String())
		}
	}
}

// exitCode waits for the process to exit, at most 15 s.
func (p *proc) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(15 * time.Second):
		t.Fatalf("process still running after 15 s:\n%s", p.out.String())
	}
	return -1
}
