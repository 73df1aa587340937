package engine

import (
	"slices"
	"testing"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// ListWorkers pages through trainers by rank, then environment workers by
// name, each once, whatever the page size; a worker that registers between
// two pages appears if it sorts after the first. A token not made by
// ListWorkers is INVALID_ARGUMENT.
func TestListWorkersPages(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(3, ""))
	env := v1.WorkerRole_WORKER_ROLE_ENVIRONMENT
	for _, r := range []int32{2, 0, 1} {
		h.register("r", v1.WorkerRole_WORKER_ROLE_TRAINER, "rank-"+itoa(int(r)), r)
	}
	for i := 24; i >= 0; i-- {
		h.register("r", env, "env-"+itoa(i), 0)
	}
	var want []string
	for r := range 3 {
		want = append(want, "rank-"+itoa(r))
	}
	for i := range 25 {
		want = append(want, "env-"+itoa(i))
	}

	list := func(size int32, between func()) (names []string, sizes []int) {
		t.Helper()
		req := &v1.ListWorkersRequest{RunId: "r", PageSize: size}
		for {
			resp, err := h.e.ListWorkers(h.ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			sizes = append(sizes, len(resp.Workers))
			for _, w := range resp.Workers {
				names = append(names, w.Name)
			}
			if req.PageToken = resp.NextPageToken; req.PageToken == "" {
				return names, sizes
			}
			if between != nil {
				between()
				between = nil
			}
		}
	}
	if names, sizes := list(4, nil); !slices.Equal(names, want) || !slices.Equal(sizes, []int{4, 4, 4, 4, 4, 4, 4}) {
		t.Fatalf("page_size 4: pages of %v listing %v, want %v", sizes, names, want)
	}
	if names, sizes := list(0, nil); !slices.Equal(names, want) || len(sizes) != 1 {
		t.Fatalf("default page size: pages of %v listing %v", sizes, names)
	}
	names, _ := list(10, func() {
		h.register("r", env, "env-aa0", 0) // sorts before the cursor (env-ag): not listed
		h.register("r", env, "env-zz", 0)  // after it: listed
	})
	if want := append(slices.Clone(want), "env-zz"); !slices.Equal(names, want) {
		t.Fatalf("registrations between pages: listed %v, want %v", names, want)
	}

	for _, tok := range []string{"bm90LWEtd29ya2Vy", "!", encodePageToken("1 0 a b")} {
		_, err := h.e.ListWorkers(h.ctx, &v1.ListWorkersRequest{RunId: "r", PageToken: tok})
		wantErr(t, err, ErrInvalidArgument, "page_token")
	}
}
