"""Two coordinators on a real etcd (Debian's /usr/bin/etcd, one member on
loopback): the client follows the leader across its SIGKILL, and a worker
gets the deadline command the new leader issues."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import threading
import time
import urllib.request
from typing import Iterator

import grpc
import pytest
from conftest import Coordinator, free_port, run_spec

import snapcoord
from snapcoord import CommandKind, Outcome, Phase, RunState
from snapcoord.v1 import run_service_pb2

ETCD = "/usr/bin/etcd"
_SERVING = b"\x08\x01"
_WORKER_SERVICE = b"\n\x1asnapcoord.v1.WorkerService"  # HealthCheckRequest{service: "snapcoord.v1.WorkerService"}


@pytest.fixture
def etcd(tmp_path: pathlib.Path) -> Iterator[str]:
    """One etcd member on free loopback ports; its client endpoint."""
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    with open(tmp_path / "etcd.log", "ab") as log:
        proc = subprocess.Popen(
            [ETCD, "--name", "m0", "--data-dir", str(tmp_path / "etcd"), "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"m0={peer}", "--initial-cluster-state", "new", "--logger", "zap"],
            stdout=log, stderr=log,
        )  # fmt: skip
    try:
        end = time.monotonic() + 30
        while not _etcd_healthy(client):
            if proc.poll() is not None or time.monotonic() > end:
                pytest.fail("etcd did not become healthy:\n" + (tmp_path / "etcd.log").read_text(errors="replace")[-2000:])
            time.sleep(0.05)  # a refused connection fails at once
        yield client.removeprefix("http://")
    finally:
        proc.kill()
        proc.wait()


def _etcd_healthy(client_url: str) -> bool:
    try:
        with urllib.request.urlopen(client_url + "/health", timeout=1) as resp:
            return b'"health":"true"' in resp.read()
    except OSError:
        return False


def leads(c: Coordinator) -> bool:
    """Whether c's health reports WorkerService SERVING: it is the leader."""
    with grpc.insecure_channel(c.addr) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b, response_deserializer=bytes)
        try:
            return check(_WORKER_SERVICE, timeout=2) == _SERVING
        except grpc.RpcError:
            return False


def test_worker_follows_a_leader_kill(snapcoord_bin: str, tmp_path: pathlib.Path, etcd: str) -> None:
    coords = []
    for i in range(2):
        (tmp_path / f"c{i}").mkdir()
        coords.append(Coordinator(snapcoord_bin, tmp_path / f"c{i}", ("--store", "etcd", "--etcd-endpoints", etcd, "--election-ttl", "2s")))
    try:
        addrs = [c.addr for c in coords]
        with snapcoord.connect(addrs, timeout=30.0, env={}) as admin:
            _, token = admin.create_run("run-a", run_spec(1, budget="00:01:00:00"))
            client = snapcoord.connect(addrs, run_id="run-a", run_token=token, timeout=30.0, env={})
            with client, client.env_worker("env-0") as worker, client.trainer(0) as trainer:
                assert trainer.complete_step(1, 0.1).action == snapcoord.Action.CONTINUE
                (leader,) = [c for c in coords if leads(c)]
                (follower,) = [c for c in coords if c is not leader]
                leader.kill()
                # The trainer's step is retried until the follower took over
                # (its election lease is 2 s).
                d = trainer.complete_step(2, 0.1)
                assert d.action == snapcoord.Action.CONTINUE and leads(follower)
                admin.call(admin.runs.TriggerDeadline, run_service_pb2.TriggerDeadlineRequest(run_id="run-a", reason="test"))
                d = trainer.complete_step(3, 0.1)
                assert d.should_save and d.should_stop
                trainer.report_checkpoint(3, Phase.SAVED, 0.1)
                cmd = worker.next_command(timeout=30)
                assert cmd is not None and cmd.kind == CommandKind.SAVE_AT_DEADLINE and cmd.anchor_step == 3, cmd
                assert worker.report_snapshot(cmd.snapshot_id, Outcome.SAVED, 0.1) == RunState.STOPPED
                stop = worker.next_command(timeout=30)
                assert stop is not None and stop.kind == CommandKind.STOP
                assert worker.error is None
    finally:
        for c in coords:
            c.stop()


def _serving_from(c: Coordinator) -> float:
    """Waits, on a health watch, until c reports WorkerService SERVING;
    returns when (time.monotonic())."""
    with grpc.insecure_channel(c.addr) as ch:
        watch = ch.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=lambda b: b, response_deserializer=bytes)
        for status in watch(_WORKER_SERVICE, timeout=60):
            if status == _SERVING:
                return time.monotonic()
    raise AssertionError(f"{c.addr} never reported SERVING")


def test_report_sent_to_a_frozen_leader_reaches_the_next(snapcoord_bin: str, tmp_path: pathlib.Path, etcd: str) -> None:
    """The leader freezes (SIGSTOP: a GC pause, a stuck disk, a VM stall)
    while the run is SNAPSHOTTING: the environment worker's report, sent to
    it, is made again at the next leader as soon as that one serves (within
    the election TTL + 1 s), not when the frozen one runs again 5x the TTL
    later; the run ends STOPPED with the report counted."""
    ttl = 2.0
    coords = []
    for i in range(2):
        (tmp_path / f"c{i}").mkdir()
        coords.append(Coordinator(snapcoord_bin, tmp_path / f"c{i}", ("--store", "etcd", "--etcd-endpoints", etcd, "--election-ttl", "2s")))
    frozen = None
    try:
        addrs = [c.addr for c in coords]
        with snapcoord.connect(addrs, timeout=30.0, env={}) as admin:
            _, token = admin.create_run("run-f", run_spec(1, budget="00:01:00:00"))
            client = snapcoord.connect(addrs, run_id="run-f", run_token=token, env={})
            with client, client.env_worker("env-0") as worker, client.trainer(0) as trainer:
                assert trainer.complete_step(1, 0.1).action == snapcoord.Action.CONTINUE
                admin.call(admin.runs.TriggerDeadline, run_service_pb2.TriggerDeadlineRequest(run_id="run-f", reason="test"))
                assert trainer.complete_step(2, 0.1).should_save
                trainer.report_checkpoint(2, Phase.SAVED, 0.1)
                cmd = worker.next_command(timeout=30)
                assert cmd is not None and cmd.kind == CommandKind.SAVE_AT_DEADLINE, cmd

                (frozen,) = [c for c in coords if leads(c)]
                (follower,) = [c for c in coords if c is not frozen]
                assert frozen.proc is not None
                frozen.proc.send_signal(signal.SIGSTOP)
                thaw = threading.Timer(5 * ttl, frozen.proc.send_signal, (signal.SIGCONT,))
                thaw.start()
                reported: dict[str, object] = {}

                def report() -> None:
                    reported["state"] = worker.report_snapshot(cmd.snapshot_id, Outcome.SAVED, 0.1)
                    reported["at"] = time.monotonic()

                reporter = threading.Thread(target=report)
                reporter.start()
                serving = _serving_from(follower)
                reporter.join(30)
                thaw.cancel()
                assert reported.get("state") == RunState.STOPPED, reported
                late = float(reported["at"]) - serving  # type: ignore[arg-type]
                assert late <= ttl + 1, f"the report was answered {late:.2f}s after the next leader served"
    finally:
        if frozen is not None and frozen.proc is not None:
            frozen.proc.send_signal(signal.SIGCONT)
        for c in coords:
            c.stop()
