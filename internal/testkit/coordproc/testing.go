package coordproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// Snapcoord is the coordinator's main package.
const Snapcoord = "github.com/snapcoord/snapcoord/cmd/snapcoord"

// Build compiles cmd/snapcoord into dir (see BuildMains) and returns its
// path.
func Build(dir string) (string, error) {
	bins, err := BuildMains(dir, Snapcoord)
	if err != nil {
		return "", err
	}
	return bins[0], nil
}

// BuildMains compiles the main packages pkgs (import paths) into dir, each
// named after its last element, and returns their paths in order. It is
// the one build rule of every test that runs a binary: -race exactly when
// the test itself runs with -race, as under `make test`, so that a data
// race in the child process fails the test (the binary exits 66) as one
// in the test process would.
func BuildMains(dir string, pkgs ...string) ([]string, error) {
	args := []string{"build"}
	if raceBuild {
		args = append(args, "-race")
	}
	args = append(append(args, "-o", dir+string(filepath.Separator)), pkgs...)
	// go test puts its own go first on PATH.
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	if raceBuild {
		quickRaceExit()
	}
	bins := make([]string, len(pkgs))
	for i, pkg := range pkgs {
		bins[i] = filepath.Join(dir, path.Base(pkg))
	}
	return bins, nil
}

// quickRaceExit has the race-built children of this process exit at once:
// by default the race runtime sleeps a second at exit, for goroutines still
// running to meet a race, and the tests run several hundred short snapctl
// and snapcoord processes (cmd/snapctl's took 265 s, most of it those
// seconds). A race is reported when it happens, so the tests still fail on
// every race they reach. GORACE set by the caller wins.
func quickRaceExit() {
	if _, set := os.LookupEnv("GORACE"); !set {
		_ = os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
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

// Binary is a main package a test package runs besides snapcoord, and
// where Main puts its path.
type Binary struct {
	Pkg  string
	Path *string
}

// Main is TestMain for a package whose tests run the binary: it builds
// cmd/snapcoord and others (with BuildMains's rule) into a temporary
// directory, sets *bin and each other's Path, runs the tests, and fails
// them if goroutines outlive them. It returns the exit code.
func Main(m *testing.M, bin *string, others ...Binary) int {
	dir, err := os.MkdirTemp("", "snapcoord-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	pkgs, paths := []string{Snapcoord}, []*string{bin}
	for _, o := range others {
		pkgs, paths = append(pkgs, o.Pkg), append(paths, o.Path)
	}
	bins, err := BuildMains(dir, pkgs...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for i, p := range paths {
		*p = bins[i]
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

// Lazy is the snapcoord binary of a test package most of whose tests do
// not run it: Path builds it (Build) the first time a test asks, so that
// the others pay nothing; Remove, from TestMain after the tests, deletes it.
type Lazy struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// Path is the binary's path, built on the first call; a failed build
// fails t.
func (l *Lazy) Path(t testing.TB) string {
	t.Helper()
	l.once.Do(func() {
		if l.dir, l.err = os.MkdirTemp("", "snapcoord-bin-"); l.err == nil {
			l.bin, l.err = Build(l.dir)
		}
	})
	if l.err != nil {
		t.Fatal(l.err)
	}
	return l.bin
}

// Remove deletes the binary, if Path built it.
func (l *Lazy) Remove() {
	if l.dir != "" {
		_ = os.RemoveAll(l.dir)
	}
}
