"""Slurm's USR1 notice reaches an EnvWorker: with the coordinator gone it
saves the environment itself; with the coordinator alive it adds nothing.

The worker runs in a process of its own, so that the signal is a real one,
handled in that process's main thread."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
from typing import Iterator, Optional

import pytest
from conftest import Coordinator, run_spec, wait_until

import snapcoord
from snapcoord.v1 import run_service_pb2

# The worker process: registers, says so on stdout, and saves each snapshot
# as a JSON file named for it, until the Stop.
WORKER = """
import json, logging, os, pathlib, sys
import snapcoord
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
addr, run_id, token, out = sys.argv[1:5]
client = snapcoord.connect(addr, plaintext=True, run_id=run_id, run_token=token, timeout=10.0, env={})
with client.env_worker("env-0") as worker:
    print("registered", flush=True)
    def save(cmd):
        if os.environ.get("FAIL_COORDINATOR_DEADLINE") and not cmd.backstop:
            raise OSError("disk full")
        (pathlib.Path(out) / cmd.snapshot_id).write_text(json.dumps(
            {"kind": cmd.kind.value, "reason": cmd.reason, "forced": cmd.forced, "backstop": cmd.backstop}))
    print("stopped:", worker.run(on_snapshot=save), flush=True)
"""


class WorkerProcess:
    def __init__(self, coordinator: Coordinator, run_id: str, tmp: pathlib.Path, env: Optional[dict[str, str]] = None) -> None:
        _, token = coordinator.admin().create_run(run_id, run_spec(1, budget="00:01:00:00"))
        self.token = token
        self.saved = tmp / "saved"
        self.saved.mkdir()
        self.stdout, self.stderr = tmp / "worker.out", tmp / "worker.err"
        script = tmp / "worker.py"
        script.write_text(WORKER)
        args = [coordinator.addr, run_id, token, str(self.saved)]
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, str(script), *args], stdout=out, stderr=err, env={**os.environ, **(env or {})})
        wait_until("the worker to register", lambda: "registered" in self.out() or self.proc.poll() is not None)
        assert self.proc.poll() is None, self.err()

    def out(self) -> str:
        return self.stdout.read_text()

    def err(self) -> str:
        return self.stderr.read_text()

    def snapshots(self) -> dict[str, dict[str, object]]:
        return {p.name: json.loads(p.read_text()) for p in sorted(self.saved.iterdir())}

    def wait(self) -> int:
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker still runs:\n{self.err()}")
        return -1

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def worker_process(coordinator: Coordinator, tmp_path: pathlib.Path) -> Iterator[WorkerProcess]:
    w = WorkerProcess(coordinator, "backstop", tmp_path)
    yield w
    w.kill()


def trigger(coordinator: Coordinator) -> None:
    coordinator.admin().runs.TriggerDeadline(run_service_pb2.TriggerDeadlineRequest(run_id="backstop", reason="test"))


def test_backstop_saves_when_the_coordinator_is_gone(coordinator: Coordinator, worker_process: WorkerProcess) -> None:
    coordinator.kill()
    worker_process.proc.send_signal(signal.SIGUSR1)
    wait_until("the backstop snapshot", lambda: "taken locally" in worker_process.err())
    saved = worker_process.snapshots()
    assert len(saved) == 1, worker_process.err()
    (local_id, local), = saved.items()
    assert local_id.startswith("backstop-")
    assert local == {"kind": "save_at_deadline", "reason": "deadline", "forced": True, "backstop": True}

    # The worker goes on: it says when the coordinator is back, and takes part
    # in the coordinator's deadline snapshot as usual.
    coordinator.start()
    wait_until("the worker to see the coordinator back", lambda: "the coordinator answers again" in worker_process.err())
    trigger(coordinator)
    assert worker_process.wait() == 0, worker_process.err()
    assert "stopped: STOPPED" in worker_process.out()
    snaps = coordinator.admin().snapshots("backstop")
    assert len(snaps) == 1 and snaps[0].outcome == snapcoord.Outcome.SAVED
    saved = worker_process.snapshots()
    assert list(saved) == [local_id, snaps[0].snapshot_id]
    assert saved[snaps[0].snapshot_id]["backstop"] is False


def refused_registrations(coordinator: Coordinator) -> int:
    """RegisterWorker calls the coordinator answered UNAUTHENTICATED, by its log."""
    lines = coordinator.log_path.read_text().splitlines()
    return sum("grpc.method=RegisterWorker" in line and "grpc.code=Unauthenticated" in line for line in lines)


# The coordinator comes back on the same address with its data lost (an
# empty data directory): it knows neither the run nor its token. The worker
# goes on as with the coordinator gone, with one WARNING however often it
# tries again, and the signal still has it save the environment itself;
# run() raises nothing. Once the coordinator has its data back, the worker
# takes part in its deadline snapshot. A new worker with the token still
# fails at once: it was never registered, and for it the token is wrong.
def test_backstop_saves_when_the_coordinator_lost_the_run(
    coordinator: Coordinator, worker_process: WorkerProcess, tmp_path: pathlib.Path
) -> None:
    db, kept = coordinator.data_dir / "snapcoord.db", tmp_path / "kept.db"
    coordinator.kill()
    shutil.move(db, kept)
    coordinator.start()
    lost = "the coordinator no longer knows this run"
    wait_until("the worker to find the run lost", lambda: lost in worker_process.err())
    # Its lease presumed lapsed, it tries to register again at each heartbeat.
    wait_until("three refused registrations", lambda: refused_registrations(coordinator) >= 3)
    with pytest.raises(snapcoord.AuthError):
        coordinator.worker_client("backstop", worker_process.token).env_worker("env-1", backstop_signal=None)
    worker_process.proc.send_signal(signal.SIGUSR1)
    wait_until("the backstop snapshot", lambda: "taken locally" in worker_process.err())
    (local_id, local), = worker_process.snapshots().items()
    assert local_id.startswith("backstop-") and local["backstop"] is True
    assert worker_process.proc.poll() is None, worker_process.err()

    coordinator.kill()
    shutil.move(kept, db)
    coordinator.start()
    wait_until("the worker to see the run known again", lambda: "the coordinator knows this run again" in worker_process.err())
    trigger(coordinator)
    assert worker_process.wait() == 0, worker_process.err()
    assert "stopped: STOPPED" in worker_process.out()
    (snap,) = coordinator.admin().snapshots("backstop")
    assert snap.outcome == snapcoord.Outcome.SAVED
    warnings = [line for line in worker_process.err().splitlines() if line.startswith("WARNING")]
    assert sum(lost in w for w in warnings) == 1, warnings
    assert not any("registering again failed" in w for w in warnings), warnings


def test_backstop_signal_with_a_live_coordinator(coordinator: Coordinator, worker_process: WorkerProcess) -> None:
    worker_process.proc.send_signal(signal.SIGUSR1)
    wait_until("the worker to find the coordinator", lambda: "backstop signal: the coordinator answers" in worker_process.err())
    trigger(coordinator)
    assert worker_process.wait() == 0, worker_process.err()
    snaps = coordinator.admin().snapshots("backstop")
    assert [s.snapshot_id for s in snaps] == list(worker_process.snapshots())
    assert len(snaps) == 1


def test_backstop_signal_handler_follows_the_worker(coordinator: Coordinator) -> None:
    _, token = coordinator.admin().create_run("handler", run_spec(1, budget="00:01:00:00"))
    client = coordinator.worker_client("handler", token)
    before = signal.getsignal(signal.SIGUSR1)
    with client.env_worker("main"):
        assert signal.getsignal(signal.SIGUSR1) is not before
    assert signal.getsignal(signal.SIGUSR1) is before
    with client.env_worker("off", backstop_signal=None):
        assert signal.getsignal(signal.SIGUSR1) is before

    got: dict[str, object] = {}

    def in_a_thread() -> None:
        with client.env_worker("thread") as w:  # the default: nothing to install from here
            got["default"] = w.worker_id
        try:
            client.env_worker("explicit", backstop_signal=signal.SIGUSR2)
        except ValueError as err:
            got["explicit"] = str(err)

    t = threading.Thread(target=in_a_thread)
    t.start()
    t.join(30)
    assert got.get("default") and signal.getsignal(signal.SIGUSR1) is before
    assert "backstop_signal=SIGUSR2 needs the main thread" in str(got.get("explicit"))


def test_a_failed_deadline_report_names_the_backstop(coordinator: Coordinator, tmp_path: pathlib.Path) -> None:
    w = WorkerProcess(coordinator, "backstop", tmp_path, env={"FAIL_COORDINATOR_DEADLINE": "1"})
    try:
        coordinator.kill()
        w.proc.send_signal(signal.SIGUSR1)
        wait_until("the backstop snapshot", lambda: "taken locally" in w.err())
        (local_id,) = w.snapshots()
        coordinator.start()
        wait_until("the worker to see the coordinator back", lambda: "the coordinator answers again" in w.err())
        trigger(coordinator)
        assert w.wait() == 0, w.err()
        (snap,) = coordinator.admin().snapshots("backstop")
        assert len(snap.reports) == 1, (snap, w.err())
        (report,) = snap.reports
        assert report.outcome == snapcoord.Outcome.IO_ERROR
        assert report.message.startswith("OSError: disk full; this worker's state was saved by the local backstop snapshot " + local_id)
    finally:
        w.kill()
