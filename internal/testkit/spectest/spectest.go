// Package spectest builds the run specs that tests across the project
// create runs from, so that "a turn-level run of two ranks due in an hour"
// is written one way. Each returns a fresh spec the caller may change.
package spectest

import (
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Checkpointed is world trainer ranks that must have saved a checkpoint
// within budget ("DD:HH:MM:SS") of their first step; no rollout recovery.
func Checkpointed(world int32, budget string) *v1.RunSpec {
	return &v1.RunSpec{
		TrainerWorldSize: world,
		Checkpointing:    &v1.CheckpointingSpec{CheckpointMustSaveBy: budget},
	}
}

// Turn is Checkpointed with turn-level rollout recovery: environment
// workers snapshot after every published checkpoint and at the deadline.
func Turn(world int32, budget string) *v1.RunSpec {
	s := Checkpointed(world, budget)
	s.RolloutRecovery = turnLevel()
	return s
}

// TurnUntil is a turn-level run whose deadline is the absolute time b.
// afterCheckpoint keeps snapshot_on_trainer_checkpoint (a Snapshot after
// every published checkpoint); otherwise the only environment commands
// are SaveAtDeadline and Stop.
func TurnUntil(world int32, b time.Time, afterCheckpoint bool) *v1.RunSpec {
	return &v1.RunSpec{
		TrainerWorldSize:     world,
		Checkpointing:        &v1.CheckpointingSpec{MustSaveBy: timestamppb.New(b)},
		RolloutRecovery:      turnLevel(),
		RolloutCheckpointing: &v1.RolloutCheckpointingSpec{SnapshotOnTrainerCheckpoint: proto.Bool(afterCheckpoint)},
	}
}

func turnLevel() *v1.RolloutRecoverySpec {
	return &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN}
}
