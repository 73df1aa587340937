"""``Trainer``: one trainer rank's view of the coordinator."""

from __future__ import annotations

import logging
from typing import Callable, Optional, cast

from snapcoord._worker import _Handle, _Worker
from snapcoord._conn import Connected
from snapcoord.types import Action, Command, CommandKind, Decision, Phase, RunState
from snapcoord.v1 import event_pb2, worker_pb2, worker_service_pb2 as ws


class Trainer(_Handle):
    """A registered trainer rank (one per rank process).

    It registers on creation (with a new incarnation), heartbeats on a daemon
    thread, and follows the run's commands for trainers: ``PublishCheckpoint``
    (deferred finalize) and ``Stop``. After every step, ``complete_step``
    returns the coordinator's decision, the same for every rank::

        with snapcoord.connect() as client, client.trainer(rank) as trainer:
            for step in range(first_step, last_step + 1):
                t0 = time.monotonic()
                train_one_step()
                decision = trainer.complete_step(step, time.monotonic() - t0)
                if decision.should_save:
                    seconds = save_checkpoint(step)
                    trainer.report_checkpoint(step, Phase.SAVED, seconds)
                if decision.should_stop:
                    break

    If another process registers under the same name (a replacement started
    while this one still ran), every call raises ``SupersededError``: this
    process must stop. ``close()`` (or leaving the ``with`` block)
    deregisters.

    ``on_publish(step)``, if given, is called on the command thread for each
    ``PublishCheckpoint`` and must make ``step_N`` visible; the rank then
    reports it PUBLISHED. Without it, those commands come from
    ``commands()`` / ``next_command()`` like the Stop.
    """

    def __init__(
        self,
        client: Connected,
        rank: int,
        *,
        run_id: Optional[str] = None,
        name: Optional[str] = None,
        on_publish: Optional[Callable[[int], None]] = None,
        poll: bool = False,
        poll_wait: float = 30.0,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        self._c = client.connection
        self._on_publish = on_publish
        self.rank = rank
        #: The run this rank belongs to.
        self.run_id = run_id or self._c.run_id
        self._w = _Worker(
            self._c,
            run_id=self.run_id,
            role=worker_pb2.WORKER_ROLE_TRAINER,
            name=name or f"rank-{rank}",
            rank=rank,
            poll=poll,
            poll_wait=poll_wait,
            replay=False,
            handler=self._publish if on_publish else None,
            logger=logger,
        )

    @property
    def last_checkpoint_step(self) -> int:
        """The run's newest checkpoint saved by every rank, as the
        coordinator knew it when this rank registered (0: none): a loop that
        resumed from its newest checkpoint (a Slurm requeue) continues after
        it."""
        return self._w.registration.last_checkpoint_step

    def complete_step(
        self,
        step: int,
        iteration_seconds: float,
        timeout: Optional[float] = None,
        *,
        local_action: Optional[Action] = None,
        wait_for_ready: bool = False,
    ) -> Decision:
        """Reports that ``step`` (from 1) finished after ``iteration_seconds``
        and returns what to do: continue, save this step's checkpoint and stop,
        or stop. The decision is made once per step; a repeat gets the same.

        ``local_action``: what this rank already did at the step on its own,
        because it could not reach the coordinator then; it becomes the
        step's decision unless one is stored (see docs/design.md, the
        fail-safe plan). ``wait_for_ready``: wait within ``timeout`` for a
        coordinator to serve instead of failing at once."""

        def call(inc: int) -> ws.CompleteStepResponse:
            req = ws.CompleteStepRequest(
                run_id=self.run_id,
                worker_id=self._w.worker_id,
                step=step,
                iteration_seconds=iteration_seconds,
                incarnation=inc,
                local_action=cast(event_pb2.StepAction, local_action or 0),  # an IntEnum of the same values
            )
            return self._c.workers_patient.CompleteStep(req, timeout=self._timeout(timeout), wait_for_ready=wait_for_ready)

        return Decision.from_response(self._w.fenced(call))

    def report_checkpoint(
        self,
        step: int,
        phase: Phase = Phase.SAVED,
        save_seconds: float = 0.0,
        timeout: Optional[float] = None,
        *,
        wait_for_ready: bool = False,
    ) -> RunState:
        """Reports this rank's checkpoint of ``step``: SAVED after writing it
        (``save_seconds`` feeds C), PUBLISHED once step_N is visible (deferred
        finalize only). Safe to repeat."""

        def call(inc: int) -> ws.ReportCheckpointResponse:
            req = ws.ReportCheckpointRequest(
                run_id=self.run_id,
                worker_id=self._w.worker_id,
                step=step,
                phase=cast(ws.CheckpointPhase, phase),  # an IntEnum of the same values
                save_seconds=save_seconds,
                incarnation=inc,
            )
            return self._c.workers_patient.ReportCheckpoint(req, timeout=self._timeout(timeout), wait_for_ready=wait_for_ready)

        return RunState(self._w.fenced(call).run_state)

    def finish_run(self, timeout: Optional[float] = None) -> RunState:
        """Training ended normally: the run becomes COMPLETED."""

        def call(inc: int) -> ws.FinishRunResponse:
            req = ws.FinishRunRequest(run_id=self.run_id, worker_id=self._w.worker_id, incarnation=inc)
            return self._c.workers_patient.FinishRun(req, timeout=self._timeout(timeout))

        return RunState(self._w.fenced(call).run_state)

    def _publish(self, cmd: Command) -> bool:
        if cmd.kind != CommandKind.PUBLISH_CHECKPOINT:
            return False
        assert self._on_publish is not None
        self._on_publish(cmd.step)
        self.report_checkpoint(cmd.step, Phase.PUBLISHED)
        return True
