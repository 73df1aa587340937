package engine

import (
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/deadline"
)

// maxStartedAtSkew bounds how far spec.started_at may be from now.
const maxStartedAtSkew = 366 * 24 * time.Hour

// Spec defaults (DESIGN.md).
const (
	defaultMaxConsecutiveFailures = 3
	defaultSnapshotTimeoutS       = 600
	defaultReserveWindow          = 5
)

// normalizeSpec checks the rules that span fields (protovalidate checked each
// field on its own) and returns the spec with defaults filled in. now is the
// default started_at.
func normalizeSpec(in *v1.RunSpec, now time.Time) (*v1.RunSpec, error) {
	if in == nil {
		return nil, errorf(ErrInvalidArgument, "spec: required")
	}
	s := proto.Clone(in).(*v1.RunSpec)
	if s.TrainerWorldSize < 1 {
		return nil, errorf(ErrInvalidArgument, "spec.trainer_world_size: must be at least 1")
	}
	if s.StartedAt == nil {
		s.StartedAt = timestamppb.New(now)
	}
	if err := s.StartedAt.CheckValid(); err != nil {
		return nil, errorf(ErrInvalidArgument, "spec.started_at: not a valid timestamp")
	}
	if d := s.StartedAt.AsTime().Sub(now); d > maxStartedAtSkew || d < -maxStartedAtSkew {
		// A zero time.Time (year 1) or a unit mix-up, more likely than a
		// job that started a year ago: its B would be long past, and the
		// run would fire at once, which cannot be undone.
		return nil, errorf(ErrInvalidArgument, "spec.started_at: %s is more than a year from now", s.StartedAt.AsTime().UTC().Format(time.RFC3339))
	}
	fillDefaults(s)
	if _, err := mustSaveBy(s.StartedAt.AsTime(), s.Checkpointing.CheckpointMustSaveBy, s.Checkpointing.MustSaveBy, "spec.checkpointing."); err != nil {
		return nil, err
	}
	if err := checkSaves(s); err != nil {
		return nil, err
	}
	if err := checkPolicy(s); err != nil {
		return nil, err
	}
	if err := checkSafetySaves(s); err != nil {
		return nil, err
	}
	return s, nil
}

func fillDefaults(s *v1.RunSpec) {
	if s.Checkpointing == nil {
		s.Checkpointing = &v1.CheckpointingSpec{}
	}
	if s.RolloutCheckpointing == nil {
		s.RolloutCheckpointing = &v1.RolloutCheckpointingSpec{}
	}
	rc := s.RolloutCheckpointing
	if rc.SnapshotOnTrainerCheckpoint == nil {
		rc.SnapshotOnTrainerCheckpoint = proto.Bool(true)
	}
	if rc.MaxConsecutiveFailures == 0 {
		rc.MaxConsecutiveFailures = defaultMaxConsecutiveFailures
	}
	if rc.SnapshotTimeoutS == 0 {
		rc.SnapshotTimeoutS = defaultSnapshotTimeoutS
	}
	if s.RolloutRecovery == nil {
		s.RolloutRecovery = &v1.RolloutRecoverySpec{}
	}
	if s.RolloutRecovery.TargetLevel == v1.TargetLevel_TARGET_LEVEL_UNSPECIFIED {
		s.RolloutRecovery.TargetLevel = v1.TargetLevel_TARGET_LEVEL_PROMPT_GROUP
	}
	if s.Reserve == nil {
		s.Reserve = &v1.ReserveSpec{}
	}
	if s.Reserve.Window == 0 {
		s.Reserve.Window = defaultReserveWindow
	}
}

// checkSaves rejects specs that would never save environment state, or that
// would snapshot a checkpoint before it is published.
func checkSaves(s *v1.RunSpec) error {
	rc := s.RolloutCheckpointing
	fineLevel := needsSnapshots(s.RolloutRecovery.TargetLevel)
	hasDeadline := s.Checkpointing.CheckpointMustSaveBy != "" || s.Checkpointing.MustSaveBy != nil
	afterCheckpoint := fineLevel && rc.GetSnapshotOnTrainerCheckpoint()
	if fineLevel && !rc.GetSnapshotOnTrainerCheckpoint() && rc.SnapshotAttemptIntervalS == nil && !hasDeadline {
		return errorf(ErrInvalidArgument, "spec.rollout_checkpointing.snapshot_on_trainer_checkpoint: false at %s level with no snapshot_attempt_interval_s and no checkpointing deadline would never save environment state",
			s.RolloutRecovery.TargetLevel)
	}
	if !s.Checkpointing.DeferredFinalize {
		return nil
	}
	if rc.SnapshotAttemptIntervalS != nil {
		return errorf(ErrInvalidArgument, "spec.rollout_checkpointing.snapshot_attempt_interval_s: not allowed with checkpointing.deferred_finalize (a snapshot must be anchored to a published checkpoint)")
	}
	if afterCheckpoint {
		return errorf(ErrInvalidArgument, "spec.rollout_checkpointing.snapshot_on_trainer_checkpoint: must be false at %s level with checkpointing.deferred_finalize (a snapshot must be anchored to a published checkpoint); deadline-only snapshots are allowed",
			s.RolloutRecovery.TargetLevel)
	}
	return nil
}

// mustSaveBy resolves B from either form; the zero time means no deadline.
// prefix names the fields in errors.
func mustSaveBy(startedAt time.Time, budget string, abs *timestamppb.Timestamp, prefix string) (time.Time, error) {
	if budget != "" && abs != nil {
		return time.Time{}, errorf(ErrInvalidArgument, "%scheckpoint_must_save_by: give either checkpoint_must_save_by or must_save_by, not both", prefix)
	}
	if abs != nil {
		if err := abs.CheckValid(); err != nil {
			return time.Time{}, errorf(ErrInvalidArgument, "%smust_save_by: not a valid timestamp", prefix)
		}
		if abs.AsTime().Before(startedAt) {
			// A zero time.Time (year 1), typically: the run would fire at once.
			return time.Time{}, errorf(ErrInvalidArgument, "%smust_save_by: %s is before the run's started_at %s",
				prefix, abs.AsTime().UTC().Format(time.RFC3339), startedAt.UTC().Format(time.RFC3339))
		}
		return abs.AsTime(), nil
	}
	if budget == "" {
		return time.Time{}, nil
	}
	d, err := deadline.ParseBudget(budget)
	if err != nil {
		return time.Time{}, errorf(ErrInvalidArgument, "%scheckpoint_must_save_by: %q %s", prefix, budget, err.Error())
	}
	return startedAt.Add(d), nil
}

func needsSnapshots(l v1.TargetLevel) bool {
	return l == v1.TargetLevel_TARGET_LEVEL_TURN || l == v1.TargetLevel_TARGET_LEVEL_PREFIX
}

// snapshotsEnabled is rollout_snapshots_enabled of the original.
func snapshotsEnabled(s *v1.RunSpec) bool {
	return s.RolloutCheckpointing.SnapshotAttemptIntervalS != nil || needsSnapshots(s.RolloutRecovery.TargetLevel)
}

// snapshotAfterCheckpoint: turn/prefix level with snapshot_on_trainer_checkpoint.
func snapshotAfterCheckpoint(s *v1.RunSpec) bool {
	return needsSnapshots(s.RolloutRecovery.TargetLevel) && s.RolloutCheckpointing.GetSnapshotOnTrainerCheckpoint()
}

// sameSpec tells an idempotent CreateRun retry from a conflicting one. A
// retry that leaves started_at to the server matches any stored started_at.
// A requested spec that is invalid in itself is its error, whether or not
// the run exists.
func sameSpec(stored, requested *v1.RunSpec) (bool, error) {
	norm, err := normalizeSpec(requested, stored.StartedAt.AsTime())
	if err != nil {
		return false, err
	}
	return proto.Equal(stored, norm), nil
}

// regularSaveFollows: the trainer saves a regular checkpoint after step,
// before its next iteration (checkpointing.checkpoint_every_steps). Step 0
// is no step: before the first one its number is not known.
func regularSaveFollows(s *v1.RunSpec, step int64) bool {
	every := int64(s.GetCheckpointing().GetCheckpointEverySteps())
	return every > 0 && step > 0 && step%every == 0
}

// observations gathers what the deadline policy needs to decide step (0:
// before the first step).
func (r *runState) observations(step int64) deadline.Observations {
	spec := r.rec.Run.Spec
	res := spec.Reserve
	o := deadline.Observations{
		MaxIterationSeconds:       r.rec.MaxIterationSeconds,
		CheckpointSeconds:         r.rec.MaxCheckpointSeconds,
		CheckpointMeasured:        r.rec.CheckpointMeasured,
		ExpectedCheckpointSeconds: res.ExpectedCheckpointSeconds,
		SavedSnapshotSeconds:      r.rec.SavedSnapshotSeconds,
		ExpectedSnapshotSeconds:   res.ExpectedSnapshotSeconds,
		MarginSeconds:             res.MarginSeconds,
		RegularSaveFollows:        regularSaveFollows(spec, step),
		SnapshotFollowsCheckpoint: snapshotAfterCheckpoint(spec),
	}
	if expectedLoss(r) {
		o.History = r.history()
	}
	return o
}

// nextStep is the step the next decision is about: 0 before the first
// step, which may have any number (a run resumed from a checkpoint).
func (r *runState) nextStep() int64 {
	if r.rec.Run.LastStep == 0 {
		return 0
	}
	return r.rec.Run.LastStep + 1
}

func (r *runState) mustSaveBy() (time.Time, bool) {
	b := r.rec.Run.Deadline.GetMustSaveBy()
	if b == nil {
		return time.Time{}, false
	}
	return b.AsTime(), true
}

// deadlineView is Run.deadline: B and the estimates the next decision uses.
func (e *Engine) deadlineView(r *runState) *v1.Deadline {
	return e.deadlineOf(r, e.policyOf(r).Estimate(r.observations(r.nextStep())))
}

// deadlineOf is B with the estimates est, and when the rule fires with them.
func (e *Engine) deadlineOf(r *runState, est deadline.Estimates) *v1.Deadline {
	d := &v1.Deadline{
		MustSaveBy:         r.rec.Run.Deadline.GetMustSaveBy(),
		IterationSeconds:   est.Iteration,
		CheckpointSeconds:  est.Checkpoint,
		SaveReserveSeconds: est.Reserve,
		MarginSeconds:      est.Margin,
	}
	if est.RegularSaveFollows {
		d.RegularSaveSeconds = proto.Float64(est.RegularSave)
	}
	if r.rec.ManualFirePending {
		d.TriggerPending = r.rec.ManualFireReason
	}
	if b, ok := r.mustSaveBy(); ok {
		d.FiresAt = timestamppb.New(e.policyOf(r).FiresAt(b, est))
	}
	if expectedLoss(r) {
		d.LastDurableSave = timestamppb.New(r.lastDurableSave())
	}
	return d
}
