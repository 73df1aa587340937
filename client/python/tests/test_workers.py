"""Worker membership against the real coordinator: tokens, incarnations,
superseded processes, lapsed leases, polling."""

from __future__ import annotations

import time

import grpc
import pytest
from conftest import Coordinator, run_spec, wait_until

import snapcoord
from snapcoord import CommandKind, Outcome, Phase, RunState
from snapcoord.v1 import run_service_pb2, worker_pb2, worker_service_pb2 as ws


def test_bad_token_is_auth_error(coordinator: Coordinator) -> None:
    coordinator.admin().create_run("run-a", run_spec(1, budget="00:01:00:00"))
    client = coordinator.worker_client("run-a", "not-the-run-token-0123456789")
    with pytest.raises(snapcoord.AuthError) as err:
        client.trainer(0)
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert err.value.message


def test_cross_run_token_is_auth_error(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    admin.create_run("run-a", run_spec(1, budget="00:01:00:00"))
    _, token_b = admin.create_run("run-b", run_spec(1, budget="00:01:00:00"))
    client = coordinator.worker_client("run-a", token_b)  # run b's token, run a's id
    with pytest.raises(snapcoord.AuthError) as err:
        client.env_worker("env-0")
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    # Nothing registered in run a.
    assert admin.run_workers("run-a") == []


def test_invalid_input_names_the_field(coordinator: Coordinator) -> None:
    _, token = coordinator.admin().create_run("run-a", run_spec(1, budget="00:01:00:00"))
    with coordinator.worker_client("run-a", token).trainer(0) as trainer:
        with pytest.raises(snapcoord.InvalidInputError) as err:
            trainer.complete_step(1, -1.0)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "iteration_seconds" in err.value.message


def test_superseded_trainer_raises_and_leaves_the_name(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("run-a", run_spec(1, budget="00:01:00:00"))
    old = coordinator.worker_client("run-a", token).trainer(0)
    assert old.complete_step(1, 0.1).action == snapcoord.Action.CONTINUE
    # A replacement process starts under the same name while the old one runs.
    new = coordinator.worker_client("run-a", token).trainer(0)
    assert new.incarnation == old.incarnation + 1
    with pytest.raises(snapcoord.SupersededError) as err:
        old.complete_step(2, 0.1)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.reason == "WORKER_SUPERSEDED"
    assert isinstance(err.value, snapcoord.ConflictError)
    # The old process changed nothing, and stays stopped.
    assert admin.get_run("run-a").last_step == 1
    with pytest.raises(snapcoord.SupersededError):
        old.report_checkpoint(1, Phase.SAVED, 0.1)
    with pytest.raises(snapcoord.SupersededError):
        list(old.commands())
    # Closing it does not deregister the name the new process holds.
    old.close()
    (worker,) = admin.run_workers("run-a")
    assert worker.state == worker_pb2.WORKER_STATE_LIVE and worker.incarnation == new.incarnation
    assert new.complete_step(2, 0.1).step == 2
    new.close()
    assert admin.run_workers("run-a")[0].state == worker_pb2.WORKER_STATE_LEFT


def test_superseded_env_worker_stops_its_commands(coordinator: Coordinator) -> None:
    _, token = coordinator.admin().create_run("run-a", run_spec(1, budget="00:01:00:00"))
    old = coordinator.worker_client("run-a", token).env_worker("env-0")
    with coordinator.worker_client("run-a", token).env_worker("env-0"):
        # The old process hears of it from its stream or its next heartbeat.
        with pytest.raises(snapcoord.SupersededError):
            for _ in old.commands():
                pass
        assert isinstance(old.error, snapcoord.SupersededError)
    old.close()


def test_reregisters_when_dropped(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("run-a", run_spec(1, budget="00:01:00:00"))
    client = coordinator.worker_client("run-a", token)
    with client.env_worker("env-0") as worker:
        first = worker.incarnation
        # Someone deregisters it behind its back (incarnation 0 skips the check):
        # its next heartbeat is refused, and it registers again by itself.
        client.workers.DeregisterWorker(ws.DeregisterWorkerRequest(run_id="run-a", worker_id=worker.worker_id))
        wait_until("the worker to register again", lambda: worker.incarnation == first + 1)
        (w,) = admin.run_workers("run-a")
        assert w.state == worker_pb2.WORKER_STATE_LIVE and w.incarnation == first + 1
        assert worker.error is None


def test_polling_worker_gets_commands_and_reports(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("run-a", run_spec(1, budget="00:01:00:00"))
    client = coordinator.worker_client("run-a", token)
    with client.env_worker("env-0", poll=True, poll_wait=2) as worker, client.trainer(0) as trainer:
        assert worker.polling
        trainer.complete_step(1, 0.1)
        admin.runs.TriggerDeadline(run_service_pb2.TriggerDeadlineRequest(run_id="run-a", reason="test"))
        assert trainer.complete_step(2, 0.1).action == snapcoord.Action.SAVE_AND_STOP
        trainer.report_checkpoint(2, Phase.SAVED, 0.1)
        cmd = worker.next_command(timeout=10)
        assert cmd is not None and cmd.kind == CommandKind.SAVE_AT_DEADLINE and cmd.anchor_step == 2
        assert worker.report_snapshot(cmd.snapshot_id, Outcome.SAVED, 0.2) == RunState.STOPPED
        stop = worker.next_command(timeout=10)
        assert stop is not None and stop.kind == CommandKind.STOP
        assert worker.next_command(timeout=1) is None  # nothing after the Stop
        assert worker.stop_reason == stop.stop_reason


def test_reregisters_after_its_lease_lapsed(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("run-a", run_spec(1, budget="00:01:00:00"))
    with coordinator.worker_client("run-a", token).env_worker("env-0") as worker:
        first = worker.incarnation
        # A coordinator gone for longer than the lease (2 s): the worker must
        # presume its lease lost and register again, as its own process.
        coordinator.kill()
        time.sleep(2.5)  # the outage itself, not a synchronisation
        coordinator.start()
        wait_until("the worker to register again", lambda: worker.incarnation == first + 1)
        (w,) = admin.run_workers("run-a")
        assert w.state == worker_pb2.WORKER_STATE_LIVE and w.incarnation == first + 1 and w.replaced_incarnation == first
        assert worker.error is None


def test_trainer_publishes_a_deferred_checkpoint(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    spec = run_spec(2, budget="00:01:00:00", snapshots=False)
    spec.checkpointing.deferred_finalize = True
    _, token = admin.create_run("run-a", spec)
    client = coordinator.worker_client("run-a", token)
    published: list[tuple[int, int]] = []
    ranks = [client.trainer(r, on_publish=lambda step, r=r: published.append((r, step))) for r in range(2)]
    for r in ranks:
        r.complete_step(1, 0.1)
    admin.runs.TriggerDeadline(run_service_pb2.TriggerDeadlineRequest(run_id="run-a", reason="test"))
    for r in ranks:
        assert r.complete_step(2, 0.1).should_save
        r.report_checkpoint(2, Phase.SAVED, 0.1)
    # PublishCheckpoint goes to the ranks; one PUBLISHED report ends the save.
    for r in ranks:
        stop = r.next_command(timeout=10)
        assert stop is not None and stop.kind == CommandKind.STOP, stop
    assert published and all(step == 2 for _, step in published)
    run = admin.get_run("run-a")
    assert RunState(run.state) == RunState.STOPPED and run.last_published_step == 2
    for r in ranks:
        r.close()
