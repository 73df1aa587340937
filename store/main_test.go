package store

import (
	"testing"

	"go.uber.org/goleak"
)

// The commit batcher runs a goroutine per open store; Close must end it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
