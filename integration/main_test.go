package integration

import (
	"os"
	"testing"

	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
)

// binPath is the snapcoord binary TestMain builds once for the crash tests.
var binPath string

func TestMain(m *testing.M) { os.Exit(coordproc.Main(m, &binPath)) }
