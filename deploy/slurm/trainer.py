#!/usr/bin/env python3
"""One trainer rank of the Slurm recipe (docs/slurm.md): a real, small
PyTorch data-parallel loop. Each step trains a linear model on a batch of
its own, averages the gradients over every rank with ``all_reduce``
(torch.distributed, gloo: CPU only) and then waits ``--iteration-seconds``
like the rollouts of an RL step. Every ``--checkpoint-every`` steps, and at
the step the coordinator says, each rank writes its ``torch.save``
checkpoint.

The coordinator decides through snapcoord's NeMo RL drop-in
(``snapcoord.nemo_rl.TimeoutChecker``), which a NeMo RL loop uses the same
way: ``mark_iteration()`` after the step, ``check_save()`` for the decision,
``checkpoint_saved()`` after the save. It also numbers the steps on a
requeue (the run's newest checkpoint every rank saved, as the coordinator
knows it) and, should the coordinator be gone, decides by the fail-safe plan.

Without a coordinator (no ``SNAPCOORD_*`` variables: grpo.sbatch found
none it could reach), the drop-in decides exactly as NeMo RL's own
TimeoutChecker, from ``--timeout``; the loop then resumes from the newest
checkpoint every rank saved, as NeMo RL finds its own.

Every rank must stop at the same step: one that stopped while the others
went on would leave them waiting in their next ``all_reduce``. So after each
decision the ranks compare theirs (an ``all_reduce`` of it): if they differ,
each says so and exits 2 (without a coordinator each rank's clock decides,
and they save when the first says so, as NeMo RL's one process would);
and the process group has a timeout
(``--collective-timeout``), so a hang becomes an error.

Rendezvous: MASTER_ADDR and MASTER_PORT (the batch script sets them), the
rank and world size from SLURM_PROCID and SLURM_NTASKS. Exits 0 once the run
(or, without a coordinator, NeMo RL's rule) told it to stop, after saving; 2
on a disagreement, 3 if another process took its rank.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import snapcoord
from snapcoord.nemo_rl import RunStopped, TimeoutChecker


def checkpoint_path(directory: Path, step: int, rank: int) -> Path:
    return directory / f"step_{step}" / f"rank-{rank}.pt"


def save(path: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """torch.save of the model and optimizer, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}, tmp)
    os.replace(tmp, path)


def train_step(step: int, rank: int, world: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> float:
    """One step of data-parallel SGD: the gradients averaged over all ranks."""
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(64, 16, generator=gen)
    y = x.sum(dim=1, keepdim=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        assert p.grad is not None
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    return float(loss)


def answers(save: bool) -> tuple[bool, bool]:
    """(some rank saves, every rank saves): all ranks call this each step."""
    flags = torch.tensor([float(save), -float(save)])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return bool(flags[0] == 1), bool(flags[1] == -1)


def newest_checkpoint(directory: Path, world: int) -> int:
    """The newest step every rank saved, 0 for none: where a job without a
    coordinator resumes (with one, the coordinator says)."""
    steps = [int(d.name[5:]) for d in directory.glob("step_*") if d.name[5:].isdigit()]
    done = [s for s in steps if all(checkpoint_path(directory, s, r).exists() for r in range(world))]
    return max(done, default=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint-dir", type=Path, required=True)
    ap.add_argument("--iteration-seconds", type=float, default=3.0, help="rollout time per step, besides the training")
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--collective-timeout", type=float, default=120.0, help="seconds before a collective that hangs fails")
    ap.add_argument(
        "--timeout",
        help="NeMo RL's timeout (DD:HH:MM:SS, from the checker's start): when to save and stop without a coordinator "
        "(grpo.sbatch gives it when it runs without one); default none, the coordinator decides",
    )
    args = ap.parse_args()
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    node = os.environ.get("SLURMD_NODENAME", "?")
    # The drop-in logs what it decides without the coordinator (WARNING).
    logging.basicConfig(level=logging.WARNING, format=f"rank {rank} on {node}: %(levelname)s %(message)s")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=args.collective_timeout),
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    # Registers this rank (SLURM_PROCID) with the run in SNAPCOORD_*; without
    # them it decides by NeMo RL's rule from --timeout, and the steps count
    # from the newest checkpoint on disk, as NeMo RL resumes on its own.
    checker = TimeoutChecker(timeout=args.timeout, fit_last_save_time=True)
    alone = checker.trainer is None
    if alone:
        checker.step = newest_checkpoint(args.checkpoint_dir, world)
    if checker.step:
        state = torch.load(checkpoint_path(args.checkpoint_dir, checker.step, rank))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    print(f"rank {rank} on {node}: starting at step {checker.step + 1}", flush=True)
    checker.start_iterations()
    waits: list[float] = []  # how long each decision took: the coordinator's cost per step
    try:
        while True:
            loss = train_step(checker.step + 1, rank, world, model, opt)
            time.sleep(args.iteration_seconds)  # the rollouts of an RL step
            checker.mark_iteration()
            step = checker.step
            t0 = time.monotonic()
            should_save = checker.check_save()
            waits.append(time.monotonic() - t0)
            if len(waits) == 1:
                print(f"rank {rank} on {node}: first decision at {time.time():.3f}", flush=True)
            some, every = answers(should_save)
            if alone:
                should_save = some  # each rank's own clock: the first to say save decides
            elif some != every:
                print(f"rank {rank} on {node}: step {step}: the ranks disagree on saving (this one: {should_save})", flush=True)
                return 2
            print(f"rank {rank} on {node}: step {step}: loss {loss:.4f}{', save and stop' if should_save else ''}", flush=True)
            if should_save or step % args.checkpoint_every == 0:
                t0 = time.monotonic()
                save(checkpoint_path(args.checkpoint_dir, step, rank), step, model, opt)
                checker.checkpoint_saved()
                print(f"rank {rank} on {node}: step {step}: checkpoint saved in {time.monotonic() - t0:.2f} s", flush=True)
            if should_save:
                print(f"rank {rank} on {node}: stopping after step {step}", flush=True)
                return 0
    except RunStopped as err:
        print(f"rank {rank} on {node}: {err}", flush=True)
        return 0
    finally:
        if waits:
            waits.sort()
            print(f"rank {rank} on {node}: decisions over {len(waits)} steps took median {waits[len(waits) // 2] * 1000:.1f} ms, "
                  f"max {waits[-1] * 1000:.1f} ms", flush=True)  # fmt: skip
        checker.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except snapcoord.SupersededError as err:
        print(f"trainer: {err}", file=sys.stderr)
        sys.exit(3)
