"""A NeMo RL drop-in whose rank another process took over (a replacement
started while this one still ran) is told so: the report it had queued is
refused, and its next check_save() raises SupersededError rather than
decide anything for a rank that is no longer its own."""

from __future__ import annotations

import logging

import pytest
from conftest import Coordinator, run_spec

import snapcoord
from snapcoord.nemo_rl import TimeoutChecker
from snapcoord.v1 import worker_pb2


def test_a_superseded_rank_raises_at_its_next_check(coordinator: Coordinator, caplog: pytest.LogCaptureFixture) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("grpo", run_spec(1, budget="00:01:00:00"))
    checker = TimeoutChecker(timeout="00:01:00:00", client=coordinator.worker_client("grpo", token), rank=0)
    checker.start_iterations()
    checker.mark_iteration()
    assert checker.check_save() is False

    replacement = coordinator.worker_client("grpo", token).trainer(0)
    checker.checkpoint_saved()  # the report it queues is refused: superseded
    checker.mark_iteration()
    with pytest.raises(snapcoord.SupersededError) as raised:
        checker.check_save()
    assert raised.value.reason == "WORKER_SUPERSEDED"
    assert [r for r in caplog.records if r.levelno == logging.ERROR and "another process registered" in r.getMessage()]
    checker.close()

    # Neither the refused report nor close() touched the replacement's rank.
    (worker,) = admin.run_workers("grpo")
    assert worker.state == worker_pb2.WORKER_STATE_LIVE and worker.incarnation == replacement.incarnation
    assert admin.get_run("grpo").last_step == 1
    assert replacement.complete_step(2, 0.1).step == 2
    replacement.close()
