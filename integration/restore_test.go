package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/server/clock"
	"github.com/snapcoord/snapcoord/server/coordinator"
)

// An operator restores the coordinator's data file from a copy made at
// step 3, while the two client.Trainer ranks trained on to step 7. Their
// next step is taken as the run's step after the restore (a WARNING event
// names the rank and the steps lost), every later decision is the same for
// both ranks, and the deadline fires at the step the rule gives, 11: with
// 5-minute steps from the run's creation, B an hour after it, and I, C and
// M of 300, 60 and 60 s, the first step decided at or after B − 420 s.
// Without the restore taken, step 8 is refused and reaches the loop.
func TestTrainersGoOnAfterTheCoordinatorIsRestoredFromAnOlderCopy(t *testing.T) {
	ctx := testContext(t)
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	srv := startInproc(t, hourlyHeartbeats, coordinator.WithClock(clk))
	ranks := restoreRun(ctx, t, srv.addr, "restored", clk.Now().Add(time.Hour))

	stepRanks(ctx, t, clk, ranks, 1, 3)
	file := filepath.Join(srv.cfg.DataDir, coordinator.StoreFile)
	srv.stop() // a copy of a file being written may be torn
	copyAtStep3, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	srv.start()
	stepRanks(ctx, t, clk, ranks, 4, 7)
	srv.stop()
	if err := os.WriteFile(file, copyAtStep3, 0o600); err != nil {
		t.Fatal(err)
	}
	srv.start()
	fired := stepRanks(ctx, t, clk, ranks, 8, 30)

	r := &run{c: newCluster(t, srv.addr), id: "restored"}
	got := r.get(ctx)
	if fired != 11 || got.GetState() != v1.RunState_RUN_STATE_STOPPED || got.GetFiredAtStep() != 11 ||
		got.GetFireKind() != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_STEP || got.GetLastPublishedStep() != 11 {
		t.Fatalf("the ranks saved at step %d; run %v fired %v at step %d, published %d; want step 11, STOPPED, STEP, 11",
			fired, got.GetState(), got.GetFireKind(), got.GetFiredAtStep(), got.GetLastPublishedStep())
	}
	var warned []string
	for _, ev := range eventsOf(r.events(ctx), v1.RunEventType_RUN_EVENT_TYPE_WARNING) {
		warned = append(warned, ev.GetMessage())
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "is at step 8 and the run's last recorded step is 3") ||
		!strings.Contains(warned[0], "steps 4 to 7 are not recorded") {
		t.Errorf("WARNING events %q; want one naming the rank, step 8 and the steps lost", warned)
	}
	for i, rk := range ranks {
		if errs := rk.logs.At(slog.LevelError); len(errs) > 0 {
			t.Errorf("rank %d logged ERRORs %q", i, errs)
		}
	}
	closeAll(ctx, t, ranks)
}

// restoreRun creates a run of two ranks due at b, with C and M of a
// minute and no environment snapshots, and starts both ranks with the
// default plan.
func restoreRun(ctx context.Context, t *testing.T, addr, id string, b time.Time) [2]failSafeRank {
	t.Helper()
	resp, err := dialClient(t, addr, "").Runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: id, Spec: &v1.RunSpec{
		TrainerWorldSize: 2,
		Checkpointing:    &v1.CheckpointingSpec{MustSaveBy: timestamppb.New(b)},
		Reserve:          &v1.ReserveSpec{MarginSeconds: 60, ExpectedCheckpointSeconds: proto.Float64(60)},
	}})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	return startRanks(ctx, t, addr, id, resp.GetRunToken(), client.FailSafeConfig{}) // the default plan
}

// stepRanks has both ranks complete steps from..to, 5 minutes each on
// clk, as a training loop: each asks the coordinator, and both must hear
// the same decision from it; they save every third step, and at a
// SAVE_AND_STOP, which ends the loop. It returns the step that said
// SAVE_AND_STOP, 0 if none did.
func stepRanks(ctx context.Context, t *testing.T, clk *clock.Fake, ranks [2]failSafeRank, from, to int64) int64 {
	t.Helper()
	for step := from; step <= to; step++ {
		clk.Advance(5 * time.Minute)
		var ds [2]*v1.Decision
		var errs [2]error
		var wg sync.WaitGroup
		for i, r := range ranks {
			wg.Go(func() { ds[i], errs[i] = r.tr.CompleteStep(ctx, step, 5*time.Minute) })
		}
		wg.Wait()
		for i, err := range errs {
			if err == nil && strings.HasPrefix(ds[i].GetExplanation(), "decided by this rank") {
				err = fmt.Errorf("decided without the coordinator: %s", ds[i].GetExplanation())
			}
			if err != nil {
				t.Fatalf("rank %d, step %d: %v", i, step, err)
			}
		}
		if !proto.Equal(ds[0], ds[1]) {
			t.Fatalf("step %d: rank 0 heard %v, rank 1 %v", step, ds[0], ds[1])
		}
		save := ds[0].GetAction() == v1.StepAction_STEP_ACTION_SAVE_AND_STOP
		if save || step%3 == 0 {
			for i, r := range ranks {
				if _, err := r.tr.ReportCheckpoint(ctx, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 30*time.Second); err != nil {
					t.Fatalf("rank %d, checkpoint of step %d: %v", i, step, err)
				}
			}
		}
		if save {
			return step
		}
	}
	return 0
}
