#!/usr/bin/env python3
"""One trainer rank of the Slurm recipe (docs/slurm.md), a stand-in for a
real training loop: each step sleeps like an iteration, every
--checkpoint-every steps it writes a checkpoint, and after every step it asks
the coordinator whether there is time for another. At SAVE_AND_STOP it saves
the step it was told and stops.

It resumes from the newest checkpoint all ranks wrote (a requeued job starts
again from there). The coordinator and the run come from the SNAPCOORD_*
variables that `snapctl run create` exported, the rank from SLURM_PROCID.
Exits 0 once the run told it to stop, 3 if another process took its rank.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import snapcoord
from snapcoord import Phase


def latest_complete(directory: Path, world: int) -> int:
    """The newest step every rank saved, 0 if none."""
    steps = [int(p.name[5:]) for p in directory.glob("step_*") if p.name[5:].isdigit()]
    for step in sorted(steps, reverse=True):
        if all((directory / f"step_{step}" / f"rank-{r}.json").exists() for r in range(world)):
            return step
    return 0


def save(directory: Path, rank: int, step: int, seconds: float) -> float:
    """Writes step_N/rank-R.json atomically, taking about `seconds`."""
    t0 = time.monotonic()
    path = directory / f"step_{step}" / f"rank-{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    time.sleep(seconds)  # a real checkpoint's writes
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "rank": rank}))
    os.replace(tmp, path)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint-dir", type=Path, required=True)
    ap.add_argument("--iteration-seconds", type=float, default=3.0)
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--checkpoint-seconds", type=float, default=0.5)
    args = ap.parse_args()
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])

    step = latest_complete(args.checkpoint_dir, world) + 1
    print(f"rank {rank}: starting at step {step}", flush=True)
    with snapcoord.connect() as client, client.trainer(rank) as trainer:
        while True:
            t0 = time.monotonic()
            time.sleep(args.iteration_seconds)  # rollouts and a policy update
            decision = trainer.complete_step(step, time.monotonic() - t0)
            print(f"rank {rank}: step {step}: {decision.action.name}", flush=True)
            if decision.should_save or (step % args.checkpoint_every == 0 and not decision.should_stop):
                took = save(args.checkpoint_dir, rank, step, args.checkpoint_seconds)
                trainer.report_checkpoint(step, Phase.SAVED, took)
                print(f"rank {rank}: step {step}: checkpoint saved in {took:.2f} s", flush=True)
            if decision.should_stop:
                print(f"rank {rank}: stopping after step {step}", flush=True)
                return 0
            step += 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except snapcoord.SupersededError as err:
        print(f"trainer: {err}", file=sys.stderr)
        sys.exit(3)
