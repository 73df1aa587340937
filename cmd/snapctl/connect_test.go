package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
	"github.com/snapcoord/snapcoord/internal/testkit/fakefollower"
	"github.com/snapcoord/snapcoord/internal/testkit/testpki"
)

// failFastBound is how long a connection that cannot come up may take to
// fail: about two seconds, generous for a busy machine, where the client's
// retries took 20 s and grpc-go's connect timeout alone is 5 s.
const failFastBound = 2 * time.Second

// noPlaintextEnv unsets the SNAPCOORD_PLAINTEXT=1 of server.env: these
// tests are about what snapctl chooses without it.
var noPlaintextEnv = []string{"SNAPCOORD_PLAINTEXT="}

// A connection that never comes up fails at its first attempt, within
// failFastBound, naming the address, the cause and what to change: each
// case against a real loopback listener.
func TestConnectionFailuresFailFast(t *testing.T) {
	plain := startServer(t)
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	other := testpki.NewCA(t, dir, "other-ca")
	cert := ca.Issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	tlsServer := startTLSServer(t, ca, cert)
	closed := closedPort(t)

	for _, tc := range []struct {
		name string
		addr string
		args []string
		want []string // in stderr
	}{
		{"nothing listening", closed, nil,
			[]string{"cannot connect to " + closed, "plaintext (the default for a loopback address)", "connection refused", "Is the coordinator running"}},
		{"TLS client, plaintext coordinator", plain.addr, []string{"--plaintext=false"},
			[]string{"cannot connect to " + plain.addr + " over TLS", "first record does not look like a TLS handshake", "pass --plaintext"}},
		{"TLS client with a CA file, plaintext coordinator", plain.addr, []string{"--ca-file", ca.File},
			[]string{"over TLS", "first record does not look like a TLS handshake", "pass --plaintext"}},
		{"plaintext client by default, TLS coordinator", tlsServer.addr, nil,
			[]string{"cannot connect to " + tlsServer.addr + " over plaintext (the default for a loopback address)", "give --ca-file", "--plaintext=false"}},
		{"plaintext client, TLS coordinator", tlsServer.addr, []string{"--plaintext"},
			[]string{"over plaintext:", "drop --plaintext", "--ca-file"}},
		{"certificate of another CA", tlsServer.addr, []string{"--ca-file", other.File},
			[]string{"over TLS", "certificate signed by unknown authority", "not signed by the CA in --ca-file " + other.File}},
		{"no CA file for a private CA", tlsServer.addr, []string{"--plaintext=false"},
			[]string{"over TLS", "certificate signed by unknown authority", "give --ca-file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"--addr", tc.addr}, append(tc.args, "run", "list")...)
			start := time.Now()
			r := plain.snapctlEnv(noPlaintextEnv, args...)
			took := time.Since(start)
			if r.code != exitUnavailable {
				t.Errorf("snapctl %v: exit %d, want %d\nstderr: %s", args, r.code, exitUnavailable, r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("snapctl %v: stderr lacks %q:\n%s", args, w, r.stderr)
				}
			}
			t.Logf("failed in %v", took)
			if took > failFastBound {
				t.Errorf("snapctl %v took %v to fail, want at most %v", args, took, failFastBound)
			}
		})
	}
	// The same coordinators, told right, answer.
	if r := plain.snapctlEnv(noPlaintextEnv, "run", "list"); r.code != 0 {
		t.Errorf("run list against the plaintext coordinator, no transport flag: exit %d: %s", r.code, r.stderr)
	}
	if r := tlsServer.snapctlEnv(noPlaintextEnv, "run", "list", "--ca-file", ca.File); r.code != 0 {
		t.Errorf("run list against the TLS coordinator with --ca-file: exit %d: %s", r.code, r.stderr)
	}
}

// closedPort is a loopback address where nothing listens: a port the
// kernel handed out and that was closed again.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// Told nothing, snapctl talks plaintext to a loopback address only; any
// TLS flag or variable, or --plaintext=false, means TLS.
func TestTransportDefault(t *testing.T) {
	for _, tc := range []struct {
		addr  string
		env   map[string]string
		flags map[string]bool
		ca    string
		plain bool
	}{
		{addr: "127.0.0.1:7070", plain: true},
		{addr: "127.1.2.3:7070", plain: true},
		{addr: "[::1]:7070", plain: true},
		{addr: "localhost:7070", plain: true},
		{addr: "coordinator.example:7070", plain: false},
		{addr: "10.0.0.7:7070", plain: false},
		{addr: "127.0.0.1:7070,127.0.0.1:7071", plain: true},
		{addr: "127.0.0.1:7070,10.0.0.7:7070", plain: false}, // every address of a list must be loopback
		{addr: "127.0.0.1:7070", ca: "ca.pem", plain: false},
		{addr: "127.0.0.1:7070", env: map[string]string{"SNAPCOORD_PLAINTEXT": "false"}, plain: false},
		{addr: "127.0.0.1:7070", flags: map[string]bool{"plaintext": true}, plain: false}, // --plaintext=false
	} {
		c := &cli{
			env:  env{lookup: func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }},
			conn: connConfig{addr: tc.addr, caFile: tc.ca}, setFlags: tc.flags,
		}
		if _, err := c.transport(); err != nil {
			t.Fatalf("transport for %+v: %v", tc, err)
		}
		if c.conn.plainInUse != tc.plain {
			t.Errorf("%s, env %v, flags %v, CA %q: plaintext %v, want %v", tc.addr, tc.env, tc.flags, tc.ca, c.conn.plainInUse, tc.plain)
		}
	}
}

// silentPeer is a loopback listener that accepts connections and never
// answers them, as a stopped (SIGSTOP) or hung process's socket does.
func silentPeer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var held []net.Conn // accepted, never answered
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
	})
	return l.Addr().String()
}

// A peer that accepts the connection and never answers fails every
// command within 2 s, those that follow a stream included, saying it did
// not answer: not that it closed the connection, and no TLS advice.
func TestSilentPeerFailsFast(t *testing.T) {
	s := &server{t: t, addr: silentPeer(t)}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"one-shot call", []string{"run", "list"}, "within --connect-timeout 1.5s"},
		{"events --follow", []string{"events", "r1", "--follow"}, "within --connect-timeout 1.5s"},
		{"run watch", []string{"run", "watch", "r1"}, "within --connect-timeout 1.5s"},
		{"over TLS", []string{"--plaintext=false", "run", "get", "r1"}, "within --connect-timeout 1.5s"},
		{"a shorter --timeout", []string{"--timeout", "1s", "run", "list"}, "within --timeout 1s"},
		{"SNAPCOORD_CONNECT_TIMEOUT", []string{"run", "list"}, "within --connect-timeout 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := noPlaintextEnv
			if tc.name == "SNAPCOORD_CONNECT_TIMEOUT" {
				env = append([]string{"SNAPCOORD_CONNECT_TIMEOUT=1s"}, env...)
			}
			start := time.Now()
			r := s.snapctlEnv(env, tc.args...)
			took := time.Since(start)
			want := "cannot connect to " + s.addr + " over "
			if r.code != exitUnavailable || !strings.Contains(r.stderr, want) ||
				!strings.Contains(r.stderr, "it accepted the connection but did not answer "+tc.want) {
				t.Errorf("snapctl %v: exit %d, stderr %q; want %d, %q and that it did not answer %s", tc.args, r.code, r.stderr, exitUnavailable, want, tc.want)
			}
			for _, wrong := range []string{"--ca-file", "closed", "TLS does", "certificate"} {
				if strings.Contains(r.stderr, wrong) {
					t.Errorf("snapctl %v: stderr says %q, which a silent peer is not about:\n%s", tc.args, wrong, r.stderr)
				}
			}
			t.Logf("failed in %v", took)
			if took > 2*time.Second {
				t.Errorf("snapctl %v took %v to fail, want at most 2s", tc.args, took)
			}
		})
	}
}

// unansweringHost is a loopback address whose TCP handshake never
// completes, as a host that is down or behind a firewall that drops
// packets: a listener with a backlog of 0, never accepting, whose queue
// one connection fills (Linux then drops the SYNs).
func unansweringHost(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	filler, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { filler.Close() })
	return addr
}

// A host that does not complete the TCP handshake is told apart from one
// that accepts and says nothing; over a list, the error names the
// addresses that accepted.
func TestUnansweringHostIsNotCalledSilent(t *testing.T) {
	down, silent := unansweringHost(t), silentPeer(t)
	s := &server{t: t, addr: down}
	for _, tc := range []struct{ addr, want string }{
		{down, "no TCP connection within --connect-timeout 1.5s: the host does not answer"},
		{down + "," + silent, silent + " accepted the connection but did not answer within --connect-timeout 1.5s"},
	} {
		start := time.Now()
		r := s.snapctlEnv(noPlaintextEnv, "--addr", tc.addr, "run", "list")
		if took := time.Since(start); r.code != exitUnavailable || !strings.Contains(r.stderr, tc.want) || took > 2*time.Second {
			t.Errorf("--addr %s: exit %d after %v, stderr %q; want %d within 2s and %q", tc.addr, r.code, took, r.stderr, exitUnavailable, tc.want)
		}
	}
}

// hungHealth answers the HTTP/2 handshake (a real gRPC server) but no
// health check: a coordinator whose process is wedged past its transport.
type hungHealth struct {
	healthpb.UnimplementedHealthServer
}

func (hungHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A peer that made the connection but answers no call fails at connect
// too, within 2 s, even for a command that then follows a stream.
func TestPeerThatAnswersNoCallFailsFast(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hungHealth{})
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()

	s := &server{t: t, addr: l.Addr().String()}
	for _, args := range [][]string{{"run", "list"}, {"events", "r1", "--follow"}} {
		start := time.Now()
		r := s.snapctlEnv(noPlaintextEnv, args...)
		took := time.Since(start)
		want := "it answered the connection but not a health check within --connect-timeout 1.5s"
		if r.code != exitUnavailable || !strings.Contains(r.stderr, want) {
			t.Errorf("snapctl %v: exit %d, stderr %q; want %d and %q", args, r.code, r.stderr, exitUnavailable, want)
		}
		if took > 2*time.Second {
			t.Errorf("snapctl %v took %v to fail, want at most 2s", args, took)
		}
	}
}

// snapctl pointed at the coordinator's metrics port (HTTP/1.1) says so
// and names the gRPC address to give, not TLS.
func TestMetricsPortNamed(t *testing.T) {
	p := coordproc.ForTest(t, coordproc.Config{Bin: bin.snapcoord, DataDir: t.TempDir(), Metrics: true})
	s := &server{t: t, addr: p.MetricsAddr}
	r := s.snapctlEnv(noPlaintextEnv, "run", "list")
	for _, want := range []string{"cannot connect to " + p.MetricsAddr, "speaks HTTP/1.1, not gRPC", "--metrics-listen", "gRPC --listen address"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if r.code != exitUnavailable || strings.Contains(r.stderr, "--ca-file") {
		t.Errorf("exit %d, stderr %q; want %d and no TLS advice", r.code, r.stderr, exitUnavailable)
	}
}

// The sidecar rides out a coordinator that does not answer yet (it keeps
// trying until --timeout), but says within the connect bound why it waits.
func TestSidecarSaysItsPeerIsSilent(t *testing.T) {
	s := &server{t: t, addr: silentPeer(t)}
	start := time.Now()
	p := startProc(t, s.env("SNAPCOORD_PLAINTEXT="), bin.snapctl, "sidecar", "--run", "r1", "--run-token", "tok",
		"--on-snapshot", "true", "--timeout", "30s")
	p.waitFor(t, "the warning", func(out string) bool { return strings.Contains(out, "it accepted the connection but did not answer") })
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the sidecar said so after %v, want within 2s", took)
	}
	if !strings.Contains(p.out.String(), "still trying until --timeout 30s") {
		t.Errorf("the warning does not say the sidecar keeps trying:\n%s", p.out.String())
	}
}

// A call that times out once connected says which coordinator and which
// bound, which grpc-go's "context deadline exceeded" does not.
func TestTimeoutErrorNamesCoordinator(t *testing.T) {
	var stderr strings.Builder
	c := &cli{env: env{stderr: &stderr}, conn: connConfig{addr: "coord.example:7070", timeout: 3 * time.Second}}
	err := fmt.Errorf("list runs: %w", status.Error(codes.DeadlineExceeded, "context deadline exceeded"))
	if code := c.fail(err); code != exitUnavailable {
		t.Errorf("exit %d, want %d", code, exitUnavailable)
	}
	want := "snapctl: list runs: DeadlineExceeded: context deadline exceeded (coordinator coord.example:7070, --timeout 3s)\n"
	if stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
}

// unavailableRuns answers ListRuns UNAVAILABLE, as a coordinator does
// while it shuts down, and counts the attempts.
type unavailableRuns struct {
	v1.UnimplementedRunServiceServer
	calls atomic.Int32
}

func (u *unavailableRuns) ListRuns(context.Context, *v1.ListRunsRequest) (*v1.ListRunsResponse, error) {
	u.calls.Add(1)
	return nil, status.Error(codes.Unavailable, "coordinator is shutting down")
}

// Once connected, UNAVAILABLE is transient (a coordinator restarting) and
// retried until --timeout; the error then says what the attempts met.
func TestUnavailableAfterConnectIsRetried(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, runs := grpc.NewServer(), &unavailableRuns{}
	v1.RegisterRunServiceServer(srv, runs)
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()

	s := &server{t: t, addr: l.Addr().String()}
	start := time.Now()
	r := s.snapctlEnv(noPlaintextEnv, "run", "list", "--timeout", "2s")
	took := time.Since(start)
	want := "(coordinator " + s.addr + ", --timeout 2s; the last attempt: coordinator is shutting down)"
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "DeadlineExceeded") || !strings.Contains(r.stderr, want) {
		t.Errorf("exit %d, stderr %q; want %d, DeadlineExceeded and %q", r.code, r.stderr, exitUnavailable, want)
	}
	if n := runs.calls.Load(); n < 2 || took < 2*time.Second || took > 2*time.Second+failFastBound {
		t.Errorf("%d attempts in %v, want several within --timeout 2s", n, took)
	}
}

// Given several addresses, snapctl talks to the leader among them; a list
// of followers only, or a follower's one address, fails at once, quoting a
// follower's answer, which names the leader the list lacks. The followers are stand-ins
// (internal/testkit/fakefollower) answering as a coordinator that is not the
// leader does.
func TestAddressListFindsTheLeader(t *testing.T) {
	s := startServer(t)
	f1 := fakefollower.Start(t, fakefollower.Options{Leader: "10.1.2.3:7070"})
	f2 := fakefollower.Start(t, fakefollower.Options{Leader: "10.1.2.3:7070"})
	s.turnRun("listed")
	out := s.ok("--addr", f1.Addr()+","+s.addr, "run", "list")
	if !strings.Contains(out, "listed") {
		t.Errorf("run list through [follower, leader]: %q lacks the run", out)
	}

	for _, list := range []string{f1.Addr() + "," + f2.Addr(), f1.Addr()} {
		start := time.Now()
		r := s.wantExit(exitUnavailable, "--addr", list, "run", "list")
		for _, want := range []string{
			"no leader at " + list + ": " + f1.Addr() + " answers",
			"not the leader; the leader is at 10.1.2.3:7070",
			"Add 10.1.2.3:7070 to --addr",
		} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("--addr %s (followers only): stderr lacks %q:\n%s", list, want, r.stderr)
			}
		}
		if took := time.Since(start); took > failFastBound {
			t.Errorf("--addr %s (followers only) took %v to fail, want at most %v", list, took, failFastBound)
		}
	}
}
