#!/usr/bin/env python3
"""A toy GRPO-style training loop (no torch) that asks the coordinator after
every step whether to go on, and saves its checkpoint when told.

One process per trainer rank. The coordinator and the run come from the
SNAPCOORD_* variables (SNAPCOORD_ADDR, SNAPCOORD_RUN_ID, SNAPCOORD_RUN_TOKEN,
SNAPCOORD_PLAINTEXT or the TLS files; plaintext by default on loopback),
the rank from --rank or RANK / SLURM_PROCID:

    SNAPCOORD_RUN_ID=grpo-7b-0042 SNAPCOORD_RUN_TOKEN=... \\
        python3 toy_grpo.py --rank 0 --checkpoint-dir ckpt

It exits 0 once the run has stopped (after the deadline save, or after
--max-steps with FinishRun), 3 if another process took over its rank.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import snapcoord
from snapcoord import CommandKind, Phase


class ToyPolicy:
    """One logit per action of a 4-armed bandit, trained with GRPO's
    group-relative advantages: no critic, rewards normalised per prompt group."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.logits = [0.0] * 4
        self.best = 2  # the arm that pays

    def probs(self) -> list[float]:
        z = [math.exp(v) for v in self.logits]
        return [v / sum(z) for v in z]

    def step(self, group_size: int = 8, lr: float = 0.5) -> float:
        actions = self.rng.choices(range(4), weights=self.probs(), k=group_size)
        rewards = [1.0 if a == self.best else 0.0 for a in actions]
        mean = sum(rewards) / group_size
        std = (sum((r - mean) ** 2 for r in rewards) / group_size) ** 0.5 or 1.0
        probs = self.probs()
        for a, r in zip(actions, rewards):
            advantage = (r - mean) / std
            for i in range(4):  # gradient of log softmax
                self.logits[i] += lr / group_size * advantage * ((1.0 if i == a else 0.0) - probs[i])
        return mean

    def state(self) -> dict[str, object]:
        return {"logits": self.logits}


def save_checkpoint(directory: Path, rank: int, step: int, policy: ToyPolicy) -> float:
    """Writes step_N/rank-R.json atomically; returns how long it took."""
    t0 = time.monotonic()
    path = directory / f"step_{step}" / f"rank-{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, **policy.state()}))
    os.replace(tmp, path)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, default=int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))))
    ap.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    ap.add_argument("--save-period", type=int, default=5, help="save a checkpoint every this many steps")
    ap.add_argument("--step-seconds", type=float, default=0.5, help="simulated generation time per step")
    ap.add_argument("--max-steps", type=int, default=1_000_000)
    args = ap.parse_args()

    policy = ToyPolicy(seed=args.rank)
    with snapcoord.connect() as client, client.trainer(args.rank) as trainer:
        for step in range(1, args.max_steps + 1):
            t0 = time.monotonic()
            time.sleep(args.step_seconds)  # rollouts would be generated here
            reward = policy.step()
            decision = trainer.complete_step(step, time.monotonic() - t0)
            print(f"rank {args.rank} step {step}: reward {reward:.2f}, {decision.action.name}: {decision.explanation}", flush=True)
            if decision.should_save or (step % args.save_period == 0 and not decision.should_stop):
                took = save_checkpoint(args.checkpoint_dir, args.rank, step, policy)
                trainer.report_checkpoint(step, Phase.SAVED, took)
            if decision.should_stop:
                break
        else:
            trainer.finish_run()
        # Wait for the run to stop: after the deadline save, the environment
        # workers' snapshot comes first.
        for cmd in trainer.commands():
            if cmd.kind == CommandKind.STOP:
                print(f"rank {args.rank}: stopped: {cmd.stop_reason}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except snapcoord.SupersededError as err:
        print(f"toy_grpo: {err}", file=sys.stderr)
        sys.exit(3)
