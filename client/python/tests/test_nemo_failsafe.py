"""The NeMo RL drop-in, tried as a NeMo RL user would: two rank processes
making grpo.py's calls (grpo_loop.py), real checkpoint files, environment
workers writing real snapshot files, and the coordinator through a normal
deadline, a Slurm requeue, a kill -9 with a restart, a kill -9 for good, a
restore of its data from an older copy, no coordinator at start, and no
coordinator configured at all."""

from __future__ import annotations

import logging
import multiprocessing
import pathlib
import queue
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import Coordinator, free_port, run_spec

import snapcoord
from grpo_loop import Loop, rank_main
from snapcoord import Command, Outcome, RunState
from snapcoord.nemo_rl import CoordinatorUnreachable, TimeoutChecker
from snapcoord.v1 import run_service_pb2, worker_pb2

RANKS = 2
_SPAWN = multiprocessing.get_context("spawn")


def dhms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 86400:02d}:{s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass
class Job:
    """One allocation's ranks, each a process, and what they reported."""

    coordinator: Coordinator
    run_id: str
    token: str
    loop: Loop
    out: Any = field(default_factory=_SPAWN.Queue)
    steps: list[tuple[int, int, int, bool, float, float]] = field(default_factory=list)  # rank, loop step, checker step, save, began, ended
    saved: list[tuple[int, int, float]] = field(default_factory=list)  # rank, step, at
    done: dict[int, int] = field(default_factory=dict)
    procs: list[Any] = field(default_factory=list)
    barrier: Any = None  # held here: the ranks unpickle it after start() returns

    def env(self) -> dict[str, str]:
        return {
            "SNAPCOORD_ADDR": self.coordinator.addr,
            "SNAPCOORD_PLAINTEXT": "true",
            "SNAPCOORD_RUN_ID": self.run_id,
            "SNAPCOORD_RUN_TOKEN": self.token,
        }

    def start(self) -> None:
        self.barrier = _SPAWN.Barrier(RANKS)
        self.procs = [_SPAWN.Process(target=rank_main, args=(r, RANKS, self.env(), self.loop, self.barrier, self.out)) for r in range(RANKS)]
        for p in self.procs:
            p.start()

    def until(self, cond: Any, timeout: float = 60.0) -> None:
        """Reads the ranks' reports until cond() holds."""
        end = time.monotonic() + timeout
        while not cond():
            if all(p.exitcode is not None for p in self.procs) and self.out.empty():
                pytest.fail(f"the ranks exited ({[p.exitcode for p in self.procs]}) before the condition held")
            try:
                msg = self.out.get(timeout=max(0.01, min(1.0, end - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > end:
                    pytest.fail(f"timed out after {timeout}s; steps so far: {self.steps[-4:]}")
                continue
            kind, rank, *rest = msg
            if kind == "step":
                self.steps.append((rank, *rest))
            elif kind == "saved":
                self.saved.append((rank, rest[0], rest[1]))
            else:
                self.done[rank] = rest[0]

    def finish(self, timeout: float = 60.0) -> None:
        self.until(lambda: len(self.done) == RANKS, timeout)
        for p in self.procs:
            p.join(15)
        assert [p.exitcode for p in self.procs] == [0] * RANKS, "a rank failed: see its output above"

    def kill(self) -> None:
        for p in self.procs:
            p.kill()
            p.join()

    def last_step(self) -> int:
        return max((s[1] for s in self.steps), default=0)

    def fired(self) -> dict[int, int]:
        """The loop step at which each rank's check_save() said save."""
        return {rank: step for rank, step, _, save, _, _ in self.steps if save}


class EnvWorkers:
    """Environment workers writing a real file per snapshot."""

    def __init__(self, client: snapcoord.Client, root: pathlib.Path, n: int = 3) -> None:
        self.root, self.workers = root, [client.env_worker(f"env-{i}") for i in range(n)]
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in self.workers]
        for t in self.threads:
            t.start()

    def _run(self, worker: snapcoord.EnvWorker) -> None:
        def save(cmd: Command) -> Outcome:
            path = self.root / cmd.snapshot_id / f"{worker.name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f'{{"anchor_step": {cmd.anchor_step}}}\n')
            return Outcome.SAVED

        try:
            worker.run(on_snapshot=save)
        except snapcoord.SnapcoordError:
            pass  # the test asserts on the run, not on how each worker ended

    def files(self, snapshot_id: str) -> list[pathlib.Path]:
        return sorted((self.root / snapshot_id).glob("*.json"))

    def close(self) -> None:
        for w in self.workers:
            w.close(timeout=5)


def create_run(coordinator: Coordinator, run_id: str, budget_s: float) -> tuple[snapcoord.Client, str, float]:
    admin = coordinator.admin()
    b = time.time() + budget_s
    _, token = admin.create_run(run_id, run_spec(RANKS, must_save_by=b, checkpoint_prior=0.3, snapshot_prior=0.3, margin=0.5))
    return admin, token, b


def deadline_snapshot(admin: snapcoord.Client, run_id: str) -> worker_pb2.Snapshot:
    (snap,) = [s for s in admin.snapshots(run_id) if s.reason == worker_pb2.SNAPSHOT_REASON_DEADLINE]
    return snap


# (1) A normal deadline.
def test_grpo_loop_saves_at_the_deadline(coordinator: Coordinator, tmp_path: pathlib.Path) -> None:
    admin, token, b = create_run(coordinator, "grpo", 12)
    envs = EnvWorkers(coordinator.worker_client("grpo", token), tmp_path / "snapshots")
    job = Job(coordinator, "grpo", token, Loop(str(tmp_path / "ckpt"), dhms(12)))
    job.start()
    job.finish()
    envs.close()

    run = admin.get_run("grpo")
    assert RunState(run.state) == RunState.STOPPED, run.failure_message
    assert job.fired() == {0: run.fired_at_step, 1: run.fired_at_step}
    assert all(loop == checker for _, loop, checker, _, _, _ in job.steps), "the checker numbers steps as the loop does"
    assert sorted((tmp_path / "ckpt" / f"step_{run.fired_at_step}").glob("*.pt")) != []
    snap = deadline_snapshot(admin, "grpo")
    assert snap.anchor_step == run.fired_at_step and len(envs.files(snap.snapshot_id)) == 3
    assert run.ended_at.ToNanoseconds() / 1e9 < b
    # I counts iterations only: not the second of setup before step 1, nor
    # the saves, nor waiting on the coordinator (steps take 0.3 s).
    assert run.deadline.iteration_seconds < 0.9


# (2) A Slurm requeue in the middle of the run: the loop restores its newest
# checkpoint and calls the checker exactly as before.
def test_grpo_loop_numbers_steps_right_after_a_requeue(coordinator: Coordinator, tmp_path: pathlib.Path) -> None:
    admin, token, _ = create_run(coordinator, "grpo", 300)
    loop = Loop(str(tmp_path / "ckpt"), dhms(300), save_period=3)
    first = Job(coordinator, "grpo", token, loop)
    first.start()
    first.until(lambda: first.last_step() >= 5)  # checkpoint at step 3, steps 4 and 5 decided
    first.kill()  # the allocation ends
    coordinator.kill()

    # The requeued allocation: the job's coordinator on the same data, a new
    # token and a new B, as deploy/slurm/grpo.sbatch does.
    coordinator.start()
    admin = coordinator.admin()
    token = admin.runs.ReissueRunToken(run_service_pb2.ReissueRunTokenRequest(run_id="grpo", reason="requeued")).run_token
    b = time.time() + 12
    req = run_service_pb2.UpdateDeadlineRequest(run_id="grpo")
    req.must_save_by.FromNanoseconds(int(b * 1e9))
    admin.runs.UpdateDeadline(req)
    envs = EnvWorkers(coordinator.worker_client("grpo", token), tmp_path / "snapshots")
    second = Job(coordinator, "grpo", token, Loop(loop.ckpt_dir, dhms(12), save_period=3))
    second.start()
    second.finish()
    envs.close()

    resumed = [s for s in second.steps]
    assert min(step for _, step, _, _, _, _ in resumed) == 4, "the loop resumes after its checkpoint of step 3"
    assert all(loop_step == checker for _, loop_step, checker, _, _, _ in resumed), "the checker numbers steps as the loop does"
    run = admin.get_run("grpo")
    assert RunState(run.state) == RunState.STOPPED, run.failure_message
    assert second.fired() == {0: run.fired_at_step, 1: run.fired_at_step}
    snap = deadline_snapshot(admin, "grpo")
    assert snap.anchor_step == run.fired_at_step
    assert len(list((tmp_path / "ckpt" / f"step_{snap.anchor_step}").glob("*.pt"))) == RANKS, "the snapshot is anchored to a checkpoint on disk"


# (3) kill -9 and a restart 3 s later.
def test_grpo_loop_rides_out_a_restart(coordinator: Coordinator, tmp_path: pathlib.Path) -> None:
    admin, token, b = create_run(coordinator, "grpo", 20)
    envs = EnvWorkers(coordinator.worker_client("grpo", token), tmp_path / "snapshots")
    job = Job(coordinator, "grpo", token, Loop(str(tmp_path / "ckpt"), dhms(20)))
    job.start()
    job.until(lambda: job.last_step() >= 4)
    coordinator.kill()
    time.sleep(3)  # the outage itself
    coordinator.start()
    serving = time.time()
    job.finish()
    envs.close()

    run = admin.get_run("grpo")
    assert RunState(run.state) == RunState.STOPPED, run.failure_message
    assert set(job.fired().values()) == {run.fired_at_step}
    spanning = [ended for _, _, _, _, began, ended in job.steps if began < serving]
    assert max(spanning) < serving + 2, "a check_save() in the outage returned within 2 s of the coordinator serving"
    assert run.deadline.iteration_seconds < 0.9, "the outage is not an iteration"
    assert run.ended_at.ToNanoseconds() / 1e9 < b


def saved_together_before(job: Job, ckpt: pathlib.Path, b: float) -> None:
    """Both ranks saved their deadline checkpoint at one step, before B."""
    fired = job.fired()
    assert len(fired) == RANKS and len(set(fired.values())) == 1, f"the ranks saved at steps {fired}"
    step = fired[0]
    saved = [at for rank, s, at in job.saved if s == step]
    assert len(saved) == RANKS and max(saved) < b, "every rank saved its deadline checkpoint before B"
    assert len(list((ckpt / f"step_{step}").glob("*.pt"))) == RANKS


# (4) kill -9 for good: the ranks save before B on their own, at one step.
def test_grpo_loop_saves_when_the_coordinator_is_gone_for_good(coordinator: Coordinator, tmp_path: pathlib.Path) -> None:
    _, token, b = create_run(coordinator, "grpo", 20)
    job = Job(coordinator, "grpo", token, Loop(str(tmp_path / "ckpt"), dhms(20), save_period=1000))
    job.start()
    job.until(lambda: job.last_step() >= 3)
    coordinator.kill()
    job.finish()  # every rank exits 0

    saved_together_before(job, tmp_path / "ckpt", b)


# (4b) The coordinator's data file restored from an older copy (made at a
# kill -9 and restart at step 4 or later) after the ranks trained on five
# more steps: they go on, coordinated, and save at one step.
def test_grpo_loop_goes_on_after_the_coordinator_is_restored_from_an_older_copy(coordinator: Coordinator, tmp_path: pathlib.Path) -> None:
    admin, token, b = create_run(coordinator, "grpo", 25)
    envs = EnvWorkers(coordinator.worker_client("grpo", token), tmp_path / "snapshots")
    job = Job(coordinator, "grpo", token, Loop(str(tmp_path / "ckpt"), dhms(25)))
    job.start()
    db, backup = coordinator.data_dir / "snapcoord.db", tmp_path / "snapcoord.db.copy"
    job.until(lambda: job.last_step() >= 4)
    coordinator.kill()  # the copy is made of a file nobody writes
    shutil.copyfile(db, backup)
    coordinator.start()
    copied = job.last_step()  # the copy's last step is this or the next
    job.until(lambda: job.last_step() >= copied + 5)
    coordinator.kill()
    shutil.copyfile(backup, db)
    coordinator.start()
    job.finish()  # every rank exits 0: nothing was refused into the loop
    envs.close()

    run = admin.get_run("grpo")
    assert RunState(run.state) == RunState.STOPPED, run.failure_message
    assert job.fired() == {0: run.fired_at_step, 1: run.fired_at_step}
    assert all(loop == checker for _, loop, checker, _, _, _ in job.steps), "the checker numbers steps as the loop does"
    assert len(list((tmp_path / "ckpt" / f"step_{run.fired_at_step}").glob("*.pt"))) == RANKS
    assert deadline_snapshot(admin, "grpo").anchor_step == run.fired_at_step
    assert run.ended_at.ToNanoseconds() / 1e9 < b
    events = admin.runs.WatchRun(run_service_pb2.WatchRunRequest(run_id="grpo", no_follow=True), timeout=10)
    found = [re.search(r"is at step (\d+) and the run's last recorded step is (\d+)", e.event.message) for e in events]
    gaps = [(int(m[1]), int(m[2])) for m in found if m]
    assert len(gaps) == 1, f"WARNING events for the restore: {gaps}"
    (taken, last), = gaps
    assert last in (copied, copied + 1) and taken >= copied + 4, f"step {taken} taken after the copy's last step {last}"


# (4c) The coordinator comes back with its data directory lost (empty, the
# same address): it knows neither the run nor its token. The ranks go on by
# their plan as if it were out of reach, nothing is raised into the loop,
# and both save at one step before B.
def test_grpo_loop_saves_when_the_coordinator_lost_its_data(coordinator: Coordinator, tmp_path: pathlib.Path) -> None:
    _, token, b = create_run(coordinator, "grpo", 20)
    job = Job(coordinator, "grpo", token, Loop(str(tmp_path / "ckpt"), dhms(20), save_period=1000))
    job.start()
    job.until(lambda: job.last_step() >= 3)
    coordinator.kill()
    (coordinator.data_dir / "snapcoord.db").unlink()  # the run and its token with it
    coordinator.start()
    job.finish()  # every rank exits 0

    saved_together_before(job, tmp_path / "ckpt", b)


# (5) SNAPCOORD_* set and no coordinator: a clear error, fast.
def test_no_coordinator_at_start_is_a_clear_error() -> None:
    addr = f"127.0.0.1:{free_port()}"
    env = {"SNAPCOORD_ADDR": addr, "SNAPCOORD_PLAINTEXT": "true", "SNAPCOORD_RUN_ID": "grpo", "SNAPCOORD_RUN_TOKEN": "x" * 32}
    began = time.monotonic()
    with pytest.raises(CoordinatorUnreachable) as err:
        TimeoutChecker(timeout="00:01:00:00", env=env)
    assert time.monotonic() - began < 6
    assert addr in str(err.value) and "SNAPCOORD_ADDR" in str(err.value)


# (6) No SNAPCOORD_*: NeMo RL's own checker, as on a laptop.
def test_without_snapcoord_variables_it_is_nemo_rls_checker(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="snapcoord")
    checker = TimeoutChecker(timeout="00:00:00:02", fit_last_save_time=True, env={})
    checker.start_iterations()
    checks = []
    for _ in range(100):
        time.sleep(0.2)
        checker.mark_iteration()
        elapsed = time.time() - checker.start_time
        mean = sum(checker.iteration_times) / len(checker.iteration_times)
        checks.append((elapsed + mean, checker.check_save()))
        if checks[-1][1]:
            break
    checker.close()
    # NeMo RL's rule: save once elapsed time plus the mean iteration reaches
    # the timeout, and only then.
    assert checks[-1][1] and checks[-1][0] >= 2.0
    assert all(not saved and fit < 2.0 for fit, saved in checks[:-1])
    assert checker.check_save() is False, "True only once"
    said = [r for r in caplog.records if "decides on its own" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO


def test_a_forgotten_checkpoint_saved_is_loud(coordinator: Coordinator, caplog: pytest.LogCaptureFixture) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("grpo", run_spec(1, budget="00:01:00:00"))
    client = coordinator.worker_client("grpo", token)
    checker = TimeoutChecker(timeout="00:01:00:00", client=client, rank=0)
    checker.start_iterations()
    checker.mark_iteration()
    assert checker.check_save() is False
    admin.runs.TriggerDeadline(run_service_pb2.TriggerDeadlineRequest(run_id="grpo", reason="test"))
    checker.mark_iteration()
    assert checker.check_save() is True
    checker.close()  # the loop exits without checkpoint_saved()

    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "checkpoint_saved() was never called" in r.getMessage()]
    assert len(errors) == 1 and "step 2" in errors[0].getMessage()
    events = admin.runs.WatchRun(run_service_pb2.WatchRunRequest(run_id="grpo", no_follow=True), timeout=10)
    warnings = [e.event.message for e in events if "left without reporting its checkpoint" in e.event.message]
    assert len(warnings) == 1 and 'rank 0 (' in warnings[0] and '"rank-0"' in warnings[0], warnings


def test_the_small_contracts(coordinator: Coordinator, caplog: pytest.LogCaptureFixture) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("grpo", run_spec(1, budget="00:01:00:00"))
    client = coordinator.worker_client("grpo", token)
    with TimeoutChecker(timeout="00:00:10:00", client=client, rank=0) as checker:
        checker.start_iterations()
        checker.mark_iteration()
        assert checker.check_save() is False
        # A timeout 50 minutes off the run's B: both are said.
        (warning,) = [r.getMessage() for r in caplog.records if "the coordinator decides by B" in r.getMessage()]
        assert "00:00:10:00" in warning
        checker.mark_iteration()
        # would_save() asks nobody: the coordinator has not heard of step 2.
        assert checker.would_save() is False
        assert admin.get_run("grpo").last_step == 1
        with pytest.raises(AttributeError):
            checker.save_reserve_seconds = 3.0

