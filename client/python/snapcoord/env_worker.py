"""``EnvWorker``: an environment worker in Python, without the sidecar."""

from __future__ import annotations

import datetime
import enum
import logging
import signal
import time
from dataclasses import dataclass
from typing import Callable, Optional, Union, cast

from snapcoord import _backstop, errors
from snapcoord._retry import FOLLOW_MAX_WAIT
from snapcoord._worker import _Handle, _Worker
from snapcoord._conn import Connected
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


class _Default(enum.Enum):
    """``backstop_signal``'s default: SIGUSR1 for a worker created in the
    main thread (the only thread Python installs signal handlers from), none
    for one created elsewhere."""

    SIGUSR1_IN_MAIN_THREAD = "SIGUSR1 in the main thread"


#: The backstop's bounds: its look at the coordinator (a live one answers a
#: heartbeat well within it; Slurm's notice leaves minutes), and how often it
#: asks again after a local snapshot, to say when the coordinator is back.
BACKSTOP_PROBE_SECONDS = 2.0
BACKSTOP_RECHECK_SECONDS = 1.0


def backstop_id(now: datetime.datetime) -> str:
    """A local backstop snapshot's id: sorts by time, and is a file name."""
    return "backstop-" + now.astimezone(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


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

    ``backstop_signal`` (default SIGUSR1 when the worker is created in the
    main thread; None turns it off) is Slurm's ``--signal`` notice: when it
    arrives and the coordinator does not answer a heartbeat within 2 s, the
    worker hands the process a SAVE_AT_DEADLINE of its own (``backstop``
    True, ``snapshot_id`` ``backstop-<UTC time>``), so that the environment
    saves although the coordinator is gone; ``run`` calls ``on_snapshot``
    with it and does not report it. With the coordinator answering, the
    signal does nothing: the deadline comes from it. Python installs signal
    handlers only from the main thread: a signal given explicitly from
    another thread raises ValueError.

    A coordinator that no longer knows the run (it lost its data, and
    answers UNAUTHENTICATED or NOT_FOUND) is one out of reach to the worker:
    one WARNING, and it goes on retrying, the backstop armed, and resumes
    if the coordinator knows the run again; ``commands()`` and ``run`` raise
    nothing for it. A wrong run or token raises AuthError or NotFoundError
    from the constructor: a worker never registered has nothing to go on
    with.
    """

    def __init__(
        self,
        client: Connected,
        name: str,
        *,
        run_id: Optional[str] = None,
        poll: bool = False,
        poll_wait: float = 30.0,
        replay: bool = False,
        logger: Optional[logging.Logger] = None,
        backstop_signal: Union[int, None, _Default] = _Default.SIGUSR1_IN_MAIN_THREAD,
    ) -> None:
        if isinstance(backstop_signal, _Default):
            backstop_signal = signal.SIGUSR1 if _backstop.in_main_thread() else None
        elif backstop_signal is not None and not _backstop.in_main_thread():
            raise ValueError(
                f"snapcoord: backstop_signal={signal.Signals(backstop_signal).name} needs the main thread "
                "(Python installs signal handlers only there): create the EnvWorker there, or pass backstop_signal=None"
            )
        self._c = client.connection
        self.name = name
        #: The run this worker belongs to.
        self.run_id = run_id or self._c.run_id
        self._w = _Worker(
            self._c,
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
        # The local backstop snapshot taken, if any: (id, outcome, when).
        self._backstop_taken: Optional[tuple[str, Outcome, datetime.datetime]] = None
        self._unwatch: Callable[[], None] = lambda: None
        if backstop_signal is not None:
            self._unwatch = _backstop.watch(backstop_signal, self._on_backstop)

    def close(self, timeout: Optional[float] = None) -> None:
        """Stops the background threads and deregisters the worker, so that no
        snapshot waits for it (not when superseded). Later calls do nothing."""
        self._unwatch()
        super().close(timeout)

    def _on_backstop(self) -> None:
        """The backstop signal came (called on a thread of its own)."""
        if self._w.wait_stopped(0):
            return
        err = self._w.probe(BACKSTOP_PROBE_SECONDS)
        if err is None:
            self._w.log.info("backstop signal: the coordinator answers, the deadline snapshot comes from it")
            return
        now = datetime.datetime.now(datetime.timezone.utc)
        snapshot_id = backstop_id(now)
        taken = self._w.claim_deadline(snapshot_id)
        if taken is not None:
            self._w.log.info("backstop signal: this worker's deadline snapshot %s was taken already", taken)
            return
        self._w.log.warning(
            "backstop signal: the coordinator cannot be reached, or lost this run (%s); taking a local deadline snapshot %s", err.code(), snapshot_id
        )
        self._w.inject(
            Command(
                seq=0, kind=CommandKind.SAVE_AT_DEADLINE, issued_at=now, snapshot_id=snapshot_id, reason="deadline",
                anchor_step=self._w.last_anchor, forced=True, backstop=True,
            )
        )  # fmt: skip
        while not self._w.wait_stopped(BACKSTOP_RECHECK_SECONDS):
            if self._w.probe(BACKSTOP_PROBE_SECONDS) is None:
                self._w.log.info(
                    "the coordinator answers again; the backstop snapshot %s was taken locally and is not reported "
                    "(the coordinator has no snapshot for it; a deadline snapshot it sends still comes)",
                    snapshot_id,
                )
                return

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
            return self._c.workers_patient.ReportSnapshot(req, timeout=self._timeout(timeout))

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
        reported IO_ERROR with its text, and does not stop the worker. A
        ``backstop`` command (see the class) is passed to ``on_snapshot`` too,
        and its outcome logged, not reported; the worker then goes on.
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
        if cmd.backstop:
            self._backstop_taken = (cmd.snapshot_id, result.outcome, datetime.datetime.now(datetime.timezone.utc))
            self._w.log.warning(
                "backstop snapshot %s taken locally (%s): the coordinator knows nothing of it", cmd.snapshot_id, result.outcome.name
            )
            return
        result = self._with_backstop_note(cmd, result)
        try:
            self.report_snapshot(cmd.snapshot_id, result.outcome, took, result.message)
        except errors.SupersededError:
            raise
        except errors.SnapcoordError as err:
            # Refused (e.g. the snapshot was superseded, or the run ended) or
            # given up on at stop: the next command goes on.
            self._w.log.warning("report of snapshot %s failed: %s", cmd.snapshot_id, err)

    def _with_backstop_note(self, cmd: Command, result: SnapshotResult) -> SnapshotResult:
        """The report of a deadline snapshot this worker could not save names
        where the local backstop saved the state instead."""
        if self._backstop_taken is None or cmd.kind != CommandKind.SAVE_AT_DEADLINE or result.outcome == Outcome.SAVED:
            return result
        sid, outcome, at = self._backstop_taken
        note = f"; this worker's state was saved by the local backstop snapshot {sid} at {at.isoformat(timespec='milliseconds')} ({outcome.name})"
        return SnapshotResult(result.outcome, (result.message + note)[:4096])
