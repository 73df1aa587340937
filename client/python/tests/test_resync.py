"""A coordinator whose state went back to an older copy: the worker's resume
point lies past the end of the command log (OUT_OF_RANGE), and the worker
reads the log again without handling a command twice."""

from __future__ import annotations

import logging
import pathlib
import shutil
import threading
from typing import Iterator

import pytest
from conftest import Coordinator, run_spec

from snapcoord import Command, CommandKind, Outcome, Phase, RunState
from snapcoord.env_worker import EnvWorker
from snapcoord.v1 import run_service_pb2

STORE = "snapcoord.db"  # coordinator.StoreFile


class Said(logging.Handler):
    """Sets ``event`` when a record's message contains ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.event = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def next_command(worker: EnvWorker) -> Command:
    cmd = worker.next_command(timeout=15)
    assert cmd is not None, "no command within 15 s"
    return cmd


@pytest.fixture
def coordinator(snapcoord_bin: str, tmp_path: pathlib.Path) -> Iterator[Coordinator]:
    # Leases outlast the stops and starts: a worker that re-registered for a
    # lapsed lease holds an incarnation the restored state never had, and is
    # refused as superseded, which is not what this is about.
    c = Coordinator(snapcoord_bin, tmp_path, ("--lease-ttl", "8s"))
    yield c
    c.stop()


@pytest.mark.parametrize("poll", [False, True], ids=["stream", "poll"])
def test_worker_resyncs_when_the_log_went_back(coordinator: Coordinator, poll: bool) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("run-a", run_spec(1, budget="00:01:00:00"))
    logger = logging.getLogger(f"snapcoord.test.resync.{poll}")
    registered = Said("registered again")
    logger.addHandler(registered)
    logger.setLevel(logging.INFO)
    client = coordinator.worker_client("run-a", token)
    with client.env_worker("env-0", poll=poll, poll_wait=2, logger=logger) as worker, client.trainer(0) as trainer:

        def checkpoint(step: int) -> Command:
            trainer.complete_step(step, 0.1)
            trainer.report_checkpoint(step, Phase.SAVED, 0.1)
            cmd = next_command(worker)
            assert cmd.kind == CommandKind.SNAPSHOT, cmd
            return cmd

        first = checkpoint(1)
        # A backup, taken while the first snapshot waits for env-0's report.
        coordinator.stop()
        shutil.copy(coordinator.data_dir / STORE, coordinator.data_dir / "backup.db")
        coordinator.start()
        worker.report_snapshot(first.snapshot_id, Outcome.SAVED, 0.1)
        second = checkpoint(2)
        worker.report_snapshot(second.snapshot_id, Outcome.SAVED, 0.1)
        assert worker.last_seq == second.seq

        # Restored: the log ends before the worker's resume point.
        coordinator.stop()
        shutil.copy(coordinator.data_dir / "backup.db", coordinator.data_dir / STORE)
        coordinator.start()
        assert registered.event.wait(15), "the worker did not register again to resync"

        admin.call(admin.runs.TriggerDeadline, run_service_pb2.TriggerDeadlineRequest(run_id="run-a", reason="test"))
        assert trainer.complete_step(2, 0.1).should_save
        trainer.report_checkpoint(2, Phase.SAVED, 0.1)
        # Not the first snapshot's command again (the restored state still
        # waits for its report, so the resync starts just before it), but
        # the SaveAtDeadline, at a seq the worker saw before the restore.
        save = next_command(worker)
        assert save.kind == CommandKind.SAVE_AT_DEADLINE and save.anchor_step == 2, save
        assert save.seq <= second.seq
        assert worker.report_snapshot(save.snapshot_id, Outcome.SAVED, 0.1) == RunState.STOPPED
        assert next_command(worker).kind == CommandKind.STOP
        assert worker.error is None
