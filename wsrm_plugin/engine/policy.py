"""The knobs of a reliable engine, in one frozen dataclass (CXF's RMAssertion + RMManager settings).

Users of CXF, Sandesha2 and WCF expect the same handful of settings: the
delivery assurance, how often and how long to retransmit, when to
acknowledge, when to give up on a silent peer, how big a sequence may grow.
They live here, validated once, so the workers never have to wonder whether a
number makes sense.  Times are seconds (floats).

The security limits are not optional extras: a WS-RM destination keeps state
for every sequence a peer opens and every message it holds back for ordering,
so without limits any client can exhaust the server's memory or disk.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass

from ..wire import (
    RM10, RM11, SOAP11, SOAP12, WSA_2004_08, WSA_2005_08, AddressingVersion, RMVersion, SoapVersion,
)
from ..wire.xmlsafe import DEFAULT_MAX_SIZE

__all__ = ["AckRequestMode", "DeliveryAssurance", "RMPolicy", "RetryStep", "POISON_HANDLING"]

#: The values of :attr:`RMPolicy.poison_handling`.
POISON_HANDLING = ("hold", "continue")


@dataclass(frozen=True)
class RetryStep:
    """What follows a failed delivery: its new durable retry state, or the poison store."""

    #: Failed attempts in the current cycle (every attempt when ``poisoned``).
    attempts: int
    #: Retry cycles begun after the first.
    cycle: int
    #: When to try again (None once ``poisoned``).
    next_attempt_at: float | None
    #: True: the last cycle is used up, the message goes to the poison store.
    poisoned: bool


class DeliveryAssurance(enum.Flag):
    """The delivery assurances of WS-RM Policy (CXF and Metro names); combine with ``|``.

    ``EXACTLY_ONCE`` is ``AT_MOST_ONCE | AT_LEAST_ONCE``; ``IN_ORDER`` adds
    ordering to any of them.  Without ``AT_LEAST_ONCE`` the source sends each
    message once and never retransmits it; without ``IN_ORDER`` the
    destination hands messages over as they arrive.  The destination never
    delivers a duplicate, whatever the assurance (stronger than AtLeastOnce
    asks, and free).
    """

    AT_MOST_ONCE = 1
    AT_LEAST_ONCE = 2
    EXACTLY_ONCE = 3
    IN_ORDER = 4


class AckRequestMode(enum.Enum):
    """When the source adds an AckRequested header to an application message."""

    NEVER = "never"
    #: On retransmissions only: a message sent again is overdue, so the peer should
    #: answer at once rather than after its acknowledgement interval.
    RETRANSMISSIONS = "retransmissions"
    ALWAYS = "always"


_WSA_BY_NAME = {"2004/08": WSA_2004_08, "2005/08": WSA_2005_08}
_RM_BY_NAME = {"1.0": RM10, "1.1": RM11}
_SOAP_BY_NAME = {"1.1": SOAP11, "1.2": SOAP12}
_OUT_OF_ORDER = ("buffer", "discard")


def _version(value, table: dict, what: str):
    if isinstance(value, str):
        try:
            return table[value]
        except KeyError:
            raise ValueError(f"{what} {value!r} is not one of {sorted(table)}") from None
    if value not in table.values():
        raise ValueError(f"{what} must be one of {sorted(table)}, not {value!r}")
    return value


@dataclass(frozen=True)
class RMPolicy:
    """Reliable messaging settings for one engine (both its source and its destination side).

    Versions may be given as objects (``RM11``) or names (``"1.1"``,
    ``"2005/08"``); ``wsa_version`` defaults to the RM version's usual
    partner (1.0 with 2004/08, 1.1 with 2005/08).
    """

    # -- what is promised ------------------------------------------------------------
    delivery: DeliveryAssurance = DeliveryAssurance.EXACTLY_ONCE | DeliveryAssurance.IN_ORDER

    # -- the source: retransmission ----------------------------------------------------
    #: Seconds before an unacknowledged message (or unanswered control message) is sent again:
    #: the floor of the retransmission timeout, which follows the peer's measured round-trip
    #: time above it (SRTT + 4 RTTVAR, as TCP).  A message an acknowledgement proves lost is
    #: sent again at once, whatever its timer.
    base_retransmission_interval: float = 3.0
    #: Double the interval after each attempt (capped by ``max_retransmission_interval``).
    exponential_backoff: bool = True
    max_retransmission_interval: float = 60.0
    #: Retransmissions allowed per message or control message before the sequence is faulted
    #: and the application told; None retries for ever.
    max_retries: int | None = None
    #: TerminateSequence goes out at most this many times, then the sequence is released
    #: anyway: it is only sent once every message is acknowledged, so a destination that
    #: never answers it (gone, or answering something else) must not keep it for ever.
    max_terminate_attempts: int = 10
    ack_request: AckRequestMode = AckRequestMode.RETRANSMISSIONS
    #: Flow control: at most this many messages of a sequence sent and not yet acknowledged
    #: (retransmissions are not held back); None means no window.
    max_unacknowledged: int | None = None
    #: Messages per sequence before the source rolls over to a new sequence; None: no limit.
    max_sequence_length: int | None = None
    #: 1.1: send CloseSequence (and get the final acknowledgement) before TerminateSequence.
    close_before_terminate: bool = True
    #: On ``stop()``, close every open source sequence and wait (up to the stop timeout)
    #: for them to terminate.
    terminate_on_shutdown: bool = False
    #: Offered sequences (for replies) are accepted from peers that offer one.
    accept_offers: bool = True

    # -- the destination: acknowledgement and lifetime ---------------------------------------
    #: Ask peers to send acknowledgements to this engine's endpoint (AcksTo = the served
    #: address) instead of on the HTTP back-channel of each message (AcksTo anonymous).
    decoupled_acks: bool = False
    #: 0 acknowledges at once; otherwise acknowledgements to an addressable AcksTo are
    #: batched for this long (acks on the HTTP back-channel are always immediate: free).
    acknowledgement_interval: float = 0.0
    #: A destination sequence with no message for this long is terminated (None: never).
    inactivity_timeout: float | None = 600.0
    # -- the invoker: failed deliveries, retry cycles, the poison store --------------------------
    # A delivery that raises rolls back and the message stays in the store.  A *failure to
    # process* (any exception but a declared SOAP fault: a database down, a timeout, a bug) is
    # retried ``max_delivery_attempts`` times with a growing delay, then again in up to
    # ``max_retry_cycles`` further cycles ``retry_cycle_delay`` apart, the count and the next
    # attempt time durable in the store; after the last cycle the message moves to the poison
    # store, where only an operator (``wsrm poison retry|discard``) ends its life.  An
    # *application fault* (the method's declared SOAP fault) is the service's answer: after
    # ``max_delivery_attempts`` (at once for a Sender fault) it goes back on the response
    # sequence; a one-way message has nobody to hear it and goes to the poison store.
    # Anchors: WCF queued delivery (ReceiveRetryCount, MaxRetryCycles, RetryCycleDelay,
    # ReceiveErrorHandling=Move), CXF's RM destination redelivery (destinationPolicy/retryPolicy
    # maxRetries, CXF-4209), ActiveMQ Artemis (max-delivery-attempts, redelivery-delay,
    # redelivery-delay-multiplier, max-redelivery-delay, dead-letter-address).

    #: Times a message is handed to the application in one retry cycle.  WCF:
    #: ``ReceiveRetryCount`` + 1 (it counts retries, default 5); CXF:
    #: ``retryPolicy/@maxRetries`` + 1; Artemis: ``max-delivery-attempts`` (of one cycle).
    max_delivery_attempts: int = 3
    #: Seconds before the second attempt of a cycle; each further one waits
    #: ``delivery_retry_multiplier`` times longer, at most ``max_delivery_retry_delay``.
    #: WCF retries at once (no knob); Artemis: ``redelivery-delay``; ActiveMQ Classic:
    #: ``initialRedeliveryDelay``.
    delivery_retry_delay: float = 0.2
    #: Growth of the delay between attempts of a cycle (1: constant).  Artemis:
    #: ``redelivery-delay-multiplier``; ActiveMQ Classic: ``backOffMultiplier``.
    delivery_retry_multiplier: float = 2.0
    #: Cap of the delay between attempts of a cycle.  Artemis: ``max-redelivery-delay``.
    max_delivery_retry_delay: float = 10.0
    #: Further cycles of ``max_delivery_attempts`` after the first one; 0: poison after the
    #: first cycle.  WCF: ``MaxRetryCycles`` (default 2).  CXF and Artemis have one cycle.
    max_retry_cycles: int = 2
    #: Seconds between two cycles: long enough for a database to come back.  WCF:
    #: ``RetryCycleDelay`` (default 30 minutes).
    retry_cycle_delay: float = 60.0
    #: What the rest of a sequence does once one of its messages is in the poison store:
    #: ``"hold"`` (default): nothing after it is delivered until an operator retries or
    #: discards it (InOrder is kept; an ERROR names the message; without InOrder there is no
    #: order to keep and the others go on); ``"continue"``: the others are delivered without it
    #: (with InOrder, the order minus the poisoned message).  WCF:
    #: ``ReceiveErrorHandling`` Fault (the queue stops) versus Move (to the poison subqueue,
    #: the rest goes on); the message itself is always kept (Move), never Drop.  Artemis:
    #: a message sent to its ``dead-letter-address`` no longer blocks its queue (continue).
    poison_handling: str = "hold"
    #: A request whose ReplyTo is anonymous (a client without a listener) gets its reply in
    #: the HTTP response: the HTTP thread waits this long for the invoker to produce it, then
    #: answers 202 and the reply goes out with the client's next retransmission (0: never wait).
    back_channel_reply_wait: float = 5.0

    # -- wire -------------------------------------------------------------------------------
    rm_version: RMVersion = RM11
    wsa_version: AddressingVersion | None = None
    soap_version: SoapVersion = SOAP12

    # -- security limits (destination) --------------------------------------------------------
    max_open_sequences: int = 1000
    max_open_sequences_per_peer: int = 100
    #: Messages a destination sequence may hold received and not yet delivered (out-of-order
    #: messages waiting for a gap, or a slow application); beyond it messages are refused
    #: unacknowledged, so the source retransmits them later.
    max_unacknowledged_held: int = 10_000
    #: Bytes of received, undelivered messages a destination may hold for one sequence, for
    #: all the sequences of one peer, and in total (WCF bounds its buffer in messages,
    #: ``MaxTransferWindowSize``; a broker in bytes, Artemis' ``max-size-bytes``).  A message
    #: beyond one of them is refused unacknowledged (HTTP 503 with Retry-After, a Receiver
    #: fault that leaves the sequence as it was), so the source retransmits it later; the
    #: message that fills an InOrder gap is always taken (refusing it would hold the rest for ever).
    max_held_bytes_per_sequence: int = 64 * 1024 * 1024
    max_held_bytes_per_peer: int = 256 * 1024 * 1024
    max_held_bytes: int = 1024 * 1024 * 1024
    #: Seconds a refused sender is told to wait (HTTP Retry-After) when the destination is
    #: full or its store cannot take a message now (disk full, database down).
    retry_after: int = 5
    #: What the destination does with a message that is not the next one in order:
    #: ``"buffer"`` keeps it until the gap is filled (fewer retransmissions); ``"discard"``
    #: drops it unacknowledged, as gSOAP does, so the source sends it again once the gap is
    #: filled (nothing held: bounded memory whatever the peers send).
    out_of_order: str = "buffer"
    max_message_size: int = DEFAULT_MAX_SIZE

    # -- plumbing -------------------------------------------------------------------------------
    #: How often idle workers look at the store anyway (work is normally signalled at once).
    poll_interval: float = 0.2
    #: Messages the source claims and sends per round.
    send_batch: int = 50
    #: HTTP requests of a round in flight at once (one keep-alive connection each), so the
    #: peer's durable receives overlap; the window (``max_unacknowledged``) still bounds them.
    send_concurrency: int = 4
    #: HTTP timeout (connect and read) for messages the engine sends.
    http_timeout: float = 10.0
    invoker_threads: int = 1
    #: Messages of one sequence the invoker delivers in one transaction; 1: one each.  Without
    #: a transaction manager each sits in its own savepoint (a failure is settled alone); with
    #: one the batch is one XA transaction, rolled back whole when a message fails, after which
    #: that message is delivered alone (see ``InvokerWorker._batches``).
    #: Off by default: a crash repeats the whole batch's NON-transactional side effects
    #: (a file written, a mail sent), so raising it widens the at-least-once window of an
    #: application that does work outside the store.  Work in the store stays exactly once.
    delivery_batch: int = 1
    #: A batch stops taking messages after this many seconds: until it commits it holds its
    #: sequence's buffer (and a SQLite store's whole file).  On PostgreSQL, where receiving
    #: never waits for a delivery, a longer batch spreads its two-phase commit over more
    #: messages; on a busy machine 0.05 s ends most batches after a handful.
    delivery_batch_seconds: float = 0.05
    #: Messages of one sequence received at the same time (one per HTTP thread) that are
    #: recorded in one store transaction: one commit, and one read of the sequence's row,
    #: instead of one each queued on the row's lock.  No receive waits for a batch to fill:
    #: a batch is whatever arrived while the one before committed.  Each is acknowledged
    #: after that commit, and a message refused in a batch is refused alone.  1: each alone;
    #: None: 16 where a commit is costly (SQLite, PostgreSQL), 1 in memory.
    receive_batch: int | None = None
    #: At the first engine start of a process, take the objects alive then (modules, the WSDL
    #: and spyne's models, the engine itself) out of the cyclic garbage collector's sight:
    #: one collection, then ``gc.freeze()``.  spyne runs a full collection every second in
    #: the request's thread (``MethodContext.close``); delivering on receipt, that is inside
    #: the delivery's transaction, which holds its sequence's row lock, so every message of
    #: the sequence waits for it: 15-20 ms each second with the start-up objects in sight,
    #: about 1 ms without them.  Frozen objects are still freed when nothing refers to them;
    #: only a reference cycle among them is never collected (see ``gc.freeze``).  False:
    #: the collector is left as it is.
    freeze_gc_at_start: bool = True
    #: Hand a message that is next in order to the application in the very transaction that
    #: receives it, in the receiving thread (as CXF does), instead of buffering it for an
    #: invoker thread: one transaction per message instead of two, no buffer row written and
    #: deleted, and under a transaction manager one XA transaction (one phase when the store
    #: and the application share a database).  Exactly as safe: the receipt and the delivery
    #: commit together or not at all, and the acknowledgement goes out after that commit.
    #: A message that is not next (a gap, an earlier one waiting for a retry) is buffered as
    #: without it (one that waits for the delivery of the one before it takes it after that
    #: delivery commits); one whose delivery fails is received again into the buffer, that try
    #: counted as its first attempt, and the invoker threads settle it (attempts, delays,
    #: poison) as any failed delivery.  The cost: the receive, and so its acknowledgement,
    #: waits for the application, and receives of one sequence queue behind each other's
    #: applications (so an application slower than 50 ms a message, lately, gets its messages
    #: through the buffer: HTTP threads are not held for it, and other peers' messages do not
    #: wait for threads).  None: on with InOrder delivery under a transaction manager (where
    #: the second transaction costs most) or where a commit is costly (SQLite, PostgreSQL: a
    #: second flush; bench_compare, SQLite: 1.02 fsyncs per message on the service instead of
    #: 1.82, 0.79 of plain calls instead of 0.72), off otherwise (the memory store).
    #: Concurrent receives are then recorded one by one unless ``receive_batch`` says
    #: otherwise (a batch is always buffered: delivering several messages in one transaction
    #: is ``delivery_batch``'s trade-off).
    deliver_on_receive: bool | None = None

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("rm_version", _version(self.rm_version, _RM_BY_NAME, "rm_version"))
        set_("soap_version", _version(self.soap_version, _SOAP_BY_NAME, "soap_version"))
        if self.wsa_version is not None:
            set_("wsa_version", _version(self.wsa_version, _WSA_BY_NAME, "wsa_version"))
        if self.out_of_order not in _OUT_OF_ORDER:
            raise ValueError(f"out_of_order must be one of {_OUT_OF_ORDER}, not {self.out_of_order!r}")
        if isinstance(self.ack_request, str):
            set_("ack_request", AckRequestMode(self.ack_request))
        if not isinstance(self.delivery, DeliveryAssurance):
            raise TypeError(f"delivery must be a DeliveryAssurance, not {self.delivery!r}")
        if not self.delivery & DeliveryAssurance.EXACTLY_ONCE:
            raise ValueError("delivery needs AT_MOST_ONCE and/or AT_LEAST_ONCE (IN_ORDER only adds order)")
        for name in ("base_retransmission_interval", "max_retransmission_interval", "poll_interval",
                     "http_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, not {getattr(self, name)!r}")
        if self.max_retransmission_interval < self.base_retransmission_interval:
            raise ValueError("max_retransmission_interval must be >= base_retransmission_interval")
        if not self.back_channel_reply_wait >= 0:
            raise ValueError("back_channel_reply_wait must be >= 0 seconds (0: never wait)")
        if not self.delivery_batch_seconds > 0:
            raise ValueError(f"delivery_batch_seconds must be > 0, not {self.delivery_batch_seconds!r}")
        if self.acknowledgement_interval < 0:
            raise ValueError("acknowledgement_interval must be >= 0 (0 acknowledges at once)")
        if self.inactivity_timeout is not None and not self.inactivity_timeout > 0:
            raise ValueError("inactivity_timeout must be > 0 seconds or None (never)")
        for name in ("max_retries",):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be an int >= 0 or None, not {value!r}")
        if not isinstance(self.max_terminate_attempts, int) or self.max_terminate_attempts < 1:
            raise ValueError(f"max_terminate_attempts must be an int >= 1, not {self.max_terminate_attempts!r}")
        if self.deliver_on_receive not in (None, True, False):
            raise ValueError(f"deliver_on_receive must be True, False or None (automatic), "
                             f"not {self.deliver_on_receive!r}")
        for name in ("max_unacknowledged", "max_sequence_length", "receive_batch"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 or None, not {value!r}")
        for name in ("delivery_retry_delay", "max_delivery_retry_delay", "retry_cycle_delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be >= 0 seconds, not {value!r}")
        if self.max_delivery_retry_delay < self.delivery_retry_delay:
            raise ValueError("max_delivery_retry_delay must be >= delivery_retry_delay")
        if isinstance(self.delivery_retry_multiplier, bool) or \
                not isinstance(self.delivery_retry_multiplier, (int, float)) or \
                not self.delivery_retry_multiplier >= 1:
            raise ValueError(f"delivery_retry_multiplier must be >= 1, not {self.delivery_retry_multiplier!r}")
        if isinstance(self.max_retry_cycles, bool) or not isinstance(self.max_retry_cycles, int) or \
                self.max_retry_cycles < 0:
            raise ValueError(f"max_retry_cycles must be an int >= 0, not {self.max_retry_cycles!r}")
        if self.poison_handling not in POISON_HANDLING:
            raise ValueError(f"poison_handling must be one of {list(POISON_HANDLING)}, not {self.poison_handling!r}")
        for name in ("max_open_sequences", "max_open_sequences_per_peer", "max_unacknowledged_held",
                     "max_message_size", "send_batch", "invoker_threads", "max_delivery_attempts",
                     "delivery_batch", "send_concurrency", "max_held_bytes_per_sequence",
                     "max_held_bytes_per_peer", "max_held_bytes", "retry_after"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, not {value!r}")

        for name in ("max_held_bytes_per_sequence", "max_held_bytes_per_peer", "max_held_bytes"):
            if getattr(self, name) < self.max_message_size:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= max_message_size "
                                 f"({self.max_message_size}): a message alone must fit")

    # -- derived ----------------------------------------------------------------------------------

    @property
    def addressing(self) -> AddressingVersion:
        """The WS-Addressing version to write: ``wsa_version``, else the RM version's partner."""
        return self.wsa_version or self.rm_version.addressing

    @property
    def in_order(self) -> bool:
        return bool(self.delivery & DeliveryAssurance.IN_ORDER)

    def delivers_on_receive(self, transaction_manager: bool, costly_commits: bool = False) -> bool:
        """``deliver_on_receive``, its automatic value resolved (see there); ``costly_commits``:
        the store's ``commits_are_costly``."""
        if self.deliver_on_receive is None:
            return (transaction_manager or costly_commits) and self.in_order
        return self.deliver_on_receive

    @property
    def discards_out_of_order(self) -> bool:
        return self.out_of_order == "discard"

    @property
    def retransmits(self) -> bool:
        return bool(self.delivery & DeliveryAssurance.AT_LEAST_ONCE)

    def retry_delay(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th transmission before the next one."""
        if attempts < 1:
            return 0.0
        if not self.exponential_backoff:
            return self.base_retransmission_interval
        exponent = min(attempts - 1, 30)  # 2**30 intervals is beyond any cap
        return min(self.base_retransmission_interval * 2 ** exponent, self.max_retransmission_interval)

    def retries_exhausted(self, attempts: int) -> bool:
        """True when ``attempts`` transmissions already used up the retry budget."""
        return self.max_retries is not None and attempts > self.max_retries

    @property
    def explicit_fields(self) -> frozenset[str]:
        """The fields the user set (constructor arguments and :meth:`replace` changes).

        What a service's WSDL publishes (its WS-RM policy assertion) may
        override every other field, never these.  ``dataclasses.replace``
        marks every field explicit (it passes them all); :meth:`replace` only
        the changed ones.
        """
        return getattr(self, "_explicit", frozenset())

    @property
    def holds_on_poison(self) -> bool:
        return self.poison_handling == "hold"

    def delivery_retry_delay_after(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt of a cycle."""
        if attempts < 1:
            return 0.0
        exponent = min(attempts - 1, 60)
        return min(self.delivery_retry_delay * self.delivery_retry_multiplier ** exponent,
                   self.max_delivery_retry_delay)

    def after_failure(self, attempts: int, cycle: int, now: float) -> RetryStep:
        """The retry state after one more failed attempt, given the state before it.

        ``attempts`` failed attempts so far in cycle ``cycle``; the result is
        the next attempt in this cycle, the first of the next cycle after
        ``retry_cycle_delay``, or the poison store after the last cycle.
        """
        attempts += 1
        if attempts < self.max_delivery_attempts:
            return RetryStep(attempts, cycle, now + self.delivery_retry_delay_after(attempts), False)
        if cycle < self.max_retry_cycles:
            return RetryStep(0, cycle + 1, now + self.retry_cycle_delay, False)
        total = cycle * self.max_delivery_attempts + attempts
        return RetryStep(total, cycle + 1, None, True)

    def replace(self, **changes) -> RMPolicy:
        new = dataclasses.replace(self, **changes)
        object.__setattr__(new, "_explicit", self.explicit_fields | frozenset(changes))
        return new


_generated_init = RMPolicy.__init__
_INIT_FIELDS = tuple(f.name for f in dataclasses.fields(RMPolicy) if f.init)  # positional order


@functools.wraps(_generated_init)
def _remembering_init(self: RMPolicy, *args, **kwargs) -> None:
    # Which knobs the user chose is worth keeping: a default may yield to the service's
    # published policy, a choice may not (see explicit_fields).  Not a dataclass field, so
    # it takes no part in equality, hashing or repr.
    object.__setattr__(self, "_explicit", frozenset(_INIT_FIELDS[:len(args)]) | frozenset(kwargs))
    _generated_init(self, *args, **kwargs)


RMPolicy.__init__ = _remembering_init  # type: ignore[method-assign]
