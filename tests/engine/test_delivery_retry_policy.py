"""The delivery retry knobs: backoff inside a cycle, retry cycles, the poison store, validation."""

from __future__ import annotations

import pytest

from wsrm_plugin.engine import RMPolicy


def schedule(policy: RMPolicy, now: float = 0.0) -> list[tuple[int, int, float | None, bool]]:
    """Every step from a fresh message to the poison store, each attempt failing at its due time."""
    steps, attempts, cycle = [], 0, 0
    while True:
        step = policy.after_failure(attempts, cycle, now)
        steps.append((step.attempts, step.cycle, step.next_attempt_at, step.poisoned))
        if step.poisoned:
            return steps
        attempts, cycle, now = step.attempts, step.cycle, step.next_attempt_at


def test_attempts_back_off_inside_a_cycle_and_cycles_are_separated_by_their_delay():
    policy = RMPolicy(max_delivery_attempts=3, delivery_retry_delay=1.0, delivery_retry_multiplier=2.0,
                      max_delivery_retry_delay=10.0, max_retry_cycles=1, retry_cycle_delay=100.0)
    assert schedule(policy) == [
        (1, 0, 1.0, False), (2, 0, 3.0, False),   # 1 s, then 2 s
        (0, 1, 103.0, False),                     # the first cycle is over: 100 s until the next
        (1, 1, 104.0, False), (2, 1, 106.0, False),
        (6, 2, None, True),                       # 6 attempts in 2 cycles: the poison store
    ]


def test_the_delay_inside_a_cycle_is_capped_and_one_cycle_can_be_all():
    policy = RMPolicy(max_delivery_attempts=6, delivery_retry_delay=1.0, delivery_retry_multiplier=3.0,
                      max_delivery_retry_delay=5.0, max_retry_cycles=0)
    assert [policy.delivery_retry_delay_after(n) for n in range(1, 6)] == [1.0, 3.0, 5.0, 5.0, 5.0]
    assert schedule(policy)[-1] == (6, 1, None, True)
    assert schedule(RMPolicy(max_delivery_attempts=1, max_retry_cycles=0)) == [(1, 1, None, True)]


def test_the_defaults_follow_wcf_three_cycles_and_hold_the_sequence():
    policy = RMPolicy()
    assert (policy.max_delivery_attempts, policy.max_retry_cycles, policy.poison_handling) == (3, 2, "hold")
    assert policy.holds_on_poison and not RMPolicy(poison_handling="continue").holds_on_poison
    assert schedule(policy)[-1][:2] == (9, 3)


@pytest.mark.parametrize("bad,match", [
    (dict(max_retry_cycles=-1), "max_retry_cycles"),
    (dict(max_retry_cycles=1.5), "max_retry_cycles"),
    (dict(retry_cycle_delay=-1), "retry_cycle_delay"),
    (dict(delivery_retry_delay=-0.1), "delivery_retry_delay"),
    (dict(delivery_retry_delay=20.0), "max_delivery_retry_delay"),
    (dict(delivery_retry_multiplier=0.5), "delivery_retry_multiplier"),
    (dict(poison_handling="drop"), "poison_handling"),
    (dict(max_delivery_attempts=0), "max_delivery_attempts"),
])
def test_nonsense_knobs_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        RMPolicy(**bad)
