from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

CREDENTIAL_ADMIN: Credential
CREDENTIAL_RUN_TOKEN: Credential
CREDENTIAL_UNSPECIFIED: Credential
DESCRIPTOR: _descriptor.FileDescriptor
RPC_FIELD_NUMBER: _ClassVar[int]
TERMINAL_FIELD_NUMBER: _ClassVar[int]
rpc: _descriptor.FieldDescriptor
terminal: _descriptor.FieldDescriptor

class RpcFacts(_message.Message):
    __slots__ = ["credential", "long_lived", "read_only", "retry_safe", "routine"]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    LONG_LIVED_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    RETRY_SAFE_FIELD_NUMBER: _ClassVar[int]
    ROUTINE_FIELD_NUMBER: _ClassVar[int]
    credential: Credential
    long_lived: bool
    read_only: bool
    retry_safe: bool
    routine: bool
    def __init__(self, retry_safe: bool = ..., long_lived: bool = ..., routine: bool = ..., credential: _Optional[_Union[Credential, str]] = ..., read_only: bool = ...) -> None: ...

class Credential(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
