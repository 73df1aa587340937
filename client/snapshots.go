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
	var all []*v1.Snapshot
	req := &v1.ListSnapshotsRequest{RunId: runID}
	for {
		resp, err := c.Runs.ListSnapshots(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("list the snapshots of run %s: %w", runID, err)
		}
		all = append(all, resp.GetSnapshots()...)
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			return all, nil
		}
	}
}
