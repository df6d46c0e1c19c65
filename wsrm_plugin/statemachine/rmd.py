"""The RM Destination sequence (seed 004 "RMDSequence"): what the receiving side knows and owes.

Seed factors (section 3.4.1, figures 3-8..3-10):

=====  ==========================  ====================================================
 FMR   first message received      at least one message of the sequence arrived
 LMR   last message received       the message marked last arrived: the last number is known
 EMR   every message received      every number 1..last arrived
 TMR   terminate message received  TerminateSequence arrived: the sequence is over
=====  ==========================  ====================================================

Of the 16 combinations, 5 are valid, a chain: ``-``, ``FMR``, ``FMR LMR``,
``FMR LMR EMR``, ``FMR LMR EMR TMR``.  The rules:

* the last message is a message: **LMR implies FMR**;
* "every message" is only defined once the last number is known: **EMR implies LMR**;
* TerminateSequence follows the acknowledgement of every message: **TMR implies EMR**
  (relaxed below for CLS).

The seed's events are new messages, classified by whether they complete the
sequence (SC: with this message every number up to the last has arrived) or
not (SNC).  :func:`rmd_receive` does that classification from the message
number, so callers never choose SC/SNC by hand.

Additions:

* ``CLS`` (closed): no new message will be accepted; the set of received
  numbers is final.  Set by CloseSequence (WS-RM 1.1), and by a termination
  that comes before EMR (a 1.1 peer may terminate without LastMessage; a peer
  may give up; the destination's inactivity timeout): such a sequence can
  never be completed, so the rule becomes **TMR implies EMR or CLS**.  New
  messages after close are refused with SequenceClosed.  8 more states.
* ``DUPLICATE``: a message already received.  It changes nothing (it is acked,
  never faulted, never delivered twice), except after termination.
* ``CLOSE_RECEIVED``, ``INACTIVITY_TIMEOUT`` (the destination ends the sequence
  itself: it behaves like TerminateSequence without a response to send).

WS-RM 1.1 has no LastMessage header, so a 1.1 sequence normally ends closed
without LMR; "closed and not EMR" means the received set is final, not that
something is missing (CloseSequence's LastMsgNumber and :class:`AckRanges` tell
whether it is).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from .ackranges import AckRanges
from .common import MAX_MESSAGE_NUMBER, FactorState, InvalidTransition, Reason, Transition, TransitionRules

__all__ = [
    "RMDAction",
    "RMDDuty",
    "RMDEvent",
    "RMDState",
    "Reception",
    "rmd_duties",
    "rmd_receive",
    "rmd_transition",
]


@dataclass(frozen=True)
class RMDState(FactorState):
    first_message_received: bool = False
    last_message_received: bool = False
    every_message_received: bool = False
    terminate_received: bool = False
    closed: bool = False

    ABBREVIATIONS = {
        "first_message_received": "FMR",
        "last_message_received": "LMR",
        "every_message_received": "EMR",
        "terminate_received": "TMR",
        "closed": "CLS",
    }
    PREFIX = "RMD"

    @classmethod
    def _broken_rules(
        cls,
        *,
        first_message_received: bool,
        last_message_received: bool,
        every_message_received: bool,
        terminate_received: bool,
        closed: bool,
    ) -> tuple[str, ...]:
        broken = []
        if last_message_received and not first_message_received:
            broken.append("LMR needs FMR: the last message is a message")
        if every_message_received and not last_message_received:
            broken.append("EMR needs LMR: 'every message' is only known once the last number is")
        if terminate_received and not (every_message_received or closed):
            broken.append("TMR needs EMR or CLS: a sequence terminated before completion is closed")
        return tuple(broken)

    @classmethod
    def initial(cls) -> RMDState:
        """The state CreateSequence creates (the CreateSequenceResponse goes back with it)."""
        return cls()

    @property
    def accepts_new_messages(self) -> bool:
        return not (self.terminate_received or self.closed or self.every_message_received)

    @property
    def open(self) -> bool:
        """Neither closed nor terminated: a peer may still send on it (a complete sequence is
        open too: it takes duplicates and its Close or Terminate)."""
        return not (self.closed or self.terminate_received)

    @property
    def final(self) -> bool:
        """Its received numbers can no longer change (closed or terminated): an acknowledgement
        of it is Final (WS-RM 1.1)."""
        return self.closed or self.terminate_received


class RMDEvent(Enum):
    # The seed's events: a NEW message (not a duplicate).
    AMR_SC = "application message received, completing the sequence"
    AMR_SNC = "application message received, not completing the sequence"
    LMR_SC = "last message received, completing the sequence"
    LMR_SNC = "last message received, not completing the sequence"
    TMR = "TerminateSequence received"
    # Additions.
    DUPLICATE = "a message already received arrived again"
    CLOSE_RECEIVED = "CloseSequence received (WS-RM 1.1)"
    INACTIVITY_TIMEOUT = "the destination ended the sequence itself (inactivity timeout)"


class RMDAction(Enum):
    ACCEPT_MESSAGE = "record the number as received and hand the message to the invoker buffer"
    RECORD_LAST = "record the message number as the last one"
    COMPLETE_DELIVERY = "tell the invoker buffer the stream is complete (invoker LMR)"
    END_DELIVERY = "tell the invoker buffer no more messages will come (invoker END)"
    REPLY_CLOSE = "answer CloseSequenceResponse (with the final acknowledgement)"
    REPLY_TERMINATE = "answer TerminateSequenceResponse (WS-RM 1.1; nothing to answer in 1.0)"


class RMDDuty(Enum):
    SEND_ACK = "acknowledge the received ranges (piggybacked or standalone, per the ack interval)"
    RELEASE = "nothing more will happen: delete the record once the invoker buffer is finished"


_NEW_MESSAGE_EVENTS = (RMDEvent.AMR_SC, RMDEvent.AMR_SNC, RMDEvent.LMR_SC, RMDEvent.LMR_SNC)


# One rule per event (the four new-message events share one): each says, for any state, what the
# event does or why it is refused.  ``rmd_transition`` only looks the rule up.

def _new_message(s: RMDState, event: RMDEvent) -> Transition[RMDState]:
    is_last = event in (RMDEvent.LMR_SC, RMDEvent.LMR_SNC)
    completes = event in (RMDEvent.AMR_SC, RMDEvent.LMR_SC)
    if s.terminate_received:
        raise InvalidTransition(s, event, Reason.SEQUENCE_TERMINATED)
    if s.closed:
        raise InvalidTransition(s, event, Reason.SEQUENCE_CLOSED)
    if s.every_message_received:
        raise InvalidTransition(s, event, Reason.LAST_MESSAGE_NUMBER_EXCEEDED,
                                "every message up to the last was received")
    if is_last and s.last_message_received:
        raise InvalidTransition(s, event, Reason.LAST_MESSAGE_NUMBER_EXCEEDED,
                                "another message was already marked last")
    if completes and not is_last and not s.last_message_received:
        raise InvalidTransition(s, event, Reason.LAST_MESSAGE_UNKNOWN)
    new = s.replace(first_message_received=True, last_message_received=s.last_message_received or is_last,
                    every_message_received=completes)
    actions = (RMDAction.ACCEPT_MESSAGE,) + ((RMDAction.RECORD_LAST,) if is_last else ()) \
        + ((RMDAction.COMPLETE_DELIVERY,) if completes else ())
    return Transition(s, new, actions)


def _duplicate(s: RMDState, event: RMDEvent) -> Transition[RMDState]:
    if s.terminate_received:
        raise InvalidTransition(s, event, Reason.SEQUENCE_TERMINATED)
    if not s.first_message_received:
        raise InvalidTransition(s, event, Reason.UNEXPECTED,
                                "nothing was received yet, so nothing can be a duplicate")
    return Transition(s, s)


def _ended(s: RMDState, reply: tuple[RMDAction, ...], **changes: bool) -> Transition[RMDState]:
    """A sequence closed or terminated: an incomplete one can never be completed now, so it is
    closed too and its invoker buffer told that nothing more will come."""
    if s.every_message_received or s.closed:
        return Transition(s, s.replace(**changes), reply)
    return Transition(s, s.replace(**{**changes, "closed": True}), reply + (RMDAction.END_DELIVERY,))


def _terminate(s: RMDState, event: RMDEvent) -> Transition[RMDState]:
    if s.terminate_received:
        return Transition(s, s, (RMDAction.REPLY_TERMINATE,))  # the first response may have been lost
    return _ended(s, (RMDAction.REPLY_TERMINATE,), terminate_received=True)


def _close(s: RMDState, event: RMDEvent) -> Transition[RMDState]:
    if s.terminate_received:
        raise InvalidTransition(s, event, Reason.SEQUENCE_TERMINATED)
    if s.closed:
        return Transition(s, s, (RMDAction.REPLY_CLOSE,))  # the first response may have been lost
    return _ended(s, (RMDAction.REPLY_CLOSE,), closed=True)


def _inactivity_timeout(s: RMDState, event: RMDEvent) -> Transition[RMDState]:
    if s.terminate_received:
        return Transition(s, s)
    return _ended(s, (), terminate_received=True)


_RULES: dict[RMDEvent, Callable[[RMDState, RMDEvent], Transition[RMDState]]] = {
    **{event: _new_message for event in _NEW_MESSAGE_EVENTS},
    RMDEvent.DUPLICATE: _duplicate,
    RMDEvent.TMR: _terminate,
    RMDEvent.CLOSE_RECEIVED: _close,
    RMDEvent.INACTIVITY_TIMEOUT: _inactivity_timeout,
}


_TRANSITIONS: TransitionRules[RMDState, RMDEvent] = TransitionRules(_RULES, "an RMDEvent")


def rmd_transition(state: RMDState, event: RMDEvent) -> Transition[RMDState]:
    """Apply ``event`` to ``state``; raises :class:`InvalidTransition` when not allowed."""
    return _TRANSITIONS(state, event)


def rmd_duties(state: RMDState) -> frozenset[RMDDuty]:
    """What the RMD worker must keep doing while the sequence is in ``state``."""
    if state.terminate_received:
        return frozenset({RMDDuty.RELEASE})
    if state.first_message_received:
        return frozenset({RMDDuty.SEND_ACK})
    return frozenset()


@dataclass(frozen=True)
class Reception:
    """A message number applied to a destination sequence.

    ``received`` and ``last_number`` are the bookkeeping to store with
    ``transition.state``; ``event`` is what the message amounted to.
    """

    event: RMDEvent
    transition: Transition[RMDState]
    received: AckRanges
    last_number: int | None

    @property
    def duplicate(self) -> bool:
        return self.event is RMDEvent.DUPLICATE


def rmd_receive(
    state: RMDState,
    number: int,
    *,
    last: bool,
    received: AckRanges,
    last_number: int | None,
) -> Reception:
    """Classify message ``number`` (``last``: it carries the last-message mark) and apply it.

    ``received``/``last_number`` are the sequence's bookkeeping as stored with
    ``state``.  A duplicate is a no-op (acked, not delivered).  A last-message
    mark on a retransmission of a message first received unmarked is ignored:
    the sequence then ends by termination (closed), which loses nothing.
    """
    if isinstance(number, bool) or not isinstance(number, int):
        raise TypeError(f"a message number is an int, got {number!r}")
    if number < 1:
        raise ValueError(f"message number {number} is below 1; WS-RM numbers start at 1")
    if state.first_message_received != bool(received):
        raise ValueError(f"{state} disagrees with received numbers {received}")
    if state.last_message_received != (last_number is not None):
        raise ValueError(f"{state} disagrees with last message number {last_number}")

    def reception(event: RMDEvent, new_received: AckRanges, new_last: int | None) -> Reception:
        return Reception(event, rmd_transition(state, event), new_received, new_last)

    def exceeded(event: RMDEvent, detail: str) -> InvalidTransition:
        # A terminated or closed sequence answers with its own fault first.
        if state.terminate_received or state.closed:
            rmd_transition(state, event)
        return InvalidTransition(state, event, Reason.LAST_MESSAGE_NUMBER_EXCEEDED, detail)

    provisional = RMDEvent.LMR_SNC if last else RMDEvent.AMR_SNC
    if number > MAX_MESSAGE_NUMBER:
        raise InvalidTransition(state, provisional, Reason.MESSAGE_NUMBER_ROLLOVER, f"message number {number}")
    if number in received:
        if last and last_number is not None and number != last_number:
            raise exceeded(provisional, f"{number} marked last, but {last_number} was the last")
        return reception(RMDEvent.DUPLICATE, received, last_number)
    if last_number is not None and number > last_number:
        raise exceeded(provisional, f"{number} after last message {last_number}")
    if last and last_number is not None:
        raise exceeded(provisional, f"{number} marked last, but {last_number} was the last")
    if last and received.highest > number:
        raise exceeded(provisional, f"{number} marked last, but {received.highest} was received")

    new_received = received.add(number)
    new_last = number if last else last_number
    completes = new_last is not None and new_received.is_complete_up_to(new_last)
    if last:
        event = RMDEvent.LMR_SC if completes else RMDEvent.LMR_SNC
    else:
        event = RMDEvent.AMR_SC if completes else RMDEvent.AMR_SNC
    return reception(event, new_received, new_last)
