package statuspage_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The tests run an engine under the page (its timers, its watchers); the
// page must hold none of them past the test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
