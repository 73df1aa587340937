package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
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
	binPath = filepath.Join(dir, "snapcoord")
	args := append(append([]string{"build"}, buildFlags...), "-o", binPath, "github.com/snapcoord/snapcoord/cmd/snapcoord")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go %s: %v\n%s", strings.Join(args, " "), err, out)
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
