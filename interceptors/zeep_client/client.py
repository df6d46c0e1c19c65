"""Reliable messaging for a zeep client: ``rc = reliable_client(zeep_client, store=..., listen=...)``.

::

    client = zeep.Client("http://orders.example/?wsdl")
    rc = reliable_client(client, store="sqlite:///client.db", listen=("0.0.0.0", 8081), key="orders")
    rc.service.Cancel(order=7)                       # one-way: enqueued, returns its SendReceipt
    future = rc.service.Quote(item="x")              # in-out: a concurrent.futures.Future
    rc.service.Quote(item="y", _callback="shop.replies:on_quote")   # survives a restart
    with tm.transaction():                           # enqueue atomically with the caller's DB work
        with ds.connection() as conn: ...
        rc.service.Cancel(order=8)
    rc.close(); rc.stop()

The zeep client passed in stays a plain zeep client: ``client.service.Op(...)``
still calls the service synchronously and returns its answer (the reliable
client works on its own copy, ``rc.zeep``).  Nothing is sent in the caller's thread: the call is stored in the RM Source
(in the caller's transaction, when a ``txmanager`` transaction is current)
and the engine's worker delivers it, retransmitting until acknowledged.

Replies of in-out calls come back reliably on the sequence the client
offered, to the client's listener (``listen``: the engine's HTTP endpoint,
the AcksTo/ReplyTo of a dual-channel client).  Without a listener the
client offers with the anonymous address and asks for replies with an
anonymous ReplyTo: acknowledgements and replies then come in the HTTP
responses to its requests (the server waits, bounded, for the reply; a
request whose response was lost is retransmitted and answered with the
stored reply), and the client acknowledges each reply at once.  The reply is deserialized with the zeep
client's binding and handed to the persisted callback (an import path, so
it is found again after a restart) and to the call's future, if the
process that made the call is still the one running.

Failures reach the caller:

* a call is refused at once, with nothing stored, when its arguments do not
  fit the WSDL (zeep's ``ValidationError``), when a ``txmanager`` transaction
  is current that the client cannot join (:class:`TransactionNotJoined`:
  pass ``tm=``), or when the service refused to open a sequence
  (:class:`SequenceRefused`, until the faulted sequence is resent);
* when a sequence is faulted (the peer refused it, or ``max_retries`` ran
  out), the futures of its in-out calls fail with :class:`SequenceFaulted`
  (:class:`SequenceRefused` for a refusal) and their persisted callbacks get
  a :class:`ReliableReply` whose ``fault`` is that exception.  The messages
  stay in the store, faulted, with the reason (``wsrm status``), until
  :meth:`ReliableClient.resend_faulted` or ``wsrm resend`` sends them again
  on a new sequence; an ``on_sequence_fault`` hook (see
  :class:`ReliableClient`) takes them over instead;
* :meth:`ReliableClient.flush` waits until everything is acknowledged and
  says what is not; ``stop()`` on a memory store refuses to drop unsent messages.

Calls from several threads: the messages of one sequence are delivered in
order, one after the other, so a service can work on several sequences at
once but on one sequence's messages only in turn.  Give each thread a key of
its own on one engine, ``rc.with_key("orders-2")`` (listed in
``active_keys``), rather than a :func:`reliable_client` each: every key
keeps its calls' order, and one sender carries them all.

A client that must be able to restart while its server is down builds its
zeep client with :class:`~interceptors.zeep_client.wsdl_cache.StoredWsdlTransport`
(``zeep.Client(url, transport=StoredWsdlTransport(store))``): the WSDL is kept
in the store and read from there when the server cannot be reached.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, overload

import zeep
from zeep.proxy import ServiceProxy

from interceptors.chain import InterceptorChain
from interceptors.zeep_client.adapter import engage_client
from interceptors.zeep_client.call_future import CallFuture
from interceptors.zeep_client.aio import AsyncReliableClient, is_async_client, sync_twin
from interceptors.zeep_client.health import ClientHealth, client_health
from interceptors.zeep_client.httpx_transport import HttpxTransport
from interceptors.zeep_client.session import ZeepSessionTransport
from interceptors.zeep_client.wsdl_policy import policy_from_wsdl
from interceptors.zeep_client.errors import (
    NotAcknowledged,
    ReplyNotDelivered,
    TransactionNotJoined,
    UnsentMessages,
)
from interceptors.zeep_client.reliable import (
    CallOptions,
    ReliableClientInterceptor,
    ReliableReply,
    current_call,
    deserialize_reply,
    import_callback,
    register_client,
    unregister_client,
)
from interceptors.zeep_client.validate import validate_request
from wsrm_plugin.engine import ReliableEngine, RMPolicy, SendReceipt
from wsrm_plugin.engine.resend import ResendResult
from wsrm_plugin.engine.source import (
    CREATE_REFUSED,
    SequenceFault,
    SequenceFaulted,
    SequenceKey,
    SequenceRefused,
)
from wsrm_plugin.lifecycle import LifecycleListener, LifecycleReport, check_recovery_interval
from wsrm_plugin.makeconnection import Poller, mc_address_for
from wsrm_plugin.store import StorageManager
from wsrm_plugin.wire.namespaces import mc_anonymous_id

__all__ = ["reliable_client", "ReliableClient", "ReliableReply", "ReplyNotDelivered", "TransactionNotJoined",
           "NotAcknowledged", "UnsentMessages", "SequenceFaulted", "SequenceRefused"]

log = logging.getLogger(__name__)


#: How many replies' callback runs a client remembers to flag a second run in the same process.
_DISPATCHED_KEPT = 10_000


class _ResolveOnRollback:
    """Fails a call's future when the transaction that enqueued the call rolls back."""

    def __init__(self, future: Future) -> None:
        self.future = future

    def before_completion(self) -> None:
        pass

    def after_completion(self, status: Any) -> None:
        from txmanager import Status

        if status != Status.COMMITTED and not self.future.done():
            self.future.set_exception(ReplyNotDelivered(
                "the transaction that enqueued this call rolled back: the call was never sent"))


class _Operation:
    def __init__(self, owner: ReliableClient, name: str) -> None:
        self._owner = owner
        self._name = name

    def __call__(self, *args: Any, _callback: str | None = None, _context: str | None = None,
                 **kwargs: Any) -> SendReceipt | Future:
        return self._owner.call(self._name, *args, _callback=_callback, _context=_context, **kwargs)


class _Service:
    """``rc.service.Op(...)``: like zeep's service proxy, returning a receipt or a future."""

    def __init__(self, owner: ReliableClient) -> None:
        self._owner = owner

    def __getattr__(self, name: str) -> _Operation:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            self._owner.zeep.service._binding.get(name)
        except ValueError as exc:  # zeep's "No such operation": an attribute error, like zeep's proxy
            raise AttributeError(f"the service has no operation {name!r}") from exc
        return _Operation(self._owner, name)


class ReliableClient:
    """A zeep client whose calls go through a WS-RM engine (see the module docstring).

    Build it with :func:`reliable_client`.  ``name`` identifies the client
    in the store (replies are dispatched to the client of that name) and must
    be the same after a restart; ``key`` separates its sequences from other
    clients' sharing the store.

    Faulted sequences: ``reliable_client(..., on_sequence_fault=hook)``
    passes ``hook(fault: SequenceFault)`` to the engine; it is called once a
    sequence is given up, with its reason and unacknowledged messages, after
    this client failed the calls' futures and callbacks, and the messages
    are then the hook's (deleted from the store).  Without a hook they stay
    in the store for :meth:`resend_faulted` / ``wsrm resend``.
    """

    def __init__(self, client: zeep.Client, engine: ReliableEngine, *, name: str, key: str = "",
                 callback: str | None = None, chain: InterceptorChain | None = None, tm: Any = None,
                 active_keys: Iterable[str] | None = None,
                 lifecycle_hooks: Any = None, make_connection: bool = False,
                 poll_interval: float = 0.2, recovery_interval: float | None = None) -> None:
        check_recovery_interval(recovery_interval, tm)
        self.zeep = client
        self.engine = engine
        self.name = name
        self.key = key
        self.tm = tm
        #: the sequence keys the lifecycle listener keeps (see :func:`reliable_client`)
        self.active_keys = frozenset(active_keys) if active_keys is not None else frozenset({key})
        self._callback = callback
        #: False for a client made by :meth:`with_key`: the engine is the first client's to start
        #: and stop, and so is the lifecycle listener's recovery
        self._owns_engine = True
        self._keyed: list[ReliableClient] = []  # made by with_key(): stopped with this one
        self.recovery_interval = recovery_interval
        self._futures: dict[str, Future] = {}
        #: In-out calls with no reply callback, by request message id: their operation.  Their
        #: future is resolved as soon as the reply is recorded (:meth:`_reply_recorded`), not
        #: when an invoker thread delivers it later.
        self._resolve_on_receipt: dict[str, str] = {}
        #: Requests whose future was resolved on receipt: their delivery has nothing more to do.
        self._resolved_on_receipt: set[str] = set()
        #: Replies read by :meth:`_consumes_reply` in the transaction recording them, by request
        #: message id: (result, fault), for :meth:`_reply_recorded` after the commit.
        self._consuming: dict[str, tuple[Any, Any]] = {}
        #: Requests whose future was resolved before their reply's record
        #: (:meth:`_answer_before_record`): that record consumes the reply.  A record that fails
        #: leaves its request here on purpose: the request stays unacknowledged (its
        #: acknowledgement rides on that record), so it is sent again, the service answers with
        #: its stored reply, and that copy's record finds the request here and consumes it in its
        #: own transaction (:meth:`_consumes_reply`), which then removes it
        #: (:meth:`_reply_recorded`).  Removed on failure, the copy would be buffered and cost a
        #: second transaction, its delivery's.  A request whose copy never comes (its sequence
        #: ended first) keeps its entry until the client stops.
        self._answered_early: set[str] = set()
        self._targets: set[str] = set()
        self._lock = threading.Lock()
        self._started = False
        self._refused: dict[str, SequenceFault] = {}  # target -> the refusal, until resent
        #: Replies that may have reached a callback before: received before this start and not
        #: delivered then (sequence id -> numbers), and those whose callback this process started.
        self._waiting_at_start: dict[str, Any] = {}
        self._dispatched: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._told: set[str] = set()  # faulted sequences whose calls were told
        self.lifecycle_report: LifecycleReport | None = None
        self.interceptor = ReliableClientInterceptor(
            engine, client_name=name, key=key, is_one_way=self.is_one_way, default_callback=callback,
            on_enqueued=self._enqueued, check=self._check_call)
        engine.source.fault_listeners.append(self._on_sequence_fault)
        engine.destination.recorded_listeners.append(self._reply_recorded)
        engine.destination.reply_consumers.append(self._consumes_reply)
        engine.destination.reply_answerers.append(self._answer_before_record)
        self.chain = chain if chain is not None else InterceptorChain([], load_entry_points=False)
        self.chain.add(self.interceptor)
        self._unengaged = _own_copy(client)  # what with_key() engages a chain of its own on
        engage_client(client, self.chain)
        self.service = _Service(self)
        self._lifecycle = LifecycleListener(
            engine, tm=tm, active_keys=set(self.active_keys),
            hooks=lifecycle_hooks if lifecycle_hooks is not None else self.chain.plugins.hook)
        self.poller: Poller | None = None
        if make_connection:
            if engine.endpoint_address is None or mc_anonymous_id(engine.endpoint_address) is None:
                raise ValueError("make_connection needs the engine's endpoint_address to be a WS-MC "
                                 "anonymous URI (reliable_client sets it when listen is None)")
            self.poller = Poller(engine, engine.endpoint_address, self.poll_targets, interval=poll_interval)
        register_client(name, self)

    def poll_targets(self) -> list[str]:
        """Servers to poll with MakeConnection: those called, and those with sequences in the store."""
        with self._lock:
            targets = set(self._targets)
        with self.engine.store.begin() as tx:
            for seq in tx.rms.list_all():
                parsed = SequenceKey.decode(seq.key)
                if parsed is not None and parsed.key == self.key:
                    targets.add(parsed.target)
        return sorted(targets)

    # -- calls ----------------------------------------------------------------------------------

    def is_one_way(self, operation: str | None) -> bool:
        """True when the WSDL operation has no output message."""
        if operation is None:
            return True
        op = self.zeep.service._binding.get(operation)
        return getattr(op.abstract, "output_message", None) is None

    def call(self, operation: str, *args: Any, _callback: str | None = None, _context: str | None = None,
             _caller_waits: bool = True, **kwargs: Any) -> SendReceipt | Future:
        """Enqueue ``operation``; a one-way call returns its receipt, an in-out call a Future.

        ``_callback`` (``"package.module:function"``, taking a :class:`ReliableReply`)
        is persisted with the message and called when the reply arrives, even
        after a restart; ``_context`` is a string handed back to it as
        ``reply.user_context``.  The future holds the result or the fault.  A caller
        that waits for it with ``result()`` sends the request from its own thread when
        nothing else is being sent on its sequence (:mod:`.call_future`);
        ``_caller_waits=False`` says it will not (an asyncio caller): the sender sends
        the request at once.
        """
        one_way = self.is_one_way(operation)
        if one_way and (_callback or _context):
            raise ValueError(f"{operation} is one-way: it has no reply for a callback")
        if _callback is not None:
            import_callback(_callback)
        options = CallOptions(callback=_callback, user_context=_context, one_way=one_way,
                              future=None if one_way else CallFuture() if _caller_waits else Future(),
                              operation=operation)
        token = current_call().set(options)
        try:
            getattr(self.zeep.service, operation)(*args, **kwargs)
        finally:
            current_call().reset(token)
        if options.receipt is None:
            raise RuntimeError(f"{operation} was not enqueued: the reliable interceptor did not run "
                               "(is another interceptor consuming the request first?)")
        return options.receipt if one_way else options.future  # type: ignore[return-value]

    def _check_call(self, message: Any) -> None:
        """Refuse, before anything is stored, a call that would be lost or fail later."""
        self._check_transaction()
        with self._lock:
            refusal = self._refused.get(message.address)
        if refusal is not None and not self._still_refused(refusal):
            with self._lock:
                self._refused.pop(message.address, None)
            refusal = None
        if refusal is not None:
            raise SequenceRefused(
                f"{refusal.target} refused to open a reliable sequence ({refusal.reason}); calls are refused "
                f"until the cause is fixed and the faulted sequence {refusal.sequence_key} is resent "
                "(rc.resend_faulted(), `wsrm resend`)", reason=refusal.reason, sequence_key=refusal.sequence_key,
                sequence_id=refusal.sequence_id, target=refusal.target)
        validate_request(self.zeep.wsdl.types, message.envelope)

    def _still_refused(self, refusal: SequenceFault) -> bool:
        """Is the refused sequence still in the store, faulted (not resent, maybe by `wsrm resend`)?"""
        with self.engine.store.begin() as tx:
            seq = tx.rms.get(refusal.sequence_key)
        return seq is not None and seq.faulted

    def _check_transaction(self) -> None:
        from txmanager.manager import current_transactions

        current = current_transactions()
        if not current:
            return
        if self.tm is None:
            manager, tx = current[0]
            raise TransactionNotJoined(
                f"transaction {tx.xid} of {manager!r} is current in this thread, but reliable client "
                f"{self.name!r} was built without tm=: the call would be enqueued outside it and sent even if "
                "it rolls back.  Pass tm=<that TransactionManager> to reliable_client(), or make the call "
                "outside the transaction (tm.suspend() first)")
        if self.tm.get_transaction() is None:
            manager, tx = current[0]
            raise TransactionNotJoined(
                f"transaction {tx.xid} of {manager!r} is current in this thread, not one of the client's "
                f"transaction manager {self.tm!r}: the call could not join it")

    def _on_sequence_fault(self, fault: SequenceFault) -> None:
        """A sequence of this engine faulted: fail its calls' futures and callbacks (worker thread)."""
        from interceptors.zeep_client.reliable import (
            DISPATCH_PATH,
            decode_reply_context,
        )

        parsed = SequenceKey.decode(fault.sequence_key)
        if parsed is None or parsed.key != self.key:
            return
        with self._lock:
            if fault.sequence_key in self._told:  # the engine's hook failed and the report is repeated
                return
            self._told.add(fault.sequence_key)
        error = fault.error()
        if fault.refused:
            with self._lock:
                self._refused[fault.target] = fault
        for failed in fault.messages:
            with self._lock:
                future = self._futures.pop(failed.message_id, None)
                self._resolve_on_receipt.pop(failed.message_id, None)
            if future is not None and not future.done():
                future.set_exception(error)
            if failed.reply_callback != DISPATCH_PATH:
                continue
            try:
                info = decode_reply_context(failed.reply_context)
            except ValueError:
                continue
            if info.get("client") != self.name or not info.get("callback"):
                continue
            reply = ReliableReply(operation=info["operation"], request_message_id=failed.message_id,
                                  envelope=b"", fault=error, user_context=info.get("context"))
            try:
                import_callback(info["callback"])(reply)
            except Exception:  # the other callers must still be told
                log.exception("reply callback %s failed on the faulted call %s", info["callback"],
                              failed.message_id)

    def resend_faulted(self, sequence: str | None = None) -> list[ResendResult]:
        """Send this client's faulted sequences' messages again on new sequences (the cause is fixed).

        ``sequence`` (an id or store key) picks one; by default every faulted
        sequence of this client's key.  Calls refused because the service
        refused a sequence are accepted again.
        """
        from wsrm_plugin.engine.resend import faulted_sequences

        if sequence is not None:
            keys = [sequence]
        else:
            keys = [k for k, _, _ in faulted_sequences(self.engine.store)
                    if (p := SequenceKey.decode(k)) is not None and p.key == self.key]
        results = [self.engine.resend_faulted(k) for k in keys]
        with self._lock:
            for result in results:
                parsed = SequenceKey.decode(result.faulted_key)
                if parsed is not None:
                    self._refused.pop(parsed.target, None)
        return results

    def _load_refusals(self) -> None:
        """A restarted client refuses calls to a target that refused a sequence, as before the restart."""
        with self.engine.store.begin() as tx:
            for seq in tx.rms.list_all():
                parsed = SequenceKey.decode(seq.key)
                if seq.faulted and parsed is not None and parsed.key == self.key \
                        and (seq.fault_reason or "").startswith(CREATE_REFUSED):
                    self._refused[seq.target] = SequenceFault(seq.key, seq.target, seq.sequence_id,
                                                              seq.fault_reason or "", ())

    def _enqueued(self, target: str, receipt: SendReceipt, options: CallOptions) -> None:
        with self._lock:
            self._targets.add(target)
            if options.future is not None:
                self._futures[receipt.message_id] = options.future
                if not (options.callback or self._callback) and options.operation:
                    self._resolve_on_receipt[receipt.message_id] = options.operation
        gtx = self.tm.get_transaction() if self.tm is not None else None
        if gtx is not None and options.future is not None:
            gtx.register_synchronization(_ResolveOnRollback(options.future))
        if isinstance(options.future, CallFuture):
            # read when the caller waits, after its transaction committed: a request enqueued in
            # a global transaction may be numbered by its commit (ReceiptAtCommit)
            options.future.send_when_waited(
                lambda: self.engine.send_for_caller(receipt.sequence_key, receipt.number),
                lambda: self.engine.leave_to_sender(receipt.sequence_key, receipt.number), self._longest_send())

    def _longest_send(self) -> float | None:
        """How long the engine's send of a request can take at most (None: unknown): its HTTP
        timeout (zeep's operation timeout when it has one) for each of the transport's two tries."""
        zeep_transport = getattr(self.zeep, "transport", None)
        timeouts = [t for t in (getattr(self.engine.transport, "timeout", None),
                                getattr(getattr(zeep_transport, "_inner", zeep_transport), "operation_timeout", None))
                    if isinstance(t, (int, float))]
        return 2 * max(timeouts) if timeouts else None

    def _answer_before_record(self, envelope: bytes, addressing: Any) -> bool:
        """A reply read from the response to our request, before its record
        (``Destination.reply_answerers``): if it answers a call of this client whose future
        resolves on it (no callback), resolve that future now, and let the record that
        follows off the caller's path consume the reply (:meth:`_consumes_reply`).  The caller
        has its answer a store round trip sooner.  A reply that cannot be read is left to its
        record, as before."""
        request = addressing.relates_to
        if request is None:
            return False
        with self._lock:
            operation = self._resolve_on_receipt.get(request)
            future = self._futures.get(request)
        if operation is None or future is None or future.done():
            return False
        try:
            result, fault = deserialize_reply(self.zeep, operation, envelope, self.engine.policy.max_message_size)
        except Exception:  # noqa: BLE001 -- its record and delivery read it again and report it
            return False
        with self._lock:
            if self._futures.pop(request, None) is not future:
                return False  # resolved (or cancelled) meanwhile
            del self._resolve_on_receipt[request]
            # its record consumes it; should the record buffer it instead, its delivery has
            # nothing more to do (as for a reply resolved on its record)
            self._answered_early.add(request)
            self._resolved_on_receipt.add(request)
        if fault is not None:
            future.set_exception(fault)
        else:
            future.set_result(result)
        return True

    def _consumes_reply(self, envelope: bytes, addressing: Any) -> bool:
        """In the transaction that records a message: is it the reply to a call of this client
        whose future resolves on it (no callback)?  Then its delivery would only consume it, and
        the destination takes it in that transaction instead (``Destination.reply_consumers``):
        one store transaction per reply instead of two.  The reply is read here, so one that
        cannot be read is buffered and left to its delivery, which reports it."""
        request = addressing.relates_to
        if request is None:
            return False
        with self._lock:
            if request in self._answered_early:
                return True  # its future has it: the record only consumes it
            operation = self._resolve_on_receipt.get(request)
            future = self._futures.get(request)
        if operation is None or future is None or future.done():
            return False
        try:
            parsed = deserialize_reply(self.zeep, operation, envelope, self.engine.policy.max_message_size)
        except Exception:  # noqa: BLE001 -- the delivery reads it again and reports what is wrong
            return False
        with self._lock:
            self._consuming[request] = parsed
        return True

    def _reply_recorded(self, envelope: bytes, addressing: Any, *, consumed: bool = False) -> None:
        """A message was recorded for delivery, or consumed (the receiving thread, after its
        commit): if it is the reply to a call of this client that has a future and no callback,
        resolve the future now.  The reply is in the store already, exactly as when the invoker
        delivers it (which then only consumes it): the caller does not wait for an invoker thread
        and its delivery transaction.  A reply that cannot be read is left to that delivery,
        which reports it."""
        request = addressing.relates_to
        if request is None:
            return
        with self._lock:
            if request in self._answered_early:  # answered before this record
                self._answered_early.discard(request)
                if consumed:
                    self._resolved_on_receipt.discard(request)
                return
            parsed = self._consuming.pop(request, None)
            operation = self._resolve_on_receipt.get(request)
            future = self._futures.get(request)
        if operation is None or future is None or future.done():
            return
        if parsed is None:
            try:
                parsed = deserialize_reply(self.zeep, operation, envelope, self.engine.policy.max_message_size)
            except Exception:  # noqa: BLE001 -- the delivery reads it again and reports what is wrong
                return
        result, fault = parsed
        with self._lock:
            if self._futures.pop(request, None) is not future:
                return  # delivered (or cancelled) meanwhile
            self._resolve_on_receipt.pop(request, None)
            if not consumed:  # its delivery is still to come, and only consumes it
                self._resolved_on_receipt.add(request)
        if fault is not None:
            future.set_exception(fault)
        else:
            future.set_result(result)

    def _on_reply(self, envelope: bytes, context: Any, info: dict[str, Any]) -> None:
        """A reply arrived (invoker thread, inside the delivery transaction)."""
        operation = info["operation"]
        with self._lock:
            self._consuming.pop(context.relates_to, None)  # read for a consumption that rolled back
        if not info.get("callback"):
            with self._lock:
                if context.relates_to in self._resolved_on_receipt:
                    self._resolved_on_receipt.discard(context.relates_to)
                    return  # its future was resolved when it was recorded: nothing left to hand over
                self._resolve_on_receipt.pop(context.relates_to, None)
        result, fault = deserialize_reply(self.zeep, operation, envelope, self.engine.policy.max_message_size)
        reply = ReliableReply(operation=operation, request_message_id=context.relates_to, envelope=envelope,
                              result=result, fault=fault, user_context=info.get("context"), context=context,
                              redelivered=self._maybe_handled_before(context))
        if info.get("callback"):
            import_callback(info["callback"])(reply)  # raising rolls the delivery back: retried
        with self._lock:
            future = self._futures.pop(context.relates_to, None)
        if future is not None and not future.done():
            if fault is not None:
                future.set_exception(fault)
            else:
                future.set_result(result)

    def _maybe_handled_before(self, context: Any) -> bool:
        """Could a callback have run for this reply already (see ReliableReply.redelivered)?"""
        received, delivered = self._waiting_at_start.get(context.sequence_id, ((), ()))
        before_start = context.message_number in received and context.message_number not in delivered
        key = f"{context.sequence_id}#{context.message_number}"
        with self._lock:
            again = key in self._dispatched
            self._dispatched[key] = None
            while len(self._dispatched) > _DISPATCHED_KEPT:
                self._dispatched.popitem(last=False)
        return before_start or again

    def _note_waiting_replies(self) -> None:
        """The received replies not yet delivered when this client starts: a dead process may have
        run their callbacks without committing the delivery."""
        with self.engine.store.begin() as tx:
            for rmd in tx.rmd.list_all():
                self._waiting_at_start[rmd.sequence_id] = (rmd.received, tx.invoker.state(rmd.sequence_id).delivered)

    def pending_futures(self) -> int:
        with self._lock:
            return len(self._futures)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> ReliableClient:
        """Run the lifecycle listener (recovery first), then the engine's workers."""
        if not self._started:
            if self._owns_engine:
                self.lifecycle_report = self._lifecycle.on_start()
            elif not self.engine.started:
                raise RuntimeError(f"client {self.name!r} shares the engine of the client it was made "
                                        "from with with_key(): start that client first")
            self._load_refusals()
            self._note_waiting_replies()
            if self._on_sequence_fault not in self.engine.source.fault_listeners:  # started again after stop()
                self.engine.source.fault_listeners.append(self._on_sequence_fault)
            if self._reply_recorded not in self.engine.destination.recorded_listeners:
                self.engine.destination.recorded_listeners.append(self._reply_recorded)
            if self._consumes_reply not in self.engine.destination.reply_consumers:
                self.engine.destination.reply_consumers.append(self._consumes_reply)
            if self._answer_before_record not in self.engine.destination.reply_answerers:
                self.engine.destination.reply_answerers.append(self._answer_before_record)
            if self._owns_engine:
                self.engine.start()
                self._lifecycle.start_recovery(self.recovery_interval, self.lifecycle_report)
            if self.poller is not None:
                self.poller.start()
            self._started = True
        return self

    def with_key(self, key: str) -> ReliableClient:
        """Another client on this client's engine, whose calls go on sequences of their own (``key``).

        For calling from several threads.  The messages of one sequence are
        delivered in order, one after the other; calls under different keys go
        on different sequences, which the service delivers side by side (each
        key's calls stay in the order they were made; there is no order
        between keys).  One engine serves them all: one sender whose rounds
        carry every sequence, one store pool, one set of workers, where a
        :func:`reliable_client` per thread would run an engine each, and
        their senders would compete (``bench/bench_compare.py --clients``).

        ``key`` must be one of this client's ``active_keys``, so that after a
        restart the lifecycle listener resumes its sequences rather than
        terminating them.  The new client is started when this one is; it
        shares this one's transaction manager and reply callback, and gets
        an interceptor chain of its own (WS-RM only).  Stopping this client
        stops the new one and the engine under both; stopping the new one
        leaves them running.
        """
        if key == self.key:
            raise ValueError(f"this client already sends under key {key!r}; name another one")
        if key not in self.active_keys:
            raise ValueError(f"key {key!r} is not one of this client's active_keys "
                             f"{sorted(self.active_keys)}: name it there (reliable_client(..., active_keys=...)), "
                             "or the lifecycle listener would terminate its sequences at the next start")
        if self.poller is not None:
            raise ValueError("with_key() is not available with make_connection (a poller per client and "
                             "engine): make a reliable_client of its own for that key")
        sibling = ReliableClient(_own_copy(self._unengaged), self.engine, name=f"{self.name}/{key}", key=key,
                                 callback=self._callback, tm=self.tm, active_keys=self.active_keys)
        sibling._owns_engine = False
        self._keyed.append(sibling)
        return sibling.start() if self._started else sibling

    def close(self, target: str | None = None) -> int:
        """End this client's sequences (to ``target``, else to every target it sent to)."""
        with self._lock:
            targets = [target] if target is not None else sorted(self._targets)
        return sum(self.engine.close(t, self.key) for t in targets)

    terminate = close

    def unacknowledged(self) -> tuple[dict[str, int], dict[str, str]]:
        """This client's unacknowledged messages by sequence, and its faulted sequences' reasons."""
        left: dict[str, int] = {}
        faulted: dict[str, str] = {}
        for seq in self.engine.store.status().rms:
            parsed = SequenceKey.decode(seq.key)
            if parsed is None or parsed.key != self.key:
                continue
            name = seq.sequence_id or f"(creating: {seq.key})"
            if seq.unacked:
                left[name] = seq.unacked
            if seq.state == "faulted":
                faulted[name] = seq.fault_reason or "faulted"
        return left, faulted

    def health(self, *, max_unacknowledged: int | None = None, max_age: float | None = None,
               max_unreachable_peers: int | None = None) -> ClientHealth:
        """Is this client keeping up?  Unacknowledged calls, the oldest's age, faulted sequences,
        unreachable peers... (:mod:`~interceptors.zeep_client.health`; reads the store)."""
        return client_health(self, max_unacknowledged=max_unacknowledged, max_age=max_age,
                             max_unreachable_peers=max_unreachable_peers)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every message this client enqueued is acknowledged by the service.

        Returns when none is left; raises :class:`NotAcknowledged` (saying
        how many are left on which sequence) after ``timeout`` seconds, or at
        once when a sequence holding some is faulted: those will not be
        acknowledged until resent.  Replies to in-out calls are not waited
        for (their futures are).
        """
        deadline = time.monotonic() + timeout
        while True:
            left, faulted = self.unacknowledged()
            if not left:
                return
            if faulted or time.monotonic() >= deadline:
                total = sum(left.values())
                what = ", ".join(f"{n} on {name}" + (f" (faulted: {faulted[name]})" if name in faulted else "")
                                 for name, n in sorted(left.items()))
                why = "faulted sequences hold them" if faulted else f"not acknowledged within {timeout:g} s"
                raise NotAcknowledged(f"{total} message(s) left, {why}: {what}", left, faulted)
            time.sleep(min(self.engine.policy.poll_interval, 0.05))

    def stop(self, timeout: float = 10.0, *, discard_unsent: bool = False) -> None:
        """Stop the engine; stored messages stay for the next start.  Pending futures are cancelled.

        With a volatile store (``memory:``) nothing stays: ``stop`` first waits
        up to ``timeout`` seconds for the messages not yet acknowledged (as
        :meth:`flush`), then raises :class:`UnsentMessages` rather than lose
        them, unless ``discard_unsent=True``, which drops them at once and logs
        each one it drops.
        """
        for keyed in self._keyed:  # they cannot send without the engine
            keyed.stop(timeout, discard_unsent=discard_unsent)
        if self._started and self.engine.store.url.startswith("memory"):
            self._before_volatile_stop(discard_unsent, timeout)
        self._lifecycle.stop_recovery(timeout)
        if self.poller is not None:
            self.poller.stop(timeout)
        if self._owns_engine:
            self.engine.stop(timeout)
        unregister_client(self.name, self)
        if self._on_sequence_fault in self.engine.source.fault_listeners:
            self.engine.source.fault_listeners.remove(self._on_sequence_fault)
        if self._reply_recorded in self.engine.destination.recorded_listeners:
            self.engine.destination.recorded_listeners.remove(self._reply_recorded)
        if self._consumes_reply in self.engine.destination.reply_consumers:
            self.engine.destination.reply_consumers.remove(self._consumes_reply)
        if self._answer_before_record in self.engine.destination.reply_answerers:
            self.engine.destination.reply_answerers.remove(self._answer_before_record)
        with self._lock:
            futures, self._futures = list(self._futures.values()), {}
            self._resolve_on_receipt.clear()
            self._resolved_on_receipt.clear()
            self._consuming.clear()
            self._answered_early.clear()
        for future in futures:
            future.cancel()
        self._started = False

    def _before_volatile_stop(self, discard: bool, timeout: float) -> None:
        if not discard:
            try:
                self.flush(timeout)
            except NotAcknowledged as exc:
                raise UnsentMessages(
                    f"stopping would discard {sum(exc.left.values())} unacknowledged message(s) held only in "
                    f"memory ({exc}); flush() longer, fix the cause, or stop(discard_unsent=True) to drop them",
                    exc.left) from None
            return
        left, _ = self.unacknowledged()
        if not left:
            return
        total = sum(left.values())
        with self.engine.store.begin() as tx:
            for seq in tx.rms.list_all():
                parsed = SequenceKey.decode(seq.key)
                if parsed is None or parsed.key != self.key:
                    continue
                for msg in tx.rms_messages.list_for(seq.key):
                    if not msg.acked:
                        log.warning("reliable client %s stopping: discarding unacknowledged message %d (%s, "
                                    "action %s) of sequence %s to %s", self.name, msg.number, msg.message_id,
                                    msg.action, seq.sequence_id or seq.key, seq.target)
        log.warning("reliable client %s stopped with %d unacknowledged message(s) discarded (memory store)",
                    self.name, total)

    def __enter__(self) -> ReliableClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def listener_address(self) -> str | None:
        return self.engine.endpoint_address


@overload
def reliable_client(client: zeep.AsyncClient, store: str | StorageManager = ..., policy: RMPolicy | None = ...,
                    **options: Any) -> AsyncReliableClient: ...


@overload
def reliable_client(client: zeep.Client, store: str | StorageManager = ..., policy: RMPolicy | None = ...,
                    **options: Any) -> ReliableClient: ...


def reliable_client(client: zeep.Client, store: str | StorageManager = "memory:",
                    policy: RMPolicy | None = None, *, tm: Any = None,
                    listen: tuple[str, int] | None = None, key: str = "", name: str | None = None,
                    callback: str | None = None, chain: InterceptorChain | None = None,
                    endpoint_address: str | None = None, active_keys: Iterable[str] | None = None,
                    make_connection: bool = False, poll_interval: float = 0.2,
                    recovery_interval: float | None = None,
                    start: bool = True, wsdl_policy: bool = True,
                    **engine_options: Any) -> ReliableClient | AsyncReliableClient:
    """Make every call of ``client`` reliable (see the module docstring); returns the started client.

    A ``zeep.AsyncClient`` gives an :class:`~interceptors.zeep_client.aio.AsyncReliableClient`,
    whose calls are awaited (same engine, store and policy; see :mod:`interceptors.zeep_client.aio`); the engine
    then sends through the ``AsyncTransport``'s synchronous ``wsdl_client``
    (:mod:`.httpx_transport`).  Inside a running event loop, pass ``start=False`` and
    ``await rc.start()`` (or ``async with rc``): starting reads the store.

    ``listen=(host, port)`` serves the client's AcksTo/ReplyTo endpoint (use
    a fixed port with a durable store so replies to calls made before a
    restart still find the client); without it, replies come on the HTTP
    back-channel.
    ``endpoint_address`` is the public URL of that listener when it differs
    from the bound one (NAT, proxy).  ``callback`` is the default reply
    callback for in-out calls made straight on ``client.service``.
    ``active_keys`` are the sequence keys still in use in a shared store
    (default: just ``key``): the lifecycle listener terminates the others.
    ``make_connection=True`` (without ``listen``) is for clients that cannot
    accept connections: replies are addressed to a WS-MC anonymous URI stable
    for ``name`` and fetched by polling the server with MakeConnection every
    ``poll_interval`` seconds (the server must run a
    :class:`~wsrm_plugin.makeconnection.Mailbox`).

    ``recovery_interval`` (seconds, with a ``tm``) runs the transaction
    manager's recovery in the background while the client runs, so a branch
    a crashed transaction left prepared (in the store or the application's
    database) is resolved without a restart; None runs it only at start-up.

    ``wsdl_policy=True`` takes the WS-RM version, delivery assurance and
    timers from the WS-RM policy assertion of the service's WSDL, except
    what ``policy`` sets explicitly (:mod:`.wsdl_policy`).  Every message
    goes out through ``client``'s own HTTP session (its TLS verification,
    client certificate, proxies, auth, ``operation_timeout``:
    :class:`~interceptors.zeep_client.session.ZeepSessionTransport`) unless
    a ``transport`` is given.
    """
    asynchronous = is_async_client(client)
    if asynchronous:
        async_transport = client.transport
        client = sync_twin(client)
    if wsdl_policy:
        policy = policy_from_wsdl(client, policy)
    policy = policy or RMPolicy()
    if asynchronous:
        engine_options.setdefault("transport", HttpxTransport(
            lambda: async_transport.wsdl_client, timeout=policy.http_timeout,
            max_response_size=4 * policy.max_message_size))
    engine_options.setdefault("transport", ZeepSessionTransport(
        client, timeout=policy.http_timeout, max_response_size=4 * policy.max_message_size))
    if make_connection and listen is not None:
        raise ValueError("make_connection is for clients without a listener: pass listen=None")
    if make_connection and endpoint_address is None:
        endpoint_address = mc_address_for(name or key or "default")
    if policy.deliver_on_receive is None:
        # A reply is recorded before its callback runs, so that one whose callback ran before a
        # crash comes again flagged ``redelivered`` (ReliableReply); delivered on receipt, it
        # would come again as a new one.
        policy = dataclasses.replace(policy, deliver_on_receive=False)
    engine = ReliableEngine(store, policy, tm=tm, application=_unrelated_message(name or key or "default"),
                            endpoint_address=endpoint_address, name=f"wsrm-client-{name or key or 'default'}",
                            **engine_options)
    try:
        if listen is not None:
            host, port = listen
            engine.serve(host, port)
        rc = ReliableClient(_own_copy(client), engine, name=name or key or "default", key=key, callback=callback,
                            chain=chain, tm=tm, active_keys=active_keys, make_connection=make_connection,
                            poll_interval=poll_interval, recovery_interval=recovery_interval)
    except BaseException:
        engine.stop()
        raise
    if start:
        rc.start()
    return AsyncReliableClient(rc) if asynchronous else rc


def _own_copy(client: zeep.Client) -> zeep.Client:
    """A zeep client sharing ``client``'s WSDL and transport, for the reliable client's chain.

    The chain consumes every request it sees (enqueued, answered with an
    empty 202); engaged on the user's own client it would turn their plain
    calls into None.  The copy leaves that client as it was.
    """
    own = copy.copy(client)
    own.plugins = list(client.plugins)
    bound = client._default_service
    if bound is not None:  # bound to the original client: the same binding and options, bound to the copy
        own._default_service = ServiceProxy(own, bound._binding, **dict(bound._binding_options))
    return own


def _unrelated_message(name: str) -> Callable[[bytes, Any], None]:
    def application(envelope: bytes, context: Any) -> None:
        log.warning("reliable client %s received message %s (action %s) that answers none of its calls; "
                    "dropped", name, context.message_id, context.action)
    return application
