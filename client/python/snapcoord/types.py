"""Enums and plain records of the API, for type hints without protobuf.

Each enum's values are the protobuf enum's, so ``Action(resp.action)`` works;
every record keeps the protobuf message it came from in ``proto``.
"""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass, field
from typing import Any, Optional

from google.protobuf import timestamp_pb2

from snapcoord.errors import UnknownActionError
from snapcoord.v1 import event_pb2, options_pb2, run_pb2, worker_pb2, worker_service_pb2


class Action(enum.IntEnum):
    """What a trainer rank does after a step (``StepAction``)."""

    CONTINUE = event_pb2.STEP_ACTION_CONTINUE
    #: Save the checkpoint of this step, report it, then stop.
    SAVE_AND_STOP = event_pb2.STEP_ACTION_SAVE_AND_STOP
    #: Stop without saving: the deadline already fired, or the run is over.
    STOP = event_pb2.STEP_ACTION_STOP
    #: A safety save: save the checkpoint of this step, report it, then keep
    #: training (only in runs with ``reserve.safety_saves``).
    SAVE_AND_CONTINUE = event_pb2.STEP_ACTION_SAVE_AND_CONTINUE


# The RunState values the API declares terminal (their ``(snapcoord.v1.terminal)``
# option, as the server and the Go client read it).
_TERMINAL_STATES: frozenset[int] = frozenset(
    v.number for v in run_pb2.RunState.DESCRIPTOR.values if v.GetOptions().Extensions[options_pb2.terminal]
)


class RunState(enum.IntEnum):
    """Where a run is in its life (``RunState``)."""

    UNSPECIFIED = run_pb2.RUN_STATE_UNSPECIFIED
    PENDING = run_pb2.RUN_STATE_PENDING
    RUNNING = run_pb2.RUN_STATE_RUNNING
    SAVING = run_pb2.RUN_STATE_SAVING
    SNAPSHOTTING = run_pb2.RUN_STATE_SNAPSHOTTING
    STOPPED = run_pb2.RUN_STATE_STOPPED
    COMPLETED = run_pb2.RUN_STATE_COMPLETED
    FAILED = run_pb2.RUN_STATE_FAILED
    CANCELLED = run_pb2.RUN_STATE_CANCELLED

    @property
    def terminal(self) -> bool:
        """STOPPED, COMPLETED, FAILED and CANCELLED: the run is over."""
        return self.value in _TERMINAL_STATES


class Phase(enum.IntEnum):
    """A trainer checkpoint's progress (``CheckpointPhase``)."""

    #: This rank's shard is written (tmp_step_N).
    SAVED = worker_service_pb2.CHECKPOINT_PHASE_SAVED
    #: The checkpoint is visible (step_N); only with deferred finalize.
    PUBLISHED = worker_service_pb2.CHECKPOINT_PHASE_PUBLISHED


class Outcome(enum.IntEnum):
    """How an environment snapshot ended on a worker (``SnapshotOutcome``)."""

    SAVED = worker_pb2.SNAPSHOT_OUTCOME_SAVED
    #: Nothing new to save (not for a forced snapshot).
    SKIPPED = worker_pb2.SNAPSHOT_OUTCOME_SKIPPED
    #: A retryable failure (disk, network).
    IO_ERROR = worker_pb2.SNAPSHOT_OUTCOME_IO_ERROR
    #: The environment state is inconsistent: this fails the run.
    INVARIANT_FAILURE = worker_pb2.SNAPSHOT_OUTCOME_INVARIANT_FAILURE
    #: Not finished in time.
    TIMEOUT = worker_pb2.SNAPSHOT_OUTCOME_TIMEOUT


class CommandKind(enum.Enum):
    """What a command asks for."""

    SAVE_AT_DEADLINE = "save_at_deadline"
    SNAPSHOT = "snapshot"
    PUBLISH_CHECKPOINT = "publish_checkpoint"
    STOP = "stop"
    #: A kind this version of the client does not know (a newer coordinator).
    UNKNOWN = "unknown"


def _time(ts: timestamp_pb2.Timestamp, present: bool) -> Optional[datetime.datetime]:
    return ts.ToDatetime(tzinfo=datetime.timezone.utc) if present else None


@dataclass(frozen=True)
class Inputs:
    """The estimates a decision was made from: B and I, C, R, M in seconds."""

    must_save_by: Optional[datetime.datetime]
    iteration_seconds: float
    checkpoint_seconds: float
    #: R, learned from the environment snapshots of the whole job.
    save_reserve_seconds: float
    margin_seconds: float
    #: B - (I + C + R + M): a step completing at or after this time saves.
    fires_at: Optional[datetime.datetime]

    @classmethod
    def from_proto(cls, d: run_pb2.Deadline) -> "Inputs":
        return cls(
            must_save_by=_time(d.must_save_by, d.HasField("must_save_by")),
            iteration_seconds=d.iteration_seconds,
            checkpoint_seconds=d.checkpoint_seconds,
            save_reserve_seconds=d.save_reserve_seconds,
            margin_seconds=d.margin_seconds,
            fires_at=_time(d.fires_at, d.HasField("fires_at")),
        )


@dataclass(frozen=True)
class Decision:
    """The coordinator's answer for one step, the same for every rank."""

    step: int
    action: Action
    #: The rule applied, in words: "now+I+C+R+M = ... < B = ...".
    explanation: str
    inputs: Optional[Inputs]
    decided_at: Optional[datetime.datetime]
    proto: event_pb2.Decision = field(repr=False, compare=False)

    @property
    def should_save(self) -> bool:
        """Save the checkpoint of this step now (and report it), then stop
        or, for a safety save (SAVE_AND_CONTINUE), keep training."""
        return self.action in (Action.SAVE_AND_STOP, Action.SAVE_AND_CONTINUE)

    @property
    def should_stop(self) -> bool:
        """Stop training after this step (saving first if should_save)."""
        return self.action in (Action.SAVE_AND_STOP, Action.STOP)

    @classmethod
    def from_response(cls, resp: worker_service_pb2.CompleteStepResponse) -> "Decision":
        d = resp.decision if resp.HasField("decision") else event_pb2.Decision(step=resp.step, action=resp.action, explanation=resp.explanation)
        try:
            action = Action(d.action)
        except ValueError:
            # A newer coordinator's action: never guess it means CONTINUE.
            raise UnknownActionError(d) from None
        return cls(
            step=d.step,
            action=action,
            explanation=d.explanation,
            inputs=Inputs.from_proto(d.inputs) if d.HasField("inputs") else None,
            decided_at=_time(d.decided_at, d.HasField("decided_at")),
            proto=d,
        )


_REASONS = {
    worker_pb2.SNAPSHOT_REASON_INTERVAL: "interval",
    worker_pb2.SNAPSHOT_REASON_TRAINER_CHECKPOINT: "trainer_checkpoint",
    worker_pb2.SNAPSHOT_REASON_MANUAL: "manual",
    worker_pb2.SNAPSHOT_REASON_DEADLINE: "deadline",
}


@dataclass(frozen=True)
class Command:
    """One command of the run's command log, delivered once per process.

    Snapshot commands (SAVE_AT_DEADLINE, SNAPSHOT) fill the snapshot fields,
    PUBLISH_CHECKPOINT fills ``step``, STOP fills ``stop_reason``.
    """

    seq: int
    kind: CommandKind
    issued_at: Optional[datetime.datetime]
    #: Quote it in the snapshot report.
    snapshot_id: str = ""
    #: "deadline", "trainer_checkpoint", "interval" or "manual".
    reason: str = ""
    #: The trainer step the snapshot belongs to (0: the bootstrap state).
    anchor_step: int = 0
    #: SKIPPED is not allowed for lack of changes (always at the deadline).
    forced: bool = False
    #: B, for SAVE_AT_DEADLINE.
    must_finish_by: Optional[datetime.datetime] = None
    #: The step to publish, for PUBLISH_CHECKPOINT.
    step: int = 0
    #: Why the run is over, for STOP.
    stop_reason: str = ""
    #: True for a SAVE_AT_DEADLINE the worker made itself: the backstop signal
    #: came and the coordinator could not be reached. Save as for the
    #: deadline, and do not report it: the coordinator issued no such snapshot.
    backstop: bool = False
    proto: Optional[worker_pb2.Command] = field(default=None, repr=False, compare=False)

    @property
    def is_snapshot(self) -> bool:
        """SAVE_AT_DEADLINE or SNAPSHOT: save the environment state and report it."""
        return self.kind in (CommandKind.SAVE_AT_DEADLINE, CommandKind.SNAPSHOT)

    @classmethod
    def from_proto(cls, c: worker_pb2.Command) -> "Command":
        common: dict[str, Any] = dict(seq=c.seq, issued_at=_time(c.issued_at, c.HasField("issued_at")), proto=c)
        which = c.WhichOneof("kind")
        if which == "save_at_deadline":
            s = c.save_at_deadline
            return cls(
                kind=CommandKind.SAVE_AT_DEADLINE, snapshot_id=s.snapshot_id, reason="deadline", anchor_step=s.anchor_step,
                forced=True, must_finish_by=_time(s.must_finish_by, s.HasField("must_finish_by")), **common,
            )
        if which == "snapshot":
            s = c.snapshot
            return cls(
                kind=CommandKind.SNAPSHOT, snapshot_id=s.snapshot_id, reason=_REASONS.get(s.reason, "unspecified"),
                anchor_step=s.anchor_step, forced=s.forced, **common,
            )
        if which == "publish_checkpoint":
            return cls(kind=CommandKind.PUBLISH_CHECKPOINT, step=c.publish_checkpoint.step, **common)
        if which == "stop":
            return cls(kind=CommandKind.STOP, stop_reason=c.stop.reason, **common)
        return cls(kind=CommandKind.UNKNOWN, **common)
