"""Connecting to the coordinator: ``connect()`` and ``Client``."""

from __future__ import annotations

import collections
import ipaddress
import logging
import os
import queue
import re
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import grpc

from snapcoord import errors
from snapcoord._conn import Connection
from snapcoord._leader import CUT_BY_NEW_LEADER, CutCall, LeaderChannel
from snapcoord._retry import DEFAULT_RETRY, LONG_LIVED_METHODS, READ_ONLY_METHODS, RETRIED_METHODS, RetryPolicy
from snapcoord.env_worker import EnvWorker
from snapcoord.trainer import Trainer
from snapcoord.v1 import run_pb2, run_service_pb2, run_service_pb2_grpc, worker_pb2, worker_service_pb2_grpc

DEFAULT_ADDR = "127.0.0.1:7070"
# A retried call that took longer than this is logged at WARNING: a training
# loop blocked that long on its coordinator deserves a line saying why.
SLOW_CALL_SECONDS = 5.0
_WORKER_PREFIX = "/snapcoord.v1.WorkerService/"
_log = logging.getLogger(__name__)

# With several addresses, every call goes to the coordinator whose health
# turned SERVING last for this service: the leader (see _leader.py).
_LEADER_SERVICE = "snapcoord.v1.WorkerService"

# Reconnect within a second of a coordinator restart (gRPC's default waits
# up to two minutes), so that a call waiting on the channel is answered and
# a worker hears a command issued then in time: connection attempts at most
# 0.5 s (+-20%) apart, which against a dead coordinator costs each process
# two refused connects a second. Notice a coordinator that stopped answering
# (frozen, or its host gone) under an idle command stream or a call in
# flight: a ping after 15 s of silence, the connection dropped 5 s (the
# default --election-ttl) without its answer; not more often than 15 s, as
# the coordinator disconnects a client that pings more often than its
# --keepalive-min-time (10 s) allows. As the Go client.
# Not grpc.min_reconnect_backoff_ms: gRPC's C core takes it as the time a
# connection attempt may last, so a coordinator slow to answer a new
# connection (a loaded machine) would be abandoned at every attempt.
_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.keepalive_time_ms", 15_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)


@dataclass(frozen=True)
class TLS:
    """The files of a TLS or mutual-TLS connection (PEM)."""

    #: CAs that may sign the server's certificate; None: the system roots.
    ca_file: Optional[str] = None
    #: The client's certificate and key, for mutual TLS (both or neither).
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    #: The name checked in the server's certificate, when it is not the
    #: host part of the address.
    server_name: Optional[str] = None


class _Details(
    collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")),
    grpc.ClientCallDetails,
):
    pass


def _with(details: grpc.ClientCallDetails, **changes: Any) -> _Details:
    fields = {name: getattr(details, name, None) for name in _Details._fields}
    fields.update(changes)
    return _Details(**fields)


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds ``authorization: Bearer``: the run token to WorkerService calls,
    the admin token to the others. An interceptor rather than call
    credentials, which gRPC refuses on a plaintext (loopback) channel."""

    def __init__(self, admin: str, run: str) -> None:
        self._admin, self._run = admin, run

    def _attach(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        token = self._run if details.method.startswith(_WORKER_PREFIX) else self._admin
        metadata = list(details.metadata or ())
        if not token or any(k == "authorization" for k, _ in metadata):
            return details  # a caller that set its own keeps it
        return _with(details, metadata=metadata + [("authorization", "Bearer " + token)])

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[override]
        return continuation(self._attach(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[override]
        return continuation(self._attach(details), request)


class _Retry(grpc.UnaryUnaryClientInterceptor):
    """Retries the methods in RETRIED_METHODS on UNAVAILABLE (see RetryPolicy),
    OUTCOME_UNKNOWN among them (their repeat answers what the first attempt
    did), and every method refused with NOT_LEADER: the coordinator did
    nothing with the call, so repeating it (to the leader, once health says
    which) is safe. Once an attempt was answered OUTCOME_UNKNOWN, a call
    whose later attempts settle nothing (UNAVAILABLE, DEADLINE_EXCEEDED,
    CANCELLED) ends with that answer: its change may have taken effect.

    Each attempt but a long poll's is bounded by the policy's
    ``attempt_timeout``, so that a call sent to a coordinator that froze is
    made again rather than wait out the pause; one cut because another
    coordinator took over (several addresses) is made again at once. An
    attempt cut either way may have been applied: unless the method is
    read-only, it counts as answered OUTCOME_UNKNOWN (see _CutAttempt).

    A call's timeout bounds all its attempts together, as a Go context does,
    and a call with one is retried until it, however many attempts that
    takes: a loss of quorum or an election may outlast ``max_attempts``'
    backoffs, and the caller said how long it can wait. ``max_attempts``
    bounds the calls without one, unless ``patient``: a worker's own calls
    (Trainer, EnvWorker) are then bounded by their timeout only, so that a
    training loop does not see an outage it could wait out.
    Each retry is logged at DEBUG; a call that waited longer than
    SLOW_CALL_SECONDS for its answer (or for its last failure) at WARNING,
    once, with the failure it waited on.
    """

    def __init__(self, policy: RetryPolicy, channel: Optional[grpc.Channel] = None, patient: bool = False) -> None:
        self._policy = policy
        self._channel = channel  # watched between attempts (_pause); None: a plain sleep
        self._patient = patient

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[override]
        if self._policy.max_attempts <= 1:
            return self._attempt(continuation, details, details.timeout, request)
        safe = details.method in RETRIED_METHODS
        start = time.monotonic()
        deadline = None if details.timeout is None else start + details.timeout
        unbounded = deadline is not None or self._patient
        attempt, why, unknown = 0, "", None
        while True:
            attempt += 1
            left = None if deadline is None else deadline - time.monotonic()
            call = self._attempt(continuation, details, left, request)
            if unknown is None and errors.error_reason(call) == errors.REASON_OUTCOME_UNKNOWN:
                unknown = call
            if not _retryable(call, safe) or (attempt >= self._policy.max_attempts and not unbounded):
                _warn_if_slow(details.method, start, attempt, why, call)
                return _still_unknown(unknown, call)
            why = f"{call.code().name}: {call.details()}"
            wait = 0.0 if call.details() == CUT_BY_NEW_LEADER else self._policy.backoff(attempt)
            if deadline is not None and deadline - time.monotonic() <= wait:
                _warn_if_slow(details.method, start, attempt, why, call)
                return _still_unknown(unknown, call)
            _log.debug("%s: attempt %d failed (%s); retrying within %.2fs", details.method, attempt, why, wait)
            self._pause(wait)

    def _attempt(self, continuation: Any, details: grpc.ClientCallDetails, left: Optional[float], request: Any) -> Any:
        """One attempt, with the call's ``left`` seconds at most; an attempt
        the client cut (see _CutAttempt) fails as such."""
        bounded = self._bounded(details, left)
        began = time.monotonic()
        call = continuation(bounded, request)
        if bounded.timeout != left and time.monotonic() - began >= bounded.timeout and call.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return _CutAttempt(details.method, "the coordinator did not answer within the attempt timeout (paused, overloaded or cut off)")
        if call.code() == grpc.StatusCode.UNAVAILABLE and call.details() == CUT_BY_NEW_LEADER:
            return _CutAttempt(details.method, CUT_BY_NEW_LEADER)
        return call

    def _bounded(self, details: grpc.ClientCallDetails, left: Optional[float]) -> grpc.ClientCallDetails:
        """details for one attempt: the call's time left, at most the policy's
        attempt_timeout unless the method is a long poll."""
        cap = self._policy.attempt_timeout
        if cap > 0 and details.method not in LONG_LIVED_METHODS:
            left = cap if left is None else min(left, cap)
        return _with(details, timeout=left)

    def _pause(self, wait: float) -> None:
        if wait <= 0:
            return
        """Waits ``wait`` seconds, or less if the channel, disconnected when
        the pause began, connects again meanwhile: a coordinator back after a
        restart is called within a moment, not after the rest of a backoff of
        up to max_delay. Watching the channel is also what makes it reconnect
        promptly (see _WaitForReady). A channel that stays connected (a
        follower's NOT_LEADER, a coordinator shutting down) gets the whole
        wait. Every rank of a job that lost the coordinator then calls again
        at once, which the coordinator handles as a step's usual burst.

        The watch does not ask the channel to connect (try_to_connect): the
        failed attempt did, and in grpcio 1.51 a pending request races
        close() into a traceback from the watching thread."""
        if self._channel is None:
            time.sleep(wait)
            return
        states: "queue.Queue[grpc.ChannelConnectivity]" = queue.Queue()
        self._channel.subscribe(states.put, try_to_connect=False)
        end = time.monotonic() + wait
        try:
            disconnected = False
            while True:
                state = states.get(timeout=max(0.0, end - time.monotonic()))
                if state != grpc.ChannelConnectivity.READY:
                    disconnected = True
                elif disconnected:
                    return
        except queue.Empty:
            return
        finally:
            self._channel.unsubscribe(states.put)


def _warn_if_slow(method: str, start: float, attempts: int, why: str, call: Any) -> None:
    waited = time.monotonic() - start
    if waited <= SLOW_CALL_SECONDS or not why:
        return
    outcome = "answered" if call.code() == grpc.StatusCode.OK else f"gave up ({call.code().name})"
    _log.warning("%s %s after %.1fs and %d attempts; it waited on: %s", method, outcome, waited, attempts, why)


class _WaitForReady(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """A worker's own calls (heartbeats, polls, the command stream,
    re-registration) wait within their timeouts for a coordinator to serve,
    rather than fail at once while it restarts (or, with several addresses,
    during an election).

    The wait is also what makes the channel reconnect promptly: in grpcio's C
    core (1.51), a channel's reconnection timers fire only while something
    polls the channel, or else every 5 s (the backup poller); a call that
    fails at once polls nothing, and a worker would take up to 10 s to see
    a restarted coordinator again."""

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[override]
        return continuation(_with(details, wait_for_ready=True), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[override]
        return continuation(_with(details, wait_for_ready=True), request)


# Answers that do not settle an earlier attempt of unknown outcome.
_UNSETTLED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


def _still_unknown(unknown: Any, call: Any) -> Any:
    """The call's final outcome: ``call``, or the earlier attempt answered
    OUTCOME_UNKNOWN if ``call`` says nothing that settles it."""
    if unknown is not None and call.code() in _UNSETTLED:
        return unknown
    return call


class _CutAttempt(CutCall):
    """An attempt the client cut: it ran out of the policy's attempt_timeout
    (not of the call's own), or another coordinator took over while it
    waited (_leader.py). UNAVAILABLE, so that the retry makes it again. The
    coordinator may have applied it before the cut: unless the method is
    read-only, its outcome is unknown (reason OUTCOME_UNKNOWN), which only a
    retry-safe method's repeat settles. As the Go client's cutStatus."""

    def __init__(self, method: str, why: str) -> None:
        super().__init__(why)
        self._unknown = method not in READ_ONLY_METHODS

    def trailing_metadata(self) -> Any:
        if not self._unknown:
            return ()
        return (("grpc-status-details-bin", errors.status_details(grpc.StatusCode.UNAVAILABLE, self._why, errors.REASON_OUTCOME_UNKNOWN)),)

    def result(self, timeout: Optional[float] = None) -> Any:
        raise self


def _retryable(call: Any, safe: bool) -> bool:
    if call.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    return safe or errors.error_reason(call) == errors.REASON_NOT_LEADER


class Client:
    """One connection to a coordinator, with stubs for both services.

    ``runs`` (RunService) carries the admin token and ``workers``
    (WorkerService) the run token; both retry the calls in RETRIED_METHODS and
    raise ``grpc.RpcError`` (convert with ``snapcoord.errors.from_rpc_error``).
    The helpers (``create_run``, ``trainer``, ``env_worker``, ...) raise
    ``SnapcoordError`` subclasses. Thread-safe; close it when done (or use it
    as a context manager). Workers started from one Client share its
    connection, which is what a process hosting many should do.
    ``follow_leader``: the channel balances over several coordinators
    (connect() sets it); single or several, calls wait on the channel alike.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        *,
        admin_token: str = "",
        run_token: str = "",
        run_id: str = "",
        timeout: Optional[float] = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        follow_leader: bool = False,
    ) -> None:
        bearer = _Bearer(admin_token, run_token)
        retried = grpc.intercept_channel(channel, bearer, _Retry(retry, channel))
        once = grpc.intercept_channel(channel, bearer, _WaitForReady())
        patient = grpc.intercept_channel(channel, bearer, _Retry(retry, channel, patient=True))
        #: What the workers started from this client share (see _conn.py).
        self.connection = Connection(
            channel,
            runs=run_service_pb2_grpc.RunServiceStub(retried),
            workers=worker_service_pb2_grpc.WorkerServiceStub(retried),
            # For Trainer and EnvWorker: retried until their timeout, if
            # any, however many attempts (see _Retry).
            workers_patient=worker_service_pb2_grpc.WorkerServiceStub(patient),
            # For a worker's periodic calls (heartbeats, polls,
            # re-registration): the next tick is their retry, and holding
            # one for 20 s would delay everything behind it.
            workers_once=worker_service_pb2_grpc.WorkerServiceStub(once),
            run_id=run_id,
            timeout=timeout,
            retry=retry,
        )
        self.runs = self.connection.runs
        self.workers = self.connection.workers

    @property
    def run_id(self) -> str:
        """The run of SNAPCOORD_RUN_ID (or connect's run_id): the default of
        trainer() and env_worker()."""
        return self.connection.run_id

    @run_id.setter
    def run_id(self, run_id: str) -> None:
        self.connection.run_id = run_id

    @property
    def timeout(self) -> Optional[float]:
        """Default bound in seconds on each call with its retries; None: none.
        Its workers follow a change."""
        return self.connection.timeout

    @timeout.setter
    def timeout(self, timeout: Optional[float]) -> None:
        self.connection.timeout = timeout

    @property
    def retry(self) -> RetryPolicy:
        return self.connection.retry

    def close(self) -> None:
        """Closes the connection."""
        self.connection.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def channel(self) -> grpc.Channel:
        """The underlying channel, e.g. for a health stub."""
        return self.connection.channel

    def call(self, method: Callable[..., Any], request: Any, timeout: Optional[float] = None) -> Any:
        """Calls a unary stub method with the client's timeout, raising SnapcoordError."""
        try:
            return method(request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as err:
            raise errors.from_rpc_error(err) from None

    # RunService helpers, for launchers and tests.

    def create_run(self, run_id: str, spec: run_pb2.RunSpec, timeout: Optional[float] = None) -> tuple[run_pb2.Run, str]:
        """Creates a run and returns it with its run token.

        A repeat with the same spec before any worker registered returns a new
        token (the earlier one stops working); after that, an empty token.
        """
        resp = self.call(self.runs.CreateRun, run_service_pb2.CreateRunRequest(run_id=run_id, spec=spec), timeout)
        return resp.run, resp.run_token

    def get_run(self, run_id: str, timeout: Optional[float] = None) -> run_pb2.Run:
        """The run: state, spec with defaults, deadline B and current estimates."""
        return self.call(self.runs.GetRun, run_service_pb2.GetRunRequest(run_id=run_id), timeout).run

    def run_workers(self, run_id: str, timeout: Optional[float] = None) -> list[worker_pb2.Worker]:
        """All of a run's workers, following ListWorkers' pages."""
        return self._all_pages(self.runs.ListWorkers, run_service_pb2.ListWorkersRequest(run_id=run_id), "workers", timeout)

    def snapshots(self, run_id: str, timeout: Optional[float] = None) -> list[worker_pb2.Snapshot]:
        """All of a run's environment snapshots, oldest first, following ListSnapshots' pages."""
        return self._all_pages(self.runs.ListSnapshots, run_service_pb2.ListSnapshotsRequest(run_id=run_id), "snapshots", timeout)

    def _all_pages(self, method: Callable[..., Any], request: Any, field: str, timeout: Optional[float]) -> list[Any]:
        items: list[Any] = []
        while True:
            resp = self.call(method, request, timeout)
            items.extend(getattr(resp, field))
            if not resp.next_page_token:
                return items
            request.page_token = resp.next_page_token

    # Workers.

    def trainer(self, rank: int, **kwargs: Any) -> Trainer:
        """Registers a trainer rank: see ``snapcoord.Trainer``."""
        return Trainer(self, rank, **kwargs)

    def env_worker(self, name: str, **kwargs: Any) -> EnvWorker:
        """Registers an environment worker: see ``snapcoord.EnvWorker``."""
        return EnvWorker(self, name, **kwargs)


def connect(
    addr: Union[None, str, Sequence[str]] = None,
    *,
    token: Optional[str] = None,
    run_token: Optional[str] = None,
    run_id: Optional[str] = None,
    tls: Optional[TLS] = None,
    plaintext: Optional[bool] = None,
    timeout: Optional[float] = None,
    retry: RetryPolicy = DEFAULT_RETRY,
    options: Sequence[tuple[str, Any]] = (),
    env: Optional[Mapping[str, str]] = None,
) -> Client:
    """Connects to the coordinator. The connection is made lazily: this fails
    only on bad options, not on an unreachable coordinator.

    Every argument left None is read from the same variables as snapctl:

    ============================  =================================================
    ``addr``                      ``SNAPCOORD_ADDR`` (default ``127.0.0.1:7070``)
                                  or several: ``a:7070,b:7070`` (or a list)
    ``token`` (admin, RunService) ``SNAPCOORD_TOKEN`` or ``SNAPCOORD_TOKEN_FILE``
    ``run_token`` (WorkerService) ``SNAPCOORD_RUN_TOKEN`` or ``SNAPCOORD_RUN_TOKEN_FILE``
    ``run_id``                    ``SNAPCOORD_RUN_ID``
    ``plaintext``                 ``SNAPCOORD_PLAINTEXT`` (true/false)
    ``tls``                       ``SNAPCOORD_CA_FILE``, ``SNAPCOORD_CERT_FILE``,
                                  ``SNAPCOORD_KEY_FILE``, ``SNAPCOORD_SERVER_NAME``
    ``timeout`` (seconds)         ``SNAPCOORD_TIMEOUT`` (``30s``, ``1m30s``, ``2.5``)
    ============================  =================================================

    As with snapctl, the connection is TLS (system roots unless a CA file is
    given) unless plaintext is asked for, or, told neither way, the address
    is on loopback (127.0.0.0/8, ::1, localhost) and no TLS file or server
    name is given; plaintext suits a coordinator on loopback only, since
    tokens then travel in the clear. ``timeout`` bounds
    each call together with its retries (None: no bound). ``options`` are
    extra gRPC channel options.

    Several addresses are the coordinators of one etcd-backed group: calls
    go to the one whose health turned SERVING last (the leader), and follow
    it when another takes over, cutting short a call that waits on a leader
    that froze (see _leader.py); workers resume after their last command, as
    across a restart. Their names are checked here (an unknown name fails
    connect). Over TLS, every coordinator's certificate must
    carry one name: the server name if given, else the one host of all the
    addresses.
    """
    env = os.environ if env is None else env
    addrs = split_addrs(addr or env.get("SNAPCOORD_ADDR") or DEFAULT_ADDR)
    admin = token if token is not None else _token_from_env(env, "SNAPCOORD_TOKEN")
    run = run_token if run_token is not None else _token_from_env(env, "SNAPCOORD_RUN_TOKEN")
    for tok in (admin, run):
        _check_token(tok)
    if tls is None:
        tls = TLS(
            ca_file=env.get("SNAPCOORD_CA_FILE") or None,
            cert_file=env.get("SNAPCOORD_CERT_FILE") or None,
            key_file=env.get("SNAPCOORD_KEY_FILE") or None,
            server_name=env.get("SNAPCOORD_SERVER_NAME") or None,
        )
    if plaintext is None and env.get("SNAPCOORD_PLAINTEXT", ""):
        plaintext = _parse_bool("SNAPCOORD_PLAINTEXT", env["SNAPCOORD_PLAINTEXT"])
    if plaintext is None:
        # Told neither way, as snapctl: plaintext to a loopback address
        # (where `snapcoord serve` listens by default) unless TLS files are
        # given, TLS to any other address.
        plaintext = tls == TLS() and all(is_loopback(a) for a in addrs)
    if timeout is None and env.get("SNAPCOORD_TIMEOUT"):
        timeout = parse_duration("SNAPCOORD_TIMEOUT", env["SNAPCOORD_TIMEOUT"])
    if len(addrs) > 1:
        for a in addrs:
            _resolve(a)  # an unknown name fails connect
    opts = list(_CHANNEL_OPTIONS) + list(options)
    if plaintext:
        if tls != TLS():
            raise ValueError("snapcoord: plaintext excludes TLS files and server name (SNAPCOORD_PLAINTEXT and SNAPCOORD_CA_FILE, ...)")

        def make(target: str) -> grpc.Channel:
            return grpc.insecure_channel(target, options=opts)

    else:
        name = tls.server_name or (_common_host(addrs) if len(addrs) > 1 else None)
        if name:
            opts.append(("grpc.ssl_target_name_override", name))
        creds = _credentials(tls)

        def make(target: str) -> grpc.Channel:
            return grpc.secure_channel(target, creds, options=opts)

    if len(addrs) > 1:
        channel: grpc.Channel = LeaderChannel(make, addrs, _LEADER_SERVICE)
    else:
        channel = make(addrs[0])
    return Client(
        channel,
        admin_token=admin,
        run_token=run,
        run_id=run_id or env.get("SNAPCOORD_RUN_ID") or "",
        timeout=timeout,
        retry=retry,
        follow_leader=len(addrs) > 1,
    )


def split_addrs(addr: Union[str, Sequence[str]]) -> list[str]:
    """The addresses in ``addr``: one, a comma-separated list, or a sequence
    of either."""
    if isinstance(addr, str) and "," not in addr:
        return [addr]  # as ever: handed to gRPC untouched
    parts = [addr] if isinstance(addr, str) else list(addr)
    addrs = [a.strip() for part in parts for a in part.split(",")]
    if not addrs or not all(addrs):
        raise ValueError(f"snapcoord: address list {addr!r} has an empty entry")
    return addrs


def leader_target(addrs: Sequence[str]) -> str:
    """One gRPC target for several "host:port" addresses: ``ipv4:`` or
    ``ipv6:`` and every address of each (names resolved now), since gRPC
    balances only over a list of IP addresses. IPv4 if every entry has one,
    else IPv6 if every entry has one."""
    resolved = [_resolve(a) for a in addrs]
    for family, scheme in ((socket.AF_INET, "ipv4"), (socket.AF_INET6, "ipv6")):
        if all(any(f == family for f, _ in r) for r in resolved):
            return scheme + ":" + ",".join(a for r in resolved for f, a in r if f == family)
    raise ValueError(f"snapcoord: addresses {','.join(addrs)} share no address family (IPv4 or IPv6)")


def _split_host_port(addr: str) -> tuple[str, str]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"snapcoord: address {addr!r}: want host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def _resolve(addr: str) -> list[tuple[socket.AddressFamily, str]]:
    host, port = _split_host_port(addr)
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise ValueError(f"snapcoord: address {addr!r}: {err.strerror}") from None
    out: list[tuple[socket.AddressFamily, str]] = []
    for family, _, _, _, sockaddr in infos:
        ip = str(sockaddr[0])
        entry = (family, f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
        if family in (socket.AF_INET, socket.AF_INET6) and entry not in out:
            out.append(entry)
    return out


def _common_host(addrs: Sequence[str]) -> str:
    hosts = {_split_host_port(a)[0] for a in addrs}
    if len(hosts) != 1:
        raise ValueError(
            "snapcoord: several TLS addresses on different hosts need a server name (SNAPCOORD_SERVER_NAME) that every coordinator's certificate carries"
        )
    return hosts.pop()


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` ("host:port") is on a loopback address: 127.0.0.0/8,
    ::1 or localhost, as snapctl decides it. No port, an empty host or any
    other name is not."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port:
        return False
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        return False  # an IPv6 address needs brackets before a port
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _credentials(tls: TLS) -> grpc.ChannelCredentials:
    if (tls.cert_file is None) != (tls.key_file is None):
        raise ValueError("snapcoord: a client certificate needs both the certificate and the key file")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file, "CA file"),
        private_key=_read(tls.key_file, "client key file"),
        certificate_chain=_read(tls.cert_file, "client certificate file"),
    )


def _read(path: Optional[str], what: str) -> Optional[bytes]:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise ValueError(f"snapcoord: read {what} {path}: {err.strerror}") from None


def _token_from_env(env: Mapping[str, str], name: str) -> str:
    token, path = env.get(name, ""), env.get(name + "_FILE", "")
    if token and path:
        raise ValueError(f"snapcoord: {name} and {name}_FILE exclude each other and are both set: unset one")
    return read_token_file(path) if path else token


def read_token_file(path: str) -> str:
    """The one token in ``path``, written like the coordinator's token files:
    surrounding whitespace, blank lines and lines starting with # are skipped.
    Errors never quote a token."""
    raw = _read(path, "token file")
    assert raw is not None
    tokens = [t for t in (line.strip() for line in raw.decode("utf-8", "replace").splitlines()) if t and not t.startswith("#")]
    if len(tokens) != 1:
        raise ValueError(f"snapcoord: token file {path} holds {len(tokens)} tokens: a client token file holds one")
    _check_token(tokens[0], f" (token file {path})")
    return tokens[0]


def _check_token(token: str, where: str = "") -> None:
    # What cannot travel as a metadata value; a stray newline from a file
    # would otherwise fail every call obscurely.
    if any(c <= " " or c > "~" for c in token):
        raise ValueError("snapcoord: a token must be printable ASCII without spaces" + where)


def _parse_bool(name: str, value: str) -> bool:
    # Go's strconv.ParseBool, as snapctl reads SNAPCOORD_PLAINTEXT.
    if value in ("", "0", "f", "F", "false", "FALSE", "False"):
        return False
    if value in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    raise ValueError(f"snapcoord: {name}={value!r}: want true or false")


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(name: str, value: str) -> float:
    """Seconds in a Go duration (``30s``, ``1m30s``, ``500ms``) or a plain number."""
    try:
        return float(value)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(value):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(value) or not value:
        raise ValueError(f"snapcoord: {name}={value!r}: want a duration such as 30s or 1m30s")
    return total
