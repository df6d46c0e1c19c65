"""The invoker worker: hands received messages to the application, in order, exactly once.

Delivery is one transaction: take the next deliverable message from the
invoker buffer, run the application's handler, remove the message from the
buffer, commit.  With a transaction manager that transaction is an XA
transaction, so the application's own database work (enlisted by the
handler in the same current transaction) commits or rolls back with the
removal: the message is processed exactly once across crashes.  Anything
the handler sends (``context.reply``, or the engine's ``send``) joins that
transaction too.

When the handler raises, the transaction rolls back and the message stays
in the store; :mod:`.settlement` judges what follows (a retry, a retry cycle,
the service's fault sent back, the poison store, or nothing counted when the
service cannot work: :mod:`.outage`).  What may happen to a message next is
the delivery machine's answer (:mod:`wsrm_plugin.statemachine.delivery`),
asked through the :class:`~.ledger.MessageLedger`.

With ``delivery_batch`` > 1 one transaction delivers several consecutive
messages of a sequence (see :meth:`InvokerWorker._batches`): the same
outcome per message, fewer commits.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lxml import etree

from ..statemachine import (
    InvalidTransition, MessageAction, MessageEvent, MessageState, ServiceMode, Stage,
)
from ..store import (
    BufferedMessage, StorageManager, StoreTransaction,
)
from ..store.api import RANK_INVOKER, RANK_RMD
from ..wire import RM10, AddressingHeaders
from . import observe
from .at_decision import AtDecision
from .envelopes import read_trusted
from .ledger import MessageLedger
from .logs import for_sequence
from .outage import DeliveryPause, PauseReport
from .settlement import ApplicationFault, FailedDelivery, RecordedFailure, Settlement
from .policy import RMPolicy
from .source import HandOut, SendReceipt, Source

__all__ = ["ApplicationFault", "DeliveryContext", "FailedDelivery", "InvokerWorker", "Application"]

log = logging.getLogger(__name__)

_LAST_MESSAGE_ACTION = RM10.action("LastMessage")
#: Deliveries a receive makes at most from the buffer after it had to buffer its own message
#: (see :meth:`InvokerWorker.deliver_through`).
CATCH_UP_STEPS = 16
#: Seconds per message (a moving average) beyond which an application is not run by receiving
#: threads (see :attr:`InvokerWorker.quick`).
QUICK_APPLICATION = 0.05


@dataclass
class DeliveryContext:
    """What the application's handler learns about the message it is given, and how to answer.

    ``transaction`` is the store transaction the delivery runs in (a branch
    of the XA transaction when the engine has a transaction manager).
    """

    sequence_id: str
    message_number: int
    message_id: str | None
    action: str
    reply_to: str | None
    relates_to: str | None
    soap_version: str
    transaction: StoreTransaction
    _source: Source = field(repr=False)
    replies: list[SendReceipt] = field(default_factory=list)
    #: the receiving thread hands the back-channel reply out itself (delivery on receipt)
    _hand_out: HandOut | None = field(default=None, repr=False)

    def reply(self, envelope: bytes | etree._Element, *, action: str | None = None,
              addressing: AddressingHeaders | None = None) -> SendReceipt:
        """Send ``envelope`` as the response to this message, reliably, on the offered sequence.

        ``envelope`` may be the response's lxml tree (a front end's own, not parsed again; it
        becomes the stored message, changed in place: the caller lets go of it).

        It is enqueued in the delivery's transaction: it goes out only if the
        delivery commits.  With an anonymous ReplyTo (a client without a
        listener) it goes back in the HTTP response to the request.  A request
        sent without an Offer to an addressable ReplyTo is answered on a
        sequence this engine opens to that endpoint (CXF's way).  ``addressing``: the WS-A
        headers the tree carries, when the caller wrote or read them (a front end's addressing
        interceptor): not read from it again.
        """
        receipt = self._source.enqueue_reply(self.transaction, self.sequence_id, envelope, reply_to=self.reply_to,
                                             relates_to=self.message_id, action=action,
                                             answers=self.message_number, addressing=addressing,
                                             hand_out=self._hand_out)
        if receipt is None:
            raise ValueError(f"sequence {self.sequence_id} has no accepted offered sequence for replies "
                             f"to {self.reply_to or 'the anonymous ReplyTo'}; the client must offer one "
                             "(send with expect_reply) whose endpoint is its ReplyTo, or name an "
                             "addressable ReplyTo (the reply then goes on a sequence to it)")
        self.replies.append(receipt)
        return receipt


Application = Callable[[bytes, DeliveryContext], Any]


def _import_callback(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"reply callback {path!r} must look like 'package.module:function'")
    target: Any = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def _may_have_relates_to(payload: bytes) -> bool:
    """False only when ``payload`` surely has no wsa:RelatesTo, without parsing it.

    An element name is never escaped, so an ASCII-compatible envelope without
    the bytes ``RelatesTo`` has none; anything else (UTF-16...) is parsed.
    """
    start = payload[3:] if payload.startswith(b"\xef\xbb\xbf") else payload
    return not start.lstrip().startswith(b"<") or b"RelatesTo" in payload


class _BatchBroken(Exception):
    """A message of a batch doomed the whole transaction (a failed statement, not the application)."""

    def __init__(self, message: BufferedMessage, error: BaseException, state: MessageState) -> None:
        super().__init__(str(error))
        self.message = message
        self.error = error
        self.state = state


@dataclass
class _Step:
    """What one step of an invoker thread took and did, from its claim to after its commit."""

    claimed: BufferedMessage | None = None
    #: The claimed message's state while its delivery may still fail (None once it did).
    delivering: MessageState | None = None
    #: (message, handed over) of each delivered in the transaction, the claimed one first.
    done: list[tuple[BufferedMessage, bool]] = field(default_factory=list)
    #: A message of the batch that failed in its savepoint, judged after the commit.
    later: tuple[BufferedMessage, BaseException] | None = None
    #: What to do once a given-up message's settling committed.
    settled: Callable[[], None] | None = None
    wake: bool = False


#: A message taken on receipt: the receiving transaction delivers it, it was never buffered.
_TAKEN_ON_RECEIPT = MessageState.initial(taken_on_receipt=True)
#: A message handed to the application before its receipt (``deliver_first``): not in the buffer.
_RUNNING_FIRST = MessageState.initial(run_first=True)
_E = MessageEvent


class InvokerWorker:
    """One delivery per ``step()`` (run by :class:`~.workers.Worker` threads).

    What may happen to a message next is the delivery machine's answer
    (:mod:`wsrm_plugin.statemachine.delivery`), asked through the
    :class:`~.ledger.MessageLedger`; whether the service can work at all is
    the outage machine's (:class:`~.outage.DeliveryPause`).  This class does
    what they answer: run the application, count a failure, give a message up.
    """

    def __init__(self, store: StorageManager, policy: RMPolicy, *, source: Source, ambient: threading.local,
                 application: Application | None, tm: Any = None,
                 on_failure: Callable[[FailedDelivery], None] | None = None,
                 after_commit: Callable[[], None] = lambda: None,
                 on_delivered: Callable[[], None] = lambda: None,
                 wake_invoker: Callable[[], None] = lambda: None, service: str = "wsrm",
                 reporter: str | None = None) -> None:
        self.store = store
        self.policy = policy
        self.source = source
        self.tm = tm
        #: deliveries answered at their commit decision (``RMPolicy.answer_at_decision``), under a
        #: transaction manager: the phase-2 workers, and each sequence's guard
        self.at_decision = AtDecision(tm, service) if tm is not None and policy.answer_at_decision else None
        self._ambient = ambient
        self.application = application
        self._on_failure = on_failure
        self._after_commit = after_commit
        #: told after every commit that handed something over (the back-channel's HTTP threads
        #: wait for it), whether or not the sender has work
        self._on_delivered = on_delivered
        #: Each message's state in the delivery machine, where its row does not say it.
        self._ledger = MessageLedger(policy.max_retry_cycles)
        #: Whether the service can work at all (the outage pause).
        #: The pause as the store shows it to ``wsrm status`` (reporter: this process's name and host).
        self._wake_invoker = wake_invoker
        #: An invoker thread found the oldest deliverable message held by a receive that delivers
        #: it apart (:meth:`deliver_received`) and went idle: woken when that delivery ends.
        self._passed_held = False
        self.report = PauseReport(store, reporter or service)
        self.pause = DeliveryPause(policy, service, record=self.report, wake=wake_invoker, logger=log)
        #: What follows a failed delivery.
        self.settlement = Settlement(store, policy, source, transaction=self._transaction, ledger=self._ledger,
                                     pause=self.pause, after_commit=after_commit, on_delivered=on_delivered,
                                     on_failure=on_failure)
        #: The engine's workers run: delivery happens (also on receipt) only between start and stop.
        self.running = False
        #: How long the application took per message lately (a moving average, seconds).
        self.application_seconds = 0.0
        self.delivered = 0
        #: Steps under way at once, at most ``invoker_threads``: a receiving thread that steps
        #: after its response (:meth:`steps_after_response`) takes an invoker thread's place.
        #: Invoker threads, ``invoker_threads`` resolved for this store and manager (the engine
        #: starts as many).
        self.thread_count = policy.invoker_thread_count(
            store.concurrent_sequences, policy.buffers_one_way(tm is not None, store.commits_are_costly))
        #: Its places: a token each (a ``SimpleQueue``, whose ``get`` and ``put`` are C; a
        #: ``BoundedSemaphore`` took 14 Python calls a step to take and give back a place).
        self._step_slots: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(self.thread_count):
            self._step_slots.put(None)
        #: A receiving thread found every place taken (:meth:`steps_after_response`): the next
        #: thread to take a place, or to leave one, steps for it (see there).
        self._step_wanted = False

    def _transaction(self) -> "_DeliveryTransaction":
        return _DeliveryTransaction(self.store, self.tm)

    @property
    def failed(self) -> int:
        """Messages given up: answered with a fault, or moved to the poison store."""
        return self.settlement.failed

    @property
    def poisoned(self) -> int:
        """Of those, moved to the poison store."""
        return self.settlement.poisoned

    @property
    def retries(self) -> int:
        """Failed attempts counted (each rolled back and scheduled again)."""
        return self.settlement.retries

    def withdraw_pause(self) -> None:
        """At start and stop: a pause this service's process reported (this one, or one that died
        paused) is nobody's now; ``wsrm status`` must not go on showing it."""
        if self.application is not None:
            self.report.withdraw()

    @property
    def paused(self) -> bool:
        """Delivery is paused: the service's dependencies are down (see :mod:`wsrm_plugin.engine.outage`)."""
        return self.pause.paused

    def message_state(self, msg: BufferedMessage) -> MessageState:
        """Where ``msg`` is in its life, as this process knows it (for tests and operators)."""
        return self._ledger.state(msg)

    # -- delivery on receipt (RMPolicy.deliver_on_receive) ---------------------------------------

    @property
    def quick(self) -> bool:
        """Does the application answer quickly enough to be run by a receiving thread?

        A receive that delivers holds its HTTP thread, and the receives of
        its sequence behind it, while the application runs: with a slow
        application (more than :data:`QUICK_APPLICATION` seconds a message,
        lately) they would hold every HTTP thread, and other peers' messages
        would wait for threads.  Its messages then go through the buffer (a
        receive answers at once) until it is quick again."""
        return self.application_seconds <= QUICK_APPLICATION

    def transaction(self) -> contextlib.AbstractContextManager[StoreTransaction]:
        """The transaction a delivery runs in (an XA transaction under a transaction manager):
        a receive that delivers on receipt runs in one of these."""
        return self._transaction()

    def in_two_phases(self) -> bool:
        """Inside a delivery's transaction under the transaction manager: will it commit in two
        phases (more than one branch: the application's database is not the store's)?"""
        gtx = self.tm.get_transaction() if self.tm is not None else None
        return gtx is not None and gtx.branch_count > 1  # (not gtx.branches: see branch_count)

    def deliver_taken(self, tx: StoreTransaction, msg: BufferedMessage,
                      replies: list[SendReceipt] | None = None, hand_out: HandOut | None = None) -> bool:
        """Hand over ``msg``, which ``tx`` just received and took (``take_next``): never buffered.

        ``replies`` gets the receipts of the replies the application enqueued
        (the receive hands a back-channel one out in ``tx`` too).  An exception
        propagates: ``tx`` must roll back, receipt and all, and the message is
        then received again without delivering it, for the invoker threads (see
        ``Destination._record_alone``).  ``hand_out``: the receive hands the back-channel reply
        out itself (:class:`HandOut`)."""
        self._ambient.wake_sender = False  # set again by whatever the delivery enqueues
        return self._deliver(tx, msg, buffered=False, replies=replies, hand_out=hand_out)

    @property
    def delivers_apart(self) -> bool:
        """Does a receive that delivers record the message first and run the application
        outside the store's transactions (:meth:`deliver_received`)?  ``RMPolicy.deliver_apart``,
        on a store whose transactions take turns on the whole file (SQLite), without a
        transaction manager: a receive that runs the application in its transaction holds
        every other sequence's receives and deliveries for as long, and their commits cannot
        share an fsync."""
        return bool(self.policy.deliver_apart) and self.tm is None and self.store.defers_transactions

    def delivers_apart_now(self, answered_in_response: bool = False, others_receiving: bool = False) -> bool:
        """Does the receive that begins now deliver apart (:meth:`deliver_received`)?  Always
        with ``RMPolicy.deliver_apart``; with its automatic value (None), when a receive of
        another sequence is under way in this process (``others_receiving``, counted by the
        destination): it would wait for the file while this one's application runs, and
        their commits could not share an fsync.  One caller's messages in turn, large ones
        too, keep the single commit, whatever background transaction holds the file.
        ``answered_in_response``: the reply goes back in the HTTP response, which the
        receipt that delivers answers with (never apart unless asked for)."""
        apart = self.policy.deliver_apart
        if apart is False or self.tm is not None or not self.store.defers_transactions:
            return False
        return apart is True or (not answered_in_response and others_receiving)

    def deliver_received(self, msg: BufferedMessage,
                         mark: Callable[[BufferedMessage, bool], StoreTransaction | None] | None = None
                         ) -> bool | None:
        """Deliver ``msg``, which the calling receive just buffered and :meth:`hold`-s, in a
        transaction that takes the store only when the application touches it, or at the end
        to mark it delivered: True if it was (the commit durable).

        ``mark(msg, next_in_order)``: when the application left that transaction untouched,
        the removal from the buffer goes there instead: in a transaction the caller shares
        with others that want the file at the same time (the receipts and deliveries of other
        sequences: one turn on the file and one commit for all), committed when it returns
        (durable once its ``wait_for_disk`` returns; an exception: not removed, judged as a
        failed delivery), or None when that batch could not (then it is done here, as without).

        The receive's own transaction committed the message into the buffer (so a crash from
        here on leaves it there, delivered again by whoever takes the buffer next, as any
        buffered message), and held it in this process, so no invoker thread takes it
        meanwhile.  Everything the delivery does in the store commits or rolls back at once
        with its removal from the buffer, which fails if someone else (another process on the
        same file) delivered it in the meantime.  A failure is judged like a failed delivery
        on receipt (:meth:`failed_on_receipt`): the message stays buffered.

        None if it was not delivered, else whether it was handed to the application (False
        for a protocol marker it never sees), counted as :meth:`delivered_on_receive` counts."""
        marked: StoreTransaction | None = None
        in_order = self.policy.in_order
        try:
            with _DeliveryTransaction(self.store, None, deferred=True) as tx:
                self._ambient.wake_sender = False  # set again by whatever the delivery enqueues
                # the buffer row is marked delivered after the application ran, which may have
                # enqueued its reply: order it first, as the invoker's claim takes it first
                tx.order_as_first(RANK_INVOKER, msg.sequence_id)
                handed_over = self._deliver(tx, msg, buffered=mark is None, next_in_order=in_order)
                if mark is not None:
                    marked = mark(msg, in_order) if tx.untouched else None
                    if marked is None:
                        self.mark_delivered_in(tx, msg, in_order)
            if marked is not None:
                marked.wait_for_disk()  # its commit returned before the disk; nothing is answered before
        except Exception as exc:  # noqa: BLE001 -- the application's errors are data here
            self._ledger.apply(msg, _E.FAILED)  # APART -> SETTLING: judged now
            self.failed_on_receipt(msg, exc)
            return None
        self._ledger.apply(msg, _E.COMMITTED)  # APART -> DELIVERED: forgotten
        self.delivered_on_receive(handed_over)
        if self._passed_held:  # an invoker thread went idle on it: others may be waiting behind it
            self._passed_held = False
            self._wake_invoker()
        return handed_over

    def deliver_first(self, msg: BufferedMessage, record: Callable[[StoreTransaction], None],
                      record_with_others: Callable[[], StoreTransaction | None]) -> bool:
        """Hand ``msg``, received but not yet recorded, to the application before its receipt, in a
        transaction that takes the store only when the application touches it; the receipt
        (``record``, which takes the message on receipt or raises) then goes in that
        transaction: whether it was handed over (False for a protocol marker), its commit durable.

        ``record_with_others()``: when the application left that transaction untouched, the
        receipt goes there instead, in a transaction the caller shares with others that want
        the file at the same time (one turn on the file and one commit for all): that
        transaction, committed (durable once its ``wait_for_disk`` returns), or None when it
        could not (then ``record`` runs here).

        The caller made sure the message will be taken (``Destination._run_first``): in order,
        nothing of its sequence in the way.  An exception (the application's, or the receipt's
        refusal) leaves nothing of the delivery in the store, and the caller receives the message
        as after a failed delivery on receipt: the application's work outside the store is then
        done again, as after a crash between its own commit and the receipt's.  Counted as
        :meth:`deliver_received` counts."""
        marked: StoreTransaction | None = None
        self._ledger.enter(msg, _RUNNING_FIRST)  # (RUNNING_FIRST until its receipt commits, or it fails)
        try:
            with _DeliveryTransaction(self.store, None, deferred=True) as tx:
                self._ambient.wake_sender = False  # set again by whatever the delivery enqueues
                # the receipt follows what the application enqueued (its reply): order it first, as the
                # receipt that delivers inside takes its sequence's rows before the application runs
                tx.order_as_first(RANK_RMD, msg.sequence_id)
                tx.order_as_first(RANK_INVOKER, msg.sequence_id)
                handed_over = self._deliver(tx, msg, buffered=False)
                if tx.untouched:
                    marked = record_with_others()
                if marked is None:
                    record(tx)
            if marked is not None:
                marked.wait_for_disk()  # its commit returned before the disk; nothing is answered before
        except Exception:
            # RUNNING_FIRST -> SETTLING: no invoker thread takes it, once buffered, before its try is counted
            self._ledger.apply(msg, _E.FAILED)
            raise
        self._ledger.apply(msg, _E.COMMITTED)  # RUNNING_FIRST -> DELIVERED: forgotten
        self.delivered_on_receive(handed_over)
        return handed_over

    def hold(self, msg: BufferedMessage) -> None:
        """Its delivery on receipt failed: keep the invoker threads off ``msg`` until
        :meth:`failed_on_receipt` or :meth:`release` (it is SETTLING)."""
        self._ledger.apply(msg, _E.FAILED, state=_TAKEN_ON_RECEIPT)

    def keep_apart(self, msg: BufferedMessage) -> bool:
        """``msg``, just buffered by its receive and next in order, is delivered by that receive
        (:meth:`deliver_received`): keep the invoker threads off it (it is APART).  False when the
        machine says it may not be (it is not WAITING: another thread has it)."""
        try:
            self._ledger.apply(msg, _E.KEPT_APART)
        except InvalidTransition:
            return False
        return True

    def not_kept_apart(self, msg: BufferedMessage) -> None:
        """The transaction that buffered ``msg`` for :meth:`keep_apart` rolled back: forget it."""
        self._ledger.apply(msg, _E.ROLLED_BACK)

    def release(self, msg: BufferedMessage) -> None:
        """:meth:`hold` ends without an attempt to count: the message was not kept (its source
        sends it again)."""
        with contextlib.suppress(InvalidTransition):
            self._ledger.apply(msg, _E.VANISHED)

    def failed_on_receipt(self, msg: BufferedMessage, exc: BaseException) -> None:
        """A delivery on receipt of ``msg`` failed with ``exc`` and ``msg`` is buffered now (or was
        a duplicate): judge it, as a failed delivery here."""
        self.settlement.judge(msg, exc)

    def delivery_wakes_sender(self) -> bool:
        """Did the delivery this thread just ran make the sender's work due (it enqueued)?
        For a delivery run by another receive's thread (``Destination._deliver_together``)."""
        return getattr(self._ambient, "wake_sender", True)

    def delivered_on_receive(self, handed_over: bool, wakes_sender: bool | None = None) -> None:
        """After the commit of a receive that delivered: what a step does after its commit.
        ``wakes_sender``: whether the delivery enqueued, when another thread ran it."""
        if handed_over:
            self.delivered += 1
        if self.delivery_wakes_sender() if wakes_sender is None else wakes_sender:
            self._after_commit()
        self._on_delivered()
        self.settlement.succeeded()

    def count_consumed(self) -> None:
        """A reply was consumed in the transaction that recorded it (``Destination.reply_consumers``):
        handed to its call there, so counted as delivered."""
        self.delivered += 1

    def deliver_through(self, sequence_id: str, number: int, limit: int = CATCH_UP_STEPS, *,
                        settled: bool = False) -> bool:
        """Deliver the sequence's buffered messages in order, up to ``number``, from the calling
        (receiving) thread: one transaction each, exactly as the invoker threads would.

        A receive that delivers on receipt but had to buffer its message (the
        one before it was still buffered) calls this before it answers;
        otherwise, under a steady stream, the invoker threads stay a message
        behind the receives and no message ever finds itself next in line.
        Unlike an invoker thread's claim, which skips a sequence another
        transaction holds, this waits for it: the message before is then
        being delivered, and this one comes right after it.  It takes a
        message only where the machine lets it be taken along (FOLLOW: not a
        message that failed before, whose attempts, delays and poison the
        invoker threads settle), stops at a gap, after ``limit`` deliveries,
        and does nothing while delivery is paused.  A failure here is judged
        like any failed delivery; a store error is left to the invoker threads
        (the receive itself succeeded).

        True when it delivered ``number``, or, with ``settled``, found nothing left in line up to
        it (a statement more, once, when another thread delivered the last of them): for a
        caller that knows every number up to ``number`` received, each is then delivered (a
        message that filled a gap, see ``Destination._caught_up``).  False otherwise."""
        if self.application is None or self.pause.paused:
            return False
        done: list[bool] = []  # (set by the pick that found nothing left in line up to ``number``)

        def next_in_line(tx: StoreTransaction) -> BufferedMessage | None:
            msg = tx.invoker.next_deliverable(sequence_id, in_order=True, now=time.time())
            if msg is None and settled:  # nothing due next: nothing in line either (none waits for a retry)?
                msg = tx.invoker.next_deliverable(sequence_id, in_order=True)
                if msg is None or msg.number > number:
                    done.append(True)
                return None
            if msg is not None and msg.number > number:
                done.append(True)  # (the next in line is past it: every number up to it delivered)
                return None
            return msg

        for _ in range(limit):
            msg = self._take_along(next_in_line, f"the buffer of {sequence_id}")
            if msg is None:
                return bool(done)
            if msg.number >= number:
                return True
        return False

    def steps_after_response(self) -> None:
        """What a woken invoker thread would do, from a receiving thread once its response is
        written (:mod:`.after_response`): steps until one finds nothing, at most
        :data:`CATCH_UP_STEPS`; an invoker thread is woken for what is left (more, or a step
        that failed).  The bound of ``invoker_threads`` steps at once holds for both kinds of
        thread: when every place is taken, this thread wakes nobody, it says a step is wanted
        (``_step_wanted``) and goes back to its requests.

        Nothing is left behind: a message buffered while this thread's last step looked is
        either seen by its own receive's steps, or its sequence was held then by a delivery
        whose thread steps again after it commits (as when an invoker thread is busy).  When
        every place is taken, each thread holding one either claims again after the flag was
        set (a thread steps while it finds work), or leaves its place afterwards and sees the
        flag: it steps again (:meth:`step`, and the loop here); the flag is cleared only by a
        thread that then claims.  Waking an invoker thread instead cost it a wake-up and a wait
        for a place, and kept the places with the invoker threads: at 16 sequences
        (bench_compare, memory, a PostgreSQL insert in the method) 0.88 of these calls found no
        place, and invoker threads made 0.89 of the deliveries.

        After the engine's ``stop()`` (``running`` False: a server may close a response
        body once the engine stopped) it does nothing: delivery happens only between start and
        stop, the store may be closed, and what is buffered waits for the next start."""
        self._ambient.invoker_busy = False  # (the thread's last steps were for another request)
        slots = self._step_slots
        while self.running:
            self._step_wanted = True  # before the look at the places: a holder leaving sees it
            try:
                slots.get_nowait()
            except queue.Empty:
                return  # every place taken: a thread holding one steps for this (see above)
            self._step_wanted = False  # (this thread claims next)
            try:
                for _ in range(CATCH_UP_STEPS):
                    if not self.running or not self._step_in_slot():
                        break
                else:
                    break  # more than a receive's share: an invoker thread goes on
            except Exception:  # noqa: BLE001 -- the receive succeeded: an invoker thread tries again
                log.exception("delivering the buffer after a response failed; left to the invoker threads")
                break
            finally:
                slots.put(None)
            if not self._step_wanted:
                return
        else:
            return
        self._wake_invoker()

    def deliver_now(self, sequence_id: str, number: int) -> bool:
        """Deliver buffered message ``number`` of ``sequence_id`` now, whatever is missing before
        it, in a transaction of its own in the calling (receiving) thread; True if it was.

        For replies on a sequence this engine offered (``RMPolicy.replies_in_order``
        False): each resolves the call it answers, so none waits for another.  A
        message the machine does not let be taken along (FOLLOW: it failed before,
        or its failure is being judged) is left to the invoker threads, and so is
        every message while delivery is paused; a failure here is judged like any
        failed delivery.
        """
        if self.application is None or self.pause.paused:
            return False
        return self._take_along(lambda tx: tx.invoker.get(sequence_id, number),
                                f"reply {number} of {sequence_id}") is not None

    def _take_along(self, pick: Callable[[StoreTransaction], BufferedMessage | None],
                    what: str) -> BufferedMessage | None:
        """Deliver the message ``pick`` finds, in a transaction of its own in the calling
        (receiving) thread; the message if it was delivered, None if not.

        The one place where a receive delivers a buffered message itself, so
        both ways of doing it (in order, and a reply whatever precedes it)
        ask the machine the same question (FOLLOW) and settle a failure the
        same way: the application succeeded but the commit did not, or it
        raised -- either way the message is judged like any failed delivery,
        while a failure before anything was taken (the store's) is left to the
        invoker threads, since the receive itself succeeded.
        """
        msg: BufferedMessage | None = None
        delivering: MessageState | None = None
        try:
            with self._transaction() as tx:
                msg = pick(tx)
                if msg is None:
                    return None
                try:
                    delivering = self._ledger.apply(msg, _E.FOLLOW).state
                except InvalidTransition:
                    return None  # it failed before: the invoker threads deliver it alone
                self._ambient.wake_sender = False  # set again by whatever the delivery enqueues
                try:
                    handed_over = self._deliver(tx, msg)
                except Exception:
                    self._ledger.apply(msg, _E.FAILED, state=delivering)  # before the rollback frees it
                    delivering = None
                    raise
        except Exception as exc:  # noqa: BLE001 -- the application's errors are data here
            if msg is None or (delivering is None and self._ledger.state(msg).stage is not Stage.SETTLING):
                log.debug("delivering %s on receipt stopped: %s", what, exc)
                return None
            if delivering is not None:  # the application succeeded, the commit did not
                self._ledger.apply(msg, _E.FAILED, state=delivering)
            self.settlement.judge(msg, exc)
            return None
        self.delivered_on_receive(handed_over)
        return msg

    # -- the invoker threads' steps ---------------------------------------------------------------

    def _anything_claimable(self) -> bool:
        """Would a delivery find a message no other invoker thread holds?  A plain, read-only look.

        An XA transaction that finds nothing still costs a branch begin and a
        commit on every resource; with several invoker threads most of them
        would find every busy sequence held by another.  The look itself is
        skipped after a step that delivered (its sequence likely has more).
        """
        if getattr(self._ambient, "invoker_busy", False):
            return True
        with self.store.begin() as tx:
            return tx.invoker.claim_next(in_order=self.policy.in_order) is not None

    def step(self) -> bool:
        """An invoker thread's step: deliver (or settle) the next message of any sequence; False
        when there was nothing to do and no receive found every place taken meanwhile (then
        True: the thread steps again for it, see :meth:`steps_after_response`)."""
        slots = self._step_slots
        slots.get()
        try:
            self._step_wanted = False  # (this step claims next: see steps_after_response)
            busy = self._step_in_slot()
        except BaseException:
            slots.put(None)
            if self._step_wanted:  # left to this thread, which now waits out its interval: to another
                self._wake_invoker()
            raise
        slots.put(None)
        return busy or self._step_wanted  # a receive found every place taken meanwhile: step again

    def _step_in_slot(self) -> bool:
        if self.application is None:
            return False
        probe = False
        if self.pause.paused:
            if not self.pause.take_probe():
                return False  # paused: only the probe delivers, one message at a time
            probe = True
        try:
            busy = self._step(probe)
        except Exception as exc:
            if not self.settlement.outage(exc):  # nothing taken: the store or a resource failed first
                raise
            busy = False
        finally:
            if probe and self.pause.mode is ServiceMode.PROBING:  # the probe delivered nothing, failed nothing
                self._probe_found_nothing()
        self._ambient.invoker_busy = busy
        return busy

    def _probe_found_nothing(self) -> None:
        if self._ledger.deferred():
            self.pause.probe_ended_empty()  # what the pause put off comes due soon: probe that
        else:
            self.settlement.service_actions(self.pause.nothing_waiting())

    def _step(self, probe: bool) -> bool:
        if not self.store.buffer_may_hold():
            return False  # nothing buffered: no transaction opened to find nothing
        if self.tm is not None and not self._anything_claimable():
            return False  # don't open an XA transaction just to find nothing
        work = _Step()
        try:
            with self._transaction() as tx:
                if not self._claim(tx, work, probe):
                    return False
        except _BatchBroken as broken:  # all of the batch rolled back: the one that broke it is judged
            self.settlement.judge(broken.message, broken.error)
            return False
        except Exception as exc:  # noqa: BLE001 -- the application's errors are data here
            if work.claimed is None:
                raise
            return self._step_failed(work, exc)
        return self._step_committed(work)

    def _claim(self, tx: StoreTransaction, work: "_Step", probe: bool) -> bool:
        """In ``tx``: the next message of any sequence, and what the machine says to do with it
        (deliver it, and those after it in a batch; or settle it given up).  False: nothing."""
        claimed = tx.invoker.claim_next(in_order=self.policy.in_order)
        if claimed is None:
            return False
        try:
            taken, error = self._ledger.take(claimed, _E.CLAIM)
        except InvalidTransition:
            self._passed_held = True  # woken when it is settled or delivered (deliver_received)
            return False  # another thread is judging its failure, or delivers it: not ours to run
        work.claimed = claimed
        if MessageAction.GIVE_UP in taken.actions:  # out of attempts inside a batch; first now
            work.settled = self.settlement.give_up(tx, claimed, error or RecordedFailure(claimed.last_error))
        elif MessageAction.POISON in taken.actions:  # its last cycle ended while not first
            work.settled = self.settlement.poison(tx, claimed, error or RecordedFailure(claimed.last_error))
        else:
            work.delivering = delivering = taken.state
            try:
                work.done.append((claimed, self._deliver(tx, claimed)))
            except Exception:
                self._ledger.apply(claimed, _E.FAILED, state=delivering)  # before the rollback frees it
                work.delivering = None
                raise
            work.wake = getattr(self._ambient, "wake_sender", True)
            if not probe and not delivering.alone and self._batches(tx):
                work.later, work.wake = self._deliver_more(tx, claimed.sequence_id, work.done, work.wake)
                if work.later is not None:
                    self._ledger.apply(work.later[0], _E.FAILED, state=MessageState(Stage.DELIVERING))
        return True

    def _step_failed(self, work: "_Step", exc: BaseException) -> bool:
        """The step's transaction raised after it took ``work.claimed``."""
        claimed = work.claimed
        assert claimed is not None
        if len(work.done) > 1:  # the commit of a batch failed: which message caused it is unknown
            return self._commit_failed([msg for msg, _ in work.done], exc)
        if work.delivering is not None:  # the application succeeded, the commit did not
            self._ledger.apply(claimed, _E.FAILED, state=work.delivering)
        elif self._ledger.state(claimed).stage is not Stage.SETTLING:
            # giving it up failed (the store): it stays given up, settled at its next claim
            log.warning("could not settle message %d of sequence %s (tried again at its next claim): %s",
                        claimed.number, claimed.sequence_id, exc)
            self.settlement.outage(exc)
            return False
        return self.settlement.judge(claimed, exc)

    def _step_committed(self, work: "_Step") -> bool:
        if work.settled is not None:
            work.settled()
            return True
        self.delivered += sum(1 for _, handed_over in work.done if handed_over)
        if work.wake:
            self._after_commit()
        if work.done:
            self._on_delivered()
            self.settlement.succeeded()
        if work.later is not None:
            return self.settlement.judge(*work.later)
        return True

    def _batches(self, tx: StoreTransaction) -> bool:
        """Deliver more than one message of a sequence in this transaction?

        Each transaction has a fixed cost that dominates a small message: a
        durable flush, and under a transaction manager a two-phase commit
        (the store's branch and the application's, each a prepared
        transaction, plus the recovery log's fsync).  A batch pays it once
        for up to ``delivery_batch`` messages (and holds the sequence's
        buffer, or a SQLite store's whole file, only briefly: it is also
        bounded by ``policy.delivery_batch_seconds``).

        Without a transaction manager the exactly-once work is the work done
        in the store transaction (``context.transaction``), and each
        message's share of it sits in its own savepoint: a message that fails
        is rolled back alone while the ones before it commit, exactly as if
        each had been delivered in its own transaction.

        With one, the application's own enlisted connections cannot be
        rolled back to a savepoint, so a batch is all-or-nothing: when any
        message's handler raises, the whole XA transaction rolls back, which
        is as if none of the batch had been delivered (nothing of it is
        committed anywhere).  The message that raised is then delivered
        *alone* (the machine's ``alone``): the messages before it are
        delivered again (they had succeeded) and it gets a transaction of its
        own, so its attempts, give-up, fault reply and failure hook are
        exactly those of one-by-one delivery.
        """
        if self.policy.delivery_batch <= 1:
            return False
        return self.tm is not None or tx.supports_savepoints

    def _deliver_more(self, tx: StoreTransaction, sequence_id: str, done: list[tuple[BufferedMessage, bool]],
                      wake: bool) -> tuple[tuple[BufferedMessage, BaseException] | None, bool]:
        """The sequence's next deliverable messages, in ``tx`` (each in a savepoint without XA).

        Returns the message that failed (rolled back to its savepoint, for
        :meth:`_judge` after the commit) and whether to wake the sender.
        Raises :class:`_BatchBroken` when the failure took the whole
        transaction with it (always, under XA).  A message the machine does
        not let be taken along (FOLLOW: it failed before, or broke a batch)
        ends the batch: it is delivered on its own.
        """
        deadline = time.monotonic() + self.policy.delivery_batch_seconds
        while len(done) < self.policy.delivery_batch and time.monotonic() < deadline:
            msg = tx.invoker.next_deliverable(sequence_id, in_order=self.policy.in_order, now=time.time())
            if msg is None:
                break
            try:
                delivering = self._ledger.apply(msg, _E.FOLLOW).state
            except InvalidTransition:
                break  # delivered alone
            try:
                with tx.savepoint() if self.tm is None else contextlib.nullcontext():
                    handed_over = self._deliver(tx, msg)
            except Exception as exc:  # noqa: BLE001 -- judged after the commit, like a lone delivery
                if self.tm is not None or tx.failed is not None:  # all of the transaction rolls back
                    self._ledger.apply(msg, _E.FAILED, state=delivering)  # before the rollback frees it
                    raise _BatchBroken(msg, exc, delivering) from exc
                return (msg, exc), wake
            done.append((msg, handed_over))
            wake = wake or getattr(self._ambient, "wake_sender", True)
        return None, wake

    def _commit_failed(self, batch: list[BufferedMessage], exc: BaseException) -> bool:
        """The commit of a batch failed, so no single message is to blame: deliver each alone.

        No attempt is counted (none of them is known to have failed); one by
        one, the message that really causes the failure is found and counted.
        """
        log.warning("a batch of %d deliveries of sequence %s failed to commit (rolled back, will deliver "
                    "them one by one): %r", len(batch), batch[0].sequence_id, exc)
        for msg in batch:
            self._ledger.apply(msg, _E.BATCH_COMMIT_FAILED, state=MessageState(Stage.DELIVERING))
        self.settlement.outage(exc)
        return False

    # -- delivering --------------------------------------------------------------------------------

    def _deliver(self, tx: StoreTransaction, msg: BufferedMessage, *, buffered: bool = True,
                 next_in_order: bool = False, replies: list[SendReceipt] | None = None,
                 hand_out: HandOut | None = None) -> bool:

        """Hand ``msg`` over in ``tx``; False for a protocol marker the application never sees.

        ``buffered=False``: a message taken on receipt (its number is already
        recorded as delivered in ``tx``), with no buffer row to remove.
        ``next_in_order``: it was the next in order when it was buffered
        (``mark_next_delivered``)."""
        if msg.action == _LAST_MESSAGE_ACTION:
            if buffered:
                self.mark_delivered_in(tx, msg, next_in_order)
            for_sequence(log, msg.sequence_id, msg.number).debug("LastMessage marker consumed")
            return False
        self._ambient.wake_sender = True
        relates_to = None
        if _may_have_relates_to(msg.payload):
            relates_to = AddressingHeaders.from_header(read_trusted(msg.payload).headers).relates_to
        context = DeliveryContext(
            sequence_id=msg.sequence_id, message_number=msg.number, message_id=msg.message_id,
            action=msg.action, reply_to=msg.reply_to, relates_to=relates_to,
            soap_version=msg.soap_version, transaction=tx, _source=self.source, _hand_out=hand_out)
        at_decision = self.at_decision
        if at_decision is not None:
            at_decision.wait_turn(msg.sequence_id)  # the sequence's last delivery's rows visible first
        observer = observe.active
        if observer is not None:
            self._deliver_observed(observer, tx, msg, context)
        else:
            self._hand_over(tx, msg, context)
        if at_decision is not None:
            at_decision.after_delivery(msg.sequence_id)
        if buffered:
            self.mark_delivered_in(tx, msg, next_in_order)
        if replies is not None:
            replies.extend(context.replies)
        if log.isEnabledFor(logging.DEBUG):  # (every delivery: its adapter only when written)
            for_sequence(log, msg.sequence_id, msg.number).debug("delivered")
        return True

    @staticmethod
    def mark_delivered_in(tx: StoreTransaction, msg: BufferedMessage, next_in_order: bool) -> None:
        """``msg``, delivered, removed from the buffer in ``tx`` (also by a batch of other
        receives' work: see :meth:`deliver_received`'s ``mark``)."""
        if next_in_order:
            tx.invoker.mark_next_delivered(msg.sequence_id, msg.number)
        else:
            tx.invoker.mark_delivered(msg.sequence_id, msg.number)

    def _deliver_observed(self, observer: observe.Observer, tx: StoreTransaction, msg: BufferedMessage,
                          context: DeliveryContext) -> None:
        """:meth:`_hand_over`, told to ``observer``: its step ends when the delivery's transaction does."""
        gtx = self.tm.get_transaction() if self.tm is not None else None
        step = observer.delivering(msg.payload, sequence_id=msg.sequence_id, number=msg.number,
                                   action=msg.action, message_id=msg.message_id,
                                   transaction=str(gtx.xid) if gtx is not None else None)
        try:
            with step.current():
                self._hand_over(tx, msg, context)
        except BaseException as exc:
            step.end(exc)  # rolled back (to its savepoint, in a batch)
            raise
        steps = _open_steps()
        if steps:
            steps[-1].append(step)  # ended with the delivery's transaction, saying how it ended
        else:
            step.end()

    def _hand_over(self, tx: StoreTransaction, msg: BufferedMessage, context: DeliveryContext) -> None:
        self._ambient.tx = tx
        try:
            if not self._deliver_reply(tx, msg, context):
                # the sender is woken after the commit only if the application enqueued something
                # (Source sets wake_sender again): waking it for nothing costs a store round trip
                self._ambient.wake_sender = False
                if self.application is None:  # step() delivers nothing without one
                    raise RuntimeError("no application to deliver to")
                started = time.monotonic()
                try:
                    self.application(msg.payload, context)
                finally:
                    # an average that forgets: a few quick calls make a once-slow service quick again
                    self.application_seconds += (time.monotonic() - started - self.application_seconds) / 8
        finally:
            self._ambient.tx = None

    def _deliver_reply(self, tx: StoreTransaction, msg: BufferedMessage, context: DeliveryContext) -> bool:
        """A response to a request sent with a ``reply_callback``: hand it to that callback."""
        if context.relates_to is None:
            return False
        request = tx.rms_messages.find_by_message_id(context.relates_to)
        if request is None:
            return False
        if request.reply_callback is None:
            self.source.reply_arrived(tx, request)  # the application gets the reply itself
            return False
        callback = _import_callback(request.reply_callback)
        callback(msg.payload, context, request.reply_context)
        self.source.reply_arrived(tx, request)
        return True

_steps_local = threading.local()


def _open_steps() -> list[list[observe.Step]]:
    """The observed delivery transactions open in this thread, innermost last, with their steps."""
    stack = getattr(_steps_local, "stack", None)
    if stack is None:
        stack = _steps_local.stack = []
    return stack


class _DeliveryTransaction:
    """What :meth:`InvokerWorker.transaction` returns: ``with tm.transaction(): with
    store.begin(xa=tm) as tx`` (or a local ``store.begin()`` without a transaction manager).

    A plain class rather than a ``@contextmanager`` generator: every delivery and every
    receive that delivers runs one, and the generator machinery (a helper object, a
    generator, the calls into it) cost more Python calls than the two ``with`` it wraps.
    Exits as the two nested ``with`` statements would: the store transaction first, then
    the global transaction with whatever the store's exit raised.
    """

    __slots__ = ("_store", "_tm", "_scope", "_tx", "_steps", "_deferred")

    def __init__(self, store: StorageManager, tm: Any, deferred: bool = False) -> None:
        self._store = store
        self._tm = tm
        self._deferred = deferred
        self._scope: Any = None
        self._tx: StoreTransaction | None = None
        self._steps: list[observe.Step] | None = None

    def __enter__(self) -> StoreTransaction:
        if observe.active is not None:  # the deliveries' steps end with this transaction
            self._steps = []
            _open_steps().append(self._steps)
        tm = self._tm
        if tm is None:
            tx = self._tx = self._store.begin_deferred() if self._deferred else self._store.begin()
            return tx.__enter__()
        scope = tm.transaction()
        scope.__enter__()
        try:
            tx = self._store.begin(xa=tm)
            entered = tx.__enter__()
        except BaseException as exc:
            scope.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._scope, self._tx = scope, tx
        return entered

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: Any) -> None:
        steps, self._steps = self._steps, None
        if steps is None:
            self._end(exc_type, exc, tb)
            return
        open_steps = _open_steps()
        if open_steps and open_steps[-1] is steps:
            open_steps.pop()
        try:
            self._end(exc_type, exc, tb)
        except BaseException as error:
            for step in steps:
                step.end(error)
            raise
        for step in steps:
            step.end(exc)

    def _end(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        scope, tx = self._scope, self._tx
        self._scope = self._tx = None
        assert tx is not None
        if scope is None:
            tx.__exit__(exc_type, exc, tb)
            return
        try:
            tx.__exit__(exc_type, exc, tb)
        except BaseException as inner:
            scope.__exit__(type(inner), inner, inner.__traceback__)
            raise
        scope.__exit__(exc_type, exc, tb)
