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
from collections.abc import Callable
from dataclasses import dataclass

from ..wire import (
    RM10, RM11, SOAP11, SOAP12, WSA_2004_08, WSA_2005_08, AddressingVersion, RMVersion, SoapVersion,
)
from ..wire.xmlsafe import DEFAULT_MAX_SIZE
from .knobs import Choice, Converted, Count, ExceptionTypes, Flag, Hook, Named, Number, Seconds, check_fields, knob

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


def _assurance(value: object) -> DeliveryAssurance:
    if not isinstance(value, DeliveryAssurance):
        raise TypeError(f"delivery must be a DeliveryAssurance, not {value!r}")
    if not value & DeliveryAssurance.EXACTLY_ONCE:
        raise ValueError("delivery needs AT_MOST_ONCE and/or AT_LEAST_ONCE (IN_ORDER only adds order)")
    return value


def _switch_interval(value: object) -> float | bool | None:
    if value is None or value is False:
        return value
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"interpreter_switch_interval must be > 0 seconds, False or None, not {value!r}")
    return value


_SECONDS = Seconds()                      # > 0
_DELAY = Seconds(inclusive=True)          # >= 0
_COUNT = Count()                          # int >= 1
_SIZE = Count()                           # bytes, >= 1


#: Invoker threads where ``RMPolicy.invoker_threads`` is None and the store runs different
#: sequences' transactions at once: enough for the sequences a service usually takes side by side
#: on a few cores (bench_compare --clients 16, memory store: 1 thread delivered 0.79 of plain calls
#: from 16 threads, 4 threads 0.92, medians of 3 rounds on a loaded 2-core machine).
AUTOMATIC_INVOKER_THREADS = 4
#: Invoker threads, and threads of a built-in HTTP server, where one-way messages are buffered
#: and delivered by the receiving HTTP threads once their responses are written (the memory
#: store without a transaction manager: ``deliver_on_receive`` automatic).  There an HTTP thread,
#: after its answer, runs deliveries while the application waits for its own database, within
#: the invoker's places: with 4 and 4, 0.64-0.84 of the requests found no HTTP thread idle and
#: 3.2-3.5 applications ran at once (plain spyne's 8 threads: 3.4-5.7).  bench_compare --clients
#: 16 --calls 2000, 8 and 8 against 4 and 4 interleaved (load 17-37, three runs): 8 and 8 won 12
#: of 15 rounds (6 and 6 of them applications at once, 0.23-0.51 found no thread idle), at the
#: same service CPU a message (medians 1.92 and 1.90 ms) and 40% more service thread switches
#: (14 against 10 a message).  Not measured on a quiet machine, where the service's interpreter
#: may bound the rate: ``serve(threads=4)`` and ``invoker_threads=4`` give the old counts back.
AUTOMATIC_THREADS_BUFFERED = 8

#: Threads of a built-in HTTP server (``serve(threads=None)``), whatever the store, unless one of
#: the counts below applies (SQLite delivering apart, PostgreSQL under a transaction manager).  On
#: PostgreSQL a receive waits in its HTTP thread for its durable commit, so more threads let
#: more receives share one WAL flush; 16 won on a loaded machine, but on a quiet 2-core one the
#: thread switches cost more than the flushes saved (16 sequences under XA in one database, one
#: run of 3 rounds: 4 threads 0.87 of the outbox, 8 0.81, 16 0.74, at 1.69-1.72 WAL flushes a
#: message each; two databases: 4 threads 0.59, 8 0.63).  ``threads=`` decides when given.
AUTOMATIC_HTTP_THREADS = 4
#: Threads of a built-in HTTP server of a SQLite service without a transaction manager that
#: delivers apart (``RMPolicy.deliver_apart`` True, or its automatic None): such a receive runs
#: its application in its HTTP thread outside the store's file, so the threads bound how many
#: applications run at once (whose commits in their own database may then share a flush), and
#: each thread also waits, per message, for the application's commit and then for the store's
#: fsync.  bench_compare --clients 16 --calls 1600 --rounds 5, SQLite delivering apart (load 11-14,
#: so counts; the rounds that delivered on receipt): 4 threads ran 1.6-2.1 applications at once
#: (plain's 8 threads 5.7-6.6), with 0.73-0.81 PostgreSQL flushes, 0.86-0.93 SQLite fsyncs and
#: 1.79-1.87 SQLite commits a message, and 0.91-0.94 of the requests found no thread idle; 16
#: threads ran 3.9-4.2 at once, with 0.47-0.51 flushes (plain's 0.52-0.62), 0.43-0.47 fsyncs and
#: 1.25-1.29 commits, 0.01-0.02 found none idle, at 0.1 ms less service CPU a message (1.55-1.65
#: ms against 1.72-1.74).  Delivering inside, the count moves nothing that bounds the rate (the
#: file is held 0.89-0.93 of the time with 4, 8 or 16 threads, 4.3-4.9 ms a message, 82-86% of it
#: the application), so it stays :data:`AUTOMATIC_HTTP_THREADS` there.
#: What the 16 threads cost in thread switches (``BENCH_THREAD_SWITCHES=1``, ``BENCH_WAITS=1``,
#: ``BENCH_PERF_STAT=1``; --clients 16, load 19-32, 2026-12-01): the service switched 25-30 times a
#: message delivering apart against 16-18 inside, nearly all of it in the HTTP threads' waits
#: (16.6-19.6 against 8.7-9.1) and in futex calls (34 against 13.5 a message), while its sockets'
#: calls stayed the same.  The waits that have a name in the code add up to 1.3 of the
#: difference (an idle HTTP thread waiting for its next request 1.0 against 0.1, a receipt's own
#: wait for the fsync 0.9 against 0.1-0.2, and 0.5 fewer waits in the receipts' batches); the
#: rest is the interpreter handed from thread to thread among the 2.9 applications and the other
#: threads running at once.
#: The count of threads is what moves it: 8 threads 22.7 switches a message, 4 threads 19.3 (with
#: the same CPU a message: 2.16-2.21 ms); the rate at that load did not decide (16 threads 0.62
#: of plain 16 threads, 8 threads 0.57, the rounds split).
APART_HTTP_THREADS = 16
#: Threads of a built-in HTTP server under a transaction manager whose deliveries on receipt commit
#: in two phases (the application's database, registered with the manager, is not the store's):
#: there the receives waiting at the same time are delivered together (``receive_together``
#: automatic), and more threads make larger batches, each one PREPARE and COMMIT PREPARED of each
#: branch and one commit mark for all.  XA across two databases, 16 sequences
#: (``bench_compare --clients 16 --calls 1600 --rounds 3``, nice -10 on a machine loaded 10-16 by
#: other work): 16 threads and batches against 4 threads alone, in the same rounds, 228/178,
#: 233/193, 153/127 msg/s; CPU a message 3.89 against 4.52 ms (client, service, PostgreSQL),
#: prepared branches 1.20-1.27 against 2.00 a message.
AUTOMATIC_HTTP_THREADS_TWO_PHASE = 16
#: Threads of a built-in HTTP server under a transaction manager on a PostgreSQL store otherwise
#: (XA in one database: the application's data source in the store's database, one phase): each
#: receive commits its application and its receipt in its HTTP thread and waits there for the WAL
#: flush, so the threads bound how many of the service's commits one flush covers.  With 4, the
#: service's side ran fewer commits at once than the outbox's 8 threads, and a flush covered 2.2-2.3
#: commit records against the outbox's 2.5-2.7, with the same commit records a message on each side
#: (the client 1 durable and about 0.2 not waiting for the disk, the service 1.02) and 0.93-1.12 WAL
#: syncs a message.  bench_compare --clients 16 --calls 3200 --scenarios outbox,xa1,
#: xa1~server_threads=8,xa1~server_threads=16 (two runs of 2 rounds, interleaved, load 17-23, so
#: the counts more than the rates): WAL syncs a message 0.95-1.12 with 4, 0.70-0.98 with 8, 0.59-0.77
#: with 16; commit records a sync 2.2-2.3, 2.9-3.1, 3.4-3.5; the rates 70-118 msg/s with 4, 97-200
#: with 8, 136-276 with 16 (the outbox 94-247 in the same rounds); client and service CPU a message
#: 3.65-4.47 ms with 4, 2.9-3.2 with 16; the service's thread switches 11.5-15.6 a message with 4,
#: 19-23 with 16.  The quiet run that chose 4 for every store (above) predates the receipt riding on
#: its application's commit: its flushes did not group by threads (1.69-1.72 a message each).
AUTOMATIC_HTTP_THREADS_XA = 16


#: Requests in flight at once where ``RMPolicy.send_concurrency`` is None: one per sequence with
#: messages due, up to this many.  Each sequence's messages wait for the peer's durable receive
#: one after the other, so 4 in flight left most of 16 sequences waiting for a lane while the
#: machine idled (bench_compare --clients 16, memory store: 0.77 of plain calls with 4, 0.88 with
#: 16, the share of the machine busy 0.68 and 0.94, medians of 3 rounds on a loaded 2-core machine).
AUTOMATIC_SEND_CONCURRENCY = 16
#: Requests in flight for a sequence due alone where ``send_concurrency`` is None: its messages
#: pipelined (the destination records them one at a time, so more mostly wait there).
AUTOMATIC_PIPELINE_LANES = 4


@dataclass(frozen=True)
class RMPolicy:
    """Reliable messaging settings for one engine (both its source and its destination side).

    Versions may be given as objects (``RM11``) or names (``"1.1"``,
    ``"2005/08"``); ``wsa_version`` defaults to the RM version's usual
    partner (1.0 with 2004/08, 1.1 with 2005/08).  Each field declares what it
    accepts and what it does (:func:`~wsrm_plugin.engine.knobs.knob`); the
    policy page's table is rendered from those declarations.
    """

    # -- what is promised ------------------------------------------------------------
    delivery: DeliveryAssurance = knob(
        DeliveryAssurance.EXACTLY_ONCE | DeliveryAssurance.IN_ORDER, Converted(_assurance),
        "the delivery assurance: AT_MOST_ONCE, AT_LEAST_ONCE, EXACTLY_ONCE, each optionally IN_ORDER; "
        "without AT_LEAST_ONCE nothing is retransmitted",
        wsdl="`DeliveryAssurance` (1.1)", cxf="`deliveryAssurance`", wcf="`ordered` (always exactly once)",
        shown="DeliveryAssurance.EXACTLY_ONCE | DeliveryAssurance.IN_ORDER")

    # -- the source: retransmission ----------------------------------------------------
    #: Seconds before an unacknowledged message (or unanswered control message) is sent again:
    #: the floor of the retransmission timeout, which follows the peer's measured round-trip
    #: time above it (SRTT + 4 RTTVAR, as TCP).  A message an acknowledgement proves lost is
    #: sent again at once, whatever its timer.
    base_retransmission_interval: float = knob(
        3.0, _SECONDS,
        "seconds before an unacknowledged message is sent again: the floor of the timeout, which "
        "follows the peer's measured round-trip time above it (SRTT + 4 RTTVAR); a message an "
        "acknowledgement proves lost goes again at once",
        wsdl="`BaseRetransmissionInterval` (1.0)", cxf="`RMAssertion/BaseRetransmissionInterval`",
        wcf="— (adaptive)")
    #: Double the interval after each attempt (capped by ``max_retransmission_interval``).
    exponential_backoff: bool = knob(
        True, Flag(), "double the interval after each attempt",
        wsdl="`ExponentialBackoff` (1.0)", cxf="`RMAssertion/ExponentialBackoff`", wcf="— (always)")
    max_retransmission_interval: float = knob(60.0, _SECONDS, "the cap of the backed-off interval")
    #: Retransmissions allowed per message or control message before the sequence is faulted
    #: and the application told; None retries for ever.
    max_retries: int | None = knob(
        None, Count(0, none="retry for ever"),
        "retransmissions per message before the sequence is faulted and the application told; None: for ever",
        wcf="`maxRetryCount`")
    #: A peer whose exchanges fail in a row this many times, the way a down peer fails
    #: (connection refused or reset, a timeout, a gateway's 502/503/504, a 429), over at least
    #: ``base_retransmission_interval`` seconds without an answer between them, is
    #: *unreachable*: its messages wait, neither sent nor counted against ``max_retries``,
    #: while one request at a time (the probe) goes to it on a capped, jittered back-off; its
    #: first answer makes everything due at once (:mod:`wsrm_plugin.engine.reachability`).
    #: Without it every message is retransmitted on its own timer during an outage: thousands
    #: of requests a minute for a backlog, all failing the same way.  None: no such judgement.
    peer_unreachable_after: int | None = knob(
        3, Count(1, none="never: every message on its own timer"),
        "failed exchanges in a row (refused, reset, timed out, 502/503/504/429), over at least the base "
        "interval, that make a peer unreachable: its messages then wait, unsent and uncounted, while one probe "
        "at a time goes to it; its first answer sends everything at once",
        cxf="— (each message on its own)", wcf="— (each session on its own)")
    #: The cap of the probe's back-off (which starts at ``base_retransmission_interval``, doubles
    #: per failed probe with ``exponential_backoff``, and is jittered to 50-100% of its value): a
    #: peer that comes back is found within this many seconds.  None: ``max_retransmission_interval``.
    max_probe_interval: float | None = knob(
        None, Seconds(none="`max_retransmission_interval`"),
        "the cap of the back-off between probes of an unreachable peer (jittered to 50-100%): a peer "
        "that comes back is found within it; None: `max_retransmission_interval`",
        cxf="—", wcf="—")
    #: TerminateSequence goes out at most this many times, then the sequence is released
    #: anyway: it is only sent once every message is acknowledged, so a destination that
    #: never answers it (gone, or answering something else) must not keep it for ever.
    max_terminate_attempts: int = knob(
        10, _COUNT, "TerminateSequence sends before the sequence is released anyway")
    ack_request: AckRequestMode = knob(
        AckRequestMode.RETRANSMISSIONS, Named({mode.value: mode for mode in AckRequestMode}),
        "when a message carries AckRequested: never, on retransmissions, always")
    #: Flow control: at most this many messages of a sequence sent and not yet acknowledged
    #: (retransmissions are not held back); None means no window.
    max_unacknowledged: int | None = knob(
        None, Count(none="no window"), "flow control: messages of a sequence in flight and unacknowledged",
        cxf="— (its `maxUnacknowledged` terminates the sequence)",
        wcf="`maxTransferWindowSize`, `flowControlEnabled`")
    #: Messages per sequence before the source rolls over to a new sequence; None: no limit.
    max_sequence_length: int | None = knob(
        None, Count(none="no limit"),
        "messages per sequence before the source rolls over to a new one (order holds within each "
        "sequence; the last message of one and the first of the next may be delivered either way round)",
        cxf="`sequenceTerminationPolicy/@maxLength`")
    #: 1.1: send CloseSequence (and get the final acknowledgement) before TerminateSequence.
    close_before_terminate: bool = knob(
        True, Flag(), "WS-RM 1.1: CloseSequence (final acknowledgement) before TerminateSequence")
    #: On ``stop()``, close every open source sequence and wait (up to the stop timeout)
    #: for them to terminate.
    terminate_on_shutdown: bool = knob(
        False, Flag(), "`stop()` closes the source sequences and waits for their termination",
        cxf="`sequenceTerminationPolicy/@terminateOnShutdown`")
    #: Offered sequences (for replies) are accepted from peers that offer one.
    accept_offers: bool = knob(
        True, Flag(), "accept the sequence a peer offers for replies", cxf="`destinationPolicy/@acceptOffers`")

    # -- the destination: acknowledgement and lifetime ---------------------------------------
    #: Ask peers to send acknowledgements to this engine's endpoint (AcksTo = the served
    #: address) instead of on the HTTP back-channel of each message (AcksTo anonymous).
    decoupled_acks: bool = knob(
        False, Flag(),
        "ask for acknowledgements at this engine's own endpoint instead of on each HTTP response",
        cxf="`sourcePolicy/@acksTo`", wcf="— (composite duplex)")
    #: 0 acknowledges at once; otherwise acknowledgements to an addressable AcksTo are
    #: batched for this long (acks on the HTTP back-channel are always immediate: free).
    acknowledgement_interval: float = knob(
        0.0, Seconds(inclusive=True, at_minimum="acknowledge at once"),
        "batch acknowledgements to an addressable AcksTo for this long; 0: at once",
        wsdl="`AcknowledgementInterval` (1.0)", cxf="`RMAssertion/AcknowledgementInterval`",
        wcf="`acknowledgementInterval`")
    #: A destination sequence with no message for this long is terminated (None: never).
    inactivity_timeout: float | None = knob(
        600.0, Seconds(none="never"), "a destination sequence silent this long is terminated; None: never",
        wsdl="`InactivityTimeout` (1.0)", cxf="`RMAssertion/InactivityTimeout`", wcf="`inactivityTimeout`")
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
    max_delivery_attempts: int = knob(
        3, _COUNT,
        "attempts per retry cycle at handing a message to the application; a failure to process (any "
        "exception but the method's own SOAP fault) is rolled back and retried",
        cxf="`retryPolicy/@maxRetries`", wcf="`receiveRetryCount` + 1")
    #: Seconds before the second attempt of a cycle; each further one waits
    #: ``delivery_retry_multiplier`` times longer, at most ``max_delivery_retry_delay``.
    #: WCF retries at once (no knob); Artemis: ``redelivery-delay``; ActiveMQ Classic:
    #: ``initialRedeliveryDelay``.
    delivery_retry_delay: float = knob(
        0.2, _DELAY, "seconds before the second attempt of a cycle (Artemis `redelivery-delay`)",
        wcf="— (retried at once)")
    #: Growth of the delay between attempts of a cycle (1: constant).  Artemis:
    #: ``redelivery-delay-multiplier``; ActiveMQ Classic: ``backOffMultiplier``.
    delivery_retry_multiplier: float = knob(
        2.0, Number(1), "growth of that delay per attempt (Artemis `redelivery-delay-multiplier`)")
    #: Cap of the delay between attempts of a cycle.  Artemis: ``max-redelivery-delay``.
    max_delivery_retry_delay: float = knob(
        10.0, _DELAY, "the cap of that delay (Artemis `max-redelivery-delay`)")
    #: Further cycles of ``max_delivery_attempts`` after the first one; 0: poison after the
    #: first cycle.  WCF: ``MaxRetryCycles`` (default 2).  CXF and Artemis have one cycle.
    max_retry_cycles: int = knob(
        2, Count(0), "retry cycles after the first before the message moves to the poison store",
        wcf="`maxRetryCycles`")
    #: Seconds between two cycles: long enough for a database to come back.  WCF:
    #: ``RetryCycleDelay`` (default 30 minutes).
    retry_cycle_delay: float = knob(60.0, _DELAY, "seconds between retry cycles", wcf="`retryCycleDelay`")
    #: What the rest of a sequence does once one of its messages is in the poison store:
    #: ``"hold"`` (default): nothing after it is delivered until an operator retries or
    #: discards it (InOrder is kept; an ERROR names the message; without InOrder there is no
    #: order to keep and the others go on); ``"continue"``: the others are delivered without it
    #: (with InOrder, the order minus the poisoned message).  WCF:
    #: ``ReceiveErrorHandling`` Fault (the queue stops) versus Move (to the poison subqueue,
    #: the rest goes on); the message itself is always kept (Move), never Drop.  Artemis:
    #: a message sent to its ``dead-letter-address`` no longer blocks its queue (continue).
    poison_handling: str = knob(
        "hold", Choice(POISON_HANDLING),
        "after a message is poisoned: `hold` the rest of its sequence (InOrder kept, ERROR logged) or "
        "`continue` without it; the message is kept either way (`wsrm poison`)",
        wcf="`receiveErrorHandling` (Fault / Move)")
    # -- the invoker: an outage is not a poison message -------------------------------------------
    # Deliveries of different messages failing one after the other the way an outage fails (a
    # connection refused, the database unavailable) mean the service cannot work, not that the
    # messages are bad: delivery pauses, one message is tried after a capped back-off, and no
    # failure counts against any message's attempts or cycles; the first success resumes
    # delivery at once (one WARNING, one INFO; ``wsrm status`` and the metrics show the pause).
    # A message that fails while others are delivered is still retried and poisoned as above.
    # Anchors: NServiceBus's automatic rate limiting (``OnConsecutiveFailures`` with
    # ``RateLimitSettings``), MassTransit's kill switch, Spring Kafka's back-off with
    # container pause, resilience4j's circuit breaker (open, half-open).  WCF and CXF have none:
    # every failure counts against its message.

    #: Pause delivery during an outage (see above); False: every failure counts against its
    #: message, as in WCF's queued delivery.
    pause_on_outage: bool = knob(
        True, Flag(),
        "deliveries failing in a row the way an outage fails (`pause_after_outage_failures`) pause delivery "
        "instead of counting against the messages (NServiceBus `OnConsecutiveFailures`, MassTransit kill "
        "switch); False: every failure counts, as WCF's do", wcf="— (every failure counts)")
    #: Deliveries failing in a row the way an outage fails that pause delivery.  Fewer are only
    #: suspected: a message delivered meanwhile makes their failures count, as any other.  1
    #: pauses at the first such failure: quickest off the mark during an outage, but a message
    #: whose own failure looks like an outage (a bug that raises ``ConnectionError``) then
    #: pauses delivery each time it is tried and is never poisoned.  Higher waits longer before
    #: sparing the messages: each suspect is tried again after its retry delay meanwhile.
    #: NServiceBus: ``OnConsecutiveFailures(n, ...)``; MassTransit's kill switch:
    #: ``ActivationThreshold`` (with ``TripThreshold``, a failure rate); resilience4j:
    #: ``minimumNumberOfCalls`` (with ``failureRateThreshold``).
    pause_after_outage_failures: int = knob(
        2, _COUNT,
        "deliveries failing in a row the way an outage fails that pause delivery (fewer are suspects: a "
        "delivery meanwhile makes them count); 1: the first pauses, and a message whose own failure looks "
        "like an outage is then never poisoned (NServiceBus `OnConsecutiveFailures(n)`, MassTransit "
        "`ActivationThreshold`)",
        wcf="— (every failure counts)")
    #: Seconds before the first probe of a paused delivery; each failed probe doubles it, up to
    #: ``max_outage_probe_delay``, less up to a quarter of jitter.  NServiceBus:
    #: ``RateLimitSettings.TimeToWaitBetweenThrottledAttempts``; Spring Kafka: the container's
    #: ``BackOff``; resilience4j: ``waitDurationInOpenState``.
    outage_probe_delay: float = knob(
        0.5, _SECONDS,
        "seconds before a paused delivery tries one message; doubled after each failed probe "
        "(NServiceBus `TimeToWaitBetweenThrottledAttempts`, resilience4j `waitDurationInOpenState`)")
    #: The cap of that back-off: the longest a service stays paused after its database is back
    #: (MassTransit's kill switch: ``RestartTimeout``, 1 minute).
    max_outage_probe_delay: float = knob(
        5.0, _SECONDS,
        "the cap of the probe back-off: at most this long from the dependency's return to the "
        "resumption (MassTransit `RestartTimeout`)")
    #: Exception classes that mean "a dependency is down" besides the built-in ones
    #: (``ConnectionError``, ``TimeoutError``, ``psycopg2``/``psycopg`` ``OperationalError``,
    #: SQLite busy or locked, an XA resource unavailable, the store unavailable).  A class is
    #: matched anywhere in the exception's causes.  NServiceBus: a custom recoverability
    #: policy; resilience4j: ``recordExceptions``; Spring Kafka: ``addRetryableExceptions``.
    outage_errors: tuple[type[BaseException], ...] = knob(
        (), ExceptionTypes(),
        "exception classes that also mean a dependency is down (besides connection errors, timeouts, "
        "`OperationalError`, SQLite busy, the store unavailable); resilience4j `recordExceptions`")
    #: ``is_outage(exception) -> True | False | None``, asked first for each exception in the
    #: chain: True, an outage; False, the message's own failure; None, no opinion (the types
    #: decide).  A declared SOAP fault (``ApplicationFault``) is never an outage.
    #: resilience4j: ``recordException(Predicate)``; MassTransit: the kill switch's exception filter.
    is_outage: Callable[[BaseException], bool | None] | None = knob(
        None, Hook("the built-in classes and `outage_errors` decide"),
        "a predicate asked first for each exception in a failure's causes: True an outage, False the "
        "message's own failure, None no opinion (resilience4j `recordException`)")

    #: A request whose ReplyTo is anonymous (a client without a listener) gets its reply in
    #: the HTTP response: the HTTP thread waits this long for the invoker to produce it, then
    #: answers 202 and the reply goes out with the client's next retransmission (0: never wait).
    back_channel_reply_wait: float = knob(
        5.0, Seconds(inclusive=True, at_minimum="never wait"),
        "how long a request with an anonymous ReplyTo waits for its reply in the HTTP response "
        "(a one-way operation, and a request behind a gap, never wait)")
    #: Replies arriving on a sequence this engine offered are handed out as they arrive (each
    #: resolves the call it answers, by RelatesTo), exactly once: one the peer is slow to resend
    #: holds back no other.  True delivers them in order, as any other sequence.
    replies_in_order: bool = knob(
        False, Flag(),
        "hand the replies arriving on a sequence this engine offered to the application in order; False: "
        "each as it arrives (exactly once; each resolves its own call by RelatesTo, so one lost reply "
        "holds back no other)",
        cxf="— (in order)", wcf="`ordered` (the whole session)")

    # -- wire -------------------------------------------------------------------------------
    rm_version: RMVersion = knob(
        RM11, Named(_RM_BY_NAME), 'the WS-RM version spoken (`"1.0"` or `"1.1"`)',
        wsdl="the assertion's namespace", cxf="the `RMAssertion` namespace", wcf="`reliableMessagingVersion`",
        shown="RM11")
    wsa_version: AddressingVersion | None = knob(
        None, Named(_WSA_BY_NAME, none="the RM version's partner"),
        "the WS-Addressing version written; None: the RM version's usual partner",
        cxf="`RM10AddressingNamespace`", wcf="the `messageVersion`")
    soap_version: SoapVersion = knob(
        SOAP12, Named(_SOAP_BY_NAME), 'the SOAP version of the engine\'s own messages (`"1.1"` or `"1.2"`)',
        cxf="the binding", wcf="the `messageVersion`", shown="SOAP12")

    # -- security limits (destination) --------------------------------------------------------
    max_open_sequences: int = knob(1000, _COUNT, "security limit: destination sequences open at once")
    max_open_sequences_per_peer: int = knob(
        100, _COUNT, "security limit: destination sequences one peer may hold open")
    #: Messages a destination sequence may hold received and not yet delivered (out-of-order
    #: messages waiting for a gap, or a slow application); beyond it messages are refused
    #: unacknowledged, so the source retransmits them later.
    max_unacknowledged_held: int = knob(
        10_000, _COUNT, "security limit: messages a destination sequence holds received and not yet delivered",
        wcf="`maxTransferWindowSize`")
    #: Bytes of received, undelivered messages a destination may hold for one sequence, for
    #: all the sequences of one peer, and in total (WCF bounds its buffer in messages,
    #: ``MaxTransferWindowSize``; a broker in bytes, Artemis' ``max-size-bytes``).  A message
    #: beyond one of them is refused unacknowledged (HTTP 503 with Retry-After, a Receiver
    #: fault that leaves the sequence as it was), so the source retransmits it later; the
    #: message that fills an InOrder gap is always taken (refusing it would hold the rest for ever).
    max_held_bytes_per_sequence: int = knob(
        64 * 1024 * 1024, _SIZE,
        "security limit: bytes a destination sequence holds received and not yet delivered; beyond it a "
        "message is refused unacknowledged (503 + Retry-After) and the source sends it again later",
        wcf="— (`maxTransferWindowSize` counts messages)")
    max_held_bytes_per_peer: int = knob(
        256 * 1024 * 1024, _SIZE,
        "the same budget across all sequences of one peer (its principal, else its address)")
    max_held_bytes: int = knob(1024 * 1024 * 1024, _SIZE, "the same budget across the whole destination")
    #: Seconds a refused sender is told to wait (HTTP Retry-After) when the destination is
    #: full or its store cannot take a message now (disk full, database down).
    retry_after: int = knob(
        5, _COUNT, "seconds named in the Retry-After of a 503 (a budget reached, the store unable to write)")
    #: What the destination does with a message that is not the next one in order:
    #: ``"buffer"`` keeps it until the gap is filled (fewer retransmissions); ``"discard"``
    #: drops it unacknowledged, as gSOAP does, so the source sends it again once the gap is
    #: filled (nothing held: bounded memory whatever the peers send).
    out_of_order: str = knob(
        "buffer", Choice(("buffer", "discard")),
        "a message that is not the next in order: `buffer` keeps it until the gap fills; `discard` drops "
        "it unacknowledged (as gSOAP does: nothing held, the source sends it again after the gap)")
    max_message_size: int = knob(
        DEFAULT_MAX_SIZE, _SIZE, "security limit: bytes of one envelope", wcf="`maxReceivedMessageSize`")

    # -- plumbing -------------------------------------------------------------------------------
    #: How often idle workers look at the store anyway (work is normally signalled at once).
    poll_interval: float = knob(0.2, _SECONDS, "how often idle workers look at the store anyway")
    #: Messages the source claims and sends per round.
    send_batch: int = knob(50, _COUNT, "messages the source claims and sends per round")
    #: HTTP requests of a round in flight at once, at most (one keep-alive connection and one
    #: sending thread each, started as a round first needs them), so the peer's durable
    #: receives overlap; the window (``max_unacknowledged``) still bounds them.  A round with
    #: several sequences due sends each sequence's messages one after the other on a lane of
    #: its own (the destination records one sequence's messages one at a time anyway); a
    #: sequence due alone is pipelined over several.  None: elastic, one request per sequence
    #: with messages due up to 16, and a sequence alone over 4.
    send_concurrency: int | None = knob(
        None, Count(none=f"one per sequence due, up to {AUTOMATIC_SEND_CONCURRENCY}; "
                         f"{AUTOMATIC_PIPELINE_LANES} for a sequence alone"),
        "HTTP requests of a sending round in flight at once, at most (a keep-alive connection and a thread each, "
        "started when a round first needs them): each sequence with messages due gets one, its messages one after "
        f"the other; a sequence due alone is pipelined over that many; `None`: one per sequence due, up to "
        f"{AUTOMATIC_SEND_CONCURRENCY}, and {AUTOMATIC_PIPELINE_LANES} for a sequence alone",
        cxf="the async conduit's `MAX_PER_HOST_CONNECTIONS`", wcf="`connectionManagement` `maxconnection`")
    #: HTTP timeout (connect and read) for messages the engine sends.
    http_timeout: float = knob(
        10.0, _SECONDS, "HTTP timeout of the engine's sends (a zeep client's `operation_timeout` wins)",
        cxf="the conduit's `ReceiveTimeout`", wcf="`sendTimeout`")
    #: A reliable client's in-out request is kept this long for its caller's thread, which sends it
    #: itself when it waits for the reply (``future.result()``) and the sequence's lane is idle
    #: (:mod:`wsrm_plugin.statemachine.lane`); the sender sends it after that, or at once when the
    #: lane is busy.  The request is stored before either sends it.  None: the sender sends every
    #: request, handed over from the caller's thread and its reply handed back (two thread switches).
    caller_send_grace: float | None = knob(
        0.01, Seconds(none="the sender sends every request"),
        "seconds an in-out request of a reliable client waits for its caller's thread to send it (the caller "
        "waiting for the reply sends it, when no other send is under way on its sequence, and reads the reply "
        "in its own thread) before the sender sends it; `None`: the sender sends every request")
    #: A reliable client's one-way call, made outside any transaction, is sent from its caller's
    #: thread once stored, when its sequence's lane is idle and its peer is sent to (as a waiting
    #: caller sends its in-out request, ``caller_send_grace``); a caller that cannot send it waits
    #: for a round to send it (at most ``http_timeout``; not while its peer is failing, and no
    #: longer than its sequence's CreateSequence takes to fail).  The call returns once the peer
    #: answered that send: callers are paced by the service, and never run ahead of their
    #: sequence (a client's memory stays flat: bench_compare --clients 16, kept 0.45 against
    #: 3.25 kB a message, peak 1.7 against 10.3 MB).  The message is stored before it is sent, so
    #: a send that fails or never ends is sent again by the retransmission timer, as the
    #: sender's would be.  It was built so that the client and the service work at once: left to
    #: the sender, 16 callers on memory stores store a round's messages in a third of its time
    #: while the service, fed a sixth of them, idles.  On a quiet machine it does what it is for
    #: (bench_compare --clients 16 --calls 3200 --rounds 3, memory with it against without in the
    #: same rounds, two runs: 1.26 of plain calls from 16 threads against 0.89-0.92; client CPU
    #: 1.04-1.42 against 1.16-1.52 ms a message, service 1.44-1.99 against 1.80-2.27); but one
    #: caller loses the sender's pipelining of its sequence over several connections
    #: (bench_compare --calls 1000 --rounds 3 on the same machine: 1.19 of plain calls against
    #: 1.34 without).  Hence None (automatic, the default): a caller sends its own message only
    #: while several of the engine's sequences are busy (:mod:`wsrm_plugin.engine.busy`: at
    #: least 4 had a one-way call within a second), its sequence is open, its peer answered its
    #: last exchange and nothing sent on the sequence is still unacknowledged as far as the
    #: answers say; otherwise the sender sends it and the call returns once it is stored.  So a
    #: peer that stops answering lets the callers return at once (with True, a caller meets the
    #: peer's failure itself: its call returns after its own send failed, at most
    #: ``http_timeout``).  Never automatically on a SQLite store: there the callers' sends cost
    #: the client a commit and most of a flush each, where the sender's rounds share them, for no
    #: gain in rate.  bench_compare --calls 1600
    #: --rounds 3, SQLite, True against False interleaved in one run (load 18-24, so counts):
    #: client CPU 1.72/1.66/1.88 against 1.37/1.60/1.29 ms a message at 2/4/8 sequences (1.96
    #: against 1.49 at 16, 3,200 calls), client fsyncs 1.00/0.88/0.80 against 0.77/0.51/0.27
    #: (0.76-0.79 against 0.14-0.15 at 16), the rates' rounds split both ways.  True: every such call once
    #: its sequence runs (the first, which opens it, waits for the sender's round); False: never.
    one_way_caller_sends: bool | None = knob(
        None, Flag(none="automatic: while at least 4 sequences of the engine had a one-way call within a second, "
                        "to a peer that answers, and never on a SQLite store"),
        "a reliable client's one-way call made outside a transaction is sent from its caller's thread once "
        "stored, when no other send is under way on its sequence and its peer is sent to, else the caller waits "
        "for the sender to send it: the call returns once the peer answered (callers paced by the service, the "
        "client's backlog bounded; with 16 sequences on memory stores, the two sides then work at once; one "
        "caller loses the sender's pipelining); False: the sender sends every one-way message and the call "
        "returns once it is stored; `None`: only while several sequences are busy and the peer answers, and not on "
        "a SQLite store (each caller's send there costs a commit and a flush the sender's rounds share)")
    #: Threads delivering buffered messages, at most: the first looks at the store on the poll
    #: interval; a message recorded for delivery wakes a thread that is not busy already, so
    #: messages of several sequences get a thread each, and idle ones cost nothing.  One
    #: sequence's messages are delivered one after the other whatever the number.  None: 4
    #: where the store runs transactions of different sequences at once (memory, PostgreSQL),
    #: 8 where one-way messages are buffered and the HTTP threads deliver them after their
    #: responses (:data:`AUTOMATIC_THREADS_BUFFERED`), 1 on SQLite, where they take turns on
    #: the file anyway.
    invoker_threads: int | None = knob(
        None, Count(none="4, 8 buffering on memory, or 1 on SQLite"),
        "threads delivering buffered messages, at most (the first polls; a message waiting wakes one that is not "
        "busy): sequences are delivered side by side, one sequence's messages one after the other; `None`: 4 "
        "where the store runs different sequences' transactions at once (memory, PostgreSQL), 8 where one-way "
        "messages are buffered and delivered after the response (memory without a transaction manager), 1 on "
        "SQLite",
        cxf="the endpoint's `Executor`", wcf="`ServiceThrottlingBehavior.MaxConcurrentSessions`")
    #: Messages of one sequence the invoker delivers in one transaction; 1: one each.  Without
    #: a transaction manager each sits in its own savepoint (a failure is settled alone); with
    #: one the batch is one XA transaction, rolled back whole when a message fails, after which
    #: that message is delivered alone (see ``InvokerWorker._batches``).
    #: Off by default: a crash repeats the whole batch's NON-transactional side effects
    #: (a file written, a mail sent), so raising it widens the at-least-once window of an
    #: application that does work outside the store.  Work in the store stays exactly once.
    delivery_batch: int = knob(1, _COUNT, "messages of one sequence delivered in one transaction")
    #: A batch stops taking messages after this many seconds: until it commits it holds its
    #: sequence's buffer (and a SQLite store's whole file).  On PostgreSQL, where receiving
    #: never waits for a delivery, a longer batch spreads its two-phase commit over more
    #: messages; on a busy machine 0.05 s ends most batches after a handful.
    delivery_batch_seconds: float = knob(0.05, _SECONDS, "a delivery batch stops taking messages after this long")
    #: Messages of one sequence received at the same time (one per HTTP thread) that are
    #: recorded in one store transaction: one commit, and one read of the sequence's row,
    #: instead of one each queued on the row's lock.  No receive waits for a batch to fill:
    #: a batch is whatever arrived while the one before committed.  Each is acknowledged
    #: after that commit, and a message refused in a batch is refused alone.  1: each alone;
    #: None: 16 where a commit is costly (SQLite, PostgreSQL), 1 in memory.
    receive_batch: int | None = knob(
        None, Count(none="16 where a commit is costly, else 1"),
        "messages of one sequence received at the same time (one per HTTP thread) that are recorded in one "
        "store transaction, one commit; each acknowledged after it, a refused one refused alone; `None`: 16 "
        "on SQLite and PostgreSQL, 1 (each alone) in memory")
    #: At the first engine start of a process, take the objects alive then (modules, the WSDL
    #: and spyne's models, the engine itself) out of the cyclic garbage collector's sight:
    #: one collection, then ``gc.freeze()``.  spyne runs a full collection every second in
    #: the request's thread (``MethodContext.close``); delivering on receipt, that is inside
    #: the delivery's transaction, which holds its sequence's row lock, so every message of
    #: the sequence waits for it: 15-20 ms each second with the start-up objects in sight,
    #: about 1 ms without them.  Frozen objects are still freed when nothing refers to them;
    #: only a reference cycle among them is never collected (see ``gc.freeze``).  False:
    #: the collector is left as it is.
    freeze_gc_at_start: bool = knob(
        True, Flag(),
        "at the first engine start of a process, one garbage collection and then `gc.freeze()`: the objects "
        "alive then (modules, the WSDL, spyne's models, the engine) leave the cyclic collector's sight; "
        "spyne's full collection each second, which runs inside a delivery's transaction while it holds its "
        "sequence's row lock, then takes about 1 ms instead of 15-20; frozen objects are still freed when "
        "unreferenced, only cycles among them are never collected")
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
    #: 1.82, 0.79 of plain calls instead of 0.72); otherwise (the memory store) only for a
    #: request whose reply goes back in the HTTP response to it (an operation that answers, an
    #: anonymous ReplyTo), whose receiving thread waits for that reply anyway: no hand-off to
    #: an invoker thread and back on a sequential caller's path.  Concurrent receives are then
    #: recorded one by one unless ``receive_batch`` says otherwise (a batch is always buffered:
    #: delivering several messages in one transaction is ``delivery_batch``'s trade-off).
    deliver_on_receive: bool | None = knob(
        None, Flag(none="automatic"),
        "hand a message that is next in order to the application in the transaction that receives it, in the "
        "receiving thread, instead of buffering it for an invoker thread: one transaction per message instead "
        "of two, no buffer row; one that is not next, or whose delivery fails, is buffered as without it; the "
        "acknowledgement then waits for the application (an application slower than 50 ms a message, lately, "
        "gets its messages through the buffer, so that it holds no HTTP threads); `None`: on with InOrder "
        "delivery under a transaction manager or where a commit is costly (SQLite, PostgreSQL), otherwise "
        "(the memory store) only for requests whose reply goes back in the HTTP response (their receiving "
        "thread waits for it anyway); receives delivered on receipt are recorded one by one unless "
        "`receive_batch` is set",
        cxf="— (CXF always delivers in the receiving thread)")
    #: SQLite without a transaction manager: a receive that delivers buffers the message in a
    #: short transaction and runs the method outside it, in one that takes the store's file
    #: only when the method touches the store or to mark the message delivered (see
    #: ``InvokerWorker.deliver_received``).  Other sequences' receives then use the file while
    #: the method waits, and their commits share fsyncs (and so do the method's own commits in
    #: its database); the price is a second commit.  Except for a message its receipt will
    #: surely take (the store's last committed state shows its sequence open, 1..n-1 received
    #: and delivered, nothing buffered): its method runs first, and one transaction records it
    #: received and delivered, with other sequences' receipts (``Destination._run_first``; one
    #: commit a message: bench_compare --clients 16, load 20, 0.71 SQLite commits a message on
    #: the service where buffering first made 1.2-1.5).  Worth it when other sequences' receives
    #: want the file meanwhile; not for one caller's messages in turn.  None (automatic): apart
    #: when a receive of another sequence is under way in this process as the receive begins
    #: (counted by the destination), inside otherwise, and never for a request whose reply goes
    #: back in its HTTP response.  An earlier automatic rule, "another transaction holds the
    #: file", sent one client's 1 MiB messages apart whenever a background transaction held it
    #: (46.3 -> 37.5 msg/s); counting receives leaves one caller's messages inside.  True:
    #: always apart; False (the default): never.  Off by default: on a quiet 2-core machine,
    #: interleaved in one run (bench_compare --clients 16 --calls 1600 --rounds 3), delivering
    #: inside ran at 0.68 of plain 16 threads against 0.61 automatic, with 1.08 ms of service CPU
    #: per message against 1.25; one client's 1 MiB messages 1.05 against 0.99 of plain.  Where
    #: cores are scarcer than the file (a loaded machine) automatic won (0.54 against 0.28).
    #: Those runs served 4 HTTP threads (which ran 1.6-2.1 applications at once delivering apart, at
    #: load 12-14); a service that may deliver apart now serves 16 unless told
    #: (``APART_HTTP_THREADS``; see there).  Measured so on a quiet machine (bench_growth, the
    #: start and end trees alternated, 2026-11-30): 16 sequences, automatic 0.72, 0.68, 0.77 of
    #: plain 16 threads against inside 0.69, 0.72, 0.77, no gain; one caller's request-reply,
    #: automatic p99 2.00-2.13x its p50 (the aim is 2x) against inside 1.45-1.51x, and in one
    #: run of both side by side 7.54 ms against 6.06.  Automatic won only where fsyncs were slow
    #: (bench/quiet_disk.py at 400 us: 0.82 against 0.43), so it stays a choice, not the default.
    deliver_apart: bool | None = knob(
        False, Flag(none="automatic"),
        "SQLite store, no transaction manager: a receive that delivers (`deliver_on_receive`) buffers the "
        "message in a short transaction and runs the application outside it, so the store's file is free for "
        "other sequences while the application waits (its own database, a call out) and their commits share "
        "fsyncs; costs a second commit per message, but for a message its receipt will surely take (its sequence "
        "open, every message before it delivered, none buffered), whose application runs before its receipt, and "
        "one commit records it received and delivered; `None`: apart when a receive of another sequence is under "
        "way in this process as the receive begins (one caller's messages in turn stay inside), never for a "
        "request whose reply goes back in its HTTP response",
        cxf="—")
    #: Delivering inside (``deliver_apart`` False), a receive that begins while a batch of
    #: receives holds the file through its applications (``receive_together``) runs its
    #: application first, as delivering apart does, when its receipt will surely take its
    #: message; its receipt alone then waits for the file (``Destination._first_when_busy``): the
    #: applications of several sequences run at once instead of one after the other in the
    #: file's hold.  Its receipt joins the batch of receives delivering inside (the one holding
    #: the file, before its commit, or the next): SQLite commits a message as delivering inside
    #: (0.53 against 0.54), fewer fsyncs and database flushes (see the changelog).  On by
    #: default since then; off, it cost about 12% more CPU a message on a quiet machine (its
    #: receipts mostly committed alone).
    first_when_busy: bool = knob(
        True, Flag(),
        "SQLite store, no transaction manager, delivering inside (`deliver_apart` off): a receive that begins "
        "while a batch of other receives holds the store's file through their applications runs its own "
        "application at once, when its receipt will surely take its message (as delivering apart does), and "
        "then waits for the file with its receipt alone, which commits with that batch or the next",
        cxf="—")
    #: SQLite without a transaction manager, delivering inside (``deliver_apart`` off): receives
    #: of different sequences that wait for the store's file at the same time are recorded and
    #: delivered in one transaction by the first of them, each in a savepoint of its own (a
    #: refusal or a failed application rolls back its part alone), with one commit and one
    #: fsync for all; each is acknowledged once that commit is on disk.  Such receives hold
    #: the file through their application one after the other anyway; together they save each
    #: a BEGIN, a COMMIT, a hand-over of the file and an fsync.  1: each alone.  A batch is at
    #: most one receive per HTTP thread (4 on SQLite): with 8 or 16 threads the batches grew
    #: (commits 0.53 -> 0.29 -> 0.19 a message at 16 sequences) but the file was held longer per
    #: message (5.9 -> 7.4 -> 9.9 ms, load 27-30): its holder waits for the interpreter while more
    #: threads compute, so the count stays.
    #: Under a transaction manager on PostgreSQL, where each message delivered on receipt is a
    #: global transaction (a PREPARE and a COMMIT PREPARED per branch, each flushed, and a commit
    #: mark), receives of different sequences under way at the same time are recorded and
    #: delivered in one global transaction by the first of them, which runs the others'
    #: applications after its own.  No savepoints there (the transaction manager has none across
    #: branches): a refusal before its writes is refused alone, any other failure rolls the
    #: whole global transaction back, the failed message buffered as alone and the others
    #: received again alone.  bench_compare --scenarios xa2 --clients 16 (load 10-13, 2 cores):
    #: prepared branches 2.00 -> 1.49 a message, PostgreSQL commits 7.43 -> 5.74, service CPU 2.29
    #: -> 1.92 ms, PostgreSQL CPU 2.15 -> 1.73 ms; under xa1 one-phase commits 2.00 -> 1.49, PostgreSQL
    #: CPU 1.21 -> 1.02 ms.  But one batch runs at a time, so the receives' round trips and
    #: commits no longer overlap: on a quiet machine (5 interleaved rounds, 3,200 calls) xa1 fell
    #: from 0.84 to 0.72 of the outbox's rate and xa2 stayed at 0.54-0.55, so it is not the
    #: default there: ask for it where PostgreSQL's CPU is what runs out.  Since then the next
    #: batch starts while one commits (``Combiner.hand_on``).  Left automatic (None) under a
    #: transaction manager on PostgreSQL, it is 16 while the deliveries commit in two phases (the
    #: last one had more than one branch: the application's database is not the store's), and
    #: the built-in server then gets 16 threads (``AUTOMATIC_HTTP_THREADS_TWO_PHASE``); in one
    #: phase each receive goes alone.
    receive_together: int | None = knob(
        None, Count(none="16 on SQLite without a transaction manager and under one while deliveries "
                         "commit in two phases, else 1"),
        "receives of different sequences that deliver on receipt at the same time, recorded and delivered in "
        "one transaction by the first of them. SQLite, no transaction manager, delivering inside: those waiting "
        "for the store's file, each in a savepoint of its own (a refusal or a failed application rolls back its "
        "part alone), one commit and one fsync for all, each acknowledged once that commit is on disk. Under a "
        "transaction manager on PostgreSQL: one global transaction (one PREPARE and COMMIT PREPARED of each "
        "branch, one commit mark), each acknowledged once it committed; no savepoints across branches: a "
        "refusal before its writes is refused alone, any other failure rolls the whole batch back, the failed "
        "message buffered as alone and the others received again alone (fewer commits; the next batch starts "
        "while one commits; automatic there only while deliveries commit in two phases, the application's "
        "database not the store's, and the built-in server then has 16 threads); 1: each alone; `None`: 16 on "
        "SQLite without a transaction manager and under one while deliveries commit in two phases, else 1",
        cxf="—")
    #: Under a transaction manager, a delivery into the application's own database (not the
    #: store's) commits in two phases: the application's branch is prepared, the store's commits
    #: with the commit mark that decides, then the application's COMMIT PREPARED.  With this on,
    #: the receive answers (acknowledges, replies) once the mark committed and a worker thread
    #: sends the COMMIT PREPARED (``wsrm_plugin.engine.at_decision``, ``txmanager.phase_two``): a
    #: round trip and a WAL flush off every message's path.  Recovery commits that branch after a
    #: crash (the mark decides), so nothing is lost or delivered twice; the next delivery of the
    #: same sequence in this process waits for it, so in order it sees the rows of the last.  What
    #: another reader of the application's database may see first is in the crash table.
    answer_at_decision: bool = knob(
        True, Flag(),
        "under a transaction manager, a delivery into the application's own database (two-phase commit decided "
        "by the store's commit mark) answers once that decision committed; the application's COMMIT PREPARED "
        "follows in a worker thread, and the sequence's next delivery in this process waits for it (its rows "
        "visible first); a crash in between is finished by recovery (the mark decides); another reader of the "
        "application's database may see the acknowledgement or reply a moment before the rows; False: answer "
        "after every branch committed",
        cxf="—")
    #: A client's future-only call whose reply comes in the HTTP response is answered from it, and
    #: the reply recorded after by the engine's records' thread (``wsrm_plugin.engine.later_records``):
    #: on a store whose record costs a round trip that can run beside the caller's next
    #: transaction (PostgreSQL), that round trip is off the caller's path.  Killed in between, the
    #: restarted client sends the request again and drops the stored reply (the crash table).
    answer_before_record: bool = knob(
        True, Flag(),
        "client, PostgreSQL store: a future-only call whose reply comes in the HTTP response is answered from it "
        "at once, and the reply recorded after in the engine's records' thread (the caller's next claim waits for "
        "it); killed in between, the restarted client sends the request again and drops the stored reply the "
        "service answers with; False: record the reply first (memory and SQLite stores always do)",
        cxf="—")
    #: A service serving (``serve()``) from a SQLite store runs with a 1 ms interpreter switch
    #: interval, not Python's 5 ms: the thread holding the store's file lets go of the
    #: interpreter at each SQLite statement and at the application's own commit, and then waits
    #: for it until a computing thread's interval runs out, inside the hold that bounds the
    #: service's rate (``wsrm_plugin.engine.switch_interval`` says why, and what was measured).
    #: Process-global: never over a value the application set, logged at INFO, put back at stop.
    interpreter_switch_interval: float | bool | None = knob(
        None, Converted(_switch_interval),
        "a service's `serve()`: the interpreter's switch interval (`sys.setswitchinterval`, process-wide) while "
        "it serves, put back when it stops; `None`: 0.001 s on a SQLite store (the thread holding the file gets "
        "the interpreter back sooner after each statement and the application's commit), unless the application "
        "set its own, else left alone; False: left alone; seconds: that interval, whatever the store",
        cxf="—")
    #: Several hosts on one PostgreSQL store (``txmanager.nodes.PostgresNodes``): the time
    #: from a host's death to its XA transactions being finished by a living host, and so
    #: its locks released.  A killed process is noticed at once (its kernel closes its
    #: sessions); a lost host or network after the TCP keepalive this sets on the claim's
    #: session (60%), then a watcher's tick (10%) and one recovery pass.  Lower costs more
    #: keepalive probes and more takeover passes; a host whose network stalls longer than
    #: this loses its node (it must restart to claim one again).
    #: SQLite without a transaction manager: callers' enqueues in local transactions that wait
    #: for the store's file at the same time are done in one transaction by the first of them
    #: (one turn on the file, one commit, one fsync for all); each caller returns once that
    #: commit is on disk, as alone.  1: each alone.
    enqueue_together: int | None = knob(
        None, Count(none="16 on SQLite, else 1"),
        "SQLite store: callers' enqueues (`send`, outside a delivery and a global transaction) waiting for the "
        "store's file at the same time, done in one transaction by the first of them: one commit and one fsync "
        "for all, each caller returning once that commit is on disk; should one fail, each enqueues alone; 1: "
        "each alone; `None`: 16 on SQLite",
        cxf="—")
    host_takeover_within: float = knob(
        10.0, Seconds(minimum=3.0, inclusive=True),
        "several hosts on one PostgreSQL store: a dead host's XA transactions are finished by a living one "
        "(its locks released) within this; a killed process frees its node at once, a lost host or network "
        "after the TCP keepalive set from it (60%), then a watcher's tick (10%) and one recovery pass",
        cxf="— (Narayana: the recovery manager's periodic scan)", wcf="— (a reliable session dies with its host)")

    def __post_init__(self) -> None:
        check_fields(self)
        # the rules between fields: a cap below its floor, a budget a single message cannot fit
        for cap, floor in (("max_retransmission_interval", "base_retransmission_interval"),
                           ("probe_interval_cap", "base_retransmission_interval"),
                           ("max_delivery_retry_delay", "delivery_retry_delay")):
            if getattr(self, cap) < getattr(self, floor):
                raise ValueError(f"{cap} must be >= {floor}")
        for name in ("max_held_bytes_per_sequence", "max_held_bytes_per_peer", "max_held_bytes"):
            if getattr(self, name) < self.max_message_size:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= max_message_size "
                                 f"({self.max_message_size}): a message alone must fit")

    # -- derived ----------------------------------------------------------------------------------

    @property
    def addressing(self) -> AddressingVersion:
        """The WS-Addressing version to write: ``wsa_version``, else the RM version's partner."""
        return self.wsa_version or self.rm_version.addressing

    @functools.cached_property
    def in_order(self) -> bool:
        """Kept once read (a frozen policy's flags never change): asked several times a message,
        and a Flag enum's ``&`` builds a new member each time."""
        return bool(self.delivery & DeliveryAssurance.IN_ORDER)

    def invoker_thread_count(self, concurrent_sequences: bool = True, buffered: bool = False) -> int:
        """``invoker_threads``, its automatic value resolved (see there); ``concurrent_sequences``:
        the store's ``concurrent_sequences``; ``buffered``: :meth:`buffers_one_way`."""
        if self.invoker_threads is None:
            if not concurrent_sequences:
                return 1
            return AUTOMATIC_THREADS_BUFFERED if buffered else AUTOMATIC_INVOKER_THREADS
        return self.invoker_threads

    def buffers_one_way(self, transaction_manager: bool, costly_commits: bool = False) -> bool:
        """Are one-way messages buffered, to be delivered after their receive's response, by
        ``deliver_on_receive`` left automatic on a store whose commits cost little (memory)?
        Then the automatic thread counts are :data:`AUTOMATIC_THREADS_BUFFERED` (measured there
        only: a SQLite or PostgreSQL store keeps its counts whatever its delivery)."""
        return (not costly_commits and self.deliver_on_receive is None
                and not self.delivers_on_receive(transaction_manager, costly_commits))

    @property
    def most_requests_in_flight(self) -> int:
        """``send_concurrency``, its automatic value resolved: the sender's requests in flight at
        once, at most (one thread and one connection each)."""
        return AUTOMATIC_SEND_CONCURRENCY if self.send_concurrency is None else self.send_concurrency

    def send_lanes(self, sequences: int) -> int:
        """Requests a sending round has in flight at once with messages of ``sequences`` sequences
        due (see ``send_concurrency``): one per sequence up to the cap, and a sequence alone
        pipelined (over as many lanes as it has messages, at most)."""
        if sequences <= 1:
            return AUTOMATIC_PIPELINE_LANES if self.send_concurrency is None else self.send_concurrency
        return min(sequences, self.most_requests_in_flight)

    def delivers_on_receive(self, transaction_manager: bool, costly_commits: bool = False) -> bool:
        """``deliver_on_receive``, its automatic value resolved (see there); ``costly_commits``:
        the store's ``commits_are_costly``."""
        if self.deliver_on_receive is None:
            return (transaction_manager or costly_commits) and self.in_order
        return self.deliver_on_receive

    def delivers_answers_on_receive(self, transaction_manager: bool, costly_commits: bool = False) -> bool:
        """Are requests whose reply goes back in the HTTP response delivered on receipt where
        :meth:`delivers_on_receive` says the others are not (``deliver_on_receive`` None)?"""
        return self.deliver_on_receive is None and self.in_order and not self.delivers_on_receive(
            transaction_manager, costly_commits)

    @property
    def discards_out_of_order(self) -> bool:
        return self.out_of_order == "discard"

    @functools.cached_property
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

    @property
    def probe_interval_cap(self) -> float:
        """``max_probe_interval``, its None resolved: the longest wait between two probes."""
        return self.max_retransmission_interval if self.max_probe_interval is None else self.max_probe_interval

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
