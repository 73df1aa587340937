"""A coordinator SIGKILL and restart in the middle of a run: the same
decisions afterwards, every report kept, and the workers carry on."""

from __future__ import annotations

import threading
from collections import defaultdict

from conftest import Coordinator, run_spec, wait_until

import snapcoord
from snapcoord import Command, CommandKind, Outcome, Phase, RunState
from snapcoord.v1 import run_service_pb2, worker_pb2


def test_coordinator_sigkill_and_restart(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("crash", run_spec(2, budget="00:01:00:00"))
    client = coordinator.worker_client("crash", token)

    seen: dict[str, list[Command]] = defaultdict(list)
    lock = threading.Lock()
    deadline_saving = threading.Barrier(3)  # both workers inside the deadline snapshot, and the test
    coordinator_down = threading.Event()

    def save(name: str):  # type: ignore[no-untyped-def]
        def on_snapshot(cmd: Command) -> Outcome:
            with lock:
                seen[name].append(cmd)
            if cmd.kind == CommandKind.SAVE_AT_DEADLINE:
                # Finish the deadline snapshot only once the coordinator is
                # dead: the report must wait for the restarted one.
                deadline_saving.wait(timeout=30)
                assert coordinator_down.wait(timeout=30)
            return Outcome.SAVED

        return on_snapshot

    envs = {name: client.env_worker(name, poll=name == "env-poll", poll_wait=2) for name in ("env-stream", "env-poll")}
    stops: dict[str, str] = {}

    def follow(name: str) -> None:
        stops[name] = envs[name].run(on_snapshot=save(name)) or ""

    threads = [threading.Thread(target=follow, args=(n,)) for n in envs]
    for t in threads:
        t.start()
    ranks = [client.trainer(r) for r in range(2)]

    # Steps 1-3, and the checkpoint of step 2, which brings a snapshot.
    before: dict[int, snapcoord.Decision] = {}
    for step in (1, 2, 3):
        before[step] = ranks[0].complete_step(step, 0.1)
        assert ranks[1].complete_step(step, 0.1) == before[step]
        if step == 2:
            for r in ranks:
                r.report_checkpoint(2, Phase.SAVED, 0.2)
    wait_until("the trainer-checkpoint snapshot", lambda: any(s.outcome == worker_pb2.SNAPSHOT_OUTCOME_SAVED for s in admin.snapshots("crash")))
    snapshots_before = admin.snapshots("crash")
    incarnations = {n: w.incarnation for n, w in envs.items()}

    # Crash 1, between steps.
    coordinator.kill()
    coordinator.start()

    # The same decisions for the same steps, and every report kept.
    for step, decision in before.items():
        assert ranks[1].complete_step(step, 5.0) == decision
    assert admin.snapshots("crash") == snapshots_before
    assert admin.get_run("crash").last_published_step == 2

    # The run goes on: step 4, then the deadline by hand at step 5.
    for r in ranks:
        assert r.complete_step(4, 0.1).action == snapcoord.Action.CONTINUE
    admin.runs.TriggerDeadline(run_service_pb2.TriggerDeadlineRequest(run_id="crash", reason="test"))
    for r in ranks:
        assert r.complete_step(5, 0.1).action == snapcoord.Action.SAVE_AND_STOP
        r.report_checkpoint(5, Phase.SAVED, 0.2)

    # Crash 2, while both workers save the deadline snapshot (delivered on the
    # stream and on the poll they resumed after crash 1): their reports are
    # retried until the restarted coordinator answers.
    deadline_saving.wait(timeout=30)
    coordinator.kill()
    coordinator_down.set()
    coordinator.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive()

    run = admin.get_run("crash")
    assert RunState(run.state) == RunState.STOPPED
    deadline = admin.snapshots("crash")[-1]
    assert deadline.reason == worker_pb2.SNAPSHOT_REASON_DEADLINE and deadline.anchor_step == 5
    assert deadline.outcome == worker_pb2.SNAPSHOT_OUTCOME_SAVED
    assert sorted(r.worker_id for r in deadline.reports) == sorted(w.worker_id for w in envs.values())
    # Each command once per worker, none lost across two crashes, no
    # re-registration needed.
    for name, cmds in seen.items():
        assert [c.kind for c in cmds] == [CommandKind.SNAPSHOT, CommandKind.SAVE_AT_DEADLINE], name
        assert envs[name].incarnation == incarnations[name]
    assert set(stops) == set(envs) and all("deadline save complete" in s for s in stops.values())
    for r in ranks:
        r.close()
    for w in envs.values():
        w.close()
