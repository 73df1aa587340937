"""Which calls are retried, and how: the Python twin of the Go client's retry.go.

Which calls are safe to retry is not written here: the API declares it, in
the ``(snapcoord.v1.rpc)`` option of each RPC (proto/snapcoord/v1), and
``RETRIED_METHODS`` is read from the generated descriptors, as the Go client
reads its list (package internal/apifacts). ``client/retry_python_test.go`` checks
that both read the same methods.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from snapcoord.v1 import options_pb2, run_service_pb2, worker_service_pb2


def _retry_safe_methods() -> frozenset[str]:
    """The unary methods the API declares ``retry_safe``.

    Why each is safe to repeat when its reply was lost is said next to its
    option. A stream is never re-sent: it resumes from its last sequence
    number instead.
    """
    methods = set()
    for module in (run_service_pb2, worker_service_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                facts = method.GetOptions().Extensions[options_pb2.rpc]
                if facts.retry_safe and not (method.client_streaming or method.server_streaming):
                    methods.add(f"/{service.full_name}/{method.name}")
    return frozenset(methods)


def _methods_where(fact: str) -> frozenset[str]:
    """The methods (unary or not) whose ``(snapcoord.v1.rpc)`` option sets ``fact``."""
    return frozenset(
        f"/{service.full_name}/{method.name}"
        for module in (run_service_pb2, worker_service_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
        if getattr(method.GetOptions().Extensions[options_pb2.rpc], fact)
    )


# The unary methods that are safe to repeat when their reply was lost, and
# so are retried on UNAVAILABLE.
RETRIED_METHODS: frozenset[str] = _retry_safe_methods()

# The methods whose calls may rightly stay open long (the long poll, the
# streams): no attempt timeout bounds them.
LONG_LIVED_METHODS: frozenset[str] = _methods_where("long_lived")

# The methods that change nothing the coordinator keeps: an attempt of one
# that the client cut (the attempt timeout, a new leader) did nothing either,
# while one of any other may have been applied before the cut.
READ_ONLY_METHODS: frozenset[str] = _methods_where("read_only")

# A worker re-opens its command stream (or polls again) at most this far
# apart, whatever RetryPolicy.max_delay says: a command issued as a restarted
# coordinator comes back (a deadline firing then) must reach it within about
# a second. The channel reconnects more often still (client.py).
FOLLOW_MAX_WAIT = 1.0


@dataclass(frozen=True)
class RetryPolicy:
    """How the calls in ``RETRIED_METHODS`` are retried.

    Only on UNAVAILABLE (the coordinator is unreachable, restarting,
    shutting down, not the leader, or could not confirm the call's commit:
    reason OUTCOME_UNKNOWN, which the repeat resolves), with exponential
    backoff and jitter, until the call's deadline, or, for a call without
    one, ``max_attempts``. Not retried: RESOURCE_EXHAUSTED
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
    #: Bounds each attempt in seconds (not a long poll's), so that a call
    #: sent to a coordinator that froze is made again rather than wait out
    #: the pause: a running coordinator answers in milliseconds, and twice
    #: the default --election-ttl leaves a slow etcd commit alone. 0: none.
    attempt_timeout: float = 10.0

    def backoff(self, attempt: int) -> float:
        """The wait in seconds before retry number ``attempt`` (from 1)."""
        delay = min(self.base_delay * (1 << (attempt - 1)), self.max_delay)
        return delay * (1 + self.jitter * (2 * random.random() - 1))

    def follow_wait(self, failures: int) -> float:
        """The wait after ``failures`` failed attempts in a row to follow commands."""
        return min(self.backoff(failures), FOLLOW_MAX_WAIT)


DEFAULT_RETRY = RetryPolicy()
