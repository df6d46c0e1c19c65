"""The questions the engine asks a state (is it open? final? may it send?) agree with the rules.

The engine decides from these predicates, not from store columns; each is
checked here against what the transition function allows in every valid state,
so a predicate cannot say "yes" where the machine refuses.
"""

from __future__ import annotations

import pytest

from wsrm_plugin.statemachine import (
    InvalidTransition,
    Reason,
    RMDEvent,
    RMDState,
    RMSEvent,
    RMSState,
    rmd_transition,
    rms_transition,
)


def _allowed(transition, state, event) -> bool:
    try:
        transition(state, event)
    except InvalidTransition:
        return False
    return True


@pytest.mark.parametrize("state", RMSState.valid_states(), ids=str)
def test_an_rms_state_accepts_messages_exactly_where_amr_is_allowed(state):
    assert state.accepts_messages == _allowed(rms_transition, state, RMSEvent.AMR)


@pytest.mark.parametrize("state", RMSState.valid_states(), ids=str)
def test_an_rms_state_is_transmitting_exactly_where_an_acknowledgement_counts(state):
    # an ack of a sequence without an identifier is refused; of a dead one, ignored
    if not state.sequence_started and state.live:
        with pytest.raises(InvalidTransition) as refused:
            rms_transition(state, RMSEvent.ACK)
        assert refused.value.reason is Reason.UNKNOWN_SEQUENCE
    counted = _allowed(rms_transition, state, RMSEvent.ACKALL) and not rms_transition(state, RMSEvent.ACKALL).noop
    assert counted <= state.transmitting  # an ack that changes something needs a transmitting state
    assert state.transmitting == (state.sequence_started and state.live)


@pytest.mark.parametrize("state", RMDState.valid_states(), ids=str)
def test_an_rmd_state_is_open_exactly_where_a_close_is_news_and_final_where_nothing_can_be_added(state):
    closing = _allowed(rmd_transition, state, RMDEvent.CLOSE_RECEIVED) and \
        rmd_transition(state, RMDEvent.CLOSE_RECEIVED).state != state
    assert state.open == closing
    new_refusals = set()
    for event in (RMDEvent.AMR_SNC, RMDEvent.LMR_SNC):
        try:
            rmd_transition(state, event)
        except InvalidTransition as refused:
            new_refusals.add(refused.reason)
    ended = {Reason.SEQUENCE_CLOSED, Reason.SEQUENCE_TERMINATED}
    assert state.final == bool(new_refusals & ended)
    assert state.final == (not state.open)
    assert not (state.accepts_new_messages and not state.open)


def test_status_names_a_row_no_state_matches_instead_of_failing():
    from wsrm_plugin.store.api import RmdSequence, RmsSequence
    from wsrm_plugin.store.api.states import rmd_state_name, rms_state_name

    # terminated without being complete or closed: TerminateSequence never leaves a row so
    corrupt = RmdSequence("s", acks_to="a", rm_version="v", wsa_version="w", terminated=True)
    assert rmd_state_name(corrupt) == "invalid"
    assert rmd_state_name(RmdSequence("s", acks_to="a", rm_version="v", wsa_version="w")) == "created"
    started = RmsSequence("k", target="t", acks_to="a", rm_version="v", wsa_version="w", started=True)
    assert rms_state_name(started) == "started"
    assert rms_state_name(RmsSequence("k", target="t", acks_to="a", rm_version="v", wsa_version="w",
                                      started=True, closed=True)) == "invalid"  # closed before the end
