"""The RM Source: application messages into source sequences, and what the peer says about them.

``send`` enqueues an application envelope into the RMS store inside the
caller's transaction: the XA transaction of a ``txmanager`` when the caller
has one (so "update my database AND send this message" commits atomically),
the invoker's transaction when an application handler sends from inside a
delivery, else a short local one.  Nothing goes on the wire here: the
retransmission worker (:mod:`.retransmission`) sends what the store holds,
which is what makes a crash or a lost connection harmless.

Sequences are created lazily, one per (target, internal key) as CXF does,
and rolled over to a new one after ``max_sequence_length`` messages.  The
other methods apply what the peer said (CreateSequenceResponse,
acknowledgements, Close/Terminate responses, faults) as state-machine
events, each in its own short store transaction.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from lxml import etree

from ..statemachine import AckRanges, InvalidTransition, RMSDuty, RMSEvent, RMSState, rms_duties, rms_transition
from ..store import (
    InvalidAcknowledgementError, RmsMessage, RmsSequence, SequenceNotOpenError, StorageManager,
    StoreTransaction, UnknownSequenceError,
)
from ..wire import (
    RM10, AddressingHeaders, CreateSequenceResponse, EndpointReference, InvalidAcknowledgement, RMVersion,
    SequenceAcknowledgement, UnknownSequence, WSRMFault, build_envelope, to_bytes,
)
from ..wire.namespaces import RM_VERSIONS, AddressingVersion, mc_anonymous_id
from . import observe
from .combiner import ALONE, Combiner
from .envelopes import OutgoingMessage, prepare_outgoing
from .logs import for_sequence
from .policy import RMPolicy
from ..store.api.states import rms_changes, rms_life, rms_state

__all__ = ["Source", "PendingAcks", "SendReceipt", "HandOut", "SequenceFault", "FailedMessage", "SequenceKey",
           "is_back_channel", "SequenceFaulted", "SequenceRefused", "CREATE_REFUSED"]

log = logging.getLogger(__name__)

_RM_BY_NS = {v.ns: v for v in RM_VERSIONS}
#: RM faults after which the peer will never accept the sequence again.
_FATAL_FAULTS = frozenset({"UnknownSequence", "SequenceTerminated", "SequenceClosed",
                           "MessageNumberRollover", "CreateSequenceRefused", "LastMessageNumberExceeded"})


#: The duties a sequence has once its application is done and every message is acknowledged.
_CONTROL_DUTIES = frozenset({RMSDuty.SEND_CLOSE, RMSDuty.SEND_TERMINATE})


def _owes_control(state: RMSState) -> bool:
    """Does ``state`` owe the peer a CloseSequence or TerminateSequence (the RMS worker's to send)?"""
    return not rms_duties(state).isdisjoint(_CONTROL_DUTIES)


@dataclass(frozen=True)
class SendReceipt:
    """Where an enqueued message went: its sequence (store key), number and wsa:MessageID (a
    :class:`ReceiptAtCommit` where the number is given by the commit of the caller's global
    transaction)."""

    sequence_key: str
    number: int
    message_id: str


class ReceiptNotNumbered(RuntimeError):
    """A :class:`ReceiptAtCommit` was asked its number before its transaction committed."""


class ReceiptAtCommit(SendReceipt):
    """A :class:`SendReceipt` whose number its transaction's commit gives: ``Source.send`` in a
    global transaction (for a caller that waits for the reply, or a message no caller sends
    itself), where the enqueue rides on the branch's COMMIT
    (``rms_messages.enqueue_claiming_at_commit``) and takes its number there.
    Its ``number`` (and ``sequence_key``: should the sequence take no more messages by then,
    the commit enqueues on another) raise :class:`ReceiptNotNumbered` before the commit, and
    after a rollback.  ``message_id`` is known at once."""

    _where: tuple[str, int] | None
    _key: str

    def __init__(self, sequence_key: str, message_id: str) -> None:  # noqa: D107 -- the class says it
        object.__setattr__(self, "message_id", message_id)
        object.__setattr__(self, "_where", None)
        object.__setattr__(self, "_key", sequence_key)

    @property
    def numbered(self) -> bool:
        """True once the commit gave the number."""
        return self._where is not None

    @property
    def sequence_key(self) -> str:
        return self._located()[0]

    @property
    def number(self) -> int:
        return self._located()[1]

    def _located(self) -> tuple[str, int]:
        where = self._where
        if where is None:
            raise ReceiptNotNumbered(f"message {self.message_id} is numbered when its transaction commits")
        return where

    def at_commit(self, sequence_key: str, number: int) -> None:
        """Where the commit put the message (the engine's to call)."""
        object.__setattr__(self, "_where", (sequence_key, number))

    def __repr__(self) -> str:
        where = self._where
        told = f"sequence_key={where[0]!r}, number={where[1]}" if where is not None else \
            f"sequence_key={self._key!r}, numbered at commit"
        return f"ReceiptAtCommit({told}, message_id={self.message_id!r})"

    # Its place is given by the commit, after it may have been put in a set or a dict: the
    # message's identity (its wsa:MessageID, unique) is what equality and the hash read, as
    # the place would change them (and raises before the commit).  A SendReceipt is never equal
    # to one: its hash reads its place.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReceiptAtCommit):
            return NotImplemented
        return self.message_id == other.message_id

    def __hash__(self) -> int:
        return hash(self.message_id)


@dataclass(frozen=True)
class FailedMessage:
    """An application message a faulted sequence could not deliver.

    ``reply_callback``/``reply_context`` are those of an in-out call, so
    whoever waits for its reply can be told it will not come.
    """

    number: int
    message_id: str
    action: str
    payload: bytes
    reply_callback: str | None = None
    reply_context: bytes | None = None


#: How a sequence's ``fault_reason`` starts when the peer definitively refused to open it.
CREATE_REFUSED = "CreateSequence refused"


class SequenceFaulted(Exception):
    """A message's sequence was given up (the faulted-sequence failure a caller receives).

    ``reason`` is the stored fault reason (what ``wsrm status`` shows).  Its
    unacknowledged messages stay in the store; once the cause is fixed they can
    be sent again on a new sequence (``ReliableEngine.resend_faulted``, ``wsrm resend``).
    """

    def __init__(self, message: str, *, reason: str | None = None, sequence_key: str | None = None,
                 sequence_id: str | None = None, target: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason if reason is not None else message
        self.sequence_key = sequence_key
        self.sequence_id = sequence_id
        self.target = target


class SequenceRefused(SequenceFaulted):
    """The peer definitively refused to open a sequence: a SOAP Sender fault (a service
    without WS-RM), CreateSequenceRefused, a 4xx answer.  Retrying cannot help."""


@dataclass(frozen=True)
class SequenceFault:
    """What the application hears when a source sequence fails (retries exhausted, refused...)."""

    sequence_key: str
    target: str
    sequence_id: str | None
    reason: str
    messages: tuple[FailedMessage, ...]

    @property
    def refused(self) -> bool:
        """The peer refused to open the sequence at all (nothing was delivered)."""
        return self.reason.startswith(CREATE_REFUSED)

    def error(self) -> SequenceFaulted:
        """The exception a caller waiting on one of these messages receives."""
        cls = SequenceRefused if self.refused else SequenceFaulted
        return cls(f"sequence to {self.target} faulted: {self.reason}", reason=self.reason,
                   sequence_key=self.sequence_key,
                   sequence_id=self.sequence_id, target=self.target)


@dataclass(frozen=True)
class SequenceKey:
    """The parts of a source sequence's store key: target, the caller's key, generation, offer."""

    target: str
    key: str
    generation: int
    offered: bool

    def encode(self) -> str:
        return json.dumps([self.target, self.key, self.generation, "offer" if self.offered else "one-way"],
                          separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> SequenceKey | None:
        """None for keys this class did not write (e.g. sequences accepted from an Offer)."""
        if not text.startswith("["):
            return None
        try:
            target, key, generation, kind = json.loads(text)
        except (ValueError, TypeError):
            return None
        return cls(target, key, int(generation), kind == "offer")


def reply_sequence_key(rmd_sequence_id: str) -> str:
    """The store key of the source sequence accepted from the Offer of destination sequence ``id``."""
    return f"reply:{rmd_sequence_id}"


def rm_version_of(seq: Any) -> RMVersion:
    return _RM_BY_NS[seq.rm_version]


#: ``next_send_at`` of replies that only ever travel in HTTP responses (the worker never sends them).
NEVER = 4e18
#: ``next_send_at`` of a message to send again at once (a Nack, a gap an acknowledgement proved):
#: before every message that is merely due (the store hands out due messages oldest first), so
#: the gap goes out ahead of newer numbers, which a destination that discards out-of-order
#: messages would drop.
AT_ONCE = 1.0
_ANSWERS = b"wsrm-answers:"
#: The conversation key of the sequences that carry replies to requests sent without an Offer.
_REPLIES_KEY = "wsrm-replies"
#: Source sequences :meth:`Source.hears_at_listener` remembers at most.
_REMEMBERED_SEQUENCES = 4096


@functools.lru_cache(maxsize=256)
def is_back_channel(address: str | None) -> bool:
    """No address to POST to (WS-A anonymous, none, or absent): messages ride HTTP responses.

    Asked of a service's own endpoint for every message it receives, and of a target at each
    send: remembered per address (the answer depends on nothing else)."""
    if not address:
        return True
    ref = EndpointReference(address)
    return ref.is_anonymous or ref.is_none


def answers_of(msg: Any) -> int | None:
    """The request number a back-channel reply answers (recorded in its ``reply_context``)."""
    context = msg.reply_context
    if msg.reply_callback is not None or not context or not bytes(context).startswith(_ANSWERS):
        return None
    try:
        return int(bytes(context)[len(_ANSWERS):])
    except ValueError:
        return None


def back_channel_replies(tx: StoreTransaction, rmd_sequence_id: str) -> dict[int, RmsMessage] | None:
    """Unacknowledged back-channel replies of ``rmd_sequence_id``'s offered sequence, by the
    number of the request each answers (no lock); None when its replies go to an address."""
    key = reply_sequence_key(rmd_sequence_id)
    seq = tx.rms.peek(key)
    if seq is None or not is_back_channel(seq.target):
        return None
    found: dict[int, RmsMessage] = {}
    for msg in tx.rms_messages.list_for(key):
        number = answers_of(msg)
        if number is not None and not msg.acked:
            found[number] = msg
    return found


class HandOut:
    """The back-channel reply that the thread which received its request will hand out in the
    HTTP response itself (delivery on receipt): enqueued as sent once, in the delivery's
    transaction, rather than counted as sent by a statement after it
    (:func:`count_reply_handed_out`).  ``taken``: its sequence and the reply, once enqueued."""

    __slots__ = ("taken",)

    def __init__(self) -> None:
        self.taken: tuple[RmsSequence, RmsMessage] | None = None


def count_reply_handed_out(tx: StoreTransaction, key: str, number: int) -> tuple[RmsSequence, RmsMessage] | None:
    """In ``tx``: back-channel reply ``number`` of sequence ``key`` counted as sent (its client may
    acknowledge it from now on, and the sender never sends it); the sequence and the reply, or
    None when the sequence is gone or not started (acknowledged, or ended, meanwhile)."""
    seq = tx.rms.get(key)
    if seq is None or seq.sequence_id is None:
        return None
    return seq, tx.rms_messages.record_send_attempt(key, number, next_send_at=NEVER)


class PendingAcks:
    """Plain acknowledgements merged per sequence until a :meth:`Source.coalesced_acks` block ends.

    Shared by the threads of one sending round, hence the lock.
    """

    def __init__(self) -> None:
        self._acks: dict[str, tuple[SequenceAcknowledgement, RMVersion]] = {}
        self._lock = threading.Lock()

    def merge(self, ack: SequenceAcknowledgement, version: RMVersion) -> None:
        with self._lock:
            held = self._acks.get(ack.identifier)
            ranges = ack.ranges if held is None else AckRanges.from_ranges([*held[0].ranges, *ack.ranges]).ranges
            self._acks[ack.identifier] = (SequenceAcknowledgement(ack.identifier, list(ranges)), version)

    def pop(self, identifier: str) -> tuple[SequenceAcknowledgement, RMVersion] | None:
        with self._lock:
            return self._acks.pop(identifier, None)

    def identifiers(self) -> list[str]:
        with self._lock:
            return list(self._acks)

    def acked_through(self, identifier: str) -> int:
        """The highest number N such that the answers pending here acknowledged messages 1 to N of
        sequence ``identifier`` (0 for none): a lane's refill passes over them
        (``RetransmissionWorker._refill``)."""
        held = self._acks.get(identifier)  # (one read of a dict the lock only writes)
        if held is None or not held[0].ranges or held[0].ranges[0][0] > 1:
            return 0
        return held[0].ranges[0][1]

    def ranges_of(self, identifier: str) -> list[tuple[int, int]] | None:
        """The merged ranges pending for sequence ``identifier`` (left pending), or None."""
        held = self._acks.get(identifier)  # (one read of a dict the lock only writes)
        return None if held is None else held[0].ranges

    def __bool__(self) -> bool:
        return bool(self._acks)


class Source:
    """The sending half of an engine (CXF's ``Source``)."""

    def __init__(self, store: StorageManager, policy: RMPolicy, *, tm: Any = None,
                 endpoint: Callable[[], str | None], wake: Callable[[], None],
                 ambient: threading.local,
                 on_fault: Callable[[SequenceFault], None] | None = None,
                 end_offered: Callable[[str], None] | None = None,
                 wake_in: Callable[[float, object], None] | None = None) -> None:
        self.store = store
        self.policy = policy
        self.tm = tm
        self._endpoint = endpoint
        self._wake = wake
        self._wake_in = wake_in
        self._ambient = ambient
        self._on_fault = on_fault
        self._end_offered = end_offered
        self._current: dict[tuple[str, str, bool], str] = {}
        self._lock = threading.Lock()
        self._secret = uuid.uuid4()
        self._coalescing = threading.local()
        self.faulted_sequences = 0
        #: Observers told of every faulted sequence before the ``on_fault`` hook (they do not take
        #: the messages over: the reliable zeep client fails its futures and callbacks there).
        self.fault_listeners: list[Callable[[SequenceFault], None]] = []
        #: Claims a request kept for its caller in the transaction that enqueues it (the sender's
        #: ``RetransmissionWorker.early_claim``, set by the engine), or None.
        self.early_claim: Callable[[StoreTransaction, str, bool], Any] | None = None
        #: Waits for the replies recorded after their call was answered (the destination's
        #: ``wait_records``, set by the engine): a claim reads what their records acknowledge.
        self.records_done: Callable[[], None] = lambda: None
        #: Whether each source sequence hears about its messages at our listener (a bounded memory).
        self._heard_at_listener: OrderedDict[str, tuple[bool, str | None]] = OrderedDict()
        #: Callers' enqueues in local transactions waiting for the store at the same time, done in
        #: one transaction by the first of them (:meth:`_enqueue_together`); None: each alone.
        together = policy.enqueue_together
        if together is None:
            together = ENQUEUE_TOGETHER if not store.concurrent_sequences else 1
        self._enqueues: Combiner[_Enqueue] | None = (
            Combiner(self._enqueue_together, together) if together > 1 else None)

    # -- transactions ---------------------------------------------------------------------

    def transaction(self) -> contextlib.AbstractContextManager[StoreTransaction]:
        """The caller's transaction (invoker delivery, or XA), else a local one."""
        return _SourceTransaction(self)

    def _wake_after_commit(self, kept: float | None = None, receipt: SendReceipt | None = None) -> None:
        """Wake the sender once the caller's transaction commits (at once if it already did);
        ``kept``: the message of ``receipt`` is kept that long for its caller's thread: wake it
        then instead, unless the caller took it (``ReliableEngine.send_for_caller``)."""
        if getattr(self._ambient, "tx", None) is not None:
            self._ambient.wake_sender = True
            return  # the invoker wakes the workers after its commit
        wake = self._wake
        if kept is not None and self._wake_in is not None and receipt is not None:
            if isinstance(receipt, ReceiptAtCommit):  # its number known by the time the sender is woken
                wake = functools.partial(self._wake_kept, kept, receipt)
            else:
                wake = functools.partial(self._wake_in, kept, (receipt.sequence_key, receipt.number))
        gtx = self.tm.get_transaction() if self.tm is not None else None
        if gtx is None:
            wake()
            return
        gtx.register_synchronization(_WakeAfter(wake))

    def _wake_kept(self, kept: float, receipt: ReceiptAtCommit) -> None:
        """:meth:`_wake_after_commit`'s wake of a message numbered at its commit."""
        if receipt.numbered:
            assert self._wake_in is not None
            self._wake_in(kept, (receipt.sequence_key, receipt.number))
        else:  # (the commit's read failed, see _enqueue_at_commit): the sender looks for itself
            self._wake()

    def _kept_for_caller(self, caller_may_send: bool) -> float | None:
        """How long a new request is kept for its caller's thread to send (None: not kept).

        Never inside a delivery's transaction: the invoker wakes the sender after its commit,
        and its thread cannot wait for a reply before that commit anyway."""
        grace = self.policy.caller_send_grace
        if not caller_may_send or grace is None or self._wake_in is None \
                or getattr(self._ambient, "tx", None) is not None:
            return None
        return grace

    @property
    def endpoint_address(self) -> str | None:
        """This engine's own address (replies to offered sequences come there), if it serves one."""
        return self._endpoint()

    def offered_sequences_post_here(self) -> bool:
        """Do peers POST the messages of the sequences this engine offered to its listener?

        Only when the engine names an address they can reach: its requests' ReplyTo
        and its Offer's Endpoint are made from it (:meth:`send`,
        ``RetransmissionWorker._send_create``).  Without one (anonymous, or a
        WS-MakeConnection anonymous URI) those messages come only in the HTTP
        responses to what it sends, so one posted to a listener of its is a stranger's.
        """
        endpoint = self._endpoint()
        return not is_back_channel(endpoint) and mc_anonymous_id(endpoint) is None

    def _replies_on_back_channel(self) -> bool:
        """Do replies to this engine's requests come in the HTTP responses (it serves no endpoint)?

        Then a request is kept, and sent again, until its reply arrived -- not
        merely until it is acknowledged: a reply lost with its HTTP response is
        only ever sent again in the response to a copy of its request (WCF's
        initiator keeps retrying for the same reason).  The request is
        ``awaits_reply`` in the store, and :meth:`on_ack` leaves it
        unacknowledged until :meth:`reply_arrived`.
        """
        return is_back_channel(self._endpoint())

    def _acks_to(self) -> str:
        """Where the peer should send acknowledgements: the back-channel unless decoupled."""
        endpoint = self._endpoint() if self.policy.decoupled_acks else None
        return endpoint or self.policy.addressing.anonymous

    # -- the application's side ---------------------------------------------------------------

    def send(self, target: str, envelope: bytes | etree._Element, *, action: str | None = None, key: str = "",
             expect_reply: bool = False, message_id: str | None = None,
             reply_callback: str | None = None, reply_context: bytes | None = None,
             caller_may_send: bool = False, caller_sends: bool = False) -> SendReceipt:
        """Enqueue ``envelope`` for ``target`` reliably; returns where it went.

        ``expect_reply`` puts the message on a sequence created with an Offer
        (the peer sends responses on the offered sequence to this engine's
        endpoint; an engine that serves none asks for them with the WS-A
        anonymous ReplyTo, in the HTTP responses to its requests).  ``reply_callback``
        (``"module:function"``) is called with the reply when it arrives.
        ``envelope`` may also be the envelope's lxml tree (a SOAP client's own):
        it is not parsed again, and becomes the stored message (changed in place).
        ``caller_may_send``: the caller may send it from its own thread while it waits for the
        reply (``RetransmissionWorker.send_for_caller``): it is kept for it for
        ``policy.caller_send_grace`` seconds before the sender sends it.
        ``caller_sends``: the caller sends it from its thread as soon as this returns
        (``ReliableEngine.send``'s one-way caller): kept for it, and the sender is not woken for
        it (the caller wakes it when it leaves the message to it); its grace only bounds how
        late the sender's next round (at the latest the poll interval's) takes a message whose
        caller failed before its send.
        """
        if not isinstance(envelope, (bytes, bytearray, etree._Element)):
            raise TypeError(f"envelope must be the SOAP envelope as bytes, not {type(envelope).__name__}")
        if not isinstance(target, str) or not target.strip():
            raise ValueError(f"target must be the peer's address (e.g. http://host:port/path), not {target!r}")
        if not isinstance(key, str):
            raise TypeError(f"key must be a string naming the conversation, not {type(key).__name__}")
        reply_to = None
        if expect_reply or reply_callback:
            reply_to = self._endpoint() or self.policy.addressing.anonymous
            expect_reply = True
        kept = self._kept_for_caller(caller_may_send or caller_sends)
        observer = observe.active
        if observer is not None:
            return self._send_observed(observer, target, envelope, action=action, key=key,
                                       expect_reply=expect_reply, message_id=message_id, reply_to=reply_to,
                                       reply_callback=reply_callback, reply_context=reply_context, kept=kept)
        outgoing = prepare_outgoing(envelope if isinstance(envelope, etree._Element) else bytes(envelope),
                                    to=target, action=action, message_id=message_id,
                                    reply_to=reply_to, relates_to=None, wsa=self.policy.addressing,
                                    max_size=self.policy.max_message_size, remember=False)
        ident = (target, key, expect_reply)
        if kept is None and self._enqueues is not None and self.alone_in_store():
            done = self._enqueues.submit(None, (ident, outgoing, reply_callback, reply_context))
            if done is not ALONE:
                receipt, tx = done
                tx.wait_for_disk()  # the batch's commit returned before the disk: this caller waits for it
                self._wake_after_commit(None, receipt)
                return receipt
        early = None
        try:
            with self.transaction() as tx:
                early = self._early_claim(tx, ident, kept)
                if early is not None:
                    receipt = self._enqueue_claiming(tx, ident, early, outgoing, reply_callback, reply_context, kept)
                else:
                    receipt = self._enqueue_on_current_at_commit(tx, ident, outgoing, reply_callback,
                                                                 reply_context, kept)
                if receipt is None:
                    receipt = self._enqueue_outgoing(tx, ident, outgoing, reply_callback, reply_context, kept=kept)
                    if early is not None:
                        early.claim(tx, receipt)
        except BaseException:
            if early is not None:
                early.abandon()
            raise
        if early is not None:
            early.committed()
        if not caller_sends or kept is None:
            self._wake_after_commit(kept, receipt)
        return receipt

    def current_sequence(self, target: str, key: str = "") -> str | None:
        """The store key of the sequence a one-way message to ``target`` under ``key`` goes on
        now (the last one this engine used for them), or None before one is opened."""
        with self._lock:
            return self._current.get((target, key, False))

    def alone_in_store(self) -> bool:
        """Would this caller's enqueue run in a local store transaction of its own (no delivery's
        transaction to join, no global transaction to bind to)?"""
        if getattr(self._ambient, "tx", None) is not None:
            return False
        return self.tm is None or self.tm.get_transaction() is None

    def _enqueue_together(self, items: list["_Enqueue"]) -> list[Any]:
        """The enqueues of callers that wait for the store at the same time, in one transaction.

        On a store whose transactions take turns on the whole file (SQLite) 16 callers each
        enqueueing in a transaction of their own queue for the file: each turn is a hand-over
        of the file, a BEGIN, a look for in-doubt branches and a COMMIT around the enqueue's
        two statements, and each statement lets the interpreter go while the file is held (the
        holder waits for it while the file waits for the holder).  The first caller enqueues
        for everyone waiting: one turn, one commit and one fsync for all.  The commit returns
        before its fsync; each caller waits for it in its own thread
        (``StoreTransaction.wait_for_disk``), so none returns before its message is on disk, as
        alone.  Should anything fail, nothing of the batch stays and each caller enqueues
        alone, as before (a lone caller's error is raised as it would be alone)."""
        receipts: list[SendReceipt] = []
        try:
            with self.store.begin() as tx:
                tx.wait_for_disk_later()
                for index, (ident, outgoing, reply_callback, reply_context) in enumerate(items):
                    if index:
                        tx.next_part()  # another caller's enqueue: the lock order starts again
                    receipts.append(self._enqueue_outgoing(tx, ident, outgoing, reply_callback, reply_context))
        except Exception as exc:
            if len(items) == 1:
                return [exc]
            log.debug("%d enqueues together rolled back (%s): each alone", len(items), exc)
            return [ALONE] * len(items)
        return [(receipt, tx) for receipt in receipts]

    def _early_claim(self, tx: StoreTransaction, ident: tuple[str, str, bool], kept: float | None) -> Any:
        """The caller's claim of a request kept for it, begun in its enqueue's transaction (see
        ``RetransmissionWorker.early_claim``): one store transaction per call instead of two
        before its send.  Only on the sequence the enqueue takes without opening one; in a
        global transaction too, where it is the caller's only once that commits."""
        if kept is None or self.early_claim is None or self.policy.max_sequence_length is not None:
            return None
        with self._lock:
            cached = self._current.get(ident)
        if cached is None:
            return None
        self.records_done()  # the request before it is acknowledged once its reply is recorded
        in_global = self.tm is not None and self.tm.get_transaction() is not None
        return self.early_claim(tx, cached, in_global)

    def _enqueue_claiming(self, tx: StoreTransaction, ident: tuple[str, str, bool], early: Any,
                          outgoing: OutgoingMessage, reply_callback: str | None, reply_context: bytes | None,
                          kept: float | None) -> SendReceipt | None:
        """The enqueue and its caller's claim (``early``) in one statement where the store can
        (``enqueue_claiming``); None, nothing done, where it cannot or the claim must follow the
        enqueue (``early.first_send``): the caller enqueues, then claims, as before."""
        spec = early.first_send(ident[0])
        if spec is None:
            return None
        next_send_at, offered_id, acked = spec
        self._ambient.wake_sender = True  # inside a delivery: the invoker wakes the sender after its commit
        if early.in_global:
            receipt = self._enqueue_at_commit(tx, ident, early.key, outgoing, reply_callback, reply_context, kept,
                                              ident[0], next_send_at, offered_id, early.claimed)
            if receipt is not None:
                return receipt
        try:
            done = tx.rms_messages.enqueue_claiming(
                early.key, outgoing.payload, action=outgoing.action, soap_version=outgoing.soap.ns,
                message_id=outgoing.message_id, target=ident[0], next_send_at=next_send_at,
                rmd_sequence_id=offered_id, reply_callback=reply_callback, reply_context=reply_context,
                send_at=None if kept is None else time.time() + kept,
                awaits_reply=ident[2] and self._replies_on_back_channel(), acked=acked)
        except (SequenceNotOpenError, UnknownSequenceError):
            return None  # nothing taken: enqueued as before, on a new sequence
        if done is None:
            return None
        msg, claimed, seq, rmd = done
        early.claimed(msg if claimed else None, seq, rmd)
        return SendReceipt(seq.key, msg.number, msg.message_id)

    def _enqueue_on_current_at_commit(self, tx: StoreTransaction, ident: tuple[str, str, bool],
                                      outgoing: OutgoingMessage, reply_callback: str | None,
                                      reply_context: bytes | None, kept: float | None) -> SendReceipt | None:
        """A message no caller sends itself (a one-way call's), in a global transaction: its
        enqueue on the current sequence rides on the store branch's COMMIT, as a request's does
        (:meth:`_enqueue_at_commit`), never claimed (the sender sends it once woken after the
        commit, as it would the message enqueued by a statement of its own).  The store's
        branch whose only statement this is (under XA across two databases, with the commit
        mark that decides) then sends its BEGIN, the enqueue, the mark and the COMMIT in one
        round trip, not two.  The receipt is numbered at the commit (:class:`ReceiptAtCommit`).
        None, nothing done, outside a global transaction, inside a delivery's, with
        ``max_sequence_length``, with no current sequence, or where the store cannot."""
        if kept is not None or self.tm is None or self.policy.max_sequence_length is not None \
                or getattr(self._ambient, "tx", None) is not None or self.tm.get_transaction() is None:
            return None
        with self._lock:
            cached = self._current.get(ident)
        if cached is None:
            return None
        # (target None: the statement's claim test never holds; its due time is the message's)
        return self._enqueue_at_commit(tx, ident, cached, outgoing, reply_callback, reply_context, None,
                                       None, time.time(), None, None)

    def _enqueue_at_commit(self, tx: StoreTransaction, ident: tuple[str, str, bool], key: str,
                           outgoing: OutgoingMessage, reply_callback: str | None, reply_context: bytes | None,
                           kept: float | None, target: str | None, next_send_at: float, offered_id: str | None,
                           claimed: Callable[[RmsMessage | None, RmsSequence, Any], None] | None
                           ) -> SendReceipt | None:
        """:meth:`_enqueue_claiming` in a global transaction whose store branch sends its writes
        with its COMMIT (``rms_messages.enqueue_claiming_at_commit``): the enqueue on sequence
        ``key`` and its claim for the caller (``claimed``; none when None) ride on the COMMIT,
        no round trip of their own, and the message is numbered there (a
        :class:`ReceiptAtCommit`; its caller needs the number only to send it, after the
        commit).  When the sequence takes no more messages by then, the message is enqueued
        as without the ride, in the same transaction before its COMMIT (a new sequence opened
        if need be), and left unclaimed: its caller's send claims it.  None, nothing done,
        where the store cannot."""
        receipt = ReceiptAtCommit(key, outgoing.message_id)

        def enqueued(msg: RmsMessage, was_claimed: bool, rows: Callable[[], tuple[RmsSequence, Any]]) -> None:
            receipt.at_commit(key, msg.number)
            if claimed is not None:  # (a message no caller sends needs only its number: rows unread)
                claimed(msg if was_claimed else None, *rows())

        def otherwise() -> None:
            done = self._enqueue_outgoing(tx, ident, outgoing, reply_callback, reply_context, kept=kept)
            receipt.at_commit(done.sequence_key, done.number)

        rode = tx.rms_messages.enqueue_claiming_at_commit(
            key, outgoing.payload, action=outgoing.action, soap_version=outgoing.soap.ns,
            message_id=outgoing.message_id, target=target, next_send_at=next_send_at,
            enqueued=enqueued, otherwise=otherwise, rmd_sequence_id=offered_id,
            reply_callback=reply_callback, reply_context=reply_context,
            send_at=None if kept is None else time.time() + kept,
            awaits_reply=ident[2] and self._replies_on_back_channel())
        return receipt if rode else None

    def _send_observed(self, observer: observe.Observer, target: str, envelope: bytes | etree._Element, *,
                       action: str | None, key: str, expect_reply: bool, message_id: str | None,
                       reply_to: str | None, reply_callback: str | None,
                       reply_context: bytes | None, kept: float | None = None) -> SendReceipt:
        """:meth:`send`, told to ``observer``: its step ends when the caller's transaction does."""
        gtx = self.tm.get_transaction() if self.tm is not None else None
        step = observer.sending(target=target, action=action, reply=False,
                                transaction=str(gtx.xid) if gtx is not None else None)
        try:
            outgoing = prepare_outgoing(envelope if isinstance(envelope, etree._Element) else bytes(envelope),
                                        to=target, action=action, message_id=message_id,
                                        reply_to=reply_to, relates_to=None, wsa=self.policy.addressing,
                                        max_size=self.policy.max_message_size, extra=step.headers())
            with self.transaction() as tx:
                receipt = self._enqueue_outgoing(tx, (target, key, expect_reply), outgoing, reply_callback,
                                                 reply_context, kept=kept)
        except BaseException as exc:
            step.end(exc)
            raise
        step.note(message_id=receipt.message_id, sequence_key=receipt.sequence_key, number=receipt.number,
                  action=outgoing.action)
        if gtx is not None and getattr(self._ambient, "tx", None) is None:
            gtx.register_synchronization(_EndWithTransaction(step))  # the call ends with its transaction
        else:
            step.end()
        self._wake_after_commit(kept, receipt)
        return receipt

    def _enqueue_outgoing(self, tx: StoreTransaction, ident: tuple[str, str, bool], outgoing: OutgoingMessage,
                          reply_callback: str | None = None, reply_context: bytes | None = None, *,
                          kept: float | None = None) -> SendReceipt:
        """Enqueue a prepared message on the current sequence for ``ident`` (target, key,
        offered), opening one when there is none that takes it.  ``kept``: due only that many
        seconds from now (kept for its caller's thread, which may send it before)."""
        send_at = None if kept is None else time.time() + kept
        receipt = self._enqueue_on_current(tx, ident, outgoing.payload, outgoing.action, outgoing.soap.ns,
                                           outgoing.message_id, reply_callback, reply_context, send_at)
        if receipt is None:
            seq = self._open_sequence(tx, *ident)
            receipt = self._enqueue(tx, seq, outgoing.payload, outgoing.action, outgoing.soap.ns,
                                    outgoing.message_id, reply_callback, reply_context, send_at)
        return receipt

    def _enqueue_on_current(self, tx: StoreTransaction, ident: tuple[str, str, bool], payload: bytes,
                            action: str, soap_ns: str, message_id: str, reply_callback: str | None,
                            reply_context: bytes | None, send_at: float | None = None) -> SendReceipt | None:
        """Enqueue on the sequence this engine last used for ``ident`` without reading it first.

        The store refuses a sequence that takes no more messages (or is gone)
        without changing anything, and a SQL store locks the row and takes the
        number in one statement: one round trip less per message than reading
        the sequence to check it.  None when there is no such sequence or it
        refused: the caller finds or opens one as before.  Not with
        ``max_sequence_length``, whose last message must be known before it is
        enqueued.
        """
        if self.policy.max_sequence_length is not None:
            return None
        with self._lock:
            cached = self._current.get(ident)
        if cached is None:
            return None
        self._ambient.wake_sender = True  # inside a delivery: the invoker wakes the sender after its commit
        try:
            msg = tx.rms_messages.enqueue(cached, payload, action=action, soap_version=soap_ns,
                                          message_id=message_id, reply_callback=reply_callback,
                                          reply_context=reply_context, send_at=send_at,
                                          awaits_reply=ident[2] and self._replies_on_back_channel())
        except (SequenceNotOpenError, UnknownSequenceError):
            return None
        return SendReceipt(cached, msg.number, message_id)

    def _enqueue(self, tx: StoreTransaction, seq: RmsSequence, payload: bytes, action: str, soap_ns: str,
                 message_id: str, reply_callback: str | None = None,
                 reply_context: bytes | None = None, send_at: float | None = None) -> SendReceipt:
        self._ambient.wake_sender = True  # inside a delivery: the invoker wakes the sender after its commit
        limit = self.policy.max_sequence_length
        rm = rm_version_of(seq)
        rolls_over = limit is not None and seq.next_number >= limit
        msg = tx.rms_messages.enqueue(
            seq.key, payload, action=action, soap_version=soap_ns, message_id=message_id,
            last=rolls_over and rm is RM10, reply_callback=reply_callback, reply_context=reply_context,
            send_at=send_at, awaits_reply=seq.offered_id is not None and self._replies_on_back_channel())
        if rolls_over and rm is not RM10:
            tx.rms.mark_last(seq.key)
        if rolls_over:
            for_sequence(log, seq.sequence_id, msg.number, seq.key).info(
                "sequence reached max_sequence_length %d; the next message starts a new one", limit)
        return SendReceipt(seq.key, msg.number, message_id)

    def enqueue_reply(self, tx: StoreTransaction, rmd_sequence_id: str, envelope: bytes | etree._Element, *,
                      reply_to: str | None, relates_to: str | None, action: str | None,
                      answers: int | None = None, addressing: AddressingHeaders | None = None,
                      hand_out: HandOut | None = None) -> SendReceipt | None:
        """Enqueue a response on the sequence offered with destination sequence ``rmd_sequence_id``.

        Runs in the invoker's transaction.  A request sent without an Offer to
        an addressable ReplyTo is answered on a sequence of this engine's own
        to that endpoint (:meth:`_reply_on_own_sequence`); None when neither is
        possible (no offer and an anonymous ReplyTo, or the offered sequence
        takes no more messages): the caller treats the response as undeliverable.
        A ``reply_to`` that is anonymous (or absent: WS-A's default) asks for
        the reply on the HTTP back-channel: possible only when the offered
        sequence itself goes there.  Such a reply is never sent by the worker;
        it waits in the store until the request's HTTP thread (or a
        retransmission of the request, ``answers`` = its message number)
        takes it, and until the client acknowledges it.  ``addressing``: the WS-A headers the
        envelope's tree carries, known to the caller (:func:`prepare_outgoing`).  ``hand_out``:
        the receiving thread hands this back-channel reply out itself (the first one, on a
        started sequence): it is enqueued as sent once, and ``hand_out.taken`` set.
        """
        seq = tx.rms.get(reply_sequence_key(rmd_sequence_id))
        if seq is None or not rms_life(seq).accepts_messages:
            if seq is None and not is_back_channel(reply_to):
                assert reply_to is not None
                return self._reply_on_own_sequence(tx, reply_to, envelope, relates_to=relates_to, action=action,
                                                   addressing=addressing)
            return None
        back_channel = is_back_channel(reply_to)
        if back_channel and not is_back_channel(seq.target):
            for_sequence(log, seq.sequence_id, key=seq.key).warning(
                "a reply for the anonymous ReplyTo cannot go on the offered sequence, which goes to %s",
                seq.target)
            return None
        if not back_channel and seq.target != reply_to:  # 1.0 offers name no endpoint: replies go to ReplyTo
            seq = tx.rms.update(seq.key, target=reply_to)
        to = seq.target if back_channel or reply_to is None else reply_to  # None is the back-channel
        wsa = self.policy.addressing
        step = _reply_step(to, action)
        outgoing = prepare_outgoing(envelope, to=to, action=action, message_id=None, reply_to=None,
                                    relates_to=relates_to, wsa=_wsa_of(seq) or wsa,
                                    max_size=self.policy.max_message_size,
                                    extra=step.headers() if step is not None else (), addressing=addressing)
        if step is not None:
            step.note(message_id=outgoing.message_id, action=outgoing.action)
            step.end()  # it commits or rolls back with the delivery, whose step says which
        if not back_channel:
            return self._enqueue(tx, seq, outgoing.payload, outgoing.action, outgoing.soap.ns,
                                 outgoing.message_id)
        handed_out = hand_out is not None and hand_out.taken is None and seq.sequence_id is not None
        msg = tx.rms_messages.enqueue(
            seq.key, outgoing.payload, action=outgoing.action, soap_version=outgoing.soap.ns,
            message_id=outgoing.message_id, send_at=NEVER,
            reply_context=_ANSWERS + str(answers).encode() if answers is not None else None,
            handed_out=handed_out)
        if handed_out:
            assert hand_out is not None
            hand_out.taken = (seq, msg)
        return SendReceipt(seq.key, msg.number, outgoing.message_id)

    def _reply_on_own_sequence(self, tx: StoreTransaction, reply_to: str, envelope: bytes | etree._Element, *,
                               relates_to: str | None, action: str | None,
                               addressing: AddressingHeaders | None = None) -> SendReceipt:
        """A reply to a request whose sequence came without an Offer, for an addressable ReplyTo.

        As CXF does for a client that includes no Offer (its default): the
        reply goes reliably on a sequence this engine opens to the ReplyTo
        endpoint itself, one per endpoint, in the delivery's transaction.
        """
        step = _reply_step(reply_to, action)
        outgoing = prepare_outgoing(envelope, to=reply_to, action=action, message_id=None, reply_to=None,
                                    relates_to=relates_to, wsa=self.policy.addressing,
                                    max_size=self.policy.max_message_size,
                                    extra=step.headers() if step is not None else (), addressing=addressing)
        if step is not None:
            step.note(message_id=outgoing.message_id, action=outgoing.action)
            step.end()
        return self._enqueue_outgoing(tx, (reply_to, _REPLIES_KEY, False), outgoing)

    def _open_sequence(self, tx: StoreTransaction, target: str, key: str, offered: bool) -> RmsSequence:
        ident = (target, key, offered)
        with self._lock:
            cached = self._current.get(ident)
        if cached is not None:
            seq = tx.rms.get(cached)
            if seq is not None and rms_life(seq).accepts_messages:
                return seq
        best: RmsSequence | None = None
        generation = best_generation = 0
        for candidate in tx.rms.list_all():
            parsed = SequenceKey.decode(candidate.key)
            if parsed is None or (parsed.target, parsed.key, parsed.offered) != ident:
                continue
            generation = max(generation, parsed.generation)
            if rms_life(candidate).accepts_messages and parsed.generation > best_generation:
                best, best_generation = candidate, parsed.generation
        seq = tx.rms.get(best.key) if best is not None else None
        if seq is None or not rms_life(seq).accepts_messages:
            store_key = SequenceKey(target, key, generation + 1, offered).encode()
            seq = tx.rms.create(
                store_key, target=target, acks_to=self._acks_to(), rm_version=self.policy.rm_version.ns,
                wsa_version=self.policy.addressing.ns,
                offered_id=f"urn:uuid:{uuid.uuid4()}" if offered else None)
            for_sequence(log, key=store_key).debug("new source sequence for %s", target)
        with self._lock:
            self._current[ident] = seq.key
        return seq

    def close(self, target: str, key: str = "") -> int:
        """No more messages on the current sequences to ``target`` under ``key``.

        Each is closed (1.1: CloseSequence) and terminated once every message
        is acknowledged; returns how many sequences that concerned.
        """
        with self.transaction() as tx:
            count = 0
            for seq in tx.rms.list_all():
                parsed = SequenceKey.decode(seq.key)
                if parsed is None or (parsed.target, parsed.key) != (target, key):
                    continue
                if self._end(tx, seq.key):
                    count += 1
        self._wake_after_commit()
        return count

    #: WS-RM terminates a sequence after closing it; both verbs end the sequence gracefully.
    terminate = close

    def close_all(self) -> int:
        """Close every open source sequence (terminate on shutdown)."""
        with self.transaction() as tx:
            count = sum(1 for seq in tx.rms.list_all() if self._end(tx, seq.key))
        self._wake_after_commit()
        return count

    def end_reply_sequence(self, tx: StoreTransaction, rmd_sequence_id: str) -> None:
        """The request sequence ``rmd_sequence_id`` is gone: end the sequence offered with it.

        It is closed and terminated like any other once its replies are
        acknowledged; one that never carried a reply to an address is simply
        dropped (there is nobody to tell).
        """
        key = reply_sequence_key(rmd_sequence_id)
        seq = tx.rms.get(key)
        if seq is None:
            return
        if is_back_channel(seq.target):
            # Its replies only ever travel in responses to the requests, and the requests are over.
            left = tx.rms_messages.count_unacked(key)
            if left:
                for_sequence(log, seq.sequence_id, key=key).warning(
                    "request sequence ended with %d back-channel reply(ies) never acknowledged", left)
            tx.rms.delete(key)
            return
        self._end(tx, key)

    def _end(self, tx: StoreTransaction, store_key: str) -> bool:
        seq = tx.rms.get(store_key)
        if seq is None or not rms_life(seq).accepts_messages:
            return False
        if is_back_channel(seq.target):
            return False  # nowhere to send Close/Terminate: it ends with its request sequence
        rm = rm_version_of(seq)
        if rm is RM10:
            # 1.0 tells the destination the end with a message: an empty LastMessage.
            envelope = to_bytes(build_envelope(self.policy.soap_version))
            target_wsa = _wsa_of(seq) or self.policy.addressing
            outgoing = prepare_outgoing(envelope, to=seq.target, action=RM10.action("LastMessage"),
                                        message_id=None, reply_to=None, relates_to=None, wsa=target_wsa,
                                        max_size=self.policy.max_message_size)
            tx.rms_messages.enqueue(seq.key, outgoing.payload, action=outgoing.action,
                                    soap_version=outgoing.soap.ns, message_id=outgoing.message_id, last=True)
        else:
            seq = tx.rms.mark_last(seq.key)
            if _owes_control(rms_state(seq, int(tx.rms_messages.has_unacked(seq.key)))):
                tx.rms.update(seq.key, next_control_at=time.time())
        return True

    # -- what the peer says ------------------------------------------------------------------------

    def create_message_id(self, seq: RmsSequence) -> str:
        """One wsa:MessageID for every (re)transmission of a sequence's CreateSequence.

        A retransmitted request is the same message: the destination answers a
        repeated MessageID with the sequence it already created instead of an
        orphan one, and a CreateSequenceResponse sent to our endpoint later is
        matched back by its RelatesTo.  Derived from a per-process secret, so
        nobody else can predict it and fish for another client's sequence.
        """
        return f"urn:uuid:{uuid.uuid5(self._secret, f'{seq.key}|{seq.created_at!r}')}"

    def key_for_create_response(self, relates_to: str | None) -> str | None:
        """The sequence whose CreateSequence a (decoupled) response relates to, if any."""
        if not relates_to:
            return None
        with self.store.begin() as tx:
            for seq in tx.rms.list_all():
                if not seq.started and self.create_message_id(seq) == relates_to:
                    return seq.key
        return None

    def key_for_sequence(self, sequence_id: str) -> str | None:
        with self.store.begin() as tx:
            for seq in tx.rms.list_all():
                if seq.sequence_id == sequence_id:
                    return seq.key
        return None

    def _accepted_acks_to(self, address: str, seq: RmsSequence) -> str:
        """Where acknowledgements of the offered sequence go, from the Accept's AcksTo.

        An Accept naming the very address our requests go to (WCF's service always does:
        MS-WSRVCRR 4.1.1) asks for what the anonymous one does here: acknowledgements
        riding on those requests (WCF's R1601), in our HTTP responses to its messages, or
        posted there when no request goes soon.  Kept as anonymous, so that a peer
        naming itself costs no standalone acknowledgement per reply.
        """
        if address == seq.target:
            return (_wsa_of(seq) or self.policy.addressing).anonymous
        return address

    def acknowledged(self, sequence_id: str, number: int) -> bool:
        """Has the destination acknowledged message ``number`` of our sequence ``sequence_id``
        (or is the sequence gone)?  Asked by the WS-MakeConnection mailbox before it hands
        out a parked copy: one the client already acknowledged is not worth its poll."""
        with self.store.begin() as tx:
            seq = tx.rms.peek_by_sequence_id(sequence_id)
            if seq is None:
                return True
            msg = tx.rms_messages.get(seq.key, number)
            return msg is None or msg.acked

    def on_create_sequence_response(self, store_key: str, response: CreateSequenceResponse,
                                    version: RMVersion, *, create_offered: Callable[..., None]) -> None:
        """The peer opened the sequence: record its identifier; accept the offered sequence."""
        now = time.time()
        with self.store.begin() as tx:
            mine = tx.rms.peek(store_key)  # no lock: only to learn the offer before locking in order
            offered_id = mine.offered_id if mine is not None else None
            if response.accept is not None and offered_id is not None and mine is not None:
                create_offered(tx, offered_id, self._accepted_acks_to(response.accept.address, mine), version)
            seq = tx.rms.get(store_key)
            if seq is None:
                return
            slog = for_sequence(log, response.identifier, key=store_key)
            state = rms_state(seq, tx.rms_messages.has_unacked(store_key))
            transition = rms_transition(state, RMSEvent.CRR)
            if transition.noop:
                slog.debug("late CreateSequenceResponse ignored (%s)", state)
                return
            expires = response.expires_after
            seq = tx.rms.update(store_key, sequence_id=response.identifier, control_attempts=0,
                                next_control_at=now if seq.last_message else None,
                                expires=now + expires.total_seconds() if expires else None,
                                **rms_changes(transition))
            slog.info("sequence created by %s", seq.target)
            if offered_id is not None and response.accept is None:
                # the sequence was opened for calls that expect replies, and none could come back:
                # fail its calls now (kept for a resend) rather than send requests whose replies
                # the peer could only drop
                self.fault_in(tx, seq, f"the peer declined the offered sequence {offered_id}, so the "
                              "replies to this sequence's requests could not come back (does the service "
                              "take offers?); nothing was sent on it")

    @contextlib.contextmanager
    def coalesced_acks(self, into: "PendingAcks | None" = None) -> Iterator["PendingAcks"]:
        """In this block (this thread only), plain acknowledgements are merged and applied once, at its end.

        The sender gets an acknowledgement in nearly every HTTP response, and
        each one repeats what the previous said plus one number: applying each
        costs a store transaction (a commit, with a durable store) per message
        sent.  Their union is exactly what the destination acknowledged, so a
        batch of sends applies it once.  Nacks and final acknowledgements are
        applied at once (after what is pending for their sequence).  Errors of
        the merged acknowledgement are logged, as the sender does for acks in
        responses.

        ``into`` is the pending acknowledgements of a block in another thread
        (the sending lanes of one round, each in a thread of its own): they
        merge there, and that block applies them all at its end, in one store
        transaction for the round's sequences (:meth:`_flush_acks`).
        """
        outer = into is None
        pending = PendingAcks() if into is None else into
        self._coalescing.pending = pending
        try:
            yield pending
        finally:
            self._coalescing.pending = None
            if outer:
                self._flush_acks(pending)

    def _flush_acks(self, pending: "PendingAcks") -> None:
        """Apply every sequence's merged acknowledgement, in one store transaction where the
        store's transactions take turns on the whole store anyway (SQLite).

        A round of 16 sequences applied its acknowledgements in 16 transactions: on
        SQLite 16 turns on the file, each with its BEGIN, its look for in-doubt
        branches and its COMMIT.  Where rows are locked one by one (PostgreSQL, memory)
        each stays a transaction of its own: one holding 16 sequences' rows would wait
        for each caller's transaction that enqueues on one of them (under XA, until its
        commit) while holding the others' (measured: a caller's enqueue waited 1.4 ms
        instead of 0.24).  Should one acknowledgement be refused (a fault) or the
        transaction fail, nothing of it stays, and each is applied alone, as before:
        the others still apply, and the refused one is logged."""
        identifiers = sorted(pending.identifiers())
        if len(identifiers) <= 1 or self.store.concurrent_sequences:
            for identifier in identifiers:
                self._flush_ack(pending, identifier)
            return
        held = [h for h in (pending.pop(i) for i in identifiers) if h is not None]
        applied: list[tuple[SequenceAcknowledgement, list[int], bool]] = []
        try:
            now = time.time()
            # not durable, as one acknowledgement alone (see on_ack)
            with self.store.begin(durable=False) as tx:
                for ack, version in held:
                    seq = tx.rms.get_by_sequence_id(ack.identifier)
                    if seq is None:
                        raise UnknownSequence(ack.identifier, version=version)
                    if rms_life(seq).transmitting:
                        applied.append((ack, *self._apply_ack(tx, seq, ack, version, now)))
        except Exception as exc:  # noqa: BLE001 -- rolled back: each applied alone, as before
            log.debug("acknowledgements of %d sequences applied one by one (%s)", len(held), exc)
            for ack, version in held:
                try:
                    self.on_ack(ack, version)
                except WSRMFault as fault:
                    for_sequence(log, ack.identifier).warning("acknowledgement refused: %s", fault)
            return
        owes_control = False
        for ack, newly, owes in applied:
            if newly:
                for_sequence(log, ack.identifier).debug(
                    "acknowledged %s (%d new)", SequenceAcknowledgement.ranges_from_numbers(newly), len(newly))
            owes_control = owes_control or owes
        if owes_control:
            self._wake()

    def _flush_ack(self, pending: "PendingAcks", identifier: str) -> None:
        held = pending.pop(identifier)
        if held is None:
            return
        try:
            self.on_ack(*held)
        except WSRMFault as fault:
            for_sequence(log, identifier).warning("acknowledgement refused: %s", fault)

    def hears_at_listener(self, identifier: str, *, riding: str | None = None) -> bool:
        """May acknowledgements, faults and responses about source sequence ``identifier`` come to
        our listener (rather than only in the HTTP responses to what we send it)?

        A sequence this engine opened with an anonymous AcksTo hears only in those
        responses, or piggybacked on a message of the sequence it offered (``riding``
        names the sequence of the message carrying it): the peer's replies come to
        our listener and may carry acknowledgements of the requests (WCF's R1601;
        gSOAP does it).  One whose AcksTo names our endpoint hears at the listener,
        as does a sequence accepted from a peer's Offer (its acknowledgements come in
        that peer's requests).  An unknown identifier: yes (the acknowledgement is then
        refused as unknown anyway).  Cached: a sequence's AcksTo never changes.
        """
        with self._lock:
            found = self._heard_at_listener.get(identifier)
        if found is None:
            with self.store.begin() as tx:
                seq = tx.rms.get_by_sequence_id(identifier)
            if seq is None:
                return True
            found = (SequenceKey.decode(seq.key) is None or not is_back_channel(seq.acks_to), seq.offered_id)
            with self._lock:
                self._heard_at_listener[identifier] = found
                while len(self._heard_at_listener) > _REMEMBERED_SEQUENCES:
                    self._heard_at_listener.popitem(last=False)
        heard, offered = found
        return heard or (riding is not None and riding == offered)

    def on_ack(self, ack: SequenceAcknowledgement, version: RMVersion) -> None:
        """Apply an acknowledgement; raises the fault to answer when it is wrong."""
        pending = getattr(self._coalescing, "pending", None)
        if pending is not None:
            if not ack.nacks and not ack.final:
                pending.merge(ack, version)
                return
            self._flush_ack(pending, ack.identifier)
        now = time.time()
        if not ack.nacks and not ack.final:
            # not durable (below); callers' enqueues on the sequence neither wait for it nor hold
            # it up (beside_enqueues); on PostgreSQL the transaction is one round trip (alone)
            with self.store.begin(durable=False) as tx:
                owes_control = self._acknowledge_by_identifier(tx, ack, version, now,
                                                               beside_enqueues=True, alone=True)
            if owes_control:
                self._wake()
            return
        # not durable: an acknowledgement a crash forgot is learned again (the messages are sent
        # again and acknowledged again); meanwhile the sequence's row is free sooner for enqueues
        with self.store.begin(durable=False) as tx:
            seq = tx.rms.get_by_sequence_id(ack.identifier, beside_enqueues=not ack.final)
            if seq is None:
                raise UnknownSequence(ack.identifier, version=version)
            slog = for_sequence(log, ack.identifier)
            if not rms_life(seq).transmitting:
                return
            if ack.nacks:  # the destination says what it lacks: send it again at once
                again = tx.rms_messages.make_due(seq.key, ack.nacks, at=AT_ONCE)
                slog.debug("Nack for %s: %d message(s) due again", ack.nacks, again)
            else:
                newly, owes_control = self._apply_ack(tx, seq, ack, version, now)
        if ack.nacks:
            if again:
                self._wake()
            return
        if newly:
            slog.debug("acknowledged %s (%d new)", SequenceAcknowledgement.ranges_from_numbers(newly), len(newly))
        if owes_control:
            self._wake()

    def apply_riding_ack(self, tx: StoreTransaction, ack: SequenceAcknowledgement, version: RMVersion) -> bool:
        """:meth:`on_ack`'s work in ``tx``, the receipt of the message ``ack`` rode on (its
        sequence's row locked first, as everywhere; a plain acknowledgement, no Nack nor Final):
        no transaction of its own before the receipt's.  Raises the fault :meth:`on_ack` would,
        before anything is written; True when the sequence owes its Close or Terminate now (wake
        the sender after the commit)."""
        return self._acknowledge_by_identifier(tx, ack, version, time.time())

    def _acknowledge_by_identifier(self, tx: StoreTransaction, ack: SequenceAcknowledgement, version: RMVersion,
                                   now: float, *, beside_enqueues: bool = False, alone: bool = False) -> bool:
        """A plain ``ack`` applied in ``tx`` through ``acknowledge_sequence`` (the sequence looked
        up in the acknowledgement's statement: one round trip); True when the sequence owes its
        Close or Terminate now.  ``beside_enqueues`` and ``alone`` as the store's."""
        identifier, ranges, keep = self.riding_acknowledging(ack)
        try:
            found = tx.rms_messages.acknowledge_sequence(identifier, ranges, now, keep_offered_awaiting=keep,
                                                         beside_enqueues=beside_enqueues, alone=alone)
        except InvalidAcknowledgementError as exc:
            raise InvalidAcknowledgement(ack.identifier, str(exc), version=version) from None
        if found is None:
            raise UnknownSequence(ack.identifier, version=version)
        seq, done = found
        if done is None:  # not transmitting: nothing written
            return False
        newly, owes_control = self._acknowledged(tx, seq, ack, *done, now)
        if newly:
            for_sequence(log, ack.identifier).debug(
                "acknowledged %s (%d new)", SequenceAcknowledgement.ranges_from_numbers(newly), len(newly))
        return owes_control

    def riding_acknowledging(self, ack: SequenceAcknowledgement) -> tuple[str, Sequence[tuple[int, int]], bool]:
        """The arguments of the ``acknowledge_sequence`` that :meth:`apply_riding_ack` makes for
        ``ack`` (but ``now``): the receipt it rode on may run it in its own round trip
        (``StoreTransaction.receive_in_order``'s ``acknowledging``)."""
        return ack.identifier, ack.ranges, self._replies_on_back_channel()

    def _apply_ack(self, tx: StoreTransaction, seq: RmsSequence, ack: SequenceAcknowledgement,
                   version: RMVersion, now: float) -> tuple[list[int], bool]:
        """The newly acknowledged numbers, and whether the sequence now owes a control message
        (every message acknowledged after the application's last: Close or Terminate)."""
        # a request still waiting for its back-channel reply stays unacknowledged: it goes again
        # on its backoff, and its copy's HTTP response brings the reply the destination stored
        keep_awaiting = seq.offered_id is not None and self._replies_on_back_channel()
        try:  # acknowledged, and what it finished purged
            newly, pending = tx.rms_messages.acknowledge(seq.key, ack.ranges, now, keep_awaiting=keep_awaiting)
        except InvalidAcknowledgementError as exc:
            raise InvalidAcknowledgement(ack.identifier, str(exc), version=version) from None
        return self._acknowledged(tx, seq, ack, newly, pending, now)

    def _acknowledged(self, tx: StoreTransaction, seq: RmsSequence, ack: SequenceAcknowledgement,
                      newly: list[int], pending: bool, now: float) -> tuple[list[int], bool]:
        """:meth:`_apply_ack` once the store applied ``ack`` to ``seq`` (as it was before)."""
        before = rms_state(seq, int(pending) + len(newly))
        event = RMSEvent.ACK if pending else RMSEvent.ACKALL
        after = rms_transition(before, event).state
        missing = pending and ack.final and self._not_in(tx, seq, ack)
        if missing:
            self.fault_in(tx, seq, f"the destination closed the sequence with {missing} message(s) "
                        "unacknowledged")
            return newly, False
        owes_control = _owes_control(after)
        if owes_control:
            tx.rms.update(seq.key, next_control_at=now)
        return newly, owes_control

    @staticmethod
    def _not_in(tx: StoreTransaction, seq: RmsSequence, ack: SequenceAcknowledgement) -> int:
        """How many unacknowledged messages of ``seq`` a Final ``ack`` leaves out (a request
        it names that waits for its reply here is not one of them)."""
        named = AckRanges.from_ranges(ack.ranges)
        return sum(1 for m in tx.rms_messages.list_for(seq.key) if not m.acked and m.number not in named)

    def reply_arrived(self, tx: StoreTransaction, request: RmsMessage) -> None:
        """The reply to ``request`` was delivered (in ``tx``, the delivery's): it may be purged,
        and a request that waited for it on the back-channel is acknowledged -- the
        destination ran it, so it had it."""
        if not request.reply_pending:
            return
        tx.rms_messages.reply_received(request.sequence_key, request.number)
        if not request.acked and self._replies_on_back_channel():
            if self._acknowledge_awaited(tx, request.sequence_key, request.number):
                self._ambient.wake_sender = True

    def reply_consumed(self, tx: StoreTransaction, relates_to: str,
                       riding: Sequence[tuple[SequenceAcknowledgement, RMVersion]] = ()) -> tuple[bool, int]:
        """The reply to request ``relates_to`` was recorded and consumed in ``tx`` (no delivery
        will follow: ``Destination.reply_consumers``): what its delivery would have done here
        (:meth:`reply_arrived`).  Whether that made the sender's work due (its Close or
        Terminate: wake it after the commit), and which of the acknowledgements ``riding`` on
        the reply it applied (-1: none).

        The request, which waited for its reply unacknowledged, is acknowledged now: by the
        acknowledgement riding on the reply when one names it (applied here, once the request
        no longer waits, rather than after a statement of its own), else on its own."""
        first = self._answering_ack(riding)
        if first is not None:
            # the acknowledgement that most likely names the request, applied with the mark (one
            # round trip on PostgreSQL); when it does not apply, on as after the mark alone
            index, ack = first
            now = time.time()
            answered, applied = tx.rms_messages.mark_answered_acknowledging(
                relates_to, ack.identifier, ack.ranges, now, keep_offered_awaiting=True)
            if applied is not None:
                before, newly, pending = applied
                newly, owes_control = self._acknowledged(tx, before, ack, newly, pending, now)
                if newly:
                    for_sequence(log, ack.identifier).debug(
                        "acknowledged %s (%d new)", SequenceAcknowledgement.ranges_from_numbers(newly), len(newly))
                return owes_control, index
        else:
            answered = tx.rms_messages.mark_answered(relates_to)
        if answered is None:
            return False, -1
        key, number, acked = answered
        if acked or not self._replies_on_back_channel():
            return False, -1
        seq = tx.rms.get(key)  # held by mark_answered: no statement
        for index, (ack, version) in enumerate(riding):
            if seq is None or ack.identifier != seq.sequence_id or ack.nacks or ack.final \
                    or not any(lo <= number <= hi for lo, hi in ack.ranges):
                continue
            try:
                return self.apply_riding_ack(tx, ack, version), index
            except WSRMFault:  # refused before it wrote: the receipt says why when it tries it again
                break
        return self._acknowledge_awaited(tx, key, number), -1

    def _answering_ack(self, riding: Sequence[tuple[SequenceAcknowledgement, RMVersion]]
                       ) -> tuple[int, SequenceAcknowledgement] | None:
        """The acknowledgement riding on a reply that :meth:`reply_consumed` applies with the
        request's mark (its index), or None: it then marks the request alone."""
        if not self._replies_on_back_channel():
            return None
        return next(((i, ack) for i, (ack, _) in enumerate(riding) if not ack.nacks and not ack.final), None)

    def reply_answering(self, relates_to: str, riding: Sequence[tuple[SequenceAcknowledgement, RMVersion]]
                        ) -> tuple[str, str, Sequence[tuple[int, int]], bool] | None:
        """The arguments of the ``mark_answered_acknowledging`` that :meth:`reply_consumed` makes
        for this reply, or None when it makes none: the reply's receipt may run it in its own
        round trip (``StoreTransaction.receive_in_order``'s ``answering``)."""
        first = self._answering_ack(riding)
        return None if first is None else (relates_to, first[1].identifier, first[1].ranges, True)

    def exchange_acknowledged(self, store_key: str, number: int) -> None:
        """The HTTP response to a copy of request ``number`` acknowledged it and carried no reply.

        The destination delivered it and owes no reply on this exchange (its
        operation has none, or the reply was taken already): the request is done,
        as WCF's initiator stops retrying a request whose exchange carried an
        acknowledgement.  (A destination whose reply is not ready answers such an
        exchange without an acknowledgement: this engine does, and so does WCF's.)
        """
        if not self._replies_on_back_channel():
            return
        with self.store.begin(durable=False) as tx:
            msg = tx.rms_messages.get(store_key, number)
            if msg is None or msg.acked or not msg.reply_pending:
                return
            if msg.reply_callback is None:
                tx.rms_messages.reply_received(store_key, number)
            woken = self._acknowledge_awaited(tx, store_key, number)
        if woken:
            self._wake()

    @staticmethod
    def _acknowledge_awaited(tx: StoreTransaction, store_key: str, number: int) -> bool:
        """Mark request ``number``, which waited for its reply, acknowledged; True when that ended
        the sequence's last work (its Close/Terminate is due now)."""
        seq = tx.rms.get(store_key)
        if seq is None or seq.offered_id is None or not seq.started or seq.faulted or seq.terminate_sent:
            return False
        try:
            newly, pending = tx.rms_messages.acknowledge(seq.key, [(number, number)])
        except InvalidAcknowledgementError:
            return False
        if not newly:
            return False
        after = rms_transition(rms_state(seq, int(pending) + 1), RMSEvent.ACK if pending else RMSEvent.ACKALL).state
        if _owes_control(after):
            tx.rms.update(seq.key, next_control_at=time.time())
            return True
        return False

    def on_closed(self, store_key: str) -> None:
        """CloseSequenceResponse: the destination's set of messages is final."""
        self._control_event(store_key, RMSEvent.CLOSE_RESPONSE)

    def on_terminated(self, store_key: str) -> None:
        """TerminateSequence went out (and, in 1.1, was answered): the sequence can go."""
        with self.store.begin() as tx:
            seq = tx.rms.get(store_key)
            if seq is None:
                return
            try:
                transition = rms_transition(rms_state(seq, tx.rms_messages.has_unacked(store_key)),
                                            RMSEvent.TERMINATE_SENT)
            except InvalidTransition as exc:
                for_sequence(log, seq.sequence_id, key=store_key).warning("terminate not recorded: %s", exc)
                return
            tx.rms.update(store_key, **rms_changes(transition))
            tx.rms.delete(store_key)
        for_sequence(log, seq.sequence_id, key=store_key).info("sequence terminated and purged")
        if seq.offered_id and self._endpoint() is None and self._end_offered is not None:
            # Replies came in our HTTP responses: the peer has no address to terminate the offered
            # sequence at, and with the requests acknowledged every reply is in (a request stays
            # unacknowledged here until its reply arrived: see _replies_on_back_channel).
            self._end_offered(seq.offered_id)
        with self._lock:
            for ident, cached in list(self._current.items()):
                if cached == store_key:
                    del self._current[ident]

    def _control_event(self, store_key: str, event: RMSEvent) -> None:
        with self.store.begin() as tx:
            seq = tx.rms.get(store_key)
            if seq is None:
                return
            try:
                transition = rms_transition(rms_state(seq, tx.rms_messages.has_unacked(store_key)), event)
            except InvalidTransition as exc:
                for_sequence(log, seq.sequence_id, key=store_key).warning("%s ignored: %s", event.name, exc)
                return
            if not transition.noop:
                tx.rms.update(store_key, control_attempts=0, next_control_at=time.time(),
                              **rms_changes(transition))
        self._wake()

    def on_fault(self, fault: WSRMFault, store_key: str | None = None) -> None:
        """A WS-RM fault about one of our sequences; the fatal ones fault the sequence."""
        with self.store.begin() as tx:
            seq = tx.rms.get_by_sequence_id(fault.identifier) if fault.identifier else None
            if seq is None and store_key is not None:
                seq = tx.rms.get(store_key)
            if seq is None:
                log.info("WS-RM fault %s about no sequence of ours: %s", fault.fault_code, fault.reason)
                return
            if fault.fault_code not in _FATAL_FAULTS:
                for_sequence(log, seq.sequence_id, key=seq.key).warning(
                    "peer answered with %s: %s", fault.fault_code, fault.reason)
                return
            self.fault_in(tx, seq, f"{fault.fault_code}: {fault.reason}")
        self._wake()

    def fault_sequence(self, store_key: str, reason: str) -> None:
        """Give up on a sequence (retries exhausted): the worker then reports and releases it."""
        with self.store.begin() as tx:
            seq = tx.rms.get(store_key)
            if seq is not None:
                self.fault_in(tx, seq, reason)
        self._wake()

    def fault_in(self, tx: StoreTransaction, seq: RmsSequence, reason: str) -> None:
        """Fault ``seq`` inside ``tx`` (the worker then reports and releases it)."""
        transition = rms_transition(rms_state(seq, tx.rms_messages.has_unacked(seq.key)), RMSEvent.FAULT)
        if transition.noop:
            return
        tx.make_durable()  # the fault hook will tell the application: a crash must not forget it
        tx.rms.update(seq.key, fault_reason=reason, next_control_at=time.time(), **rms_changes(transition))
        self.faulted_sequences += 1
        for_sequence(log, seq.sequence_id, key=seq.key).error("sequence faulted: %s", reason)

    def report_and_release(self, store_key: str) -> bool:
        """Tell the application about a faulted sequence's messages, then delete it.

        The hook runs before the delete, so a crash in between reports again
        after the restart rather than losing the report (at least once).
        Returns False when the hook failed (the worker tries again later).
        Without an ``on_sequence_fault`` hook, a sequence that still holds
        unacknowledged messages is never deleted: it is logged at ERROR and
        kept, faulted, with its messages (its ``fault_reason`` says so), so no
        message is ever dropped silently.
        """
        with self.store.begin() as tx:
            seq = tx.rms.get(store_key)
            if seq is None or not seq.faulted:
                return True
            failed = tuple(FailedMessage(m.number, m.message_id, m.action, m.payload, m.reply_callback,
                                         m.reply_context)
                           for m in tx.rms_messages.list_for(store_key) if not m.acked)
        report = SequenceFault(store_key, seq.target, seq.sequence_id, seq.fault_reason or "faulted", failed)
        if KEPT_MARK not in (seq.fault_reason or ""):  # not told again about a sequence already kept
            for listener in list(self.fault_listeners):
                try:
                    listener(report)
                except Exception:  # noqa: BLE001 -- an observer must not stop the report
                    for_sequence(log, seq.sequence_id, key=store_key).exception("a sequence fault listener failed")
        if self._on_fault is not None:
            try:
                self._on_fault(report)
            except Exception:  # noqa: BLE001 -- the application's hook must not kill the worker
                for_sequence(log, seq.sequence_id, key=store_key).exception(
                    "the sequence fault hook failed; it will be called again")
                return False
        elif failed:
            # Nobody to hand them to: keep them rather than lose them silently.  The sequence
            # stays in the store, faulted, its messages unacknowledged (``wsrm status`` shows
            # it as faulted with its unacked count) until an operator deals with it.
            for_sequence(log, seq.sequence_id, key=store_key).error(
                "sequence faulted (%s) with %d unacknowledged message(s) and no on_sequence_fault hook: "
                "the messages are kept in the store as failed (see `wsrm status`), not delivered",
                seq.fault_reason or "faulted", len(failed))
            with self.store.begin() as tx:
                if tx.rms.get(store_key) is not None:
                    tx.rms.update(store_key, next_control_at=None, expires=None,
                                  fault_reason=_kept_reason(seq.fault_reason, len(failed)))
            self._forget_current(store_key)
            return True
        with self.store.begin() as tx:
            if tx.rms.get(store_key) is not None:
                tx.rms.delete(store_key)
        self._forget_current(store_key)
        return True

    def _forget_current(self, store_key: str) -> None:
        with self._lock:
            for ident, cached in list(self._current.items()):
                if cached == store_key:
                    del self._current[ident]


#: How :meth:`Source.report_and_release` marks a faulted sequence whose messages it kept.
KEPT_MARK = "messages kept: no on_sequence_fault hook"


def _kept_reason(reason: str | None, count: int) -> str:
    reason = reason or "faulted"
    return reason if KEPT_MARK in reason else f"{reason} [{count} {KEPT_MARK}]"


def _wsa_of(seq: RmsSequence) -> AddressingVersion | None:
    return AddressingVersion.for_namespace(seq.wsa_version)


#: Callers' enqueues done in one transaction at most, where the store's transactions take the whole
#: file (``RMPolicy.enqueue_together``'s automatic value).
ENQUEUE_TOGETHER = 16

#: One caller's enqueue for :meth:`Source._enqueue_together`: (target, key, offered), the message,
#: its reply callback and context.
_Enqueue = tuple[tuple[str, str, bool], OutgoingMessage, "str | None", "bytes | None"]


class _SourceTransaction:
    """What :meth:`Source.transaction` returns: the caller's store transaction (an invoker's
    delivery, whose transaction it joins and leaves alone), else ``store.begin(xa=tm)``.

    A plain class rather than a ``@contextmanager`` generator: every send runs one, and the
    generator machinery cost more Python calls than the ``with`` it wraps.
    """

    __slots__ = ("_source", "_tx")

    def __init__(self, source: Source) -> None:
        self._source = source
        self._tx: StoreTransaction | None = None

    def __enter__(self) -> StoreTransaction:
        source = self._source
        ambient = getattr(source._ambient, "tx", None)
        if ambient is not None and not ambient.closed:
            return ambient
        tx = self._tx = source.store.begin(xa=source.tm)
        return tx.__enter__()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: Any) -> None:
        tx, self._tx = self._tx, None
        if tx is not None:
            tx.__exit__(exc_type, exc, tb)


def _reply_step(target: str | None, action: str | None) -> observe.Step | None:
    """The observer's step for a reply enqueued in a delivery (which is the current context)."""
    observer = observe.active
    if observer is None:
        return None
    return observer.sending(target=target, action=action, reply=True, transaction=None)


class _EndWithTransaction:
    """Ends an observer's step once the caller's transaction ends, saying how (a synchronization)."""

    __slots__ = ("_step",)

    def __init__(self, step: observe.Step) -> None:
        self._step = step

    def before_completion(self) -> None:
        pass

    def after_completion(self, status: Any) -> None:
        committed = getattr(status, "name", str(status)) == "COMMITTED"
        self._step.note(transaction_outcome="committed" if committed else "rolled back")
        self._step.end(None if committed else _RolledBack(
            "the transaction that enqueued the message rolled back: it was never sent"))


class _RolledBack(Exception):
    """What ends the step of a message whose transaction rolled back."""


class _WakeAfter:
    """Wakes the sender once the transaction that enqueued commits (a synchronization).

    A class of the module rather than one defined inside the method that registers it:
    making a class is several times the cost of making an instance, on every send."""

    __slots__ = ("_wake",)

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def before_completion(self) -> None:
        pass

    def after_completion(self, status: Any) -> None:
        self._wake()
