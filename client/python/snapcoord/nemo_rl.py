"""A drop-in for NeMo RL's ``nemo_rl.utils.timer.TimeoutChecker`` that asks
the coordinator.

Two lines change in a NeMo RL training loop (e.g. ``nemo_rl/algorithms/grpo.py``)::

    from snapcoord.nemo_rl import TimeoutChecker   # was: from nemo_rl.utils.timer import TimeoutChecker
    ...
    checkpointer.finalize_checkpoint(checkpoint_path)
    timeout.checkpoint_saved()                     # new: the save's duration feeds C

Everything else stays: ``TimeoutChecker(timeout=..., fit_last_save_time=True)``,
``start_iterations()``, ``mark_iteration()`` after each step and
``check_save()`` before the checkpoint decision. ``check_save()`` is then the
coordinator's decision for the step (CompleteStep with the measured iteration
time): every rank of the job gets the same answer at the same step, and the
save reserve R (``save_reserve_seconds``) is learned from the environment
snapshots of the whole job rather than guessed in one process.

The checker registers as a trainer rank when it is created, heartbeats in the
background, and deregisters at ``close()`` or at exit. It finds the
coordinator and the run in the ``SNAPCOORD_*`` variables (``SNAPCOORD_ADDR``,
``SNAPCOORD_RUN_ID``, ``SNAPCOORD_RUN_TOKEN`` or ``SNAPCOORD_RUN_TOKEN_FILE``,
``SNAPCOORD_PLAINTEXT`` or the TLS files: see ``snapcoord.connect``), and its
rank in ``SNAPCOORD_RANK``, else ``RANK`` (torchrun), else ``SLURM_PROCID``,
else 0; keyword arguments override them. NeMo RL drives training from a
single controller process: create its run with ``trainer_world_size`` 1.

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
import logging
import os
import sys
import time
from typing import Mapping, Optional

from snapcoord.client import Client, connect
from snapcoord.errors import SnapcoordError
from snapcoord.trainer import Trainer
from snapcoord.types import Action, Decision, Phase

__all__ = ["RunStopped", "TimeoutChecker", "convert_to_seconds"]


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


class TimeoutChecker:
    """NeMo RL's TimeoutChecker, answered by the coordinator.

    ``timeout`` (``DD:HH:MM:SS``) and ``fit_last_save_time`` are accepted as
    NeMo RL's are, and ``timeout`` is checked the same way, but the deadline
    B is the run's (``snapctl run create --from-nemo-rl`` reads
    ``checkpoint_must_save_by`` from the same config), and the coordinator
    always fits the slowest iteration, checkpoint and snapshot.

    ``check_save()`` returns True once, at the step the coordinator answers
    SAVE_AND_STOP; save the checkpoint and stop, as the loop already does.
    If the coordinator answers STOP it raises ``RunStopped``: the run is over
    and a save would be wasted. With ``safety_saves=True``,
    ``check_safety_save()`` returns True at a step the coordinator answers
    SAVE_AND_CONTINUE: save, call ``checkpoint_saved()``, and keep training.
    """

    def __init__(
        self,
        timeout: Optional[str] = "00:03:45:00",
        fit_last_save_time: bool = False,
        *,
        client: Optional[Client] = None,
        rank: Optional[int] = None,
        run_id: Optional[str] = None,
        start_step: int = 1,
        env: Optional[Mapping[str, str]] = None,
        safety_saves: bool = False,
    ) -> None:
        env = os.environ if env is None else env
        self.last_save_time = float("inf") if timeout is None else convert_to_seconds(timeout)
        self.fit_last_save_time = fit_last_save_time
        self.start_time = time.time()
        self.last_saved = False
        self.iteration_times: list[float] = []
        self.previous_iteration_time: Optional[float] = None
        #: The last step marked by mark_iteration (0: none yet); the loop may
        #: set it, e.g. to the step a resumed run starts after.
        self.step = start_step - 1
        #: The coordinator's latest decision.
        self.last_decision: Optional[Decision] = None
        self._checked_at: Optional[float] = None
        #: The loop saves when check_safety_save() says so.
        self.safety_saves = safety_saves
        self._safety_step = 0  # the step whose safety save is due, until taken
        self._own_client = client is None
        self._client = client if client is not None else connect(env=env)
        self.trainer = Trainer(self._client, _rank(rank, env), run_id=run_id)
        atexit.register(self._close_at_exit)

    @property
    def save_reserve_seconds(self) -> float:
        """R, the save reserve the coordinator used in its latest decision:
        the longest recent environment snapshot of the whole job (or the
        run's prior). 0 before the first decision."""
        d = self.last_decision
        return d.inputs.save_reserve_seconds if d is not None and d.inputs is not None else 0.0

    @save_reserve_seconds.setter
    def save_reserve_seconds(self, _seconds: float) -> None:
        # Code written for the in-process checker records each snapshot's
        # duration here. The coordinator learns R from the environment
        # workers' snapshot reports instead, so the value is not used.
        pass

    def start_iterations(self) -> None:
        """Starts timing the first iteration."""
        self.previous_iteration_time = time.time()

    def mark_iteration(self) -> None:
        """Marks the end of a step: records its duration for the next check."""
        sys.stdout.flush()
        sys.stderr.flush()
        now = time.time()
        start = self.previous_iteration_time if self.previous_iteration_time is not None else self.start_time
        self.iteration_times.append(now - start)
        self.previous_iteration_time = now
        self.step += 1

    def would_save(self, extra_s: float = 0.0) -> bool:
        """Whether the coordinator says save at the marked step, without
        consuming the answer (NeMo RL's newer API)."""
        if self.last_saved or self.step < 1:
            return False
        decision = self._decide(extra_s)
        if decision.action == Action.SAVE_AND_CONTINUE:
            if not self.safety_saves:
                raise SafetySaveNotHandled(decision)
            self._safety_step = decision.step
        return decision.action == Action.SAVE_AND_STOP

    def check_save(self, extra_s: float = 0.0) -> bool:
        """True once: when the coordinator decides the marked step must save
        and stop. ``extra_s``, extra seconds the next iteration will take
        (a validation pass), is added to the iteration time reported; since
        the coordinator keeps the slowest iteration, it stays in its estimate.
        """
        sys.stdout.flush()
        sys.stderr.flush()
        if not self.would_save(extra_s):
            self._checked_at = time.monotonic()
            return False
        self.last_saved = True
        self._checked_at = time.monotonic()
        return True

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
        which the training loop follows with the save. It feeds C, and at the
        deadline it lets the coordinator go on to the environment snapshot.
        """
        if save_seconds is None:
            save_seconds = time.monotonic() - self._checked_at if self._checked_at is not None else 0.0
        self.trainer.report_checkpoint(self.step, Phase.SAVED, save_seconds)

    def close(self, timeout: float = 10.0) -> None:
        """Deregisters the rank (also done at exit), waiting at most
        ``timeout`` seconds: an exiting trainer must not hang on a coordinator
        that is down (its lease then simply lapses)."""
        atexit.unregister(self._close_at_exit)
        self.trainer.close(timeout)
        if self._own_client:
            self._client.close()

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except SnapcoordError as err:
            logging.getLogger("snapcoord").warning("deregistering rank %d at exit failed: %s", self.trainer.rank, err)

    def __enter__(self) -> "TimeoutChecker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _decide(self, extra_s: float) -> Decision:
        iteration = (self.iteration_times[-1] if self.iteration_times else 0.0) + max(0.0, extra_s)
        decision = self.trainer.complete_step(self.step, iteration)
        self.last_decision = decision
        if decision.action == Action.STOP:
            raise RunStopped(decision)
        return decision


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
