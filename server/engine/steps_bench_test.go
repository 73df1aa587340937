package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/store"
)

// BenchmarkCompleteStep is the engine's part of snapbench's CompleteStep
// figure: 8 runs × 8 trainer ranks ask about steps 1, 2, 3 … back to back,
// far from the deadline; the first rank to ask about a step makes a durable
// decision, the other seven get it (no gRPC). One op is one call.
func BenchmarkCompleteStep(b *testing.B) {
	const runs, ranks = 8, 8
	ctx := context.Background()
	db, err := store.Open(filepath.Join(b.TempDir(), "snapcoord.db"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	eng, err := engine.New(ctx, db, engine.Options{LeaseTTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	var callers []*v1.CompleteStepRequest
	for r := range runs {
		run := fmt.Sprintf("steps-%d", r)
		if _, err := eng.CreateRun(ctx, &v1.CreateRunRequest{RunId: run, Spec: &v1.RunSpec{
			TrainerWorldSize: ranks,
			Checkpointing:    &v1.CheckpointingSpec{CheckpointMustSaveBy: "30:00:00:00"},
		}}); err != nil {
			b.Fatal(err)
		}
		for k := range ranks {
			resp, err := eng.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: run, Role: v1.WorkerRole_WORKER_ROLE_TRAINER,
				Rank: int32(k), Name: fmt.Sprintf("rank-%d", k)})
			if err != nil {
				b.Fatal(err)
			}
			callers = append(callers, &v1.CompleteStepRequest{RunId: run, WorkerId: resp.WorkerId, IterationSeconds: 10})
		}
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	before := liveHeap()
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, c := range callers {
		wg.Go(func() {
			for step := int64(1); left.Add(-1) >= 0; step++ {
				req := &v1.CompleteStepRequest{RunId: c.RunId, WorkerId: c.WorkerId, Step: step, IterationSeconds: c.IterationSeconds}
				if _, err := eng.CompleteStep(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	b.StopTimer()
	// What a long run keeps in memory for every step it has taken (the step
	// record with its decision, and the decision's event).
	steps := int64(0)
	for r := range runs {
		run, err := eng.GetRun(ctx, &v1.GetRunRequest{RunId: fmt.Sprintf("steps-%d", r)})
		if err != nil {
			b.Fatal(err)
		}
		steps += run.Run.LastStep
	}
	b.ReportMetric(float64(liveHeap()-before)/float64(steps), "retained-B/step")
}
