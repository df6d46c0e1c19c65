"""The RM Destination: opens sequences for peers, takes their messages, owes them acknowledgements.

Each incoming protocol event is one short store transaction: read the
destination sequence, apply the state machine (which decides duplicates,
closed sequences, numbers past the last one), record the number and put
the message in the invoker buffer, all or nothing.  A refusal rolls the
transaction back and becomes the WS-RM fault the peer gets, so nothing
accepted before is ever lost or changed by a bad message.

Acknowledgements are not sent from here: when AcksTo is anonymous they ride
the HTTP response (the caller asks :meth:`ack_for`); otherwise the sequence
is marked as owing one and the acknowledgement worker sends it.  Either way
they are made in one place, :mod:`.ackbuilder`, from the sequence's state.

Security, because a destination keeps state on behalf of strangers:
identifiers are unguessable (``urn:uuid:`` + uuid4, from ``os.urandom``);
when the transport authenticated the peer, a sequence takes messages, acks,
Close and Terminate only from the principal that created it; the numbers of
open sequences (per peer and in total) and of messages held are limited.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..statemachine import (
    WAYS, InvalidTransition, MessageEvent, MessageState, Reception, RMDEvent, Stage, Way, message_transition,
    rmd_receive, rmd_transition, way_in,
)
from ..store import (
    BufferedMessage, CommitDeclined, RmdSequence, RmsMessage, RmsSequence, StorageManager, StoreTransaction,
)
from ..wire import (
    AddressingHeaders, AddressingVersion, CloseSequence, CreateSequence, CreateSequenceRefused,
    CreateSequenceResponse, EndpointReference, RMVersion, SequenceAcknowledgement, SequenceHeader,
    SoapFault, TerminateSequence, UnknownSequence, WSA_2005_08,
)
from ..wire.namespaces import ADDRESSING_VERSIONS, RM_VERSIONS
from . import observe
from . import after_response
from .ackbuilder import acknowledgement_of
from .combiner import ALONE, Combiner
from .faults import busy_fault, fault_for_transition
from .later_records import LaterRecords
from .logs import for_sequence
from .policy import RMPolicy
from .source import HandOut, SendReceipt, back_channel_replies, count_reply_handed_out, reply_sequence_key
from ..store.api import RANK_INVOKER, RANK_RMD
from ..store.api.states import received_ranges, rmd_changes, rmd_state, rms_life

if TYPE_CHECKING:
    from .invoker import InvokerWorker

__all__ = ["Destination", "Accepted"]

log = logging.getLogger(__name__)

_RM_BY_NS = {v.ns: v for v in RM_VERSIONS}

#: How long the destination trusts its own count of the bytes held undelivered before it asks
#: the store again: other processes sharing the store (gunicorn workers) add to the real figure.
HELD_BYTES_REFRESH = 1.0
#: The share of :data:`HELD_BYTES_REFRESH` after which a receive that still finds room has the
#: store asked again once its response is written (``after_response``), off every receipt's
#: path: a busy destination's bound then never grows stale, and no receive asks inside its own
#: transaction, which a receipt riding on its COMMIT cannot (it went the general way for it:
#: about 1.5% of the messages at 16 sequences, ``Destination._receipt_at_commit``).  Its cost,
#: counted at 16 sequences (16 clients, 2,400 one-way messages, against 1.0, which turns it off):
#: about one store transaction a second (1.0-1.3), 8-12 a thousand messages, each 0.2-0.26 ms of the
#: receiving thread's CPU and 8-12 ms of its time after its response (a load of 13-19), in place
#: of 7.5 (SQLite) to 15 (PostgreSQL) questions a thousand messages asked inside a receipt: the
#: store is asked about as often as before (SQLite 21-25 times a run against 18, PostgreSQL 32-34
#: against 35-36), but in a transaction of its own (SQLite: a turn on the file).
HELD_BYTES_EARLY = 0.75
#: Receives of one sequence recorded in one transaction at most, unless the policy says.
DEFAULT_RECEIVE_BATCH = 16
_REMEMBERED_CREATES = 1024
_REMEMBERED_OWNERS = 4096
#: How often a sequence's receipt at the commit may find its guess wrong before its receipts go the
#: general way (``Destination._receipt_at_commit``): each costs its application's run.  Counted
#: against the guesses that held (:data:`_FORESIGHT_FORGIVEN`), not for the sequence's life: under
#: load, a message that overtook the one before it by more than ``REORDER_WAIT`` is buffered
#: while the one before guesses, and that guess fails now and then in this process alone (a
#: single client's sequence on a loaded machine: 3 of its first 300 messages, and its next 700
#: then went the general way, ``bench_server_path.py --store xa1 --on-receipt``: 0.11-0.55 of
#: them at the commit).  Another process receiving on the same sequence makes most guesses fail:
#: it still goes the general way after a few.
_FORESIGHT_DECLINES = 3
#: Guesses that held which forgive one that failed: a sequence whose guesses keep failing now and
#: then runs at most one application in this many again, as well as its first
#: :data:`_FORESIGHT_DECLINES`.
_FORESIGHT_FORGIVEN = 16
#: Seconds a receive that delivers on receipt waits at most for the receive of a lower number
#: of its sequence to finish (see ``Destination._wait_turn``); then it goes on regardless.
TURN_WAIT = 5.0
#: Seconds a receive waits at most for the messages between the last one taken and its own to
#: arrive (concurrent requests overtake each other on their way in; see ``Destination._wait_turn``),
#: when at most :data:`REORDER_WINDOW` numbers lie between.
REORDER_WAIT = 0.02
REORDER_WINDOW = 8
#: Seconds a caller's claim waits at most for the replies answered before their record to be
#: recorded (``Destination.wait_records``); then it goes on, and the sender sends its request.
RECORDS_WAIT = 5.0
_REPLY_KEY_PREFIX = reply_sequence_key("")
#: The state a receive puts its message in to take each way (``statemachine.delivery.WAYS``):
#: buffered for the invoker threads, taken and delivered in its transaction, buffered and kept
#: apart to deliver it itself, run before its receipt.
_BUFFERED, _TAKEN, _KEPT_APART, _FIRST = (way_in(way) for way in (Way.BUFFERED, Way.INSIDE, Way.APART, Way.FIRST))
_BY_BUFFER, _INSIDE, _APART, _RUN_FIRST = Way.BUFFERED, Way.INSIDE, Way.APART, Way.FIRST
_NO_SAVEPOINT = contextlib.nullcontext()


@functools.lru_cache(maxsize=256)
def _is_anonymous(address: str) -> bool:
    """Is AcksTo ``address`` an anonymous URI (asked twice per message: cached)?"""
    return EndpointReference(address).is_anonymous


#: the AcksTo addresses for which ``Destination._anonymous`` holds (a stored one is never None)
_ANONYMOUS = ("", *(v.anonymous for v in ADDRESSING_VERSIONS))


class _OutOfOrder(Exception):
    """A message a discarding destination drops (not the next in order)."""

    def __init__(self, seq: RmdSequence, expected: int) -> None:
        super().__init__(f"message {expected} is the next in order")
        self.seq, self.expected = seq, expected


@dataclass(eq=False)
class _Receipt:
    """An application message on its way into the store (one call of :meth:`Destination.receive`)."""

    header: SequenceHeader
    version: RMVersion
    envelope: bytes
    addressing: AddressingHeaders
    principal: str | None
    soap_ns: str
    ack_requested: bool
    expects_reply: bool = False
    #: Set once its recording changed the transaction: from then on only a rollback undoes it.
    wrote: bool = False
    #: Its message's state in the delivery machine as its receive put it: the way it takes
    #: (:attr:`way`) is read from it.  Buffered for the invoker threads unless the receive
    #: chooses another (``way_in``); moved on by a failure on receipt (FAILED: received again
    #: into the buffer, see ``Destination._received_after_failure``), or by a receipt that
    #: buffered what its way meant to deliver (NOT_TAKEN: MISSED, see ``Destination._not_taken``).
    state: MessageState = _BUFFERED
    #: Taken in that transaction (recorded as delivered, never buffered): delivered on commit.
    taken: bool = False
    #: Taken in that transaction with nothing to run: a reply whose call is answered by its
    #: record (see ``Destination.reply_consumers``).
    consumed: bool = False
    #: Consuming it made the sender's work due (the request sequence's Close or Terminate).
    wake_sender: bool = False
    #: It filled a gap: the messages buffered behind it are the invoker threads' to deliver.
    filled_gap: bool = False
    #: Handed to the application (False for a protocol marker it never sees).
    handed_over: bool = False
    #: Holding its turn among the receives of its sequence (see ``Destination._wait_turn``).
    turn: bool = False
    #: Its back-channel reply, taken in its receive's transaction (see :attr:`Accepted.reply`).
    reply: tuple[RmsSequence, RmsMessage] | None = None
    #: Plain acknowledgements that rode on it, applied in its receive's transaction
    #: (``Destination.apply_riding_ack``) unless that ends without a commit.
    acks: tuple[tuple[SequenceAcknowledgement, RMVersion], ...] = ()
    #: Applied, and committed with the receipt (see :attr:`Accepted.acks_applied`).
    acks_applied: bool = False
    #: Applying them made the sender's work due (a Close or Terminate): woken after the commit.
    acks_wake: bool = False
    #: The one of :attr:`acks` the reply's record applied already (``Destination.reply_arrived``), or -1.
    ack_done: int = -1
    #: Delivered on receipt by another receive's thread, in its transaction (``Destination._deliver_together``):
    #: whether that delivery made the sender's work due (read after the commit, in the receive's thread).
    wakes_sender_after: bool | None = None
    #: Recorded in a store transaction of its own that does nothing else: a reply's record may
    #: then commit in its receipt's round trip (``receive_in_order``'s ``commits``).
    alone: bool = False
    #: What its receipt read and decided, once recorded after its application ran (the FIRST way).
    recorded: tuple[RmdSequence, Reception] | None = None

    @property
    def way(self) -> Way:
        """How its receive delivers it, from its message's state (``statemachine.delivery.WAYS``):
        INSIDE (taken in its receive's transaction: delivered there if next in order), APART
        (buffered, then delivered by its receive outside the store's transactions), FIRST (run
        before its receipt, which takes it; its turn passes once that receipt is on disk, not
        when it is taken), or BUFFERED (the invoker threads deliver it)."""
        return WAYS[self.state.stage]


class _Removal:
    """A delivery apart whose application has run, its message to be removed from the buffer in a
    batch of :meth:`Destination._buffer_apart` (see ``InvokerWorker.deliver_received``'s ``mark``)."""

    __slots__ = ("msg", "next_in_order")

    def __init__(self, msg: BufferedMessage, next_in_order: bool) -> None:
        self.msg = msg
        self.next_in_order = next_in_order


class _RanFirst:
    """A receive whose application ran before its receipt (``Destination._run_first``), its
    message to be recorded, and taken, in a batch of :meth:`Destination._buffer_apart`."""

    __slots__ = ("item",)

    def __init__(self, item: _Receipt) -> None:
        self.item = item


class _NotTaken(Exception):
    """A receipt after its application ran did not take its message (another process on the same
    store received it meanwhile): rolled back, the message received again as after a failure."""


class _TwoPhases(Exception):
    """A delivery before its receipt found its global transaction committing in two phases (its
    application's database is not the store's): rolled back, received the general way."""


class _FailedOnReceipt:
    """A batch's outcome for a receive whose application (in its savepoint) failed: buffered after."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


@dataclass(frozen=True)
class Accepted:
    """The outcome of an application message: whether it was new, and the ack for the back-channel.

    ``ack`` is None when acknowledgements go to an addressable AcksTo instead.
    """

    sequence_id: str
    number: int
    duplicate: bool
    ack: SequenceAcknowledgement | None = None
    #: The sequence came with an accepted Offer (its replies may be owed on the back-channel).
    offered: bool = False
    #: InOrder delivery, and a number before it is missing: it cannot be delivered until the
    #: gap is filled, so nobody should wait for its delivery now.
    behind_gap: bool = False
    #: Delivered on receipt, its reply for the back-channel taken in the same transaction
    #: (counted as sent): the reply's sequence and message, to hand out with ``ack``.
    reply: tuple[RmsSequence, RmsMessage] | None = None
    #: The acknowledgements that rode on it were applied in its receipt's transaction (else
    #: the caller applies them, as before the receipt).
    acks_applied: bool = False


class _TurnSignals:
    """The lock of the receives' turns (``with``), and their wake-ups by sequence.

    Every wait on it is for a change of one sequence (its turns, its message run before its
    receipt, its end), so a change wakes that sequence's waiters only.  One condition for all
    woke every waiting receive of the 16 sequences at each turn taken or passed, each to find
    its own unchanged and sleep again: a thread switch, and a wait for the interpreter, each."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        #: sequence -> its condition (on the one lock) and how many wait on it, while any does
        self._waiting: dict[str, tuple[threading.Condition, list[int]]] = {}

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def wait(self, identifier: str, timeout: float | None = None) -> bool:
        """Wait (holding the lock) until :meth:`notify` of ``identifier``, or ``timeout``."""
        entry = self._waiting.get(identifier)
        if entry is None:
            entry = self._waiting[identifier] = (threading.Condition(self._lock), [0])
        entry[1][0] += 1
        try:
            return entry[0].wait(timeout)
        finally:
            entry[1][0] -= 1
            if not entry[1][0]:
                del self._waiting[identifier]

    def notify(self, identifier: str) -> None:
        """Wake the waiters of ``identifier`` (caller holds the lock)."""
        entry = self._waiting.get(identifier)
        if entry is not None:
            entry[0].notify_all()


class Destination:
    """The receiving half of an engine (CXF's ``Destination``)."""

    def __init__(self, store: StorageManager, policy: RMPolicy, *, endpoint: Callable[[], str | None],
                 wake_invoker: Callable[[], None], wake_acks: Callable[[], None],
                 wake_release: Callable[[], None] | None = None, name: str = "wsrm") -> None:
        self.store = store
        self.policy = policy
        #: the engine's name, which its threads carry (the records' thread: ``<name>-reply-records``)
        self.name = name
        self._endpoint = endpoint
        self._wake_invoker = wake_invoker
        self._wake_acks = wake_acks
        self._wake_release = wake_release or wake_acks
        #: Peer of each open sequence created by an unauthenticated peer (by address): the
        #: per-peer limit needs it, and the store keeps only authenticated principals.
        self._peers: dict[str, str] = {}
        #: Recent CreateSequence answers by (wsa:MessageID, peer), for duplicates.
        self._answered: OrderedDict[tuple[str, str], CreateSequenceResponse] = OrderedDict()
        #: Principal served by each source sequence (see :meth:`source_owner`).
        self._owners: OrderedDict[str, str | None] = OrderedDict()
        self._peers_lock = threading.Lock()
        self._create_lock = threading.Lock()
        self.refused_sequences = 0
        #: Messages refused because a byte budget was reached (the source retransmits them).
        self.refused_for_budget = 0
        #: Messages handed to the application in the transaction that received them
        #: (``deliver_on_receive``); the others went through the buffer.
        self.delivered_on_receipt = 0
        #: Of those, handed over before their receipt (delivering apart: :meth:`_run_first`), and of
        #: these, guessed from this process's last receipt of the sequence (no read of the store).
        self.delivered_before_receipt = 0
        self.foreseen_in_memory = 0
        #: Receives that waited for the receipt of a copy of their message whose application ran
        #: before it (then found a duplicate: see :meth:`receive`).
        self.copies_waited = 0
        #: Requests delivered on receipt under a transaction manager whose receipt rode on their
        #: transaction's commit (:meth:`_receipt_at_commit`), and those whose guess was found
        #: wrong there (then received the general way).
        self.receipts_at_commit = 0
        self.receipts_declined_at_commit = 0
        #: Messages dropped because they were not the next in order (``out_of_order="discard"``).
        self.discarded_out_of_order = 0
        #: An upper bound of the bytes held undelivered, as the store last said plus what this
        #: process accepted since (deliveries only lower the real figure), and when the store
        #: said it: while the bound is under every budget no budget needs the store's figures.
        self._held_bound = 0
        self._held_asked_at = float("-inf")
        self._held_lock = threading.Lock()
        #: The bytes accepted since a refresh after a response began (:meth:`_refresh_held`),
        #: and when one was handed to a response (-inf: none under way; one whose response never
        #: ran it, a body nobody closed, is given up after :data:`HELD_BYTES_REFRESH`).
        self._held_added = 0
        self._held_refresh_at = float("-inf")
        #: Concurrent receives of a sequence recorded in one transaction (None: each alone).
        batch = policy.receive_batch
        if batch is None:
            batch = DEFAULT_RECEIVE_BATCH if store.commits_are_costly else 1
        self._receipts: Combiner[_Receipt] | None = Combiner(self._record_batch, batch) if batch > 1 else None
        #: Receives of any sequences buffering their message to deliver it apart
        #: (``deliver_apart``) that wait for the store's file at the same time, recorded in one
        #: transaction by the first of them: one commit and one turn on the file instead of one
        #: each (see :meth:`_buffer_apart`).
        #: The removals from the buffer of those deliveries, once their applications ran, go in the
        #: same batches (:class:`_Removal`).
        self._apart_receipts: Combiner[_Receipt | _Removal | _RanFirst] = \
            Combiner(self._buffer_apart, DEFAULT_RECEIVE_BATCH)
        #: Receives of any sequences that deliver on receipt in their transaction, on a store whose
        #: transactions take turns on the whole file, waiting for it at the same time: recorded and
        #: delivered in one transaction by the first of them, each in a savepoint of its own (see
        #: :meth:`_deliver_together`); None: each alone (set by :meth:`deliver_on_receive`).
        self._together: Combiner[Any] | None = None
        #: Under a transaction manager with ``receive_together`` left automatic: the combiner is
        #: used only while the deliveries on receipt commit in two phases (see
        #: :meth:`_together_combiner`); :attr:`_two_phase` says whether the last one did.
        self._together_if_two_phase = False
        self._two_phase = False
        #: The invoker that takes messages on receipt (``deliver_on_receive``), or None.
        self._direct: InvokerWorker | None = None
        #: Only requests whose reply goes back in the HTTP response are taken on receipt (the
        #: automatic ``deliver_on_receive`` of a store whose commits cost little: see there).
        self._direct_answers_only = False
        #: Receives under way, by sequence and number, while delivering on receipt (see :meth:`_wait_turn`).
        self._turns: dict[str, Counter[int]] = {}
        #: Receives that may deliver on receipt under way, by sequence, from their start to their
        #: answer, and in all (see :meth:`_others_receiving`).
        self._receiving: Counter[str] = Counter()
        self._receiving_total = 0
        self._receiving_lock = threading.Lock()
        self._turns_changed = _TurnSignals()
        #: Delivering apart on a store that can foresee a receipt (``_run_first``): every receive
        #: under way by (sequence, number), the sequence whose message runs its application
        #: before its receipt and that number, and the sequences a Close, Terminate or expiry is
        #: ending (all under ``_turns_changed``).
        self._first_possible = False
        self._under_way: Counter[tuple[str, int]] = Counter()
        self._first: dict[str, int] = {}
        self._ending: Counter[str] = Counter()
        #: Each sequence's RMD row as this process's last receipt run first committed it, and the
        #: number it took: what the next one guesses from instead of reading the store
        #: (:meth:`_foresee_apart`), with the store's ``written_elsewhere`` count then; forgotten
        #: when a receive of the sequence that did not run first ends, or an ending of it begins
        #: (a bounded memory).  The sequences whose receipt run first is under way with nothing
        #: else of theirs ended since it began, and that count as it began.
        self._ran_first: OrderedDict[str, tuple[RmdSequence, int, int]] = OrderedDict()
        self._first_clean: dict[str, int | None] = {}
        #: Under a transaction manager on a store whose receipts can ride on the commit: each
        #: sequence's RMD row and its replies' RMS row as this process's last delivery on receipt
        #: committed them, what the next receipt guesses from (:meth:`_receipt_at_commit`; a
        #: bounded memory), and how often a sequence's guess was found wrong, in guesses that held
        #: (:data:`_FORESIGHT_FORGIVEN` each a wrong one; at :data:`_FORESIGHT_DECLINES` wrong ones
        #: not forgiven the general way, which does not guess: another process shares it).
        self._at_commit_possible = False
        self._foreseen: OrderedDict[str, tuple[RmdSequence, RmsSequence | None]] = OrderedDict()
        self._foresight_declined: OrderedDict[str, int] = OrderedDict()  # (x _FORESIGHT_FORGIVEN)
        #: The last number each sequence took on receipt in this process (a bounded memory).
        self._taken_upto: OrderedDict[str, int] = OrderedDict()
        #: Sequences whose reply's record could not commit in its receipt's round trip (its
        #: ``commits`` declined: a round trip more; an AcksTo that takes acknowledgement requests
        #: declines every time): their records go the old way from then on (a bounded memory).
        self._records_declined: OrderedDict[str, None] = OrderedDict()
        #: Observers of every message recorded in the buffer for later delivery (not a duplicate,
        #: not delivered on receipt) or consumed on receipt (``reply_consumers``), told after its
        #: commit with (envelope, addressing, consumed=...): it is durable by then.  The reliable
        #: zeep client resolves a call's future there, off the invoker's path; they must not
        #: raise, nor take long (the receiving thread runs them).
        self.recorded_listeners: list[Callable[..., None]] = []
        #: Asked, in the transaction that records a message, whether its delivery would have
        #: nothing to do: the reliable zeep client's reply to a call whose future resolves on the
        #: reply's record (no callback).  One that says yes has the message taken in that
        #: transaction, when it is next in order (recorded as delivered, never buffered: the
        #: delivery machine's "taken on receipt", with nothing to hand over), so no second
        #: transaction consumes it later; its ``recorded_listeners`` are told with
        #: ``consumed=True``.  A crash loses nothing by it: a consumed reply's delivery after a
        #: restart would have found no call waiting either.  They must not raise (an error
        #: counts as no), nor take long.
        self.reply_consumers: list[Callable[[bytes, AddressingHeaders], bool]] = []
        #: Asked, before a reply read from the response to a request of ours is recorded, whether
        #: they answered its call with it now (the reliable zeep client's future-only call: it
        #: reads the reply and resolves the future); then the record follows off the caller's
        #: path (:meth:`answer_before_record`), and their ``reply_consumers`` must say yes to it
        #: there.  They must not raise (an error counts as no), nor take long.
        self.reply_answerers: list[Callable[[bytes, AddressingHeaders], bool]] = []
        #: Replies answered before their record are recorded by one thread, in the order they
        #: came (started when first needed): only where a record costs a round trip that can
        #: run beside the caller's next transaction (a store of concurrent sequences whose
        #: commits are costly: PostgreSQL; ``RMPolicy.answer_before_record``).  Elsewhere (memory,
        #: SQLite's one file) the caller records its reply itself, as before.
        self.records_after_answer = policy.answer_before_record and store.commits_are_costly \
            and store.concurrent_sequences
        self._records: LaterRecords | None = None
        self._records_lock = threading.Lock()
        #: The source's side of a consumed reply, in its transaction (``Source.reply_consumed``:
        #: the request has its reply); True when the sender has work now.  Set by the engine.
        self.reply_arrived: Callable[[StoreTransaction, str, Sequence[tuple[SequenceAcknowledgement, RMVersion]]],
                                     tuple[bool, int]] = lambda tx, relates_to, riding: (False, -1)
        #: What :attr:`reply_arrived` will ask of the store for a reply (``Source.reply_answering``):
        #: the receipt asks it in its own round trip.  Set by the engine.
        self.reply_answering: Callable[[str, Sequence[tuple[SequenceAcknowledgement, RMVersion]]],
                                       tuple[str, str, Sequence[tuple[int, int]], bool] | None] = \
            lambda relates_to, riding: None
        #: The source's side of an acknowledgement riding on a received message, in that
        #: message's receipt (``Source.apply_riding_ack``); True when the sender has work now.
        #: None: the receipt leaves them to its caller.  Set by the engine.
        self.apply_riding_ack: Callable[[StoreTransaction, SequenceAcknowledgement, RMVersion], bool] | None = None
        #: What :attr:`apply_riding_ack` will ask of the store for an acknowledgement
        #: (``Source.riding_acknowledging``): the receipt asks it in its own round trip.  Set by
        #: the engine.
        self.riding_acknowledging: Callable[[SequenceAcknowledgement],
                                            tuple[str, Sequence[tuple[int, int]], bool] | None] = lambda ack: None
        #: Wakes the engine's sender (set by the engine).
        self.wake_sender: Callable[[], None] = lambda: None
        #: Counts a consumed reply as delivered, as its delivery would have (the invoker's count,
        #: ``EngineStatus.delivered``; set by the engine).
        self.count_delivered: Callable[[], None] = lambda: None
        #: The invoker that hands out replies on offered sequences as they arrive, or None.
        self._replies: InvokerWorker | None = None
        #: Whether each destination sequence is one this engine offered (a bounded memory).
        self._offered_by_us: OrderedDict[str, bool] = OrderedDict()

    def answer_before_record(self, header: SequenceHeader, envelope: bytes, addressing: AddressingHeaders) -> bool:
        """A reply read from the response to a request of ours (nobody waits for what its
        receive answers): do the ``reply_answerers`` answer its call with it now, before its
        record?  Then the caller goes on while :meth:`record_later` records it; the record is
        the same transaction as before, made a moment later by another thread (see the
        concepts page's crash table).  Not for the sequence's last message, nor on a store
        where a record costs the caller little (:attr:`records_after_answer`)."""
        if not self.records_after_answer or header.last_message or addressing.relates_to is None:
            return False
        for answerer in self.reply_answerers:
            try:
                if answerer(envelope, addressing):
                    return True
            except Exception:  # noqa: BLE001 -- an answerer must not fail the receive: recorded first then
                log.exception("a reply answerer failed")
        return False

    def record_later(self, job: Callable[[], None]) -> None:
        """Run ``job`` (a reply's record, after its call was answered; it catches its own errors)
        in the records' thread, after the records handed to it before."""
        with self._records_lock:
            if self._records is None:
                self._records = LaterRecords(self.name)
            records = self._records
        records.submit(job)

    def wait_records(self) -> None:
        """Wait for the records handed to :meth:`record_later` so far (at most
        :data:`RECORDS_WAIT` seconds): a caller's next claim on its sequence finds the request
        before it acknowledged only once that request's reply is recorded."""
        records = self._records
        if records is not None and not records.wait(RECORDS_WAIT):
            log.debug("replies answered before their record still not recorded after %.0f s", RECORDS_WAIT)

    def close_records(self, timeout: float | None = None) -> bool:
        """Wait until the replies answered before their record are recorded, and end their
        thread (an engine's stop; a start after makes a new one); True once none is left."""
        with self._records_lock:
            records, self._records = self._records, None
        return records is None or records.close(timeout)

    def replies_to(self, invoker: InvokerWorker) -> None:
        """Hand replies arriving on sequences this engine offered to ``invoker``'s application as
        they arrive (``RMPolicy.replies_in_order`` False)."""
        self._replies = invoker

    def is_offered_by_us(self, identifier: str) -> bool:
        """Is destination sequence ``identifier`` one this engine offered (for the replies to its
        requests)?  Known from creation; after a restart, from the source sequence that offered it."""
        with self._peers_lock:
            known = self._offered_by_us.get(identifier)
        if known is not None:
            return known
        with self.store.begin() as tx:  # a scan without locks: the RMS comes after the RMD (lock order)
            known = any(s.offered_id == identifier for s in tx.rms.list_all())
        self._remember_offered(identifier, known)
        return known

    def _remember_offered(self, identifier: str, offered: bool) -> None:
        with self._peers_lock:
            self._offered_by_us[identifier] = offered
            while len(self._offered_by_us) > _REMEMBERED_OWNERS:
                self._offered_by_us.popitem(last=False)

    def deliver_on_receive(self, invoker: InvokerWorker, *, answers_only: bool = False) -> None:
        """Hand each message that is next in order to ``invoker``'s application in its receive's
        transaction (``RMPolicy.deliver_on_receive``).  Concurrent receives are then recorded
        one by one, unless ``receive_batch`` was set: a batch is always buffered.

        ``answers_only``: only requests whose reply goes back in the HTTP response to them
        (an operation that answers, an anonymous ReplyTo).  Their receiving thread waits for
        the reply anyway: delivering in that thread saves the hand-off to an invoker thread
        and back, and the reply is ready when the receive's transaction commits."""
        self._direct = invoker
        self._direct_answers_only = answers_only
        self._at_commit_possible = invoker.tm is not None and not self.store.defers_transactions \
            and self.store.commits_are_costly
        # SQLite without a transaction manager: delivering apart, and delivering inside while a
        # batch holds the file (_first_when_busy), a message may run its method before its receipt
        self._first_possible = self._at_commit_possible or (invoker.tm is None and self.store.defers_transactions)
        if self.policy.receive_batch is None and not answers_only:
            self._receipts = None
        self._together = self._together_combiner(invoker)

    @property
    def delivers_together_if_two_phase(self) -> bool:
        """Under a transaction manager, ``receive_together`` automatic: are the receives waiting at
        the same time delivered together once deliveries commit in two phases?"""
        return self._together is not None and self._together_if_two_phase

    def _together_combiner(self, invoker: InvokerWorker) -> Combiner[Any] | None:
        """The combiner of receives that deliver on receipt together (``RMPolicy.receive_together``):
        on SQLite without a transaction manager (:meth:`_deliver_together`, by default), or, when
        the knob asks for it, under one on PostgreSQL, whose row locks wait and whose deadlocks
        are detected and roll back (:meth:`_deliver_in_one_global`); None elsewhere, or with a
        size of 1.  Left automatic under a transaction manager, it is used only while the
        deliveries commit in two phases (:attr:`_two_phase`, as the last one did: the application's
        database is not the store's), where a batch saves a PREPARE and a COMMIT PREPARED of each
        branch and a commit mark a message; in one phase it saved only a COMMIT, and its receives
        waiting for one another cost xa1 more rate than that (see the knob)."""
        store = self.store
        if invoker.tm is None:
            batch: Callable[[list[Any]], list[Any]] | None = \
                self._deliver_together if store.defers_transactions else None
        else:
            batch = self._deliver_in_one_global if store.commits_are_costly and not store.defers_transactions else None
        group = self.policy.receive_together
        self._together_if_two_phase = group is None and batch is not None and invoker.tm is not None
        if group is None:
            group = DEFAULT_RECEIVE_BATCH if batch is not None else 1
        return Combiner(batch, group) if batch is not None and group > 1 else None

    # -- CreateSequence --------------------------------------------------------------------------

    def create_sequence(self, request: CreateSequence, version: RMVersion, addressing: AddressingHeaders,
                        *, principal: str | None, remote_addr: str | None) -> CreateSequenceResponse:
        """Open a destination sequence (and accept an Offer); raises CreateSequenceRefused."""
        with self._create_lock:  # so two copies of one CreateSequence can't both create
            return self._create_sequence(request, version, addressing, principal, remote_addr)

    def _create_sequence(self, request: CreateSequence, version: RMVersion, addressing: AddressingHeaders,
                         principal: str | None, remote_addr: str | None) -> CreateSequenceResponse:
        wsa = addressing.version or version.addressing
        peer = f"user:{principal}" if principal else f"addr:{remote_addr or '?'}"
        repeated = self._answered_before(addressing.message_id, peer)
        if repeated is not None:
            return repeated
        now = time.time()
        with self.store.begin() as tx:
            holder = self._offer_holder(tx, request)
            response = self._offered_before(tx, holder, request, version, addressing, peer, principal)
            if response is None:
                sequence_id = f"urn:uuid:{uuid.uuid4()}"
                self._check_limits(tx, version, peer, principal)
                reply_address = self._offer_target(request, addressing, holder)
                offered_id = (request.offer.identifier
                              if reply_address is not None and request.offer is not None else None)
                expires = request.expires_after
                tx.rmd.create(sequence_id, acks_to=request.acks_to.address, rm_version=version.ns,
                              wsa_version=wsa.ns, principal=principal, offered_id=offered_id,
                              expires=now + expires.total_seconds() if expires else None, now=now)
                accept = None
                if reply_address is not None and offered_id is not None:
                    accept = self._accept_offer(tx, offered_id, reply_address, version, wsa, sequence_id,
                                                addressing)
                response = CreateSequenceResponse(sequence_id, accept=accept)
                for_sequence(log, sequence_id).info("sequence created for %s (AcksTo %s)", peer,
                                                    request.acks_to.address)
                self._remember_offered(sequence_id, False)
        with self._peers_lock:
            self._peers.setdefault(response.identifier, peer)
            if addressing.message_id:
                self._answered[(addressing.message_id, peer)] = response
                while len(self._answered) > _REMEMBERED_CREATES:
                    self._answered.popitem(last=False)
        return response

    def _answered_before(self, message_id: str | None, peer: str) -> CreateSequenceResponse | None:
        """The response already given to this very CreateSequence (a network duplicate), if its
        sequence is still there: answering it again avoids an orphan sequence per duplicate.
        Only the same peer gets it, so a replayed MessageID reveals nothing to a stranger."""
        if not message_id:
            return None
        with self._peers_lock:
            response = self._answered.get((message_id, peer))
        if response is None:
            return None
        with self.store.begin() as tx:
            if tx.rmd.get(response.identifier) is None:
                return None
        for_sequence(log, response.identifier).debug("CreateSequence %s repeated: same answer", message_id)
        return response

    @staticmethod
    def _offer_holder(tx: StoreTransaction, request: CreateSequence) -> RmsSequence | None:
        """The source sequence of ours that already has the offered identifier, if any."""
        offer = request.offer
        if offer is None:
            return None
        # a scan without locks: the RMS lock may only be taken after the RMD's (lock order)
        return tx.rms.peek_by_sequence_id(offer.identifier)

    def _offered_before(self, tx: StoreTransaction, holder: RmsSequence | None, request: CreateSequence,
                        version: RMVersion, addressing: AddressingHeaders, peer: str,
                        principal: str | None) -> CreateSequenceResponse | None:
        """The sequence an earlier CreateSequence with this very Offer opened, if it is still open.

        A client that died before it stored our response sends its
        CreateSequence again after its restart, with a new wsa:MessageID but
        the same offered identifier (kept in its store).  A new sequence would
        have to decline the offer (the identifier is taken), and every reply
        of the client's calls would then be undeliverable.  The offered
        identifier names the sequence pair: the same peer (its principal, and
        its address while this process knows it), the same AcksTo and version
        get the same answer, and the replies go where the new Offer says.
        """
        offer = request.offer
        if (offer is None or holder is None or not self.policy.accept_offers
                or not holder.key.startswith(_REPLY_KEY_PREFIX) or not rms_life(holder).accepts_messages):
            return None
        identifier = holder.key[len(_REPLY_KEY_PREFIX):]
        seq = tx.rmd.get(identifier)
        if (seq is None or not rmd_state(seq).open or seq.principal != principal
                or seq.rm_version != version.ns or seq.acks_to != request.acks_to.address):
            return None
        with self._peers_lock:
            known = self._peers.get(identifier)
        if known is not None and known != peer:
            return None
        target = self._offer_address(request, addressing)
        if offer.endpoint is not None and target != holder.target:
            tx.rms.update(holder.key, target=target)
        for_sequence(log, identifier).info("CreateSequence repeated with offer %s (new MessageID): same sequence",
                                           offer.identifier)
        return CreateSequenceResponse(identifier, accept=self._accept_acks_to(holder.acks_to, addressing))

    def _accept_acks_to(self, acks_to: str, addressing: AddressingHeaders) -> EndpointReference:
        """The AcksTo of an Accept: where the peer sends its acknowledgements of our replies.

        They arrive at this endpoint -- riding on the peer's requests, or posted to it -- so
        the Accept names it: the address the CreateSequence was sent to (its wsa:To), or
        this engine's own.  Anonymous would say "in the HTTP responses to our messages",
        which a peer getting its replies in HTTP responses cannot do; WCF's client faults
        a sequence whose Accept names any address but the one it sends to
        (AcksToMustBeSameAsRemoteAddress), and Microsoft's MS-WSRVCRR 4.1.1 shows its
        service's own address there.
        """
        if not self._anonymous(acks_to):
            return EndpointReference(acks_to)
        to = addressing.to
        if to and not self._anonymous(to) and not EndpointReference(to).is_none:
            return EndpointReference(to)
        return EndpointReference(self._endpoint() or acks_to)

    def _check_limits(self, tx: StoreTransaction, version: RMVersion, peer: str, principal: str | None) -> None:
        open_ids = tx.rmd.open_ids()
        with self._peers_lock:
            mine = sum(1 for sid in open_ids if self._peers.get(sid) == peer)
        if principal is not None:
            mine = max(mine, len(tx.rmd.open_ids(principal)))
        limit = None
        if len(open_ids) >= self.policy.max_open_sequences:
            limit = f"{len(open_ids)} sequences are open (limit {self.policy.max_open_sequences})"
        elif mine >= self.policy.max_open_sequences_per_peer:
            limit = f"{peer} has {mine} open sequences (limit {self.policy.max_open_sequences_per_peer})"
        if limit is not None:
            self.refused_sequences += 1
            log.warning("CreateSequence refused: %s", limit)
            raise CreateSequenceRefused(None, f"CreateSequence refused: {limit}; terminate sequences first",
                                        version=version, sender=False)

    def _offer_target(self, request: CreateSequence, addressing: AddressingHeaders,
                      holder: RmsSequence | None) -> str | None:
        """Where replies on the offered sequence would go, or None when the offer is declined
        (``holder``: a sequence of ours that has the offered identifier already)."""
        offer = request.offer
        if offer is None or not self.policy.accept_offers:
            return None
        if holder is not None:
            log.warning("offer %s declined: the identifier is already in use", offer.identifier)
            return None
        return self._offer_address(request, addressing)

    @staticmethod
    def _offer_address(request: CreateSequence, addressing: AddressingHeaders) -> str:
        """Where replies on the offered sequence go."""
        offer = request.offer
        assert offer is not None
        # 1.0 offers name no endpoint: replies then go where each request's ReplyTo says.
        address = (offer.endpoint.address if offer.endpoint is not None
                   else addressing.reply_to.address if addressing.reply_to is not None else None)
        return address if address is not None else (addressing.version or WSA_2005_08).anonymous

    def _accept_offer(self, tx: StoreTransaction, offered_id: str, reply_address: str, version: RMVersion,
                      wsa: AddressingVersion, sequence_id: str, addressing: AddressingHeaders) -> EndpointReference:
        key = reply_sequence_key(sequence_id)
        acks_to = (self._endpoint() if self.policy.decoupled_acks else None) or wsa.anonymous
        tx.rms.create(key, target=reply_address, acks_to=acks_to, rm_version=version.ns, wsa_version=wsa.ns,
                      next_control_at=None)
        tx.rms.update(key, sequence_id=offered_id, started=True)
        return self._accept_acks_to(acks_to, addressing)

    # -- application messages --------------------------------------------------------------------

    def _sequence(self, tx: StoreTransaction, identifier: str, version: RMVersion,
                  principal: str | None) -> RmdSequence:
        seq = tx.rmd.get(identifier)
        if seq is None:
            raise UnknownSequence(identifier, version=version)
        return self._checked(seq, identifier, version, principal)

    @staticmethod
    def _checked(seq: RmdSequence, identifier: str, version: RMVersion, principal: str | None) -> RmdSequence:
        """``seq``, if a message from ``principal`` in ``version`` may be received on it."""
        if seq.principal is not None and seq.principal != principal:
            # Not "access denied": a stranger learns nothing about sequences that are not theirs.
            for_sequence(log, identifier).warning("refused a message from %r: the sequence belongs to %r",
                                                  principal, seq.principal)
            raise UnknownSequence(identifier, version=version)
        if seq.rm_version != version.ns:
            # A sequence speaks the version it was created in.  In the other version's namespace
            # there is no such sequence: UnknownSequence, in the version the peer used (so it can
            # read it), never an acknowledgement in a version the sequence does not speak.
            for_sequence(log, identifier).warning("refused a WS-RM %s message: the sequence is WS-RM %s",
                                                  version.name, _RM_BY_NS[seq.rm_version].name)
            raise UnknownSequence(identifier, f"sequence {identifier} is not a WS-RM {version.name} sequence",
                                  version=version)
        return seq

    def _check_budgets(self, tx: StoreTransaction, seq: RmdSequence, size: int, number: int) -> None:
        """Refuse (unacknowledged, 503) a message that would hold more bytes than the policy allows.

        Summing the held payloads in the store costs a scan of the buffer, so it is done only
        when this process's upper bound of the total (see ``_held_bound``) could be over the
        smallest budget, or is older than :data:`HELD_BYTES_REFRESH`: a busy destination far
        from its limits asks the store about once a second, not once per message."""
        if self._room_held(size):
            return
        policy = self.policy
        asked_at = time.monotonic()
        by_sequence = tx.invoker.held_bytes()
        identifier = seq.sequence_id
        total = sum(by_sequence.values())
        mine = by_sequence.get(identifier, 0)
        what = None
        if mine + size > policy.max_held_bytes_per_sequence:
            what = f"sequence {identifier} holds {mine} bytes undelivered (limit {policy.max_held_bytes_per_sequence})"
        elif total + size > policy.max_held_bytes:
            what = f"the destination holds {total} bytes undelivered (limit {policy.max_held_bytes})"
        elif total + size > policy.max_held_bytes_per_peer:  # else no peer can be over its budget
            peer = self._peer_of(seq)
            if seq.principal is not None:
                ids = {s.sequence_id for s in tx.rmd.list_all() if s.principal == seq.principal}
            else:
                with self._peers_lock:
                    ids = {sid for sid, p in self._peers.items() if p == peer}
            theirs = sum(by_sequence.get(sid, 0) for sid in ids | {identifier})
            if theirs + size > policy.max_held_bytes_per_peer:
                what = f"{peer} holds {theirs} bytes undelivered (limit {policy.max_held_bytes_per_peer})"
        if what is None:
            with self._held_lock:
                self._held_bound, self._held_asked_at = total + size, asked_at
            return
        self.refused_for_budget += 1
        for_sequence(log, identifier, number).warning("refused a %d-byte message: %s", size, what)
        raise busy_fault(f"{what}; retransmit later", policy.retry_after)

    def _room_held(self, size: int) -> bool:
        """:meth:`_check_budgets` without the store: True (and ``size`` counted in this process's
        bound) when the bound, asked of the store within :data:`HELD_BYTES_REFRESH`, leaves room
        under the smallest budget.  Past :data:`HELD_BYTES_EARLY` of that, the bound is asked
        again once this thread's response is written (:meth:`_refresh_held`), where it can be."""
        policy = self.policy
        smallest = min(policy.max_held_bytes_per_sequence, policy.max_held_bytes_per_peer, policy.max_held_bytes)
        now = time.monotonic()
        with self._held_lock:
            age = now - self._held_asked_at
            if age >= HELD_BYTES_REFRESH or self._held_bound + size > smallest:
                return False
            self._held_bound += size
            self._held_added += size
            refresh = age >= HELD_BYTES_REFRESH * HELD_BYTES_EARLY and now - self._held_refresh_at >= HELD_BYTES_REFRESH
            if refresh:
                self._held_refresh_at = now
        if refresh and not after_response.defer(self._refresh_held):
            with self._held_lock:  # no response to follow here (a worker, an asyncio front end)
                self._held_refresh_at = float("-inf")
        return True

    def _refresh_held(self) -> None:
        """The bound of the bytes held asked of the store again, in a transaction of its own,
        by a receiving thread once its response is written: the store's total, plus what this
        process accepted since the question began.  A failure leaves the bound to age, and a
        receive then asks inside its transaction (:meth:`_check_budgets`), as before."""
        asked_at = time.monotonic()
        with self._held_lock:
            self._held_added = 0
        try:
            with self.store.begin() as tx:
                total = sum(tx.invoker.held_bytes().values())
        except Exception as exc:  # noqa: BLE001 -- a hint's refresh: the receives ask the store themselves
            log.debug("the bound of the bytes held was not asked again (%s): a receive will", exc)
            with self._held_lock:
                self._held_refresh_at = float("-inf")
            return
        with self._held_lock:
            if asked_at > self._held_asked_at:  # (a receive may have asked meanwhile)
                self._held_bound, self._held_asked_at = total + self._held_added, asked_at
            self._held_refresh_at = float("-inf")

    def _peer_of(self, seq: RmdSequence) -> str:
        if seq.principal is not None:
            return f"user:{seq.principal}"
        with self._peers_lock:
            return self._peers.get(seq.sequence_id, "addr:?")

    def receive(self, header: SequenceHeader, version: RMVersion, envelope: bytes,
                addressing: AddressingHeaders, *, principal: str | None, soap_ns: str,
                ack_requested: bool = False, expects_reply: bool = False,
                acks: tuple[tuple[SequenceAcknowledgement, RMVersion], ...] = ()) -> Accepted:
        """Record an application message and buffer it for the application (duplicates: neither).

        ``expects_reply``: its operation answers.  When no reply could reach the
        peer (the sequence came without an Offer and ReplyTo is anonymous), it is
        refused before it is recorded, not run with its reply dropped.

        Concurrent receives of one sequence are recorded together, in one store
        transaction (see :mod:`.combiner` and ``RMPolicy.receive_batch``); each is
        answered only once that transaction committed, so an acknowledgement
        never runs ahead of the store.
        """
        item = _Receipt(header, version, envelope, addressing, principal, soap_ns, ack_requested, expects_reply,
                        acks=acks if self.apply_riding_ack is not None else ())
        if not self._first_possible:
            return self._receive_in_turn(item)
        key = (header.identifier, header.message_number)
        with self._turns_changed:
            if self._first.get(key[0]) == key[1]:  # its copy runs before its receipt: a duplicate then
                self.copies_waited += 1
                while self._first.get(key[0]) == key[1]:
                    self._turns_changed.wait(key[0])
            self._under_way[key] += 1
        try:
            return self._receive_in_turn(item)
        finally:
            with self._turns_changed:
                left = self._under_way[key] - 1
                if left:
                    self._under_way[key] = left
                else:
                    del self._under_way[key]
                known = self._ran_first.get(key[0])
                if known is None or known[1] != key[1]:  # not the receipt run first remembered
                    self._forget_ran_first(key[0])

    def _receive_in_turn(self, item: _Receipt) -> Accepted:
        header = item.header
        if self._receipts is None and self._delivers_now(item):
            identifier = header.identifier
            with self._receiving_lock:
                self._receiving[identifier] += 1
                self._receiving_total += 1
            try:
                self._wait_turn(item)
                try:
                    return self._receive(item)
                finally:
                    self._pass_turn(item)
            finally:
                with self._receiving_lock:
                    self._receiving_total -= 1
                    left = self._receiving[identifier] - 1
                    if left:
                        self._receiving[identifier] = left
                    else:
                        del self._receiving[identifier]
        return self._receive(item)

    def _others_receiving(self, item: _Receipt) -> bool:
        """Is a receive of another sequence than ``item``'s under way in this process (waiting for
        its turn or the store's file, recording, or running its application on receipt)?  The
        automatic ``deliver_apart`` asks: that receive would wait for the file while ``item``'s
        application runs in it.  Read without the lock: a hint, taken once per receive."""
        return self._receiving_total > self._receiving.get(item.header.identifier, 0)

    def _receive(self, item: _Receipt) -> Accepted:
        header = item.header
        try:
            recorded = ALONE if self._receipts is None else self._receipts.submit(header.identifier, item)
            if recorded is ALONE:
                recorded = self._record_alone(item)
        except _OutOfOrder as skipped:
            return self._discarded(skipped.seq, header.message_number, skipped.expected)
        return self._accepted(item, *recorded)

    def _delivers_now(self, item: _Receipt) -> bool:
        """Is ``item``, if next in order, delivered on receipt now (the engine started, its
        application quick, delivery not paused by an outage: then it is buffered, and
        acknowledged as soon as the store has it)?"""
        invoker = self._direct
        if self._direct_answers_only and not self._answered_on_back_channel(item):
            return False
        return (invoker is not None and invoker.application is not None and invoker.running and invoker.quick
                and not invoker.paused)

    def _answered_on_back_channel(self, item: _Receipt) -> bool:
        """Does ``item`` call an operation whose reply goes back in the HTTP response to it?"""
        reply_to = item.addressing.reply_to
        return item.expects_reply and self._anonymous(reply_to.address if reply_to is not None else None)

    def _wait_turn(self, item: _Receipt) -> None:
        """Delivering on receipt: let the receives of a sequence in by number, as CXF's in-order
        destination does.  Concurrent requests overtake each other on their way in (measured
        here: under load, a third of them reach this point before the one sent just before
        them); one that goes first finds the one before it not delivered and is buffered.

        So a receive waits, holding no lock, while a receive of a lower number
        of its sequence is under way in this process and has not yet taken its
        message (once it has, the store makes the next one wait for its
        commit, so the two overlap): at most :data:`TURN_WAIT` seconds.  And
        when a number between the last one taken and this one has not arrived,
        it waits :data:`REORDER_WAIT` seconds at most for it: a message lost on
        the way costs the few after it that much once, not a wait each."""
        identifier, number = item.header.identifier, item.header.message_number
        now = time.monotonic()
        deadline, arrival = now + TURN_WAIT, now + REORDER_WAIT
        with self._turns_changed:
            while True:
                # looked up again after every wait: an emptied counter leaves the dictionary
                under_way = self._turns.get(identifier, ())
                if any(n < number for n in under_way):
                    until = deadline
                elif self._not_arrived(identifier, number, under_way):
                    until = arrival
                else:
                    break
                remaining = until - time.monotonic()
                if remaining <= 0:
                    break
                self._turns_changed.wait(identifier, remaining)
            self._turns.setdefault(identifier, Counter())[number] += 1
            self._turns_changed.notify(identifier)  # a receive of a higher number may wait for this one
        item.turn = True

    def _not_arrived(self, identifier: str, number: int, under_way: Any) -> bool:
        """Is a number just before ``number`` neither taken nor under way (caller holds the lock)?"""
        taken = self._taken_upto.get(identifier)
        if taken is None or not taken < number - 1 or number - taken > REORDER_WINDOW:
            return False
        return any(n not in under_way for n in range(taken + 1, number))

    def _pass_turn(self, item: _Receipt, *, taken: bool = False) -> None:
        """The receive took its message, or ended: the next one may go (once)."""
        if not item.turn:
            return
        item.turn = False
        identifier, number = item.header.identifier, item.header.message_number
        with self._turns_changed:
            if taken:
                self._taken_upto[identifier] = number
                self._taken_upto.move_to_end(identifier)
                if len(self._taken_upto) > _REMEMBERED_OWNERS:
                    forgotten, _ = self._taken_upto.popitem(last=False)
                    self._turns_changed.notify(forgotten)  # its receives no longer wait for a gap
            under_way = self._turns[identifier]
            under_way[number] -= 1
            if under_way[number] <= 0:
                del under_way[number]
            if not under_way:
                del self._turns[identifier]
            self._turns_changed.notify(identifier)

    def _discarded(self, seq: RmdSequence, number: int, expected: int) -> Accepted:
        """``out_of_order="discard"``: a message that is not the next in order was dropped unrecorded.

        As gSOAP does: the source sends it again after the gap.  The
        acknowledgement of what is held tells the source where the gap is; an
        addressable AcksTo gets it at once.
        """
        identifier = seq.sequence_id
        self.discarded_out_of_order += 1
        for_sequence(log, identifier, number).debug("discarded: not the next in order (%d)", expected)
        offered = False  # no reply will come for it: not worth waiting for on the back-channel
        if not self._anonymous(seq.acks_to):
            with self.store.begin() as tx:
                if tx.rmd.get(identifier) is not None:
                    tx.rmd.request_ack(identifier, due_at=time.time())
            self._wake_acks()
            return Accepted(identifier, number, True, None, offered=offered)
        return Accepted(identifier, number, True, self.current_ack(identifier), offered=offered)

    def _record_alone(self, item: _Receipt) -> tuple[RmdSequence, Reception]:
        invoker = self._direct
        if invoker is None or not self._delivers_now(item):
            item.wrote = False
            item.alone = True
            with self.store.begin() as tx:
                recorded = self._record(tx, item)
                if item.consumed:
                    tx.wait_for_disk_later()  # see _record_batch
                return recorded
        if invoker.delivers_apart_now(self._answered_on_back_channel(item), self._others_receiving(item)):
            ran = self._run_first(item, invoker)
            if ran is None:
                return self._record_then_deliver(item, invoker)
            if not isinstance(ran, Exception):
                return ran
            return self._received_after_failure(item, invoker, ran)
        if self._first_when_busy(item, invoker):
            ran = self._run_first(item, invoker, together=True)
            if isinstance(ran, Exception):
                return self._received_after_failure(item, invoker, ran)
            if ran is not None:
                return ran
        # a receive that goes through the combiner in two phases (where one alone cannot ride), or a
        # one-way one there with the knob set: its receipt rides on its batch's commit instead
        # (_batch_guess), if any
        batched = self._together is not None and (
            (self._together_if_two_phase and self._two_phase)
            or (not self._together_if_two_phase and not item.acks and not item.expects_reply))
        if self._at_commit_possible and (item.acks or not item.expects_reply) and not batched:
            ran = self._receipt_at_commit(item, invoker)
            if isinstance(ran, Exception):
                return self._received_after_failure(item, invoker, ran)
            if ran is not None:
                return ran
        together = self._together
        if together is not None and self._together_if_two_phase and not self._two_phase:
            together = None  # one-phase deliveries: each alone (see _together_combiner)
        # a batch's leader runs the batch's phase 2 itself, after the others were answered
        here = invoker.at_decision if together is not None else None
        if here is not None:
            here.collect_here()
        try:
            outcome = ALONE if together is None else together.submit(None, item)
        finally:
            if here is not None:
                here.run_here()
        if outcome is ALONE:  # alone, or its batch rolled back: as if it had come alone
            item.wrote = item.taken = item.handed_over = False
            item.state = _TAKEN
            item.wakes_sender_after = None
            # under a transaction manager whose receipts can ride on the commit, the next receive
            # of the sequence guesses from this one's commit (_foresee_after): its turn comes then,
            # not when this one is taken (it went the general way too, and so on, while the
            # sequence was busy); its receipt would have waited for this commit in the store anyway
            foresees = self._at_commit_possible
            try:
                with invoker.transaction() as tx:
                    recorded = self._record(tx, item, turn_at_take=not foresees)
                    if item.taken:
                        self._deliver_taken(tx, item, invoker)
                        if self._together_if_two_phase:  # (a receipt that delivered nothing tells nothing)
                            self._two_phase = invoker.in_two_phases()
                    held = self._foreseeable(tx, item)
                if self._at_commit_possible:
                    self._foresee_after(item, recorded, held, invoker)
                if item.taken:
                    self._pass_turn(item, taken=True)  # (done already when not foreseen)
                return recorded
            except Exception as exc:
                item.reply = None
                if not item.taken:
                    raise  # the receive itself failed or was refused: as without delivery on receipt
                failure = exc
        elif isinstance(outcome, _FailedOnReceipt):
            failure = outcome.error
        else:
            seq, reception, tx = outcome
            tx.wait_for_disk()  # the batch's commit returned before the disk: nothing is answered before it
            return seq, reception
        return self._received_after_failure(item, invoker, failure)

    def _first_when_busy(self, item: _Receipt, invoker: InvokerWorker) -> bool:
        """Delivering inside on SQLite (no transaction manager): does a batch of receives hold the
        file through its applications as ``item``'s receive begins?  Then ``item`` tries to run its
        application first (:meth:`_run_first`), while that batch holds the file, instead of
        waiting for it and then holding the file through its own application after the batch's:
        their applications (and their own databases' commits) run at once, and its receipt
        alone waits for the file.  A request answered in its HTTP response never does (its reply
        is taken in its receipt's transaction).  Read without the lock: a hint.

        On a quiet machine a receive that comes alone finds no batch running and stays inside
        (one commit); 16 sequences at once, a batch's applications ran one after the other
        while the file was held (0.87-0.89 of the time), each with its own PostgreSQL commit.
        bench_compare.py --clients 16 --calls 3200 --rounds 3 --no-strace (interleaved, load
        14-26): file held 0.88 -> 0.71 of the time, 0.63-0.65 of the messages ran first,
        service CPU 2.20-2.49 -> 1.58-2.00 ms a message, thread switches 16.1-16.4 -> 17.6-19.2,
        SQLite commits 0.52-0.54 -> 0.90-0.92, PostgreSQL flushes 1.00 -> 0.74-0.79 a message; rate
        against plain 16 threads 0.68, 0.55, 0.67 -> 0.91, 1.09, 0.78 in the same rounds.
        Its receipt commits with the batch of receives delivering inside (:meth:`_join_late`,
        or the next batch): as many SQLite commits a message as delivering inside.
        ``RMPolicy.first_when_busy`` (on by default) switches it."""
        together = self._together
        return (together is not None and invoker.tm is None and self.policy.first_when_busy
                and self.policy.deliver_apart is False
                and self.store.defers_transactions and together.busy(None)
                and not self._answered_on_back_channel(item))

    def _received_after_failure(self, item: _Receipt, invoker: InvokerWorker,
                                failure: Exception) -> tuple[RmdSequence, Reception]:
        """The application (or the commit of what it did) failed, and the receipt rolled back with
        it: the message is received again, into the buffer, and that failed try counts as the
        invoker's first attempt (its retry policy, poison store and fault reply apply as to
        any).  Should the commit have happened after all (its answer lost), this second
        receive finds a duplicate, and nothing is delivered twice."""
        failed = message_transition(item.state, MessageEvent.FAILED)  # raises unless it was delivering
        msg = self._taken_message(item)
        for_sequence(log, msg.sequence_id, msg.number).info(
            "delivery on receipt failed (%s: %s): kept in the buffer", type(failure).__name__, failure)
        if item.way is not _RUN_FIRST:  # (deliver_first made a message that ran first SETTLING itself)
            invoker.hold(msg)  # no invoker thread takes it before its attempt is counted
        item.state = failed.state  # SETTLING: received again into the buffer
        item.taken = item.handed_over = False
        item.wrote = False
        try:
            with self.store.begin() as tx:
                recorded = self._record(tx, item)
        except BaseException:
            invoker.release(msg)  # not kept: its source sends it again
            raise
        invoker.failed_on_receipt(msg, failure)
        return recorded

    def _deliver_taken(self, tx: StoreTransaction, item: _Receipt, invoker: InvokerWorker) -> None:
        """Hand ``item``, just taken in ``tx``, to the application, and take its back-channel reply."""
        replies: list[SendReceipt] = []
        hand_out = HandOut() if self._answered_on_back_channel(item) else None
        item.handed_over = invoker.deliver_taken(tx, self._taken_message(item), replies, hand_out)
        item.reply = self._back_channel_reply(tx, item, replies, hand_out)

    def _deliver_together(self, items: list[_Receipt | _RanFirst]) -> list[Any]:
        """Record ``items`` (of any sequences) and deliver each that is next in order, in one
        transaction, each receive's part in a savepoint of its own; an outcome each: (the
        sequence as read, the reception, the transaction), the exception that refused it, or
        :class:`_FailedOnReceipt` when its application failed.

        On a store whose transactions take the whole file (SQLite) receives that deliver on
        receipt run one after the other anyway, each holding the file through its
        application; several waiting for it at once (16 sequences arriving together) take it
        once and commit once, the first of them running the others' applications after its
        own (one BEGIN, one look for in-doubt branches, one COMMIT and its WAL pages, one
        fsync, and no hand-over of the file between them).  A part that fails, the
        application or a refusal, rolls back to its savepoint alone: a refused receive is
        refused, a failed application's message is buffered after the commit as when it
        fails alone (``_record_alone``), and the others commit.  The first part takes no
        savepoint (two statements a batch): when it fails the transaction, which holds
        nothing else yet, rolls back, its message is buffered as above (or, refused, received
        alone again), and the others are each received alone.  Anything else (the
        commit) rolls the batch back: each receive whose application ran is buffered as after
        a failed delivery, the others are recorded alone.  Nothing is answered before the
        commit covering its part is on disk (``wait_for_disk``, in each receive's thread); for
        a batch of several, the first waits for it before the others wake
        (:meth:`_on_disk_before_waking`).

        A :class:`_RanFirst` item is the receipt alone of a message whose application ran while
        a batch held the file (:meth:`_first_when_busy`): its part is recorded first (taken, or
        the batch rolls back before any application of it ran, and each goes alone), and its
        outcome is the transaction."""
        invoker = self._direct
        assert invoker is not None
        outcomes: list[Any] = [None] * len(items)
        alone = len(items) == 1  # its failure rolls the transaction back: no savepoint needed
        # receipts of messages run first (_RanFirst: their applications ran, nothing else to do) go
        # first and take no savepoint: one that fails rolls the batch back before any application
        # of it ran, and each then goes alone
        order = sorted(range(len(items)), key=lambda i: not isinstance(items[i], _RanFirst))
        late: list[bool] = []
        try:
            with invoker.transaction() as tx:
                tx.wait_for_disk_later()  # the receives wait, each in its thread, not the next batch
                for index, at in enumerate(order):
                    if index:
                        tx.next_part()
                    item = items[at]
                    if isinstance(item, _RanFirst):  # fails the batch unless taken: each then alone
                        self._record_ran_first(tx, item.item)
                        outcomes[at] = tx
                        continue
                    try:
                        # the first part needs none: should it fail, the transaction rolls back
                        # with nothing else in it yet, and the others are each received alone
                        with _NO_SAVEPOINT if alone or not index else tx.savepoint():
                            recorded = self._record_and_deliver(tx, item, invoker)
                    except Exception as exc:  # rolled back to its savepoint: the others go on
                        if alone or not index:
                            raise
                        item.reply = None
                        outcomes[at] = _FailedOnReceipt(exc) if item.taken else exc
                        continue
                    outcomes[at] = (*recorded, tx)
                late = self._join_late(tx)
        except Exception as exc:
            if len(items) == 1 and not late and (isinstance(items[0], _RanFirst) or not items[0].taken):
                return [exc]
            log.debug("a batch of %d receives that deliver was rolled back (%s)", len(items), exc)
            return [_FailedOnReceipt(exc) if not isinstance(item, _RanFirst) and item.taken else ALONE
                    for item in items] + [ALONE] * len(late)
        if len(items) + len(late) > 1:
            self._on_disk_before_waking(tx, self._together)
        return outcomes + [tx if joined else ALONE for joined in late]

    def _join_late(self, tx: StoreTransaction) -> list[bool]:
        """A batch of :meth:`_deliver_together`, its parts done, takes before its commit the
        receipts of messages run first that came while it ran (``Combiner.join_late``), in a
        savepoint for all of them: each taken in its message, or (one failing) none of them,
        left to their callers.  Whether each joined.

        Their applications ran while this batch held the file, so they came during it; waiting
        for it to end, they formed a batch of their own, which committed apart (SQLite commits a
        message with first-when-busy 0.77-0.82; taken here and by the next batch, 0.53-0.54, as
        delivering inside's 0.54-0.56: bench_compare --clients 16 --calls 3200, load 21-23)."""
        together = self._together
        joining = [] if together is None else together.join_late(lambda queued: isinstance(queued, _RanFirst))
        if not joining:
            return []
        tx.next_part()
        try:
            with tx.savepoint():
                for part, late in enumerate(joining):
                    if part:
                        tx.next_part()
                    self._record_ran_first(tx, late.item)
        except Exception as exc:  # noqa: BLE001 -- rolled back to the savepoint: each then alone
            log.debug("receipts run first that joined a batch late were rolled back (%s)", exc)
            return [False] * len(joining)
        return [True] * len(joining)

    @staticmethod
    def _on_disk_before_waking(tx: StoreTransaction, combiner: Combiner[Any] | None) -> None:
        """A batch of ``combiner`` committed ``tx`` and each of its other receives waits for that
        commit's fsync before it answers: the next batch may take the file now
        (``Combiner.hand_on``), and the fsync runs before they wake.  Woken first, each went to
        sleep again on it (or ran it, and the first waited): a second sleep and wake-up of a
        thread per receive, in a process whose threads take turns on one interpreter.  Should
        the fsync fail here, each receive tries it again in its own thread and fails there, as
        before."""
        if combiner is not None:
            combiner.hand_on()
        try:
            tx.wait_for_disk()
        except OSError as exc:
            log.debug("a batch's fsync failed before its receives woke (%s): each waits alone", exc)

    def _deliver_in_one_global(self, items: list[_Receipt]) -> list[Any]:
        """Under a transaction manager (a PostgreSQL store): record ``items`` (of any sequences)
        and deliver each that is next in order in one global transaction; an outcome each, as
        :meth:`_deliver_together` gives.

        Each message delivered under a transaction manager is a global transaction of its own:
        a PREPARE and a COMMIT PREPARED per branch (the store's, the application's in its
        database), each flushed by PostgreSQL, and the commit mark.  Receives waiting for
        one another at the same time (16 sequences arriving together) share them: the first
        runs the others' records and applications after its own, in its global transaction,
        the store's branch and the application's branches taken once.  The transaction manager
        has no savepoint across branches (the application's connection to its database is a
        branch of its own), so no part rolls back alone: a message refused before it wrote
        anything is refused alone and the others go on (as :meth:`_record_batch` does); any
        other failure rolls the whole global transaction back.  Then the part that failed is
        settled as when it fails alone (an application's failure: buffered after the rollback,
        its try counted as the invoker's first attempt, ``_FailedOnReceipt``), and every other
        receive goes again alone (:data:`ALONE`: what the batch did rolled back with it, in
        every database, so nothing runs twice); should the commit itself fail, each receive
        whose application ran is buffered as after a failed delivery (a commit that happened
        after all leaves the buffered copy a duplicate).  Parts run in the order of their
        sequences' identifiers, so two such batches (two hosts on one store) take rows in one
        order; a deadlock with another transaction is detected by PostgreSQL and rolls the
        batch back, each receive then alone.  Nothing is answered before the global
        commit, which returns once it is durable.

        Once every part ran, only the commit is left (its round trips and flushes: under
        two-phase commit a PREPARE and a COMMIT PREPARED a branch): the receives waiting
        meanwhile start the next batch then (``Combiner.hand_on``), which records and delivers
        while this one commits.  One batch at a time, they did not overlap at all, and that
        cost more rate than the commits saved.  A part of the next batch whose sequence this
        one holds waits for its commit, as a receive alone would (no deadlock: a commit waits
        for no row).

        A one-way message whose sequence this process delivered last (:meth:`_batch_guess`)
        runs its application before its receipt, which rides on the store's commit
        (:meth:`_deliver_riding`): under two-phase commit the store's branch commits last, in one
        phase, with the commit mark, so the receipt is decided with everything else, and costs
        no round trip of its own (xa2 at 16 sequences: the service's store 1.2-1.6 round trips
        a message -> 0.6-0.7); where every receipt of the batch rides, the store's branch sends
        its BEGIN with them too, and the whole branch is one round trip, its commit.  Their rows
        are locked at that commit, after the general way's.  A guess found wrong there fails the
        commit on purpose: nothing is decided, the application's prepared branch rolls back, and
        each receive of the batch goes again alone (:data:`ALONE`), the general way; their applications ran twice, as a
        wrong guess alone does (:meth:`_receipt_at_commit`)."""
        invoker = self._direct
        assert invoker is not None
        outcomes: dict[int, Any] = {}
        failing: _Receipt | None = None
        riding: list[tuple[_Receipt, RmdSequence, Reception]] = []
        general: list[tuple[_Receipt, tuple[RmdSequence, Reception]]] = []
        try:
            with invoker.transaction() as tx:
                for index, item in enumerate(sorted(items, key=lambda i: i.header.identifier)):
                    if index:
                        tx.next_part()
                    guessed = self._batch_guess(tx, item)
                    if guessed is not None:  # its receipt rides on the batch's commit
                        riding.append((item, *guessed))
                        try:
                            self._deliver_riding(tx, item, invoker)
                        except Exception:
                            failing = item
                            raise
                        outcomes[id(item)] = (*guessed, tx)
                        continue
                    try:
                        recorded = self._record_and_deliver(tx, item, invoker)
                        general.append((item, recorded))
                    except (SoapFault, _OutOfOrder) as exc:
                        if item.wrote or item.taken or tx.failed is not None or len(items) == 1:
                            failing = item
                            raise
                        outcomes[id(item)] = exc  # nothing of it written: refused alone, the others go on
                        continue
                    except Exception:
                        failing = item
                        raise
                    outcomes[id(item)] = (*recorded, tx)
                if self._together_if_two_phase and any(item.taken for item in items):
                    self._two_phase = invoker.in_two_phases()
                if self._together is not None:  # only the commit is left: the next batch starts now
                    self._together.hand_on()
        except Exception as exc:
            if riding:
                for item, _, _ in riding:
                    self._forget_foreseen(item.header.identifier)
                if self.store.declined_at_commit(exc):  # a riding receipt's guess found wrong: each again, alone
                    self.receipts_declined_at_commit += 1
                    for item in items:
                        item.taken = item.acks_applied = False
                        item.reply = None
                    return [ALONE for _ in items]
            if len(items) == 1:
                return [_FailedOnReceipt(exc) if items[0].taken else exc]
            log.debug("a global transaction of %d receives that deliver was rolled back (%s)", len(items), exc)
            for item in items:
                item.reply = None
            # the part that failed is judged as failed; the commit failing, every application that ran
            return [_FailedOnReceipt(exc) if item.taken and (failing is None or item is failing) else ALONE
                    for item in items]
        for item, seq, reception in riding:
            self.receipts_at_commit += 1
            self._foresee(item.header.identifier, seq.with_received(reception.received), None)
            self._pass_turn(item, taken=True)  # committed: the next of its sequence finds itself next
        for item, (seq, reception) in general:  # what the next receipt of each one-way sequence guesses from
            if item.taken and not item.acks and not item.expects_reply and not reception.duplicate \
                    and reception.received.highest == item.header.message_number:
                self._foresee(item.header.identifier, seq.with_received(reception.received), None)
        return [outcomes[id(item)] for item in items]

    def _batch_guess(self, tx: StoreTransaction, item: _Receipt) -> tuple[RmdSequence, Reception] | None:
        """In a batch (:meth:`_deliver_in_one_global`): the guess of a one-way message whose
        receipt may ride on the batch's commit (:meth:`_guess_reception`, from what this
        process's last delivery of its sequence committed), or None: the general way.  Its
        statements ride on the store branch's next round trip, the store's commit, which under
        two-phase commit is the one that carries the decision (its commit mark) after the
        application's branch is prepared; on a branch that sent nothing yet (the batch's first
        receipt, or every one before it riding too) the branch's BEGIN rides in front of them
        (``StoreTransaction.rides_first_writes``).  Not while another receive of
        its sequence runs first or ends it, or a higher number of it is under way (see
        :meth:`_guessed_at_commit`)."""
        if not self._at_commit_possible or item.acks or item.expects_reply or not tx.receives_at_commit \
                or not getattr(tx, "rides_first_writes", False):  # (a SQL store's: it receives at its commit)
            return None
        known = self._foreseen_guess(item)
        guessed = None if known is None else self._guess_reception(item, known[0])
        if guessed is None:
            return None
        identifier, number = item.header.identifier, item.header.message_number
        with self._turns_changed:
            if identifier in self._first or self._ending[identifier] or self._under_way[(identifier, number)] > 1 \
                    or any(n > number for n in self._turns.get(identifier, ())):
                return None
        return guessed

    def _deliver_riding(self, tx: StoreTransaction, item: _Receipt, invoker: InvokerWorker) -> None:
        """``item``'s part of a batch, its guess made (:meth:`_batch_guess`): its application
        runs, then its receipt and take ride on the batch's commit (one statement that checks
        itself, ``StoreTransaction.receive_at_commit``): found wrong there, it fails on purpose,
        and the whole global transaction with it (:meth:`_deliver_in_one_global` then receives
        each of the batch again, alone)."""
        identifier, number = item.header.identifier, item.header.message_number
        item.wrote = item.handed_over = item.consumed = item.wake_sender = item.acks_wake = False
        item.state = _TAKEN
        item.taken = True
        item.acks_applied = False
        item.reply = None
        item.wakes_sender_after = None
        item.ack_done = -1
        # the receipt's rows are locked at the commit, in the store's order (RMD, invoker)
        tx.order_as_first(RANK_RMD, identifier)
        tx.order_as_first(RANK_INVOKER, identifier)
        self._deliver_taken(tx, item, invoker)
        if not tx.receive_at_commit(identifier, number, now=time.time()):
            raise AssertionError("a transaction that receives at its commit refused to")

    def _record_and_deliver(self, tx: StoreTransaction, item: _Receipt,
                            invoker: InvokerWorker) -> tuple[RmdSequence, Reception]:
        """A receive's part of a batch that delivers on receipt: recorded, and delivered if taken."""
        item.wrote = item.taken = item.handed_over = False
        item.state = _TAKEN
        item.reply = None
        item.wakes_sender_after = None
        recorded = self._record(tx, item)
        if item.taken:
            self._deliver_taken(tx, item, invoker)
            item.wakes_sender_after = invoker.delivery_wakes_sender()
        return recorded

    def _back_channel_reply(self, tx: StoreTransaction, item: _Receipt, replies: list[SendReceipt],
                            hand_out: HandOut | None = None) -> tuple[RmsSequence, RmsMessage] | None:
        """In the transaction that delivered ``item`` on receipt: the one reply its application
        enqueued for the back-channel, counted as sent there (as ``BackChannel`` would count it
        in a transaction of its own after the commit), so the receiving thread answers with it
        at once.  Committed with the delivery, or rolled back with it; a response that never
        reaches the client leaves the reply stored, for the request's next copy.  Enqueued as
        sent already (``hand_out``), it takes no statement here."""
        if len(replies) != 1 or not self._answered_on_back_channel(item):
            return None
        receipt = replies[0]
        if receipt.sequence_key != reply_sequence_key(item.header.identifier):
            return None
        taken = hand_out.taken if hand_out is not None else None
        if taken is not None and taken[1].sequence_key == receipt.sequence_key and taken[1].number == receipt.number:
            return taken
        return count_reply_handed_out(tx, receipt.sequence_key, receipt.number)

    def _run_first(self, item: _Receipt, invoker: InvokerWorker, *, together: bool = False
                   ) -> tuple[RmdSequence, Reception] | Exception | None:
        """Delivering apart: hand ``item`` to the application before its receipt, then record it
        taken on receipt in one transaction (:meth:`InvokerWorker.deliver_first`), shared with
        the receipts of other sequences that want the file at the same time: one commit a
        message where buffering it first (:meth:`_record_then_deliver`) made two, and the
        application runs while others hold the file.  What its receipt read and decided; the
        exception that failed it (the application's, or its receipt's: nothing of it is in
        the store, and the caller receives it as after a failed delivery); or None when it is
        not run first (the caller buffers it to deliver apart, or as it would).

        It runs first only when its receipt will take it: the store's last committed state
        (read without taking the file: :meth:`StorageManager.foresee_in_order`) shows its
        sequence open with exactly 1..n-1 received and delivered, nothing buffered; the
        checks its receipt makes pass on that state; its bytes fit every budget without
        asking the store; and nothing in this process can change that before its receipt:
        it is the only receive of its number under way (a copy arriving meanwhile waits for
        its receipt, then finds a duplicate: see :meth:`receive`), and no Close, Terminate
        or expiry of its sequence runs (each waits for its receipt: :meth:`_sequence_ending`).
        The receives of its sequence behind it wait for their turn (:meth:`_wait_turn`) until
        its receipt is on disk, then find themselves next.  Another process on the same store
        could still receive it, or end its sequence, meanwhile: its receipt then fails, and
        the message is received as after a failed delivery (its application's work in the
        store rolled back with the receipt; its work elsewhere done again, as after a crash
        between that work's commit and the receipt's).

        ``together``: run first because a batch of receives that deliver inside held the file
        (:meth:`_first_when_busy`); its receipt then joins the next of those batches
        (:meth:`_deliver_together`), not one of its own."""
        header = item.header
        identifier, number = header.identifier, header.message_number
        if header.last_message or number < 2 or not self._room_held(len(item.envelope)):
            return None
        with self._turns_changed:
            if identifier in self._first or self._ending[identifier] \
                    or self._under_way[(identifier, number)] > 1:
                return None
            self._first[identifier] = number
            self._first_clean[identifier] = elsewhere = self.store.written_elsewhere()
            seq = self._foresee_apart(identifier, number, elsewhere)
        ran = False
        try:
            if seq is None:
                seq = self.store.foresee_in_order(identifier, number)
            if seq is None:
                return None
            try:
                seq = self._checked(seq, identifier, item.version, item.principal)
                rmd_receive(rmd_state(seq), number, last=False, received=received_ranges(seq),
                            last_number=seq.last_number)
            except (SoapFault, InvalidTransition):
                return None  # its receipt refuses it: the general way says how
            reply_to = item.addressing.reply_to
            if item.expects_reply and seq.offered_id is None \
                    and self._anonymous(reply_to.address if reply_to is not None else None):
                return None
            item.wrote = item.taken = item.handed_over = False
            msg = self._taken_message(item)
            item.state = _FIRST
            item.recorded = None
            try:
                item.handed_over = invoker.deliver_first(
                    msg, lambda tx: self._record_ran_first(tx, item),
                    lambda: self._record_ran_first_with_others(item, together))
            except Exception as exc:  # noqa: BLE001 -- judged as a failed delivery on receipt
                return exc  # (SETTLING now: see deliver_first)
            self.delivered_before_receipt += 1  # (counted by deliver_first as delivered)
            assert item.recorded is not None
            ran = True
            with self._turns_changed:  # before its turn passes: the next of its sequence guesses from it
                self._remember_ran_first(item, item.recorded[1])
            self._pass_turn(item, taken=True)  # on disk: the next of its sequence finds itself next
            return item.recorded
        finally:
            with self._turns_changed:
                del self._first[identifier]
                self._first_clean.pop(identifier, None)
                if not ran:
                    self._ran_first.pop(identifier, None)
                self._turns_changed.notify(identifier)

    def _foresee_apart(self, identifier: str, number: int, elsewhere: int | None) -> RmdSequence | None:
        """:meth:`_run_first`'s guess without reading the store (under ``_turns_changed``): the row
        this process's receipt run first of ``number - 1`` committed, while no receive of a higher
        number of the sequence is under way (it may be buffered), no other receive of it ended since
        that receipt began (:meth:`receive` forgets the row then: a lower number under way is a
        copy, which changes nothing), no ending of it began (:meth:`_sequence_ending`), and no
        other store held the file since that receipt began (``elsewhere``: the store's
        ``written_elsewhere`` now, the same).  That receipt took its message with 1..number-1
        received, nothing buffered and the sequence open: the store's read
        (:meth:`StorageManager.foresee_in_order`) would find the same.  None: read it."""
        known = self._ran_first.get(identifier)
        if known is None or known[1] != number - 1 or elsewhere is None or known[2] != elsewhere \
                or any(k[0] == identifier and k[1] > number for k in self._under_way):
            return None
        self.foreseen_in_memory += 1
        return known[0]

    def _remember_ran_first(self, item: _Receipt, reception: Reception) -> None:
        """A receipt run first committed (under ``_turns_changed``): remember its sequence's row for the
        next number's guess (:meth:`_foresee_apart`) when nothing else of the sequence ended since it
        began, no other store held the file since, its message was taken with exactly 1..n
        received, and its sequence stays open."""
        identifier, number = item.header.identifier, item.header.message_number
        received = reception.received
        seq = item.recorded[0] if item.recorded is not None else None
        elsewhere = self._first_clean.get(identifier)
        if seq is None or elsewhere is None or elsewhere != self.store.written_elsewhere() or not item.taken \
                or reception.duplicate or received.highest != number or not received.is_complete_up_to(number) \
                or rmd_changes(reception.transition):
            self._ran_first.pop(identifier, None)
            return
        self._ran_first[identifier] = (seq.with_received(received), number, elsewhere)
        self._ran_first.move_to_end(identifier)
        if len(self._ran_first) > _REMEMBERED_OWNERS:
            self._ran_first.popitem(last=False)

    def _forget_ran_first(self, identifier: str) -> None:
        """Something of ``identifier`` other than a receipt run first ended or begins to end
        (under ``_turns_changed``): its next receipt run first reads the store."""
        self._ran_first.pop(identifier, None)
        self._first_clean.pop(identifier, None)

    def _receipt_at_commit(self, item: _Receipt, invoker: InvokerWorker
                           ) -> tuple[RmdSequence, Reception] | Exception | None:
        """Under a transaction manager: hand ``item`` (a request answered on the back-channel)
        to the application before its receipt, and send the receipt, the take and the
        acknowledgement that rode on it with the transaction's COMMIT
        (``StoreTransaction.receive_at_commit``), its reply's enqueue riding there too, numbered
        from the reply sequence's row as this process last committed it
        (``foresee_sequence``): one round trip less than the receipt's own before the
        application.  What its receipt decided; the exception that failed it (the
        application's, or its commit's: nothing of it is in the store, and the caller receives
        it as after a failed delivery on receipt); or None when it was not tried, or its
        guess was found wrong (then nothing of it was committed: the caller receives it the
        general way, and the application runs again there).

        The guess: this process's last delivery of the sequence (:attr:`_foreseen`) took
        ``number - 1`` and left it open and in order, the reply sequence open and numbered so
        far; the checks its receipt makes pass on that row; its bytes fit every budget
        without asking the store; and nothing in this process changes that before its
        commit (as :meth:`_run_first`: no copy of it under way, a copy arriving waits, so does
        a Close or Terminate of its sequence).  The receipt's statement checks all of it
        before the COMMIT and fails on purpose where it does not hold (another process on the
        same store received the message, or enqueued on the reply sequence), and the whole
        transaction with it: the application's work in the store's database too.  Its work
        elsewhere is done again by the general way, as after a crash between that work's
        commit and the receipt's.

        A one-way message (no acknowledgement rode on it, its operation answers nothing) goes
        the same way: its receipt and take alone ride on the COMMIT, checked there
        (:meth:`_one_way_at_commit`)."""
        if not item.acks and not item.expects_reply:
            return self._one_way_at_commit(item, invoker)
        known = self._foreseen_guess(item)
        if known is None or len(item.acks) != 1 or not self._answered_on_back_channel(item):
            return None
        seq, reply_seq = known
        ack = item.acks[0][0]
        if reply_seq is None or ack.nacks or ack.final or not ack.ranges or reply_seq.sequence_id != ack.identifier \
                or reply_seq.key != reply_sequence_key(item.header.identifier) or seq.offered_id is None:
            return None
        acknowledging = self.riding_acknowledging(ack)
        guessed = None if acknowledging is None else self._guess_reception(item, seq)
        if guessed is None:
            return None
        return self._guessed_at_commit(item, invoker, guessed[0], reply_seq, guessed[1], acknowledging)

    def _one_way_at_commit(self, item: _Receipt, invoker: InvokerWorker
                           ) -> tuple[RmdSequence, Reception] | Exception | None:
        """:meth:`_receipt_at_commit` for a one-way message: the application runs, then its
        receipt and take go with the COMMIT (``StoreTransaction.receive_at_commit`` without an
        acknowledgement): two round trips of the service's session a message, the
        application's (its BEGIN in front) and the COMMIT's, where the general way's receipt
        had one of its own before the application.  The guess is :meth:`_guess_reception`'s
        alone (no acknowledgement rode on it, no reply sequence to number).  Outcomes as
        :meth:`_receipt_at_commit`'s."""
        known = self._foreseen_guess(item)
        guessed = None if known is None else self._guess_reception(item, known[0])
        if guessed is None:
            return None
        return self._guessed_at_commit(item, invoker, guessed[0], None, guessed[1], None)

    def _foreseen_guess(self, item: _Receipt) -> tuple[RmdSequence, RmsSequence | None] | None:
        """What this process's last delivery of ``item``'s sequence left (:attr:`_foreseen`),
        when a guess from it may be tried: ``item`` is not its sequence's last message (that
        one changes the sequence's state), and the guesses on the sequence were not declined
        :data:`_FORESIGHT_DECLINES` times more than the guesses that held forgave (another process
        receives on it too: :data:`_FORESIGHT_FORGIVEN`)."""
        identifier = item.header.identifier
        known = self._foreseen.get(identifier)
        if known is None or item.header.last_message \
                or self._foresight_declined.get(identifier, 0) >= _FORESIGHT_DECLINES * _FORESIGHT_FORGIVEN:
            return None
        return known

    def _guess_reception(self, item: _Receipt, seq: RmdSequence) -> tuple[RmdSequence, Reception] | None:
        """The guess both receipts at the commit (:meth:`_receipt_at_commit`,
        :meth:`_one_way_at_commit`) make on ``seq``, the row of ``item``'s sequence as this
        process last committed it: the row took ``number - 1`` and left the sequence open, in
        order, with an anonymous AcksTo (no acknowledgement to send elsewhere); the checks
        ``item``'s receipt makes pass on that row, and its receipt would take a new message
        without changing the sequence's state (the statement at the COMMIT checks only that);
        its bytes fit every budget without asking the store (asked last: a yes counts them in
        this process's bound).  The checked row and its receipt's decision, or None: the
        general way says how."""
        identifier, number = item.header.identifier, item.header.message_number
        so_far = received_ranges(seq)
        if seq.closed or seq.terminated or seq.last_number is not None or not self._anonymous(seq.acks_to) \
                or so_far.highest != number - 1 or not so_far.is_complete_up_to(number - 1):
            return None
        try:
            seq = self._checked(seq, identifier, item.version, item.principal)
            reception = rmd_receive(rmd_state(seq), number, last=False, received=so_far, last_number=None)
        except (SoapFault, InvalidTransition):
            return None  # its receipt refuses it: the general way says how
        if reception.duplicate or rmd_changes(reception.transition) or not self._room_held(len(item.envelope)):
            return None
        return seq, reception

    def _guessed_at_commit(self, item: _Receipt, invoker: InvokerWorker, seq: RmdSequence,
                           reply_seq: RmsSequence | None, reception: Reception,
                           acknowledging: tuple[str, Sequence[tuple[int, int]], bool] | None
                           ) -> tuple[RmdSequence, Reception] | Exception | None:
        """:meth:`_deliver_before_receipt` once the guess is made, as the only receive of its
        sequence under way in this process that runs before its receipt (see :meth:`_run_first`),
        or None when another one is, or its sequence is ending, or a receive of a higher number of
        its sequence is under way in this process: that one overtook ``item`` (beyond
        ``REORDER_WAIT``) and is buffered behind it; its receipt may commit before ``item``'s
        COMMIT, which then finds the row otherwise and fails (measured with one busy sequence
        under load: each of the wrong guesses that were not another message filling a gap).
        One that comes after ``item`` registered waits for ``item``'s turn."""
        identifier, number = item.header.identifier, item.header.message_number
        with self._turns_changed:
            if identifier in self._first or self._ending[identifier] or self._under_way[(identifier, number)] > 1 \
                    or any(n > number for n in self._turns.get(identifier, ())):
                return None
            self._first[identifier] = number
        try:
            return self._deliver_before_receipt(item, invoker, seq, reply_seq, reception, acknowledging)
        finally:
            with self._turns_changed:
                del self._first[identifier]
                self._turns_changed.notify(identifier)

    def _deliver_before_receipt(self, item: _Receipt, invoker: InvokerWorker, seq: RmdSequence,
                                reply_seq: RmsSequence | None, reception: Reception,
                                acknowledging: tuple[str, Sequence[tuple[int, int]], bool] | None
                                ) -> tuple[RmdSequence, Reception] | Exception | None:
        """:meth:`_receipt_at_commit`'s transaction, once its guess is made (``reply_seq`` and
        ``acknowledging`` None: a one-way message's)."""
        identifier, number = item.header.identifier, item.header.message_number
        item.wrote = item.handed_over = item.consumed = item.wake_sender = item.acks_wake = False
        item.state = _TAKEN
        item.taken = True
        item.acks_applied = bool(item.acks)  # applied at the commit, or nothing is
        item.reply = None
        item.wakes_sender_after = None
        item.ack_done = -1
        after: tuple[RmdSequence | None, RmsSequence | None] = (None, None)
        try:
            with invoker.transaction() as tx:
                if not tx.receives_at_commit:  # nothing sent yet: the general way, in this transaction
                    item.taken = item.acks_applied = False
                    recorded = self._record(tx, item)
                    if item.taken:
                        self._deliver_taken(tx, item, invoker)
                    return recorded
                # the receipt's rows are locked at the commit, first, in the store's order
                tx.order_as_first(RANK_RMD, identifier)
                tx.order_as_first(RANK_INVOKER, identifier)
                if reply_seq is not None:
                    tx.foresee_sequence(reply_seq)
                self._deliver_taken(tx, item, invoker)
                if invoker.in_two_phases():  # the application's database is not the store's: see below
                    raise _TwoPhases
                if not tx.receive_at_commit(identifier, number, now=time.time(),
                                            acknowledging=acknowledging,
                                            reply=None if reply_seq is None else reply_seq.key):
                    raise AssertionError("a transaction that receives at its commit refused to")
                if self._together_if_two_phase:
                    self._two_phase = invoker.in_two_phases()
                if reply_seq is not None:
                    after = tx.held_rows(identifier, reply_seq.key)
        except _TwoPhases:
            # a PREPARE before the store's commit: a guess found wrong there would fail a global
            # transaction of several branches; such deliveries take the general way from now on
            # (rolled back: the application runs again there), or, where the receives that commit
            # in two phases are delivered together, their batches (whose receipts ride on the
            # store's marked commit: _batch_guess).  Turned off for good there, a receipt that
            # delivered nothing (buffered: the last delivery then seemed to commit in one phase)
            # turned every batch's receipts off too, for the process's life (bench_compare xa2 at
            # load 26-38: 0.00 receipts at the commit a message in one of four runs)
            if self._together_if_two_phase:
                self._two_phase = True
            else:
                self._at_commit_possible = False
            self._forget_foreseen(identifier)
            item.taken = item.acks_applied = False
            return None
        except Exception as exc:  # noqa: BLE001 -- the application's errors are data here
            item.reply = None
            self._forget_foreseen(identifier)
            if not item.taken:
                raise  # the receive itself failed or was refused (the general way, above)
            if not self.store.declined_at_commit(exc):
                return exc
            self.receipts_declined_at_commit += 1
            with self._turns_changed:
                self._foresight_declined[identifier] = \
                    self._foresight_declined.get(identifier, 0) + _FORESIGHT_FORGIVEN
                while len(self._foresight_declined) > _REMEMBERED_OWNERS:
                    self._foresight_declined.popitem(last=False)
            for_sequence(log, identifier, number).debug("its receipt at the commit guessed wrong: received again")
            item.taken = item.acks_applied = False
            return None
        self.receipts_at_commit += 1
        if identifier in self._foresight_declined:  # (read without the lock: a hint)
            self._forgive_decline(identifier)
        reply_after = after[1]
        if reply_after is not None or reply_seq is None:  # (a one-way message's sequence: its row alone)
            self._foresee(identifier, seq.with_received(reception.received), reply_after)
        self._pass_turn(item, taken=True)  # committed: the next of its sequence finds itself next
        return seq, reception

    def _forgive_decline(self, identifier: str) -> None:
        """A guess of ``identifier``'s that held: one in :data:`_FORESIGHT_FORGIVEN` of a wrong one forgiven."""
        with self._turns_changed:
            left = self._foresight_declined.get(identifier, 0) - 1
            if left > 0:
                self._foresight_declined[identifier] = left
            else:
                self._foresight_declined.pop(identifier, None)

    def _foresee(self, identifier: str, seq: RmdSequence, reply_seq: RmsSequence | None) -> None:
        """Remember ``seq`` and ``reply_seq`` as a delivery on receipt committed them (see :attr:`_foreseen`)."""
        with self._turns_changed:
            self._foreseen[identifier] = (seq, reply_seq)
            self._foreseen.move_to_end(identifier)
            if len(self._foreseen) > _REMEMBERED_OWNERS:
                self._foreseen.popitem(last=False)

    def _foreseeable(self, tx: StoreTransaction, item: _Receipt) -> RmsSequence | None:
        """In the transaction of a receive that delivered on receipt the general way: its reply
        sequence's row as the transaction holds it, when its next receipt may guess from it."""
        if not self._at_commit_possible or item.reply is None or not item.taken:
            return None
        return tx.held_rows(item.header.identifier, item.reply[0].key)[1]

    def _foresee_after(self, item: _Receipt, recorded: tuple[RmdSequence, Reception],
                       reply_seq: RmsSequence | None, invoker: InvokerWorker) -> None:
        """After the commit of a receive that delivered on receipt the general way: what its
        sequence's next receipt may guess from (:meth:`_receipt_at_commit`), or nothing.  A
        one-way message's sequence (nothing rode on it, nothing answers it) is remembered
        without a reply sequence once its message was taken.  One that filled a gap left a row
        saying the messages behind it received, but they are in the buffer, and the guess of
        the next number expects them delivered (its COMMIT's take failed): a one-way message's
        receive delivers them first (:meth:`_caught_up`), else its row is not remembered."""
        identifier = item.header.identifier
        seq, reception = recorded
        one_way = not item.acks and not item.expects_reply and item.taken
        if (reply_seq is None and not one_way) or reception.duplicate \
                or (reception.received.highest > item.header.message_number
                    and not (one_way and self._caught_up(item, reception, invoker))):
            self._forget_foreseen(identifier)
            return
        self._foresee(identifier, seq.with_received(reception.received), reply_seq)

    def _caught_up(self, item: _Receipt, reception: Reception, invoker: InvokerWorker) -> bool:
        """``item`` filled a gap, its receipt committed: deliver the messages buffered behind it
        from its receive's thread, now (``InvokerWorker.deliver_through``: a transaction each,
        as an invoker thread's), before it answers and passes its turn; True once every number
        its row says received is delivered (by this thread or another).  Then the next number's
        receipt may ride on its COMMIT, guessed from that row, where it went the general way (a
        message that overtook the one before it by more than ``REORDER_WAIT``: the one it
        overtook, itself and the next one went the general way, one busy sequence under load).
        The buffered messages' receipts are durable already; their deliveries are the invoker
        threads' own transactions, made by another thread: the crash table does not change."""
        received = reception.received
        if not received.is_complete_up_to(received.highest):
            return False  # another gap behind it: the buffer waits for it
        if not invoker.deliver_through(item.header.identifier, received.highest, settled=True):
            return False
        item.filled_gap = False  # nothing behind it left for the invoker threads
        return True

    def _forget_foreseen(self, identifier: str) -> None:
        with self._turns_changed:
            self._foreseen.pop(identifier, None)

    def _record_ran_first(self, tx: StoreTransaction, item: _Receipt) -> None:
        """The receipt of a message whose application ran (:meth:`_run_first`), in ``tx``: taken, or raises."""
        item.recorded = self._record(tx, item)
        if not item.taken:
            raise _NotTaken(f"message {item.header.message_number} of sequence {item.header.identifier} "
                            "was received by someone else while its application ran")

    def _record_ran_first_with_others(self, item: _Receipt, together: bool = False) -> StoreTransaction | None:
        """:meth:`_record_ran_first` in a batch of :meth:`_buffer_apart`, or (``together``, run first
        while a batch delivering inside held the file) of :meth:`_deliver_together`: its
        transaction (committed, not yet waited for), or None if the batch left it to the caller.

        Run first beside a batch delivering inside, its receipt went in a batch of
        :meth:`_buffer_apart` of its own, which took the file between two of those batches:
        such receipts mostly committed alone (SQLite commits 0.9 a message against 0.5
        delivering inside).  Joining the batch that waits for the file, it shares its commit."""
        combiner = self._together if together else None
        outcome = (self._apart_receipts if combiner is None else combiner).submit(None, _RanFirst(item))
        return None if outcome is ALONE else outcome

    @contextlib.contextmanager
    def _sequence_ending(self, identifier: str) -> Any:
        """A Close, Terminate or expiry of ``identifier`` under way: no message of it runs its
        application before its receipt meanwhile, and it waits for one that does (whose
        receipt must not find the sequence ended after its application ran)."""
        if not self._first_possible:
            yield
            return
        with self._turns_changed:
            self._ending[identifier] += 1
            self._forget_ran_first(identifier)
            while identifier in self._first:
                self._turns_changed.wait(identifier)
        try:
            yield
        finally:
            with self._turns_changed:
                left = self._ending[identifier] - 1
                if left:
                    self._ending[identifier] = left
                else:
                    del self._ending[identifier]

    def _record_then_deliver(self, item: _Receipt, invoker: InvokerWorker) -> tuple[RmdSequence, Reception]:
        """Delivery on receipt on a store whose transactions take turns on the whole file: the
        message buffered in a short transaction, then delivered outside it
        (:meth:`InvokerWorker.deliver_received`).

        The application runs while the receives and deliveries of other sequences take
        the file, and their commits share one fsync (SQLite's group commit) instead of
        each waiting, one after the other, for the application of the one before.  The
        buffering commit does not wait for the disk: the delivery's durable commit covers it
        (WAL commits reach the disk in order), and nothing is acknowledged before that; a
        receive that reads it (a duplicate of the message) waits for the disk, as for any
        durable commit.  Receives of other sequences that buffer at the same time share
        that transaction (:meth:`_buffer_apart`).
        Held in this process from that transaction on, so no invoker thread takes the
        message meanwhile; the receives of its sequence behind it wait for their turn
        (:meth:`_wait_turn`) until it is delivered."""
        item.wrote = item.taken = item.handed_over = False
        item.state = _KEPT_APART
        outcome = self._apart_receipts.submit(None, item)
        if outcome is ALONE:  # its batch rolled back: alone, as if it had come alone
            [outcome] = self._buffer_apart([item])
            if isinstance(outcome, BaseException):
                raise outcome
        seq, reception, held, tx = outcome
        recorded = (seq, reception)
        if held is None:
            if not reception.duplicate and not item.taken:  # (taken: a reply consumed by its record)
                self._not_taken(item)
            tx.wait_for_disk()  # a batch that held others' messages did not wait at its commit
            return recorded
        handed_over = invoker.deliver_received(held, self._remove_with_others)
        if handed_over is None:  # not delivered (judged as a failed delivery): answered as buffered
            tx.wait_for_disk()
            return recorded
        item.taken = True  # (counted by deliver_received as delivered)
        item.handed_over = handed_over
        item.filled_gap = recorded[1].received.highest > item.header.message_number
        self._pass_turn(item, taken=True)
        return recorded

    def _remove_with_others(self, msg: BufferedMessage, next_in_order: bool) -> StoreTransaction | None:
        """A delivery apart, its application run and its transaction untouched: ``msg`` removed
        from the buffer in a batch of :meth:`_buffer_apart`, with the receipts and removals of
        other sequences that want the file at the same time; the batch's transaction
        (committed, not yet waited for), or None if the batch left it to the caller."""
        outcome = self._apart_receipts.submit(None, _Removal(msg, next_in_order))
        return None if outcome is ALONE else outcome

    def _buffer_apart(self, items: list[_Receipt | _Removal | _RanFirst]) -> list[Any]:
        """Record ``items`` (of any sequences) in one transaction, each message that is next in
        order held for its receive to deliver apart; an outcome each: (the sequence as read,
        the reception, the message held or None, the transaction), or the exception that
        refused it.  A :class:`_Removal` (a delivery apart that ran its application) removes
        its message from the buffer there, before the receipts (a receipt of the message after
        it then finds it next to deliver); its outcome is the transaction.  The removal may
        fail (someone else delivered the message): the batch rolls back, and each does its
        part alone.

        Several receives waiting for the file at once (16 sequences arriving together) take
        it once and commit once, the first of them recording for all (one SQLite
        transaction: its BEGIN, its look for in-doubt branches, its COMMIT and the WAL pages
        written once).  Each receive's part starts the store's lock order afresh
        (``StoreTransaction.next_part``: on a store whose transactions take the whole file
        the order is bookkeeping alone).  As in :meth:`_record_batch`, a message refused
        before it wrote anything is refused alone, and anything else that fails rolls the
        batch back: each receive then records its message alone.  Nothing is acknowledged
        before the commit covering its record is on disk: the delivery's durable commit,
        or the batch's own (``wait_for_disk`` after it)."""
        invoker = self._direct
        assert invoker is not None
        outcomes: list[Any] = [None] * len(items)
        held: list[BufferedMessage] = []
        try:
            with self.store.begin() as tx:
                removals = False
                for part, index in enumerate(sorted(range(len(items)),
                                                    key=lambda i: not isinstance(items[i], (_Removal, _RanFirst)))):
                    if part:
                        tx.next_part()
                    item = items[index]
                    if isinstance(item, _Removal):
                        invoker.mark_delivered_in(tx, item.msg, item.next_in_order)
                        outcomes[index] = tx
                        removals = True
                        continue
                    if isinstance(item, _RanFirst):  # fails the batch unless taken: each then alone
                        self._record_ran_first(tx, item.item)
                        outcomes[index] = tx
                        removals = True
                        continue
                    item.wrote = False
                    try:
                        recorded = self._record(tx, item)
                    except (SoapFault, _OutOfOrder) as exc:
                        if item.wrote:
                            raise  # its writes are in the transaction: only a rollback undoes them
                        outcomes[index] = exc
                        continue
                    ready = None
                    if not recorded[1].duplicate and not item.taken and self._next_to_deliver(tx, item, recorded[1]):
                        ready = self._taken_message(item)  # as buffered: the payload is not read back
                        if invoker.keep_apart(ready):  # under the transaction that buffered it: no one took it yet
                            held.append(ready)
                        else:
                            ready = None
                    outcomes[index] = (*recorded, ready, tx)
                if held or removals:
                    # each delivery's commit waits, and each removal's thread, before anything is answered
                    tx.wait_for_disk_later()
        except Exception as exc:
            for msg in held:
                invoker.not_kept_apart(msg)
            if len(items) == 1:
                return [exc]
            log.debug("a batch of %d receives to deliver apart was rolled back (%s): each is recorded alone",
                      len(items), exc)
            return [ALONE] * len(items)
        except BaseException:
            for msg in held:
                invoker.not_kept_apart(msg)
            raise
        if removals and not held and len(items) > 1 \
                and not any(isinstance(outcome, BaseException) for outcome in outcomes):
            # every receive of the batch waits for its fsync now (none delivers apart next)
            self._on_disk_before_waking(tx, self._apart_receipts)
        return outcomes

    def _next_to_deliver(self, tx: StoreTransaction, item: _Receipt, reception: Reception) -> bool:
        """Is ``item``, just buffered in ``tx``, the message its sequence delivers next?

        InOrder: every number before it delivered (the delivered numbers are a
        prefix, so exactly ``number - 1`` of the received ones are delivered),
        which the put's read of the delivered ranges answers without a
        statement; those after it, buffered, follow it from the buffer.
        Otherwise the buffer is asked."""
        number = item.header.message_number
        if not self.policy.in_order:
            ready = tx.invoker.next_deliverable(item.header.identifier, in_order=False, now=time.time())
            return ready is not None and ready.number == number
        received = reception.received
        return received.is_complete_up_to(number) \
            and received.count - tx.invoker.held(item.header.identifier, received) == number - 1

    @staticmethod
    def _not_taken(item: _Receipt) -> None:
        """``item``'s receipt buffered its message where its way meant to deliver it on receipt
        (INSIDE, APART): it is not next in order (behind a gap, or the one before it was
        buffered), or another thread has it.  Its state then says where it is and what its
        receive still owes (NOT_TAKEN: MISSED, in the buffer; its receive delivers the buffer up
        to it before answering)."""
        item.state = message_transition(item.state, MessageEvent.NOT_TAKEN).state

    @staticmethod
    def _taken_message(item: _Receipt) -> BufferedMessage:
        """A taken message as the invoker knows buffered ones (it never was)."""
        addressing = item.addressing
        return BufferedMessage(
            sequence_id=item.header.identifier, number=item.header.message_number,
            message_id=addressing.message_id, action=addressing.action or "", soap_version=item.soap_ns,
            payload=item.envelope,
            reply_to=addressing.reply_to.address if addressing.reply_to is not None else None,
            received_at=time.time())

    def _record_batch(self, items: list[_Receipt]) -> list[Any]:
        """Record ``items`` (of one sequence) in one transaction; an outcome each.

        A message refused before it changed anything (a fault, a discarded
        out-of-order message) is refused alone and the others go on.  Anything
        else that fails (a refusal after its writes, the store) rolls the batch
        back, and each caller then records its message by itself, exactly as
        without batching.
        """
        outcomes: list[Any] = []
        try:
            with self.store.begin() as tx:
                for item in items:
                    item.alone = len(items) == 1
                    try:
                        outcomes.append(self._record(tx, item))
                    except (SoapFault, _OutOfOrder) as exc:
                        if item.wrote:
                            raise  # its writes are in the transaction: only a rollback undoes them
                        outcomes.append(exc)
                if all(item.consumed for item in items):
                    # Replies whose calls are answered by their record: the callers have them
                    # from the network, so their commit does not wait for the disk (the next
                    # call's enqueue, which waits, covers it).  Whatever reads the record (the
                    # acknowledgement of the replies, on the next request or on its own) waits
                    # for the disk first, so a power loss that forgets it forgets it on both
                    # sides: the reply stays with the peer, comes again in answer to its
                    # request's next copy, and is dropped then (its caller is gone; such a call
                    # has no callback to run twice).  See the concepts page's crash table.
                    tx.wait_for_disk_later()
        except Exception as exc:
            if len(items) == 1:
                return [exc]
            log.debug("a batch of %d receives was rolled back (%s): each is recorded alone", len(items), exc)
            return [ALONE] * len(items)
        return outcomes

    def _record(self, tx: StoreTransaction, item: _Receipt, *,
                turn_at_take: bool = True) -> tuple[RmdSequence, Reception]:
        """The receive's work in ``tx``: the sequence as read, and the state machine's reception.
        ``turn_at_take``: a message taken passes its turn (``_pass_turn``) here, before the
        commit; else the caller passes it after the commit."""
        header, version, envelope, addressing = item.header, item.version, item.envelope, item.addressing
        identifier, number = header.identifier, header.message_number
        now = time.time()
        # a record tried again (alone, after its batch rolled back) starts afresh
        item.consumed = item.wake_sender = item.acks_applied = False
        item.ack_done = -1
        way = WAYS[item.state.stage]
        taking = way is _INSIDE or way is _RUN_FIRST  # its receipt takes it, if next in order
        # a steady stream's next message: recorded and taken in the round trip that locks its
        # sequence, before the checks below, which roll the transaction back if they refuse it;
        # so is the reply a call's future takes (consumed: its delivery would have nothing to do)
        # (asked once: a consumer reads the reply, and keeps what it read for the call)
        consuming = (not taking and not header.last_message and addressing.relates_to is not None
                     and bool(self.reply_consumers) and self._consumed_here(item))
        # a consumed reply's mark of its request goes in the receipt's round trip (see
        # reply_arrived), else the first acknowledgement riding on it (see _apply_riding_acks)
        answering = self.reply_answering(addressing.relates_to, item.acks) \
            if consuming and addressing.relates_to is not None else None
        # its record commits in that round trip too when nothing could follow it: no other
        # acknowledgement to apply, no refusal after it (the checks of the sequence are made by
        # the store then, the budget's room taken now), no acknowledgement to request
        commits = (version.ns, item.principal, _ANONYMOUS) \
            if answering is not None and item.alone and len(item.acks) == 1 and not item.expects_reply \
            and identifier not in self._records_declined and self._room_held(len(envelope)) else None
        acknowledging = self.riding_acknowledging(item.acks[0][0]) \
            if answering is None and not consuming and item.acks and self.apply_riding_ack is not None else None
        # a receipt buffered to deliver apart guesses too, and is not taken (the put follows)
        guessed = None
        if (taking or consuming or way is _APART) and not header.last_message:
            take = taking or consuming
            while True:  # twice at most: a declined commit is tried again without it
                try:
                    guessed = tx.receive_in_order(identifier, number, now=now, answering=answering,
                                                  acknowledging=acknowledging, take=take, commits=commits)
                    break
                except CommitDeclined:  # nothing of it written: again, a round trip more (see _records_declined)
                    if commits is None:
                        raise
                    commits = None
                    self._records_declined[identifier] = None
                    while len(self._records_declined) > _REMEMBERED_OWNERS:
                        self._records_declined.popitem(last=False)
        if guessed is not None:
            item.wrote = True  # a refusal below must roll its writes back, in a batch too
            before, taken_with_receipt = guessed
            seq = self._checked(before, identifier, version, item.principal)
        else:
            seq = self._sequence(tx, identifier, version, item.principal)
        try:
            reception = rmd_receive(rmd_state(seq), number, last=header.last_message,
                                    received=received_ranges(seq), last_number=seq.last_number)
        except InvalidTransition as exc:
            for_sequence(log, identifier, number).info("refused: %s", exc)
            raise fault_for_transition(exc, version, identifier) from None
        # the message that fills the gap is never refused: refusing it would hold the rest for ever
        so_far = received_ranges(seq)
        if self.policy.discards_out_of_order and not reception.duplicate and number != so_far.next_expected:
            raise _OutOfOrder(seq, so_far.next_expected)  # nothing recorded
        reply_to = addressing.reply_to.address if addressing.reply_to is not None else None
        if item.expects_reply and not reception.duplicate and seq.offered_id is None:
            if self._anonymous(reply_to):
                for_sequence(log, identifier, number).warning(
                    "refused: its operation answers, and no reply could reach the peer")
                raise SoapFault(
                    f"message {number} of sequence {identifier} calls an operation that answers, but "
                    "the sequence came without an Offer and its ReplyTo is anonymous: no reply could "
                    "reach you; offer a sequence for replies in CreateSequence, or name an addressable "
                    "ReplyTo (the reply then goes on a sequence to it)", code="Sender")
        fills_gap = self.policy.in_order and number == so_far.next_expected < so_far.highest
        if not reception.duplicate and not fills_gap and commits is None:  # (else its room is held)
            self._check_budgets(tx, seq, len(envelope), number)
        item.wrote = True
        changes = rmd_changes(reception.transition)
        if guessed is not None:  # written and taken already
            if changes:
                tx.rmd.update(identifier, **changes)
            taken = taken_with_receipt
            if consuming and taken:  # a guess that holds is never a duplicate
                item.consumed = True
                assert addressing.relates_to is not None
                item.wake_sender, item.ack_done = self.reply_arrived(tx, addressing.relates_to, item.acks)
        elif taking and not reception.duplicate and not changes:  # the common case: one call
            taken = tx.receive_and_take(identifier, number, last=header.last_message, now=now)
        else:
            tx.rmd.record_received(identifier, number, last=header.last_message, now=now)
            if changes:
                tx.rmd.update(identifier, **changes)
            taken = taking and not reception.duplicate and tx.invoker.take_next(identifier, number)
            if not taken and not reception.duplicate and (consuming or (
                    (taking or header.last_message) and self._consumed_here(item))):
                taken = item.consumed = tx.invoker.take_next(identifier, number)
                if taken and addressing.relates_to is not None:
                    item.wake_sender, item.ack_done = self.reply_arrived(tx, addressing.relates_to, item.acks)
        if not reception.duplicate:
            if taken:
                item.taken, item.filled_gap = True, fills_gap  # delivered before this transaction ends
                # (one run first passes it once on disk, one the caller foresees from once committed:
                # the next one's foresight reads committed rows)
                if way is not _RUN_FIRST and turn_at_take:
                    self._pass_turn(item, taken=True)  # the next receive now waits for this commit in the store
            else:
                if way is _INSIDE:
                    self._not_taken(item)
                tx.invoker.put(identifier, number, envelope, action=addressing.action or "",
                               soap_version=item.soap_ns, message_id=addressing.message_id, reply_to=reply_to,
                               now=now)
        if not reception.duplicate and not fills_gap and not item.taken:
            # after the put, which read what is delivered already: the count needs no read
            # of its own; a refusal rolls the put back with the rest
            held = tx.invoker.held(identifier, so_far)
            if held >= self.policy.max_unacknowledged_held:
                for_sequence(log, identifier, number).warning("refused: %d messages already held for delivery", held)
                raise busy_fault(f"sequence {identifier} holds {held} undelivered messages "
                                 f"(limit {self.policy.max_unacknowledged_held}); retransmit later",
                                 self.policy.retry_after)
        if not self._anonymous(seq.acks_to):
            delay = 0.0 if item.ack_requested else self.policy.acknowledgement_interval
            tx.rmd.request_ack(identifier, due_at=now + delay)
        if item.acks:
            self._apply_riding_acks(tx, item)
        return seq, reception

    def _apply_riding_acks(self, tx: StoreTransaction, item: _Receipt) -> None:
        """The acknowledgements that rode on ``item``, applied in its receipt's transaction (after
        its RMD row, as the store's lock order wants): one transaction per message instead of
        two.  A wrong one is ignored, as it was in a transaction of its own (a bad
        acknowledgement must not get the message refused); it is refused before it writes."""
        apply = self.apply_riding_ack
        assert apply is not None
        item.acks_wake = False
        for index, (ack, version) in enumerate(item.acks):
            if index == item.ack_done:
                continue  # applied by the reply's record (see reply_arrived)
            try:
                item.acks_wake = apply(tx, ack, version) or item.acks_wake
            except SoapFault as fault:
                for_sequence(log, item.header.identifier, item.header.message_number).warning(
                    "piggybacked acknowledgement ignored: %s", fault)
        item.acks_applied = True

    def _consumed_here(self, item: _Receipt) -> bool:
        """Does a reply consumer say ``item``'s delivery would have nothing to do?"""
        for consumer in self.reply_consumers:
            try:
                if consumer(item.envelope, item.addressing):
                    return True
            except Exception:  # noqa: BLE001 -- a consumer must not fail the receive: it is buffered
                log.exception("a reply consumer failed")
        return False

    def _tell_recorded(self, item: _Receipt) -> None:
        for listener in self.recorded_listeners:
            try:
                listener(item.envelope, item.addressing, consumed=item.consumed)
            except Exception:  # noqa: BLE001 -- an observer must not fail the receive
                for_sequence(log, item.header.identifier, item.header.message_number).exception(
                    "a recorded-message listener failed")

    def _accepted(self, item: _Receipt, seq: RmdSequence, reception: Reception) -> Accepted:
        """After the commit: wake the invoker, and the acknowledgement for the back-channel."""
        identifier, number = item.header.identifier, item.header.message_number
        # every receive comes here: its adapter only when the lines below are written
        slog = for_sequence(log, identifier, number) if log.isEnabledFor(logging.DEBUG) else None
        if reception.duplicate:
            if slog is not None:
                slog.debug("duplicate: acknowledged again, not delivered")
        elif item.consumed:
            if slog is not None:
                slog.debug("accepted and consumed (its call is answered)")
            self.delivered_on_receipt += 1
            self.count_delivered()
            observer = observe.active
            if observer is not None:  # a delivery, which the receive's transaction committed
                observer.delivering(item.envelope, sequence_id=identifier, number=number,
                                    action=item.addressing.action or "", message_id=item.addressing.message_id,
                                    transaction=None).end()
            self._tell_recorded(item)
            if item.wake_sender:
                self.wake_sender()
            if item.filled_gap:
                self._wake_invoker()  # the messages buffered behind it are deliverable now
        elif item.taken and self._direct is not None:
            if slog is not None:
                slog.debug("accepted and delivered")
            if item.handed_over:  # not a protocol marker (1.0's LastMessage)
                self.delivered_on_receipt += 1
            if item.way is _INSIDE:  # (delivering apart or first, the invoker counted it)
                self._direct.delivered_on_receive(item.handed_over, item.wakes_sender_after)
            if item.filled_gap:
                self._wake_invoker()  # the messages buffered behind it are deliverable now
        else:
            if slog is not None:
                slog.debug("accepted")
            self._tell_recorded(item)
            # its receive meant to deliver it on receipt: its receipt did not take it (NOT_TAKEN:
            # MISSED, whose way is the buffer's), or its delivery apart was judged a failure (still
            # APART here)
            on_receipt = item.state.stage is Stage.MISSED or item.way is not _BY_BUFFER
            if self._replies is not None and self._replies.running and self.is_offered_by_us(identifier):
                # a reply: handed out now, whatever the replies before it (each resolves its own call)
                if not self._replies.deliver_now(identifier, number):
                    self._wake_invoker()
            elif on_receipt or not self._deliver_after_response():
                self._wake_invoker()
            if on_receipt and self._direct is not None:
                # it missed delivery on receipt (the one before it was buffered, or a gap): deliver
                # the buffer up to it before answering, so that the next message finds itself next
                # (delivering apart too: else, once a sequence fell behind, every message after it
                # was buffered, and the invoker thread delivered them all, holding the file)
                self._direct.deliver_through(identifier, number)
        if item.acks_wake:
            self.wake_sender()  # an acknowledgement that rode on it made a Close or Terminate due
        ack = None
        after = reception.transition.state
        if self._anonymous(seq.acks_to):
            ack = acknowledgement_of(seq, reception.received, after)
        else:
            self._wake_acks()
        behind_gap = self.policy.in_order and not reception.received.is_complete_up_to(number)
        return Accepted(identifier, number, reception.duplicate, ack, offered=seq.offered_id is not None,
                        behind_gap=behind_gap, reply=item.reply, acks_applied=item.acks_applied)

    def _deliver_after_response(self) -> bool:
        """A message buffered for the invoker (not meant for delivery on receipt): have the
        receiving thread deliver the buffer once its response is written (:mod:`.after_response`)
        rather than wake an invoker thread; False when it will not (no such thread, an
        application not quick, delivery paused, or ``deliver_on_receive`` False)."""
        invoker = self._direct
        if invoker is None or not invoker.quick or invoker.paused or not invoker.running:
            return False
        return after_response.defer(invoker.steps_after_response)

    def ack_requested(self, identifier: str, version: RMVersion, *, principal: str | None) -> RmdSequence:
        """An AckRequested: returns the sequence; a non-anonymous AcksTo gets an ack at once.

        Like any message on the sequence it is activity (WS-RM): a source whose
        backlog keeps it from sending on this sequence for a while asks for an
        acknowledgement so that the inactivity timeout does not end it.
        """
        with self.store.begin() as tx:
            seq = self._sequence(tx, identifier, version, principal)
            if not seq.terminated:
                seq = tx.rmd.update(identifier, last_activity=time.time())
            if not self._anonymous(seq.acks_to):
                tx.rmd.request_ack(identifier, due_at=time.time())
        if not self._anonymous(seq.acks_to):
            self._wake_acks()
        return seq

    # -- closing ------------------------------------------------------------------------------------

    def close(self, request: CloseSequence, version: RMVersion, *, principal: str | None) -> RmdSequence:
        """CloseSequence (1.1): no new messages; returns the sequence for the final acknowledgement."""
        return self._end_event(request.identifier, version, principal, RMDEvent.CLOSE_RECEIVED)

    def terminate(self, request: TerminateSequence, version: RMVersion, *, principal: str | None) -> RmdSequence:
        seq = self._end_event(request.identifier, version, principal, RMDEvent.TMR)
        self._wake_release()  # the RMD worker deletes terminated sequences once delivery is done
        return seq

    def _end_event(self, identifier: str, version: RMVersion, principal: str | None,
                   event: RMDEvent) -> RmdSequence:
        with self._sequence_ending(identifier), self.store.begin() as tx:
            seq = self._sequence(tx, identifier, version, principal)
            try:
                transition = rmd_transition(rmd_state(seq), event)
            except InvalidTransition as exc:
                raise fault_for_transition(exc, version, identifier) from None
            changes = rmd_changes(transition)
            if changes:
                seq = tx.rmd.update(identifier, **changes)
        for_sequence(log, identifier).info("%s (received %s)", event.value, received_ranges(seq))
        return seq

    def expire(self, identifier: str) -> bool:
        """End a sequence the peer abandoned (inactivity timeout or Expires); True if it ended."""
        with self._sequence_ending(identifier), self.store.begin() as tx:
            seq = tx.rmd.get(identifier)
            if seq is None:
                return False
            transition = rmd_transition(rmd_state(seq), RMDEvent.INACTIVITY_TIMEOUT)
            if transition.noop:
                return False
            tx.rmd.update(identifier, **rmd_changes(transition))
        for_sequence(log, identifier).warning("sequence ended: no activity (received %s)", received_ranges(seq))
        return True

    def source_owner(self, identifier: str) -> tuple[bool, str | None]:
        """(is it a source sequence of ours, the principal it serves -- None: no one in particular).

        A reply sequence accepted from an Offer belongs to the principal of the
        destination sequence it was offered with; sequences this engine opened
        itself name no principal.  Cached: a sequence's owner never changes.
        """
        with self._peers_lock:
            if identifier in self._owners:
                return True, self._owners[identifier]
        with self.store.begin() as tx:  # RMS alone: the RMD is read in its own transaction (lock order)
            found = tx.rms.get_by_sequence_id(identifier)
        key = found.key if found is not None else None
        owner, known = None, key is not None
        if key is not None and key.startswith(_REPLY_KEY_PREFIX):
            with self.store.begin() as tx:
                seq = tx.rmd.get(key[len(_REPLY_KEY_PREFIX):])
            owner, known = (seq.principal, True) if seq is not None else (None, False)
        if known:
            with self._peers_lock:
                self._owners[identifier] = owner
                while len(self._owners) > _REMEMBERED_OWNERS:
                    self._owners.popitem(last=False)
        return key is not None, owner

    def owner_of(self, identifier: str) -> str | None:
        """The principal any sequence of ours belongs to: a destination sequence's creator, or the
        peer a source sequence serves (see :meth:`source_owner`); None when no one in particular."""
        exists, owner = self.source_owner(identifier)
        if exists:
            return owner
        with self.store.begin() as tx:
            seq = tx.rmd.get(identifier)
        return seq.principal if seq is not None else None

    def forget(self, identifier: str) -> None:
        with self._peers_lock:
            self._peers.pop(identifier, None)

    # -- acknowledgements ------------------------------------------------------------------------------

    @staticmethod
    def _anonymous(address: str | None) -> bool:
        return not address or _is_anonymous(address)

    def acks_on_back_channel(self, seq: RmdSequence) -> bool:
        """Acknowledgements of ``seq`` go in HTTP responses (its AcksTo is anonymous)."""
        return self._anonymous(seq.acks_to)

    def ack_for(self, seq: RmdSequence) -> SequenceAcknowledgement | None:
        """The acknowledgement of ``seq`` as it stands (None for 1.0 before any message): see
        :func:`~.ackbuilder.acknowledgement_of`, the one place every acknowledgement is made."""
        return acknowledgement_of(seq)

    # -- replies on the back-channel ---------------------------------------------------------------

    def back_channel(self, identifier: str, *, tx: StoreTransaction | None = None) -> bool:
        """Do replies to destination sequence ``identifier`` go back in HTTP responses?"""
        if tx is None:
            with self.store.begin() as own:
                return self.back_channel(identifier, tx=own)
        return back_channel_replies(tx, identifier) is not None

    def end_offered(self, offered_id: str) -> None:
        """Client side: end the offered sequence whose replies came in HTTP responses.

        The peer cannot terminate it (it has no address of ours), so it ends
        with the request sequence it was offered with.
        """
        with self.store.begin() as tx:
            seq = tx.rmd.get(offered_id)
            if seq is None or seq.terminated:
                return
            transition = rmd_transition(rmd_state(seq), RMDEvent.TMR)
            changes = rmd_changes(transition)
            if changes:
                tx.rmd.update(offered_id, **changes)
        for_sequence(log, offered_id).info("offered sequence ended with its request sequence")
        self._wake_release()

    def ack_delivered(self, sent: RmdSequence) -> None:
        """The acknowledgement built from ``sent`` reached AcksTo: owe nothing more, unless
        something arrived since (then the newer acknowledgement is still owed)."""
        with self.store.begin() as tx:
            seq = tx.rmd.get(sent.sequence_id)
            if seq is None or seq.ack_due_at is None:
                return
            if (seq.received, seq.closed, seq.terminated) == (sent.received, sent.closed, sent.terminated):
                tx.rmd.ack_sent(sent.sequence_id)

    def create_offered(self, tx: StoreTransaction, offered_id: str, acks_to: str, version: RMVersion) -> None:
        """Client side of an accepted Offer: the destination sequence the replies will arrive on."""
        if tx.rmd.get(offered_id) is None:
            tx.rmd.create(offered_id, acks_to=acks_to, rm_version=version.ns,
                          wsa_version=self.policy.addressing.ns)
            for_sequence(log, offered_id).info("offered sequence accepted by the peer (AcksTo %s)", acks_to)
        self._remember_offered(offered_id, True)

    def current_ack(self, identifier: str) -> SequenceAcknowledgement | None:
        """The acknowledgement of sequence ``identifier`` from committed state (no lock held after)."""
        with self.store.begin() as tx:
            seq = tx.rmd.read(identifier)
        return self.ack_for(seq) if seq is not None else None

