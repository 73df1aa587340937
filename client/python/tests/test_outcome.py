"""A write answered UNAVAILABLE OUTCOME_UNKNOWN (a coordinator that lost its
leadership or its etcd quorum while the commit waited) is retried if it is
safe to repeat, and the repeat returns what the first attempt did."""

from __future__ import annotations

import signal
import threading
from concurrent import futures
from typing import Any, Iterator

import grpc
import pytest
from conftest import Coordinator, free_port, run_spec

import snapcoord
from snapcoord._leader import CutCall
from snapcoord.client import _Details, _Retry
from snapcoord.errors import from_rpc_error, status_details
from snapcoord.v1 import run_service_pb2


class UnknownOutcomeProxy:
    """A loopback proxy in front of a real coordinator. It forwards every
    unary call; ``unknown[name]`` calls of a method (by name) are forwarded
    and their answer then replaced by UNAVAILABLE with ErrorInfo reason
    OUTCOME_UNKNOWN: the change was made, its answer never arrives."""

    def __init__(self, upstream: str) -> None:
        self.unknown: dict[str, int] = {}
        self.down = False  # every call after an unknown one: UNAVAILABLE, not forwarded
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._upstream = grpc.insecure_channel(upstream)
        self.addr = f"127.0.0.1:{free_port()}"
        self._server = grpc.server(futures.ThreadPoolExecutor(4))
        self._server.add_generic_rpc_handlers([_Forward(self)])
        self._server.add_insecure_port(self.addr)
        self._server.start()

    def forward(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        name = method.rsplit("/", 1)[-1]
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1
            lose = self.unknown.get(name, 0) > 0
            if lose:
                self.unknown[name] -= 1
            elif self.down:
                context.abort(grpc.StatusCode.UNAVAILABLE, "proxy: the coordinator is unreachable")
        call = self._upstream.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        metadata = [(k, v) for k, v in context.invocation_metadata() if k == "authorization"]
        try:
            answer = call(request, metadata=metadata, timeout=10)
        except grpc.RpcError as err:
            context.abort(err.code(), err.details())
        if lose:
            message = "the change was made but its commit was not confirmed (proxy)"
            context.set_trailing_metadata([("grpc-status-details-bin", status_details(grpc.StatusCode.UNAVAILABLE, message, "OUTCOME_UNKNOWN"))])
            context.abort(grpc.StatusCode.UNAVAILABLE, message)
        return answer

    def stop(self) -> None:
        self._server.stop(0)
        self._upstream.close()


class _Forward(grpc.GenericRpcHandler):
    def __init__(self, proxy: UnknownOutcomeProxy) -> None:
        self.proxy = proxy

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        method = details.method
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: self.proxy.forward(method, req, ctx))


@pytest.fixture
def proxy(coordinator: Coordinator) -> Iterator[UnknownOutcomeProxy]:
    p = UnknownOutcomeProxy(coordinator.addr)
    yield p
    p.stop()


def test_trigger_and_create_of_unknown_outcome_return_the_original_result(coordinator: Coordinator, proxy: UnknownOutcomeProxy) -> None:
    admin = coordinator.admin()
    admin.create_run("run-a", run_spec(1, budget="00:01:00:00"))
    with snapcoord.connect(proxy.addr, timeout=10.0, env={}) as c:
        proxy.unknown["TriggerDeadline"] = 1
        run = c.call(c.runs.TriggerDeadline, run_service_pb2.TriggerDeadlineRequest(run_id="run-a", reason="drain")).run
        stored = admin.get_run("run-a")
        # The first attempt fired the deadline (no step yet: at once); the
        # repeat answers with that fire, not "already fired".
        assert stored.HasField("fired_at") and run.fired_at == stored.fired_at
        assert proxy.calls["TriggerDeadline"] == 2

        proxy.unknown["CreateRun"] = 1
        created, token = c.create_run("run-b", run_spec(1, budget="00:01:00:00"))
        assert created.run_id == "run-b" and token and proxy.calls["CreateRun"] == 2
    # The token of the repeat is the run's: a rank registers with it.
    with coordinator.worker_client("run-b", token) as w, w.trainer(0) as trainer:
        assert trainer.complete_step(1, 0.1).action == snapcoord.Action.CONTINUE


def test_unknown_outcome_of_a_call_not_safe_to_repeat_is_raised(coordinator: Coordinator, proxy: UnknownOutcomeProxy) -> None:
    coordinator.admin().create_run("run-a", run_spec(1, budget="00:01:00:00"))
    with snapcoord.connect(proxy.addr, timeout=10.0, env={}) as c:
        proxy.unknown["ReissueRunToken"] = 1
        with pytest.raises(snapcoord.OutcomeUnknownError) as raised:
            c.call(c.runs.ReissueRunToken, run_service_pb2.ReissueRunTokenRequest(run_id="run-a"))
        assert isinstance(raised.value, snapcoord.UnavailableError) and raised.value.reason == "OUTCOME_UNKNOWN"
        assert proxy.calls["ReissueRunToken"] == 1


def test_unknown_outcome_is_raised_when_the_retries_settle_nothing(coordinator: Coordinator, proxy: UnknownOutcomeProxy) -> None:
    """The repeats of a call answered OUTCOME_UNKNOWN meet only an
    unreachable coordinator: the call raises OutcomeUnknownError (the change
    may have been made), not the last attempt's plain UnavailableError."""
    coordinator.admin().create_run("run-a", run_spec(1, budget="00:01:00:00"))
    policy = snapcoord.RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.01)
    # No timeout: a call with one is retried until it, however many attempts.
    with snapcoord.connect(proxy.addr, retry=policy, env={}) as c:
        proxy.unknown["CancelRun"] = 1
        proxy.down = True
        with pytest.raises(snapcoord.OutcomeUnknownError):
            c.call(c.runs.CancelRun, run_service_pb2.CancelRunRequest(run_id="run-a", reason="drain"))
        assert proxy.calls["CancelRun"] == 3
    proxy.down = False
    assert coordinator.admin().get_run("run-a").state == snapcoord.RunState.CANCELLED


def test_an_attempt_cut_by_the_client_is_of_unknown_outcome_unless_read_only(coordinator: Coordinator) -> None:
    """The coordinator freezes (SIGSTOP: a GC pause, a stuck disk) under a
    call, and the client cuts the attempt after RetryPolicy.attempt_timeout.
    The coordinator may have applied it before freezing: a call that may
    change something raises OutcomeUnknownError, at once if it is not safe
    to repeat, once its repeats settled nothing if it is; a read stays a
    plain UnavailableError. As the Go client."""
    coordinator.admin().create_run("run-a", run_spec(1, budget="00:01:00:00"))
    policy = snapcoord.RetryPolicy(base_delay=0.05, max_delay=0.05, attempt_timeout=0.3)
    with snapcoord.connect(coordinator.addr, plaintext=True, retry=policy, env={}) as c:
        c.get_run("run-a", timeout=5.0)  # connected: the calls below reach the frozen process
        assert coordinator.proc is not None
        coordinator.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(snapcoord.OutcomeUnknownError) as reissue:
                c.call(c.runs.ReissueRunToken, run_service_pb2.ReissueRunTokenRequest(run_id="run-a"), timeout=5.0)
            assert "attempt timeout" in reissue.value.message and reissue.value.reason == "OUTCOME_UNKNOWN"
            with pytest.raises(snapcoord.OutcomeUnknownError):
                c.call(c.runs.CancelRun, run_service_pb2.CancelRunRequest(run_id="run-a", reason="drain"), timeout=1.0)
            with pytest.raises(snapcoord.UnavailableError) as read:
                c.get_run("run-a", timeout=1.0)
            assert not isinstance(read.value, snapcoord.OutcomeUnknownError), read.value
        finally:
            coordinator.proc.send_signal(signal.SIGCONT)


def test_an_attempt_cut_by_a_new_leader_is_of_unknown_outcome_unless_read_only() -> None:
    """Several coordinators: an attempt still waiting on the previous leader
    when another took over is cut (_leader.py). Sent, it may have been
    applied: the same rule as for the attempt timeout."""
    policy = snapcoord.RetryPolicy(max_attempts=2, base_delay=0.0, max_delay=0.0)

    def outcome(method: str) -> snapcoord.SnapcoordError:
        call = _Retry(policy).intercept_unary_unary(lambda details, request: CutCall(), _Details(method, None, None, None, None, None), None)
        return from_rpc_error(call)

    for method in ("/snapcoord.v1.RunService/ReissueRunToken", "/snapcoord.v1.RunService/CancelRun", "/snapcoord.v1.WorkerService/CompleteStep"):
        assert isinstance(outcome(method), snapcoord.OutcomeUnknownError), method
    read = outcome("/snapcoord.v1.RunService/GetRun")
    assert isinstance(read, snapcoord.UnavailableError) and not isinstance(read, snapcoord.OutcomeUnknownError)
