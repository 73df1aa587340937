"""4 trainer ranks and 8 environment workers in Python through a whole deadline."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from conftest import Coordinator, run_spec, wait_until

import snapcoord
from snapcoord import Action, Command, CommandKind, Outcome, Phase, RunState

RANKS = 4
ENV_WORKERS = 8
STEP_SECONDS = 0.2


def test_whole_deadline(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    budget_end = time.time() + 8.0
    _, token = admin.create_run("grpo-py", run_spec(RANKS, must_save_by=budget_end, checkpoint_prior=0.5, snapshot_prior=0.5, margin=0.5))
    client = coordinator.worker_client("grpo-py", token)

    decisions: dict[int, list[snapcoord.Decision]] = defaultdict(list)  # by rank
    snapshots: dict[str, list[Command]] = defaultdict(list)  # by worker name
    stop_reasons: dict[str, str] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(RANKS)  # the collective every real step ends with
    failures: list[BaseException] = []

    def rank(r: int) -> None:
        with client.trainer(r) as trainer:
            step = 0
            while True:
                step += 1
                t0 = time.monotonic()
                time.sleep(STEP_SECONDS)  # the step's work
                barrier.wait(timeout=30)
                d = trainer.complete_step(step, time.monotonic() - t0)
                with lock:
                    decisions[r].append(d)
                if d.should_save:
                    time.sleep(0.1)  # writing the checkpoint
                    trainer.report_checkpoint(step, Phase.SAVED, 0.1)
                if d.should_stop:
                    break
            # The run stops once the deadline snapshot is saved; then Stop.
            for cmd in trainer.commands():
                if cmd.kind == CommandKind.STOP:
                    with lock:
                        stop_reasons[f"rank-{r}"] = cmd.stop_reason

    def env(i: int) -> None:
        name = f"env-{i}"
        # Half stream their commands, half long-poll them.
        with client.env_worker(name, poll=i % 2 == 1, poll_wait=5) as worker:
            def save(cmd: Command) -> Outcome:
                with lock:
                    snapshots[name].append(cmd)
                time.sleep(0.05)  # writing the environment state
                return Outcome.SAVED

            reason = worker.run(on_snapshot=save)
            with lock:
                stop_reasons[name] = reason or ""

    threads = [threading.Thread(target=guard(failures, env, i)) for i in range(ENV_WORKERS)]
    # Environment workers first, so that the deadline snapshot expects all of them.
    for t in threads:
        t.start()
    wait_until("8 environment workers", lambda: len(admin.run_workers("grpo-py")) == ENV_WORKERS)
    ranks = [threading.Thread(target=guard(failures, rank, r)) for r in range(RANKS)]
    for t in ranks:
        t.start()
    for t in ranks + threads:
        t.join(60)
        assert not t.is_alive()
    assert not failures, failures

    # Every rank got the same decision at every step: continue until one step
    # saves and stops, and that is the step the run fired at.
    run = admin.get_run("grpo-py")
    per_rank = {r: [(d.step, d.action, d.explanation, d.decided_at) for d in ds] for r, ds in decisions.items()}
    assert all(v == per_rank[0] for v in per_rank.values())
    actions = [d.action for d in decisions[0]]
    assert actions[:-1] == [Action.CONTINUE] * (len(actions) - 1)
    assert actions[-1] == Action.SAVE_AND_STOP
    assert run.fired_at_step == len(actions) > 1
    fired = decisions[0][-1]
    assert fired.inputs is not None and fired.inputs.save_reserve_seconds == 0.5
    assert "B" in fired.explanation

    # The run ended STOPPED, before B, with the deadline snapshot saved by all 8.
    assert RunState(run.state) == RunState.STOPPED
    assert run.ended_at.ToNanoseconds() / 1e9 < budget_end
    deadline = [s for s in admin.snapshots("grpo-py") if s.snapshot_id == fired_deadline_id(snapshots)]
    assert len(deadline) == 1
    assert {r.worker_id for r in deadline[0].reports} == set(deadline[0].expected_worker_ids)
    assert len(deadline[0].reports) == ENV_WORKERS
    assert all(r.outcome == Outcome.SAVED for r in deadline[0].reports)
    for name, cmds in snapshots.items():
        assert cmds[-1].kind == CommandKind.SAVE_AT_DEADLINE, name
        assert cmds[-1].anchor_step == run.fired_at_step
    assert len(stop_reasons) == RANKS + ENV_WORKERS
    assert all("deadline save complete" in r for r in stop_reasons.values()), stop_reasons


def fired_deadline_id(snapshots: dict[str, list[Command]]) -> str:
    ids = {cmds[-1].snapshot_id for cmds in snapshots.values()}
    assert len(ids) == 1, ids
    return ids.pop()


def guard(failures: list[BaseException], fn, *args):  # type: ignore[no-untyped-def]
    def run() -> None:
        try:
            fn(*args)
        except BaseException as exc:  # surfaced by the test, not lost in a thread
            failures.append(exc)
            raise

    return run
