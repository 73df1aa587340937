// Package coordproc runs the snapcoord binary as a child process for the
// tools that drive a real coordinator (make demo, make ui-check): on free
// loopback ports, a temporary data directory and a JSON log in a file,
// returning once it serves, and stopped with SIGTERM as an operator would.
package coordproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Process is a running coordinator.
type Process struct {
	// Addr is the gRPC address; MetricsAddr the metrics listener's, empty
	// when args turned it off.
	Addr, MetricsAddr string

	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
}

// Start runs `bin serve` on 127.0.0.1:0 (gRPC and metrics) with its data in
// dir/data and its log in dir/coordinator.log, env as its whole
// environment; args come last and win. It returns once the coordinator
// logs that it serves.
func Start(ctx context.Context, bin, dir string, env []string, args ...string) (*Process, error) {
	p := &Process{logPath: filepath.Join(dir, "coordinator.log"), done: make(chan struct{})}
	base := []string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "data"), "--log-format", "json"}
	p.cmd = exec.Command(bin, append(base, args...)...)
	p.cmd.Env = env
	logFile, err := os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		_ = logFile.Close()
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	addrs := make(chan [2]string, 1)
	go func() {
		scanLog(stderr, logFile, addrs)
		_ = p.cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	select {
	case a := <-addrs:
		p.MetricsAddr, p.Addr = a[0], a[1]
		return p, nil
	case <-p.done:
		return nil, errors.New("the coordinator exited before serving:\n" + p.Tail(40))
	case <-time.After(15 * time.Second):
	case <-ctx.Done():
	}
	_ = p.Stop()
	return nil, errors.New("the coordinator did not start serving")
}

// scanLog copies the JSON log to w and sends the metrics and gRPC
// addresses once the "serving" line is out ("metrics listening" comes
// before it).
func scanLog(r io.Reader, w io.Writer, addrs chan<- [2]string) {
	sc := bufio.NewScanner(r)
	var metrics string
	for sc.Scan() {
		fmt.Fprintln(w, sc.Text())
		var rec struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &rec) != nil || rec.Addr == "" {
			continue
		}
		switch rec.Msg {
		case "metrics listening":
			metrics = rec.Addr
		case "serving":
			select {
			case addrs <- [2]string{metrics, rec.Addr}:
			default:
			}
		}
	}
}

// Stop drains the coordinator with SIGTERM; after 15 s it is killed. The
// error says if it did not exit 0.
func (p *Process) Stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return errors.New("the coordinator did not stop within 15 s of SIGTERM")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("the coordinator exited %d", code)
	}
	return nil
}

// Tail is the log's last n lines.
func (p *Process) Tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
