from snapcoord._vendor.buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from snapcoord.v1 import options_pb2 as _options_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Mapping as _Mapping, Optional as _Optional, Union as _Union

DEADLINE_FIRE_KIND_LOCAL: DeadlineFireKind
DEADLINE_FIRE_KIND_MANUAL: DeadlineFireKind
DEADLINE_FIRE_KIND_PRE_STEP: DeadlineFireKind
DEADLINE_FIRE_KIND_STEP: DeadlineFireKind
DEADLINE_FIRE_KIND_UNSPECIFIED: DeadlineFireKind
DESCRIPTOR: _descriptor.FileDescriptor
RESERVE_POLICY_EXPECTED_LOSS: ReservePolicy
RESERVE_POLICY_MAX: ReservePolicy
RESERVE_POLICY_UNSPECIFIED: ReservePolicy
RUN_STATE_CANCELLED: RunState
RUN_STATE_COMPLETED: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_PENDING: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_SAVING: RunState
RUN_STATE_SNAPSHOTTING: RunState
RUN_STATE_STOPPED: RunState
RUN_STATE_UNSPECIFIED: RunState
TARGET_LEVEL_PREFIX: TargetLevel
TARGET_LEVEL_PROMPT_GROUP: TargetLevel
TARGET_LEVEL_SIBLING: TargetLevel
TARGET_LEVEL_TURN: TargetLevel
TARGET_LEVEL_UNSPECIFIED: TargetLevel

class CheckpointingSpec(_message.Message):
    __slots__ = ["checkpoint_every_steps", "checkpoint_must_save_by", "deferred_finalize", "must_save_by"]
    CHECKPOINT_EVERY_STEPS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_MUST_SAVE_BY_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_FINALIZE_FIELD_NUMBER: _ClassVar[int]
    MUST_SAVE_BY_FIELD_NUMBER: _ClassVar[int]
    checkpoint_every_steps: int
    checkpoint_must_save_by: str
    deferred_finalize: bool
    must_save_by: _timestamp_pb2.Timestamp
    def __init__(self, checkpoint_must_save_by: _Optional[str] = ..., must_save_by: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., deferred_finalize: bool = ..., checkpoint_every_steps: _Optional[int] = ...) -> None: ...

class Deadline(_message.Message):
    __slots__ = ["checkpoint_seconds", "expected_loss_next_seconds", "expected_loss_now_seconds", "expected_loss_safety_seconds", "fires_at", "iteration_seconds", "last_durable_save", "margin_seconds", "miss_probability_next", "miss_probability_now", "must_save_by", "regular_save_seconds", "save_reserve_seconds", "trigger_pending"]
    CHECKPOINT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LOSS_NEXT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LOSS_NOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LOSS_SAFETY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRES_AT_FIELD_NUMBER: _ClassVar[int]
    ITERATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_DURABLE_SAVE_FIELD_NUMBER: _ClassVar[int]
    MARGIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MISS_PROBABILITY_NEXT_FIELD_NUMBER: _ClassVar[int]
    MISS_PROBABILITY_NOW_FIELD_NUMBER: _ClassVar[int]
    MUST_SAVE_BY_FIELD_NUMBER: _ClassVar[int]
    REGULAR_SAVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAVE_RESERVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_PENDING_FIELD_NUMBER: _ClassVar[int]
    checkpoint_seconds: float
    expected_loss_next_seconds: float
    expected_loss_now_seconds: float
    expected_loss_safety_seconds: float
    fires_at: _timestamp_pb2.Timestamp
    iteration_seconds: float
    last_durable_save: _timestamp_pb2.Timestamp
    margin_seconds: float
    miss_probability_next: float
    miss_probability_now: float
    must_save_by: _timestamp_pb2.Timestamp
    regular_save_seconds: float
    save_reserve_seconds: float
    trigger_pending: str
    def __init__(self, must_save_by: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., iteration_seconds: _Optional[float] = ..., checkpoint_seconds: _Optional[float] = ..., save_reserve_seconds: _Optional[float] = ..., margin_seconds: _Optional[float] = ..., fires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., trigger_pending: _Optional[str] = ..., regular_save_seconds: _Optional[float] = ..., expected_loss_now_seconds: _Optional[float] = ..., expected_loss_next_seconds: _Optional[float] = ..., miss_probability_now: _Optional[float] = ..., miss_probability_next: _Optional[float] = ..., expected_loss_safety_seconds: _Optional[float] = ..., last_durable_save: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReserveSpec(_message.Message):
    __slots__ = ["expected_checkpoint_seconds", "expected_snapshot_seconds", "margin_seconds", "max_loss_seconds", "policy", "safety_saves", "window"]
    EXPECTED_CHECKPOINT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SNAPSHOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MARGIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOSS_SECONDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SAFETY_SAVES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    expected_checkpoint_seconds: float
    expected_snapshot_seconds: float
    margin_seconds: float
    max_loss_seconds: float
    policy: ReservePolicy
    safety_saves: bool
    window: int
    def __init__(self, window: _Optional[int] = ..., margin_seconds: _Optional[float] = ..., expected_checkpoint_seconds: _Optional[float] = ..., expected_snapshot_seconds: _Optional[float] = ..., policy: _Optional[_Union[ReservePolicy, str]] = ..., max_loss_seconds: _Optional[float] = ..., safety_saves: bool = ...) -> None: ...

class RolloutCheckpointingSpec(_message.Message):
    __slots__ = ["max_consecutive_failures", "snapshot_attempt_interval_s", "snapshot_on_trainer_checkpoint", "snapshot_timeout_s"]
    MAX_CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ATTEMPT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ON_TRAINER_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    max_consecutive_failures: int
    snapshot_attempt_interval_s: int
    snapshot_on_trainer_checkpoint: bool
    snapshot_timeout_s: int
    def __init__(self, snapshot_attempt_interval_s: _Optional[int] = ..., snapshot_on_trainer_checkpoint: bool = ..., max_consecutive_failures: _Optional[int] = ..., snapshot_timeout_s: _Optional[int] = ...) -> None: ...

class RolloutRecoverySpec(_message.Message):
    __slots__ = ["target_level"]
    TARGET_LEVEL_FIELD_NUMBER: _ClassVar[int]
    target_level: TargetLevel
    def __init__(self, target_level: _Optional[_Union[TargetLevel, str]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ["created_at", "deadline", "deadline_missed", "deadline_missed_at", "deadline_missed_reason", "ended_at", "failure_message", "fire_kind", "fired_at", "fired_at_step", "last_event_seq", "last_published_step", "last_step", "run_id", "spec", "state"]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MISSED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MISSED_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MISSED_REASON_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIRED_AT_FIELD_NUMBER: _ClassVar[int]
    FIRED_AT_STEP_FIELD_NUMBER: _ClassVar[int]
    FIRE_KIND_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_PUBLISHED_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    created_at: _timestamp_pb2.Timestamp
    deadline: Deadline
    deadline_missed: bool
    deadline_missed_at: _timestamp_pb2.Timestamp
    deadline_missed_reason: str
    ended_at: _timestamp_pb2.Timestamp
    failure_message: str
    fire_kind: DeadlineFireKind
    fired_at: _timestamp_pb2.Timestamp
    fired_at_step: int
    last_event_seq: int
    last_published_step: int
    last_step: int
    run_id: str
    spec: RunSpec
    state: RunState
    def __init__(self, run_id: _Optional[str] = ..., state: _Optional[_Union[RunState, str]] = ..., spec: _Optional[_Union[RunSpec, _Mapping]] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., fired_at_step: _Optional[int] = ..., last_published_step: _Optional[int] = ..., failure_message: _Optional[str] = ..., deadline: _Optional[_Union[Deadline, _Mapping]] = ..., fired_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., fire_kind: _Optional[_Union[DeadlineFireKind, str]] = ..., last_step: _Optional[int] = ..., ended_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., last_event_seq: _Optional[int] = ..., deadline_missed: bool = ..., deadline_missed_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., deadline_missed_reason: _Optional[str] = ...) -> None: ...

class RunSpec(_message.Message):
    __slots__ = ["checkpointing", "reserve", "rollout_checkpointing", "rollout_recovery", "started_at", "trainer_world_size"]
    CHECKPOINTING_FIELD_NUMBER: _ClassVar[int]
    RESERVE_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_CHECKPOINTING_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_RECOVERY_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    TRAINER_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    checkpointing: CheckpointingSpec
    reserve: ReserveSpec
    rollout_checkpointing: RolloutCheckpointingSpec
    rollout_recovery: RolloutRecoverySpec
    started_at: _timestamp_pb2.Timestamp
    trainer_world_size: int
    def __init__(self, trainer_world_size: _Optional[int] = ..., started_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., checkpointing: _Optional[_Union[CheckpointingSpec, _Mapping]] = ..., rollout_checkpointing: _Optional[_Union[RolloutCheckpointingSpec, _Mapping]] = ..., rollout_recovery: _Optional[_Union[RolloutRecoverySpec, _Mapping]] = ..., reserve: _Optional[_Union[ReserveSpec, _Mapping]] = ...) -> None: ...

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class TargetLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ReservePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class DeadlineFireKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
