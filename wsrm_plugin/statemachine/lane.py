"""Who sends a source sequence's messages right now: the sender's round, the caller's thread, or both.

The sender (the RMS worker) sends every message: it is woken when a
message is committed, claims what is due and sends it.  A caller that waits
for the reply of its own request pays for that: its thread hands the message
to the sender's thread and is handed the reply back, two thread switches per
call.  So a caller that waits (``Future.result()`` of the reliable zeep
client) may send its own request itself, from its own thread, when the
sequence's lane is idle: no round is sending on it and no other caller is.
It claims the message in the store exactly as a round does (its first attempt
recorded, with the next retransmission time, before anything goes out), so
the retransmission timer covers a send the caller's thread started and never
finished, and a message a round claimed is never sent by a caller.

Factors:

=====  ==========================  ====================================================
 RND   round sending               a sender round claimed messages of the sequence and
                                   is sending them
 CLR   caller sending              a caller's thread claimed its own message and is
                                   sending it
=====  ==========================  ====================================================

All four combinations are valid: a round may start while a caller's message
is out (it only sends what is due, and the caller's message is claimed), but
a caller never starts while a round is out on the sequence, nor while another
caller is: its message then goes with the round, which the commit woke.  That
keeps a caller's send from overtaking what a round sends, so a peer that
drops messages sent after a gap is not made to drop them by the caller.

When the lane is idle as a caller's request is enqueued, the enqueue's own
transaction makes the claim and CALLER_CLAIMS happens then: the lane is the
caller's until its send ends, or until it leaves the request to the sender
(its grace ended, or it waits with a short timeout).

Kept in the sender's memory (one process's threads); the store's claim is
what makes a message go once per attempt across processes.  Nothing here
does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from .common import FactorState, InvalidTransition, Reason, Transition, TransitionRules

__all__ = ["LaneAction", "LaneEvent", "LaneState", "lane_transition"]


@dataclass(frozen=True)
class LaneState(FactorState):
    round_sending: bool = False
    caller_sending: bool = False

    ABBREVIATIONS = {
        "round_sending": "RND",
        "caller_sending": "CLR",
    }
    PREFIX = "Lane"

    @classmethod
    def _broken_rules(cls, *, round_sending: bool, caller_sending: bool) -> tuple[str, ...]:
        return ()  # a round may start while a caller's message is out (see the module's text)

    @classmethod
    def initial(cls) -> LaneState:
        """Nobody sends on the sequence: one value, built (and checked) once -- the sender keeps
        no entry for an idle lane, and each of a call's two transitions starts from it or ends in it."""
        return _IDLE

    @property
    def idle(self) -> bool:
        """Neither a round nor a caller is sending: a caller may send its own message."""
        return not (self.round_sending or self.caller_sending)


class LaneEvent(Enum):
    ROUND_CLAIMED = "a sender round claimed messages of the sequence"
    ROUND_ENDED = "the round's sends on the sequence ended, their answers applied"
    CALLER_CLAIMS = "a caller waiting for its reply asks to send its own request from its thread"
    CALLER_ENDED = "the caller's send ended (answered, failed, or not made: the store said no)"


class LaneAction(Enum):
    SEND_FROM_CALLER = ("the caller's thread claims its message in the store (its first attempt recorded) and "
                        "sends it as a round would; a failure is left to the message's retransmission timer")
    SETTLE = "apply what the caller's exchange showed (a number proven lost is due at once)"


def _round_claimed(s: LaneState, event: LaneEvent) -> Transition[LaneState]:
    return Transition(s, s.replace(round_sending=True))


def _round_ended(s: LaneState, event: LaneEvent) -> Transition[LaneState]:
    return Transition(s, s.replace(round_sending=False))


def _caller_claims(s: LaneState, event: LaneEvent) -> Transition[LaneState]:
    if s.round_sending:
        raise InvalidTransition(s, event, Reason.LANE_BUSY, "a round is sending on the sequence")
    if s.caller_sending:
        raise InvalidTransition(s, event, Reason.LANE_BUSY, "another caller's request is going out")
    return Transition(s, s.replace(caller_sending=True), (LaneAction.SEND_FROM_CALLER,))


def _caller_ended(s: LaneState, event: LaneEvent) -> Transition[LaneState]:
    if not s.caller_sending:
        raise InvalidTransition(s, event, Reason.UNEXPECTED, "no caller is sending on the sequence")
    return Transition(s, s.replace(caller_sending=False), (LaneAction.SETTLE,))


_RULES: dict[LaneEvent, Callable[[LaneState, LaneEvent], Transition[LaneState]]] = {
    LaneEvent.ROUND_CLAIMED: _round_claimed,
    LaneEvent.ROUND_ENDED: _round_ended,
    LaneEvent.CALLER_CLAIMS: _caller_claims,
    LaneEvent.CALLER_ENDED: _caller_ended,
}


_IDLE = LaneState()

_TRANSITIONS: TransitionRules[LaneState, LaneEvent] = TransitionRules(_RULES, "a LaneEvent")


def lane_transition(state: LaneState, event: LaneEvent) -> Transition[LaneState]:
    """Apply ``event`` to ``state``; raises :class:`InvalidTransition` when not allowed."""
    return _TRANSITIONS(state, event)
