#!/usr/bin/env python3
"""An environment worker in Python, without the sidecar: it holds unfinished
multi-turn episodes and snapshots them whenever the coordinator asks.

    SNAPCOORD_RUN_ID=grpo-7b-0042 SNAPCOORD_RUN_TOKEN=... \\
        python3 env_worker.py --name "$(hostname)-env0" --snapshot-dir snapshots

Each snapshot goes to SNAPSHOT_DIR/<snapshot id>/<name>.json, written
atomically. A snapshot that is not forced is SKIPPED when nothing changed
since the last one. It exits 0 after the run's Stop, or on SIGTERM / SIGINT
(deregistering, so that no snapshot waits for it), 3 if another process took
over its name.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import snapcoord
from snapcoord import Command, Outcome, SnapshotResult


class Environment:
    """Episodes in progress, advanced by a background thread (the rollouts)."""

    def __init__(self, episodes: int = 4) -> None:
        self.lock = threading.Lock()
        self.turns = {f"episode-{i}": 0 for i in range(episodes)}
        self.version = 0  # bumped on every change
        self.saved_version = -1

    def advance(self, stop: threading.Event, turn_seconds: float) -> None:
        while not stop.wait(turn_seconds):
            with self.lock:
                for episode in self.turns:
                    self.turns[episode] += 1
                self.version += 1

    def snapshot(self, directory: Path, name: str, cmd: Command) -> SnapshotResult:
        with self.lock:  # a consistent state: no turn advances while it is copied
            if not cmd.forced and self.version == self.saved_version:
                return SnapshotResult(Outcome.SKIPPED, "nothing changed")
            state, version = dict(self.turns), self.version
        path = directory / cmd.snapshot_id / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"anchor_step": cmd.anchor_step, "reason": cmd.reason, "turns": state}))
        os.replace(tmp, path)
        self.saved_version = version
        return SnapshotResult(Outcome.SAVED, str(path))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default=os.environ.get("SNAPCOORD_WORKER_NAME", socket.gethostname()))
    ap.add_argument("--snapshot-dir", type=Path, default=Path("snapshots"))
    ap.add_argument("--turn-seconds", type=float, default=0.2)
    ap.add_argument("--poll", action="store_true", help="long-poll for commands instead of streaming them")
    args = ap.parse_args()

    env, stop = Environment(), threading.Event()
    threading.Thread(target=env.advance, args=(stop, args.turn_seconds), daemon=True).start()
    # Slurm's end of job (SIGTERM): leave cleanly. close() ends run(). The
    # handler is in place before registering, so no signal is missed; it
    # runs on the main thread, as the lines after registering do.
    signalled = threading.Event()
    workers: list[snapcoord.EnvWorker] = []

    def leave(*_: object) -> None:
        signalled.set()
        for w in workers:
            threading.Thread(target=w.close).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, leave)
    with snapcoord.connect() as client, client.env_worker(args.name, poll=args.poll) as worker:
        workers.append(worker)
        if signalled.is_set():
            worker.close()
        reason = worker.run(on_snapshot=lambda cmd: env.snapshot(args.snapshot_dir, args.name, cmd))
        print(f"{args.name}: stopped: {reason or 'signalled'}", flush=True)
    stop.set()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except snapcoord.SupersededError as err:
        print(f"env_worker: {err}", file=sys.stderr)
        sys.exit(3)
