package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// nemoRLConfig is the part of a NeMo RL training config that becomes a run
// spec. Everything else in the file (policy, cluster, data, other
// checkpointing keys) is ignored. Pointers tell "absent or null" from a
// value. checkpointing.deferred_finalize is snapcoord's own key: NeMo RL's
// CheckpointingConfig has none (it always finalizes in the background) but
// accepts extra keys.
type nemoRLConfig struct {
	Checkpointing struct {
		Enabled              *bool   `yaml:"enabled"`
		SavePeriod           *int32  `yaml:"save_period"`
		CheckpointMustSaveBy *string `yaml:"checkpoint_must_save_by"`
		DeferredFinalize     *bool   `yaml:"deferred_finalize"`
	} `yaml:"checkpointing"`
	RolloutCheckpointing struct {
		SnapshotAttemptIntervalS    *int32 `yaml:"snapshot_attempt_interval_s"`
		SnapshotOnTrainerCheckpoint *bool  `yaml:"snapshot_on_trainer_checkpoint"`
		MaxConsecutiveFailures      *int32 `yaml:"max_consecutive_failures"`
		SnapshotTimeoutS            *int32 `yaml:"snapshot_timeout_s"`
	} `yaml:"rollout_checkpointing"`
	RolloutRecovery struct {
		TargetLevel *string `yaml:"target_level"`
	} `yaml:"rollout_recovery"`
}

// readNemoRL reads a NeMo RL YAML config into spec.
func readNemoRL(path string, spec *v1.RunSpec) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return inputErr("--from-nemo-rl: %w", err)
	}
	var cfg nemoRLConfig
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return inputErr("--from-nemo-rl %s: %w", path, err)
	}
	if err := cfg.apply(spec); err != nil {
		return inputErr("--from-nemo-rl %s: %w", path, err)
	}
	return nil
}

func (cfg nemoRLConfig) apply(spec *v1.RunSpec) error {
	ck, rc := cfg.Checkpointing, cfg.RolloutCheckpointing
	if b := ck.CheckpointMustSaveBy; b != nil {
		// OmegaConf resolves interpolations when the trainer starts; this
		// reader sees them raw.
		if strings.Contains(*b, "${") {
			return fmt.Errorf("checkpointing.checkpoint_must_save_by %q is an unresolved interpolation: pass --budget instead", *b)
		}
		spec.Checkpointing.CheckpointMustSaveBy = *b
	}
	if ck.DeferredFinalize != nil {
		spec.Checkpointing.DeferredFinalize = *ck.DeferredFinalize
	}
	// NeMo RL saves after every save_period-th step, only when enabled.
	if ck.SavePeriod != nil && (ck.Enabled == nil || *ck.Enabled) {
		spec.Checkpointing.CheckpointEverySteps = *ck.SavePeriod
	}
	if rc.SnapshotAttemptIntervalS != nil {
		spec.RolloutCheckpointing.SnapshotAttemptIntervalS = proto.Int32(*rc.SnapshotAttemptIntervalS)
	}
	if rc.SnapshotOnTrainerCheckpoint != nil {
		spec.RolloutCheckpointing.SnapshotOnTrainerCheckpoint = proto.Bool(*rc.SnapshotOnTrainerCheckpoint)
	}
	if rc.MaxConsecutiveFailures != nil {
		spec.RolloutCheckpointing.MaxConsecutiveFailures = *rc.MaxConsecutiveFailures
	}
	if rc.SnapshotTimeoutS != nil {
		spec.RolloutCheckpointing.SnapshotTimeoutS = *rc.SnapshotTimeoutS
	}
	if lvl := cfg.RolloutRecovery.TargetLevel; lvl != nil {
		tl, err := parseTargetLevel(*lvl)
		if err != nil {
			return fmt.Errorf("rollout_recovery.target_level: %w", err)
		}
		spec.RolloutRecovery.TargetLevel = tl
	}
	return nil
}

// parseTargetLevel accepts "turn", "TURN" or "TARGET_LEVEL_TURN".
func parseTargetLevel(s string) (v1.TargetLevel, error) {
	if v, ok := apifacts.ParseEnum[v1.TargetLevel](s); ok {
		return v, nil
	}
	return 0, fmt.Errorf("%q is not a target level (prompt_group, sibling, turn, prefix)", s)
}
