"""The invoker buffer (seed 004 "InvokerBuffer"): messages on their way to the application.

Seed factors (section 3.4.1, figures 3-11..3-13):

=====  ==========================  ====================================================
 MIB   messages in buffer          some message is available for delivery
 LMR   last message received       the final messages of the stream were handed over
 EMS   every message sent          the whole stream was delivered to the application
=====  ==========================  ====================================================

"Available" is what makes the model small: the RMD hands a message over when
it may be delivered (at once for unordered delivery; for InOrder, when every
lower number has been handed over, so one arriving message may make a run
available).  The invoker's LMR is the hand-over that completes the stream (the
RMD's AMR(SC)/LMR(SC), action COMPLETE_DELIVERY); AMR is any other hand-over.

Of the 8 combinations, 4 are valid: ``-``, ``MIB``, ``MIB LMR``, ``LMR EMS``.
The rules:

* every message sent means the end is known and nothing is waiting:
  **EMS implies LMR and not MIB**;
* the stream's last hand-over brings messages, and once those are delivered
  everything is: **LMR implies MIB or EMS**.

Addition: ``END`` (ended), set by the event END when the RMD sequence is
closed, terminated or expired before it was complete (RMD action
END_DELIVERY): nothing more will become available, what is in the buffer is
still delivered.  A stream with a last message does not need it, so **END
implies not LMR** (and so not EMS).  Two more states: ``END``, ``MIB END``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .common import FactorState, InvalidTransition, Reason, Transition

__all__ = ["InvokerAction", "InvokerDuty", "InvokerEvent", "InvokerState", "invoker_duties", "invoker_transition"]


@dataclass(frozen=True)
class InvokerState(FactorState):
    messages_in_buffer: bool = False
    last_message_received: bool = False
    every_message_sent: bool = False
    ended: bool = False

    ABBREVIATIONS = {
        "messages_in_buffer": "MIB",
        "last_message_received": "LMR",
        "every_message_sent": "EMS",
        "ended": "END",
    }
    PREFIX = "Invoker"

    @classmethod
    def _broken_rules(
        cls,
        *,
        messages_in_buffer: bool,
        last_message_received: bool,
        every_message_sent: bool,
        ended: bool,
    ) -> tuple[str, ...]:
        broken = []
        if every_message_sent and not (last_message_received and not messages_in_buffer):
            broken.append("EMS needs LMR and no MIB: 'every message' is known only at the end, with nothing waiting")
        if last_message_received and not (messages_in_buffer or every_message_sent):
            broken.append("LMR needs MIB or EMS: the last hand-over brings messages, and delivering them delivers all")
        if ended and last_message_received:
            broken.append("END excludes LMR: a stream that has its last message ends by delivering it")
        return tuple(broken)

    @classmethod
    def initial(cls) -> InvokerState:
        return cls()

    @property
    def finished(self) -> bool:
        """Nothing is left to deliver and nothing more will come."""
        return self.every_message_sent or (self.ended and not self.messages_in_buffer)


class InvokerEvent(Enum):
    # The seed's events.
    AMR = "messages became available for delivery"
    LMR = "the messages completing the stream became available"
    SAM = "every available message was delivered to the application"
    # Addition.
    END = "the destination sequence ended before completion: nothing more will come"


class InvokerAction(Enum):
    BUFFER_MESSAGE = "keep the message(s) for delivery"


class InvokerDuty(Enum):
    DELIVER = "deliver the next available message, in its own transaction"
    RELEASE = "nothing more will happen: the buffer may be deleted"


def invoker_transition(state: InvokerState, event: InvokerEvent) -> Transition[InvokerState]:
    """Apply ``event`` to ``state``; raises :class:`InvalidTransition` when not allowed."""

    def go(new: InvokerState = state, *actions: InvokerAction) -> Transition[InvokerState]:
        return Transition(state, new, actions)

    s = state
    match event:
        case InvokerEvent.AMR | InvokerEvent.LMR:
            if s.ended:
                raise InvalidTransition(s, event, Reason.DELIVERY_ENDED)
            if s.last_message_received:
                raise InvalidTransition(s, event, Reason.LAST_MESSAGE_NUMBER_EXCEEDED, "the stream is complete")
            new = s.replace(messages_in_buffer=True, last_message_received=event is InvokerEvent.LMR)
            return go(new, InvokerAction.BUFFER_MESSAGE)

        case InvokerEvent.SAM:
            if not s.messages_in_buffer:
                return go()  # nothing was available
            return go(s.replace(messages_in_buffer=False, every_message_sent=s.last_message_received))

        case InvokerEvent.END:
            if s.ended or s.last_message_received:
                return go()  # a complete stream loses nothing when its sequence ends
            return go(s.replace(ended=True))

    raise TypeError(f"not an InvokerEvent: {event!r}")


def invoker_duties(state: InvokerState) -> frozenset[InvokerDuty]:
    """What the invoker worker must keep doing while the buffer is in ``state``."""
    if state.messages_in_buffer:
        return frozenset({InvokerDuty.DELIVER})
    if state.finished:
        return frozenset({InvokerDuty.RELEASE})
    return frozenset()
