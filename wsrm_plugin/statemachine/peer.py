"""Whether a peer can be reached: the source's circuit breaker, one per peer address.

Retransmission is per message: each unacknowledged message has its own
timer.  That is right for loss (one message's exchange fails while the
others' get through) and wrong for an outage: with the peer down every
message of every sequence to it is sent on its own timer, so a backlog of
thousands of messages becomes thousands of requests per retransmission
interval, all failing the same way, and with ``max_retries`` set every
sequence to the peer is faulted for the peer's absence, not its messages'.
A source tells the two apart the way a circuit breaker does (resilience4j's
CLOSED, OPEN, HALF_OPEN; Polly's and Hystrix's alike): once its exchanges
with a peer fail in a row for a while, the peer is *unreachable*; only one
request, the *probe*, goes to it on a capped, jittered back-off, every other
message waits without being sent or counted, and the first answer from the
peer makes it reachable again and everything due at once.

Factors:

=====  ==========================  ====================================================
 FLG   failing                     the last exchange with the peer failed the way a
                                   down peer fails, and nothing has answered since
 UNR   unreachable                 judged down: only the probe is sent to it
 PRB   probing                     the probe is out: nothing else goes until it ends
=====  ==========================  ====================================================

Of the 8 combinations, 4 are valid: ``-`` (reachable, resilience4j's CLOSED),
``FLG`` (failing, still CLOSED: one more answer clears it), ``FLG UNR``
(OPEN: waiting for the probe's time) and ``FLG UNR PRB`` (HALF_OPEN with one
permitted call).  The rules:

* a peer is judged unreachable on failures, and any answer clears both:
  **UNR implies FLG**;
* only an unreachable peer is probed: **PRB implies UNR**.

What "fails the way a down peer fails" means (a connection refused or reset,
a timeout, a gateway's 502/503/504, a 429) is the engine's classification
(:mod:`wsrm_plugin.engine.reachability`); when failures become DOWN is
:func:`peer_failure`'s rule, from counts the engine keeps.  Nothing here does
I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from .common import FactorState, InvalidTransition, Reason, Transition

__all__ = ["PeerAction", "PeerDuty", "PeerEvent", "PeerState", "peer_duties", "peer_failure", "peer_transition"]


@dataclass(frozen=True)
class PeerState(FactorState):
    failing: bool = False
    unreachable: bool = False
    probing: bool = False

    ABBREVIATIONS = {
        "failing": "FLG",
        "unreachable": "UNR",
        "probing": "PRB",
    }
    PREFIX = "Peer"

    @classmethod
    def _broken_rules(cls, *, failing: bool, unreachable: bool, probing: bool) -> tuple[str, ...]:
        broken = []
        if unreachable and not failing:
            broken.append("UNR needs FLG: a peer is judged unreachable on failures, and an answer clears both")
        if probing and not unreachable:
            broken.append("PRB needs UNR: only an unreachable peer is probed; a reachable one gets every message")
        return tuple(broken)

    @classmethod
    def initial(cls) -> PeerState:
        """A peer nothing is known of is reachable: the first exchanges find out."""
        return cls()

    @property
    def sending(self) -> bool:
        """Every sequence sends to the peer on its own timers (the breaker is closed)."""
        return not self.unreachable


class PeerEvent(Enum):
    ANSWERED = "the peer answered an exchange (any HTTP response of its own, a fault included)"
    FAILED = "an exchange failed the way a down peer fails, not yet enough to judge it down"
    DOWN = "exchanges failed in a row for long enough: the peer is down (see peer_failure)"
    PROBE_DUE = "the back-off ended and the worker sends one request as the probe"
    PROBE_FAILED = "the probe failed the way a down peer fails"


class PeerAction(Enum):
    MARK_UNREACHABLE = "one WARNING; from now on only the probe goes, the rest waits uncounted; first probe scheduled"
    SEND_PROBE = "send one request (one message of one sequence, or a control message) to the peer"
    BACK_OFF = "the next probe after a longer (capped, jittered) back-off"
    MARK_REACHABLE = "one INFO; every waiting message and control message is due at once"


class PeerDuty(Enum):
    SEND = "every sequence sends to the peer as its timers say"
    PROBE = "when the back-off ends, one request to the peer, nothing else"


def _answered(s: PeerState, event: PeerEvent) -> Transition[PeerState]:
    if not s.failing:
        return Transition(s, s)
    actions = (PeerAction.MARK_REACHABLE,) if s.unreachable else ()
    return Transition(s, PeerState(), actions)


def _failed(s: PeerState, event: PeerEvent) -> Transition[PeerState]:
    # An exchange that began before the peer was judged down may end after it: it changes
    # nothing then, least of all the probe's schedule.
    return Transition(s, s.replace(failing=True))


def _down(s: PeerState, event: PeerEvent) -> Transition[PeerState]:
    if s.unreachable:
        return Transition(s, s)
    return Transition(s, PeerState(failing=True, unreachable=True), (PeerAction.MARK_UNREACHABLE,))


def _probe_due(s: PeerState, event: PeerEvent) -> Transition[PeerState]:
    if not s.unreachable:
        raise InvalidTransition(s, event, Reason.UNEXPECTED, "a reachable peer is sent everything, not probed")
    if s.probing:
        raise InvalidTransition(s, event, Reason.UNEXPECTED, "one probe at a time: the last one has not ended")
    return Transition(s, s.replace(probing=True), (PeerAction.SEND_PROBE,))


def _probe_failed(s: PeerState, event: PeerEvent) -> Transition[PeerState]:
    if s.probing:
        return Transition(s, s.replace(probing=False), (PeerAction.BACK_OFF,))
    # An answer reopened the peer while the probe was out: its failure is one like any other.
    # (Judged down again meanwhile, a new probe is due on its own schedule: nothing changes.)
    return Transition(s, s.replace(failing=True))


_RULES: dict[PeerEvent, Callable[[PeerState, PeerEvent], Transition[PeerState]]] = {
    PeerEvent.ANSWERED: _answered,
    PeerEvent.FAILED: _failed,
    PeerEvent.DOWN: _down,
    PeerEvent.PROBE_DUE: _probe_due,
    PeerEvent.PROBE_FAILED: _probe_failed,
}


def peer_transition(state: PeerState, event: PeerEvent) -> Transition[PeerState]:
    """Apply ``event`` to ``state``; raises :class:`InvalidTransition` when not allowed."""
    rule = _RULES.get(event)
    if rule is None:
        raise TypeError(f"not a PeerEvent: {event!r}")
    return rule(state, event)


def peer_failure(state: PeerState, *, failures_in_row: int, failing_for: float, threshold: int,
                 after: float) -> Transition[PeerState]:
    """Interpret one more failed exchange (not the probe's): FAILED, or DOWN once the evidence holds.

    ``failures_in_row`` counts this one; ``failing_for`` is the seconds since
    the first of them.  DOWN needs both ``threshold`` failures and ``after``
    seconds: many requests failing within a few milliseconds are one event (a
    round's lanes all meeting the same refused port), and a single failure now
    and then on a lossy link is loss, not an outage -- it spans no time
    without an answer in between.
    """
    if threshold < 1 or after < 0:
        raise ValueError(f"threshold must be >= 1 and after >= 0, got {threshold} and {after}")
    down = failures_in_row >= threshold and failing_for >= after
    return peer_transition(state, PeerEvent.DOWN if down else PeerEvent.FAILED)


def peer_duties(state: PeerState) -> frozenset[PeerDuty]:
    """What the retransmission worker does for the peer's sequences in ``state``.

    Nothing while the probe is out: its answer (or its failure) decides.
    """
    if state.sending:
        return frozenset({PeerDuty.SEND})
    if not state.probing:
        return frozenset({PeerDuty.PROBE})
    return frozenset()
