"""Store records <-> state-machine states, so every event goes through the one set of rules.

The store keeps a sequence as columns (``started``, ``closed``, ``received``
ranges...); :mod:`wsrm_plugin.statemachine` reasons in seed 004's factor
states.  These functions are the whole translation: read a record into a
state, apply the event with the pure transition function, write back only
the factors that changed.  A store row that maps to an impossible state
raises :class:`~wsrm_plugin.statemachine.InvalidState` instead of being acted on.

Kept in the store API so that one translation serves everyone who asks what
state a sequence is in: the engine's events, the store's own rules (an
enqueue into a sequence that takes no more messages) and the status an
operator reads.  Nobody else decides a sequence's state from its columns.
"""

from __future__ import annotations

from typing import Any

from ...statemachine.ackranges import AckRanges
from ...statemachine.common import InvalidState, Transition
from ...statemachine.rmd import RMDState
from ...statemachine.rms import RMSState
from .records import RmdSequence, RmsSequence

__all__ = ["rms_state", "rms_life", "rms_changes", "rmd_state", "rmd_changes", "received_ranges",
           "rms_state_name", "rmd_state_name"]


def rms_state(seq: RmsSequence, unacked: int) -> RMSState:
    """The RMS state of ``seq`` with ``unacked`` messages still unacknowledged in the store.

    A faulted sequence may still hold the messages it failed (until they are
    reported): they no longer count as "in buffer".
    """
    factors = started, buffered, last, terminated, closed, faulted = (
        seq.started, unacked > 0 and not seq.faulted, seq.last_message, seq.terminate_sent, seq.closed, seq.faulted)
    # 1 == True: only real bools share a state (written out: a generator's all() was most of the cost)
    cacheable = (type(started) is bool and type(buffered) is bool and type(last) is bool
                 and type(terminated) is bool and type(closed) is bool and type(faulted) is bool)
    state = _RMS_STATES.get(factors) if cacheable else None
    if state is None:  # built (and checked: a non-bool or an impossible combination raises) once
        state = RMSState(*factors)
        if cacheable:
            _RMS_STATES[factors] = state
    return state


#: The RMS states built so far, by their factors (as :data:`_RMD_STATES`): every claim, send,
#: acknowledgement and enqueue asks for one, a handful of times per message.
_RMS_STATES: dict[tuple[bool, bool, bool, bool, bool, bool], RMSState] = {}


def rms_life(seq: RmsSequence) -> RMSState:
    """The RMS state of ``seq`` as far as its record tells, its buffer not looked at.

    For the questions about a sequence's life (is it started, live, open to
    new messages?), which no factor but MIB answers from the message queue:
    MIB is taken as the record implies it (a sequence not started yet was
    created by a message; a started one is asked nothing about its buffer).
    Use :func:`rms_state` with the unacknowledged count for its duties.
    """
    return rms_state(seq, 0 if seq.started or seq.faulted else 1)


def rms_state_name(seq: RmsSequence) -> str:
    """The word ``wsrm status`` shows for a source sequence's state ("invalid" for a row no
    state of the machine matches: shown, not raised, so the rest of the status is read)."""
    try:
        state = rms_life(seq)
    except InvalidState:
        return "invalid"
    if state.faulted:
        return "faulted"
    if state.terminate_sent:
        return "terminated"
    if state.closed or seq.close_sent:  # CloseSequence sent and not answered yet: closing
        return "closed"
    if state.last_message_received:
        return "last-message"
    return "started" if state.sequence_started else "creating"


def rms_changes(transition: Transition[RMSState]) -> dict[str, Any]:
    """Store updates for the stored factors a transition changed (MIB and LMR are
    kept by the message queue and ``mark_last``, not here)."""
    before, after = transition.previous, transition.state
    changes: dict[str, Any] = {}
    for factor, column in (("sequence_started", "started"), ("closed", "closed"),
                           ("terminate_sent", "terminate_sent"), ("faulted", "faulted")):
        if getattr(after, factor) != getattr(before, factor):
            changes[column] = getattr(after, factor)
    return changes


def received_ranges(seq: RmdSequence) -> AckRanges:
    received = seq.received
    return received if isinstance(received, AckRanges) else AckRanges.from_ranges(received)


#: The RMD states built so far, by their factors: a state is a frozen value checked when built,
#: and each received message asks for one.
_RMD_STATES: dict[tuple[bool, bool, bool, bool, bool], RMDState] = {}


def rmd_state(seq: RmdSequence) -> RMDState:
    factors = first, last, every, terminated, closed = (
        seq.first_received, seq.last_received, seq.every_received, seq.terminated, seq.closed)
    cacheable = (type(first) is bool and type(last) is bool and type(every) is bool  # as in rms_state
                 and type(terminated) is bool and type(closed) is bool)
    state = _RMD_STATES.get(factors) if cacheable else None
    if state is None:  # built (and checked: a non-bool or an impossible combination raises) once
        state = RMDState(*factors)
        if cacheable:
            _RMD_STATES[factors] = state
    return state


def rmd_state_name(seq: RmdSequence) -> str:
    """The word ``wsrm status`` shows for a destination sequence's state (or "invalid")."""
    try:
        state = rmd_state(seq)
    except InvalidState:
        return "invalid"
    if state.terminate_received:
        return "terminated"
    if state.closed:
        return "closed"
    if state.every_message_received:
        return "complete"
    if state.last_message_received:
        return "last-received"
    return "receiving" if state.first_message_received else "created"


def rmd_changes(transition: Transition[RMDState]) -> dict[str, Any]:
    """Store updates for closed/terminated (the other factors follow from ``received``)."""
    before, after = transition.previous, transition.state
    changes: dict[str, Any] = {}
    if after.closed != before.closed:
        changes["closed"] = after.closed
    if after.terminate_received != before.terminate_received:
        changes["terminated"] = after.terminate_received
    return changes
