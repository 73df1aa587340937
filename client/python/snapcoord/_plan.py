"""The fail-safe plan: what a trainer rank decides on its own while it cannot
reach the coordinator (docs/design.md, "When a trainer cannot reach the
coordinator"). Pure: no gRPC, no clock of its own, so that every rank given
the same last decision decides the same step, and tests can say when "now" is.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from snapcoord.types import Decision


@dataclass(frozen=True)
class Plan:
    """Projects step ends from the last decision the rank received."""

    #: The last decision received from the coordinator: step s, decided at
    #: t0, with B, I, C, R and M.
    anchor: Decision
    #: W: how long the call that found the coordinator gone may have waited.
    wait: float
    #: P: how long each later step waits for the coordinator to answer again.
    probe: float

    def decide(self, step: int, saves_since: int, now: float) -> tuple[bool, str]:
        """Whether ``step`` (> the anchor's) must save and stop, and why.
        ``saves_since``: checkpoints this rank saved since the anchor (the
        ranks save the same steps, so they agree on it); ``now``: epoch
        seconds, used only when the projection has fallen behind the clock
        so far that the save itself no longer fits."""
        inputs, t0 = self.anchor.inputs, self.anchor.decided_at
        if inputs is None or inputs.must_save_by is None or t0 is None:
            return False, "the run has no deadline: continue"
        b = inputs.must_save_by.timestamp()
        i, c, r, m = inputs.iteration_seconds, inputs.checkpoint_seconds, inputs.save_reserve_seconds, inputs.margin_seconds
        ahead = step - self.anchor.step
        projected = t0.timestamp() + ahead * i + saves_since * c + self.wait + max(0, ahead - 1) * self.probe
        if projected + i + c + r + m >= b:
            return True, (
                f"step {step} projected to end by {_hms(projected)} (step {self.anchor.step}'s decision + {ahead} x I {i:.3g} s"
                f" + {saves_since} x C + waits): one more step and the save ({i + c + r + m:.3g} s) would pass B {_hms(b)}: save now"
            )
        if now + c + r + m >= b:
            return True, (
                f"steps ran slower than I = {i:.3g} s: at {_hms(now)} only the save ({c + r + m:.3g} s) still fits before B {_hms(b)}:"
                " save now, on this rank's own clock"
            )
        return False, f"step {step} projected to end by {_hms(projected)}; one more step and the save fit before B {_hms(b)}: continue"


def _hms(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%H:%M:%S")


def nemo_rule(elapsed: float, iteration_times: list[float], timeout_s: float, fit_last_save_time: bool) -> bool:
    """NeMo RL's own TimeoutChecker.check_save rule: save once the time since
    the checker was made, plus the mean iteration if fitting it, reaches the
    timeout."""
    if fit_last_save_time and iteration_times:
        if elapsed + sum(iteration_times) / len(iteration_times) >= timeout_s:
            return True
    return elapsed >= timeout_s

