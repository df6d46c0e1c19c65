"""Which peers the source can reach: one circuit breaker per peer address.

The state machine is :mod:`wsrm_plugin.statemachine.peer`; this module feeds it
the evidence of every exchange and keeps, per peer, what its rules need (how
many exchanges failed in a row, since when) and what the back-off needs (when
the next probe may go).  The senders (the retransmission worker, the
acknowledgement worker) ask :meth:`Reachability.gate` before a request and
report its outcome after it; that is the whole contract.

What counts as the peer being down, rather than one message's bad luck or
fault (:func:`failure_of`):

* no HTTP answer at all: a connection refused or reset, a timeout, a name
  that does not resolve (:class:`~.transport.TransportError`);
* a gateway's or an overloaded server's answer: 502, 503, 504 (with or
  without the destination's own Retry-After: a store that cannot write turns
  every message away alike) and 429;
* any other 5xx that carries no SOAP envelope (a proxy's error page).

Anything else is an answer from the peer, a SOAP fault included: the peer is
there, and whatever it said is about the message or its sequence (a refusal,
an unknown sequence), which the sequence's own rules handle.  A single
failure is never enough: the peer is unreachable only after
``peer_unreachable_after`` failures in a row spanning at least
``base_retransmission_interval`` with no answer between them, so a lossy
link, or a round's lanes all meeting one refused port in the same
millisecond, does not trip it.

While a peer is unreachable, its messages are *held*: not sent, so they spend
none of their retries, and parked in the store for at most the probe cap (a
crash forgets the breaker; parked messages then come due on their own).  One
request at a time, the *probe*, goes to it after a back-off that starts at
``base_retransmission_interval``, doubles with every failed probe (with
``exponential_backoff``), never exceeds ``max_probe_interval`` (or
``max_retransmission_interval``), never precedes the peer's Retry-After, and
is jittered to 50-100% of its value so that many sources do not probe a
recovering peer in step.  The probe is a real request (the lowest
unacknowledged message of one sequence, or the CreateSequence, Close or
Terminate a sequence owes) and counts as one for its own sequence.  The first
answer from the peer, to the probe or to anything else, makes it reachable
and everything it held due at once.  One WARNING when a peer becomes
unreachable, one INFO when it is back; the attempts in between log at DEBUG.
"""

from __future__ import annotations

import enum
import http.client
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..statemachine import PeerAction, PeerEvent, PeerState, Transition, peer_failure, peer_transition
from .policy import RMPolicy
from .transport import Response

__all__ = ["Gate", "Reachability", "UnreachablePeer", "failure_of"]

log = logging.getLogger(__name__)

#: HTTP statuses that say the peer (or the way to it) cannot take messages now.
_UNAVAILABLE = frozenset({429, 502, 503, 504})
#: A probe that neither answered nor failed after this many HTTP timeouts is taken as failed
#: (the transport may send a request twice when a kept-alive connection turned out closed).
_PROBE_TIMEOUTS = 2.5


def failure_of(response: Response) -> str | None:
    """Why ``response`` says the peer is unavailable (its status, reason, Retry-After and the first
    line of a text body), or None when the peer answered."""
    status = response.status
    if not (status in _UNAVAILABLE or (status >= 500 and not (response.body and response.is_xml))):
        return None
    text = f"HTTP {status} {http.client.responses.get(status, '')}".rstrip()
    retry_after = retry_after_of(response)
    if retry_after is not None:
        text += f" (Retry-After {retry_after:g}s)"
    if response.body.strip() and not response.is_xml:
        text += f": {response.body.strip().splitlines()[0][:200].decode('utf-8', 'replace')!r}"
    return text


def retry_after_of(response: Response) -> float | None:
    """The Retry-After of ``response`` in seconds (None when absent or an HTTP-date)."""
    for name, value in (getattr(response, "headers", None) or {}).items():
        if name.lower() == "retry-after":
            try:
                return max(float(value), 0.0)
            except ValueError:
                return None
    return None


class Gate(enum.Enum):
    """What a sender may do with a request to a peer now."""

    #: The peer is reachable: send as the timers say.
    SEND = "send"
    #: This request is the probe: send it, and report its outcome with ``probe=True``.
    PROBE = "probe"
    #: Hold it: the peer is unreachable and the probe is another request.
    WAIT = "wait"


@dataclass(frozen=True)
class UnreachablePeer:
    """A peer the source holds its messages for (``EngineStatus.unreachable_peers``)."""

    address: str
    #: When it was judged unreachable (epoch seconds).
    since: float
    #: What the last failed exchange met: ``POST ... failed: ConnectionRefusedError(...)``, ``HTTP 503``.
    last_error: str
    #: Probes sent since.
    probes: int
    #: When the next probe may go (epoch seconds); None while one is out.
    next_probe_at: float | None
    #: Messages this process holds for it (parked, unsent) right now.
    held: int = 0

    @property
    def probing(self) -> bool:
        return self.next_probe_at is None


@dataclass
class _Peer:
    state: PeerState = field(default_factory=PeerState.initial)
    failures: int = 0
    first_failure: float = 0.0  # monotonic, of the current run of failures
    since: float = 0.0  # wall clock, when judged unreachable
    last_error: str = ""
    probes: int = 0
    failed_probes: int = 0
    next_probe: float = 0.0  # monotonic
    probe_started: float = 0.0  # monotonic
    retry_after: float = 0.0  # seconds the peer asked for in its last failure
    #: (sequence key, message number) held for it by this process (parked in the store).
    held: set[tuple[str, int]] = field(default_factory=set)


class Reachability:
    """The circuit breakers of one engine's peers, keyed by address (thread-safe).

    ``on_reachable(address)`` is called (outside the lock) when a peer that
    was unreachable answers: the engine makes what it held due and wakes its
    senders.  ``rng`` and ``clock``/``wall`` are for tests.
    """

    def __init__(self, policy: RMPolicy, *, on_reachable: Callable[[str], None] | None = None,
                 rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.on_reachable = on_reachable
        self._rng = rng or random.Random()
        self._clock = clock
        self._wall = wall
        self._peers: dict[str, _Peer] = {}
        self._lock = threading.Lock()
        #: Probes sent, and peers that became unreachable, since the engine started.
        self.probes_sent = 0
        self.outages = 0
        #: Counts every change worth reporting (a peer unreachable or back, a probe's failure).
        self.changes = 0

    @property
    def enabled(self) -> bool:
        return self.policy.peer_unreachable_after is not None

    # -- asking ---------------------------------------------------------------------------------

    def gate(self, address: str) -> Gate:
        """May a request go to ``address`` now?  PROBE moves the peer to probing: the caller
        must send and report the outcome (``probe=True``) or call :meth:`abandon_probe`."""
        with self._lock:
            peer = self._peers.get(address)
            if peer is None or peer.state.sending:
                return Gate.SEND
            now = self._clock()
            self._expire_probe(address, peer, now)
            if peer.state.probing or now < peer.next_probe:
                return Gate.WAIT
            self._apply(address, peer, PeerEvent.PROBE_DUE)
            peer.probe_started = now
            peer.probes += 1
            self.probes_sent += 1
            return Gate.PROBE

    def sending(self, address: str) -> bool:
        """True while the peer is reachable (or failing, not yet judged down): no transition."""
        with self._lock:
            peer = self._peers.get(address)
            return peer is None or peer.state.sending

    def failing(self, address: str) -> bool:
        """The last exchange with the peer failed and none answered since (judged down or not yet)."""
        with self._lock:
            peer = self._peers.get(address)
            return peer is not None and peer.state.failing

    def probes_due(self) -> list[str]:
        """Unreachable peers whose next probe may go now (nothing changes until :meth:`gate`)."""
        now = self._clock()
        with self._lock:
            due = []
            for address, peer in self._peers.items():
                if peer.state.sending:
                    continue
                self._expire_probe(address, peer, now)
                if not peer.state.probing and now >= peer.next_probe:
                    due.append(address)
            return due

    def hold_seconds(self) -> float:
        """How long a held message is parked in the store: the probe cap, so that a crash
        (which forgets every breaker) delays it no longer than a probe would."""
        return self.policy.probe_interval_cap

    # -- telling --------------------------------------------------------------------------------

    def answered(self, address: str) -> None:
        """The peer answered an exchange (any HTTP response of its own)."""
        with self._lock:
            peer = self._peers.get(address)
            if peer is None or not peer.state.failing:
                return
            reopened = self._apply(address, peer, PeerEvent.ANSWERED)
        if reopened and self.on_reachable is not None:
            self.on_reachable(address)

    def failed(self, address: str, error: str, *, probe: bool = False, retry_after: float | None = None) -> None:
        """An exchange with the peer failed the way a down peer fails (see :func:`failure_of`)."""
        if not self.enabled:
            return
        now = self._clock()
        with self._lock:
            peer = self._peers.setdefault(address, _Peer())
            if not peer.state.failing or peer.failures == 0:
                peer.failures, peer.first_failure = 0, now
            peer.failures += 1
            peer.last_error = error
            peer.retry_after = retry_after or 0.0
            if probe:
                self._apply(address, peer, PeerEvent.PROBE_FAILED)
                return
            threshold = self.policy.peer_unreachable_after
            assert threshold is not None  # enabled
            transition = peer_failure(peer.state, failures_in_row=peer.failures, failing_for=now - peer.first_failure,
                                      threshold=threshold, after=self.policy.base_retransmission_interval)
            self._enter(address, peer, transition)

    def abandon_probe(self, address: str) -> None:
        """The probe granted by :meth:`gate` found nothing to send: the next one may go at once."""
        with self._lock:
            peer = self._peers.get(address)
            if peer is None or not peer.state.probing:
                return
            peer.probes -= 1
            self.probes_sent -= 1
            peer.state = peer.state.replace(probing=False)
            peer.next_probe = self._clock() + self.policy.poll_interval

    def held(self, address: str, key: str, numbers: list[int]) -> None:
        """These messages were parked for ``address`` (made due again when it answers)."""
        with self._lock:
            peer = self._peers.get(address)
            if peer is not None and not peer.state.sending:
                peer.held.update((key, n) for n in numbers)

    def held_messages(self, address: str) -> list[tuple[str, int]]:
        """The (sequence key, number) held for ``address``, lowest first: the probe's candidates."""
        with self._lock:
            peer = self._peers.get(address)
            return sorted(peer.held) if peer is not None else []

    def held_keys(self) -> set[str]:
        with self._lock:
            return {key for peer in self._peers.values() for key, _ in peer.held}

    def take_held(self, address: str) -> dict[str, list[int]]:
        """The messages parked for ``address``, by sequence key, forgotten here."""
        with self._lock:
            peer = self._peers.get(address)
            held: dict[str, list[int]] = {}
            for key, number in (peer.held if peer is not None else set()):
                held.setdefault(key, []).append(number)
            if peer is not None:
                peer.held = set()
            return {key: sorted(numbers) for key, numbers in held.items()}

    def forget(self, keys: set[str]) -> None:
        """Sequences that are gone (released, faulted): nothing of theirs is held any more."""
        with self._lock:
            for peer in self._peers.values():
                if peer.held:
                    peer.held = {(k, n) for k, n in peer.held if k not in keys}
            for address in [a for a, p in self._peers.items() if p.state == PeerState() and not p.held]:
                del self._peers[address]  # nothing known worth keeping

    # -- observing ------------------------------------------------------------------------------

    def unreachable(self) -> tuple[UnreachablePeer, ...]:
        """The peers judged unreachable now, oldest outage first."""
        now, wall = self._clock(), self._wall()
        with self._lock:
            out = [UnreachablePeer(address, peer.since, peer.last_error, peer.probes,
                                   None if peer.state.probing else wall + max(peer.next_probe - now, 0.0),
                                   len(peer.held))
                   for address, peer in self._peers.items() if not peer.state.sending]
        return tuple(sorted(out, key=lambda p: p.since))

    # -- inside the lock ------------------------------------------------------------------------

    def _apply(self, address: str, peer: _Peer, event: PeerEvent) -> bool:
        return self._enter(address, peer, peer_transition(peer.state, event))

    def _enter(self, address: str, peer: _Peer, transition: Transition[PeerState]) -> bool:
        """Take ``transition`` and do its actions; True when the peer became reachable again."""
        peer.state = transition.state
        reopened = False
        if transition.actions:
            self.changes += 1
        for action in transition.actions:
            if action is PeerAction.MARK_UNREACHABLE:
                self.outages += 1
                peer.since, peer.probes, peer.failed_probes = self._wall(), 0, 0
                peer.next_probe = self._clock() + self._back_off(peer)
                log.warning("peer %s unreachable: %d exchange(s) in a row failed over %.1fs, the last with %s; "
                            "its messages wait (unsent, spending no retries) while one probe at a time goes to it, "
                            "at most every %gs", address, peer.failures, self._clock() - peer.first_failure,
                            peer.last_error, self.policy.probe_interval_cap)
            elif action is PeerAction.BACK_OFF:
                peer.failed_probes += 1
                delay = self._back_off(peer)
                peer.next_probe = self._clock() + delay
                log.debug("peer %s: probe %d failed (%s); next in %.1fs", address, peer.probes, peer.last_error, delay)
            elif action is PeerAction.MARK_REACHABLE:
                reopened = True
                log.info("peer %s reachable again after %.1fs unreachable (%d probe(s)); sending what waited",
                         address, self._wall() - peer.since, peer.probes)
        if not peer.state.failing:
            peer.failures = 0
        return reopened

    def _back_off(self, peer: _Peer) -> float:
        """Seconds to the next probe: base doubling per failed probe, capped, jittered to
        50-100%, never before the peer's Retry-After (itself capped)."""
        policy = self.policy
        cap = policy.probe_interval_cap
        base = policy.base_retransmission_interval
        exponent = min(peer.failed_probes, 30) if policy.exponential_backoff else 0
        delay = min(base * 2 ** exponent, cap)
        delay *= 0.5 + 0.5 * self._rng.random()
        return max(delay, min(peer.retry_after, cap))

    def _expire_probe(self, address: str, peer: _Peer, now: float) -> None:
        """A probe whose sender never reported (a crash of its thread, a lost store write)."""
        if peer.state.probing and now - peer.probe_started > _PROBE_TIMEOUTS * self.policy.http_timeout + 1.0:
            peer.last_error = peer.last_error or "the probe never ended"
            self._apply(address, peer, PeerEvent.PROBE_FAILED)
