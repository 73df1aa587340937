"""The examples run as documented: two toy GRPO ranks and two environment
workers as separate processes, configured by SNAPCOORD_* alone."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

from conftest import REPO, Coordinator, run_spec, wait_until

from snapcoord import RunState

EXAMPLES = REPO / "client" / "python" / "examples"


def test_examples_through_a_deadline(coordinator: Coordinator, tmp_path: pathlib.Path) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("toy", run_spec(2, budget="00:00:00:06", checkpoint_prior=0.3, snapshot_prior=0.3, margin=0.3))
    env = dict(
        os.environ,
        SNAPCOORD_ADDR=coordinator.addr,
        SNAPCOORD_PLAINTEXT="true",
        SNAPCOORD_RUN_ID="toy",
        SNAPCOORD_RUN_TOKEN=token,
    )

    def start(script: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(EXAMPLES / script), *args], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip

    workers = [start("env_worker.py", "--name", f"env-{i}", "--snapshot-dir", str(tmp_path / "snap"), *(["--poll"] if i else []))
               for i in range(2)]  # fmt: skip
    wait_until("2 environment workers", lambda: len(admin.run_workers("toy")) == 2)
    ranks = [start("toy_grpo.py", "--rank", str(r), "--checkpoint-dir", str(tmp_path / "ckpt"), "--step-seconds", "0.2", "--save-period", "3")
             for r in range(2)]  # fmt: skip
    for p in ranks + workers:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, out
        assert "stopped: STOPPED" in out, out

    run = admin.get_run("toy")
    assert RunState(run.state) == RunState.STOPPED
    step = run.fired_at_step
    for r in range(2):
        assert json.loads((tmp_path / "ckpt" / f"step_{step}" / f"rank-{r}.json").read_text())["step"] == step
    deadline = admin.snapshots("toy")[-1]
    for i in range(2):
        saved = json.loads((tmp_path / "snap" / deadline.snapshot_id / f"env-{i}.json").read_text())
        assert saved["anchor_step"] == step and saved["reason"] == "deadline"


def test_env_worker_example_leaves_on_sigterm(coordinator: Coordinator, tmp_path: pathlib.Path) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("toy", run_spec(1, budget="00:01:00:00"))
    env = dict(os.environ, SNAPCOORD_ADDR=coordinator.addr,
               SNAPCOORD_PLAINTEXT="true", SNAPCOORD_RUN_ID="toy", SNAPCOORD_RUN_TOKEN=token)  # fmt: skip
    p = subprocess.Popen([sys.executable, str(EXAMPLES / "env_worker.py"), "--name", "env-0"], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    wait_until("the worker to register", lambda: len(admin.run_workers("toy")) == 1)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0, out
    (w,) = admin.run_workers("toy")
    assert w.state == 3  # WORKER_STATE_LEFT: no snapshot waits for it
