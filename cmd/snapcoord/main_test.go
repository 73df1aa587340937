package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
)

// binPath is the snapcoord binary TestMain builds once for the process tests.
var binPath string

// serve runs in-process in most tests: once each has stopped, none of its
// goroutines may be left (coordproc.Main checks).
func TestMain(m *testing.M) { os.Exit(coordproc.Main(m, &binPath)) }

// serverProc is a `snapcoord serve` process, logging JSON.
type serverProc struct {
	*coordproc.Proc
	addr string
}

// startServer runs the binary on a free loopback port with dataDir and
// waits until its health service reports SERVING.
func startServer(t *testing.T, dataDir string) *serverProc {
	t.Helper()
	p := coordproc.ForTest(t, coordproc.Config{Bin: binPath, DataDir: dataDir,
		Args: []string{"--metrics-listen", "127.0.0.1:0", "--log-format", "json"}})
	return &serverProc{Proc: p, addr: p.Addr}
}

// stop sends sig and returns the exit code, failing if it takes too long.
func (p *serverProc) stop(t *testing.T, sig os.Signal) int {
	t.Helper()
	code, err := p.Signal(sig, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func lines(s string) []string {
	var out []string
	// Not bufio.Scanner: it stops without a word at a line over 64 KiB.
	for line := range strings.Lines(s) {
		out = append(out, strings.TrimSuffix(line, "\n"))
	}
	return out
}
