package main

import (
	"testing"

	"go.uber.org/goleak"
)

// The report runs simulations on worker goroutines; all must have ended.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
