package client_test

import (
	"context"
	"net"
	"slices"
	"testing"

	"google.golang.org/grpc"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
)

// pagedRuns answers ListSnapshots with one snapshot a page, as a
// coordinator does when each snapshot carries a megabyte of reports.
type pagedRuns struct {
	v1.UnimplementedRunServiceServer
	ids []string
}

func (p pagedRuns) ListSnapshots(_ context.Context, req *v1.ListSnapshotsRequest) (*v1.ListSnapshotsResponse, error) {
	i := 0
	if req.PageToken != "" {
		i = slices.Index(p.ids, req.PageToken) + 1
	}
	resp := &v1.ListSnapshotsResponse{Snapshots: []*v1.Snapshot{{SnapshotId: p.ids[i]}}}
	if i+1 < len(p.ids) {
		resp.NextPageToken = p.ids[i]
	}
	return resp, nil
}

func TestSnapshotsFollowsThePages(t *testing.T) {
	want := []string{"snap-1", "snap-2", "snap-3"}
	srv := grpc.NewServer()
	v1.RegisterRunServiceServer(srv, pagedRuns{ids: want})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	c, err := client.Dial(lis.Addr().String(), client.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	snaps, err := c.Snapshots(t.Context(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range snaps {
		got = append(got, s.GetSnapshotId())
	}
	if !slices.Equal(got, want) {
		t.Errorf("Snapshots = %v, want %v", got, want)
	}
}
