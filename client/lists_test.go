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

// pagedRuns answers ListSnapshots and ListWorkers with one item a page, as
// a coordinator does when each snapshot carries a megabyte of reports.
type pagedRuns struct {
	v1.UnimplementedRunServiceServer
	ids []string
}

// page is the index of the page's item and the next page's token.
func (p pagedRuns) page(token string) (int, string) {
	i := 0
	if token != "" {
		i = slices.Index(p.ids, token) + 1
	}
	if i+1 < len(p.ids) {
		return i, p.ids[i]
	}
	return i, ""
}

func (p pagedRuns) ListSnapshots(_ context.Context, req *v1.ListSnapshotsRequest) (*v1.ListSnapshotsResponse, error) {
	i, next := p.page(req.PageToken)
	return &v1.ListSnapshotsResponse{Snapshots: []*v1.Snapshot{{SnapshotId: p.ids[i]}}, NextPageToken: next}, nil
}

func (p pagedRuns) ListWorkers(_ context.Context, req *v1.ListWorkersRequest) (*v1.ListWorkersResponse, error) {
	i, next := p.page(req.PageToken)
	return &v1.ListWorkersResponse{Workers: []*v1.Worker{{WorkerId: p.ids[i]}}, NextPageToken: next}, nil
}

func dialPaged(t *testing.T, ids []string) *client.Client {
	t.Helper()
	srv := grpc.NewServer()
	v1.RegisterRunServiceServer(srv, pagedRuns{ids: ids})
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
	return c
}

// Snapshots and RunWorkers return every item of every page, in order.
func TestListsFollowThePages(t *testing.T) {
	want := []string{"id-1", "id-2", "id-3"}
	c := dialPaged(t, want)
	snaps, err := c.Snapshots(t.Context(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	workers, err := c.RunWorkers(t.Context(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	var gotSnaps, gotWorkers []string
	for _, s := range snaps {
		gotSnaps = append(gotSnaps, s.GetSnapshotId())
	}
	for _, w := range workers {
		gotWorkers = append(gotWorkers, w.GetWorkerId())
	}
	if !slices.Equal(gotSnaps, want) || !slices.Equal(gotWorkers, want) {
		t.Errorf("Snapshots = %v, RunWorkers = %v; want %v", gotSnaps, gotWorkers, want)
	}
}
