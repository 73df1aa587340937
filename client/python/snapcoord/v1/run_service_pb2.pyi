from snapcoord._vendor.buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from snapcoord.v1 import event_pb2 as _event_pb2
from snapcoord.v1 import options_pb2 as _options_pb2
from snapcoord.v1 import run_pb2 as _run_pb2
from snapcoord.v1 import worker_pb2 as _worker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CancelRunRequest(_message.Message):
    __slots__ = ["reason", "run_id"]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    reason: str
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _run_pb2.Run
    def __init__(self, run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ...) -> None: ...

class CreateRunRequest(_message.Message):
    __slots__ = ["run_id", "spec"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    spec: _run_pb2.RunSpec
    def __init__(self, run_id: _Optional[str] = ..., spec: _Optional[_Union[_run_pb2.RunSpec, _Mapping]] = ...) -> None: ...

class CreateRunResponse(_message.Message):
    __slots__ = ["run", "run_token", "token_reissued"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    RUN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_REISSUED_FIELD_NUMBER: _ClassVar[int]
    run: _run_pb2.Run
    run_token: str
    token_reissued: bool
    def __init__(self, run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ..., run_token: _Optional[str] = ..., token_reissued: bool = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ["run_id"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _run_pb2.Run
    def __init__(self, run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ["page_size", "page_token", "state"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    state: _run_pb2.RunState
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., state: _Optional[_Union[_run_pb2.RunState, str]] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ["next_page_token", "runs"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    runs: _containers.RepeatedCompositeFieldContainer[_run_pb2.Run]
    def __init__(self, runs: _Optional[_Iterable[_Union[_run_pb2.Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ["page_size", "page_token", "run_id"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ["next_page_token", "snapshots"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    snapshots: _containers.RepeatedCompositeFieldContainer[_worker_pb2.Snapshot]
    def __init__(self, snapshots: _Optional[_Iterable[_Union[_worker_pb2.Snapshot, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ["page_size", "page_token", "run_id"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ["next_page_token", "workers"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    workers: _containers.RepeatedCompositeFieldContainer[_worker_pb2.Worker]
    def __init__(self, workers: _Optional[_Iterable[_Union[_worker_pb2.Worker, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReissueRunTokenRequest(_message.Message):
    __slots__ = ["reason", "run_id"]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    reason: str
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReissueRunTokenResponse(_message.Message):
    __slots__ = ["run", "run_token"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    RUN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run: _run_pb2.Run
    run_token: str
    def __init__(self, run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ..., run_token: _Optional[str] = ...) -> None: ...

class TriggerDeadlineRequest(_message.Message):
    __slots__ = ["reason", "run_id"]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    reason: str
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class TriggerDeadlineResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _run_pb2.Run
    def __init__(self, run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ...) -> None: ...

class UpdateDeadlineRequest(_message.Message):
    __slots__ = ["checkpoint_must_save_by", "must_save_by", "run_id"]
    CHECKPOINT_MUST_SAVE_BY_FIELD_NUMBER: _ClassVar[int]
    MUST_SAVE_BY_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_must_save_by: str
    must_save_by: _timestamp_pb2.Timestamp
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., checkpoint_must_save_by: _Optional[str] = ..., must_save_by: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class UpdateDeadlineResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _run_pb2.Run
    def __init__(self, run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ...) -> None: ...

class WatchRunRequest(_message.Message):
    __slots__ = ["after_seq", "no_follow", "run_id"]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    NO_FOLLOW_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    no_follow: bool
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., no_follow: bool = ...) -> None: ...

class WatchRunResponse(_message.Message):
    __slots__ = ["event"]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: _event_pb2.RunEvent
    def __init__(self, event: _Optional[_Union[_event_pb2.RunEvent, _Mapping]] = ...) -> None: ...
