// Package coordproc runs the snapcoord binary as a child process, for
// every test and tool that drives the real binary (integration, client,
// cmd/snapcoord and cmd/snapctl tests, snapbench, snapcrash, snapdemo,
// snapuicheck): it builds the binary once for a test package, by the one
// rule of every Go test (-race when the tests run with -race; snapctl's
// tests build snapctl the same way), starts it on a free loopback
// port and a data directory with its log in a file, returns once the health
// service reports SERVING, and stops it with SIGTERM (drain) or SIGKILL
// (crash). It also reads the process's CPU time and resident memory from
// /proc for the measurement tools.
package coordproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Config describes one coordinator.
type Config struct {
	// Bin is the snapcoord binary (see Build).
	Bin string
	// Command is the subcommand; default "serve". It is given --listen,
	// and --data-dir when DataDir is set.
	Command string
	// DataDir is its --data-dir; it survives restarts.
	DataDir string
	// Etcd, with endpoints, runs it on the etcd store (--store etcd)
	// instead of a bbolt file in DataDir. Start then returns once the
	// process serves, leader or follower, unless HealthService asks for
	// leadership.
	Etcd Etcd
	// Addr is the gRPC address; empty picks a free loopback port once, kept
	// across restarts so that clients reconnect to the same address.
	Addr string
	// Metrics serves the metrics listener (and status page) on a free
	// loopback port, kept across restarts (Proc.MetricsAddr). Without it,
	// Args decide (serve's default is 127.0.0.1:7071).
	Metrics bool
	// LogPath receives the process's stdout and stderr (appended).
	LogPath string
	// Args are extra flags; they come last and win.
	Args []string
	// Env is added to this process's environment, from which every
	// SNAPCOORD_* variable is removed first (see CleanEnv).
	Env []string
	// HealthService is the health service Start waits to be SERVING:
	// default "", the whole server. A coordinator on etcd serves
	// snapcoord.v1.RunService only once it is the leader.
	HealthService string
	// StartTimeout bounds the wait for SERVING; default 60 s.
	StartTimeout time.Duration
	// Creds are what the SERVING check connects with when the coordinator
	// serves TLS (--tls-cert); nil is plaintext.
	Creds credentials.TransportCredentials
}

// Etcd is a coordinator's etcd store and election.
type Etcd struct {
	Endpoints []string
	// Prefix is its --etcd-prefix; coordinators on one prefix elect one
	// leader. Empty: serve's default.
	Prefix string
	// ElectionTTL is its --election-ttl; 0: serve's default.
	ElectionTTL time.Duration
}

func (e Etcd) args() []string {
	if len(e.Endpoints) == 0 {
		return nil
	}
	args := []string{"--store", "etcd", "--etcd-endpoints", strings.Join(e.Endpoints, ",")}
	if e.Prefix != "" {
		args = append(args, "--etcd-prefix", e.Prefix)
	}
	if e.ElectionTTL > 0 {
		args = append(args, "--election-ttl", e.ElectionTTL.String())
	}
	return args
}

// Proc is a running (or exited) coordinator.
type Proc struct {
	cfg    Config
	cmd    *exec.Cmd
	exited chan struct{}
	// Addr is where it serves gRPC; MetricsAddr its metrics listener, when
	// Config.Metrics.
	Addr, MetricsAddr string
	// Ready is how long it took from process start to SERVING.
	Ready time.Duration
}

// Start starts the coordinator and returns once its health service answers
// SERVING, or with an error that quotes the end of its log.
func Start(ctx context.Context, cfg Config) (*Proc, error) {
	if cfg.LogPath == "" {
		return nil, errors.New("coordproc: Config.LogPath is required")
	}
	cmd, err := cfg.Cmd(context.Background()) // the process outlives ctx
	if err != nil {
		return nil, err
	}
	log, err := os.OpenFile(cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("coordinator log: %w", err)
	}
	defer log.Close() // the child has its own descriptor
	p := &Proc{cfg: cfg, cmd: cmd, Addr: cfg.Addr, MetricsAddr: cfg.metricsAddr(), exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = log, log
	// Prepared before the start so that it adds nothing to Ready.
	creds := cfg.Creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(cfg.Addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 2 * time.Millisecond, Multiplier: 1, MaxDelay: 2 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	start := time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cfg.Bin, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	if err := p.awaitServing(ctx, conn); err != nil {
		p.kill()
		return nil, fmt.Errorf("%w\n%s", err, p.Tail(30))
	}
	p.Ready = time.Since(start)
	return p, nil
}

// Cmd is the process Start would run for c, not started, its output
// not yet directed: for a test about the raw process, one that must see it
// fail to start, say. It fills in c's defaults and free ports first.
func (c *Config) Cmd(ctx context.Context) (*exec.Cmd, error) {
	if err := c.fill(); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, c.Bin, c.args()...)
	cmd.Env = CleanEnv(c.Env...)
	// A tool that dies takes its coordinator with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd, nil
}

// fill applies the defaults and picks the free ports.
func (c *Config) fill() error {
	if c.StartTimeout <= 0 {
		c.StartTimeout = time.Minute
	}
	if c.Command == "" {
		c.Command = "serve"
	}
	var err error
	if c.Addr == "" {
		if c.Addr, err = FreePort(); err != nil {
			return err
		}
	}
	if c.Metrics && !strings.Contains(strings.Join(c.Args, " "), "--metrics-listen") {
		var addr string
		if addr, err = FreePort(); err != nil {
			return err
		}
		c.Args = append([]string{"--metrics-listen", addr}, c.Args...)
	}
	return nil
}

// metricsAddr is the --metrics-listen that fill chose, if any.
func (c Config) metricsAddr() string {
	if !c.Metrics {
		return ""
	}
	for i, a := range c.Args {
		if a == "--metrics-listen" && i+1 < len(c.Args) {
			return c.Args[i+1]
		}
	}
	return ""
}

func (c Config) args() []string {
	args := []string{c.Command, "--listen", c.Addr}
	if c.DataDir != "" {
		args = append(args, "--data-dir", c.DataDir)
	}
	args = append(args, c.Etcd.args()...)
	return append(args, c.Args...)
}

// awaitServing asks the health service until it says SERVING for
// Config.HealthService. Each check waits for the connection, which retries
// every 2 ms, so the first SERVING is seen within a few milliseconds of the
// process reaching it.
func (p *Proc) awaitServing(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	// A check waiting for the connection returns as soon as the process
	// exits, not at the timeout.
	go func() {
		select {
		case <-p.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	health := healthpb.NewHealthClient(conn)
	for {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: p.cfg.HealthService}, grpc.WaitForReady(true))
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Millisecond):
			continue
		}
		select {
		case <-p.exited: // the exit ended ctx
			return fmt.Errorf("%s exited before serving: %v", p.cfg.Bin, p.cmd.ProcessState)
		default:
			return fmt.Errorf("%s did not report SERVING within %s (last: %v, %v)", p.cfg.Bin, p.cfg.StartTimeout, resp.GetStatus(), err)
		}
	}
}

// Health is what the coordinator's health service says of service: "" the
// process, "snapcoord.v1.RunService" whether it leads its group.
func (p *Proc) Health(ctx context.Context, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	conn, err := p.dial()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return resp.GetStatus(), err
}

// AwaitHealth returns once the health service reports want for service
// (see WatchHealth), or with an error if ctx ends or the watch fails first.
func (p *Proc) AwaitHealth(ctx context.Context, service string, want healthpb.HealthCheckResponse_ServingStatus) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	statuses, err := p.WatchHealth(ctx, service)
	if err != nil {
		return err
	}
	for st := range statuses {
		if st == want {
			return nil
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("health of %q at %s never %v: %w", service, p.Addr, want, err)
	}
	return fmt.Errorf("health of %q at %s never %v: the watch ended (the process exited?)", service, p.Addr, want)
}

func (p *Proc) dial() (*grpc.ClientConn, error) {
	creds := p.cfg.Creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	return grpc.NewClient(p.Addr, grpc.WithTransportCredentials(creds))
}

// Pause stops the process with SIGSTOP, as a long GC pause, a frozen VM or
// a partition would: it holds its ports but answers nothing. It returns
// once the kernel reports the process stopped: its threads stop one after
// another, and on a loaded machine one still running could otherwise
// answer a request sent after Pause returned.
func (p *Proc) Pause() error {
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	// WNOWAIT leaves the report (and an exit) to cmd.Wait.
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, p.Pid(), &info, unix.WSTOPPED|unix.WEXITED|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("coordproc: wait for the stop: %w", err)
		}
		if info.Code != cldStopped {
			return fmt.Errorf("snapcoord exited instead of stopping\n%s", p.Tail(30))
		}
		return nil
	}
}

// cldStopped is siginfo's si_code for a stopped child (CLD_STOPPED).
const cldStopped = 5

// Resume continues it with SIGCONT after Pause.
func (p *Proc) Resume() error { return p.cmd.Process.Signal(syscall.SIGCONT) }

// Restart starts the same coordinator again: same binary, data directory,
// addresses and flags. The previous process must have exited.
func (p *Proc) Restart(ctx context.Context) (*Proc, error) {
	return p.RestartAt(ctx, p.Addr)
}

// RestartAt is Restart on another gRPC address: the coordinator's data
// served from another machine, as after a failover.
func (p *Proc) RestartAt(ctx context.Context, addr string) (*Proc, error) {
	cfg := p.cfg
	cfg.Addr = addr
	return Start(ctx, cfg)
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Kill sends SIGKILL and waits for the process to be gone. It is an error
// if the process had exited by itself (a race report exits 66 just before
// the kill, say).
func (p *Proc) Kill() error {
	select {
	case <-p.exited:
		return fmt.Errorf("snapcoord had already exited: %v\n%s", p.cmd.ProcessState, p.Tail(30))
	default:
	}
	p.kill()
	if code := p.cmd.ProcessState.ExitCode(); code != -1 {
		return fmt.Errorf("snapcoord exited %d before SIGKILL\n%s", code, p.Tail(30))
	}
	return nil
}

func (p *Proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Stop drains the coordinator with SIGTERM, as an operator would, and
// kills it if it has not exited within timeout. It is an error if it did
// not exit 0.
func (p *Proc) Stop(timeout time.Duration) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	code, err := p.Signal(syscall.SIGTERM, timeout)
	if err == nil && code != 0 {
		err = fmt.Errorf("snapcoord exited %d\n%s", code, p.Tail(30))
	}
	return err
}

// Signal sends sig and waits up to timeout for the process to exit, then
// kills it; it returns the exit code.
func (p *Proc) Signal(sig os.Signal, timeout time.Duration) (exitCode int, err error) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		p.kill()
		return -1, fmt.Errorf("snapcoord did not stop within %s of %v\n%s", timeout, sig, p.Tail(30))
	}
}

// Log is the whole log so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.cfg.LogPath)
	return string(b)
}

// Tail is the log's last n lines, headed by its path, for error messages.
func (p *Proc) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	return "--- " + p.cfg.LogPath + " (last lines) ---\n" + strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// CPU is the process's user plus system CPU time so far.
func (p *Proc) CPU() (time.Duration, error) { return ProcessCPU(p.Pid()) }

// RSS is the process's resident set size in bytes.
func (p *Proc) RSS() (int64, error) { return ProcessRSS(p.Pid()) }

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times; 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// ProcessCPU reads utime + stime of pid from /proc/<pid>/stat.
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces; fields after its
	// closing parenthesis start at field 3 (state).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("coordproc: malformed /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("coordproc: short /proc stat")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// ProcessRSS reads VmRSS of pid from /proc/<pid>/status, in bytes.
func ProcessRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) < 1 {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, err
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("coordproc: no VmRSS in /proc status")
}

// FreePort returns a loopback address whose port was free a moment ago.
func FreePort() (string, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := lis.Addr().String()
	return addr, lis.Close()
}

// CleanEnv is this process's environment without SNAPCOORD_* variables
// (a developer's admin token or listen address), plus extra.
func CleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SNAPCOORD_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// WatchHealth streams the coordinator's health status for service (its
// gRPC health Watch) into the returned channel, which is closed when ctx
// ends or the stream fails (the process died, say). Every status the
// server sends is delivered, the current one first; a receiver that falls
// behind holds the stream back, not the coordinator. Several coordinators
// on one etcd prefix report NOT_SERVING for snapcoord.v1.RunService and
// snapcoord.v1.WorkerService except on the leader, so watching those shows
// the moment a follower takes over.
func (p *Proc) WatchHealth(ctx context.Context, service string) (<-chan healthpb.HealthCheckResponse_ServingStatus, error) {
	conn, err := p.dial()
	if err != nil {
		return nil, err
	}
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	out := make(chan healthpb.HealthCheckResponse_ServingStatus)
	go func() {
		defer conn.Close()
		defer close(out)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case out <- resp.GetStatus():
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
