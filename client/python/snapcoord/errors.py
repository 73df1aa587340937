"""Exceptions: one class per failure class, as snapctl's exit statuses.

| exception            | gRPC codes                                  | snapctl exit |
|----------------------|---------------------------------------------|--------------|
| NotFoundError        | NOT_FOUND                                   | 3            |
| ConflictError        | ALREADY_EXISTS, FAILED_PRECONDITION, ABORTED | 4            |
| SupersededError      | FAILED_PRECONDITION, reason WORKER_SUPERSEDED | 4          |
| UnavailableError     | UNAVAILABLE (reason NOT_LEADER from a follower), DEADLINE_EXCEEDED | 5 |
| OutcomeUnknownError  | UNAVAILABLE, reason OUTCOME_UNKNOWN         | 5            |
| AuthError            | UNAUTHENTICATED, PERMISSION_DENIED          | 6            |
| InvalidInputError    | INVALID_ARGUMENT, OUT_OF_RANGE              | 7            |
| LimitError           | RESOURCE_EXHAUSTED                          | 8            |
| SnapcoordError       | any other code                              | 1            |

Each carries the gRPC ``code`` and the coordinator's ``message`` (which names
the field of bad input), and ``reason`` from the status' ErrorInfo if any.
"""

from __future__ import annotations

from typing import Any, Optional

import grpc
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool

try:  # protobuf >= 4.22
    from google.protobuf.message_factory import GetMessageClass as _message_class
except ImportError:  # Debian bookworm's 4.21
    from google.protobuf.message_factory import MessageFactory as _Factory

    _message_class = _Factory().GetPrototype

# The coordinator's ErrorInfo domain, the reason of a superseded worker,
# that of a call refused before it did anything (UNAVAILABLE, by a follower
# or a leader whose term had ended; the leader, if known, is named in the
# message), and that of a call whose change may still take effect
# (UNAVAILABLE: its commit was not confirmed before the call was answered).
ERROR_DOMAIN = "snapcoord.v1"
REASON_SUPERSEDED = "WORKER_SUPERSEDED"
REASON_NOT_LEADER = "NOT_LEADER"
REASON_OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"


class SnapcoordError(Exception):
    """A call the coordinator refused, or that could not reach it.

    ``code`` is the gRPC status code (None for errors raised by this
    package itself), ``message`` the coordinator's text.
    """

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None, reason: str = "") -> None:
        super().__init__(f"{code.name}: {message}" if code is not None else message)
        self.code = code
        self.message = message
        self.reason = reason


class NotFoundError(SnapcoordError):
    """The run or the worker does not exist (NOT_FOUND)."""


class ConflictError(SnapcoordError):
    """The call conflicts with the run's state (ALREADY_EXISTS, FAILED_PRECONDITION, ABORTED)."""


class SupersededError(ConflictError):
    """Another process registered under this worker's name: this one must stop.

    Its reports, steps and FinishRun change nothing from then on, and it does
    not register again (the two processes would take the name from each other
    in turn).
    """


class UnavailableError(SnapcoordError):
    """The coordinator is unreachable, shutting down, not the leader (reason
    NOT_LEADER), or did not answer in time."""


class OutcomeUnknownError(UnavailableError):
    """The call's change may or may not have taken effect (UNAVAILABLE,
    reason OUTCOME_UNKNOWN): the coordinator lost its leadership or its etcd
    quorum while the commit waited, or the call's deadline came first.

    The client repeats the calls that are safe to repeat (``RETRIED_METHODS``),
    whose repeat answers what the first attempt did, so this is raised only
    by a call that is not (ReissueRunToken), or whose retries ran out or
    timed out before an attempt settled it. Read the state (``get_run``) to
    learn what happened."""


class AuthError(SnapcoordError):
    """Missing, unknown or wrong token (UNAUTHENTICATED, PERMISSION_DENIED)."""


class InvalidInputError(SnapcoordError, ValueError):
    """The coordinator rejected the input; ``message`` names the field."""


class LimitError(SnapcoordError):
    """A coordinator limit was reached (RESOURCE_EXHAUSTED)."""


class UnknownActionError(SnapcoordError):
    """The coordinator answered a step with an action this client does not
    know (a newer coordinator): upgrade the client. Raised rather than read
    as CONTINUE, since the action may ask for a save. ``decision`` is the
    raw ``snapcoord.v1.Decision``."""

    def __init__(self, decision: object) -> None:
        step, action = getattr(decision, "step", 0), getattr(decision, "action", 0)
        super().__init__(f"step {step}: action {action} is unknown to this client; upgrade it")
        self.decision = decision


class RunEndedError(SnapcoordError):
    """The run ended without this worker seeing its Stop command.

    The Stop was issued before the worker's first command (it registered
    after the run ended).
    """


_CLASSES: dict[grpc.StatusCode, type[SnapcoordError]] = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: ConflictError,
    grpc.StatusCode.FAILED_PRECONDITION: ConflictError,
    grpc.StatusCode.ABORTED: ConflictError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: AuthError,
    grpc.StatusCode.PERMISSION_DENIED: AuthError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidInputError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidInputError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: LimitError,
}


# What gRPC's TLS says (in an UNAVAILABLE's details) when the coordinator's
# certificate is signed by a CA this process does not trust: with
# BoringSSL, CERTIFICATE_VERIFY_FAILED; with OpenSSL, "certificate verify
# failed".
_UNTRUSTED = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed")

#: Appended to such an error: gRPC's own words name no remedy.
UNTRUSTED_HINT = (
    "the coordinator's TLS certificate is not signed by a CA this process trusts: set SNAPCOORD_CA_FILE to the CA "
    "certificate that signed it (for a job's coordinator started with --tls-self-signed DIR: DIR/ca.pem)"
)


def untrusted_certificate(message: str) -> bool:
    """Whether a call failed because the coordinator's certificate is not trusted."""
    return any(s in message for s in _UNTRUSTED)


def from_rpc_error(err: grpc.RpcError) -> SnapcoordError:
    """The exception for a failed call (``grpc.RpcError`` from a raw stub)."""
    code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
    message = (err.details() if isinstance(err, grpc.Call) else str(err)) or ""
    if code == grpc.StatusCode.UNAVAILABLE and untrusted_certificate(message):
        message = f"{message}. {UNTRUSTED_HINT}"
    reason = error_reason(err)
    cls = _CLASSES.get(code, SnapcoordError)
    if code == grpc.StatusCode.FAILED_PRECONDITION and reason == REASON_SUPERSEDED:
        cls = SupersededError
    if code == grpc.StatusCode.UNAVAILABLE and reason == REASON_OUTCOME_UNKNOWN:
        cls = OutcomeUnknownError
    return cls(message, code, reason)


def error_reason(err: grpc.RpcError) -> str:
    """The ErrorInfo reason of the coordinator's domain in ``err``'s status, or ''."""
    if not isinstance(err, grpc.Call):
        return ""
    for key, value in err.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        status = _Status.FromString(value)
        for detail in status.details:
            if detail.type_url.endswith("/google.rpc.ErrorInfo"):
                info = _ErrorInfo.FromString(detail.value)
                if info.domain == ERROR_DOMAIN:
                    return info.reason
    return ""


def status_details(code: grpc.StatusCode, message: str, reason: str) -> bytes:
    """The ``grpc-status-details-bin`` trailer of a status carrying the
    coordinator's ErrorInfo ``reason``: how the client marks a status it
    makes itself (an attempt it cut) as the coordinator would."""
    status = _Status(code=code.value[0], message=message)
    info = _ErrorInfo(reason=reason, domain=ERROR_DOMAIN)
    status.details.add(type_url="type.googleapis.com/google.rpc.ErrorInfo", value=info.SerializeToString())
    return bytes(status.SerializeToString())


def is_superseded(err: BaseException) -> bool:
    """Whether ``err`` says another process registered under the worker's name."""
    if isinstance(err, SupersededError):
        return True
    return isinstance(err, grpc.RpcError) and error_reason(err) == REASON_SUPERSEDED


def _rpc_status_types() -> tuple[Any, Any]:
    """google.rpc.Status and google.rpc.ErrorInfo, built in a private pool.

    The coordinator puts ErrorInfo in the status details. Their generated code
    is in googleapis-common-protos, which Debian's python3-grpcio does not
    bring; a private pool cannot clash with it where it is installed.
    """
    f = descriptor_pb2.FileDescriptorProto(name="snapcoord_rpc_status.proto", package="google.rpc", syntax="proto3")
    f.dependency.append("google/protobuf/any.proto")
    T = descriptor_pb2.FieldDescriptorProto
    status = f.message_type.add(name="Status")
    status.field.add(name="code", number=1, type=T.TYPE_INT32, label=T.LABEL_OPTIONAL)
    status.field.add(name="message", number=2, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    status.field.add(name="details", number=3, type=T.TYPE_MESSAGE, label=T.LABEL_REPEATED, type_name=".google.protobuf.Any")
    info = f.message_type.add(name="ErrorInfo")
    info.field.add(name="reason", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    info.field.add(name="domain", number=2, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    # Field 3, metadata (a map), is not needed: unknown fields are skipped.
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(descriptor_pb2.FileDescriptorProto.FromString(any_pb2.DESCRIPTOR.serialized_pb).SerializeToString())
    pool.AddSerializedFile(f.SerializeToString())
    return (
        _message_class(pool.FindMessageTypeByName("google.rpc.Status")),
        _message_class(pool.FindMessageTypeByName("google.rpc.ErrorInfo")),
    )


_Status, _ErrorInfo = _rpc_status_types()
