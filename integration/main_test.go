package integration

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/snapcoord/snapcoord/internal/coordproc"
)

// binPath is the snapcoord binary TestMain builds once for the crash tests.
var (
	binPath    string
	buildFlags []string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "snapcoord-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if binPath, err = coordproc.Build(dir, buildFlags...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	// A stream, poll or timer goroutine still running after every server
	// and client was shut down is a delivery bug (or a test that forgot to
	// stop a worker): fail the package, as grpc-go's own tests do.
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked: %v\n", err)
			code = 1
		}
	}
	return code
}
