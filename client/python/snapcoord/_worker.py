"""What every worker process does, trainer rank or environment worker:
register, heartbeat, follow its commands, re-register, stop when superseded.

The behaviour mirrors the Go client's worker.go and commands.go.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator, Optional, TypeVar

import grpc

from snapcoord import errors
from snapcoord._conn import Connection
from snapcoord.types import Command, CommandKind, RunState
from snapcoord.v1 import worker_pb2, worker_service_pb2 as ws

T = TypeVar("T")

# PollCommandsRequest.wait_seconds' upper bound: a longer wait is refused.
MAX_POLL_WAIT = 3600
# How much longer than its wait a long poll may take before it is given up
# (and asked again): a coordinator that vanished without closing the
# connection, before keepalive notices.
_POLL_SLACK = 10.0
_END = object()  # closes the command queue

_CODES_TO_RESUME = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)
_CODES_FATAL = frozenset({grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT})
# What a coordinator that registered this worker answers once it lost the
# run: its token is unknown, or the run is (see _run_lost).
_CODES_RUN_LOST = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.NOT_FOUND})
# What the backstop's probe takes for a coordinator that will send no deadline.
_CODES_NO_ANSWER = _CODES_RUN_LOST | {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


class _Prefixed(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Names the run and the worker in every message (and in ``extra``)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        assert self.extra is not None
        kwargs.setdefault("extra", {}).update(self.extra)
        return f"{self.extra['run_id']}/{self.extra['worker']}: {msg}", kwargs


class _NoStop(Exception):
    """A poll found the run terminal and no command after the last delivered
    one: its Stop lies before this worker's resume point, the run is over."""


def poll_wait_seconds(wait: float) -> int:
    """Whole seconds from 1 to an hour (30 if not positive): what PollCommands
    accepts. 0 would be answered at once and poll in a busy loop."""
    if wait <= 0:
        return 30
    return max(1, min(MAX_POLL_WAIT, int(-(-wait // 1))))


class _Worker:
    """A registered worker: heartbeats on a daemon thread and follows its
    commands on another, queueing them for the process."""

    def __init__(
        self,
        conn: Connection,
        *,
        run_id: str,
        role: worker_pb2.WorkerRole,
        name: str,
        rank: int,
        poll: bool,
        poll_wait: float,
        replay: bool,
        handler: Optional[Callable[[Command], bool]],
        logger: Optional[logging.Logger],
    ) -> None:
        if not run_id:
            raise ValueError("snapcoord: no run id: pass run_id, or set SNAPCOORD_RUN_ID")
        self._c = conn
        self._run_id, self._role, self._name, self._rank = run_id, role, name, rank
        self._poll_wait = poll_wait_seconds(poll_wait)
        self._handler = handler
        self.log = _Prefixed(logger or logging.getLogger("snapcoord"), {"run_id": run_id, "worker": name})
        self._lock = threading.Lock()
        self._reg_lock = threading.Lock()  # held across a re-register (see _refused)
        self._stop = threading.Event()
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._active: Optional[grpc.Future] = None  # the stream or poll in flight, cancelled on close
        self._polling = poll
        self._err: Optional[errors.SnapcoordError] = None
        self._stop_reason: Optional[str] = None
        self._lost: Optional[grpc.RpcError] = None  # why the coordinator no longer knows the run; None while it does
        self._closed = False
        self._close_lock = threading.Lock()
        try:
            self._register(0, self._c.workers, self._c.timeout)
        except grpc.RpcError as err:
            raise errors.from_rpc_error(err) from None
        self._replay = replay
        self._last_seq = 0 if replay else self._reg.resume_after_seq
        # A hash of each command delivered, by seq: what a resync skips (see _resync).
        self._delivered: dict[int, int] = {}
        # For the backstop: the deadline snapshot handed to the process (the
        # coordinator's or a local one), and the last snapshot's anchor step.
        self._deadline_id: Optional[str] = None
        self._last_anchor = 0
        self._threads = [
            threading.Thread(target=self._receive, name=f"snapcoord-commands-{name}", daemon=True),
            threading.Thread(target=self._heartbeats, name=f"snapcoord-heartbeat-{name}", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # State, as last heard.

    @property
    def worker_id(self) -> str:
        with self._lock:
            return self._reg.worker_id

    @property
    def incarnation(self) -> int:
        with self._lock:
            return self._reg.incarnation

    @property
    def registration(self) -> ws.RegisterWorkerResponse:
        """The coordinator's answer to this process's latest registration."""
        with self._lock:
            return self._reg

    @property
    def run_state(self) -> RunState:
        with self._lock:
            return RunState(self._run_state)

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._last_seq

    @property
    def polling(self) -> bool:
        with self._lock:
            return self._polling

    @property
    def error(self) -> Optional[errors.SnapcoordError]:
        with self._lock:
            return self._err

    @property
    def stop_reason(self) -> Optional[str]:
        with self._lock:
            return self._stop_reason

    def wait_stopped(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for the worker to stop; reports whether it has."""
        return self._stop.wait(timeout)

    # Commands, for the process.

    def commands(self) -> Iterator[Command]:
        while True:
            cmd = self.next_command()
            if cmd is None:
                return
            yield cmd

    def next_command(self, timeout: Optional[float] = None) -> Optional[Command]:
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _END:
            self._queue.put(_END)  # every later call sees the end too
            if self.error is not None:
                raise self.error
            return None
        return item

    # The backstop (see env_worker.EnvWorker).

    @property
    def last_anchor(self) -> int:
        with self._lock:
            return self._last_anchor

    def claim_deadline(self, snapshot_id: str) -> Optional[str]:
        """Makes ``snapshot_id`` this process's deadline snapshot, unless one
        was handed to it already: then returns that one's id."""
        with self._lock:
            if self._deadline_id is not None:
                return self._deadline_id
            self._deadline_id = snapshot_id
            return None

    def inject(self, cmd: Command) -> None:
        """Hands a command the worker made itself to the process, after those
        already queued."""
        self._queue.put(cmd)

    def probe(self, timeout: float) -> Optional[grpc.RpcError]:
        """One heartbeat, not retried, bounded by ``timeout``: None if the
        coordinator answered (a refusal is an answer), else the error. So is
        UNAUTHENTICATED or NOT_FOUND: it registered this worker, so it lost
        the run or the worker, and may send no deadline."""
        req = ws.HeartbeatRequest(run_id=self._run_id, worker_id=self.worker_id, incarnation=self.incarnation)
        try:
            self._c.workers_once.Heartbeat(req, timeout=timeout)
        except grpc.RpcError as err:
            if err.code() in _CODES_NO_ANSWER:
                return err
        return None

    # Calls.

    def fenced(self, call: Callable[[int], T]) -> T:
        """Makes a call that carries the incarnation, so that a process
        another one replaced changes nothing. Refused as superseded, it is
        made once more if this process registered again meanwhile; if another
        process took the name, SupersededError."""
        err = self.error
        if isinstance(err, errors.SupersededError):
            raise err
        sent = self.incarnation
        try:
            return call(sent)
        except grpc.RpcError as first:
            if not errors.is_superseded(first):
                raise errors.from_rpc_error(first) from None
            refusal = self._refused(sent, first)
            if isinstance(refusal, errors.SupersededError):
                raise refusal from None
            if self.incarnation == sent:
                raise errors.from_rpc_error(first) from None
        try:
            return call(self.incarnation)
        except grpc.RpcError as second:
            raise errors.from_rpc_error(second) from None

    def close(self, timeout: Optional[float] = None) -> None:
        """Stops the background threads and deregisters, so that no snapshot
        waits for this worker; a superseded worker is not deregistered (the
        name belongs to another process now). A call made while another
        runs waits for it (a signal handler's close and the with block's);
        later calls do nothing."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._close(timeout)

    def _close(self, timeout: Optional[float]) -> None:
        self._halt()
        for t in self._threads:
            t.join(timeout)
        if isinstance(self.error, errors.SupersededError):
            return
        req = ws.DeregisterWorkerRequest(run_id=self._run_id, worker_id=self.worker_id, incarnation=self.incarnation)
        try:
            self._c.workers.DeregisterWorker(req, timeout=timeout if timeout is not None else self._c.timeout)
        except grpc.RpcError as err:
            if not errors.is_superseded(err):  # superseded meanwhile: nothing of ours to deregister
                raise errors.from_rpc_error(err) from None

    # Registration.

    def _register(self, incarnation: int, stub: Any, timeout: Optional[float]) -> None:
        resp = stub.RegisterWorker(
            ws.RegisterWorkerRequest(run_id=self._run_id, role=self._role, name=self._name, rank=self._rank, incarnation=incarnation),
            timeout=timeout,
        )
        with self._lock:
            self._reg, self._last_ack, self._run_state = resp, time.monotonic(), resp.run_state
        self._run_known()

    def _reregister(self, why: str) -> Optional[errors.SnapcoordError]:
        with self._reg_lock:
            return self._reregister_locked(why)

    def _reregister_locked(self, why: str) -> Optional[errors.SnapcoordError]:
        # While the coordinator does not know the run, every attempt fails
        # (refused, or unanswered while it restarts), and _run_lost said so once.
        self.log.log(logging.DEBUG if self._lost is not None else logging.INFO, "registering again: %s", why)
        try:
            self._register(self.incarnation, self._c.workers_once, max(self._interval(), 5.0))
        except grpc.RpcError as err:
            mapped = errors.from_rpc_error(err)
            if isinstance(mapped, errors.SupersededError):
                self.log.error("another process registered under this worker's name: stopping (%s)", mapped)
                self._fail(mapped)
            elif err.code() in _CODES_RUN_LOST:
                self._run_lost(err)  # it registered this worker before: it lost the run
            else:
                self.log.log(logging.DEBUG if self._lost is not None else logging.WARNING, "registering again failed: %s", mapped)
            return mapped
        self.log.info("registered again as %s, incarnation %d", self.worker_id, self.incarnation)
        return None

    def _run_lost(self, err: grpc.RpcError) -> None:
        """The coordinator no longer knows the run, or its token: its data
        directory was lost, or restored from a copy older than the run. It
        registered this worker, so the run and the token were right (a wrong
        one fails the constructor): the worker goes on as while the
        coordinator is out of reach, following and heartbeating at its
        backoff, so that the backstop still saves, and so that it resumes if
        the coordinator knows the run again (its data restored). One WARNING,
        not one per retry. As the Go client's runLost."""
        with self._lock:
            first, self._lost = self._lost is None, err
        if first:
            self.log.log(
                self._lost_level(),
                "the coordinator no longer knows this run or its token (its data lost or "
                "restored from an older copy, or the token reissued for a new allocation): "
                "going on as while it is out of reach, until it knows the run again (%s: %s)",
                err.code().name,
                err.details(),
            )

    def _run_known(self) -> None:
        """An answer for the run: after _run_lost, one line says it is known again."""
        with self._lock:
            was, self._lost = self._lost, None
        if was is not None:
            self.log.log(self._lost_level(), "the coordinator knows this run again")

    def _lost_level(self) -> int:
        # A trainer rank's fail-safe plan warns about the same coordinator.
        return logging.INFO if self._role == worker_pb2.WORKER_ROLE_TRAINER else logging.WARNING

    def _refused(self, sent: int, err: grpc.RpcError) -> Optional[errors.SnapcoordError]:
        # A call refused for the stale incarnation sent: this process
        # registered again since (repeat it under the new one), or another
        # process did. A re-register settles which: the coordinator answers a
        # repeat of this process's own with its registration, and refuses a
        # superseded process.
        with self._reg_lock:
            if self.incarnation != sent:
                return None
            return self._reregister_locked("call refused: " + (err.details() or ""))

    # Heartbeats.

    def _interval(self) -> float:
        with self._lock:
            d = self._reg.heartbeat_interval
        return d.ToTimedelta().total_seconds() or 5.0

    def _heartbeats(self) -> None:
        while not self._stop.wait(self._interval()):
            try:
                self._beat()
            except Exception:  # never let the thread die: the lease depends on it
                self.log.exception("heartbeat failed")

    def _beat(self) -> None:
        # Register again when the lease must be presumed lost: nothing
        # acknowledged for longer than lease_ttl (a partition), or the
        # coordinator refused the heartbeat (deregistered, or unknown).
        with self._lock:
            silent = time.monotonic() - self._last_ack
            ttl = self._reg.lease_ttl.ToTimedelta().total_seconds()
        if ttl > 0 and silent > ttl:
            self._reregister(f"no heartbeat acknowledged for {silent:.1f}s (lease {ttl:g}s)")
            return
        req = ws.HeartbeatRequest(run_id=self._run_id, worker_id=self.worker_id, incarnation=self.incarnation)
        try:
            resp = self._c.workers_once.Heartbeat(req, timeout=self._interval())
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                self._reregister("heartbeat refused: " + (err.details() or ""))
            elif not self._stop.is_set():
                self.log.debug("heartbeat failed: %s", err.code())
            return
        with self._lock:
            self._last_ack, self._run_state = time.monotonic(), resp.run_state
        self._run_known()

    # Following commands.

    def _receive(self) -> None:
        try:
            err = self._follow()
        except Exception as exc:  # a bug or a failing handler must not hang the consumer
            self.log.exception("following commands failed")
            err = errors.SnapcoordError(f"following commands failed: {exc!r}")
        with self._lock:
            if self._err is None:
                self._err = err
        self._halt()
        self._queue.put(_END)

    def _follow(self) -> Optional[errors.SnapcoordError]:
        # Failed fetches are retried with the client's backoff, capped at a
        # second; a fetch that delivered something resets it.
        failures = 0
        while not self._stop.is_set():
            inc = self.incarnation
            stopped, progressed, err = self._fetch(inc)
            if stopped or self._stop.is_set():
                return None
            if progressed:
                failures = 0
            if err is None:
                continue
            fatal = self._recover(err, inc)
            if fatal is not None:
                return fatal
            failures += 1
            if self._stop.wait(self._c.retry.follow_wait(failures)):
                return None
        return None

    def _fetch(self, inc: int) -> tuple[bool, bool, Optional[BaseException]]:
        return self._poll(inc) if self.polling else self._stream(inc)

    def _recover(self, err: BaseException, inc: int) -> Optional[errors.SnapcoordError]:
        """None to try again after a backoff, or the error that ends the worker."""
        if isinstance(err, _NoStop):
            return errors.RunEndedError("the run ended before this worker's first command (no Stop was delivered)")
        assert isinstance(err, grpc.RpcError)
        code = err.code()
        if code in _CODES_TO_RESUME:
            return None  # the coordinator restarts, drains or is busy: resume
        if code == grpc.StatusCode.OUT_OF_RANGE:
            self._resync(err)
            return None
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            if errors.is_superseded(err):
                # Another process took the name (then the worker stops), or
                # this one registered again: the next fetch uses the new one.
                self._refused(inc, err)
            return None
        if code == grpc.StatusCode.NOT_FOUND:
            # The coordinator does not know the worker; if it lost the run
            # too, registering notes that (see _run_lost).
            self._reregister("the coordinator does not know this worker")
            return None
        if code == grpc.StatusCode.UNAUTHENTICATED:
            self._run_lost(err)  # it registered this worker with the same token: it lost the run
            return None
        if code in _CODES_FATAL:
            return errors.from_rpc_error(err)
        # UNIMPLEMENTED, INTERNAL, UNKNOWN: typically a proxy that does not
        # pass server streams. Long polls are plain unary calls, and as prompt.
        if self.polling:
            return errors.from_rpc_error(err) if code == grpc.StatusCode.UNIMPLEMENTED else None
        self.log.warning("command stream failed (%s); falling back to polling", code)
        with self._lock:
            self._polling = True
        return None

    def _track(self, call: Optional[grpc.Future]) -> None:
        with self._lock:
            self._active = call
        if call is not None and self._stop.is_set():
            call.cancel()

    def _stream(self, inc: int) -> tuple[bool, bool, Optional[BaseException]]:
        req = ws.StreamCommandsRequest(run_id=self._run_id, worker_id=self.worker_id, after_seq=self.last_seq, incarnation=inc)
        progressed = False
        call = self._c.workers_once.StreamCommands(req)
        self._track(call)
        try:
            for resp in call:
                self._run_known()
                progressed = True
                if self._deliver(resp.command):
                    return True, True, None
        except grpc.RpcError as failed:
            return False, progressed, failed
        finally:
            self._track(None)
        # The coordinator ends a stream without a Stop only when the run is
        # over and the Stop lies before the resume point. One poll (answered
        # at once for a finished run) tells that from anything unexpected.
        stopped, polled, err = self._poll(inc)
        return stopped, progressed or polled, err

    def _poll(self, inc: int) -> tuple[bool, bool, Optional[BaseException]]:
        req = ws.PollCommandsRequest(
            run_id=self._run_id, worker_id=self.worker_id, after_seq=self.last_seq, wait_seconds=self._poll_wait, incarnation=inc
        )
        future = self._c.workers_once.PollCommands.future(req, timeout=self._poll_wait + _POLL_SLACK)
        self._track(future)
        try:
            resp = future.result()
        except grpc.FutureCancelledError:
            return False, False, None  # closing
        except grpc.RpcError as err:
            return False, False, err
        finally:
            self._track(None)
        self._run_known()
        with self._lock:
            self._run_state = resp.run_state
        for cmd in resp.commands:
            if self._deliver(cmd):
                return True, True, None
        if not resp.commands and RunState(resp.run_state).terminal:
            return False, False, _NoStop()  # polls of a terminal run return at once: must not spin
        return False, True, None

    def _resync(self, err: grpc.RpcError) -> None:
        """Moves the resume point back after the coordinator said it lies past
        the end of the command log (OUT_OF_RANGE): its state was restored from
        a backup or replaced, and waiting for the log to catch up would skip
        every command issued meanwhile, a SaveAtDeadline among them. The log
        is read again from where a new process would start: from 0 with
        replay, else from the resume point of a registration (the end of the
        log, or the command still waiting for this worker); from 0 it would
        hand over every old command of the run. A command delivered before is
        not delivered again: the same bytes at the same seq (issued_at
        included) are the restored copy of one already handled, while the
        commands issued since the restore reuse the seqs of lost ones and
        differ. If registering fails, the next fetch meets OUT_OF_RANGE again.
        As the Go client's resync."""
        self.log.warning(
            "the coordinator's command log ends before this worker's resume point %d (its state was restored or replaced): reading it again (%s)",
            self.last_seq,
            err.details(),
        )
        start = 0
        if not self._replay:
            if self._reregister("command log behind the resume point") is not None:
                return
            with self._lock:
                start = self._reg.resume_after_seq
        with self._lock:
            self._last_seq = start

    def _deliver(self, proto: worker_pb2.Command) -> bool:
        """Hands one command to the process (or the handler), unless it did
        before a resync, and advances the resume point. Reports whether it
        was the Stop."""
        if proto.seq <= self.last_seq:
            return False  # already delivered before a reconnect
        digest = hash(proto.SerializeToString(deterministic=True))
        cmd = Command.from_proto(proto)
        if self._delivered.get(proto.seq) != digest:
            if cmd.kind == CommandKind.STOP:
                with self._lock:
                    self._stop_reason = cmd.stop_reason
            elif cmd.is_snapshot:
                with self._lock:
                    self._last_anchor = cmd.anchor_step
                    if cmd.kind == CommandKind.SAVE_AT_DEADLINE and self._deadline_id is None:
                        self._deadline_id = cmd.snapshot_id
            if self._handler is None or not self._handler(cmd):
                self._queue.put(cmd)
            self._delivered[proto.seq] = digest
        with self._lock:
            self._last_seq = proto.seq
        return cmd.kind == CommandKind.STOP

    # Stopping.

    def _fail(self, err: errors.SnapcoordError) -> None:
        with self._lock:
            self._err = err
        self._halt()

    def _halt(self) -> None:
        self._stop.set()
        with self._lock:
            active = self._active
        if active is not None:
            active.cancel()


class _Handle:
    """What Trainer and EnvWorker share: state, commands, close."""

    _c: Connection
    _w: _Worker

    @property
    def worker_id(self) -> str:
        """The coordinator's id for this worker."""
        return self._w.worker_id

    @property
    def incarnation(self) -> int:
        """Counts the registrations under the worker's name."""
        return self._w.incarnation

    @property
    def run_state(self) -> RunState:
        """The run's state as last heard (registration, heartbeat, poll)."""
        return self._w.run_state

    @property
    def last_seq(self) -> int:
        """The last command delivered: where delivery resumes after a disconnect."""
        return self._w.last_seq

    @property
    def polling(self) -> bool:
        """Whether commands are long-polled (asked for, or fallen back to)."""
        return self._w.polling

    @property
    def stop_reason(self) -> Optional[str]:
        """The Stop command's reason once it arrived, else None."""
        return self._w.stop_reason

    @property
    def error(self) -> Optional[errors.SnapcoordError]:
        """Why the worker stopped following commands, if not a Stop or close():
        SupersededError, RunEndedError, a refusal such as PERMISSION_DENIED.
        A coordinator that no longer knows the run or its token (it lost its
        data) does not stop the worker: it goes on as with the coordinator
        out of reach."""
        return self._w.error

    def commands(self) -> Iterator[Command]:
        """The worker's commands in sequence order, each once per process.

        Ends after the Stop (which it yields) or on close(); raises the error
        that ended the worker otherwise (e.g. SupersededError)."""
        return self._w.commands()

    def next_command(self, timeout: Optional[float] = None) -> Optional[Command]:
        """The next command; None after ``timeout`` seconds, or once none will
        come (after the Stop or close()). Raises as commands() does."""
        return self._w.next_command(timeout)

    def close(self, timeout: Optional[float] = None) -> None:
        """Stops the background threads and deregisters the worker, so that no
        snapshot waits for it (not when superseded). Later calls do nothing."""
        self._w.close(timeout)

    def __enter__(self: "H") -> "H":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.close()
        except Exception:
            if exc_type is None:
                raise
            self._w.log.exception("deregistering after an error failed")

    def _timeout(self, timeout: Optional[float]) -> Optional[float]:
        return self._c.timeout if timeout is None else timeout


H = TypeVar("H", bound=_Handle)
