"""How the source paces a sequence: what acknowledgements say about the peer, and when to send again.

Two things the retransmission worker learns from its exchanges and keeps in
memory (nothing here is durable: a restart starts from the safe defaults):

* :class:`RttEstimator`, per peer address: the round-trip time of its HTTP
  exchanges, smoothed as TCP does (RFC 6298: SRTT, RTTVAR, RTO = SRTT +
  4 RTTVAR), so a slow peer is not flooded with retransmissions its answers
  were already on the way for.  ``base_retransmission_interval`` stays the
  floor, ``max_retransmission_interval`` the cap, and a message's own timer
  still doubles with each attempt while the peer stays silent.
* :class:`SequenceFlow`, per source sequence: whether the peer keeps
  out-of-order messages.  A destination may discard a message that is not the
  next in order (gSOAP's does: it delivers only last+1 and answers a later one
  with a bare 202), or hold it until the gap fills; pipelining a sequence to
  such a peer loses (or stalls) most of what is sent.  A sequence starts in
  order, one message at a time, in bursts that grow while nothing is lost
  (go-back-N); it tries pipelining once its in-order rate is known and keeps
  whichever way delivers faster, trying the other again after twice as many
  messages each time it loses.  An answer to message m that leaves m out
  while an earlier number is missing proves the peer discards: back to in
  order at once.

Ack-driven fast retransmission comes from the same evidence: a number
missing from an acknowledgement given in answer to an exchange that started
after that number's last transmission ended was lost (HTTP pairs each
response with its request, so the evidence is exact), and is sent again at
once instead of when its timer fires; with a discarding peer, so is every
number sent after it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from ..statemachine import AckRanges

__all__ = ["Exchange", "RttEstimator", "SequenceFlow", "Verdict"]

#: RFC 6298's gains and clock granularity (seconds).
_ALPHA, _BETA, _GRANULARITY = 1 / 8, 1 / 4, 0.001
#: Messages sent one way before the other way is tried for a round; doubled each time the try
#: loses.  The other way must deliver this much faster to be kept.
_FIRST_PROBE = 32
_MAX_PROBE = 1 << 20
_MARGIN = 1.25
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
    #: A 2xx answer without an acknowledgement (gSOAP's bare 202 for a message it dropped).
    bare: bool = False


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
    """What the source knows of one sequence's peer; updated once per sending round.

    Two ways to send a sequence: *pipelined* (a round's messages over several
    connections at once) and *ordered* (one at a time, in number order, in
    bursts of ``window``).  Which one is right depends on the peer: one that
    buffers gains from pipelining; one that discards out-of-order messages
    loses them (proved by its acknowledgements: ordered at once), and one
    that holds them until the gap fills (gSOAP with a hold time) answers
    slowly.  So a sequence starts ordered, measures the delivery rate of each
    way and, first as soon as the ordered rate is known and then every
    ``probe_after`` messages, tries the other way for one round; it keeps the
    faster one (by a margin), and waits twice as long before the next try
    each time the try loses.
    """

    batch: int
    concurrency: int = 4
    #: Send in order, one message at a time (the peer discards or holds out-of-order messages).
    #: A sequence starts so (safe with every peer) and tries pipelining once its rate is known.
    ordered: bool = True
    #: Messages claimed per round while ordered (grows while nothing is lost).
    window: int = 2
    #: Messages sent in the current way since the last decision.
    since: int = 0
    probe_after: int = _FIRST_PROBE
    #: This round tries the other way (decided on at the round's end).
    probing: bool = False
    probes: int = 0
    #: Messages per second delivered by each way (key: ordered), smoothed.
    rates: dict[bool, float] = field(default_factory=dict)
    #: Number -> when its last transmission ended, for numbers sent and not known acknowledged.
    outstanding: dict[int, float] = field(default_factory=dict)
    discards_seen: int = 0
    fast_retransmits: int = 0
    #: Everything the peer acknowledged in its responses so far.
    known: AckRanges = field(default_factory=AckRanges)
    #: The peer puts acknowledgements in its responses (an anonymous AcksTo).
    acks_in_responses: bool = False
    _round: tuple[bool, float] | None = None

    def pipeline(self) -> None:
        """Send pipelined from the next round on, as a try of it that won would decide: for a peer
        known to keep what arrives out of order.  The rates measured so far are kept, and a
        discard seen later puts the sequence back in order, as ever."""
        self.ordered, self.probing, self.since = False, False, 0

    def claim_limit(self) -> int:
        if self.ordered:
            return self.window
        return min(self.batch, 2 * self.concurrency) if self.probing else self.batch

    def note_round(self, *, ordered: bool, seconds: float) -> None:
        """This round's messages of the sequence took ``seconds`` to send, one way or the other."""
        self._round = (ordered, seconds)

    def _note_rate(self, sent: list[int], acked: AckRanges) -> None:
        """Messages per second the round delivered: acknowledged ones when the answers say, else sent."""
        if self._round is None:
            return
        ordered, seconds = self._round
        self._round = None
        if len(sent) < 2 or seconds <= 0:
            return  # one message says nothing about pipelining
        delivered = sum(1 for n in sent if n in acked) if self.acks_in_responses else len(sent)
        rate = delivered / seconds
        old = self.rates.get(ordered)
        self.rates[ordered] = rate if old is None else (old + rate) / 2

    def after_round(self, exchanges: list[Exchange]) -> Verdict:
        """Learn from a round's exchanges (all ended); what to send again now."""
        for ex in sorted(exchanges, key=lambda e: e.ended):
            self.outstanding[ex.number] = ex.ended
        answered = [ex for ex in exchanges if ex.answered and ex.ack is not None]
        acked = self.known
        for ex in answered:
            if ex.ack is not None:
                acked = acked.union(ex.ack)
        self.known = acked
        if answered:
            self.acks_in_responses = True
        if self.acks_in_responses:
            # A peer that acknowledges in its responses answered without one: it did not take
            # the message (gSOAP drops an out-of-order message with a bare 202).  What it holds
            # is what it acknowledged last.
            answered += [replace(ex, ack=acked) for ex in exchanges if ex.bare]
        for number in [n for n in self.outstanding if n in acked]:
            del self.outstanding[number]
        # Numbers below the highest acknowledged that nobody here sent (a restart): long over.
        for lower, upper in acked.missing_up_to(acked.highest).ranges:
            for number in range(lower, min(upper, lower + self.batch - 1) + 1):
                self.outstanding.setdefault(number, 0.0)
        self._note_rate([ex.number for ex in exchanges], acked)
        discarding = any(ex.ack is not None and ex.number not in ex.ack and ex.ack.next_expected < ex.number
                         for ex in answered)
        lost = {n for n, ended in self.outstanding.items()
                if any(ex.ack is not None and ex.started >= ended and n not in ex.ack for ex in answered)}
        if discarding:
            self.discards_seen += 1
            if not self.ordered:  # pipelining loses messages with this peer: in order from now on
                if self.probing or self.discards_seen > 1:
                    self.probe_after = min(self.probe_after * 2, _MAX_PROBE)
                self.ordered, self.window, self.since, self.probing = True, 2, 0, False
        resend: set[int] = set()
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
            if resend or probe:
                self.window = max(2, self.window // 2)
            else:
                self.window = min(self.window * 2, self.batch)
        self._choose_way(len(exchanges))
        if len(self.outstanding) > _MAX_OUTSTANDING:
            for number in sorted(self.outstanding)[:len(self.outstanding) - _MAX_OUTSTANDING]:
                del self.outstanding[number]
        return Verdict(frozenset(resend), frozenset(probe), discarding)

    def taken_alone(self, exchange: Exchange) -> bool:
        """Learn from one exchange sent alone (a caller's own send) whose answer acknowledged its
        message and every number before it, with nothing else of the sequence out and no try of
        the other way under way: True, and what :meth:`after_round` would learn from it is
        learnt (the acknowledgement, the window, the count of messages sent), in a few steps
        instead of its general ones (no loss, no discard, nothing to send again can follow
        from such an answer).  False, nothing learnt: give it to :meth:`after_round`."""
        ack = exchange.ack
        if ack is None or self.outstanding or self.probing or len(ack.ranges) != 1:
            return False
        lower, upper = ack.ranges[0]
        if lower != 1 or not exchange.number <= upper:
            return False
        known = self.known.ranges
        if known and (len(known) != 1 or known[0][1] > upper):
            return False  # the acknowledgement holds less than is known: the general way
        self.known = ack
        self.acks_in_responses = True
        if self.ordered:
            self.window = min(self.window * 2, self.batch)
        self.since += 1
        return True

    def _choose_way(self, sent: int) -> None:
        self.since += sent
        if self.probing:  # the round just sent tried the other way: keep the faster
            self.probing = False
            tried, kept = self.rates.get(self.ordered), self.rates.get(not self.ordered)
            if tried is None or kept is None or tried < _MARGIN * kept:
                self.ordered = not self.ordered
                self.probe_after = min(self.probe_after * 2, _MAX_PROBE)
            self.since = 0
        elif self.since >= self.probe_after or (self.probes == 0 and self.ordered in self.rates):
            # the first try comes as soon as the ordered way's rate is known
            self.probing, self.ordered, self.since = True, not self.ordered, 0
            self.probes += 1
            self.window = max(self.window, self.concurrency)
