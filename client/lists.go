package client

import (
	"context"
	"fmt"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/paging"
)

// Snapshots returns all of a run's snapshots, oldest first, following
// ListSnapshots' pages (a page ends at 1 MiB: with thousands of workers,
// each snapshot carries thousands of reports).
func (c *Client) Snapshots(ctx context.Context, runID string) ([]*v1.Snapshot, error) {
	all, err := paging.All(func(token string) ([]*v1.Snapshot, string, error) {
		resp, err := c.Runs.ListSnapshots(ctx, &v1.ListSnapshotsRequest{RunId: runID, PageToken: token})
		return resp.GetSnapshots(), resp.GetNextPageToken(), err
	})
	if err != nil {
		return nil, fmt.Errorf("list the snapshots of run %s: %w", runID, err)
	}
	return all, nil
}

// RunWorkers returns all of a run's workers, trainers by rank then
// environment workers by name, following ListWorkers' pages of 1000.
func (c *Client) RunWorkers(ctx context.Context, runID string) ([]*v1.Worker, error) {
	all, err := paging.All(func(token string) ([]*v1.Worker, string, error) {
		resp, err := c.Runs.ListWorkers(ctx, &v1.ListWorkersRequest{RunId: runID, PageToken: token})
		return resp.GetWorkers(), resp.GetNextPageToken(), err
	})
	if err != nil {
		return nil, fmt.Errorf("list the workers of run %s: %w", runID, err)
	}
	return all, nil
}

// AllRuns returns every run (in state, if it is not RUN_STATE_UNSPECIFIED) by
// run_id, following ListRuns' pages.
func (c *Client) AllRuns(ctx context.Context, state v1.RunState) ([]*v1.Run, error) {
	all, err := paging.All(func(token string) ([]*v1.Run, string, error) {
		resp, err := c.Runs.ListRuns(ctx, &v1.ListRunsRequest{State: state, PageToken: token})
		return resp.GetRuns(), resp.GetNextPageToken(), err
	})
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return all, nil
}
