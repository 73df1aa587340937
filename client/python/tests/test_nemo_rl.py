"""snapcoord.nemo_rl.TimeoutChecker in a toy NeMo RL-style loop."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import Coordinator, run_spec

from snapcoord import Command, Outcome, RunState
from snapcoord.nemo_rl import RunStopped, TimeoutChecker, convert_to_seconds
from snapcoord.v1 import run_service_pb2

RANKS = 2
SNAPSHOT_SECONDS = 1.0


def nemo_style_loop(checker: TimeoutChecker, barrier: threading.Barrier, save_period: int = 2) -> tuple[int, list[bool]]:
    """The shape of nemo_rl.algorithms.grpo's loop around its TimeoutChecker."""
    checks: list[bool] = []
    checker.start_iterations()
    for step in range(1, 1000):
        time.sleep(0.2)  # generation and training
        barrier.wait(timeout=30)  # ranks end a step together
        checker.mark_iteration()
        should_save_by_timeout = checker.check_save()
        checks.append(should_save_by_timeout)
        if step % save_period == 0 or should_save_by_timeout:
            time.sleep(0.05)  # checkpointer.save(...); finalize_checkpoint(...)
            checker.checkpoint_saved()
        if should_save_by_timeout:
            return step, checks
    raise AssertionError("the deadline never fired")


def test_timeout_checker_drop_in(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("nemo", run_spec(RANKS, budget="00:00:00:09", checkpoint_prior=0.3, snapshot_prior=0.3, margin=0.3))
    client = coordinator.worker_client("nemo", token)
    results: dict[int, tuple[int, list[bool]]] = {}
    reserves: dict[int, float] = {}
    barrier = threading.Barrier(RANKS)

    # One environment worker whose snapshots take a second: the reserve R the
    # ranks see must grow from the 0.3 s prior to that.
    def save(cmd: Command) -> Outcome:
        time.sleep(SNAPSHOT_SECONDS)
        return Outcome.SAVED

    env = client.env_worker("env-0")
    env_thread = threading.Thread(target=env.run, args=(save,))
    env_thread.start()

    def rank(r: int) -> None:
        with TimeoutChecker(timeout="00:00:00:09", fit_last_save_time=True, client=client, rank=r) as checker:
            results[r] = nemo_style_loop(checker, barrier)
            reserves[r] = checker.save_reserve_seconds

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    env_thread.join(30)
    env.close()
    assert len(results) == RANKS and not env_thread.is_alive()

    run = admin.get_run("nemo")
    # Every rank was told to save at the same step, the step the run fired at,
    # and only then.
    fired = {step for step, _ in results.values()}
    assert fired == {run.fired_at_step}
    for _, checks in results.values():
        assert checks == [False] * (run.fired_at_step - 1) + [True]
    # The reserve is the coordinator's, learned from the environment snapshot.
    assert reserves[0] == reserves[1] >= SNAPSHOT_SECONDS
    # The deadline checkpoint was reported, so the deadline snapshot followed.
    assert RunState(run.state) == RunState.STOPPED


def test_check_save_raises_when_the_run_is_over(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("nemo", run_spec(1, budget="00:01:00:00", snapshots=False))
    client = coordinator.worker_client("nemo", token)
    with TimeoutChecker(client=client, rank=0) as checker:
        checker.start_iterations()
        checker.mark_iteration()
        assert checker.check_save() is False
        assert checker.save_reserve_seconds == admin.get_run("nemo").deadline.save_reserve_seconds
        admin.runs.CancelRun(run_service_pb2.CancelRunRequest(run_id="nemo", reason="operator"))
        checker.mark_iteration()
        with pytest.raises(RunStopped) as err:
            checker.check_save()
    assert err.value.decision.step == 2


def test_timeout_checker_reads_the_environment(coordinator: Coordinator) -> None:
    _, token = coordinator.admin().create_run("nemo", run_spec(4, budget="00:01:00:00"))
    env = {
        "SNAPCOORD_ADDR": coordinator.addr,
        "SNAPCOORD_PLAINTEXT": "true",
        "SNAPCOORD_RUN_ID": "nemo",
        "SNAPCOORD_RUN_TOKEN": token,
        "SLURM_PROCID": "3",
    }
    with TimeoutChecker("00:01:00:00", env=env) as checker:
        assert checker.trainer.rank == 3
        (worker,) = coordinator.admin().run_workers("nemo")
        assert worker.name == "rank-3" and worker.rank == 3


def test_convert_to_seconds() -> None:
    assert convert_to_seconds("01:02:03:04") == 86400 + 7200 + 180 + 4
    with pytest.raises(ValueError):
        convert_to_seconds("3h")
