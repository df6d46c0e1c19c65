"""Invoker buffer: every factor combination, every (state, event) pair, reachability, duties."""

from __future__ import annotations

import pytest

from wsrm_plugin.statemachine import (
    InvalidState,
    InvokerDuty,
    InvokerEvent,
    InvokerState,
    Reason,
    duties,
    invoker_duties,
    invoker_transition,
    transition,
)

from .helpers import NOOP, cells, check_cell, reachable

SEED_VALID = ["-", "MIB", "MIB LMR", "LMR EMS"]
ENDED = ["END", "MIB END"]
VALID = SEED_VALID + ENDED

BUFFER = ["BUFFER_MESSAGE"]
EXCEEDED = Reason.LAST_MESSAGE_NUMBER_EXCEEDED
ENDED_R = Reason.DELIVERY_ENDED

TABLE = {
    "-": {"AMR": ("MIB", BUFFER), "LMR": ("MIB LMR", BUFFER), "SAM": NOOP, "END": ("END", [])},
    "MIB": {"AMR": ("MIB", BUFFER), "LMR": ("MIB LMR", BUFFER), "SAM": ("-", []), "END": ("MIB END", [])},
    "MIB LMR": {"AMR": EXCEEDED, "LMR": EXCEEDED, "SAM": ("LMR EMS", []), "END": NOOP},
    "LMR EMS": {"AMR": EXCEEDED, "LMR": EXCEEDED, "SAM": NOOP, "END": NOOP},
    "END": {"AMR": ENDED_R, "LMR": ENDED_R, "SAM": NOOP, "END": NOOP},
    "MIB END": {"AMR": ENDED_R, "LMR": ENDED_R, "SAM": ("END", []), "END": NOOP},
}


def test_the_seed_factors_give_four_states():
    seed = [c for c in InvokerState.combinations() if not c["ended"]]
    assert len(seed) == 8
    valid = {InvokerState(**c) for c in seed if InvokerState.is_valid(**c)}
    assert valid == {InvokerState.of(label) for label in SEED_VALID}


@pytest.mark.parametrize("factors", list(InvokerState.combinations()), ids=lambda c: "".join("1" if v else "0" for v in c.values()))
def test_every_combination_is_accepted_exactly_when_valid(factors):
    if factors in [InvokerState.of(label).factors() for label in VALID]:
        assert InvokerState(**factors).factors() == factors
    else:
        assert not InvokerState.is_valid(**factors)
        with pytest.raises(InvalidState):
            InvokerState(**factors)


def test_the_table_covers_every_state_and_event():
    assert {InvokerState.of(label) for label in TABLE} == set(InvokerState.valid_states())
    for row in TABLE.values():
        assert set(row) == {e.name for e in InvokerEvent}


@pytest.mark.parametrize("label, event, expected", cells(TABLE, InvokerEvent), ids=str)
def test_transition(label, event, expected):
    check_cell(InvokerState, invoker_transition, label, event, expected)
    check_cell(InvokerState, transition, label, event, expected)


def test_every_valid_state_is_reachable_and_every_reachable_state_is_valid():
    reached = reachable({InvokerState.initial()}, invoker_transition, InvokerEvent)
    assert reached == {InvokerState.of(label) for label in VALID}


DUTIES = {
    "-": set(),
    "MIB": {InvokerDuty.DELIVER},
    "MIB LMR": {InvokerDuty.DELIVER},
    "MIB END": {InvokerDuty.DELIVER},
    "LMR EMS": {InvokerDuty.RELEASE},
    "END": {InvokerDuty.RELEASE},
}


@pytest.mark.parametrize("label", VALID)
def test_duties(label):
    assert invoker_duties(InvokerState.of(label)) == DUTIES[label]
    assert duties(InvokerState.of(label)) == DUTIES[label]


def test_generic_entry_points_refuse_foreign_objects():
    with pytest.raises(TypeError, match="no state machine"):
        transition("RMS[SS]", InvokerEvent.AMR)
    with pytest.raises(TypeError, match="no state machine"):
        duties(42)
    with pytest.raises(TypeError, match="not an InvokerEvent"):
        invoker_transition(InvokerState(), "AMR")
