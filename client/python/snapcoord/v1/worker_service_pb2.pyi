from snapcoord._vendor.buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from snapcoord.v1 import event_pb2 as _event_pb2
from snapcoord.v1 import options_pb2 as _options_pb2
from snapcoord.v1 import run_pb2 as _run_pb2
from snapcoord.v1 import worker_pb2 as _worker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

CHECKPOINT_PHASE_PUBLISHED: CheckpointPhase
CHECKPOINT_PHASE_SAVED: CheckpointPhase
CHECKPOINT_PHASE_UNSPECIFIED: CheckpointPhase
DESCRIPTOR: _descriptor.FileDescriptor

class CompleteStepRequest(_message.Message):
    __slots__ = ["incarnation", "iteration_seconds", "local_action", "run_id", "step", "worker_id"]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ITERATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ACTION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    iteration_seconds: float
    local_action: _event_pb2.StepAction
    run_id: str
    step: int
    worker_id: str
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., step: _Optional[int] = ..., iteration_seconds: _Optional[float] = ..., incarnation: _Optional[int] = ..., local_action: _Optional[_Union[_event_pb2.StepAction, str]] = ...) -> None: ...

class CompleteStepResponse(_message.Message):
    __slots__ = ["action", "decision", "explanation", "step"]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    action: _event_pb2.StepAction
    decision: _event_pb2.Decision
    explanation: str
    step: int
    def __init__(self, step: _Optional[int] = ..., action: _Optional[_Union[_event_pb2.StepAction, str]] = ..., explanation: _Optional[str] = ..., decision: _Optional[_Union[_event_pb2.Decision, _Mapping]] = ...) -> None: ...

class DeregisterWorkerRequest(_message.Message):
    __slots__ = ["incarnation", "run_id", "worker_id"]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    run_id: str
    worker_id: str
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class DeregisterWorkerResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class FinishRunRequest(_message.Message):
    __slots__ = ["incarnation", "run_id", "worker_id"]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    run_id: str
    worker_id: str
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class FinishRunResponse(_message.Message):
    __slots__ = ["run_state"]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    run_state: _run_pb2.RunState
    def __init__(self, run_state: _Optional[_Union[_run_pb2.RunState, str]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ["incarnation", "run_id", "worker_id"]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    run_id: str
    worker_id: str
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ["lease_expires_at", "run_state"]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    lease_expires_at: _timestamp_pb2.Timestamp
    run_state: _run_pb2.RunState
    def __init__(self, run_state: _Optional[_Union[_run_pb2.RunState, str]] = ..., lease_expires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PollCommandsRequest(_message.Message):
    __slots__ = ["after_seq", "incarnation", "run_id", "wait_seconds", "worker_id"]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    incarnation: int
    run_id: str
    wait_seconds: int
    worker_id: str
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., wait_seconds: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class PollCommandsResponse(_message.Message):
    __slots__ = ["commands", "run_state"]
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[_worker_pb2.Command]
    run_state: _run_pb2.RunState
    def __init__(self, commands: _Optional[_Iterable[_Union[_worker_pb2.Command, _Mapping]]] = ..., run_state: _Optional[_Union[_run_pb2.RunState, str]] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ["incarnation", "name", "rank", "role", "run_id"]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    name: str
    rank: int
    role: _worker_pb2.WorkerRole
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., role: _Optional[_Union[_worker_pb2.WorkerRole, str]] = ..., name: _Optional[str] = ..., rank: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ["heartbeat_interval", "incarnation", "last_checkpoint_step", "last_command_seq", "lease_ttl", "resume_after_seq", "run_state", "worker_id"]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMAND_SEQ_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    RESUME_AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval: _duration_pb2.Duration
    incarnation: int
    last_checkpoint_step: int
    last_command_seq: int
    lease_ttl: _duration_pb2.Duration
    resume_after_seq: int
    run_state: _run_pb2.RunState
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., heartbeat_interval: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., lease_ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., run_state: _Optional[_Union[_run_pb2.RunState, str]] = ..., last_command_seq: _Optional[int] = ..., resume_after_seq: _Optional[int] = ..., last_checkpoint_step: _Optional[int] = ...) -> None: ...

class ReportCheckpointRequest(_message.Message):
    __slots__ = ["incarnation", "phase", "run_id", "save_seconds", "step", "worker_id"]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SAVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    phase: CheckpointPhase
    run_id: str
    save_seconds: float
    step: int
    worker_id: str
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., step: _Optional[int] = ..., phase: _Optional[_Union[CheckpointPhase, str]] = ..., save_seconds: _Optional[float] = ..., incarnation: _Optional[int] = ...) -> None: ...

class ReportCheckpointResponse(_message.Message):
    __slots__ = ["run_state"]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    run_state: _run_pb2.RunState
    def __init__(self, run_state: _Optional[_Union[_run_pb2.RunState, str]] = ...) -> None: ...

class ReportSnapshotRequest(_message.Message):
    __slots__ = ["duration_seconds", "incarnation", "message", "outcome", "run_id", "snapshot_id", "worker_id"]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    duration_seconds: float
    incarnation: int
    message: str
    outcome: _worker_pb2.SnapshotOutcome
    run_id: str
    snapshot_id: str
    worker_id: str
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., outcome: _Optional[_Union[_worker_pb2.SnapshotOutcome, str]] = ..., duration_seconds: _Optional[float] = ..., message: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class ReportSnapshotResponse(_message.Message):
    __slots__ = ["run_state"]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    run_state: _run_pb2.RunState
    def __init__(self, run_state: _Optional[_Union[_run_pb2.RunState, str]] = ...) -> None: ...

class StreamCommandsRequest(_message.Message):
    __slots__ = ["after_seq", "incarnation", "run_id", "worker_id"]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    incarnation: int
    run_id: str
    worker_id: str
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class StreamCommandsResponse(_message.Message):
    __slots__ = ["command"]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    command: _worker_pb2.Command
    def __init__(self, command: _Optional[_Union[_worker_pb2.Command, _Mapping]] = ...) -> None: ...

class CheckpointPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
