package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
)

// These examples need a running coordinator, so they are compiled but not
// run by `go test`.

// A launcher creates the run and hands its token to the job's processes.
func ExampleClient_createRun() {
	c, err := client.Dial("coordinator.example:7070",
		client.WithToken(os.Getenv("SNAPCOORD_TOKEN")),
		client.WithTLS(client.TLS{CAFile: "/etc/snapcoord/ca.pem"}))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	resp, err := c.Runs.CreateRun(context.Background(), &v1.CreateRunRequest{
		RunId: "grpo-7b-0042",
		Spec: &v1.RunSpec{
			TrainerWorldSize: 8,
			StartedAt:        timestamppb.New(time.Unix(1_790_000_000, 0)), // SLURM_JOB_START_TIME
			Checkpointing:    &v1.CheckpointingSpec{CheckpointMustSaveBy: "00:03:45:00"},
			RolloutRecovery:  &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("export SNAPCOORD_RUN_TOKEN=%s\n", resp.GetRunToken())
}

// The step loop of one trainer rank.
func ExampleTrainer() {
	ctx := context.Background()
	c, err := client.Dial("127.0.0.1:7070", client.WithInsecure(), client.WithRunToken(os.Getenv("SNAPCOORD_RUN_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	rank := int32(0) // e.g. from RANK
	tr, err := c.StartTrainer(ctx, client.TrainerConfig{RunID: "grpo-7b-0042", Rank: rank})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close(ctx)

	// A requeued job resumes after the run's newest checkpoint (0 in a
	// fresh run), restored from disk.
	last := tr.LastCheckpointStep()
	restoreCheckpoint(last)
	for step := last + 1; ; step++ {
		// The iteration is the step's training alone: timed from after the
		// previous CompleteStep or save returned, never counting the
		// save or the time spent in CompleteStep itself.
		began := time.Now()
		train(step)
		d, err := tr.CompleteStep(ctx, step, time.Since(began))
		if err != nil {
			log.Fatal(err)
		}
		switch d.GetAction() {
		case v1.StepAction_STEP_ACTION_CONTINUE:
			continue
		case v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE, v1.StepAction_STEP_ACTION_SAVE_AND_STOP:
			began = time.Now()
			saveCheckpoint(step)
			if _, err := tr.ReportCheckpoint(ctx, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, time.Since(began)); err != nil {
				log.Fatal(err)
			}
			if d.GetAction() == v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE {
				continue // a safety save
			}
		}
		log.Printf("stopping after step %d: %s", step, d.GetExplanation())
		return
	}
}

// An environment worker saves its state when told to. Saving in the loop,
// as here, keeps the example short but reads no command while a save runs:
// a worker whose regular snapshots can take long should save in the
// background and cancel a regular save when SaveAtDeadline arrives (the
// coordinator has then superseded that snapshot, and the deadline save
// must not wait behind it), as `snapctl sidecar` does.
func ExampleWorker() {
	ctx := context.Background()
	c, err := client.Dial("127.0.0.1:7070", client.WithInsecure(), client.WithRunToken(os.Getenv("SNAPCOORD_RUN_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	w, err := c.StartWorker(ctx, client.WorkerConfig{
		RunID: "grpo-7b-0042", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-host3-slot1",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close(ctx)

	for cmd := range w.Commands() {
		var id string
		switch {
		case cmd.GetSaveAtDeadline() != nil:
			id = cmd.GetSaveAtDeadline().GetSnapshotId()
		case cmd.GetSnapshot() != nil:
			id = cmd.GetSnapshot().GetSnapshotId()
		default:
			continue // Stop: the channel closes next
		}
		began := time.Now()
		outcome := v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED
		if err := saveEnvironment(id); err != nil {
			outcome = v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR
		}
		if _, err := w.ReportSnapshot(ctx, id, outcome, time.Since(began), ""); err != nil {
			log.Print(err)
		}
	}
	if err := w.Err(); err != nil {
		log.Fatal(err)
	}
}

// An operator follows a run's events as they happen.
func ExampleClient_WatchEvents() {
	c, err := client.Dial("127.0.0.1:7070", client.WithInsecure())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.WatchEvents(context.Background(), "grpo-7b-0042", 0, true, func(ev *v1.RunEvent) error {
		fmt.Println(ev.GetSeq(), ev.GetMessage())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

func train(int64)                  {}
func saveCheckpoint(int64)         {}
func restoreCheckpoint(int64)      {}
func saveEnvironment(string) error { return nil }
