"""Several coordinator addresses: the client finds the one serving, follows
it, and its workers carry on across a restart of the coordinator."""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any, Iterator

import grpc
import pytest
from conftest import Coordinator, free_port, run_spec

import snapcoord
from snapcoord import CommandKind, Outcome, RunState
from snapcoord.client import split_addrs
from snapcoord.errors import _ErrorInfo, _Status
from snapcoord.v1 import run_service_pb2

_NOT_SERVING = b"\x08\x02"  # grpc.health.v1.HealthCheckResponse{status: NOT_SERVING}
_SERVING = b"\x08\x01"


class Follower:
    """A coordinator that is not the leader, as far as a client can tell: its
    health reports ``serving`` for RunService and WorkerService (and SERVING
    for the whole server, "", as a live follower does), and every other call gets
    UNAVAILABLE, with ErrorInfo reason NOT_LEADER unless ``not_leader`` is
    False. A stale leader (one that lost the election and does not know it
    yet in its health) is ``serving=True``. ``calls`` counts what it refused."""

    def __init__(self, serving: bool, not_leader: bool = True) -> None:
        self.serving, self.not_leader, self.calls = serving, not_leader, 0
        self.addr = f"127.0.0.1:{free_port()}"
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(4))
        self._server.add_generic_rpc_handlers([_FollowerHandler(self)])
        self._server.add_insecure_port(self.addr)
        self._server.start()

    def refuse(self, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.calls += 1
        message = "not the leader; the leader is at 127.0.0.1:1"
        if self.not_leader:
            info = _ErrorInfo(reason="NOT_LEADER", domain="snapcoord.v1")
            status = _Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message=message)
            status.details.add(type_url="type.googleapis.com/google.rpc.ErrorInfo", value=info.SerializeToString())
            context.set_trailing_metadata([("grpc-status-details-bin", status.SerializeToString())])
        context.abort(grpc.StatusCode.UNAVAILABLE, message)

    def stop(self) -> None:
        self._server.stop(0)


class _FollowerHandler(grpc.GenericRpcHandler):
    def __init__(self, f: Follower) -> None:
        self.f = f

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        if details.method == "/grpc.health.v1.Health/Watch":
            return grpc.unary_stream_rpc_method_handler(self._watch)
        if details.method == "/grpc.health.v1.Health/Check":
            return grpc.unary_unary_rpc_method_handler(lambda req, ctx: self._status(req))
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: self.f.refuse(ctx))

    def _status(self, request: bytes) -> bytes:
        # HealthCheckRequest{service: 1} of a short name: tag, length, name.
        whole_server = request[2:] == b""
        return _SERVING if self.f.serving or whole_server else _NOT_SERVING

    def _watch(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        # The status never changes: hold the watch open until the channel
        # cancels it or the server stops. Not a bare wait: a handler thread
        # that never returns keeps the server's executor, and with it the
        # interpreter, from ever exiting.
        ended = threading.Event()
        if not context.add_callback(ended.set):
            return
        yield self._status(request)
        ended.wait()


@pytest.fixture
def follower() -> Iterator[Follower]:
    f = Follower(serving=False)
    yield f
    f.stop()


def test_dead_address_then_live(coordinator: Coordinator) -> None:
    dead = f"127.0.0.1:{free_port()}"
    _, token = coordinator.admin().create_run("run-a", run_spec(1, budget="00:01:00:00"))
    env = {"SNAPCOORD_ADDR": f"{dead},{coordinator.addr}", "SNAPCOORD_RUN_ID": "run-a", "SNAPCOORD_RUN_TOKEN": token}
    with snapcoord.connect(env=env, timeout=10.0) as client, client.trainer(0) as trainer, client.env_worker("env-0") as worker:
        assert trainer.complete_step(1, 0.1).action == snapcoord.Action.CONTINUE
        # Whatever the method, a call goes to the live address, not the dead one.
        with snapcoord.connect([dead, coordinator.addr], timeout=10.0, env={}) as admin:
            admin.call(admin.runs.TriggerDeadline, run_service_pb2.TriggerDeadlineRequest(run_id="run-a", reason="test"))
        assert trainer.complete_step(2, 0.1).should_save
        trainer.report_checkpoint(2, snapcoord.Phase.SAVED, 0.1)
        cmd = worker.next_command(timeout=10)
        assert cmd is not None and cmd.kind == CommandKind.SAVE_AT_DEADLINE
        assert worker.report_snapshot(cmd.snapshot_id, Outcome.SAVED, 0.1) == RunState.STOPPED


def test_calls_go_to_the_serving_coordinator(coordinator: Coordinator, follower: Follower) -> None:
    """A follower reports NOT_SERVING: every call goes to the leader, the
    follower is listed first or not."""
    for addrs in ([follower.addr, coordinator.addr], [coordinator.addr, follower.addr]):
        with snapcoord.connect(addrs, timeout=10.0, env={}) as admin:
            for i in range(4):
                with pytest.raises(snapcoord.NotFoundError):  # the leader's answer
                    admin.get_run(f"no-such-run-{i}")
                # Not retried on UNAVAILABLE: a call the follower got would fail.
                with pytest.raises(snapcoord.NotFoundError):
                    admin.call(admin.runs.ReissueRunToken, run_service_pb2.ReissueRunTokenRequest(run_id=f"no-such-run-{i}", reason="t"))
    assert follower.calls == 0


def test_not_leader_is_retried_even_where_unavailable_is_not(coordinator: Coordinator) -> None:
    """A stale leader (still SERVING in its health) refuses a call with
    NOT_LEADER: the call did nothing there, so even ReissueRunToken, never
    retried on a plain UNAVAILABLE, is repeated, and reaches the leader; the
    stale one is passed over from then on. Calls go to the coordinator whose
    health turned SERVING last: the stale one in about every other client."""
    admin = coordinator.admin()
    for i in range(40):
        admin.create_run(f"run-{i}", run_spec(1, budget="00:01:00:00"))
    stale = Follower(serving=True)
    try:
        i = 0
        while stale.calls == 0:
            assert i < 20, "20 clients, and no call reached the stale leader"
            with snapcoord.connect([stale.addr, coordinator.addr], timeout=10.0, env={}) as c:
                for _ in range(3):
                    run = c.call(c.runs.ReissueRunToken, run_service_pb2.ReissueRunTokenRequest(run_id=f"run-{i}", reason="test")).run
                    assert run.run_id == f"run-{i}"
                    i += 1
        assert stale.calls == 1, "the stale leader was not passed over after its refusal"
        # The same refusal without NOT_LEADER is a plain UNAVAILABLE: not retried.
        stale.not_leader = False
        refused = 0
        while refused == 0:
            assert i < 40, "20 clients, and no call reached the stale leader"
            with snapcoord.connect([stale.addr, coordinator.addr], timeout=10.0, env={}) as c:
                try:
                    c.call(c.runs.ReissueRunToken, run_service_pb2.ReissueRunTokenRequest(run_id=f"run-{i}", reason="test"))
                except snapcoord.UnavailableError:
                    refused += 1
                i += 1
    finally:
        stale.stop()


def test_worker_follows_a_restarted_coordinator(coordinator: Coordinator) -> None:
    """Across a SIGKILL and restart of the serving coordinator, a worker given
    [dead, live] resumes its command stream and gets the deadline command."""
    _, token = coordinator.admin().create_run("run-a", run_spec(1, budget="00:01:00:00"))
    addrs = [f"127.0.0.1:{free_port()}", coordinator.addr]
    with snapcoord.connect(addrs, run_id="run-a", run_token=token, timeout=10.0, env={}) as client, client.env_worker("env-0") as worker:
        first = worker.incarnation
        coordinator.kill()
        coordinator.start()
        admin = coordinator.admin()
        admin.call(admin.runs.TriggerDeadline, run_service_pb2.TriggerDeadlineRequest(run_id="run-a", reason="test"))
        cmd = worker.next_command(timeout=15)
        assert cmd is not None and cmd.kind == CommandKind.SAVE_AT_DEADLINE
        assert worker.report_snapshot(cmd.snapshot_id, Outcome.SAVED, 0.1) is not None
        assert worker.incarnation == first and worker.error is None


def test_address_lists() -> None:
    assert split_addrs("127.0.0.1:1") == ["127.0.0.1:1"]
    assert split_addrs("a:1, b:2") == ["a:1", "b:2"]
    assert split_addrs(["a:1", "b:2,c:3"]) == ["a:1", "b:2", "c:3"]
    with pytest.raises(ValueError, match="empty entry"):
        snapcoord.connect("127.0.0.1:1,", env={})
    # Plaintext by default only when every address is on loopback: here TLS,
    # and over TLS two hosts need the one name their certificates share.
    with pytest.raises(ValueError, match="server name"):
        snapcoord.connect(env={"SNAPCOORD_ADDR": "127.0.0.1:1,10.0.0.1:1"})
    snapcoord.connect("127.0.0.1:1,10.0.0.1:1", tls=snapcoord.TLS(server_name="coordinators.example"), env={}).close()
    with pytest.raises(ValueError, match="no-such-host.invalid"):
        snapcoord.connect("127.0.0.1:1,no-such-host.invalid:1", env={})
