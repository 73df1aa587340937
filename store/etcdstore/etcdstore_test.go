package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	snapcoordv1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
	"github.com/snapcoord/snapcoord/store"
	"github.com/snapcoord/snapcoord/store/etcdstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(etcdtest.M{M: m}) }

func sharedClient(t testing.TB) *clientv3.Client {
	return etcdtest.Client(t, etcdtest.Shared(t, 3))
}

func open(t testing.TB, cli *clientv3.Client, prefix string, fence etcdstore.Fence, opts etcdstore.Options) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.Open(testCtx(t), cli, prefix, fence, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func prefixOf(t testing.TB) string { return "/test/" + t.Name() }

func commit(t testing.TB, s store.Store, b *store.Batch) {
	t.Helper()
	if err := s.Submit(b).Wait(testCtx(t)); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

func load(t testing.TB, s store.Store) []*store.RunData {
	t.Helper()
	runs, err := s.Load(testCtx(t), store.Everything)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return runs
}

func runBatch(id string) *store.Batch {
	b := &store.Batch{}
	b.PutRun(&storagev1.RunRecord{Run: &snapcoordv1.Run{RunId: id}})
	return b
}

func eventBatch(runID string, seq int64) *store.Batch {
	b := &store.Batch{}
	b.PutEvent(runID, &snapcoordv1.RunEvent{Seq: seq, Message: "e"})
	return b
}

// campaign makes a session on cli win the election at prefix and returns
// the fence of its leadership.
func campaign(t *testing.T, cli *clientv3.Client, prefix string) (*concurrency.Session, etcdstore.Fence) {
	t.Helper()
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	e := concurrency.NewElection(sess, prefix+"/leader")
	if err := e.Campaign(testCtx(t), "coordinator"); err != nil {
		t.Fatal(err)
	}
	return sess, etcdstore.Fence{Key: e.Key(), Revision: e.Rev()}
}

// A leader whose session ended, replaced by another, writes nothing more:
// every batch it submits fails with ErrFenced, and the new leader's store
// holds none of them.
func TestFencedAfterTakeover(t *testing.T) {
	cli := sharedClient(t)
	prefix := prefixOf(t)
	sess1, fence1 := campaign(t, cli, prefix)
	old := open(t, cli, prefix, fence1, etcdstore.Options{})
	commit(t, old, runBatch("before"))

	// The old leader's session ends (its lease expired, as for a paused
	// process), and a second coordinator wins the election.
	if _, err := cli.Revoke(testCtx(t), sess1.Lease()); err != nil {
		t.Fatal(err)
	}
	_, fence2 := campaign(t, cli, prefix)
	next := open(t, cli, prefix, fence2, etcdstore.Options{})

	var pending []*store.Pending
	for i := range 20 {
		pending = append(pending, old.Submit(runBatch(fmt.Sprintf("deposed-%d", i))))
	}
	for i, p := range pending {
		err := p.Wait(testCtx(t))
		if !errors.Is(err, store.ErrFenced) || !errors.Is(err, store.ErrCommitFailed) {
			t.Fatalf("deposed leader's batch %d: %v, want ErrFenced", i, err)
		}
	}
	if err := old.Submit(&store.Batch{}).Wait(testCtx(t)); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("a later batch of the deposed leader: %v, want ErrFenced", err)
	}
	commit(t, next, runBatch("after"))
	runs := load(t, next)
	if got := ids(runs); got != "after,before" {
		t.Fatalf("runs in the new leader's store: %s, want after,before", got)
	}
}

// A store whose fence no longer holds cannot even open.
func TestOpenFenced(t *testing.T) {
	cli := sharedClient(t)
	prefix := prefixOf(t)
	sess, fence := campaign(t, cli, prefix)
	if err := sess.Close(); err != nil { // resigns: the key is deleted
		t.Fatal(err)
	}
	_, err := etcdstore.Open(testCtx(t), cli, prefix, fence, etcdstore.Options{})
	if !errors.Is(err, store.ErrFenced) {
		t.Fatalf("Open with a lost fence: %v, want ErrFenced", err)
	}
}

func ids(runs []*store.RunData) string {
	var out []string
	for _, r := range runs {
		out = append(out, r.Record.GetRun().GetRunId())
	}
	return strings.Join(out, ",")
}

// A group larger than one etcd transaction commits whole, in several, and
// Load sees every batch; batches that rewrite one key (the run record, as
// the engine does) fold into one put.
func TestGroupSplitsIntoTxns(t *testing.T) {
	cli := sharedClient(t)
	var maxGroup atomic.Int64
	s := open(t, cli, prefixOf(t), etcdstore.Fence{}, etcdstore.Options{OnCommit: func(n int, _ time.Duration) {
		for m := maxGroup.Load(); int64(n) > m && !maxGroup.CompareAndSwap(m, int64(n)); m = maxGroup.Load() {
		}
	}})
	commit(t, s, runBatch("r"))
	const n = 2000
	var pending []*store.Pending
	for seq := int64(1); seq <= n; seq++ {
		b := eventBatch("r", seq)
		rec := &storagev1.RunRecord{Run: &snapcoordv1.Run{RunId: "r", LastEventSeq: seq}}
		b.PutRun(rec)
		b.PutWorker("r", &snapcoordv1.Worker{WorkerId: fmt.Sprintf("w%d", seq%300)})
		pending = append(pending, s.Submit(b))
	}
	for i, p := range pending {
		if err := p.Wait(testCtx(t)); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
	}
	// Each batch is at least 2 etcd operations once its run record folds
	// with the others': a group of over 64 needed several txns.
	if maxGroup.Load() <= 64 {
		t.Fatalf("largest group %d batches: the test never split one", maxGroup.Load())
	}
	t.Logf("largest group: %d batches", maxGroup.Load())
	runs := load(t, s)
	if len(runs) != 1 || len(runs[0].Events) != n || len(runs[0].Workers) != 300 || runs[0].Record.GetRun().GetLastEventSeq() != n {
		t.Fatalf("loaded %d runs, %d events, %d workers, last_event_seq %d; want 1, %d, 300, %d",
			len(runs), len(runs[0].Events), len(runs[0].Workers), runs[0].Record.GetRun().GetLastEventSeq(), n, n)
	}
}

// One batch over etcd's limits fails, with an error that says so, and
// writes nothing, neither itself nor the batches grouped with it.
func TestOversizeBatch(t *testing.T) {
	cases := map[string]func(b *store.Batch){
		"operations": func(b *store.Batch) {
			for seq := int64(1); seq <= 200; seq++ {
				b.PutEvent("r", &snapcoordv1.RunEvent{Seq: seq})
			}
		},
		"bytes": func(b *store.Batch) {
			b.PutEvent("r", &snapcoordv1.RunEvent{Seq: 1, Message: strings.Repeat("x", 2<<20)})
		},
	}
	for name, fill := range cases {
		t.Run(name, func(t *testing.T) {
			cli := sharedClient(t)
			s := open(t, cli, prefixOf(t), etcdstore.Fence{}, etcdstore.Options{})
			big := runBatch("r")
			fill(big)
			err := s.Submit(big).Wait(testCtx(t))
			if !errors.Is(err, etcdstore.ErrBatchTooLarge) || !errors.Is(err, store.ErrCommitFailed) {
				t.Fatalf("oversize batch: %v, want ErrBatchTooLarge", err)
			}
			if !strings.Contains(err.Error(), "128 operations") {
				t.Errorf("error %q does not state the limits", err)
			}
			fresh := open(t, cli, prefixOf(t), etcdstore.Fence{}, etcdstore.Options{})
			if runs := load(t, fresh); len(runs) != 0 {
				t.Fatalf("an oversize batch stored %s", ids(runs))
			}
		})
	}
}

// Every acknowledged write survives the writer: a new Store (a restarted
// or succeeding coordinator, on its own client) loads them all, though the
// old one was never closed.
func TestRestartSeesAcknowledged(t *testing.T) {
	c := etcdtest.Shared(t, 3)
	prefix := prefixOf(t)
	first := open(t, etcdtest.Client(t, c), prefix, etcdstore.Fence{}, etcdstore.Options{})
	commit(t, first, runBatch("r"))
	acked := writeConcurrently(t, first, 16, 40, nil)

	second := open(t, etcdtest.Client(t, c), prefix, etcdstore.Fence{}, etcdstore.Options{})
	assertEvents(t, load(t, second), acked)
}

// writeConcurrently runs writers that each commit perWriter events of run
// "r"; after every writer's first acknowledgement it calls during (if set)
// once. It returns the acknowledged seqs; a failed commit fails t.
func writeConcurrently(t *testing.T, s store.Store, writers, perWriter int, during func()) map[int64]bool {
	t.Helper()
	var mu sync.Mutex
	acked := map[int64]bool{}
	var started sync.WaitGroup
	started.Add(writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			first := sync.OnceFunc(started.Done)
			defer first()
			for i := range perWriter {
				seq := int64(w*perWriter + i + 1)
				if err := s.Submit(eventBatch("r", seq)).Wait(testCtx(t)); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				mu.Lock()
				acked[seq] = true
				mu.Unlock()
				first()
			}
		})
	}
	if during != nil {
		started.Wait()
		during()
	}
	wg.Wait()
	return acked
}

func assertEvents(t *testing.T, runs []*store.RunData, acked map[int64]bool) {
	t.Helper()
	if len(runs) != 1 {
		t.Fatalf("%d runs loaded, want 1", len(runs))
	}
	stored := map[int64]bool{}
	for _, e := range runs[0].Events {
		stored[e.GetSeq()] = true
	}
	for seq := range acked {
		if !stored[seq] {
			t.Errorf("acknowledged event %d was not stored", seq)
		}
	}
	t.Logf("%d acknowledged, %d stored", len(acked), len(stored))
}

// A member killed while writers commit costs no write: the other two are
// a quorum, and a txn that was in flight to the dead member is sent again.
func TestMemberKilledUnderLoad(t *testing.T) {
	c := etcdtest.Start(t, 3)
	cli := etcdtest.Client(t, c)
	s := open(t, cli, prefixOf(t), etcdstore.Fence{}, etcdstore.Options{})
	commit(t, s, runBatch("r"))
	acked := writeConcurrently(t, s, 16, 60, func() {
		if err := c.Kill(0); err != nil {
			t.Error(err)
		}
	})
	if len(acked) != 16*60 {
		t.Fatalf("%d of %d writes acknowledged with one member dead", len(acked), 16*60)
	}
	assertEvents(t, load(t, s), acked)
}

// The same batches, grouped at random, leave etcd in the state they leave
// bbolt in: the folding of a group into one txn keeps the order of puts,
// put-if-absent and deletes across and within batches. And the reads of
// many records (Snapshots, Events) return on etcd, in pages of two keys,
// what they return on bbolt.
func TestSameStateAsBbolt(t *testing.T) {
	cli := sharedClient(t)
	ec := open(t, cli, prefixOf(t), etcdstore.Fence{}, etcdstore.Options{PageSize: 2})
	bb, err := store.Open(filepath.Join(t.TempDir(), "snapcoord.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bb.Close() })

	rng := rand.New(rand.NewPCG(18, 2026))
	compared, read := 0, 0
	for round := range 40 {
		var pendings []*store.Pending
		for range 1 + rng.IntN(12) {
			ops := randomOps(rng)
			for _, s := range []store.Store{bb, ec} {
				b := &store.Batch{}
				for _, op := range ops {
					op(b)
				}
				pendings = append(pendings, s.Submit(b))
			}
		}
		for _, p := range pendings {
			if err := p.Wait(testCtx(t)); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		compared += assertSameRecords(t, round, dump(t, bb), dump(t, ec))
		read += assertSameReads(t, round, bb, ec)
	}
	if compared < 100 || read < 1000 {
		t.Fatalf("only %d records compared and %d read over all rounds", compared, read)
	}
	t.Logf("%d records compared, %d read", compared, read)
}

// Snapshots of more records than a txn holds reads them over several
// txns on etcd, and returns what bbolt returns.
func TestSnapshotsAcrossTxnsAsBbolt(t *testing.T) {
	cli := sharedClient(t)
	ec := open(t, cli, prefixOf(t), etcdstore.Fence{}, etcdstore.Options{MaxTxnOps: 8, PageSize: 3})
	bb, err := store.Open(filepath.Join(t.TempDir(), "snapcoord.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bb.Close() })
	var ids []string
	for _, s := range []store.Store{bb, ec} {
		commit(t, s, runBatch("r"))
	}
	for i := range 60 {
		id := fmt.Sprint("snap-", i+1)
		ids = append(ids, id)
		for _, s := range []store.Store{bb, ec} {
			b := &store.Batch{}
			b.PutSnapshot("r", &snapcoordv1.Snapshot{SnapshotId: id, AnchorStep: int64(i)})
			for w := range i % 6 { // up to 5 reports, within 8 operations
				b.PutSnapshotReport("r", id, &snapcoordv1.SnapshotReport{WorkerId: fmt.Sprint("w", w), Message: id})
			}
			commit(t, s, b)
		}
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	for _, ask := range [][]string{ids, append(ids[:50:50], "snap-0")} {
		want, wantErr := readSnapshots(t, bb, "r", ask, len(ask))
		got, gotErr := readSnapshots(t, ec, "r", ask, len(ask))
		if n := assertSameMessages(t, fmt.Sprint(len(ask), " snapshots"), want, got, wantErr, gotErr); n < 150 {
			t.Errorf("%d records read, want at least 150", n)
		}
	}
}

// sameReadIDs are the snapshot ids asked of Snapshots: randomOps' and one
// never stored, in orders other than the stored one, repeated.
var sameReadIDs = [][]string{
	{"s1"}, {"s2"}, {"s3"}, {"s4"},
	{"s1", "s2", "s3"}, {"s3", "s1", "s2", "s1"}, {"s2", "s4", "s1"},
}

// assertSameReads compares Snapshots and Events of both stores, with
// their errors; it returns how many records they read.
func assertSameReads(t *testing.T, round int, bb, ec store.Store) int {
	t.Helper()
	read := 0
	for _, run := range []string{"a", "a.b", "none"} {
		for _, ids := range sameReadIDs {
			for _, stopAfter := range []int{1, len(ids)} {
				want, wantErr := readSnapshots(t, bb, run, ids, stopAfter)
				got, gotErr := readSnapshots(t, ec, run, ids, stopAfter)
				what := fmt.Sprintf("round %d: Snapshots(%q, %q) stopped after %d", round, run, ids, stopAfter)
				read += assertSameMessages(t, what, want, got, wantErr, gotErr)
			}
		}
		for after := range int64(7) {
			for _, limit := range []int{1, 3, 100} {
				want, wantErr := bb.Events(run, after, 5, limit)
				got, gotErr := ec.Events(run, after, 5, limit)
				what := fmt.Sprintf("round %d: Events(%q, %d, 5, %d)", round, run, after, limit)
				read += assertSameMessages(t, what, want, got, wantErr, gotErr)
			}
		}
	}
	return read
}

// readSnapshots is what Snapshots yields when the caller stops after n.
func readSnapshots(t *testing.T, s store.Store, run string, ids []string, n int) ([]*snapcoordv1.Snapshot, error) {
	var out []*snapcoordv1.Snapshot
	err := s.Snapshots(testCtx(t), run, ids, func(s *snapcoordv1.Snapshot) bool {
		out = append(out, s)
		return len(out) < n
	})
	return out, err
}

func assertSameMessages[M proto.Message](t *testing.T, what string, want, got []M, wantErr, gotErr error) int {
	t.Helper()
	if fmt.Sprint(wantErr) != fmt.Sprint(gotErr) {
		t.Errorf("%s: bbolt error %v, etcd error %v", what, wantErr, gotErr)
	}
	if !slices.EqualFunc(want, got, func(a, b M) bool { return proto.Equal(a, b) }) {
		t.Errorf("%s:\nbbolt %v\netcd  %v", what, want, got)
	}
	n := len(want)
	for _, m := range want {
		if s, ok := any(m).(*snapcoordv1.Snapshot); ok {
			n += len(s.Reports)
		}
	}
	return n
}

func assertSameRecords(t *testing.T, round int, want, got map[string]string) int {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("round %d: %q: bbolt %x, etcd %x", round, k, v, got[k])
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("round %d: %q: only in etcd: %x", round, k, v)
		}
	}
	return len(want)
}

// dump is every record of a store, by bucket and key, read through its view.
func dump(t *testing.T, s store.Viewer) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := s.View(testCtx(t), func(kv store.KV) error {
		for _, b := range store.Buckets() {
			err := kv.Scan(testCtx(t), b, nil, nil, 0, func(k, v []byte) (bool, error) {
				out[b.String()+"/"+string(k)] = string(v)
				return true, nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// randomOps is a batch's changes over a small key space, so that batches
// overwrite, delete and recreate each other's keys.
func randomOps(rng *rand.Rand) []func(*store.Batch) {
	var ops []func(*store.Batch)
	for range 1 + rng.IntN(8) {
		run := []string{"a", "a.b"}[rng.IntN(2)]
		n := int64(1 + rng.IntN(6))
		v := rng.Int64()
		switch rng.IntN(12) {
		case 0, 1:
			ops = append(ops, func(b *store.Batch) {
				b.PutRun(&storagev1.RunRecord{Run: &snapcoordv1.Run{RunId: run, LastStep: v}})
			})
		case 2, 7, 8:
			ops = append(ops, func(b *store.Batch) { b.PutEvent(run, &snapcoordv1.RunEvent{Seq: n, Step: v}) })
		case 3, 9:
			ops = append(ops, func(b *store.Batch) { b.DeleteEventsThrough(run, n) })
		case 4, 10:
			ops = append(ops, func(b *store.Batch) {
				b.PutWorker(run, &snapcoordv1.Worker{WorkerId: fmt.Sprint("w", n), Incarnation: v})
			})
		case 5, 11:
			snap := fmt.Sprint("s", 1+v%3)
			ops = append(ops, func(b *store.Batch) {
				b.PutSnapshot(run, &snapcoordv1.Snapshot{SnapshotId: snap, AnchorStep: v})
				b.PutSnapshotReport(run, snap, &snapcoordv1.SnapshotReport{WorkerId: fmt.Sprint("w", n), Message: fmt.Sprint(v)})
			})
		case 6:
			ops = append(ops, func(b *store.Batch) { b.DeleteRun(run) })
		}
	}
	return ops
}
