"""A NeMo RL-shaped training rank: the calls ``nemo_rl/algorithms/grpo.py``
makes around its TimeoutChecker, with the two-line change, in a process of its
own. Ranks meet at a barrier every step, as at a collective: ranks told
different things at the same step break it, and the rank fails.

Run by the tests with ``multiprocessing`` (spawn), each rank reporting every
step on a queue.
"""

from __future__ import annotations

import logging
import multiprocessing.synchronize
import os
import pathlib
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Loop:
    ckpt_dir: str
    timeout: str  # DD:HH:MM:SS, as checkpointing.checkpoint_must_save_by
    step_seconds: float = 0.3  # generation and training
    save_period: int = 3  # checkpointing.save_period
    val_seconds: float = 1.0  # setup and val_at_start, before the first step
    max_steps: int = 1000


def newest_checkpoint(ckpt_dir: pathlib.Path, ranks: int) -> int:
    """The newest step_N that every rank wrote: where a requeued job resumes."""
    steps = [int(p.name[5:]) for p in ckpt_dir.glob("step_*") if len(list(p.glob("rank_*.pt"))) == ranks]
    return max(steps, default=0)


def save_checkpoint(ckpt_dir: pathlib.Path, step: int, rank: int) -> None:
    path = ckpt_dir / f"step_{step}"
    path.mkdir(parents=True, exist_ok=True)
    with open(path / f"rank_{rank}.pt", "wb") as f:
        f.write(f"weights of step {step}, rank {rank}\n".encode() * 64)
        f.flush()
        os.fsync(f.fileno())


def rank_main(
    rank: int, ranks: int, env: Mapping[str, str], loop: Loop, barrier: multiprocessing.synchronize.Barrier, out: Any
) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=f"rank {rank}: %(levelname)s %(message)s")
    from snapcoord.nemo_rl import TimeoutChecker

    ckpt_dir = pathlib.Path(loop.ckpt_dir)
    timeout = TimeoutChecker(timeout=loop.timeout, fit_last_save_time=True, env=env, rank=rank)
    timeout.start_iterations()
    total_steps = newest_checkpoint(ckpt_dir, ranks)  # grpo_save_state.total_steps, restored
    time.sleep(loop.val_seconds)  # setup, val_at_start
    while total_steps < loop.max_steps:
        time.sleep(loop.step_seconds)  # generation and training
        barrier.wait(timeout=20)  # the step's collectives
        timeout.mark_iteration()
        should_save_by_step = (total_steps + 1) % loop.save_period == 0
        began = time.time()
        should_save_by_timeout = timeout.check_save()
        out.put(("step", rank, total_steps + 1, timeout.step, should_save_by_timeout, began, time.time()))
        if should_save_by_step or should_save_by_timeout:
            save_checkpoint(ckpt_dir, total_steps + 1, rank)
            timeout.checkpoint_saved()  # the new line
            out.put(("saved", rank, total_steps + 1, time.time()))
        total_steps += 1
        barrier.wait(timeout=20)  # the next step's collectives
        if should_save_by_timeout:
            break
    timeout.close()
    out.put(("done", rank, total_steps, time.time()))
