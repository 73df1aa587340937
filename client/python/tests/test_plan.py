"""The fail-safe plan, alone: what a rank decides without the coordinator."""

from __future__ import annotations

import datetime

from snapcoord._plan import Plan
from snapcoord.types import Action, Decision, Inputs
from snapcoord.v1 import event_pb2

T0 = 1_800_000_000.0


def anchor(step: int, at: float, b: float, i: float = 10.0, c: float = 5.0, r: float = 3.0, m: float = 2.0) -> Decision:
    utc = datetime.timezone.utc
    inputs = Inputs(datetime.datetime.fromtimestamp(b, utc), i, c, r, m, None)
    return Decision(step, Action.CONTINUE, "", inputs, datetime.datetime.fromtimestamp(at, utc), event_pb2.Decision())


def first_save(plan: Plan, saves_after: frozenset[int] = frozenset()) -> int:
    saves = 0
    for step in range(plan.anchor.step + 1, plan.anchor.step + 1000):
        if plan.decide(step, saves, now=0.0)[0]:
            return step
        saves += step in saves_after
    raise AssertionError("never saves")


def test_the_projection_is_the_coordinators_rule_a_step_at_a_time() -> None:
    # Step 5 decided at T0, B 200 s on; I + C + R + M = 20 s, W = 5 s, P = 1 s.
    plan = Plan(anchor(5, T0, T0 + 200), wait=5.0, probe=1.0)
    # Step 5 + k ends by T0 + 10k + 5 + (k - 1): it saves once that plus
    # 20 s reaches B, i.e. 11k + 24 >= 200: k = 16.
    assert first_save(plan) == 21
    assert not plan.decide(20, 0, now=0.0)[0]


def test_ranks_on_the_same_decision_save_at_the_same_step_whatever_their_clocks() -> None:
    d = anchor(7, T0, T0 + 300)
    fast, slow = Plan(d, 5.0, 0.5), Plan(d, 5.0, 0.5)
    for step in range(8, 40):
        # Clocks up to a second apart, and behind the projection: only the
        # shared decision counts.
        assert fast.decide(step, 0, now=T0 + 1)[0] == slow.decide(step, 0, now=T0)[0]


def test_checkpoints_saved_since_the_anchor_bring_the_save_earlier() -> None:
    plan = Plan(anchor(0, T0, T0 + 400), 0.0, 0.0)
    assert first_save(plan, frozenset({5, 10, 15, 20, 25, 30})) < first_save(plan)


def test_the_clock_wins_only_when_the_save_itself_no_longer_fits() -> None:
    plan = Plan(anchor(1, T0, T0 + 1000), 0.0, 0.0)
    save, why = plan.decide(2, 0, now=T0 + 1000 - 10 + 0.5)  # C + R + M = 10 s
    assert save and "own clock" in why
    assert not plan.decide(2, 0, now=T0 + 1000 - 10 - 0.5)[0]


def test_no_deadline_means_continue() -> None:
    d = Decision(3, Action.CONTINUE, "", None, None, event_pb2.Decision())
    assert Plan(d, 5.0, 0.5).decide(4, 0, now=T0) == (False, "the run has no deadline: continue")
