from google.protobuf import timestamp_pb2 as _timestamp_pb2
from snapcoord.v1 import run_pb2 as _run_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
RUN_EVENT_TYPE_CHECKPOINT_PUBLISHED: RunEventType
RUN_EVENT_TYPE_CHECKPOINT_SAVED: RunEventType
RUN_EVENT_TYPE_COMMAND_ISSUED: RunEventType
RUN_EVENT_TYPE_DEADLINE_FIRED: RunEventType
RUN_EVENT_TYPE_DEADLINE_UPDATED: RunEventType
RUN_EVENT_TYPE_DECISION: RunEventType
RUN_EVENT_TYPE_RUN_CREATED: RunEventType
RUN_EVENT_TYPE_SNAPSHOT_COMPLETED: RunEventType
RUN_EVENT_TYPE_SNAPSHOT_ISSUED: RunEventType
RUN_EVENT_TYPE_SNAPSHOT_TICK_SKIPPED: RunEventType
RUN_EVENT_TYPE_STATE_CHANGED: RunEventType
RUN_EVENT_TYPE_UNSPECIFIED: RunEventType
RUN_EVENT_TYPE_WARNING: RunEventType
RUN_EVENT_TYPE_WORKER_LEFT: RunEventType
RUN_EVENT_TYPE_WORKER_LOST: RunEventType
RUN_EVENT_TYPE_WORKER_REGISTERED: RunEventType
STEP_ACTION_CONTINUE: StepAction
STEP_ACTION_SAVE_AND_CONTINUE: StepAction
STEP_ACTION_SAVE_AND_STOP: StepAction
STEP_ACTION_STOP: StepAction
STEP_ACTION_UNSPECIFIED: StepAction

class Decision(_message.Message):
    __slots__ = ["action", "decided_at", "explanation", "inputs", "step"]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    action: StepAction
    decided_at: _timestamp_pb2.Timestamp
    explanation: str
    inputs: _run_pb2.Deadline
    step: int
    def __init__(self, step: _Optional[int] = ..., action: _Optional[_Union[StepAction, str]] = ..., decided_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., inputs: _Optional[_Union[_run_pb2.Deadline, _Mapping]] = ..., explanation: _Optional[str] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ["at", "command_seq", "decision", "message", "seq", "snapshot_id", "state", "step", "type", "worker_id"]
    AT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_SEQ_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    command_seq: int
    decision: Decision
    message: str
    seq: int
    snapshot_id: str
    state: _run_pb2.RunState
    step: int
    type: RunEventType
    worker_id: str
    def __init__(self, seq: _Optional[int] = ..., at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., type: _Optional[_Union[RunEventType, str]] = ..., message: _Optional[str] = ..., step: _Optional[int] = ..., worker_id: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., state: _Optional[_Union[_run_pb2.RunState, str]] = ..., command_seq: _Optional[int] = ...) -> None: ...

class StepAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RunEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
