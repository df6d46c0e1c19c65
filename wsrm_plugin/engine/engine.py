"""ReliableEngine: a store, a policy, three workers and an HTTP endpoint, put together.

::

    engine = ReliableEngine("sqlite:///rm.db", RMPolicy(), application=handle)
    server = engine.serve("127.0.0.1", 8080)     # the RMEndpoint, on waitress
    engine.start()                               # the RMS, RMD and invoker workers
    engine.send("http://peer:8080/", envelope, action="urn:example:order")
    ...
    engine.stop()

One engine is both an RM Source (what it sends) and an RM Destination (what
it receives); both keep all their state in the store, so ``stop()`` and a
later ``start()`` (or a crash and a restart) continue where things were.
The engine knows nothing of spyne or zeep: its unit of work is a SOAP
envelope as bytes, and its application is a callable
``(envelope, DeliveryContext)``.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .. import poison
from ..store import PoisonMessage, StorageManager, open_store
from .acknowledgement import AcknowledgementWorker
from .backchannel import BackChannel
from .busy import BUSY_AT, BusySequences
from .destination import Destination
from .inbound import Inbound
from .invoker import Application, FailedDelivery, InvokerWorker
from .policy import (
    APART_HTTP_THREADS,
    AUTOMATIC_HTTP_THREADS,
    AUTOMATIC_HTTP_THREADS_TWO_PHASE,
    AUTOMATIC_HTTP_THREADS_XA,
    AUTOMATIC_THREADS_BUFFERED,
    RMPolicy,
)
from .reachability import UnreachablePeer
from .reporter import NodeReports, reporter_name
from .resend import ResendResult, resend_faulted
from .retransmission import RetransmissionWorker
from .source import SendReceipt, SequenceFault, Source
from .switch_interval import Claim, claim
from .transport import HttpServer, HttpTransport, Reply, RMEndpoint, Transport
from .workers import Worker

__all__ = ["ReliableEngine", "EngineStatus"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStatus:
    """Counters for operators and tests: the store's view plus what this process did."""

    rms_sequences: int
    rmd_sequences: int
    unacked: int
    buffered: int
    faulted_sequences: int
    messages_sent: int
    retransmissions: int
    send_failures: int
    delivered: int
    delivery_failures: int
    faults_sent: int
    refused_sequences: int
    by_state: dict[str, int]
    #: Control messages (CreateSequence, CloseSequence, TerminateSequence) this process sent again.
    control_retries: int = 0
    #: Failed delivery attempts this process rolled back and scheduled again.
    delivery_retries: int = 0
    #: Buffered messages waiting for a retry after a failed delivery (the store's count).
    retrying: int = 0
    #: Messages in the poison store (the store's count).
    poisoned: int = 0
    #: Messages this process refused (503, unacknowledged: the source sends them again) because
    #: a byte budget of what is held undelivered was reached.
    refused_for_budget: int = 0
    #: Messages this process dropped unrecorded because they were not the next in order
    #: (``RMPolicy.out_of_order="discard"``; the source sends them again).
    discarded_out_of_order: int = 0
    #: Of ``delivered``, messages handed over in the transaction that received them
    #: (``RMPolicy.deliver_on_receive``); the others went through the invoker buffer.
    delivered_on_receipt: int = 0
    #: Delivery is paused: what the service depends on is down (``RMPolicy.pause_on_outage``);
    #: messages are still received and acknowledged, and kept until it is back.
    paused: bool = False
    #: Since when (epoch seconds), while paused.
    paused_since: float | None = None
    #: The error that paused delivery, or the last probe's, while paused.
    pause_error: str | None = None
    #: Messages waiting for delivery while paused (0 while delivering).
    waiting: int = 0
    #: Peers this process judged unreachable and holds messages for (since, last error,
    #: probes, next probe): one probe at a time goes to each (``RMPolicy.peer_unreachable_after``).
    unreachable_peers: tuple[UnreachablePeer, ...] = ()
    #: Probes sent to unreachable peers, and times a peer became unreachable, by this process.
    probes_sent: int = 0
    peer_outages: int = 0


_frozen = False
_frozen_lock = threading.Lock()


def _freeze_start_up_objects() -> None:
    """``RMPolicy.freeze_gc_at_start``: once per process, so that objects an application
    made and dropped between two engines' starts are not frozen with their cycles."""
    global _frozen
    with _frozen_lock:
        if _frozen:
            return
        _frozen = True
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        log.debug("froze %d start-up objects out of the garbage collector's sight in %.1f ms",
                  gc.get_freeze_count(), 1000 * (time.perf_counter() - started))


class ReliableEngine:
    """A WS-RM node: RM Source and RM Destination over one store.

    ``store`` is a store URL (``memory:``, ``sqlite:///file.db``,
    ``postgresql://...``; the engine then owns and closes it) or an open
    :class:`~wsrm_plugin.store.StorageManager`.  ``tm`` (a
    ``txmanager.TransactionManager``) makes ``send`` join the caller's XA
    transaction and runs each delivery in one.  ``application`` handles
    delivered messages; ``on_delivery_failure`` hears about messages the
    application kept failing on.

    ``on_sequence_fault(fault: SequenceFault)`` is called once a source
    sequence is given up (retries exhausted, the peer refused to open it or
    faulted it) with its reason and its unacknowledged messages; when it
    returns, the sequence and its messages are deleted: they are the hook's
    to keep.  Without the hook they stay in the store, faulted (``wsrm status``
    shows the reason), until :meth:`resend_faulted` (or ``wsrm resend``) sends
    them again on a new sequence once the cause is fixed.  ``endpoint_address`` is
    this node's public address (AcksTo, Offer endpoint); :meth:`serve` sets it
    when not given.

    ``answers(body)`` says whether the operation of a request (its SOAP Body's
    first element) answers.  With it, a request no reply could reach (its
    sequence came without an Offer and its ReplyTo is anonymous) is refused
    with a Sender fault before it is recorded, as the spyne adapter does;
    without it such a request is run, and its ``context.reply`` raises.

    ``understands``: the header blocks (``"{namespace}local"``) the application
    processes, beside WS-Addressing's, WS-RM's and WS-MakeConnection's, which the
    engine does.  A received message with any other header marked mustUnderstand
    is refused with SOAP's MustUnderstand fault before it is recorded (SOAP 1.1
    section 4.2.3, 1.2 part 1 section 2.4).  None: a front end in front of the
    engine applies that rule itself (the spyne adapter does, knowing the service's
    declared headers).  ``knows(body, action)`` says whether an application
    message's body element (None for an empty body) and wsa:Action name an
    operation of the application; with it, a message naming none is refused
    (WS-Addressing's ActionNotSupported) before it is acknowledged.
    """

    def __init__(self, store: str | StorageManager, policy: RMPolicy | None = None, *, tm: Any = None,
                 transport: Transport | None = None, application: Application | None = None,
                 endpoint_address: str | None = None,
                 on_sequence_fault: Callable[[SequenceFault], None] | None = None,
                 on_delivery_failure: Callable[[FailedDelivery], None] | None = None,
                 answers: Callable[[Any], bool] | None = None,
                 understands: Iterable[str] | None = (),
                 knows: Callable[[Any, str | None], bool] | None = None,
                 name: str = "wsrm") -> None:
        self.policy = policy or RMPolicy()
        self._owns_store = isinstance(store, str)
        self.store = open_store(store) if isinstance(store, str) else store
        self._owns_transport = transport is None
        self.transport = transport or HttpTransport(timeout=self.policy.http_timeout)
        self.tm = tm
        self.name = name
        self.endpoint_address = endpoint_address
        self._ambient = threading.local()
        self._servers: list[HttpServer] = []
        #: The interpreter's switch interval this engine set while it serves (``serving``).
        self._switch_interval: Claim | None = None

        policy = self.policy
        endpoint = lambda: self.endpoint_address  # noqa: E731 -- read late: serve() may set it
        #: Who this process is in the conditions it reports to the store, and who withdraws a dead
        #: host's (:mod:`.reporter`).
        reporter = reporter_name(name, tm)
        self.node_reports = NodeReports(self.store, tm)
        self.source = Source(self.store, policy, tm=tm, endpoint=endpoint, wake=self._wake_sender,
                             ambient=self._ambient, on_fault=on_sequence_fault,
                             end_offered=lambda offered_id: self.destination.end_offered(offered_id),
                             wake_in=lambda seconds, token: self._workers[0].wake_in(seconds, token))
        self.destination = Destination(self.store, policy, endpoint=endpoint, wake_invoker=self._wake_invoker,
                                       wake_acks=self._wake_acks, wake_release=self._wake_release, name=name)
        self.destination.reply_arrived = self.source.reply_consumed
        self.destination.reply_answering = self.source.reply_answering
        self.destination.apply_riding_ack = self.source.apply_riding_ack
        self.destination.riding_acknowledging = self.source.riding_acknowledging
        self.destination.wake_sender = self._wake_sender
        self.back_channel = BackChannel(self.store, policy, self.destination)
        self.inbound = Inbound(self.source, self.destination, policy, self.back_channel, answers=answers,
                               understands=understands, knows=knows)
        self.retransmission = RetransmissionWorker(self.store, policy, self.source, self.destination,
                                                   self.inbound, self.transport, on_reachable=self._peer_is_back,
                                                   name=name, reporter=reporter)
        self.source.early_claim = self.retransmission.early_claim
        #: The sequences that had a one-way call lately (the automatic ``one_way_caller_sends``).
        self._busy = BusySequences()
        self.source.records_done = self.destination.wait_records
        self.acknowledgement = AcknowledgementWorker(self.store, policy, self.destination, self.inbound,
                                                     self.transport, source=self.source,
                                                     reachability=self.retransmission.reachability)
        self.invoker = InvokerWorker(self.store, policy, source=self.source, ambient=self._ambient,
                                     application=application, tm=tm, on_failure=on_delivery_failure,
                                     after_commit=self._wake_sender,
                                     on_delivered=self.back_channel.delivered,
                                     wake_invoker=self._wake_invoker, service=name,
                                     reporter=reporter)
        self.destination.count_delivered = self.invoker.count_consumed
        if policy.delivers_on_receive(tm is not None, self.store.commits_are_costly):
            self.destination.deliver_on_receive(self.invoker)
        elif policy.delivers_answers_on_receive(tm is not None, self.store.commits_are_costly):
            self.destination.deliver_on_receive(self.invoker, answers_only=True)
        if not policy.replies_in_order:
            self.destination.replies_to(self.invoker)
        # The invoker threads grow with the work: the first polls; a message recorded for delivery
        # wakes a thread that is not busy (see _wake_invoker); one that found nothing sleeps until
        # woken again.
        self._workers = [
            Worker(f"{name}-rms", self.retransmission.step, policy.poll_interval),
            Worker(f"{name}-rmd", self.acknowledgement.step, policy.poll_interval),
            *(Worker(f"{name}-invoker-{i}", self.invoker.step, policy.poll_interval if i == 0 else None)
              for i in range(self.invoker.thread_count)),
        ]
        self.endpoint = RMEndpoint(self, policy.max_message_size)

    # -- waking the workers ---------------------------------------------------------------------

    def _wake_sender(self) -> None:
        self._workers[0].wake()

    def _wake_acks(self) -> None:
        self._workers[1].wake()

    def _wake_release(self) -> None:
        self.acknowledgement.request_housekeeping()
        self._workers[1].wake()

    def _peer_is_back(self, address: str) -> None:
        self._workers[0].wake()  # its next round sends what was held for the peer
        self._workers[1].wake()

    def _wake_invoker(self) -> None:
        """A message waits for delivery: wake one invoker thread that is neither busy nor woken
        already, so that messages of several sequences arriving together get a thread each.
        When none is, the first looks again once its step ends (a busy thread's step that
        delivered is followed by another at once anyway)."""
        invokers = self._workers[2:]
        for worker in invokers:
            if worker.idle:
                worker.wake()
                return
        invokers[0].wake()

    # -- the application's API ------------------------------------------------------------------

    def send(self, target: str, envelope: Any, *, action: str | None = None, key: str = "",
             expect_reply: bool = False, message_id: str | None = None,
             reply_callback: str | None = None, reply_context: bytes | None = None,
             caller_may_send: bool = False, caller_sends: bool = False) -> SendReceipt:
        """Enqueue ``envelope`` for reliable delivery to ``target`` (see :meth:`Source.send`).

        ``caller_sends``: a one-way message whose caller sends it from its own thread once it is
        stored (policy ``one_way_caller_sends``: always, or by default only while several
        sequences are busy, :meth:`_one_way_caller_sends`), outside a delivery's and a global
        transaction only (the message is not stored before they commit), when the sequence's
        lane is idle (:meth:`send_for_caller`); otherwise the sender sends it."""
        policy = self.policy
        now = caller_sends and policy.caller_send_grace is not None and self._one_way_caller_sends(target, key) \
            and self.source.alone_in_store()
        receipt = self.source.send(target, envelope, action=action, key=key, expect_reply=expect_reply,
                                   message_id=message_id, reply_callback=reply_callback,
                                   reply_context=reply_context, caller_may_send=caller_may_send, caller_sends=now)
        if now:
            try:
                self.send_for_caller(receipt.sequence_key, receipt.number, paced=policy.http_timeout)
            except Exception:  # stored: the sender sends it (the caller must not send it again itself)
                log.warning("message %d of %s left to the sender: its caller's send failed", receipt.number,
                            receipt.sequence_key, exc_info=True)
                self.leave_to_sender(receipt.sequence_key, receipt.number)
        return receipt

    def _one_way_caller_sends(self, target: str, key: str) -> bool:
        """Does a one-way caller to ``target`` under ``key`` send its own message (policy
        ``one_way_caller_sends``)?  By default (None) only while at least
        :data:`~.busy.BUSY_AT` of this engine's sequences are busy (:mod:`.busy`: one caller keeps
        the sender's pipelining, many are paced by the service), and only when nothing says the
        caller would wait on trouble: its sequence is open, its peer is sent to and answered
        its last exchange, and nothing sent on the sequence is still unacknowledged as far as
        the answers say (:meth:`RetransmissionWorker.sends_unhindered`).  Never on a store whose
        transactions take turns on its file (SQLite): each caller's send there costs a commit
        and a flush that the sender's rounds share (see ``RMPolicy.one_way_caller_sends``).
        Otherwise the sender sends it and the call returns once it is stored."""
        mode = self.policy.one_way_caller_sends
        if mode is not None:
            return mode
        if self.store.defers_transactions:
            return False
        current = self.source.current_sequence(target, key)
        if current is None:  # its CreateSequence goes first: the sender's
            return False
        return self._busy.note(current) >= BUSY_AT and self.retransmission.sends_unhindered(target, current)

    def send_for_caller(self, sequence_key: str, number: int, *, paced: float | None = None) -> bool:
        """Send an enqueued request from the calling thread, which then waits for its reply (see
        :meth:`RetransmissionWorker.send_for_caller`); False when the sender's round sends it.

        Only while the sender runs: a stopped engine sends nothing, from any thread.
        """
        if not self._workers[0].running:
            return False
        self._workers[0].cancel((sequence_key, number))  # sent now, from here or by the sender
        return self.retransmission.send_for_caller(sequence_key, number, paced=paced)

    def leave_to_sender(self, sequence_key: str, number: int) -> None:
        """The caller of an enqueued request will not send it (see :meth:`send_for_caller`): the
        sender sends it now rather than when the caller's grace ends."""
        self._workers[0].cancel((sequence_key, number))
        self.retransmission.leave_to_round(sequence_key, number)

    def resend_faulted(self, sequence: str) -> ResendResult:
        """Send a faulted sequence's unacknowledged messages again on a new sequence (see :mod:`.resend`).

        For when the cause of the fault is fixed; ``sequence`` is its
        identifier or store key (``wsrm status``; ``wsrm resend`` does the same
        from the command line).
        """
        result = resend_faulted(self.store, sequence)
        self.source._forget_current(result.faulted_key)
        self._wake_sender()
        return result

    def close(self, target: str, key: str = "") -> int:
        """End the sequences to ``target`` under ``key`` once their messages are acknowledged."""
        return self.source.close(target, key)

    terminate = close

    def handle(self, data: bytes, *, principal: str | None = None, content_type: str | None = None,
               remote_addr: str | None = None, parsed: Any = None, addressing: Any = None,
               via_response: bool = False) -> Reply:
        """Process one received envelope (what the HTTP endpoint and adapters call).

        ``parsed``: the envelope's lxml tree when the caller parsed ``data`` already (safely),
        or that tree as the caller read it already (a :class:`~wsrm_plugin.wire.soap.Envelope`);
        ``addressing``: the :class:`~wsrm_plugin.wire.AddressingHeaders` the caller read from
        that tree's headers already (an interceptor chain's), not read again.
        ``via_response``: ``data`` came in the HTTP response to a request this engine sent
        (a MakeConnection poll's answer), so from the peer it addressed.
        """
        return self.inbound.handle(data, principal=principal, content_type=content_type,
                                   remote_addr=remote_addr, parsed=parsed, addressing=addressing,
                                   via_response=via_response)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> ReliableEngine:
        """Start the workers (idempotent); messages are delivered from now on."""
        if self.policy.freeze_gc_at_start:
            _freeze_start_up_objects()
        if not self.invoker.running:
            self.invoker.withdraw_pause()  # what a predecessor of this process left reported
            self.node_reports.attach()  # and what a dead host leaves: withdrawn by who takes it over
        for worker in self._workers:
            worker.start()
        self.invoker.running = True
        return self

    @property
    def workers(self) -> tuple[Worker, ...]:
        """The engine's worker threads (the sender, the acknowledger, the invokers): for health checks."""
        return tuple(self._workers)

    @property
    def started(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self.invoker.running

    def serve(self, host: str = "127.0.0.1", port: int = 0, *, path: str = "/",
              middleware: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
              threads: int | None = None, **options: Any) -> HttpServer:
        """Serve the RM endpoint with waitress; the first server's URL becomes the endpoint address.

        ``threads``: waitress's threads; None: :attr:`http_threads`.

        ``options`` go to :class:`~.http_server.HttpServer` (``connection_limit``,
        ``channel_timeout``, ``request_timeout``, ``on_failure``...); ``server.wait(stop)``
        raises when its loop failed for good (see the deploy guide)."""
        app: Callable[..., Any] = self.endpoint if middleware is None else middleware(self.endpoint)
        threads = self.http_threads if threads is None else threads
        self.serving()
        server = HttpServer(app, host, port, threads=threads, path=path,
                            max_body=max(4 * self.policy.max_message_size, 16 * 1024 * 1024), **options).start()
        self._servers.append(server)
        if self.endpoint_address is None:
            self.endpoint_address = server.url
        return server

    def serving(self) -> None:
        """A built-in server is about to serve this engine: on a SQLite store the interpreter's
        switch interval is shortened until :meth:`stop` (``RMPolicy.interpreter_switch_interval``;
        :mod:`.switch_interval` says why).  A front end with its own ``serve()`` calls it too."""
        if self._switch_interval is None:
            self._switch_interval = claim(self.policy.interpreter_switch_interval,
                                          self.store.defers_transactions)

    @property
    def http_threads(self) -> int:
        """The threads a built-in server gets unless told (:data:`~.policy.AUTOMATIC_HTTP_THREADS`):
        more let more PostgreSQL receives share a WAL flush, and cost more thread switches on
        a machine whose cores are not otherwise busy; that constant says what was measured.  A
        SQLite service without a transaction manager that may deliver apart (``deliver_apart``
        True or automatic) gets :data:`~.policy.APART_HTTP_THREADS`: there each thread runs its
        application outside the store's file, and the threads bound how many run at once.
        Under a transaction manager whose deliveries will commit in two phases
        (:data:`~.policy.AUTOMATIC_HTTP_THREADS_TWO_PHASE`), where the receives waiting at the
        same time are delivered together: a resource registered with the manager (an
        ``XADataSource``, registered as it is made) names a database that is not the store's.
        One made after :meth:`serve` is not seen here.  Under a transaction manager on a
        PostgreSQL store otherwise (XA in one database: :data:`~.policy.AUTOMATIC_HTTP_THREADS_XA`),
        each receive commits its application and its receipt in its HTTP thread, and the threads
        bound how many such commits one WAL flush covers.  Where one-way messages are buffered
        and the HTTP threads deliver them after their responses (the memory store without a
        transaction manager), :data:`~.policy.AUTOMATIC_THREADS_BUFFERED`, as many as the
        invoker's places."""
        if self.policy.deliver_apart is not False and self.tm is None and self.store.defers_transactions:
            return APART_HTTP_THREADS
        if self.destination.delivers_together_if_two_phase and any(
                getattr(resource, "database", None) not in (None, getattr(self.store, "database", None))
                for resource in self.tm.resources):
            return AUTOMATIC_HTTP_THREADS_TWO_PHASE
        if self.tm is not None and self.store.commits_are_costly and not self.store.defers_transactions:
            return AUTOMATIC_HTTP_THREADS_XA
        if self.store.concurrent_sequences and self.policy.buffers_one_way(self.tm is not None,
                                                                           self.store.commits_are_costly):
            return AUTOMATIC_THREADS_BUFFERED
        return AUTOMATIC_HTTP_THREADS

    @property
    def servers(self) -> tuple[HttpServer, ...]:
        """The built-in HTTP servers :meth:`serve` started (and :meth:`stop` has not stopped)."""
        return tuple(self._servers)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop workers and servers; with ``terminate_on_shutdown`` end the source sequences first.

        Waiting for termination needs the peer: at most ``timeout`` seconds,
        after which what is left stays in the store for the next start.
        """
        if not self.destination.close_records(timeout):  # replies answered before their record
            log.warning("stopped with replies still to record: their peers send them again")
        if self.policy.terminate_on_shutdown and any(w.running for w in self._workers):
            self.source.close_all()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.status().rms_sequences:
                time.sleep(min(self.policy.poll_interval, 0.05))
        was_running, self.invoker.running = self.invoker.running, False
        for worker in self._workers:
            worker.stop(timeout)
        if was_running and self.invoker.paused:
            self.invoker.withdraw_pause()
        if was_running:
            self.node_reports.detach()
        self.retransmission.close()
        for server in self._servers:
            server.stop(timeout)
        self._servers.clear()
        if self._switch_interval is not None:
            self._switch_interval.release()
            self._switch_interval = None
        at_decision = self.invoker.at_decision
        if at_decision is not None and not at_decision.drain(timeout):  # what was answered at its decision
            log.warning("stopped with second phases still under way: recovery commits them by their marks")
        if self._owns_transport:
            self.transport.close()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> ReliableEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observing ---------------------------------------------------------------------------------

    def status(self) -> EngineStatus:
        store = self.store.status()
        pause = self.invoker.pause.status()
        return EngineStatus(**pause, waiting=store.buffered if pause["paused"] else 0,
            rms_sequences=len(store.rms), rmd_sequences=len(store.rmd), unacked=store.unacked,
            buffered=store.buffered, faulted_sequences=self.source.faulted_sequences,
            messages_sent=self.retransmission.messages_sent,
            retransmissions=self.retransmission.retransmissions,
            send_failures=self.retransmission.send_failures,
            delivered=self.invoker.delivered, delivery_failures=self.invoker.failed,
            delivery_retries=self.invoker.retries, retrying=store.retrying, poisoned=store.poisoned,
            faults_sent=self.inbound.faults_sent, refused_sequences=self.destination.refused_sequences,
            by_state=store.by_state(), control_retries=self.retransmission.control_retries,
            refused_for_budget=self.destination.refused_for_budget,
            discarded_out_of_order=self.destination.discarded_out_of_order,
            delivered_on_receipt=self.destination.delivered_on_receipt,
            unreachable_peers=self.retransmission.reachability.unreachable(),
            probes_sent=self.retransmission.reachability.probes_sent,
            peer_outages=self.retransmission.reachability.outages)

    # -- the poison store (see wsrm_plugin.poison) ---------------------------------------------

    def poison_messages(self, sequence_id: str | None = None) -> list[PoisonMessage]:
        """Messages given up after their last retry cycle, kept until an operator decides."""
        return poison.list_poison(self.store, sequence_id)

    def poison_message(self, poison_id: str) -> PoisonMessage:
        """One poison message by its ``"<sequence id>#<number>"`` id."""
        return poison.get_poison(self.store, poison_id)

    def retry_poison(self, poison_id: str) -> PoisonMessage:
        """Put a poison message back for delivery (in order, in its sequence), its attempts reset."""
        found = poison.retry_poison(self.store, poison_id)
        self._wake_invoker()
        return found

    def discard_poison(self, poison_id: str) -> PoisonMessage:
        """Delete a poison message for good; its sequence goes on without it."""
        found = poison.discard_poison(self.store, poison_id)
        self._wake_invoker()
        return found

    def wait_until(self, predicate: Callable[[EngineStatus], bool], timeout: float) -> bool:
        """Poll :meth:`status` until ``predicate`` holds; False after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            if predicate(self.status()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
