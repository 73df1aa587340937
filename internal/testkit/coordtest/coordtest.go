// Package coordtest runs the assembled coordinator inside a test process:
// the production configuration and interceptor chain on a loopback port,
// shut down at the end of the test.
package coordtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/snapcoord/snapcoord/server/coordinator"
)

// Config is coordinator.Defaults() for a test: a free loopback port, the
// store in dir, no metrics listener and no credential polling.
func Config(dir string) coordinator.Config {
	cfg := coordinator.Defaults()
	cfg.Listen = "127.0.0.1:0"
	cfg.DataDir = dir
	cfg.MetricsListen = ""
	cfg.CredentialsCheckInterval = 0
	return cfg
}

// Instance is a running coordinator.
type Instance struct {
	*coordinator.Coordinator
	// Stop drains and closes it, failing the test if serving failed; safe
	// to call again (it also runs at cleanup). Starting cfg again with
	// Listen set to Addr() is a restart on the same data and address.
	Stop func()
}

// Start assembles cfg with opts and serves it until Stop or the end of the
// test.
func Start(t testing.TB, cfg coordinator.Config, opts ...coordinator.Option) *Instance {
	t.Helper()
	in := Serve(t, cfg, opts...)
	t.Cleanup(in.Stop)
	return in
}

// Serve is Start for harnesses that restart the coordinator: the caller
// calls Stop, at the latest in a cleanup registered before the test's own,
// so the coordinator outlives the clients that the test closes at cleanup.
func Serve(t testing.TB, cfg coordinator.Config, opts ...coordinator.Option) *Instance {
	t.Helper()
	c, err := coordinator.New(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatalf("coordinator.New: %v", err)
	}
	if err := c.Start(); err != nil {
		_ = c.Shutdown(context.Background())
		t.Fatalf("coordinator Start: %v", err)
	}
	in := &Instance{Coordinator: c}
	in.Stop = sync.OnceFunc(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("coordinator Shutdown: %v", err)
		}
	})
	return in
}
