"""How the source paces a sequence: what acknowledgements say about the peer, and when to send again.

Two things the retransmission worker learns from its exchanges and keeps in
memory (nothing here is durable: a restart starts from the safe defaults):

* :class:`RttEstimator`, per peer address: the round-trip time of its HTTP
  exchanges, smoothed as TCP does (RFC 6298: SRTT, RTTVAR, RTO = SRTT +
  4 RTTVAR), so a slow peer is not flooded with retransmissions its answers
  were already on the way for.  ``base_retransmission_interval`` stays the
  floor, ``max_retransmission_interval`` the cap, and a message's own timer
  still doubles with each attempt (a silent peer).
* :class:`SequenceFlow`, per source sequence: whether the peer keeps
  out-of-order messages.  A destination may discard a message that is not the
  next in order (gSOAP's does: it delivers only last+1, acknowledging what it
  has); pipelining a sequence to such a peer loses most of what is sent, and
  every message sent after a gap waits for its own timer.  The flow starts
  pipelined; the first acknowledgement in the response to message m that
  leaves m out while an earlier number is missing proves the peer discards, and
  the sequence is then sent one message at a time in number order, in bursts
  that grow while nothing is lost (go-back-N).  After enough clean messages it
  tries pipelining again, waiting twice as long each time it proves wrong.

Ack-driven fast retransmission comes from the same evidence: a number
missing from an acknowledgement given in answer to an exchange that started
after that number's last transmission ended was lost (HTTP pairs each
response with its request, so the evidence is exact), and is sent again at
once instead of when its timer fires; with a discarding peer, so is every
number sent after it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..statemachine import AckRanges

__all__ = ["Exchange", "RttEstimator", "SequenceFlow", "Verdict"]

#: RFC 6298's gains and clock granularity (seconds).
_ALPHA, _BETA, _GRANULARITY = 1 / 8, 1 / 4, 0.001
#: Messages of a discarding peer's sequence sent in order without a loss before pipelining is
#: tried again; doubled each time the peer proves it still discards.
_FIRST_RESUME = 64
_MAX_RESUME = 1 << 20
#: Numbers remembered as sent and unacknowledged per sequence (acks normally prune them).
_MAX_OUTSTANDING = 4096


class RttEstimator:
    """Smoothed round-trip time of one peer (RFC 6298, section 2)."""

    def __init__(self) -> None:
        self.srtt: float | None = None
        self.rttvar = 0.0
        #: Exchanges in a row that got no answer at all (reset by any answer).
        self.failures_in_row = 0
        self._lock = threading.Lock()

    def sample(self, rtt: float) -> None:
        """One answered exchange that took ``rtt`` seconds."""
        rtt = max(rtt, 0.0)
        with self._lock:
            self.failures_in_row = 0
            if self.srtt is None:
                self.srtt, self.rttvar = rtt, rtt / 2
            else:
                self.rttvar = (1 - _BETA) * self.rttvar + _BETA * abs(self.srtt - rtt)
                self.srtt = (1 - _ALPHA) * self.srtt + _ALPHA * rtt

    def failed(self) -> None:
        with self._lock:
            self.failures_in_row += 1

    @property
    def alive(self) -> bool:
        """The peer answered recently: a single failed exchange is loss, not a silent peer."""
        return self.srtt is not None and self.failures_in_row < 3

    def timeout(self, floor: float, cap: float) -> float:
        """The retransmission timeout: SRTT + 4 RTTVAR, never below ``floor`` nor above ``cap``."""
        if self.srtt is None:
            return min(floor, cap)
        return min(max(floor, self.srtt + max(_GRANULARITY, 4 * self.rttvar)), cap)

    def probe_delay(self) -> float:
        """How soon to resend a message whose exchange failed while the peer is otherwise answering.

        A failed exchange with nothing sent after it (the end of a burst) gives
        no acknowledgement to learn from; waiting for the timer would stall the
        sequence.  Two round trips let any late answer land first.
        """
        return max(2 * (self.srtt or 0.0), 0.005)


@dataclass(frozen=True)
class Exchange:
    """One transmission of message ``number`` as it went: when, and what came back."""

    number: int
    started: float
    ended: float
    #: An HTTP response came (whatever its status).
    answered: bool
    #: The acknowledgement of this sequence in the response, if any.
    ack: AckRanges | None = None


@dataclass(frozen=True)
class Verdict:
    """What a round's exchanges say to do now."""

    #: Send these again at once (lost, or sent after a gap to a peer that discards).
    resend: frozenset[int] = frozenset()
    #: Exchanges that failed with no later evidence: resend soon if the peer is alive.
    probe: frozenset[int] = frozenset()
    #: The peer was just seen discarding an out-of-order message.
    discarding: bool = False


@dataclass
class SequenceFlow:
    """What the source knows of one sequence's peer; updated once per sending round."""

    batch: int
    #: Send in order, one message at a time (the peer discards out-of-order messages).
    ordered: bool = False
    #: Messages claimed per round while ordered (grows while nothing is lost).
    window: int = 2
    clean: int = 0
    resume_after: int = _FIRST_RESUME
    #: Number -> when its last transmission ended, for numbers sent and not known acknowledged.
    outstanding: dict[int, float] = field(default_factory=dict)
    discards_seen: int = 0
    fast_retransmits: int = 0

    def claim_limit(self) -> int:
        return self.window if self.ordered else self.batch

    def after_round(self, exchanges: list[Exchange]) -> Verdict:
        """Learn from a round's exchanges (all ended); what to send again now."""
        for ex in sorted(exchanges, key=lambda e: e.ended):
            self.outstanding[ex.number] = ex.ended
        answered = [ex for ex in exchanges if ex.answered and ex.ack is not None]
        acked = AckRanges()
        for ex in answered:
            acked = acked.union(ex.ack)
        for number in [n for n in self.outstanding if n in acked]:
            del self.outstanding[number]
        # Numbers below the highest acknowledged that nobody here sent (a restart): long over.
        for lower, upper in acked.missing_up_to(acked.highest).ranges:
            for number in range(lower, min(upper, lower + self.batch - 1) + 1):
                self.outstanding.setdefault(number, 0.0)
        discarding = any(ex.number not in ex.ack and ex.ack.next_expected < ex.number for ex in answered)
        lost = {n for n, ended in self.outstanding.items()
                if any(ex.started >= ended and n not in ex.ack for ex in answered)}
        resend: set[int] = set()
        if discarding:
            if not self.ordered:  # pipelining (again) proved wrong: in order, and wait longer to retry
                if self.discards_seen:
                    self.resume_after = min(self.resume_after * 2, _MAX_RESUME)
                self.ordered, self.window, self.clean = True, 2, 0
            self.discards_seen += 1
        if self.ordered and (lost or discarding):
            first = min(lost | set(self.outstanding), default=0)
            if first:
                resend = {n for n in self.outstanding if n >= first}
        else:
            resend = lost
        self.fast_retransmits += len(resend)
        last_evidence = max((ex.started for ex in answered), default=-1.0)
        probe = {ex.number for ex in exchanges
                 if not ex.answered and ex.number in self.outstanding and ex.number not in resend
                 and ex.ended > last_evidence}
        if self.ordered:
            if resend or probe or not exchanges:
                self.window = max(2, self.window // 2)
                self.clean = 0 if resend else self.clean
            else:
                self.window = min(self.window * 2, self.batch)
                self.clean += len(exchanges)
                if self.clean >= self.resume_after and not self.outstanding:
                    self.ordered, self.clean = False, 0  # try pipelining again
        if len(self.outstanding) > _MAX_OUTSTANDING:
            for number in sorted(self.outstanding)[:len(self.outstanding) - _MAX_OUTSTANDING]:
                del self.outstanding[number]
        return Verdict(frozenset(resend), frozenset(probe), discarding)

    def forget(self, numbers: set[int]) -> None:
        """Numbers acknowledged (or dropped) by other means."""
        for number in numbers:
            self.outstanding.pop(number, None)
