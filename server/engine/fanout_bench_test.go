package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/store"
)

// BenchmarkFanout is the engine's part of a SaveAtDeadline fan-out: n
// command streams wait; the deadline is triggered; one op ends when every
// stream has handed its SaveAtDeadline to send (no gRPC).
func BenchmarkFanout(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			ctx := context.Background()
			db, err := store.Open(filepath.Join(b.TempDir(), "snapcoord.db"), store.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			eng, err := engine.New(ctx, db, engine.Options{LeaseTTL: time.Hour, MaxWorkersPerRun: n, MaxRuns: b.N + 1})
			if err != nil {
				b.Fatal(err)
			}
			defer eng.Close()
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				run := fmt.Sprintf("fanout-%d", i)
				if _, err := eng.CreateRun(ctx, &v1.CreateRunRequest{RunId: run, Spec: &v1.RunSpec{
					TrainerWorldSize: 1,
					Checkpointing:    &v1.CheckpointingSpec{CheckpointMustSaveBy: "30:00:00:00"},
					RolloutRecovery:  &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN},
				}}); err != nil {
					b.Fatal(err)
				}
				sctx, cancel := context.WithCancel(ctx)
				var got, done sync.WaitGroup
				got.Add(n)
				for _, id := range registerEnvs(b, eng, run, n) {
					done.Go(func() {
						// After seq 0: only the SaveAtDeadline counts.
						_ = eng.StreamCommands(sctx, &v1.StreamCommandsRequest{RunId: run, WorkerId: id},
							func(c *v1.Command) error {
								if c.GetSaveAtDeadline() != nil {
									got.Done()
								}
								return nil
							})
					})
				}
				b.StartTimer()
				if _, err := eng.TriggerDeadline(ctx, &v1.TriggerDeadlineRequest{RunId: run}); err != nil {
					b.Fatal(err)
				}
				got.Wait()
				b.StopTimer()
				cancel()
				done.Wait()
				b.StartTimer()
			}
		})
	}
}
