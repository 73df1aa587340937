package engine

import (
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"

	"go.uber.org/goleak"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Every goroutine the engine starts (timer callbacks, publishers, the
// observer calls of a caller that gave up) ends by the time its test has
// closed the engine and the store; and the package's tests, run in full,
// take every transition of the state table (states.go).
func TestMain(m *testing.M) { goleak.VerifyTestMain(tableCovered{m}) }

type tableCovered struct{ m *testing.M }

func (c tableCovered) Run() int {
	var mu sync.Mutex
	taken := map[[2]v1.RunState]bool{}
	transitionTaken = func(from, to v1.RunState) {
		mu.Lock()
		defer mu.Unlock()
		taken[[2]v1.RunState{from, to}] = true
	}
	code := c.m.Run()
	if code != 0 || flag.Lookup("test.run").Value.String() != "" || flag.Lookup("test.skip").Value.String() != "" || testing.Short() {
		return code // a partial run need not take them all
	}
	mu.Lock()
	defer mu.Unlock()
	for _, t := range transitions {
		for _, from := range t.from {
			if !taken[[2]v1.RunState{from, t.to}] {
				fmt.Fprintf(os.Stderr, "FAIL: no test takes the transition %s -> %s (%s)\n", stateName(from), stateName(t.to), t.when)
				code = 1
			}
		}
	}
	return code
}
