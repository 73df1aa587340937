package engine

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the engine starts (timer callbacks, publishers, the
// observer calls of a caller that gave up) ends by the time its test has
// closed the engine and the store.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
