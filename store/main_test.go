package store

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
)

// The commit batcher runs a goroutine per open store; Close must end it.
// The etcd backend's tests share one cluster, stopped before the check.
func TestMain(m *testing.M) { goleak.VerifyTestMain(etcdtest.M{M: m}) }
