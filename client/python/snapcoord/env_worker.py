"""``EnvWorker``: an environment worker in Python, without the sidecar."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional, Union, cast

from snapcoord import errors
from snapcoord._retry import FOLLOW_MAX_WAIT
from snapcoord._worker import _Handle, _Worker
from snapcoord.client import Client
from snapcoord.types import Command, CommandKind, Outcome, RunState
from snapcoord.v1 import worker_pb2, worker_service_pb2 as ws


@dataclass(frozen=True)
class SnapshotResult:
    """What an ``on_snapshot`` callback may return besides a bare Outcome."""

    outcome: Outcome
    #: Free text: where the snapshot went, or the error (at most 4096 bytes).
    message: str = ""


#: What ``on_snapshot`` returns: None means SAVED.
SnapshotReturn = Union[None, Outcome, SnapshotResult]


class EnvWorker(_Handle):
    """A registered environment worker.

    It heartbeats on a daemon thread and receives the run's commands for
    environment workers (``SaveAtDeadline``, ``Snapshot``, ``Stop``) by stream,
    falling back to long polling when the stream is refused; it resumes after
    the last command it delivered across disconnects and coordinator
    restarts, registers again when its lease lapsed, and deregisters on
    ``close()``. A worker started in place of one that died in the middle of a
    snapshot gets that snapshot's command first.

    Iterate the commands yourself::

        for cmd in worker.commands():
            if cmd.is_snapshot:
                t0 = time.monotonic()
                save_state(cmd.snapshot_id)
                worker.report_snapshot(cmd.snapshot_id, Outcome.SAVED, time.monotonic() - t0)

    or let ``run`` call back for each snapshot and report what it returns::

        worker.run(on_snapshot=lambda cmd: save_state(cmd.snapshot_id))

    ``name`` must be stable for the process (a restarted process with the same
    name is the same worker) and unique in the run.
    """

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        run_id: Optional[str] = None,
        poll: bool = False,
        poll_wait: float = 30.0,
        replay: bool = False,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        self._c = client
        self.name = name
        #: The run this worker belongs to.
        self.run_id = run_id or client.run_id
        self._w = _Worker(
            client,
            run_id=self.run_id,
            role=worker_pb2.WORKER_ROLE_ENVIRONMENT,
            name=name,
            rank=0,
            poll=poll,
            poll_wait=poll_wait,
            replay=replay,
            handler=None,
            logger=logger,
        )

    def report_snapshot(
        self,
        snapshot_id: str,
        outcome: Outcome,
        duration_seconds: float,
        message: str = "",
        timeout: Optional[float] = None,
    ) -> RunState:
        """Reports how this worker's part of a snapshot ended.

        While the coordinator cannot be reached it keeps trying, a second
        apart once the client's own retries gave up, until it answers: a
        restarted coordinator still counts a report that arrives within its
        restart grace. It gives up when the worker stops (Stop, close(),
        superseded), raising UnavailableError. A refusal raises at once. Safe
        to repeat: the coordinator keeps the first report.
        """

        def call(inc: int) -> ws.ReportSnapshotResponse:
            req = ws.ReportSnapshotRequest(
                run_id=self.run_id,
                worker_id=self._w.worker_id,
                snapshot_id=snapshot_id,
                outcome=cast(worker_pb2.SnapshotOutcome, outcome),  # an IntEnum of the same values
                duration_seconds=duration_seconds,
                message=message,
                incarnation=inc,
            )
            return self._c.workers.ReportSnapshot(req, timeout=self._timeout(timeout))

        while True:
            try:
                return RunState(self._w.fenced(call).run_state)
            except errors.UnavailableError as err:
                self._w.log.warning("report of snapshot %s not answered yet: %s", snapshot_id, err)
                if self._w.wait_stopped(FOLLOW_MAX_WAIT):
                    raise

    def run(
        self,
        on_snapshot: Callable[[Command], SnapshotReturn],
        on_stop: Optional[Callable[[str], None]] = None,
    ) -> Optional[str]:
        """Follows the commands until the Stop: for each snapshot command,
        calls ``on_snapshot(cmd)``, measures it, and reports what it returned
        (None: SAVED; an Outcome; a SnapshotResult). An exception from it is
        reported IO_ERROR with its text, and does not stop the worker.
        ``on_stop(reason)`` is called on the Stop. Returns the Stop's reason
        (None if close() ended it); raises what ended the worker otherwise.
        """
        for cmd in self.commands():
            if cmd.kind == CommandKind.STOP:
                if on_stop is not None:
                    on_stop(cmd.stop_reason)
                return cmd.stop_reason
            if cmd.is_snapshot:
                self._snapshot(cmd, on_snapshot)
        return None

    def _snapshot(self, cmd: Command, on_snapshot: Callable[[Command], SnapshotReturn]) -> None:
        t0 = time.monotonic()
        try:
            got = on_snapshot(cmd)
            result = got if isinstance(got, SnapshotResult) else SnapshotResult(Outcome.SAVED if got is None else Outcome(got))
        except Exception as exc:  # the environment's failure is the snapshot's outcome, not the worker's end
            self._w.log.exception("snapshot %s failed", cmd.snapshot_id)
            result = SnapshotResult(Outcome.IO_ERROR, f"{type(exc).__name__}: {exc}"[:4096])
        took = time.monotonic() - t0
        try:
            self.report_snapshot(cmd.snapshot_id, result.outcome, took, result.message)
        except errors.SupersededError:
            raise
        except errors.SnapcoordError as err:
            # Refused (e.g. the snapshot was superseded, or the run ended) or
            # given up on at stop: the next command goes on.
            self._w.log.warning("report of snapshot %s failed: %s", cmd.snapshot_id, err)
