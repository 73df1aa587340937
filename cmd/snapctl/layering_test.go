package main

import (
	"testing"

	"github.com/snapcoord/snapcoord/server/deadline"
)

// snapctl shows what the API returns and imports no server/ package; the
// one number it takes from run.proto's documentation, τ's default, must
// still be the coordinator's.
func TestDefaultTauIsTheCoordinators(t *testing.T) {
	if defaultTau != deadline.DefaultTau {
		t.Errorf("snapctl's default τ %v, the coordinator's %v", defaultTau, deadline.DefaultTau)
	}
}
