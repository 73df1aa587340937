package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	snapcoordv1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/store"
)

func runRecord(id string) *storagev1.RunRecord {
	return &storagev1.RunRecord{
		Run:            &snapcoordv1.Run{RunId: id, State: snapcoordv1.RunState(1), CreatedAt: timestamppb.New(time.Unix(1700000000, 0))},
		TokenHash:      []byte("hash-" + id),
		LastCommandSeq: 3,
	}
}

func event(seq int64, msg string) *snapcoordv1.RunEvent {
	return &snapcoordv1.RunEvent{Seq: seq, Type: snapcoordv1.RunEventType_RUN_EVENT_TYPE_STATE_CHANGED, Message: msg}
}

// fixture builds a run with children whose insertion order differs from
// the order Load must return, and the batch that stores it.
func fixture(id string) (*store.RunData, *store.Batch) {
	b := &store.Batch{}
	return addFixture(b, id), b
}

// addFixture adds fixture's run to b and returns it.
func addFixture(b *store.Batch, id string) *store.RunData {
	want := &store.RunData{
		Record: runRecord(id),
		Steps: []*storagev1.StepRecord{
			{Step: 0, MaxIterationSeconds: 1.5},
			{Step: 2, SavedRanks: []int32{0, 1}},
			{Step: 256, Saved: true, Published: true},
		},
		Workers: []*snapcoordv1.Worker{
			{WorkerId: "w1", Name: id + "-trainer", Rank: 1},
			{WorkerId: "w10", Rank: 10},
			{WorkerId: "w2", Rank: 2},
		},
		Snapshots: []*snapcoordv1.Snapshot{
			{SnapshotId: "s1", AnchorStep: 5},
			{SnapshotId: "s2", ExpectedWorkerIds: []string{"w1", "w2"}},
		},
		Events: []*snapcoordv1.RunEvent{event(1, id+" one"), event(2, "two"), event(300, "three hundred")},
		Commands: []*snapcoordv1.Command{
			{Seq: 1, Audience: snapcoordv1.WorkerRole(1)},
			{Seq: 2},
			{Seq: 1 << 40},
		},
	}
	b.PutRun(want.Record)
	for i := len(want.Steps) - 1; i >= 0; i-- {
		b.PutStep(id, want.Steps[i])
	}
	for i := len(want.Workers) - 1; i >= 0; i-- {
		b.PutWorker(id, want.Workers[i])
	}
	for i := len(want.Snapshots) - 1; i >= 0; i-- {
		b.PutSnapshot(id, want.Snapshots[i])
	}
	for i := len(want.Events) - 1; i >= 0; i-- {
		b.PutEvent(id, want.Events[i])
	}
	for i := len(want.Commands) - 1; i >= 0; i-- {
		b.PutCommand(id, want.Commands[i])
	}
	return want
}

func assertRunData(t *testing.T, got, want *store.RunData) {
	t.Helper()
	if !proto.Equal(got.Record, want.Record) {
		t.Errorf("record: got %v, want %v", got.Record, want.Record)
	}
	assertMsgs(t, "steps", got.Steps, want.Steps)
	assertMsgs(t, "workers", got.Workers, want.Workers)
	assertMsgs(t, "snapshots", got.Snapshots, want.Snapshots)
	assertMsgs(t, "events", got.Events, want.Events)
	assertMsgs(t, "commands", got.Commands, want.Commands)
}

func assertMsgs[M proto.Message](t *testing.T, what string, got, want []M) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: got %d, want %d: %v", what, len(got), len(want), got)
		return
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("%s[%d]: got %v, want %v", what, i, got[i], want[i])
		}
	}
}

func testRoundTrip(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	// "a" is a prefix of "a.b"; the separator must keep them apart.
	wantAB, bAB := fixture("a.b")
	wantA, bA := fixture("a")
	mustCommit(t, db, bAB)
	mustCommit(t, db, bA)

	db = bk.reopen(t, db)
	runs := mustLoad(t, db)
	if len(runs) != 2 {
		t.Fatalf("got %d runs, want 2", len(runs))
	}
	assertRunData(t, runs[0], wantA)
	assertRunData(t, runs[1], wantAB)
}

func testLoadEmpty(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	if runs := mustLoad(t, db); len(runs) != 0 {
		t.Fatalf("got %d runs from a new file", len(runs))
	}
}

func testPutOverwrites(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	b := &store.Batch{}
	b.PutRun(runRecord("r"))
	b.PutWorker("r", &snapcoordv1.Worker{WorkerId: "w", Rank: 1})
	b.PutWorker("r", &snapcoordv1.Worker{WorkerId: "w", Rank: 2})
	mustCommit(t, db, b)
	runs := mustLoad(t, db)
	if len(runs[0].Workers) != 1 || runs[0].Workers[0].GetRank() != 2 {
		t.Fatalf("workers = %v, want one with rank 2", runs[0].Workers)
	}
}

func testDeleteEventsThrough(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	b := &store.Batch{}
	for _, id := range []string{"a", "a.b", "b"} {
		b.PutRun(runRecord(id))
		for seq := int64(1); seq <= 5; seq++ {
			b.PutEvent(id, event(seq, id))
		}
	}
	mustCommit(t, db, b)

	b = &store.Batch{}
	b.DeleteEventsThrough("a", 3)
	b.DeleteEventsThrough("b", -1) // nothing
	b.PutEvent("b", event(6, "b"))
	b.DeleteEventsThrough("b", 0) // nothing: seqs start at 1
	mustCommit(t, db, b)

	want := map[string][]int64{"a": {4, 5}, "a.b": {1, 2, 3, 4, 5}, "b": {1, 2, 3, 4, 5, 6}}
	for _, rd := range mustLoad(t, bk.reopen(t, db)) {
		var got []int64
		for _, e := range rd.Events {
			got = append(got, e.GetSeq())
		}
		id := rd.Record.GetRun().GetRunId()
		if fmt.Sprint(got) != fmt.Sprint(want[id]) {
			t.Errorf("run %q events %v, want %v", id, got, want[id])
		}
	}
}

func testDeleteAfterPutInSameBatch(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	b := &store.Batch{}
	b.PutRun(runRecord("r"))
	b.PutEvent("r", event(1, "gone"))
	b.PutEvent("r", event(2, "gone"))
	b.DeleteEventsThrough("r", 2)
	b.PutEvent("r", event(3, "kept"))
	mustCommit(t, db, b)
	runs := mustLoad(t, db)
	if len(runs[0].Events) != 1 || runs[0].Events[0].GetSeq() != 3 {
		t.Fatalf("events = %v, want only seq 3", runs[0].Events)
	}
}

func testPutSnapshotsMessage(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	rec := runRecord("r")
	w := &snapcoordv1.Worker{WorkerId: "w", Rank: 1}
	e := event(1, "before")
	b := &store.Batch{}
	b.PutRun(rec)
	b.PutWorker("r", w)
	b.PutEvent("r", e)
	rec.LastCommandSeq = 99
	w.Rank = 99
	e.Message = "after"
	mustCommit(t, db, b)

	rd := mustLoad(t, bk.reopen(t, db))[0]
	if rd.Record.GetLastCommandSeq() != 3 || rd.Workers[0].GetRank() != 1 || rd.Events[0].GetMessage() != "before" {
		t.Fatalf("stored state after Put changed: %v %v %v", rd.Record, rd.Workers[0], rd.Events[0])
	}
}

func testGroupCommit(t *testing.T, bk *backend) {
	const writers, perWriter = 256, 20
	var commits, committed atomic.Int64
	db := bk.open(t, store.Options{OnCommit: func(n int, _ time.Duration) {
		commits.Add(1)
		committed.Add(int64(n))
	}})
	b := &store.Batch{}
	b.PutRun(runRecord("g"))
	mustCommit(t, db, b)
	commits.Store(0)
	committed.Store(0)

	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				b := &store.Batch{}
				b.PutEvent("g", event(int64(w*perWriter+i+1), "x"))
				mustCommit(t, db, b)
			}
		})
	}
	wg.Wait()

	total := int64(writers * perWriter)
	if committed.Load() != total {
		t.Errorf("OnCommit saw %d batches, want %d", committed.Load(), total)
	}
	if commits.Load() >= total {
		t.Errorf("%d commits for %d batches: writers shared no fsync", commits.Load(), total)
	}
	t.Logf("%d batches in %d commits", total, commits.Load())
	if got := len(mustLoad(t, bk.reopen(t, db))[0].Events); int64(got) != total {
		t.Fatalf("%d events durable, want %d", got, total)
	}
}

func testDoneInSubmitOrder(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{MaxBatchesPerCommit: 7})
	setup := &store.Batch{}
	setup.PutRun(runRecord("r"))
	pending := []*store.Pending{db.Submit(setup)}
	for i := range 2000 {
		b := &store.Batch{}
		if i%5 != 0 { // every fifth batch is empty
			b.PutEvent("r", event(int64(i+1), "x"))
		}
		pending = append(pending, db.Submit(b))
	}
	var wg sync.WaitGroup
	for k := 1; k < len(pending); k++ {
		wg.Go(func() {
			<-pending[k].Done()
			select {
			case <-pending[k-1].Done():
			default:
				t.Errorf("batch %d done before batch %d", k, k-1)
			}
		})
	}
	wg.Wait()
	for i, p := range pending {
		if p.Err() != nil {
			t.Fatalf("batch %d: %v", i, p.Err())
		}
	}
}

func testCommitFailurePoisons(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	good := &store.Batch{}
	good.PutRun(runRecord("ok"))
	mustCommit(t, db, good)

	bad, cause := bk.failing()
	err := db.Submit(bad).Wait(context.Background())
	if !errors.Is(err, store.ErrCommitFailed) || !errors.Is(err, cause) {
		t.Fatalf("bad batch: %v, want ErrCommitFailed wrapping %v", err, cause)
	}

	later := &store.Batch{}
	later.PutRun(runRecord("later"))
	if err := db.Submit(later).Wait(context.Background()); !errors.Is(err, store.ErrCommitFailed) {
		t.Fatalf("batch after failure: %v, want ErrCommitFailed", err)
	}
	if err := db.Submit(&store.Batch{}).Wait(context.Background()); !errors.Is(err, store.ErrCommitFailed) {
		t.Fatalf("empty batch after failure: %v, want ErrCommitFailed", err)
	}
	runs := mustLoad(t, bk.reopen(t, db))
	if len(runs) != 1 || runs[0].Record.GetRun().GetRunId() != "ok" {
		t.Fatalf("after poison, stored runs = %v", runs)
	}
}

func testInvalidBatchFails(t *testing.T, bk *backend) {
	cases := map[string]func(b *store.Batch){
		"negative step": func(b *store.Batch) { b.PutStep("r", &storagev1.StepRecord{Step: -1}) },
		"negative seq":  func(b *store.Batch) { b.PutEvent("r", event(-2, "x")) },
		"NUL in run id": func(b *store.Batch) { b.PutWorker("r\x00x", &snapcoordv1.Worker{WorkerId: "w"}) },
	}
	for name, put := range cases {
		t.Run(name, func(t *testing.T) {
			db := bk.open(t, store.Options{})
			b := &store.Batch{}
			b.PutRun(runRecord("r"))
			put(b)
			err := db.Submit(b).Wait(context.Background())
			if !errors.Is(err, store.ErrCommitFailed) {
				t.Fatalf("Submit: %v, want ErrCommitFailed", err)
			}
			if runs := mustLoad(t, db); len(runs) != 0 {
				t.Fatalf("part of an invalid batch was stored: %v", runs)
			}
		})
	}
}

func testCloseDrains(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	var pending []*store.Pending
	for i := range 100 {
		b := &store.Batch{}
		b.PutRun(runRecord(fmt.Sprintf("r%03d", i)))
		pending = append(pending, db.Submit(b))
	}
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i, p := range pending {
		select {
		case <-p.Done():
			if p.Err() != nil {
				t.Fatalf("batch %d: %v", i, p.Err())
			}
		default:
			t.Fatalf("batch %d not done after Close", i)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	p := db.Submit(&store.Batch{})
	if err := p.Wait(context.Background()); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Submit after Close: %v, want ErrClosed", err)
	}
	if runs := mustLoad(t, bk.reopen(t, db)); len(runs) != 100 {
		t.Fatalf("%d runs durable after Close, want 100", len(runs))
	}
}

func testCloseRacesSubmit(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	var wg, committing sync.WaitGroup
	committing.Add(16)
	for range 16 {
		wg.Go(func() {
			first := sync.OnceFunc(committing.Done)
			defer first() // also when the very first Submit already failed
			for {
				b := &store.Batch{}
				b.PutRun(runRecord("r"))
				err := db.Submit(b).Wait(context.Background())
				if errors.Is(err, store.ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Submit: %v", err)
					return
				}
				first()
			}
		})
	}
	committing.Wait() // every writer has committed once and is still submitting
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

func testLoadCorruptRecord(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	b := &store.Batch{}
	b.PutRun(runRecord("r"))
	mustCommit(t, db, b)
	bk.putRaw(t, db, store.BucketWorkers, store.NameKey("r", "bad"), []byte{0xff, 0xff, 0xff})
	_, err := db.Load(context.Background(), store.Everything)
	if err == nil || !strings.Contains(err.Error(), "workers") || !strings.Contains(err.Error(), "bad") {
		t.Fatalf("Load of a corrupt record: %v, want an error naming bucket and key", err)
	}
}

func testLoadOrphanRecord(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	b := &store.Batch{}
	b.PutEvent("ghost", event(1, "x"))
	mustCommit(t, db, b)
	if _, err := db.Load(context.Background(), store.Everything); err == nil || !strings.Contains(err.Error(), "ghost") {
		t.Fatalf("Load of a record without a run: %v", err)
	}
}

// writeManyRuns submits one batch per run without waiting in between, so
// they group-commit.
func writeManyRuns(t testing.TB, db store.Store, nRuns, nWorkers int) {
	t.Helper()
	var pending []*store.Pending
	for r := range nRuns {
		id := fmt.Sprintf("run-%04d", r)
		b := &store.Batch{}
		b.PutRun(runRecord(id))
		for w := range nWorkers {
			b.PutWorker(id, &snapcoordv1.Worker{
				WorkerId: fmt.Sprintf("w%03d", w), Name: "worker", Rank: int32(w),
				RegisteredAt: timestamppb.Now(), LeaseExpiresAt: timestamppb.Now(),
			})
		}
		pending = append(pending, db.Submit(b))
	}
	for _, p := range pending {
		if err := p.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// Reports are stored apart from their snapshot and come back attached to it,
// in the order they were reported, whatever the worker ids.
func testSnapshotReportsRoundTrip(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	at := func(s int64) *timestamppb.Timestamp { return timestamppb.New(time.Unix(1700000000+s, 0)) }
	snap := &snapcoordv1.Snapshot{SnapshotId: "snap-1", IssuedAt: at(0)}
	var b store.Batch
	b.PutRun(&storagev1.RunRecord{Run: &snapcoordv1.Run{RunId: "r"}})
	b.PutSnapshot("r", snap)
	reports := []*snapcoordv1.SnapshotReport{
		{WorkerId: "w9", Outcome: snapcoordv1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, ReportedAt: at(1)},
		{WorkerId: "w10", Outcome: snapcoordv1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, ReportedAt: at(2)},
	}
	for _, r := range reports {
		snap.Reports = append(snap.Reports, r)
		b.PutSnapshotReport("r", "snap-1", r)
	}
	b.PutSnapshot("r", snap) // a later put of the snapshot must not duplicate them
	if err := db.Submit(&b).Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(snap.Reports) != 2 {
		t.Fatalf("PutSnapshot changed the caller's reports: %v", snap.Reports)
	}
	runs := mustLoad(t, bk.reopen(t, db))
	got := runs[0].Snapshots[0].Reports
	if len(got) != 2 || !proto.Equal(got[0], reports[0]) || !proto.Equal(got[1], reports[1]) {
		t.Fatalf("reports after reload: %v", got)
	}
}

// A worker's first report on a snapshot stands, whether a second one comes
// in the same batch or a later one. A completed snapshot loads as a summary;
// Snapshots and SnapshotReport read it in full.
func testCompletedSnapshotReadOnDemand(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	at := func(s int64) *timestamppb.Timestamp { return timestamppb.New(time.Unix(1700000000+s, 0)) }
	rep := func(w string, s int64, o snapcoordv1.SnapshotOutcome) *snapcoordv1.SnapshotReport {
		return &snapcoordv1.SnapshotReport{WorkerId: w, Outcome: o, ReportedAt: at(s)}
	}
	const saved, ioErr = snapcoordv1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, snapcoordv1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR
	done := &snapcoordv1.Snapshot{SnapshotId: "snap-1", ExpectedWorkerIds: []string{"w1", "w2"}, CompletedAt: at(9)}
	open := &snapcoordv1.Snapshot{SnapshotId: "snap-10", ExpectedWorkerIds: []string{"w1"}}
	b := &store.Batch{}
	b.PutRun(runRecord("r"))
	b.PutSnapshot("r", done)
	b.PutSnapshot("r", open)
	b.PutSnapshotReport("r", "snap-1", rep("w2", 1, saved))
	b.PutSnapshotReport("r", "snap-1", rep("w2", 2, ioErr))
	b.PutSnapshotReport("r", "snap-10", rep("w1", 3, saved))
	mustCommit(t, db, b)
	b = &store.Batch{}
	b.PutSnapshotReport("r", "snap-1", rep("w1", 4, saved))
	b.PutSnapshotReport("r", "snap-10", rep("w1", 5, ioErr))
	mustCommit(t, db, b)
	db = bk.reopen(t, db)

	snaps := mustLoad(t, db)[0].Snapshots
	wantOpen := proto.CloneOf(open)
	wantOpen.Reports = []*snapcoordv1.SnapshotReport{rep("w1", 3, saved)}
	summary := proto.CloneOf(done)
	summary.ExpectedWorkerIds = nil
	assertMsgs(t, "loaded snapshots", snaps, []*snapcoordv1.Snapshot{summary, wantOpen})

	wantDone := proto.CloneOf(done)
	wantDone.Reports = []*snapcoordv1.SnapshotReport{rep("w2", 1, saved), rep("w1", 4, saved)}
	var got []*snapcoordv1.Snapshot
	err := db.Snapshots(t.Context(), "r", []string{"snap-10", "snap-1"}, func(s *snapcoordv1.Snapshot) bool {
		got = append(got, s)
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	assertMsgs(t, "read snapshots", got, []*snapcoordv1.Snapshot{wantOpen, wantDone})
	got = nil
	if err := db.Snapshots(t.Context(), "r", []string{"snap-1", "snap-10"}, func(s *snapcoordv1.Snapshot) bool {
		got = append(got, s)
		return false
	}); err != nil || len(got) != 1 {
		t.Fatalf("Snapshots went on after yield returned false: %d snapshots, %v", len(got), err)
	}
	if err := db.Snapshots(t.Context(), "r", []string{"snap-2"}, func(*snapcoordv1.Snapshot) bool { return true }); err == nil || !strings.Contains(err.Error(), "snap-2") {
		t.Fatalf("reading a snapshot never stored: %v", err)
	}

	if r, err := db.SnapshotReport("r", "snap-1", "w2"); err != nil || !proto.Equal(r, rep("w2", 1, saved)) {
		t.Fatalf("SnapshotReport(w2) = %v, %v; want its first report", r, err)
	}
	if r, err := db.SnapshotReport("r", "snap-10", "w2"); err != nil || r != nil {
		t.Fatalf("SnapshotReport of a worker that never reported = %v, %v; want nil", r, err)
	}
}

// DeleteRun removes a run and all it holds, and nothing of another run
// whose id it prefixes; the file stays consistent and loads.
func testDeleteRun(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	_, b := fixture("a")
	kept := addFixture(b, "a.b")
	b.PutSnapshotReport("a", "s1", &snapcoordv1.SnapshotReport{WorkerId: "w1"})
	b.PutSnapshotReport("a.b", "s1", &snapcoordv1.SnapshotReport{WorkerId: "w1"})
	mustCommit(t, db, b)

	b = &store.Batch{}
	b.DeleteRun("a")
	mustCommit(t, db, b)
	db = bk.reopen(t, db)
	runs := mustLoad(t, db)
	if len(runs) != 1 || runs[0].Record.GetRun().GetRunId() != "a.b" {
		t.Fatalf("after DeleteRun(a): %d runs, want only a.b", len(runs))
	}
	kept.Snapshots[0].Reports = []*snapcoordv1.SnapshotReport{{WorkerId: "w1"}}
	assertRunData(t, runs[0], kept)
	if err := bk.check(db); err != nil {
		t.Fatal(err)
	}
	if r, err := db.SnapshotReport("a", "s1", "w1"); err != nil || r != nil {
		t.Fatalf("a's report after DeleteRun: %v, %v", r, err)
	}
}

// A long run loads with its latest steps and events, and the step its
// deadline fired at; Step and Events read the others.
func testLoadWindow(t *testing.T, bk *backend) {
	db := bk.open(t, store.Options{})
	rec := runRecord("r")
	rec.Run.LastStep, rec.Run.FiredAtStep, rec.Run.LastEventSeq = 100, 3, 20
	b := &store.Batch{}
	b.PutRun(rec)
	for s := int64(1); s <= 100; s++ {
		b.PutStep("r", &storagev1.StepRecord{Step: s, MaxIterationSeconds: float64(s)})
	}
	for seq := int64(1); seq <= 20; seq++ {
		b.PutEvent("r", event(seq, "x"))
	}
	mustCommit(t, db, b)

	runs, err := db.Load(context.Background(), store.Window{Steps: 10, Events: 3})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, st := range runs[0].Steps {
		got = append(got, st.Step)
	}
	if want := []int64{3, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100}; !slices.Equal(got, want) {
		t.Errorf("steps loaded: %v, want %v", got, want)
	}
	st, err := db.Step("r", 42)
	if err != nil || st.GetMaxIterationSeconds() != 42 {
		t.Errorf("Step(42) = %v, %v; want the stored record", st, err)
	}
	if st, err := db.Step("r", 101); st != nil || err != nil {
		t.Errorf("Step(101) = %v, %v; want nil, nil", st, err)
	}
	var all []int64
	for seq := int64(1); seq <= 20; seq++ {
		all = append(all, seq)
	}
	for _, c := range []struct {
		after, upTo int64
		limit       int
		want        []int64
	}{
		{0, 20, 100, all},
		{5, 20, 4, []int64{6, 7, 8, 9}},
		{16, 18, 10, []int64{17, 18}},
		{20, 20, 10, nil},
	} {
		evs, err := db.Events("r", c.after, c.upTo, c.limit)
		if err != nil {
			t.Fatal(err)
		}
		if got := seqs(evs); !slices.Equal(got, c.want) {
			t.Errorf("Events(after %d, up to %d, limit %d) = %v, want %v", c.after, c.upTo, c.limit, got, c.want)
		}
	}
	if got := seqs(runs[0].Events); !slices.Equal(got, []int64{18, 19, 20}) {
		t.Errorf("events loaded: %v, want 18, 19, 20", got)
	}
}

func seqs(evs []*snapcoordv1.RunEvent) []int64 {
	var out []int64
	for _, ev := range evs {
		out = append(out, ev.Seq)
	}
	return out
}
