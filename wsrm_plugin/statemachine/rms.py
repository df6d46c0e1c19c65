"""The RM Source sequence (seed 004 "RMSSequence"): what the sending side knows and owes.

Seed factors (section 3.4.1, figures 3-5..3-7):

=====  ==========================  ====================================================
 SS    sequence started            CreateSequenceResponse received: the sequence has an
                                   identifier and messages may go on the wire
 MIB   messages in buffer          some application message is not acknowledged yet
 LMR   last message received       the application said "no more messages"
 TMS   terminate message sent      TerminateSequence went out: the sequence is over
=====  ==========================  ====================================================

Of the 16 combinations, 7 are valid.  The rules that remove the other 9:

* an RMS sequence is created by the application's first message (that message
  is what makes the worker send CreateSequence), and nothing can be
  acknowledged before the sequence has an identifier, so **not SS implies MIB**;
* TerminateSequence is only sent for a started sequence whose end was announced
  and whose every message was acknowledged, so **TMS implies SS, LMR, not MIB**.

=====================  ====================================================================
 state                 why it exists / what the worker does (``rms_duties``)
=====================  ====================================================================
 MIB                   messages waiting for CreateSequenceResponse: send CreateSequence
 MIB LMR               same, and the application already said it is done
 SS                    started, everything acknowledged, more may come: nothing to do
 SS MIB                messages unacknowledged: (re)transmit them
 SS MIB LMR            the same after the end was announced (1.0: the last one carries
                       LastMessage)
 SS LMR                everything acknowledged and nothing more will come: send
                       TerminateSequence (1.1: CloseSequence first)
 SS LMR TMS            terminated: the record can go
=====================  ====================================================================

Additions, each documented where it is used:

* ``CLS`` (closed, WS-RM 1.1): CloseSequenceResponse received.  Close is sent in
  ``SS LMR`` only, so **CLS implies SS, LMR, not MIB**; after it, application
  messages are refused with SequenceClosed.  Two states: ``SS LMR CLS`` (send
  TerminateSequence) and ``SS LMR CLS TMS``.
* ``FLT`` (faulted): retransmission limit exceeded, CreateSequenceRefused, or the
  peer faulted the sequence (UnknownSequence, SequenceTerminated, SequenceClosed).
  The unacknowledged messages are failed and reported to the application, so
  **FLT implies not MIB**; a terminated sequence cannot fault, so **FLT implies
  not TMS**.  Five states (SS, LMR, CLS keep their history).
* The seed's four events come from the application or the network; the worker's
  own progress is an event too: ``TERMINATE_SENT`` sets TMS.  ``ACK`` is an
  acknowledgement that leaves messages unacknowledged (no factor changes, but
  the acked messages leave the buffer), ``CLOSE_RESPONSE`` and ``FAULT`` drive
  the additions above.

``LMR`` here is the application's signal, not a message: an application whose
last message is already sent can still say "done".  For WS-RM 1.0 the store
turns "done" into an AMR of an empty LastMessage message (action .../LastMessage)
followed by LMR, so the destination learns the end; 1.1 tells it with
CloseSequence's LastMsgNumber instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from .ackranges import AckRanges
from .common import FactorState, InvalidTransition, Reason, Transition, TransitionRules

__all__ = [
    "AckOutcome",
    "RMSAction",
    "RMSDuty",
    "RMSEvent",
    "RMSState",
    "rms_acknowledge",
    "rms_duties",
    "rms_transition",
]


@dataclass(frozen=True)
class RMSState(FactorState):
    sequence_started: bool = False
    messages_in_buffer: bool = False
    last_message_received: bool = False
    terminate_sent: bool = False
    closed: bool = False
    faulted: bool = False

    ABBREVIATIONS = {
        "sequence_started": "SS",
        "messages_in_buffer": "MIB",
        "last_message_received": "LMR",
        "terminate_sent": "TMS",
        "closed": "CLS",
        "faulted": "FLT",
    }
    PREFIX = "RMS"

    @classmethod
    def _broken_rules(
        cls,
        *,
        sequence_started: bool,
        messages_in_buffer: bool,
        last_message_received: bool,
        terminate_sent: bool,
        closed: bool,
        faulted: bool,
    ) -> tuple[str, ...]:
        broken = []
        if not sequence_started and not messages_in_buffer and not faulted:
            broken.append(
                "not SS needs MIB: a sequence is created by its first message, and nothing"
                " is acknowledged before the sequence has an identifier"
            )
        if terminate_sent and not (sequence_started and last_message_received and not messages_in_buffer):
            broken.append("TMS needs SS, LMR and no MIB: terminate follows the ack for every message")
        if closed and not (sequence_started and last_message_received and not messages_in_buffer):
            broken.append("CLS needs SS, LMR and no MIB: close follows the ack for every message")
        if faulted and messages_in_buffer:
            broken.append("FLT excludes MIB: a fault fails the unacknowledged messages")
        if faulted and terminate_sent:
            broken.append("FLT excludes TMS: a terminated sequence has nothing left to fail")
        return tuple(broken)

    @classmethod
    def initial(cls, *, offered: bool = False) -> RMSState:
        """A new sequence: created by the application's first message (``MIB``, which the
        creating transaction buffers), or accepted from a peer's Offer (``SS``: the
        identifier is known, no CreateSequence is needed)."""
        return cls(sequence_started=True) if offered else cls(messages_in_buffer=True)

    @property
    def live(self) -> bool:
        """Neither terminated nor faulted: the sequence still has work or may get some."""
        return not (self.terminate_sent or self.faulted)

    @property
    def transmitting(self) -> bool:
        """Started and live: its messages go on the wire and acknowledgements of them count."""
        return self.sequence_started and self.live

    @property
    def accepts_messages(self) -> bool:
        """An application message (AMR) would be taken, not refused: live, neither closed nor
        told by the application that it is done."""
        return self.live and not (self.closed or self.last_message_received)


class RMSEvent(Enum):
    # The seed's events.
    CRR = "CreateSequenceResponse received"
    AMR = "application message received from the application"
    LMR = "the application said it sends no more messages"
    ACKALL = "acknowledgement covering every message sent"
    # Additions.
    ACK = "acknowledgement leaving some message unacknowledged"
    CLOSE_RESPONSE = "CloseSequenceResponse received (WS-RM 1.1)"
    TERMINATE_SENT = "the worker sent TerminateSequence"
    FAULT = "retries exhausted, CreateSequence refused, or the peer faulted the sequence"


class RMSAction(Enum):
    BUFFER_MESSAGE = "store the message with the next message number"
    RECORD_LAST = "remember the highest number assigned as the last message number"
    RECORD_SEQUENCE = "store the identifier (and Expires, accepted Offer) from the response"
    DISCARD_ACKED = "drop the newly acknowledged messages from the buffer"
    REPORT_FAULT = "mark unacknowledged messages failed and tell the application why"


class RMSDuty(Enum):
    SEND_CREATE_SEQUENCE = "send (again) CreateSequence"
    SEND_MESSAGES = "(re)transmit unacknowledged messages, with backoff; request acks"
    SEND_CLOSE = "send (again) CloseSequence with the last message number"
    SEND_TERMINATE = "send TerminateSequence, then record TERMINATE_SENT"
    RELEASE = "nothing more will happen: the record may be deleted"


# One rule per event (or pair of events that share one): each says, for any state, what the
# event does or why it is refused.  ``rms_transition`` only looks the rule up.

def _application_message(s: RMSState, event: RMSEvent) -> Transition[RMSState]:
    if s.terminate_sent:
        raise InvalidTransition(s, event, Reason.SEQUENCE_TERMINATED)
    if s.faulted:
        raise InvalidTransition(s, event, Reason.SEQUENCE_FAULTED)
    if s.closed:
        raise InvalidTransition(s, event, Reason.SEQUENCE_CLOSED)
    if s.last_message_received:
        raise InvalidTransition(s, event, Reason.LAST_MESSAGE_NUMBER_EXCEEDED,
                                "the application already said it was done")
    return Transition(s, s.replace(messages_in_buffer=True), (RMSAction.BUFFER_MESSAGE,))


def _last_message(s: RMSState, event: RMSEvent) -> Transition[RMSState]:
    if s.last_message_received or not s.live:
        return Transition(s, s)  # saying "done" again, or to a dead sequence, changes nothing
    return Transition(s, s.replace(last_message_received=True), (RMSAction.RECORD_LAST,))


def _create_sequence_response(s: RMSState, event: RMSEvent) -> Transition[RMSState]:
    if s.sequence_started or not s.live:
        return Transition(s, s)  # a retransmitted CreateSequence answered again, or a late answer
    return Transition(s, s.replace(sequence_started=True), (RMSAction.RECORD_SEQUENCE,))


def _acknowledgement(s: RMSState, event: RMSEvent) -> Transition[RMSState]:
    if not s.live:
        return Transition(s, s)  # late acknowledgement
    if not s.sequence_started:
        raise InvalidTransition(s, event, Reason.UNKNOWN_SEQUENCE)
    if not s.messages_in_buffer:
        return Transition(s, s)  # everything was acknowledged already
    new = s if event is RMSEvent.ACK else s.replace(messages_in_buffer=False)
    return Transition(s, new, (RMSAction.DISCARD_ACKED,))


def _ending(s: RMSState, event: RMSEvent, done: bool, what: str) -> Transition[RMSState] | None:
    """What CloseSequenceResponse and TerminateSequence share: both follow the ack for every
    message of a started sequence; None when the event may go ahead."""
    if done:
        return Transition(s, s)  # the response to a retransmitted request, or sent already
    if not s.sequence_started:
        raise InvalidTransition(s, event, Reason.UNKNOWN_SEQUENCE)
    if s.messages_in_buffer or not s.last_message_received:
        raise InvalidTransition(s, event, Reason.UNEXPECTED,
                                f"{what} is only sent once every message is acknowledged")
    return None


def _close_response(s: RMSState, event: RMSEvent) -> Transition[RMSState]:
    return (_ending(s, event, s.closed or not s.live, "CloseSequence")
            or Transition(s, s.replace(closed=True)))


def _terminate_sent(s: RMSState, event: RMSEvent) -> Transition[RMSState]:
    if s.faulted and not s.terminate_sent:
        raise InvalidTransition(s, event, Reason.SEQUENCE_FAULTED)
    return (_ending(s, event, s.terminate_sent, "TerminateSequence")
            or Transition(s, s.replace(terminate_sent=True)))


def _fault(s: RMSState, event: RMSEvent) -> Transition[RMSState]:
    if not s.live:
        return Transition(s, s)
    return Transition(s, s.replace(faulted=True, messages_in_buffer=False), (RMSAction.REPORT_FAULT,))


_RULES: dict[RMSEvent, Callable[[RMSState, RMSEvent], Transition[RMSState]]] = {
    RMSEvent.AMR: _application_message,
    RMSEvent.LMR: _last_message,
    RMSEvent.CRR: _create_sequence_response,
    RMSEvent.ACK: _acknowledgement,
    RMSEvent.ACKALL: _acknowledgement,
    RMSEvent.CLOSE_RESPONSE: _close_response,
    RMSEvent.TERMINATE_SENT: _terminate_sent,
    RMSEvent.FAULT: _fault,
}


_TRANSITIONS: TransitionRules[RMSState, RMSEvent] = TransitionRules(_RULES, "an RMSEvent")


def rms_transition(state: RMSState, event: RMSEvent) -> Transition[RMSState]:
    """Apply ``event`` to ``state``; raises :class:`InvalidTransition` when not allowed."""
    return _TRANSITIONS(state, event)


def rms_duties(state: RMSState, *, close_first: bool = False) -> frozenset[RMSDuty]:
    """What the RMS worker must keep doing while the sequence is in ``state``.

    ``close_first``: the sequence speaks WS-RM 1.1, which closes (and gets the
    final acknowledgement) before terminating.
    """
    if not state.live:
        return frozenset({RMSDuty.RELEASE})
    if not state.sequence_started:
        return frozenset({RMSDuty.SEND_CREATE_SEQUENCE})
    if state.messages_in_buffer:
        return frozenset({RMSDuty.SEND_MESSAGES})
    if not state.last_message_received:
        return frozenset()
    if close_first and not state.closed:
        return frozenset({RMSDuty.SEND_CLOSE})
    return frozenset({RMSDuty.SEND_TERMINATE})


@dataclass(frozen=True)
class AckOutcome:
    """An acknowledgement applied: the event it amounted to, the transition, the new acked set."""

    event: RMSEvent
    transition: Transition[RMSState]
    acked: AckRanges
    newly_acked: AckRanges


def rms_acknowledge(
    state: RMSState, ack: AckRanges, *, acked: AckRanges, highest_assigned: int
) -> AckOutcome:
    """Interpret a SequenceAcknowledgement for this sequence.

    ``acked`` is what earlier acknowledgements covered, ``highest_assigned`` the
    highest message number given out (1..highest_assigned are the messages of
    the sequence).  Acks only ever add numbers (a peer's smaller ack is not an
    un-ack), and an ack naming a number never sent is refused with
    InvalidAcknowledgement.  The result is ACKALL when every message is now
    acknowledged, else ACK.
    """
    if highest_assigned < 0:
        raise ValueError(f"highest_assigned must be >= 0, got {highest_assigned}")
    if acked.highest > highest_assigned:
        raise ValueError(f"acked {acked} goes beyond the highest assigned number {highest_assigned}")
    merged = acked.union(ack)
    event = RMSEvent.ACKALL if merged.is_complete_up_to(highest_assigned) else RMSEvent.ACK
    if state.live and state.sequence_started and ack.highest > highest_assigned:
        raise InvalidTransition(
            state,
            event,
            Reason.INVALID_ACKNOWLEDGEMENT,
            (f"ack {ack} but only 1..{highest_assigned} were sent" if highest_assigned
             else f"ack {ack} but nothing was sent"),
        )
    transition = rms_transition(state, event)
    if transition.noop:
        return AckOutcome(event, transition, acked, AckRanges())
    return AckOutcome(event, transition, merged, merged.difference(acked))
