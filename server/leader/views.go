package leader

import (
	"context"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/engine"
)

// The methods below let the gate stand for the current engine where the
// coordinator's other parts read it (authentication, telemetry, the status
// page): while following there is no engine, and they see no runs.

// RunForToken resolves a run token with the current engine (auth.RunResolver).
func (g *Gate) RunForToken(token string) (string, bool) {
	if e := g.Current(); e != nil {
		return e.RunForToken(token)
	}
	return "", false
}

// Stats are the current engine's counts; zero while following.
func (g *Gate) Stats() engine.Stats {
	if e := g.Current(); e != nil {
		return e.Stats()
	}
	return engine.Stats{}
}

// MetricRuns are the current engine's runs with per-run gauges; none
// while following.
func (g *Gate) MetricRuns(endedWithin time.Duration) []engine.LiveRun {
	if e := g.Current(); e != nil {
		return e.MetricRuns(endedWithin)
	}
	return nil
}

// Healthy is the current engine's Healthy; nil while following.
func (g *Gate) Healthy() error {
	if e := g.Current(); e != nil {
		return e.Healthy()
	}
	return nil
}

// fresh is the current engine while its term is known to be held: the
// status page's reads come from memory, which a coordinator that may have
// been replaced must not show as the state of the runs.
func (g *Gate) fresh() *engine.Engine {
	g.mu.Lock()
	t := g.term
	g.mu.Unlock()
	if t == nil || t.hold != nil && !t.hold.Held() {
		return nil
	}
	return t.eng
}

// notLeading is what the status page's reads get while following, or
// while leading a term not known to be held (see term.held).
func (g *Gate) notLeading() error {
	addr, self := g.Leader()
	msg := "this coordinator follows; the leader is at " + addr
	switch {
	case self:
		msg = "this coordinator cannot confirm that it still leads (its election lease may have lapsed); it steps down or renews within moments"
	case addr == "":
		msg = "this coordinator follows; electing a leader"
	}
	return &engine.Error{Kind: engine.ErrUnavailable, Msg: msg}
}

// ListRuns is the current engine's (statuspage.Runs).
func (g *Gate) ListRuns(ctx context.Context, req *v1.ListRunsRequest) (*v1.ListRunsResponse, error) {
	if e := g.fresh(); e != nil {
		return e.ListRuns(ctx, req)
	}
	return nil, g.notLeading()
}

// GetRun is the current engine's (statuspage.Runs).
func (g *Gate) GetRun(ctx context.Context, req *v1.GetRunRequest) (*v1.GetRunResponse, error) {
	if e := g.fresh(); e != nil {
		return e.GetRun(ctx, req)
	}
	return nil, g.notLeading()
}

// WatchRun is the current engine's (statuspage.Runs).
func (g *Gate) WatchRun(ctx context.Context, req *v1.WatchRunRequest, send func(*v1.RunEvent) error) error {
	if e := g.fresh(); e != nil {
		return e.WatchRun(ctx, req, send)
	}
	return g.notLeading()
}

// ListWorkers is the current engine's (statuspage.Runs).
func (g *Gate) ListWorkers(ctx context.Context, req *v1.ListWorkersRequest) (*v1.ListWorkersResponse, error) {
	if e := g.fresh(); e != nil {
		return e.ListWorkers(ctx, req)
	}
	return nil, g.notLeading()
}

// ListSnapshots is the current engine's (statuspage.Runs).
func (g *Gate) ListSnapshots(ctx context.Context, req *v1.ListSnapshotsRequest) (*v1.ListSnapshotsResponse, error) {
	if e := g.fresh(); e != nil {
		return e.ListSnapshots(ctx, req)
	}
	return nil, g.notLeading()
}
