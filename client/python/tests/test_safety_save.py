"""Safety saves (SAVE_AND_CONTINUE) from Python, against the real coordinator.

The coordinator weighs minutes of penalties, so a safety save only pays
where hours of work are at stake and steps take minutes. The run below is
made to look like that without waiting for it: it started three hours ago
(nothing durable since), its B is about 22 minutes away, and the ranks
report 10-minute iterations, the seventh 20 minutes: the expected-loss
policy then answers step 7 with a safety save (from its figures, at any B
between 18 and 26 minutes away).
"""

from __future__ import annotations

import time

import pytest
from conftest import Coordinator

from snapcoord import Action, Phase, RunState, UnknownActionError
from snapcoord.nemo_rl import SafetySaveNotHandled, TimeoutChecker
from snapcoord.types import Decision
from snapcoord.v1 import event_pb2, run_pb2, worker_service_pb2

SAFETY_STEP = 7


def safety_spec() -> run_pb2.RunSpec:
    now = time.time()
    spec = run_pb2.RunSpec(trainer_world_size=1)
    spec.started_at.FromSeconds(int(now - 3 * 3600))
    spec.checkpointing.must_save_by.FromSeconds(int(now + 1300))
    spec.reserve.policy = run_pb2.RESERVE_POLICY_EXPECTED_LOSS
    spec.reserve.safety_saves = True
    spec.reserve.margin_seconds = 60
    spec.reserve.expected_checkpoint_seconds = 120
    return spec


def iteration(step: int) -> float:
    return 1200.0 if step % 8 == 7 else 600.0


def test_trainer_safety_save(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("safety", safety_spec())
    client = coordinator.worker_client("safety", token)
    with client.trainer(rank=0) as trainer:
        for step in range(1, SAFETY_STEP):
            d = trainer.complete_step(step, iteration(step))
            assert d.action == Action.CONTINUE and not d.should_save and not d.should_stop, d.explanation
        d = trainer.complete_step(SAFETY_STEP, iteration(SAFETY_STEP))
        assert d.action == Action.SAVE_AND_CONTINUE, d.explanation
        assert d.should_save and not d.should_stop
        assert "save now and continue" in d.explanation
        assert d.proto.inputs.HasField("expected_loss_safety_seconds")
        before = admin.get_run("safety").deadline.last_durable_save.ToSeconds()
        trainer.report_checkpoint(SAFETY_STEP, Phase.SAVED, 120)
        run = admin.get_run("safety")
        # Saved and published (no snapshots at this level): the run goes on,
        # and the save is now what a miss would lose from.
        assert RunState(run.state) == RunState.RUNNING and run.last_published_step == SAFETY_STEP
        assert run.deadline.last_durable_save.ToSeconds() > before
        d = trainer.complete_step(SAFETY_STEP + 1, iteration(SAFETY_STEP + 1))
        assert d.action != Action.STOP


def test_timeout_checker_safety_save(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("safety", safety_spec())
    client = coordinator.worker_client("safety", token)
    with TimeoutChecker(client=client, rank=0, safety_saves=True) as checker:
        checker.start_iterations()
        for step in range(1, SAFETY_STEP + 1):
            checker.mark_iteration()
            # extra_s stands in for the minutes an iteration of this run takes.
            assert checker.check_save(extra_s=iteration(step)) is False
            due = checker.check_safety_save()
            assert due == (step == SAFETY_STEP)
            assert checker.check_safety_save() is False  # once
        checker.checkpoint_saved(120)
    assert admin.get_run("safety").last_published_step == SAFETY_STEP


def test_timeout_checker_without_safety_saves_refuses(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("safety", safety_spec())
    client = coordinator.worker_client("safety", token)
    with TimeoutChecker(client=client, rank=0) as checker:
        checker.start_iterations()
        for step in range(1, SAFETY_STEP):
            checker.mark_iteration()
            assert checker.check_save(extra_s=iteration(step)) is False
        checker.mark_iteration()
        with pytest.raises(SafetySaveNotHandled) as err:
            checker.check_save(extra_s=iteration(SAFETY_STEP))
    assert err.value.decision.step == SAFETY_STEP


def test_unknown_action_is_not_continue() -> None:
    resp = worker_service_pb2.CompleteStepResponse(decision=event_pb2.Decision(step=3, action=42, explanation="newer"))
    with pytest.raises(UnknownActionError) as err:
        Decision.from_response(resp)
    assert err.value.decision.step == 3
