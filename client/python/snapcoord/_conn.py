"""``Connection``: what a worker needs of a client, and nothing more.

``Client`` (client.py) builds one from its channel and hands it to the
workers it starts (trainer.py, env_worker.py, _worker.py), so that those
modules never import client.py and the package's imports form a tree.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import grpc

from snapcoord._retry import RetryPolicy


class Connection:
    """The stubs of one client's channel, with the settings its workers follow.

    Shared, not copied: a change to ``timeout`` (the NeMo RL drop-in clears
    its own after registering) applies to the workers started before it.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        *,
        runs: Any,
        workers: Any,
        workers_patient: Any,
        workers_once: Any,
        run_id: str,
        timeout: Optional[float],
        retry: RetryPolicy,
    ) -> None:
        self.channel = channel
        #: RunService and WorkerService, retried (see client._Retry).
        self.runs, self.workers = runs, workers
        #: WorkerService for Trainer's and EnvWorker's calls: retried until
        #: their timeout, if any, however many attempts.
        self.workers_patient = workers_patient
        #: WorkerService for a worker's periodic calls (heartbeats, polls,
        #: re-registration): not retried, waiting for the channel to be
        #: ready; the next tick is their retry.
        self.workers_once = workers_once
        #: The default run of the workers.
        self.run_id = run_id
        #: Default bound in seconds on each call with its retries; None: none.
        self.timeout = timeout
        self.retry = retry


class Connected(Protocol):
    """What ``Trainer`` and ``EnvWorker`` are created from: a ``Client``."""

    @property
    def connection(self) -> Connection: ...
