"""Which calls are retried, and how: the Python twin of the Go client's retry.go.

``RETRIED_METHODS`` must list exactly the methods of the Go client's
``retried`` map; ``client/retry_python_test.go`` fails when the two disagree.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# The unary methods that are safe to repeat when their reply was lost, and
# so are retried on UNAVAILABLE. Why each is safe is said next to the Go list
# (client/retry.go). Deliberately absent: TriggerDeadline (a retry after a
# lost reply may answer "already fired" for a call that worked) and the
# streams StreamCommands and WatchRun, which resume from their last sequence
# number instead of being re-sent.
RETRIED_METHODS: frozenset[str] = frozenset(
    {
        "/snapcoord.v1.RunService/GetRun",
        "/snapcoord.v1.RunService/ListRuns",
        "/snapcoord.v1.RunService/ListWorkers",
        "/snapcoord.v1.RunService/ListSnapshots",
        "/snapcoord.v1.RunService/UpdateDeadline",
        "/snapcoord.v1.RunService/CancelRun",
        "/snapcoord.v1.RunService/CreateRun",
        "/snapcoord.v1.WorkerService/RegisterWorker",
        "/snapcoord.v1.WorkerService/Heartbeat",
        "/snapcoord.v1.WorkerService/DeregisterWorker",
        "/snapcoord.v1.WorkerService/CompleteStep",
        "/snapcoord.v1.WorkerService/ReportCheckpoint",
        "/snapcoord.v1.WorkerService/ReportSnapshot",
        "/snapcoord.v1.WorkerService/FinishRun",
        "/snapcoord.v1.WorkerService/PollCommands",
    }
)

# A worker re-opens its command stream (or polls again) at most this far
# apart, whatever RetryPolicy.max_delay says: a command issued as a restarted
# coordinator comes back (a deadline firing then) must reach it within about
# a second. The channel reconnects as often (client.py).
FOLLOW_MAX_WAIT = 1.0


@dataclass(frozen=True)
class RetryPolicy:
    """How the calls in ``RETRIED_METHODS`` are retried.

    Only on UNAVAILABLE (the coordinator is unreachable, restarting or
    shutting down), with exponential backoff and jitter, until
    ``max_attempts`` or the call's deadline. Not retried: RESOURCE_EXHAUSTED
    (a limit does not lift by itself), DEADLINE_EXCEEDED (the caller's own
    deadline) and every other code, which a repeat would only answer again.

    The default waits 0.1, 0.2, 0.4 ... 5 s between 10 attempts: about 20 s,
    enough to ride out a coordinator restart.
    """

    #: Counts the first attempt: 1 disables retries.
    max_attempts: int = 10
    #: The first wait in seconds; each further wait doubles, up to max_delay.
    base_delay: float = 0.1
    max_delay: float = 5.0
    #: Spreads each wait by +- this fraction, so the ranks of a job that lost
    #: the coordinator together do not come back together.
    jitter: float = 0.2

    def backoff(self, attempt: int) -> float:
        """The wait in seconds before retry number ``attempt`` (from 1)."""
        delay = min(self.base_delay * (1 << (attempt - 1)), self.max_delay)
        return delay * (1 + self.jitter * (2 * random.random() - 1))

    def follow_wait(self, failures: int) -> float:
        """The wait after ``failures`` failed attempts in a row to follow commands."""
        return min(self.backoff(failures), FOLLOW_MAX_WAIT)


DEFAULT_RETRY = RetryPolicy()
