package coordproc

import (
	"context"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// FirstServing returns the first of procs (but skip, which may be nil) whose
// health reports service SERVING: among coordinators on one etcd prefix,
// the leader, for snapcoord.v1.RunService. It watches them all at once.
func FirstServing(ctx context.Context, service string, procs []*Proc, skip *Proc) (*Proc, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	won := make(chan *Proc, len(procs))
	for _, p := range procs {
		if p != skip {
			go func() {
				if p.AwaitHealth(ctx, service, healthpb.HealthCheckResponse_SERVING) == nil {
					won <- p
				}
			}()
		}
	}
	select {
	case p := <-won:
		return p, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// LeaderForTest is FirstServing for snapcoord.v1.RunService, failing t if
// none serves before ctx ends; it returns the leader and when it was seen.
func LeaderForTest(ctx context.Context, t testing.TB, procs []*Proc, skip *Proc) (*Proc, time.Time) {
	t.Helper()
	p, err := FirstServing(ctx, "snapcoord.v1.RunService", procs, skip)
	if err != nil {
		t.Fatalf("no leader: %v", err)
	}
	return p, time.Now()
}
