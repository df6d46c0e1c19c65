"""Table checking shared by the state machine tests.

Expected tables are written by hand in each test module, in the seed's
notation: a row per valid state (label), a cell per event holding either
NOOP, a Reason (the event is refused), or (new state label, action names).
"""

from __future__ import annotations

from collections import deque
from enum import Enum
from typing import Any, Callable, Iterable

import pytest

from wsrm_plugin.statemachine import InvalidTransition, Reason

NOOP = "noop"


def check_cell(state_cls: Any, fn: Callable, label: str, event: Enum, expected: Any) -> None:
    state = state_cls.of(label)
    if isinstance(expected, Reason):
        with pytest.raises(InvalidTransition) as info:
            fn(state, event)
        error = info.value
        assert error.reason is expected, f"{event.name} in {label}: {error}"
        assert error.state == state and error.event is event
        assert error.fault == expected.fault
        assert str(state) in str(error)
        return
    result = fn(state, event)
    assert result.previous == state
    if expected == NOOP:
        assert result.noop, f"{event.name} in {label} should change nothing, got {result}"
        assert result.state == state and result.actions == ()
        return
    new_label, action_names = expected
    assert result.state == state_cls.of(new_label), f"{event.name} in {label} -> {result.state}"
    assert tuple(a.name for a in result.actions) == tuple(action_names)
    assert not result.noop


def cells(table: dict[str, dict[str, Any]], events: type[Enum]) -> list[tuple[str, Enum, Any]]:
    """Flatten a table to (state label, event, expected) for parametrize."""
    return [(label, events[name], expected) for label, row in table.items() for name, expected in row.items()]


def reachable(initial: Iterable[Any], fn: Callable, events: type[Enum]) -> set[Any]:
    """Breadth-first search over every event from the initial states."""
    seen = set(initial)
    todo = deque(seen)
    while todo:
        state = todo.popleft()
        for event in events:
            try:
                new = fn(state, event).state
            except InvalidTransition:
                continue
            if new not in seen:
                seen.add(new)
                todo.append(new)
    return seen
