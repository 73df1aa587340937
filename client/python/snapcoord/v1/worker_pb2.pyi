from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
SNAPSHOT_OUTCOME_INVARIANT_FAILURE: SnapshotOutcome
SNAPSHOT_OUTCOME_IO_ERROR: SnapshotOutcome
SNAPSHOT_OUTCOME_SAVED: SnapshotOutcome
SNAPSHOT_OUTCOME_SKIPPED: SnapshotOutcome
SNAPSHOT_OUTCOME_TIMEOUT: SnapshotOutcome
SNAPSHOT_OUTCOME_UNSPECIFIED: SnapshotOutcome
SNAPSHOT_REASON_DEADLINE: SnapshotReason
SNAPSHOT_REASON_INTERVAL: SnapshotReason
SNAPSHOT_REASON_MANUAL: SnapshotReason
SNAPSHOT_REASON_TRAINER_CHECKPOINT: SnapshotReason
SNAPSHOT_REASON_UNSPECIFIED: SnapshotReason
WORKER_ROLE_ENVIRONMENT: WorkerRole
WORKER_ROLE_TRAINER: WorkerRole
WORKER_ROLE_UNSPECIFIED: WorkerRole
WORKER_STATE_LEFT: WorkerState
WORKER_STATE_LIVE: WorkerState
WORKER_STATE_LOST: WorkerState
WORKER_STATE_UNSPECIFIED: WorkerState

class Command(_message.Message):
    __slots__ = ["audience", "issued_at", "publish_checkpoint", "save_at_deadline", "seq", "snapshot", "stop"]
    AUDIENCE_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    SAVE_AT_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    audience: WorkerRole
    issued_at: _timestamp_pb2.Timestamp
    publish_checkpoint: PublishCheckpointCommand
    save_at_deadline: SaveAtDeadlineCommand
    seq: int
    snapshot: SnapshotCommand
    stop: StopCommand
    def __init__(self, seq: _Optional[int] = ..., issued_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., audience: _Optional[_Union[WorkerRole, str]] = ..., save_at_deadline: _Optional[_Union[SaveAtDeadlineCommand, _Mapping]] = ..., snapshot: _Optional[_Union[SnapshotCommand, _Mapping]] = ..., publish_checkpoint: _Optional[_Union[PublishCheckpointCommand, _Mapping]] = ..., stop: _Optional[_Union[StopCommand, _Mapping]] = ...) -> None: ...

class PublishCheckpointCommand(_message.Message):
    __slots__ = ["step"]
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...

class SaveAtDeadlineCommand(_message.Message):
    __slots__ = ["anchor_step", "must_finish_by", "snapshot_id"]
    ANCHOR_STEP_FIELD_NUMBER: _ClassVar[int]
    MUST_FINISH_BY_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    anchor_step: int
    must_finish_by: _timestamp_pb2.Timestamp
    snapshot_id: str
    def __init__(self, snapshot_id: _Optional[str] = ..., anchor_step: _Optional[int] = ..., must_finish_by: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ["anchor_step", "completed_at", "duration_seconds", "expected_worker_ids", "forced", "issued_at", "message", "must_finish_by", "outcome", "reason", "reports", "snapshot_id"]
    ANCHOR_STEP_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    FORCED_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MUST_FINISH_BY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    anchor_step: int
    completed_at: _timestamp_pb2.Timestamp
    duration_seconds: float
    expected_worker_ids: _containers.RepeatedScalarFieldContainer[str]
    forced: bool
    issued_at: _timestamp_pb2.Timestamp
    message: str
    must_finish_by: _timestamp_pb2.Timestamp
    outcome: SnapshotOutcome
    reason: SnapshotReason
    reports: _containers.RepeatedCompositeFieldContainer[SnapshotReport]
    snapshot_id: str
    def __init__(self, snapshot_id: _Optional[str] = ..., reason: _Optional[_Union[SnapshotReason, str]] = ..., anchor_step: _Optional[int] = ..., forced: bool = ..., issued_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., completed_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[_Union[SnapshotOutcome, str]] = ..., duration_seconds: _Optional[float] = ..., expected_worker_ids: _Optional[_Iterable[str]] = ..., reports: _Optional[_Iterable[_Union[SnapshotReport, _Mapping]]] = ..., must_finish_by: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class SnapshotCommand(_message.Message):
    __slots__ = ["anchor_step", "forced", "reason", "snapshot_id"]
    ANCHOR_STEP_FIELD_NUMBER: _ClassVar[int]
    FORCED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    anchor_step: int
    forced: bool
    reason: SnapshotReason
    snapshot_id: str
    def __init__(self, snapshot_id: _Optional[str] = ..., reason: _Optional[_Union[SnapshotReason, str]] = ..., anchor_step: _Optional[int] = ..., forced: bool = ...) -> None: ...

class SnapshotReport(_message.Message):
    __slots__ = ["duration_seconds", "message", "outcome", "reported_at", "worker_id"]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    duration_seconds: float
    message: str
    outcome: SnapshotOutcome
    reported_at: _timestamp_pb2.Timestamp
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ..., outcome: _Optional[_Union[SnapshotOutcome, str]] = ..., duration_seconds: _Optional[float] = ..., message: _Optional[str] = ..., reported_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class StopCommand(_message.Message):
    __slots__ = ["reason"]
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Worker(_message.Message):
    __slots__ = ["incarnation", "last_step", "last_step_at", "lease_expires_at", "name", "rank", "registered_at", "replaced_incarnation", "role", "state", "worker_id"]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    REPLACED_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    last_step: int
    last_step_at: _timestamp_pb2.Timestamp
    lease_expires_at: _timestamp_pb2.Timestamp
    name: str
    rank: int
    registered_at: _timestamp_pb2.Timestamp
    replaced_incarnation: int
    role: WorkerRole
    state: WorkerState
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ..., name: _Optional[str] = ..., role: _Optional[_Union[WorkerRole, str]] = ..., rank: _Optional[int] = ..., state: _Optional[_Union[WorkerState, str]] = ..., incarnation: _Optional[int] = ..., registered_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., replaced_incarnation: _Optional[int] = ..., last_step: _Optional[int] = ..., last_step_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WorkerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class SnapshotReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class SnapshotOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
