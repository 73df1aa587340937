package main

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
)

func TestServeLockRestart(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data") // created by serve
	first := startServer(t, dataDir)
	runs := v1.NewRunServiceClient(dial(t, first.addr))
	spec := spectest.Checkpointed(1, "00:01:00:00")
	if _, err := runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "survivor", Spec: spec}); err != nil {
		t.Fatalf("CreateRun: %v", err)
	}

	t.Run("second instance fails at once", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		cfg := coordproc.Config{Bin: binPath, DataDir: dataDir, Args: []string{"--metrics-listen", "", "--lock-timeout", "300ms"}}
		cmd, err := cfg.Cmd(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		out, err := cmd.CombinedOutput()
		elapsed := time.Since(start)
		if exitErr, ok := errors.AsType[*exec.ExitError](err); !ok || exitErr.ExitCode() != 1 {
			t.Errorf("second instance: %v, want exit code 1; output:\n%s", err, out)
		}
		if elapsed > 10*time.Second {
			t.Errorf("second instance took %v to fail, want about the 300ms lock timeout", elapsed)
		}
		if !strings.Contains(string(out), dataDir) {
			t.Errorf("second instance output does not name %s:\n%s", dataDir, out)
		}
	})

	if code := first.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("SIGTERM: exit code %d, want 0:\n%s", code, first.Log())
	}
	if !strings.Contains(first.Log(), `"msg":"stopped"`) {
		t.Errorf("no \"stopped\" log line after SIGTERM:\n%s", first.Log())
	}

	second := startServer(t, dataDir)
	runs = v1.NewRunServiceClient(dial(t, second.addr))
	got, err := runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "survivor"})
	if err != nil || got.GetRun().GetRunId() != "survivor" {
		t.Errorf("GetRun after restart = %v, %v; want the run created before", got.GetRun(), err)
	}
	if code := second.stop(t, syscall.SIGINT); code != 0 {
		t.Errorf("SIGINT: exit code %d, want 0:\n%s", code, second.Log())
	}
}

// One "serving" line, with the address: operators and scripts grep for it.
func TestServeLogsServingOnce(t *testing.T) {
	p := startServer(t, t.TempDir())
	p.stop(t, syscall.SIGTERM)
	n := 0
	for _, l := range lines(p.Log()) {
		if strings.Contains(l, `"msg":"serving"`) {
			n++
			if !strings.Contains(l, p.addr) {
				t.Errorf("serving line lacks the address %s: %s", p.addr, l)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d serving lines, want 1:\n%s", n, p.Log())
	}
}
