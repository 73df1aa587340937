package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/store"
)

// BenchmarkSnapshotReports is one snapshot reported by every environment
// worker of a run (the deadline snapshot of a large job), 256 reports at a
// time, through the engine and a real bbolt file. One op is one snapshot;
// the cost of a report must not grow with the number of workers.
func BenchmarkSnapshotReports(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			ctx := context.Background()
			db, err := store.Open(filepath.Join(b.TempDir(), "snapcoord.db"), store.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			eng, err := engine.New(ctx, db, engine.Options{LeaseTTL: time.Hour, MaxWorkersPerRun: n + 1})
			if err != nil {
				b.Fatal(err)
			}
			defer eng.Close()
			const run = "bench"
			if _, err := eng.CreateRun(ctx, &v1.CreateRunRequest{RunId: run, Spec: &v1.RunSpec{
				TrainerWorldSize: 1,
				Checkpointing:    &v1.CheckpointingSpec{CheckpointMustSaveBy: "30:00:00:00"},
				RolloutRecovery:  &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN},
			}}); err != nil {
				b.Fatal(err)
			}
			trainer, err := eng.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: run, Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0"})
			if err != nil {
				b.Fatal(err)
			}
			envs := registerEnvs(b, eng, run, n)
			before := liveHeap()
			b.ResetTimer()
			for i := range b.N {
				// Each published checkpoint issues the next snapshot, snap-(i+1).
				if _, err := eng.ReportCheckpoint(ctx, &v1.ReportCheckpointRequest{RunId: run, WorkerId: trainer.WorkerId,
					Step: int64(i + 1), Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 1}); err != nil {
					b.Fatal(err)
				}
				snap := fmt.Sprintf("snap-%d", i+1)
				next := make(chan string)
				var wg sync.WaitGroup
				for range 256 {
					wg.Go(func() {
						for w := range next {
							if _, err := eng.ReportSnapshot(ctx, &v1.ReportSnapshotRequest{RunId: run, WorkerId: w, SnapshotId: snap,
								Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, DurationSeconds: 1}); err != nil {
								b.Error(err)
							}
						}
					})
				}
				for _, w := range envs {
					next <- w
				}
				close(next)
				wg.Wait()
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "reports/s")
			b.StopTimer()
			// What a long run pays for every snapshot it has taken.
			b.ReportMetric(float64(liveHeap()-before)/float64(b.N), "retained-B/snapshot")
		})
	}
}

// liveHeap is the heap in use after a full collection.
func liveHeap() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// registerEnvs registers n environment workers, 64 at a time (each
// registration waits for its commit).
func registerEnvs(b *testing.B, eng *engine.Engine, run string, n int) []string {
	b.Helper()
	ids := make([]string, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for i := range next {
				resp, err := eng.RegisterWorker(context.Background(), &v1.RegisterWorkerRequest{RunId: run,
					Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: fmt.Sprintf("env-%d", i)})
				if err != nil {
					b.Error(err)
					continue
				}
				ids[i] = resp.WorkerId
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return ids
}
