package coordproc

import (
	"context"
	"debug/buildinfo"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

var bin string

func TestMain(m *testing.M) { os.Exit(Main(m, &bin)) }

// The binary under test is a race build exactly when the tests are: under
// `make test` (go test -race) a data race in the child process fails the
// test that started it, and a quick `go test` builds quickly.
func TestBuildRacesWithTheTests(t *testing.T) {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	race := false
	for _, s := range info.Settings {
		if s.Key == "-race" {
			race = s.Value == "true"
		}
	}
	if race != raceBuild {
		t.Errorf("%s built with -race=%v, the tests with -race=%v", bin, race, raceBuild)
	}
}

// A coordinator killed and restarted serves again on the same addresses
// with the same data; SIGTERM then drains it and it exits 0.
func TestKillRestartStop(t *testing.T) {
	p := ForTest(t, Config{Bin: bin, DataDir: filepath.Join(t.TempDir(), "data"), Metrics: true,
		Args: []string{"--log-format", "json"}})
	if p.MetricsAddr == "" || !strings.Contains(p.Log(), p.MetricsAddr) {
		t.Errorf("metrics address %q not in the log:\n%s", p.MetricsAddr, p.Log())
	}
	if err := p.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := p.Kill(); err == nil {
		t.Error("Kill of an exited process: no error")
	}
	q := p.RestartForTest(t)
	if q.Addr != p.Addr || q.MetricsAddr != p.MetricsAddr {
		t.Errorf("restarted on %s and %s, want %s and %s", q.Addr, q.MetricsAddr, p.Addr, p.MetricsAddr)
	}
	if code, err := q.Signal(syscall.SIGTERM, 30*time.Second); err != nil || code != 0 {
		t.Errorf("SIGTERM: exit %d, %v; want 0", code, err)
	}
	if !strings.Contains(q.Tail(3), `"msg":"stopped"`) {
		t.Errorf("log does not end with stopped:\n%s", q.Tail(3))
	}
}

// A coordinator that cannot start fails Start at once (not at the start
// timeout), with its exit status and its log's end.
func TestStartReportsAnEarlyExit(t *testing.T) {
	began := time.Now()
	_, err := Start(t.Context(), Config{Bin: bin, LogPath: filepath.Join(t.TempDir(), "log"), Args: []string{"--lease-ttl", "-1s"}})
	if err == nil || !strings.Contains(err.Error(), "exited before serving: exit status 2") || !strings.Contains(err.Error(), `--lease-ttl "-1s": must not be negative`) {
		t.Errorf("Start with a bad flag = %v, want exit status 2 and the end of the log, naming the flag", err)
	}
	if took := time.Since(began); took > 30*time.Second {
		t.Errorf("Start took %v to see the exit", took)
	}
}

// WatchHealth delivers the service's current status first, and its
// channel closes when the coordinator dies.
func TestWatchHealth(t *testing.T) {
	p := ForTest(t, Config{Bin: bin, DataDir: filepath.Join(t.TempDir(), "data")})
	ch, err := p.WatchHealth(t.Context(), "snapcoord.v1.RunService")
	if err != nil {
		t.Fatal(err)
	}
	if st := <-ch; st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("first status %v, want SERVING", st)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	for st := range ch {
		t.Errorf("status %v after the kill", st)
	}
}

// Start waits for Config.HealthService: a coordinator serving RunService is
// ready; one that never reports the named service is not, and Start says
// which service it waited for.
func TestStartWaitsForTheHealthService(t *testing.T) {
	ForTest(t, Config{Bin: bin, DataDir: filepath.Join(t.TempDir(), "data"), HealthService: "snapcoord.v1.RunService"})
	dir := t.TempDir()
	_, err := Start(t.Context(), Config{Bin: bin, DataDir: filepath.Join(dir, "data"), LogPath: filepath.Join(dir, "log"),
		Args: []string{"--metrics-listen", ""}, HealthService: "no.such.Service", StartTimeout: 3 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "did not report SERVING") {
		t.Errorf("Start waiting for an unknown service = %v, want a timeout", err)
	}
}

// Paused, the coordinator answers nothing, not even health; resumed, it
// serves again.
func TestPauseResume(t *testing.T) {
	p := ForTest(t, Config{Bin: bin, DataDir: filepath.Join(t.TempDir(), "data")})
	if err := p.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if st, err := p.Health(ctx, ""); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("health of a paused coordinator: %v, %v; want no answer", st, err)
	}
	if err := p.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := p.AwaitHealth(t.Context(), "", healthpb.HealthCheckResponse_SERVING); err != nil {
		t.Fatal(err)
	}
	if err := p.Pause(); err != nil { // a second pause is waited for too
		t.Fatalf("second Pause: %v", err)
	}
	if err := p.Resume(); err != nil {
		t.Fatalf("second Resume: %v", err)
	}
}
