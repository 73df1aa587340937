package apifacts

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

func TestNames(t *testing.T) {
	for _, c := range []struct {
		e           protoreflect.Enum
		name, lower string
	}{
		{v1.RunState_RUN_STATE_RUNNING, "RUNNING", "running"},
		{v1.RunState_RUN_STATE_UNSPECIFIED, "UNSPECIFIED", "unspecified"},
		{v1.SnapshotReason_SNAPSHOT_REASON_TRAINER_CHECKPOINT, "TRAINER_CHECKPOINT", "trainer_checkpoint"},
		{v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE, "SAVE_AND_CONTINUE", "save_and_continue"},
		{v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, "ENVIRONMENT", "environment"},
		{v1.RunState(99), "99", "99"},
	} {
		if got := EnumName(c.e); got != c.name {
			t.Errorf("EnumName(%v) = %q, want %q", c.e, got, c.name)
		}
		if got := EnumLower(c.e); got != c.lower {
			t.Errorf("EnumLower(%v) = %q, want %q", c.e, got, c.lower)
		}
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]v1.RunState{"running": v1.RunState_RUN_STATE_RUNNING, "STOPPED": v1.RunState_RUN_STATE_STOPPED, "RUN_STATE_FAILED": v1.RunState_RUN_STATE_FAILED} {
		if got, ok := ParseEnum[v1.RunState](in); !ok || got != want {
			t.Errorf("ParseEnum(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "unspecified", "RUN_STATE_UNSPECIFIED", "run", "RUN_STATE_", "snapshot_reason_interval"} {
		if got, ok := ParseEnum[v1.RunState](in); ok {
			t.Errorf("ParseEnum(%q) = %v, want refused", in, got)
		}
	}
	if got, ok := ParseEnum[v1.TargetLevel]("prompt_group"); !ok || got != v1.TargetLevel_TARGET_LEVEL_PROMPT_GROUP {
		t.Errorf("ParseEnum(prompt_group) = %v, %v", got, ok)
	}
}
