"""Who sends a source sequence's messages: every (state, event) pair, and reachability.

The rule that matters: a caller's thread sends its own request only on an idle lane (no round,
no other caller); a round may start while a caller's request is out (the caller's message is
claimed in the store, so the round cannot send it too)."""

from __future__ import annotations

import pytest

from wsrm_plugin.statemachine import LaneEvent, LaneState, Reason, lane_transition, transition

from .helpers import NOOP, cells, check_cell, reachable

BUSY = Reason.LANE_BUSY

TABLE = {
    "-": {
        "ROUND_CLAIMED": ("RND", []),
        "ROUND_ENDED": NOOP,
        "CALLER_CLAIMS": ("CLR", ["SEND_FROM_CALLER"]),
        "CALLER_ENDED": Reason.UNEXPECTED,
    },
    "RND": {
        "ROUND_CLAIMED": NOOP,
        "ROUND_ENDED": ("-", []),
        "CALLER_CLAIMS": BUSY,  # its request goes with the round, which its commit woke
        "CALLER_ENDED": Reason.UNEXPECTED,
    },
    "CLR": {
        "ROUND_CLAIMED": ("RND CLR", []),  # other messages of the sequence, never the caller's
        "ROUND_ENDED": NOOP,
        "CALLER_CLAIMS": BUSY,  # one caller's request at a time
        "CALLER_ENDED": ("-", ["SETTLE"]),
    },
    "RND CLR": {
        "ROUND_CLAIMED": NOOP,
        "ROUND_ENDED": ("CLR", []),
        "CALLER_CLAIMS": BUSY,
        "CALLER_ENDED": ("RND", ["SETTLE"]),
    },
}


def test_the_table_covers_every_state_and_event():
    assert {LaneState.of(label) for label in TABLE} == set(LaneState.valid_states())
    for row in TABLE.values():
        assert set(row) == {e.name for e in LaneEvent}


@pytest.mark.parametrize("label, event, expected", cells(TABLE, LaneEvent), ids=str)
def test_transition(label, event, expected):
    check_cell(LaneState, lane_transition, label, event, expected)
    check_cell(LaneState, transition, label, event, expected)  # the generic entry point agrees


def test_every_state_is_reachable_from_idle():
    assert reachable({LaneState.initial()}, lane_transition, LaneEvent) == set(LaneState.valid_states())


def test_only_an_idle_lane_lets_a_caller_send():
    for state in LaneState.valid_states():
        assert state.idle == (state == LaneState.initial())


def test_an_unknown_event_is_a_type_error():
    with pytest.raises(TypeError, match="not a LaneEvent"):
        lane_transition(LaneState(), "CALLER_CLAIMS")  # type: ignore[arg-type]
