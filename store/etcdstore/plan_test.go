package etcdstore

import (
	"errors"
	"slices"
	"testing"

	snapcoordv1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
	"github.com/snapcoord/snapcoord/store"
)

func events(runID string, seqs ...int64) *store.Batch {
	b := &store.Batch{}
	for _, seq := range seqs {
		b.PutEvent(runID, &snapcoordv1.RunEvent{Seq: seq})
	}
	return b
}

// Transactions are cut between batches only, as full as the limits allow.
func TestPlanSplitsBetweenBatches(t *testing.T) {
	s := &Store{prefix: "/p/store/"}
	var group []*store.Batch
	for i := range int64(7) {
		group = append(group, events("r", 3*i+1, 3*i+2, 3*i+3))
	}
	txns, err := s.planGroup(group, limits{ops: 10, bytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	for _, txn := range txns {
		ops, _ := txn.size()
		sizes = append(sizes, ops)
	}
	if want := []int{9, 9, 3}; !slices.Equal(sizes, want) {
		t.Fatalf("txn sizes %v, want %v", sizes, want)
	}

	_, err = s.planGroup([]*store.Batch{events("r", 1), events("r", 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)}, limits{ops: 10, bytes: 1 << 20})
	if !errors.Is(err, ErrBatchTooLarge) {
		t.Fatalf("a batch of 11 operations under a limit of 10: %v, want ErrBatchTooLarge", err)
	}
}

// A put after a delete range that covers it takes its key out of the
// range (etcd refuses both in one txn); a put the range deletes is dropped.
func TestPlanFoldsOverlaps(t *testing.T) {
	s := &Store{prefix: "/p/store/"}
	b := events("r", 1, 2)        // dropped by the delete below
	b.DeleteEventsThrough("r", 5) // events 1..5
	b.PutEvent("r", &snapcoordv1.RunEvent{Seq: 3})
	txns, err := s.planGroup([]*store.Batch{b}, limits{ops: 10, bytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	p := txns[0]
	k := func(seq int64) string {
		b := events("r", seq)
		return s.key(b.Ops()[0].Bucket, b.Ops()[0].Key)
	}
	if len(p.puts) != 1 || p.puts[k(3)].val == nil {
		t.Fatalf("puts %v, want only event 3", p.puts)
	}
	runPrefix := k(1)[:len(k(1))-8] // less the big-endian seq
	want := []keyRange{{runPrefix, k(3)}, {k(3) + "\x00", k(5) + "\x00"}}
	if !slices.Equal(p.dels, want) {
		t.Fatalf("delete ranges %q, want %q", p.dels, want)
	}
}

// etcd checks a txn nested in another (a snapshot report's put-if-absent)
// against --max-txn-ops minus the outer txn's operations, so a group of
// 127 events and one report, 128 operations, is refused by etcd as "too
// many operations" under the default 128: the plan must cut it in two.
// Committed on a real cluster, the group is stored whole.
func TestNestedTxnLeavesRoomUnderMaxTxnOps(t *testing.T) {
	cli := etcdtest.Client(t, etcdtest.Shared(t, 3))
	ctx := t.Context()
	s, err := Open(ctx, cli, "/test/"+t.Name(), Fence{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	seqs := make([]int64, 127)
	for i := range seqs {
		seqs[i] = int64(i + 1)
	}
	report := &store.Batch{}
	report.PutSnapshotReport("r", "snap-1", &snapcoordv1.SnapshotReport{WorkerId: "w"})
	group := []*store.Batch{events("r", seqs...), report}
	txns, err := s.planGroup(group, s.lim)
	if err != nil {
		t.Fatal(err)
	}
	if len(txns) != 2 {
		t.Errorf("127 events and a report under --max-txn-ops 128: %d txns, want 2", len(txns))
	}
	if err := s.apply(group); err != nil {
		t.Fatalf("apply: %v", err)
	}
}
