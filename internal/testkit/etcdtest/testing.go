package etcdtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// startTimeout bounds a cluster's start in tests: members elect a leader
// within a few election timeouts (1 s each), slower on a loaded machine.
const startTimeout = 60 * time.Second

// logTail is how much of each member's log a failed test prints.
const logTail = 8000

// Require skips t when Binary is missing, or fails it when CI=true: CI must
// run the etcd tests, a developer's machine may lack etcd.
func Require(t testing.TB) {
	t.Helper()
	if err := Check(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// Start starts an n-member cluster in t.TempDir() for t alone; it is killed
// when t ends, and its members' logs are printed if t failed.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartTLS(t, n, nil)
}

// StartTLS is Start with clients served over mutual TLS (see TLS).
func StartTLS(t testing.TB, n int, tls *TLS) *Cluster {
	t.Helper()
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := LaunchTLS(ctx, t.TempDir(), n, tls)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		if t.Failed() {
			t.Log(c.logs(logTail))
		}
	})
	return c
}

// shared is the cluster of a test binary (see Shared).
var shared struct {
	mu  sync.Mutex
	n   int
	dir string
	c   *Cluster
	err error
}

// Shared returns the test binary's n-member cluster, starting it on first
// use, so that a package's tests share one cluster's start-up cost. Tests
// keep apart by key prefix (e.g. t.Name()). A test that kills or pauses a
// member must use its own cluster (Start). The package's TestMain must call
// StopShared after m.Run. If t fails, the members' logs are printed.
func Shared(t testing.TB, n int) *Cluster {
	t.Helper()
	Require(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c == nil && shared.err == nil {
		shared.n = n
		shared.dir, shared.err = os.MkdirTemp("", "etcdtest-")
		if shared.err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
			shared.c, shared.err = Launch(ctx, shared.dir, n)
			cancel()
		}
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	if shared.n != n {
		t.Fatalf("etcdtest: Shared(%d) after Shared(%d) in one test binary", n, shared.n)
	}
	c := shared.c
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.logs(logTail))
		}
	})
	return c
}

// StopShared kills the shared cluster, if one was started, and removes its
// directory. It prints the members' logs to stderr when code (m.Run's) is
// not 0.
func StopShared(code int) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		shared.c.Close()
		if code != 0 {
			fmt.Fprint(os.Stderr, shared.c.Logs())
		}
		shared.c = nil
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
		shared.dir = ""
	}
}

// M runs a package's tests and then StopShared: TestMain calls
// os.Exit(etcdtest.M{M: m}.Run()), or hands it to goleak.VerifyTestMain.
type M struct{ *testing.M }

// Run runs the tests, stops the shared cluster and returns the exit code.
func (m M) Run() int {
	code := m.M.Run()
	StopShared(code)
	return code
}

// Client returns a client of c's members, closed when t ends.
func Client(t testing.TB, c *Cluster) *clientv3.Client {
	t.Helper()
	cli, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}
