"""A drop-in for NeMo RL's ``nemo_rl.utils.timer.TimeoutChecker`` that asks
the coordinator.

Two lines change in NeMo RL's training loop (``nemo_rl/algorithms/grpo.py``)::

    from snapcoord.nemo_rl import TimeoutChecker   # was: from nemo_rl.utils.timer import TimeoutChecker
    ...
    checkpointer.begin_finalization(checkpoint_path, wait_fn=policy.finalize_async_save)
    timeout.checkpoint_saved()                     # new: the save is reported, its duration feeds C

(with asynchronous checkpoint writes, call ``checkpointer.finalize_pending()``
before ``checkpoint_saved()`` at the step ``check_save()`` said to save: the
coordinator then starts the environment snapshot of that checkpoint).
Everything else stays: ``TimeoutChecker(timeout=..., fit_last_save_time=True)``,
``start_iterations()``, ``mark_iteration()`` after each step and
``check_save()`` before the checkpoint decision. ``check_save()`` is then the
coordinator's decision for the step (CompleteStep with the measured iteration
time): every rank of the job gets the same answer at the same step, and the
save reserve R (``save_reserve_seconds``) is learned from the environment
snapshots of the whole job rather than guessed in one process.

The checker registers as a trainer rank when it is created (a coordinator
named by ``SNAPCOORD_*`` that does not answer within 5 s raises
``CoordinatorUnreachable``, naming the address), heartbeats in the
background, and deregisters at ``close()`` or at exit. It finds the
coordinator and the run in the ``SNAPCOORD_*`` variables (``SNAPCOORD_ADDR``,
``SNAPCOORD_RUN_ID``, ``SNAPCOORD_RUN_TOKEN`` or ``SNAPCOORD_RUN_TOKEN_FILE``,
``SNAPCOORD_PLAINTEXT`` or the TLS files: see ``snapcoord.connect``), and its
rank in ``SNAPCOORD_RANK``, else ``RANK`` (torchrun), else ``SLURM_PROCID``,
else 0; keyword arguments override them. Without any of those variables it
decides exactly as NeMo RL's own checker does, so the same script runs on a
laptop. NeMo RL drives training from a single controller process: create its
run with ``trainer_world_size`` 1.

A loop restored from its checkpoint (a Slurm requeue) needs nothing new: the
checker counts steps from the run's newest checkpoint saved by every rank,
which the coordinator knows. Once registered, the coordinator going away
never reaches the loop: the checker decides by the fail-safe plan
(docs/design.md) from the run's last decision and reports what it decided
when the coordinator is back.

Safety saves (a run with ``reserve.safety_saves``: save now, then keep
training) need a third line. NeMo RL stops after any save that
``check_save()`` asked for, so ``check_save()`` never returns True for one;
``check_safety_save()`` does, once, and the loop saves as for its regular
checkpoints::

    should_save_by_timeout = timeout.check_save()
    should_save_by_step = should_save_by_step or timeout.check_safety_save()   # new

Create the checker with ``safety_saves=True`` to say the loop does this.
Without it, a safety save raises ``SafetySaveNotHandled`` rather than let
the run go on without the save the coordinator counts on.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import sys
import threading
import time
from typing import Mapping, Optional

from snapcoord._plan import Plan, nemo_rule
from snapcoord.client import DEFAULT_ADDR, Client, connect
from snapcoord.errors import AuthError, NotFoundError, SnapcoordError, UnavailableError, untrusted_certificate

# What says the coordinator cannot answer for this rank: out of reach, or it
# no longer knows the run or the rank (its data directory lost, or restored
# from a copy made before the rank registered). The rank then goes on by the
# fail-safe plan rather than end the job for what the coordinator lost.
_NO_ANSWER = (UnavailableError, NotFoundError, AuthError)
from snapcoord.trainer import Trainer
from snapcoord.types import Action, Decision, Phase

__all__ = ["CoordinatorUnreachable", "RunStopped", "SafetySaveNotHandled", "TimeoutChecker", "convert_to_seconds"]


def convert_to_seconds(time_string: str) -> int:
    """Seconds in a ``DD:HH:MM:SS`` string, e.g. ``00:03:45:00``, as NeMo RL's."""
    parts = time_string.split(":")
    if len(parts) != 4:
        raise ValueError(f"timeout {time_string!r}: want DD:HH:MM:SS")
    days, hours, minutes, seconds = (int(p) for p in parts)
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


class RunStopped(SnapcoordError):
    """The coordinator answered STOP: the deadline fired at an earlier step or
    the run is over (cancelled, failed, completed). Stop without saving.
    ``decision`` says why."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(f"the coordinator says stop at step {decision.step}: {decision.explanation}")
        self.decision = decision


class SafetySaveNotHandled(SnapcoordError):
    """The coordinator asked for a safety save (the run has
    ``reserve.safety_saves``), but the checker was created without
    ``safety_saves=True``: the loop would neither save nor stop."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(
            f"the coordinator asks for a safety save at step {decision.step}, and this TimeoutChecker was created "
            "without safety_saves=True: save when check_safety_save() says so and pass safety_saves=True, "
            "or create the run without reserve.safety_saves"
        )
        self.decision = decision


class CoordinatorUnreachable(SnapcoordError):
    """``SNAPCOORD_*`` name a coordinator, and it did not answer the
    registration in time: the message names the address, the cause and the
    variable to change. Raised by the constructor only; once registered, a
    checker never raises for a coordinator that went away."""


class TimeoutChecker:
    """NeMo RL's TimeoutChecker, answered by the coordinator.

    ``check_save()`` returns True once, at the step the coordinator answers
    SAVE_AND_STOP; save the checkpoint, call ``checkpoint_saved()`` and stop,
    as the loop already does. If the coordinator answers STOP it raises
    ``RunStopped``: the run is over and a save would be wasted. With
    ``safety_saves=True``, ``check_safety_save()`` returns True at a step the
    coordinator answers SAVE_AND_CONTINUE: save, call ``checkpoint_saved()``,
    and keep training.

    ``timeout`` (``DD:HH:MM:SS``) and ``fit_last_save_time`` are NeMo RL's.
    With a coordinator, B is the run's (``snapctl run create --from-nemo-rl``
    reads ``checkpoint_must_save_by`` from the same config); a ``timeout``
    more than a minute away from it is logged with both. Without
    ``SNAPCOORD_*`` variables (and no ``client``), the checker decides
    exactly as NeMo RL's own does, from ``timeout``, and says so once.

    The coordinator going away never reaches the loop: a ``check_save()``
    that cannot reach it within ``failsafe_wait`` seconds decides by the
    fail-safe plan (docs/design.md), from the last decision every rank
    received, reports what it decided once the coordinator answers again,
    and logs one WARNING each way. ``start_step`` (the step the loop resumes
    at) defaults to one past the run's newest checkpoint saved by every
    rank, as the coordinator knows it: a loop restored from that checkpoint
    (a Slurm requeue) numbers its steps as the run does.
    """

    def __init__(
        self,
        timeout: Optional[str] = "00:03:45:00",
        fit_last_save_time: bool = False,
        *,
        client: Optional[Client] = None,
        rank: Optional[int] = None,
        run_id: Optional[str] = None,
        start_step: Optional[int] = None,
        env: Optional[Mapping[str, str]] = None,
        safety_saves: bool = False,
        connect_timeout: float = 5.0,
        failsafe_wait: float = 5.0,
        failsafe_probe: float = 0.5,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        env = os.environ if env is None else env
        self.last_save_time = float("inf") if timeout is None else convert_to_seconds(timeout)
        self.fit_last_save_time = fit_last_save_time
        self.start_time = time.time()
        self.last_saved = False
        #: Step to step, as NeMo RL measures them (its local rule uses them).
        self.iteration_times: list[float] = []
        self.previous_iteration_time: Optional[float] = None
        #: The coordinator's latest decision.
        self.last_decision: Optional[Decision] = None
        #: The loop saves when check_safety_save() says so.
        self.safety_saves = safety_saves
        self.log = logger or logging.getLogger("snapcoord")
        self._timeout_given = timeout is not None
        self._safety_step = 0  # the step whose safety save is due, until taken
        self._checked_at: Optional[float] = None  # monotonic: when check_save returned
        self._iter_began: Optional[float] = None  # monotonic: when the step being timed began (None: not timed)
        self._iteration = 0.0  # the last step's honest iteration time (0: not measured)
        self._wait, self._probe = failsafe_wait, failsafe_probe
        self._away: Optional[str] = None  # why the coordinator is out of reach
        self._unreported: list[tuple[str, int, float, Optional[Action]]] = []  # ("step"|"checkpoint", step, seconds, action)
        self._saves_since_anchor = 0
        self._save_watch: Optional[threading.Timer] = None
        self._save_owed = False  # check_save() said save, checkpoint_saved() has not come
        self._addr = env.get("SNAPCOORD_ADDR") or DEFAULT_ADDR
        self.trainer: Optional[Trainer] = None
        self._own_client = client is None
        if client is None and not any(env.get(name) for name in _VARIABLES):
            self._client: Optional[Client] = None
            self.step = (start_step or 1) - 1
            self.log.info(
                "snapcoord: no SNAPCOORD_* variables (%s): this TimeoutChecker decides on its own, exactly as NeMo RL's (timeout %s)",
                ", ".join(_VARIABLES),
                timeout,
            )
            return
        self._client = client if client is not None else connect(env=env, timeout=connect_timeout)
        self.trainer = self._register(_rank(rank, env), run_id, connect_timeout)
        resume = self.trainer.last_checkpoint_step
        self.step = start_step - 1 if start_step is not None else resume
        if start_step is None and resume:
            self.log.info("snapcoord: the run's newest checkpoint is step %d: counting steps from %d", resume, resume + 1)
        atexit.register(self._close_at_exit)

    def _register(self, rank: int, run_id: Optional[str], connect_timeout: float) -> Trainer:
        assert self._client is not None
        try:
            trainer = Trainer(self._client, rank, run_id=run_id)
        except UnavailableError as err:
            if self._own_client:
                self._client.close()
            if untrusted_certificate(err.message):
                raise CoordinatorUnreachable(f"snapcoord: cannot connect to {self._addr} over TLS: {err.message}", err.code) from None
            raise CoordinatorUnreachable(
                f"snapcoord: no coordinator answered at {self._addr} within {connect_timeout:g} s ({err}): start it, "
                "or point SNAPCOORD_ADDR at it (unset the SNAPCOORD_* variables to decide without one)",
                err.code,
            ) from None
        if self._own_client:
            self._client.timeout = None  # later calls carry their own bounds
        return trainer

    @property
    def save_reserve_seconds(self) -> float:
        """R, the save reserve the coordinator used in its latest decision:
        the longest recent environment snapshot of the whole job (or the
        run's prior). 0 before the first decision."""
        d = self.last_decision
        return d.inputs.save_reserve_seconds if d is not None and d.inputs is not None else 0.0

    @save_reserve_seconds.setter
    def save_reserve_seconds(self, _seconds: float) -> None:
        raise AttributeError(
            "snapcoord: save_reserve_seconds is the coordinator's R, learned from the environment workers' snapshot reports; "
            "it cannot be set here (give the run a prior with snapctl run create --snapshot-prior)"
        )

    def start_iterations(self) -> None:
        """Starts timing the steps. The first step after it is not counted
        in I: NeMo RL's setup and validation at start run in between."""
        self.previous_iteration_time = time.time()
        self._iter_began = None

    def mark_iteration(self) -> None:
        """Marks the end of a step: records its duration for the next check.

        The duration reported to the coordinator runs from the end of the
        previous step's check_save() (or checkpoint_saved(), after a save)
        to now: neither a save, nor time waiting on the coordinator, nor what
        came before the first step is an iteration."""
        sys.stdout.flush()
        sys.stderr.flush()
        now = time.time()
        start = self.previous_iteration_time if self.previous_iteration_time is not None else self.start_time
        self.iteration_times.append(now - start)
        self.previous_iteration_time = now
        mono = time.monotonic()
        self._iteration = mono - self._iter_began if self._iter_began is not None else 0.0
        self._iter_began = mono  # for a loop that never calls check_save
        self.step += 1

    def would_save(self, extra_s: float = 0.0) -> bool:
        """Whether the marked step would save, as far as this process can
        tell without asking: the rule applied to the latest decision's
        estimates and the clock now (NeMo RL's own rule without a
        coordinator). Records nothing; check_save() decides."""
        if self.last_saved or self.step < 1:
            return False
        if self.trainer is None or self.last_decision is None or self.last_decision.inputs is None:
            return self._nemo_says(extra_s)
        d = self.last_decision.inputs
        if d.must_save_by is None:
            return False
        need = max(self._iteration + extra_s, d.iteration_seconds) + d.checkpoint_seconds + d.save_reserve_seconds + d.margin_seconds
        return time.time() + need >= d.must_save_by.timestamp()

    def check_save(self, extra_s: float = 0.0) -> bool:
        """True once: when the marked step must save and stop. ``extra_s``,
        extra seconds the next iteration will take (a validation pass), is
        added to the iteration time reported; since the coordinator keeps
        the slowest iteration, it stays in its estimate."""
        sys.stdout.flush()
        sys.stderr.flush()
        save = False
        if not self.last_saved and self.step >= 1:
            save = self._decide(extra_s) == Action.SAVE_AND_STOP
            self.last_saved = save
        self._checked_at = self._iter_began = time.monotonic()
        if save:
            self._watch_save()
        return save

    def check_safety_save(self) -> bool:
        """True once: after check_save() at a step the coordinator answered
        SAVE_AND_CONTINUE (a safety save). Save the checkpoint as a regular
        one, call checkpoint_saved(), and keep training."""
        due = self._safety_step != 0 and self._safety_step == self.step
        self._safety_step = 0
        return due

    def checkpoint_saved(self, save_seconds: Optional[float] = None) -> None:
        """Reports that this rank saved the checkpoint of the marked step.

        ``save_seconds`` defaults to the time since the last check_save(),
        which the training loop follows with the save. It feeds C, and at
        the deadline it lets the coordinator go on to the environment
        snapshot. With the coordinator out of reach, the report waits for
        its return (or for close())."""
        if save_seconds is None:
            save_seconds = time.monotonic() - self._checked_at if self._checked_at is not None else 0.0
        self._save_owed = False
        self._cancel_watch()
        if self.trainer is not None:
            self._saves_since_anchor += 1
            self._unreported.append(("checkpoint", self.step, save_seconds, None))
            if self._away is None:
                self._flush(self._wait)
        self._iter_began = time.monotonic()

    def close(self, timeout: float = 10.0) -> None:
        """Reports what the coordinator has not heard yet and deregisters the
        rank (also done at exit), waiting at most ``timeout`` seconds: an
        exiting trainer must not hang on a coordinator that is down. Never
        raises for a coordinator that is gone."""
        atexit.unregister(self._close_at_exit)
        self._cancel_watch()
        if self._save_owed:
            self.log.error(
                "snapcoord: rank %d: the coordinator asked to save step %d and checkpoint_saved() was never called: "
                "the run cannot finish its deadline save (add timeout.checkpoint_saved() after the checkpoint is written)",
                self._rank_no(),
                self.step,
            )
        if self.trainer is None:
            return
        if self._unreported and not self._flush(timeout):
            self.log.warning(
                "snapcoord: rank %d: exiting with the coordinator at %s still out of reach (%s); not reported: %s",
                self._rank_no(),
                self._addr,
                self._away,
                ", ".join(f"{kind} {step}" for kind, step, _, _ in self._unreported),
            )
        try:
            self.trainer.close(timeout)
        except SnapcoordError as err:
            self.log.warning("snapcoord: rank %d: deregistering failed: %s", self._rank_no(), err)
        if self._own_client and self._client is not None:
            self._client.close()

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except SnapcoordError as err:
            self.log.warning("deregistering rank %d at exit failed: %s", self._rank_no(), err)

    def __enter__(self) -> "TimeoutChecker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Deciding.

    def _decide(self, extra_s: float) -> Action:
        if self.trainer is None:
            return Action.SAVE_AND_STOP if self._nemo_says(extra_s) else Action.CONTINUE
        iteration = self._iteration + max(0.0, extra_s)
        if self._away is None or self._flush(self._probe):
            try:
                decision = self.trainer.complete_step(self.step, iteration, timeout=self._wait, wait_for_ready=True)
            except _NO_ANSWER as err:
                self._go_away(err)
            else:
                return self._heard(decision)
        return self._decide_locally(iteration)

    def _heard(self, decision: Decision) -> Action:
        first = self.last_decision is None
        self.last_decision, self._saves_since_anchor = decision, 0
        if first:
            self._check_timeout(decision)
        if decision.action == Action.STOP:
            raise RunStopped(decision)
        if decision.action == Action.SAVE_AND_CONTINUE:
            if not self.safety_saves:
                raise SafetySaveNotHandled(decision)
            self._safety_step = decision.step
        return decision.action

    def _decide_locally(self, iteration: float) -> Action:
        if self.last_decision is None:
            # Gone before the first answer: what NeMo RL's checker would do.
            save = self._nemo_says(0.0)
            why = f"NeMo RL's own rule with timeout {self.last_save_time:g} s"
        else:
            save, why = Plan(self.last_decision, self._wait, self._probe).decide(self.step, self._saves_since_anchor, time.time())
        action = Action.SAVE_AND_STOP if save else Action.CONTINUE
        self._unreported.append(("step", self.step, iteration, action))
        log = self.log.warning if save else self.log.info
        log("snapcoord: rank %d: step %d decided without the coordinator: %s", self._rank_no(), self.step, why)
        return action

    def _nemo_says(self, extra_s: float) -> bool:
        times = [t + extra_s for t in self.iteration_times] if extra_s else self.iteration_times
        return nemo_rule(time.time() - self.start_time, times, self.last_save_time, self.fit_last_save_time)

    # The coordinator going and coming back.

    def _go_away(self, err: SnapcoordError) -> None:
        if self._away is None:
            self._away = str(err)
            self.log.warning(
                "snapcoord: rank %d: the coordinator at %s cannot answer (%s): deciding on the fail-safe plan until it answers",
                self._rank_no(),
                self._addr,
                err,
            )

    def _flush(self, wait: float) -> bool:
        """Reports, in order, what the coordinator has not heard, each call
        waiting at most ``wait`` s for it; True once nothing is left."""
        assert self.trainer is not None
        while self._unreported:
            kind, step, seconds, action = self._unreported[0]
            try:
                if action is not None:
                    stored = self.trainer.complete_step(step, seconds, timeout=wait, local_action=action, wait_for_ready=True)
                    self._compare(stored, action)
                else:
                    self.trainer.report_checkpoint(step, Phase.SAVED, seconds, timeout=wait, wait_for_ready=True)
            except _NO_ANSWER as err:
                self._go_away(err)
                return False
            except SnapcoordError as err:
                self.log.error("snapcoord: rank %d: reporting %s %d failed, dropped: %s", self._rank_no(), kind, step, err)
            self._unreported.pop(0)
        if self._away is not None:
            self.log.warning("snapcoord: rank %d: the coordinator at %s answers again; what was decided without it is reported", self._rank_no(), self._addr)
            self._away = None
        return True

    def _compare(self, stored: Decision, acted: Action) -> None:
        if stored.action != acted:
            self.log.error(
                "snapcoord: rank %d: at step %d this rank did %s without the coordinator, which had decided %s (%s)",
                self._rank_no(),
                stored.step,
                acted.name,
                stored.action.name,
                stored.explanation,
            )

    # Loud misuse.

    def _check_timeout(self, decision: Decision) -> None:
        b = decision.inputs.must_save_by if decision.inputs is not None else None
        if not self._timeout_given or b is None:
            return
        local = self.start_time + self.last_save_time
        if abs(b.timestamp() - local) > 60:
            self.log.warning(
                "snapcoord: timeout %s ends at %s, the run's B is %s: the coordinator decides by B",
                _dhms(self.last_save_time),
                datetime.datetime.fromtimestamp(local, datetime.timezone.utc).isoformat(timespec="seconds"),
                b.isoformat(timespec="seconds"),
            )

    def _watch_save(self) -> None:
        # An ERROR while there is still time, if the loop saves but never
        # says so (the coordinator names the rank in an event too): when only
        # the snapshot and the margin are left before B.
        self._save_owed = True
        d = self.last_decision.inputs if self.last_decision is not None else None
        if d is None or d.must_save_by is None:
            return
        late = max(d.must_save_by.timestamp() - d.save_reserve_seconds - d.margin_seconds, time.time() + d.checkpoint_seconds + d.margin_seconds)
        self._save_watch = threading.Timer(late - time.time(), self._save_late)
        self._save_watch.daemon = True
        self._save_watch.start()

    def _save_late(self) -> None:
        if not self._save_owed:
            return
        self.log.error(
            "snapcoord: rank %d: the coordinator asked to save step %d and checkpoint_saved() has not been called: "
            "the deadline save waits for it (add timeout.checkpoint_saved() after the checkpoint is written)",
            self._rank_no(),
            self.step,
        )

    def _cancel_watch(self) -> None:
        if self._save_watch is not None:
            self._save_watch.cancel()
            self._save_watch = None

    def _rank_no(self) -> int:
        return self.trainer.rank if self.trainer is not None else 0


_VARIABLES = ("SNAPCOORD_ADDR", "SNAPCOORD_RUN_ID", "SNAPCOORD_RUN_TOKEN", "SNAPCOORD_RUN_TOKEN_FILE")


def _dhms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 86400:02d}:{s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _rank(rank: Optional[int], env: Mapping[str, str]) -> int:
    if rank is not None:
        return rank
    for name in ("SNAPCOORD_RANK", "RANK", "SLURM_PROCID"):
        value = env.get(name, "")
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"snapcoord: {name}={value!r} is not a rank") from None
    return 0
