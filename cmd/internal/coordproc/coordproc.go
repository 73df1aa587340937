// Package coordproc runs `snapcoord serve` as a child process for the
// measurement tools: it starts the binary on a loopback port, times how long
// it takes to report SERVING on the health service, reads the process's CPU
// time and resident memory from /proc, and stops it gently or with SIGKILL.
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

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Config describes one coordinator.
type Config struct {
	// Bin is the snapcoord binary.
	Bin string
	// Command is the subcommand; default "serve". It is given --listen,
	// and --data-dir when DataDir is set.
	Command string
	// DataDir is its --data-dir; it survives restarts.
	DataDir string
	// Addr is the gRPC address; empty picks a free loopback port once, kept
	// across restarts so that clients reconnect to the same address.
	Addr string
	// LogPath receives the process's stdout and stderr (appended).
	LogPath string
	// Args are extra `snapcoord serve` flags.
	Args []string
	// StartTimeout bounds the wait for SERVING; default 60 s.
	StartTimeout time.Duration
}

// Proc is a running (or exited) coordinator.
type Proc struct {
	cfg    Config
	cmd    *exec.Cmd
	exited chan struct{}
	// Addr is where it serves gRPC.
	Addr string
	// Ready is how long it took from process start to SERVING.
	Ready time.Duration
}

// Start starts the coordinator and returns once its health service answers
// SERVING, or with an error that quotes the end of its log.
func Start(ctx context.Context, cfg Config) (*Proc, error) {
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = time.Minute
	}
	if cfg.Addr == "" {
		addr, err := FreePort()
		if err != nil {
			return nil, err
		}
		cfg.Addr = addr
	}
	log, err := os.OpenFile(cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("coordinator log: %w", err)
	}
	defer log.Close() // the child has its own descriptor
	if cfg.Command == "" {
		cfg.Command = "serve"
	}
	args := []string{cfg.Command, "--listen", cfg.Addr}
	if cfg.DataDir != "" {
		args = append(args, "--data-dir", cfg.DataDir)
	}
	args = append(args, cfg.Args...)
	p := &Proc{cfg: cfg, Addr: cfg.Addr, exited: make(chan struct{})}
	p.cmd = exec.Command(cfg.Bin, args...)
	p.cmd.Env = cleanEnv()
	// A tool that dies takes its coordinator with it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.cmd.Stdout, p.cmd.Stderr = log, log
	// Prepared before the start so that it adds nothing to Ready.
	conn, err := grpc.NewClient(cfg.Addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
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
		return nil, fmt.Errorf("%w\n%s", err, tail(cfg.LogPath, 30))
	}
	p.Ready = time.Since(start)
	return p, nil
}

// awaitServing asks the health service until it says SERVING. Each check
// waits for the connection, which retries every 2 ms, so the first SERVING
// is seen within a few milliseconds of the process reaching it.
func (p *Proc) awaitServing(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	health := healthpb.NewHealthClient(conn)
	for {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited before serving: %v", p.cfg.Bin, p.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("%s did not report SERVING within %s (last: %v, %v)", p.cfg.Bin, p.cfg.StartTimeout, resp.GetStatus(), err)
		case <-time.After(time.Millisecond):
		}
	}
}

// Restart starts the same coordinator again: same binary, data directory,
// address and flags. The previous process must have exited.
func (p *Proc) Restart(ctx context.Context) (*Proc, error) {
	cfg := p.cfg
	cfg.Addr = p.Addr
	return Start(ctx, cfg)
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Kill sends SIGKILL and waits for the process to be gone. It is an error
// if the process had already exited by itself.
func (p *Proc) Kill() error {
	select {
	case <-p.exited:
		return fmt.Errorf("snapcoord had already exited: %v\n%s", p.cmd.ProcessState, tail(p.cfg.LogPath, 30))
	default:
	}
	p.kill()
	return nil
}

func (p *Proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Stop drains the coordinator with SIGTERM, as an operator would, and
// kills it if it has not exited within timeout.
func (p *Proc) Stop(timeout time.Duration) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(timeout):
		p.kill()
		return fmt.Errorf("snapcoord did not stop within %s of SIGTERM", timeout)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("snapcoord exited %d\n%s", code, tail(p.cfg.LogPath, 30))
	}
	return nil
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

// cleanEnv keeps the developer's SNAPCOORD_* settings (an admin token, a
// listen address) away from the coordinator under measurement.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SNAPCOORD_") {
			env = append(env, kv)
		}
	}
	return env
}

// tail returns the last n lines of the log, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return "--- " + path + " (last lines) ---\n" + strings.Join(lines[max(0, len(lines)-n):], "\n")
}
