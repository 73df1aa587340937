package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"

	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
)

// snapctl runs snapctl against the coordinator and returns its stdout.
func (d *demo) snapctl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, d.cfg.snapctl, args...)
	cmd.Env = coordproc.CleanEnv("SNAPCOORD_ADDR="+d.addr, "SNAPCOORD_PLAINTEXT=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("snapctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// The sidecars' hooks. A snapshot takes 0.2 s, plus 0.15 s per worker
// number, plus 0.06 s per anchor step: the environment state grows as
// training goes on, and so does the save reserve R.
const (
	snapshotHook = `ms=$((200 + 150 * DEMO_WORKER + 60 * SNAPCOORD_ANCHOR_STEP))
sleep "$((ms / 1000)).$(printf %03d $((ms % 1000)))"
echo "saved $SNAPCOORD_SNAPSHOT_ID ($SNAPCOORD_REASON, anchor step $SNAPCOORD_ANCHOR_STEP, forced $SNAPCOORD_FORCED) in $ms ms"`
	stopHook = `echo "stopping: $SNAPCOORD_STOP_REASON"`
)

// sidecar is one `snapctl sidecar` process.
type sidecar struct {
	name string
	cmd  *exec.Cmd
	done chan error
}

func (d *demo) startSidecars() ([]*sidecar, error) {
	var out []*sidecar
	for i := 1; i <= envWorkers; i++ {
		sc, err := d.startSidecar(i)
		if err != nil {
			return nil, err
		}
		out = append(out, sc)
	}
	return out, nil
}

func (d *demo) startSidecar(i int) (*sidecar, error) {
	sc := &sidecar{name: fmt.Sprintf("env-%d", i), done: make(chan error, 1)}
	sc.cmd = exec.Command(d.cfg.snapctl, "sidecar", "--name", sc.name, "--on-snapshot", snapshotHook,
		"--on-stop", stopHook, "--log-level", "warn")
	sc.cmd.Env = coordproc.CleanEnv("SNAPCOORD_ADDR="+d.addr, "SNAPCOORD_PLAINTEXT=1", "SNAPCOORD_RUN_ID="+runID,
		"SNAPCOORD_RUN_TOKEN="+d.token, fmt.Sprintf("DEMO_WORKER=%d", i))
	lines := &lineWriter{emit: func(line string) { d.out.say(sc.name, "%s", line) }}
	sc.cmd.Stdout, sc.cmd.Stderr = lines, lines
	if err := sc.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start sidecar %s: %w", sc.name, err)
	}
	go func() { sc.done <- sc.cmd.Wait() }()
	return sc, nil
}

// wait waits for the sidecar to exit after the run's Stop.
func (sc *sidecar) wait(ctx context.Context) error {
	select {
	case err := <-sc.done:
		if err != nil {
			return fmt.Errorf("sidecar %s: %w", sc.name, err)
		}
		return nil
	case <-ctx.Done():
		_ = sc.cmd.Process.Signal(syscall.SIGTERM)
		<-sc.done
		return fmt.Errorf("sidecar %s still running: %w", sc.name, ctx.Err())
	}
}

// lineWriter calls emit for each complete line written. exec calls Write
// from one goroutine at a time when Stdout and Stderr are the same writer.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	emit func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.emit(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}
