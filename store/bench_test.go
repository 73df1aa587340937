package store_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	snapcoordv1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/store"
)

// benchDB opens a store with one run and counts commits.
func benchDB(b *testing.B) (*store.DB, *atomic.Int64) {
	commits := new(atomic.Int64)
	db := mustOpen(b, tempPath(b), store.Options{OnCommit: func(int, time.Duration) { commits.Add(1) }})
	setup := &store.Batch{}
	setup.PutRun(runRecord("bench"))
	mustCommit(b, db, setup)
	commits.Store(0)
	return db, commits
}

// benchBatch is a typical report: a worker update and an event.
func benchBatch(seq int64) *store.Batch {
	b := &store.Batch{}
	b.PutWorker("bench", &snapcoordv1.Worker{WorkerId: "w", Rank: 3, Incarnation: seq})
	b.PutEvent("bench", event(seq, "worker reported"))
	return b
}

func report(b *testing.B, commits *atomic.Int64) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
	if c := commits.Load(); c > 0 {
		b.ReportMetric(float64(b.N)/float64(c), "batches/commit")
	}
}

// BenchmarkSubmit has many concurrent writers, each waiting for its own
// batch, as RPC handlers do; they share fsyncs.
func BenchmarkSubmit(b *testing.B) {
	db, commits := benchDB(b)
	var seq atomic.Int64
	b.SetParallelism(64) // 64 × GOMAXPROCS writers
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if err := db.Submit(benchBatch(seq.Add(1))).Wait(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	report(b, commits)
}

// BenchmarkSubmitSerial is one writer: every batch pays a full commit.
func BenchmarkSubmitSerial(b *testing.B) {
	db, commits := benchDB(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		if err := db.Submit(benchBatch(int64(i + 1))).Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
	report(b, commits)
}

// BenchmarkLoad reads 1000 runs with 100 workers each.
func BenchmarkLoad(b *testing.B) {
	db := mustOpen(b, tempPath(b), store.Options{})
	writeManyRuns(b, db, 1000, 100)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if _, err := db.Load(ctx, store.Everything); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDeleteRun deletes a run the size of a long job's (100,000
// events, 10,000 steps, 1,000 workers) in one commit: the time every other
// commit waits when a finished run's retention ends.
func BenchmarkDeleteRun(b *testing.B) {
	db := mustOpen(b, tempPath(b), store.Options{})
	ctx := context.Background()
	for i := range b.N {
		b.StopTimer()
		id := fmt.Sprintf("run-%d", i)
		setup := &store.Batch{}
		setup.PutRun(runRecord(id))
		for n := range int64(100_000) {
			setup.PutEvent(id, event(n, "step decided: continue"))
		}
		for n := range int64(10_000) {
			setup.PutStep(id, &storagev1.StepRecord{Step: n, MaxIterationSeconds: 30})
		}
		for w := range 1000 {
			setup.PutWorker(id, &snapcoordv1.Worker{WorkerId: fmt.Sprintf("w%d", w), Name: "env"})
		}
		mustCommit(b, db, setup)
		del := &store.Batch{}
		del.DeleteRun(id)
		b.StartTimer()
		if err := db.Submit(del).Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
