"""Peer reachability: every factor combination, every (state, event) pair, reachability, duties,
and the rule that turns failures into DOWN."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wsrm_plugin.statemachine import (
    InvalidState,
    InvalidTransition,
    PeerDuty,
    PeerEvent,
    PeerState,
    Reason,
    duties,
    peer_duties,
    peer_failure,
    peer_transition,
    transition,
)

from .helpers import NOOP, cells, check_cell, reachable

VALID = ["-", "FLG", "FLG UNR", "FLG UNR PRB"]
UNEXPECTED = Reason.UNEXPECTED

TABLE = {
    "-": {
        "ANSWERED": NOOP,
        "FAILED": ("FLG", []),
        "DOWN": ("FLG UNR", ["MARK_UNREACHABLE"]),
        "PROBE_DUE": UNEXPECTED,
        "PROBE_FAILED": ("FLG", []),  # reopened while the probe was out: a failure like any other
    },
    "FLG": {
        "ANSWERED": ("-", []),
        "FAILED": NOOP,
        "DOWN": ("FLG UNR", ["MARK_UNREACHABLE"]),
        "PROBE_DUE": UNEXPECTED,
        "PROBE_FAILED": NOOP,
    },
    "FLG UNR": {
        "ANSWERED": ("-", ["MARK_REACHABLE"]),
        "FAILED": NOOP,  # an exchange begun before the peer was judged down
        "DOWN": NOOP,
        "PROBE_DUE": ("FLG UNR PRB", ["SEND_PROBE"]),
        "PROBE_FAILED": NOOP,
    },
    "FLG UNR PRB": {
        "ANSWERED": ("-", ["MARK_REACHABLE"]),
        "FAILED": NOOP,  # not the probe: it decides
        "DOWN": NOOP,
        "PROBE_DUE": UNEXPECTED,  # one probe at a time
        "PROBE_FAILED": ("FLG UNR", ["BACK_OFF"]),
    },
}


@pytest.mark.parametrize("factors", list(PeerState.combinations()),
                         ids=lambda c: "".join("1" if v else "0" for v in c.values()))
def test_every_combination_is_accepted_exactly_when_valid(factors):
    if factors in [PeerState.of(label).factors() for label in VALID]:
        assert PeerState.is_valid(**factors)
        assert PeerState(**factors).factors() == factors
    else:
        assert not PeerState.is_valid(**factors)
        assert PeerState.broken_rules(**factors)
        with pytest.raises(InvalidState):
            PeerState(**factors)


def test_four_of_eight_combinations_are_states():
    assert len(list(PeerState.combinations())) == 8
    assert set(PeerState.valid_states()) == {PeerState.of(label) for label in VALID}


def test_the_table_covers_every_state_and_event():
    assert {PeerState.of(label) for label in TABLE} == set(PeerState.valid_states())
    for row in TABLE.values():
        assert set(row) == {e.name for e in PeerEvent}


@pytest.mark.parametrize("label, event, expected", cells(TABLE, PeerEvent), ids=str)
def test_transition(label, event, expected):
    check_cell(PeerState, peer_transition, label, event, expected)
    check_cell(PeerState, transition, label, event, expected)  # the generic entry point agrees


def test_every_valid_state_is_reachable_and_every_reachable_state_is_valid():
    assert reachable({PeerState.initial()}, peer_transition, PeerEvent) == set(PeerState.valid_states())


@pytest.mark.parametrize("label, expected", [
    ("-", {PeerDuty.SEND}),
    ("FLG", {PeerDuty.SEND}),  # failing is not yet down: every sequence keeps its own timers
    ("FLG UNR", {PeerDuty.PROBE}),
    ("FLG UNR PRB", set()),  # the probe is out: its outcome decides
])
def test_duties(label, expected):
    state = PeerState.of(label)
    assert peer_duties(state) == expected
    assert duties(state) == expected
    assert state.sending == (PeerDuty.SEND in expected)


def test_an_unknown_event_is_a_type_error():
    with pytest.raises(TypeError, match="not a PeerEvent"):
        peer_transition(PeerState(), "ANSWERED")  # type: ignore[arg-type]


@pytest.mark.parametrize("failures, seconds, expected", [
    (1, 0.0, "FAILED"),
    (1, 100.0, "FAILED"),   # one failure, however long ago the last answer: loss, not an outage
    (3, 0.0, "FAILED"),     # three lanes meeting the same refused port at once: one event
    (3, 2.9, "FAILED"),
    (3, 3.0, "DOWN"),
    (50, 3.5, "DOWN"),
    (2, 50.0, "FAILED"),
])
def test_failures_become_down_with_enough_of_them_over_enough_time(failures, seconds, expected):
    result = peer_failure(PeerState.of("FLG"), failures_in_row=failures, failing_for=seconds, threshold=3, after=3.0)
    assert result.state == (PeerState.of("FLG UNR") if expected == "DOWN" else PeerState.of("FLG"))


def test_peer_failure_refuses_a_meaningless_rule():
    with pytest.raises(ValueError, match="threshold"):
        peer_failure(PeerState(), failures_in_row=1, failing_for=0, threshold=0, after=1)


@given(st.lists(st.sampled_from(list(PeerEvent)), max_size=60))
def test_one_probe_at_a_time_and_only_to_an_unreachable_peer(events):
    """Whatever happens, a probe is only sent from UNR without PRB, and an answer always ends
    the outage (MARK_REACHABLE exactly when it was unreachable)."""
    state = PeerState.initial()
    probes_out = 0
    for event in events:
        try:
            result = peer_transition(state, event)
        except InvalidTransition as error:
            assert event is PeerEvent.PROBE_DUE and not (state.unreachable and not state.probing)
            assert error.state == state
            continue
        names = [a.name for a in result.actions]
        if "SEND_PROBE" in names:
            assert probes_out == 0
            probes_out += 1
        if result.state.probing is False:
            probes_out = 0
        if event is PeerEvent.ANSWERED:
            assert result.state == PeerState()
            assert ("MARK_REACHABLE" in names) == state.unreachable
        state = result.state
