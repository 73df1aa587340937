package client

import (
	"context"
	"fmt"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Snapshots returns all of a run's snapshots, oldest first, following
// ListSnapshots' pages (a page ends at 1 MiB: with thousands of workers,
// each snapshot carries thousands of reports).
func (c *Client) Snapshots(ctx context.Context, runID string) ([]*v1.Snapshot, error) {
	all, err := allPages(func(token string) ([]*v1.Snapshot, string, error) {
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
	all, err := allPages(func(token string) ([]*v1.Worker, string, error) {
		resp, err := c.Runs.ListWorkers(ctx, &v1.ListWorkersRequest{RunId: runID, PageToken: token})
		return resp.GetWorkers(), resp.GetNextPageToken(), err
	})
	if err != nil {
		return nil, fmt.Errorf("list the workers of run %s: %w", runID, err)
	}
	return all, nil
}

// allPages calls page with each next page token, from the first page to
// the last.
func allPages[T any](page func(token string) ([]T, string, error)) ([]T, error) {
	var all []T
	token := ""
	for {
		items, next, err := page(token)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if token = next; token == "" {
			return all, nil
		}
	}
}
