"""RMS sequence: every factor combination, every (state, event) pair, reachability, duties."""

from __future__ import annotations

import pytest

from wsrm_plugin.statemachine import (
    InvalidState,
    Reason,
    RMSDuty,
    RMSEvent,
    RMSState,
    duties,
    rms_duties,
    rms_transition,
    transition,
)

from .helpers import NOOP, cells, check_cell, reachable

SEED_VALID = ["MIB", "MIB LMR", "SS", "SS MIB", "SS MIB LMR", "SS LMR", "SS LMR TMS"]
CLOSED = ["SS LMR CLS", "SS LMR CLS TMS"]
FAULTED = ["FLT", "LMR FLT", "SS FLT", "SS LMR FLT", "SS LMR CLS FLT"]
VALID = SEED_VALID + CLOSED + FAULTED

UNKNOWN = Reason.UNKNOWN_SEQUENCE
EXCEEDED = Reason.LAST_MESSAGE_NUMBER_EXCEEDED
UNEXPECTED = Reason.UNEXPECTED
TERMINATED = Reason.SEQUENCE_TERMINATED
FAULTED_R = Reason.SEQUENCE_FAULTED

_terminated_row = {
    "CRR": NOOP, "AMR": TERMINATED, "LMR": NOOP, "ACKALL": NOOP, "ACK": NOOP,
    "CLOSE_RESPONSE": NOOP, "TERMINATE_SENT": NOOP, "FAULT": NOOP,
}
_faulted_row = {
    "CRR": NOOP, "AMR": FAULTED_R, "LMR": NOOP, "ACKALL": NOOP, "ACK": NOOP,
    "CLOSE_RESPONSE": NOOP, "TERMINATE_SENT": FAULTED_R, "FAULT": NOOP,
}

TABLE = {
    "MIB": {
        "CRR": ("SS MIB", ["RECORD_SEQUENCE"]),
        "AMR": ("MIB", ["BUFFER_MESSAGE"]),
        "LMR": ("MIB LMR", ["RECORD_LAST"]),
        "ACKALL": UNKNOWN, "ACK": UNKNOWN, "CLOSE_RESPONSE": UNKNOWN, "TERMINATE_SENT": UNKNOWN,
        "FAULT": ("FLT", ["REPORT_FAULT"]),
    },
    "MIB LMR": {
        "CRR": ("SS MIB LMR", ["RECORD_SEQUENCE"]),
        "AMR": EXCEEDED,
        "LMR": NOOP,
        "ACKALL": UNKNOWN, "ACK": UNKNOWN, "CLOSE_RESPONSE": UNKNOWN, "TERMINATE_SENT": UNKNOWN,
        "FAULT": ("LMR FLT", ["REPORT_FAULT"]),
    },
    "SS": {
        "CRR": NOOP,
        "AMR": ("SS MIB", ["BUFFER_MESSAGE"]),
        "LMR": ("SS LMR", ["RECORD_LAST"]),
        "ACKALL": NOOP, "ACK": NOOP,
        "CLOSE_RESPONSE": UNEXPECTED, "TERMINATE_SENT": UNEXPECTED,
        "FAULT": ("SS FLT", ["REPORT_FAULT"]),
    },
    "SS MIB": {
        "CRR": NOOP,
        "AMR": ("SS MIB", ["BUFFER_MESSAGE"]),
        "LMR": ("SS MIB LMR", ["RECORD_LAST"]),
        "ACKALL": ("SS", ["DISCARD_ACKED"]),
        "ACK": ("SS MIB", ["DISCARD_ACKED"]),
        "CLOSE_RESPONSE": UNEXPECTED, "TERMINATE_SENT": UNEXPECTED,
        "FAULT": ("SS FLT", ["REPORT_FAULT"]),
    },
    "SS MIB LMR": {
        "CRR": NOOP,
        "AMR": EXCEEDED,
        "LMR": NOOP,
        "ACKALL": ("SS LMR", ["DISCARD_ACKED"]),
        "ACK": ("SS MIB LMR", ["DISCARD_ACKED"]),
        "CLOSE_RESPONSE": UNEXPECTED, "TERMINATE_SENT": UNEXPECTED,
        "FAULT": ("SS LMR FLT", ["REPORT_FAULT"]),
    },
    "SS LMR": {
        "CRR": NOOP, "AMR": EXCEEDED, "LMR": NOOP, "ACKALL": NOOP, "ACK": NOOP,
        "CLOSE_RESPONSE": ("SS LMR CLS", []),
        "TERMINATE_SENT": ("SS LMR TMS", []),
        "FAULT": ("SS LMR FLT", ["REPORT_FAULT"]),
    },
    "SS LMR CLS": {
        "CRR": NOOP, "AMR": Reason.SEQUENCE_CLOSED, "LMR": NOOP, "ACKALL": NOOP, "ACK": NOOP,
        "CLOSE_RESPONSE": NOOP,
        "TERMINATE_SENT": ("SS LMR CLS TMS", []),
        "FAULT": ("SS LMR CLS FLT", ["REPORT_FAULT"]),
    },
    "SS LMR TMS": _terminated_row,
    "SS LMR CLS TMS": _terminated_row,
    **{label: _faulted_row for label in FAULTED},
}


def test_the_seed_factors_give_seven_states():
    seed = [c for c in RMSState.combinations() if not c["closed"] and not c["faulted"]]
    assert len(seed) == 16
    valid = {RMSState(**c) for c in seed if RMSState.is_valid(**c)}
    assert valid == {RMSState.of(label) for label in SEED_VALID}
    assert len(valid) == 7


@pytest.mark.parametrize("factors", list(RMSState.combinations()), ids=lambda c: "".join("1" if v else "0" for v in c.values()))
def test_every_combination_is_accepted_exactly_when_valid(factors):
    if factors in [RMSState.of(label).factors() for label in VALID]:
        assert RMSState.is_valid(**factors)
        assert RMSState(**factors).factors() == factors
    else:
        assert not RMSState.is_valid(**factors)
        assert RMSState.broken_rules(**factors)
        with pytest.raises(InvalidState):
            RMSState(**factors)


def test_valid_states_matches_the_list():
    assert set(RMSState.valid_states()) == {RMSState.of(label) for label in VALID}
    assert len(VALID) == 14


def test_the_table_covers_every_state_and_event():
    assert {RMSState.of(label) for label in TABLE} == {RMSState.of(label) for label in VALID}
    for row in TABLE.values():
        assert set(row) == {e.name for e in RMSEvent}


@pytest.mark.parametrize("label, event, expected", cells(TABLE, RMSEvent), ids=str)
def test_transition(label, event, expected):
    check_cell(RMSState, rms_transition, label, event, expected)
    check_cell(RMSState, transition, label, event, expected)  # the generic entry point agrees


def test_every_valid_state_is_reachable_and_every_reachable_state_is_valid():
    initial = {RMSState.initial(), RMSState.initial(offered=True)}
    assert initial == {RMSState.of("MIB"), RMSState.of("SS")}
    assert reachable(initial, rms_transition, RMSEvent) == {RMSState.of(label) for label in VALID}


def test_a_sequence_created_by_the_application_reaches_every_state():
    reached = reachable({RMSState.initial()}, rms_transition, RMSEvent)
    assert reached == {RMSState.of(label) for label in VALID}


SEND = {RMSDuty.SEND_MESSAGES}
RELEASE = {RMSDuty.RELEASE}
DUTIES = {  # label: (duties for WS-RM 1.0, duties for 1.1 which closes first)
    "MIB": ({RMSDuty.SEND_CREATE_SEQUENCE},) * 2,
    "MIB LMR": ({RMSDuty.SEND_CREATE_SEQUENCE},) * 2,
    "SS": (set(), set()),
    "SS MIB": (SEND, SEND),
    "SS MIB LMR": (SEND, SEND),
    "SS LMR": ({RMSDuty.SEND_TERMINATE}, {RMSDuty.SEND_CLOSE}),
    "SS LMR CLS": ({RMSDuty.SEND_TERMINATE}, {RMSDuty.SEND_TERMINATE}),
    "SS LMR TMS": (RELEASE, RELEASE),
    "SS LMR CLS TMS": (RELEASE, RELEASE),
    **{label: (RELEASE, RELEASE) for label in FAULTED},
}


@pytest.mark.parametrize("label", VALID)
def test_duties(label):
    state = RMSState.of(label)
    v10, v11 = DUTIES[label]
    assert rms_duties(state) == v10
    assert rms_duties(state, close_first=True) == v11
    assert duties(state, close_first=True) == v11


def test_refusals_name_the_fault_to_send():
    with pytest.raises(Exception) as info:
        rms_transition(RMSState.of("SS LMR CLS"), RMSEvent.AMR)
    assert info.value.fault == "SequenceClosed"
    with pytest.raises(Exception) as info:
        rms_transition(RMSState.of("MIB"), RMSEvent.ACKALL)
    assert info.value.fault == "UnknownSequence"
    with pytest.raises(Exception) as info:
        rms_transition(RMSState.of("SS FLT"), RMSEvent.AMR)
    assert info.value.fault is None and "start a new sequence" in str(info.value)


def test_states_are_built_from_the_seed_notation_and_printed_in_it():
    assert RMSState.of("SS+MIB") == RMSState(sequence_started=True, messages_in_buffer=True)
    assert str(RMSState.of("MIB LMR SS")) == "RMS[SS MIB LMR]"
    with pytest.raises(ValueError, match="unknown factor"):
        RMSState.of("SS XYZ")
    with pytest.raises(TypeError, match="must be a bool"):
        RMSState(sequence_started=1)
    with pytest.raises(TypeError, match="no factor"):
        RMSState.is_valid(started=True)
