package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// The run: B 12 s after creation, priors C 2 s and R 1 s, M 2 s, steps of
// about 0.6 s, a checkpoint every third step and an interval snapshot every
// 2 s: the deadline fires at about 6 s, and the timeline has a bit of
// everything.
const (
	budget       = "00:00:00:12"
	stepEvery    = 600 * time.Millisecond
	snapshotTook = 400 * time.Millisecond
	saveTook     = 300 * time.Millisecond
)

func bearer(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// turnSpec is a turn-level run of world ranks due within budget, with an
// interval snapshot every 2 s, M 2 s and priors C (ckpt seconds) and R 1 s.
func turnSpec(world int32, budget string, ckpt float64) *v1.RunSpec {
	return &v1.RunSpec{
		TrainerWorldSize:     world,
		Checkpointing:        &v1.CheckpointingSpec{CheckpointMustSaveBy: budget},
		RolloutCheckpointing: &v1.RolloutCheckpointingSpec{SnapshotAttemptIntervalS: proto.Int32(2)},
		RolloutRecovery:      &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN},
		Reserve:              &v1.ReserveSpec{MarginSeconds: 2, ExpectedCheckpointSeconds: proto.Float64(ckpt), ExpectedSnapshotSeconds: proto.Float64(1)},
	}
}

// driveRun plays the run until it is STOPPED.
func driveRun(ctx context.Context, addr, runID string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	runs, workers := v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn)
	admin := bearer(ctx, adminToken)
	created, err := runs.CreateRun(admin, &v1.CreateRunRequest{RunId: runID, Spec: turnSpec(1, budget, 2)})
	if err != nil {
		return fmt.Errorf("CreateRun: %w", err)
	}
	asRun := bearer(ctx, created.GetRunToken())
	register := func(role v1.WorkerRole, name string) (string, error) {
		r, err := workers.RegisterWorker(asRun, &v1.RegisterWorkerRequest{RunId: runID, Role: role, Name: name})
		return r.GetWorkerId(), err
	}
	trainer, err := register(v1.WorkerRole_WORKER_ROLE_TRAINER, "rank-0")
	if err != nil {
		return fmt.Errorf("RegisterWorker(rank-0): %w", err)
	}
	env, err := register(v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, "env-0")
	if err != nil {
		return fmt.Errorf("RegisterWorker(env-0): %w", err)
	}
	beatCtx, stopBeats := context.WithCancel(asRun)
	defer stopBeats()
	go heartbeat(beatCtx, workers, runID, trainer, env)
	envDone := make(chan error, 1)
	go func() { envDone <- environment(asRun, workers, runID, env) }()
	if err := train(asRun, workers, runID, trainer); err != nil {
		return err
	}
	if err := <-envDone; err != nil {
		return err
	}
	stopBeats()
	got, err := runs.GetRun(admin, &v1.GetRunRequest{RunId: runID})
	if err != nil {
		return err
	}
	if got.GetRun().GetState() != v1.RunState_RUN_STATE_STOPPED {
		return fmt.Errorf("run ended %v, want STOPPED: %s", got.GetRun().GetState(), got.GetRun().GetFailureMessage())
	}
	return nil
}

// heartbeat keeps the workers' leases (--lease-ttl 5s) until ctx ends.
func heartbeat(ctx context.Context, workers v1.WorkerServiceClient, runID string, ids ...string) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, id := range ids {
				_, _ = workers.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: runID, WorkerId: id})
			}
		}
	}
}

// train completes steps until the deadline fires, then saves that step.
func train(ctx context.Context, workers v1.WorkerServiceClient, runID, id string) error {
	last := time.Now()
	for step := int64(1); step <= 100; step++ {
		time.Sleep(stepEvery)
		now := time.Now()
		resp, err := workers.CompleteStep(ctx, &v1.CompleteStepRequest{RunId: runID, WorkerId: id, Step: step,
			IterationSeconds: now.Sub(last).Seconds()})
		if err != nil {
			return fmt.Errorf("CompleteStep(%d): %w", step, err)
		}
		last = now
		action := resp.GetDecision().GetAction()
		if step%3 != 0 && action == v1.StepAction_STEP_ACTION_CONTINUE {
			continue
		}
		time.Sleep(saveTook)
		if _, err := workers.ReportCheckpoint(ctx, &v1.ReportCheckpointRequest{RunId: runID, WorkerId: id, Step: step,
			Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: saveTook.Seconds()}); err != nil {
			return fmt.Errorf("ReportCheckpoint(%d): %w", step, err)
		}
		if action != v1.StepAction_STEP_ACTION_CONTINUE {
			return nil
		}
	}
	return errors.New("the deadline did not fire in 100 steps")
}

// environment answers every snapshot command until Stop.
func environment(ctx context.Context, workers v1.WorkerServiceClient, runID, id string) error {
	after := int64(0)
	for {
		resp, err := workers.PollCommands(ctx, &v1.PollCommandsRequest{RunId: runID, WorkerId: id, AfterSeq: after, WaitSeconds: 10})
		if err != nil {
			return fmt.Errorf("PollCommands: %w", err)
		}
		for _, cmd := range resp.GetCommands() {
			after = cmd.GetSeq()
			snap := cmd.GetSnapshot().GetSnapshotId()
			if s := cmd.GetSaveAtDeadline(); s != nil {
				snap = s.GetSnapshotId()
			}
			switch {
			case cmd.GetStop() != nil:
				return nil
			case snap != "":
				time.Sleep(snapshotTook)
				if _, err := workers.ReportSnapshot(ctx, &v1.ReportSnapshotRequest{RunId: runID, WorkerId: id, SnapshotId: snap,
					Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, DurationSeconds: snapshotTook.Seconds()}); err != nil {
					return fmt.Errorf("ReportSnapshot(%s): %w", snap, err)
				}
			}
		}
	}
}
