"""snapcoord: the Python client of the snapcoord coordinator.

The coordinator makes a training run save its trainer checkpoint and its
environment snapshot before the walltime runs out. This package gives a
training loop and its environment workers what the Go client gives Go
programs:

* ``connect()`` - a connection with tokens, TLS, per-call deadlines and
  retries (the ``SNAPCOORD_*`` variables of snapctl);
* ``Trainer`` - one per rank: ``complete_step`` returns the step's decision,
  ``report_checkpoint`` reports the save;
* ``EnvWorker`` - an environment worker: snapshot commands, by iterator or
  callback, reports retried until answered;
* ``snapcoord.nemo_rl.TimeoutChecker`` - a drop-in for NeMo RL's.

Failures raise ``SnapcoordError`` subclasses (``snapcoord.errors``).
"""

import logging

from snapcoord._retry import DEFAULT_RETRY, RETRIED_METHODS, RetryPolicy
from snapcoord._version import __version__
from snapcoord.client import TLS, Client, connect, read_token_file
from snapcoord.env_worker import EnvWorker, SnapshotResult
from snapcoord.errors import (
    AuthError,
    ConflictError,
    InvalidInputError,
    LimitError,
    NotFoundError,
    OutcomeUnknownError,
    RunEndedError,
    SnapcoordError,
    SupersededError,
    UnavailableError,
    UnknownActionError,
)
from snapcoord.trainer import Trainer
from snapcoord.types import Action, Command, CommandKind, Decision, Inputs, Outcome, Phase, RunState

__all__ = [
    "DEFAULT_RETRY",
    "RETRIED_METHODS",
    "TLS",
    "Action",
    "AuthError",
    "Client",
    "Command",
    "CommandKind",
    "ConflictError",
    "Decision",
    "EnvWorker",
    "Inputs",
    "InvalidInputError",
    "LimitError",
    "NotFoundError",
    "Outcome",
    "OutcomeUnknownError",
    "Phase",
    "RetryPolicy",
    "RunEndedError",
    "RunState",
    "SnapcoordError",
    "SnapshotResult",
    "SupersededError",
    "Trainer",
    "UnavailableError",
    "UnknownActionError",
    "__version__",
    "connect",
    "read_token_file",
]

# A library logs only where the program asks it to (logging.basicConfig, or a
# handler on the "snapcoord" logger): reconnects and re-registrations are
# routine and must not print by themselves.
logging.getLogger("snapcoord").addHandler(logging.NullHandler())
