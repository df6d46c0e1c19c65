"""RMD sequence: every factor combination, every (state, event) pair, reachability, duties, rmd_receive."""

from __future__ import annotations

import pytest

from wsrm_plugin.statemachine import (
    MAX_MESSAGE_NUMBER,
    AckRanges,
    InvalidState,
    InvalidTransition,
    Reason,
    RMDDuty,
    RMDEvent,
    RMDState,
    duties,
    rmd_duties,
    rmd_receive,
    rmd_transition,
    transition,
)

from .helpers import NOOP, cells, check_cell, reachable

SEED_VALID = ["-", "FMR", "FMR LMR", "FMR LMR EMR", "FMR LMR EMR TMR"]
CLOSED = ["CLS", "FMR CLS", "FMR LMR CLS", "FMR LMR EMR CLS"]
TERMINATED_CLOSED = ["TMR CLS", "FMR TMR CLS", "FMR LMR TMR CLS", "FMR LMR EMR TMR CLS"]
VALID = SEED_VALID + CLOSED + TERMINATED_CLOSED

EXCEEDED = Reason.LAST_MESSAGE_NUMBER_EXCEEDED
UNKNOWN_LAST = Reason.LAST_MESSAGE_UNKNOWN
CLOSED_R = Reason.SEQUENCE_CLOSED
TERMINATED = Reason.SEQUENCE_TERMINATED

ACCEPT = "ACCEPT_MESSAGE"
LAST = "RECORD_LAST"
COMPLETE = "COMPLETE_DELIVERY"
END = "END_DELIVERY"
R_TERM = "REPLY_TERMINATE"
R_CLOSE = "REPLY_CLOSE"

_new_refused = lambda reason: {e: reason for e in ("AMR_SC", "AMR_SNC", "LMR_SC", "LMR_SNC")}  # noqa: E731


def _closed_row(label: str) -> dict:
    return {
        **_new_refused(CLOSED_R),
        "TMR": (label + " TMR", [R_TERM]),
        "DUPLICATE": NOOP if "FMR" in label else Reason.UNEXPECTED,
        "CLOSE_RECEIVED": (label, [R_CLOSE]),
        "INACTIVITY_TIMEOUT": (label + " TMR", []),
    }


def _terminated_row(label: str) -> dict:
    return {
        **_new_refused(TERMINATED),
        "TMR": (label, [R_TERM]),
        "DUPLICATE": TERMINATED,
        "CLOSE_RECEIVED": TERMINATED,
        "INACTIVITY_TIMEOUT": NOOP,
    }


TABLE = {
    "-": {
        "AMR_SC": UNKNOWN_LAST,
        "AMR_SNC": ("FMR", [ACCEPT]),
        "LMR_SC": ("FMR LMR EMR", [ACCEPT, LAST, COMPLETE]),
        "LMR_SNC": ("FMR LMR", [ACCEPT, LAST]),
        "TMR": ("TMR CLS", [R_TERM, END]),
        "DUPLICATE": Reason.UNEXPECTED,
        "CLOSE_RECEIVED": ("CLS", [R_CLOSE, END]),
        "INACTIVITY_TIMEOUT": ("TMR CLS", [END]),
    },
    "FMR": {
        "AMR_SC": UNKNOWN_LAST,
        "AMR_SNC": ("FMR", [ACCEPT]),
        "LMR_SC": ("FMR LMR EMR", [ACCEPT, LAST, COMPLETE]),
        "LMR_SNC": ("FMR LMR", [ACCEPT, LAST]),
        "TMR": ("FMR TMR CLS", [R_TERM, END]),
        "DUPLICATE": NOOP,
        "CLOSE_RECEIVED": ("FMR CLS", [R_CLOSE, END]),
        "INACTIVITY_TIMEOUT": ("FMR TMR CLS", [END]),
    },
    "FMR LMR": {
        "AMR_SC": ("FMR LMR EMR", [ACCEPT, COMPLETE]),
        "AMR_SNC": ("FMR LMR", [ACCEPT]),
        "LMR_SC": EXCEEDED,
        "LMR_SNC": EXCEEDED,
        "TMR": ("FMR LMR TMR CLS", [R_TERM, END]),
        "DUPLICATE": NOOP,
        "CLOSE_RECEIVED": ("FMR LMR CLS", [R_CLOSE, END]),
        "INACTIVITY_TIMEOUT": ("FMR LMR TMR CLS", [END]),
    },
    "FMR LMR EMR": {
        **_new_refused(EXCEEDED),
        "TMR": ("FMR LMR EMR TMR", [R_TERM]),
        "DUPLICATE": NOOP,
        "CLOSE_RECEIVED": ("FMR LMR EMR CLS", [R_CLOSE]),
        "INACTIVITY_TIMEOUT": ("FMR LMR EMR TMR", []),
    },
    **{label: _closed_row(label) for label in CLOSED},
    **{label: _terminated_row(label) for label in ["FMR LMR EMR TMR"] + TERMINATED_CLOSED},
}


def test_the_seed_factors_give_five_states():
    seed = [c for c in RMDState.combinations() if not c["closed"]]
    assert len(seed) == 16
    valid = {RMDState(**c) for c in seed if RMDState.is_valid(**c)}
    assert valid == {RMDState.of(label) for label in SEED_VALID}


@pytest.mark.parametrize("factors", list(RMDState.combinations()), ids=lambda c: "".join("1" if v else "0" for v in c.values()))
def test_every_combination_is_accepted_exactly_when_valid(factors):
    if factors in [RMDState.of(label).factors() for label in VALID]:
        assert RMDState.is_valid(**factors)
        assert RMDState(**factors).factors() == factors
    else:
        assert not RMDState.is_valid(**factors)
        with pytest.raises(InvalidState):
            RMDState(**factors)


def test_the_table_covers_every_state_and_event():
    assert len(VALID) == 13
    assert {RMDState.of(label) for label in TABLE} == set(RMDState.valid_states())
    for row in TABLE.values():
        assert set(row) == {e.name for e in RMDEvent}


@pytest.mark.parametrize("label, event, expected", cells(TABLE, RMDEvent), ids=str)
def test_transition(label, event, expected):
    check_cell(RMDState, rmd_transition, label, event, expected)
    check_cell(RMDState, transition, label, event, expected)


def test_every_valid_state_is_reachable_and_every_reachable_state_is_valid():
    assert RMDState.initial() == RMDState.of("-")
    assert reachable({RMDState.initial()}, rmd_transition, RMDEvent) == {RMDState.of(label) for label in VALID}


DUTIES = {
    "-": set(),
    "CLS": set(),
    **{label: {RMDDuty.SEND_ACK} for label in ["FMR", "FMR LMR", "FMR LMR EMR", "FMR CLS", "FMR LMR CLS", "FMR LMR EMR CLS"]},
    **{label: {RMDDuty.RELEASE} for label in ["FMR LMR EMR TMR"] + TERMINATED_CLOSED},
}


@pytest.mark.parametrize("label", VALID)
def test_duties(label):
    assert rmd_duties(RMDState.of(label)) == DUTIES[label]
    assert duties(RMDState.of(label)) == DUTIES[label]


# rmd_receive: the message-number bookkeeping that decides SC / SNC.

def receive_all(numbers, last):
    state, received, last_number = RMDState.initial(), AckRanges(), None
    events = []
    for n in numbers:
        r = rmd_receive(state, n, last=(n == last), received=received, last_number=last_number)
        state, received, last_number = r.transition.state, r.received, r.last_number
        events.append(r.event.name)
    return state, received, last_number, events


def test_in_order_sequence_completes_with_the_last_message():
    state, received, last, events = receive_all([1, 2, 3], last=3)
    assert events == ["AMR_SNC", "AMR_SNC", "LMR_SC"]
    assert state == RMDState.of("FMR LMR EMR") and received == AckRanges(((1, 3),)) and last == 3


def test_gap_filled_after_the_last_message_completes_with_an_application_message():
    state, received, last, events = receive_all([1, 3, 3, 2], last=3)
    assert events == ["AMR_SNC", "LMR_SNC", "DUPLICATE", "AMR_SC"]
    assert state == RMDState.of("FMR LMR EMR")


def test_single_message_sequence():
    state, _, last, events = receive_all([1], last=1)
    assert events == ["LMR_SC"] and last == 1 and state.every_message_received


def test_message_beyond_the_last_is_refused_with_last_message_number_exceeded():
    state, received, last, _ = receive_all([1, 2], last=2)
    with pytest.raises(InvalidTransition) as info:
        rmd_receive(state, 3, last=False, received=received, last_number=last)
    assert info.value.fault == "LastMessageNumberExceeded"
    state, received, last, _ = receive_all([1, 3], last=3)  # not complete yet, still beyond
    with pytest.raises(InvalidTransition) as info:
        rmd_receive(state, 4, last=False, received=received, last_number=last)
    assert info.value.reason is Reason.LAST_MESSAGE_NUMBER_EXCEEDED


def test_a_last_mark_below_messages_already_received_is_refused():
    state, received, last, _ = receive_all([1, 5], last=None)
    with pytest.raises(InvalidTransition, match="marked last"):
        rmd_receive(state, 3, last=True, received=received, last_number=last)
    state, received, last, _ = receive_all([1, 4], last=4)
    with pytest.raises(InvalidTransition, match="marked last") as info:
        rmd_receive(state, 2, last=True, received=received, last_number=last)
    assert info.value.fault == "LastMessageNumberExceeded"


def test_duplicate_last_message_is_a_no_op():
    state, received, last, _ = receive_all([1, 2], last=2)
    r = rmd_receive(state, 2, last=True, received=received, last_number=last)
    assert r.duplicate and r.transition.noop and r.received == received and r.last_number == 2


def test_after_close_new_messages_get_sequence_closed_and_duplicates_are_still_acked():
    state, received, last, _ = receive_all([1, 2], last=None)
    state = rmd_transition(state, RMDEvent.CLOSE_RECEIVED).state
    with pytest.raises(InvalidTransition) as info:
        rmd_receive(state, 3, last=False, received=received, last_number=last)
    assert info.value.fault == "SequenceClosed"
    with pytest.raises(InvalidTransition) as info:  # closed wins over "beyond the last"
        rmd_receive(state, 9, last=True, received=received, last_number=last)
    assert info.value.fault == "SequenceClosed"
    assert rmd_receive(state, 2, last=False, received=received, last_number=last).transition.noop


def test_after_terminate_everything_gets_sequence_terminated():
    state, received, last, _ = receive_all([1, 2], last=2)
    state = rmd_transition(state, RMDEvent.TMR).state
    for number, is_last in [(2, True), (1, False), (3, False)]:
        with pytest.raises(InvalidTransition) as info:
            rmd_receive(state, number, last=is_last, received=received, last_number=last)
        assert info.value.fault == "SequenceTerminated"


def test_message_number_limits():
    state = RMDState.initial()
    with pytest.raises(InvalidTransition) as info:
        rmd_receive(state, MAX_MESSAGE_NUMBER + 1, last=False, received=AckRanges(), last_number=None)
    assert info.value.fault == "MessageNumberRollover"
    with pytest.raises(ValueError, match="below 1"):
        rmd_receive(state, 0, last=False, received=AckRanges(), last_number=None)
    r = rmd_receive(state, MAX_MESSAGE_NUMBER, last=False, received=AckRanges(), last_number=None)
    assert r.event is RMDEvent.AMR_SNC


def test_bookkeeping_that_disagrees_with_the_state_is_refused():
    with pytest.raises(ValueError, match="disagrees"):
        rmd_receive(RMDState.initial(), 1, last=False, received=AckRanges.of([1]), last_number=None)
    with pytest.raises(ValueError, match="disagrees"):
        rmd_receive(RMDState.of("FMR"), 2, last=False, received=AckRanges.of([1]), last_number=1)


def test_replace_builds_each_transition_once_and_still_refuses_what_is_not_a_state():
    start = RMDState.of("-")
    first = start.replace(first_message_received=True)
    assert first is start.replace(first_message_received=True)  # kept: every message takes it
    assert first == RMDState(first_message_received=True)
    with pytest.raises(TypeError, match="must be a bool"):
        start.replace(first_message_received=1)  # 1 == True, yet no bool: not taken from the cache
    for _ in range(2):  # an impossible combination is refused every time, never remembered
        with pytest.raises(InvalidState):
            start.replace(every_message_received=True)
