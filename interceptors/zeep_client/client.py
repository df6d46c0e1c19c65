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

Calls made straight on ``client.service`` are enqueued too (they return None).
Nothing is sent in the caller's thread: the call is stored in the RM Source
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

A client that must be able to restart while its server is down builds its
zeep client with :class:`~interceptors.zeep_client.wsdl_cache.StoredWsdlTransport`
(``zeep.Client(url, transport=StoredWsdlTransport(store))``): the WSDL is kept
in the store and read from there when the server cannot be reached.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import zeep

from interceptors.chain import InterceptorChain
from interceptors.zeep_client.reliable import (
    CallOptions, ReliableClientInterceptor, ReliableReply, current_call, deserialize_reply,
    import_callback, register_client, unregister_client,
)
from interceptors.zeep_client.adapter import engage_client

from wsrm_plugin.engine import ReliableEngine, RMPolicy, SendReceipt
from wsrm_plugin.engine.source import SequenceKey
from wsrm_plugin.lifecycle import LifecycleListener, LifecycleReport
from wsrm_plugin.makeconnection import Poller, mc_address_for
from wsrm_plugin.wire.namespaces import mc_anonymous_id
from wsrm_plugin.store import StorageManager

__all__ = ["reliable_client", "ReliableClient", "ReliableReply", "ReplyNotDelivered"]

log = logging.getLogger(__name__)


class ReplyNotDelivered(Exception):
    """Set on a call's future when its enqueueing transaction rolled back (nothing was sent)."""


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
    """

    def __init__(self, client: zeep.Client, engine: ReliableEngine, *, name: str, key: str = "",
                 callback: str | None = None, chain: InterceptorChain | None = None, tm: Any = None,
                 active_keys: Iterable[str] | None = None,
                 lifecycle_hooks: Any = None, make_connection: bool = False,
                 poll_interval: float = 0.2) -> None:
        self.zeep = client
        self.engine = engine
        self.name = name
        self.key = key
        self.tm = tm
        self._futures: dict[str, Future] = {}
        self._targets: set[str] = set()
        self._lock = threading.Lock()
        self._started = False
        self.lifecycle_report: LifecycleReport | None = None
        self.interceptor = ReliableClientInterceptor(
            engine, client_name=name, key=key, is_one_way=self.is_one_way, default_callback=callback,
            on_enqueued=self._enqueued)
        self.chain = chain if chain is not None else InterceptorChain([], load_entry_points=False)
        self.chain.add(self.interceptor)
        engage_client(client, self.chain)
        self.service = _Service(self)
        self._lifecycle = LifecycleListener(
            engine, tm=tm, active_keys=set(active_keys) if active_keys is not None else {key},
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
             **kwargs: Any) -> SendReceipt | Future:
        """Enqueue ``operation``; a one-way call returns its receipt, an in-out call a Future.

        ``_callback`` (``"package.module:function"``, taking a :class:`ReliableReply`)
        is persisted with the message and called when the reply arrives, even
        after a restart; ``_context`` is a string handed back to it as
        ``reply.user_context``.  The future holds the result or the fault.
        """
        one_way = self.is_one_way(operation)
        if one_way and (_callback or _context):
            raise ValueError(f"{operation} is one-way: it has no reply for a callback")
        if _callback is not None:
            import_callback(_callback)
        options = CallOptions(callback=_callback, user_context=_context, one_way=one_way,
                              future=None if one_way else Future())
        token = current_call().set(options)
        try:
            getattr(self.zeep.service, operation)(*args, **kwargs)
        finally:
            current_call().reset(token)
        if options.receipt is None:
            raise RuntimeError(f"{operation} was not enqueued: the reliable interceptor did not run "
                               "(is another interceptor consuming the request first?)")
        return options.receipt if one_way else options.future  # type: ignore[return-value]

    def _enqueued(self, target: str, receipt: SendReceipt, options: CallOptions) -> None:
        with self._lock:
            self._targets.add(target)
            if options.future is not None:
                self._futures[receipt.message_id] = options.future
        gtx = self.tm.get_transaction() if self.tm is not None else None
        if gtx is not None and options.future is not None:
            gtx.register_synchronization(_ResolveOnRollback(options.future))

    def _on_reply(self, envelope: bytes, context: Any, info: dict[str, Any]) -> None:
        """A reply arrived (invoker thread, inside the delivery transaction)."""
        operation = info["operation"]
        result, fault = deserialize_reply(self.zeep, operation, envelope, self.engine.policy.max_message_size)
        reply = ReliableReply(operation=operation, request_message_id=context.relates_to, envelope=envelope,
                              result=result, fault=fault, user_context=info.get("context"), context=context)
        if info.get("callback"):
            import_callback(info["callback"])(reply)  # raising rolls the delivery back: retried
        with self._lock:
            future = self._futures.pop(context.relates_to, None)
        if future is not None and not future.done():
            if fault is not None:
                future.set_exception(fault)
            else:
                future.set_result(result)

    def pending_futures(self) -> int:
        with self._lock:
            return len(self._futures)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> ReliableClient:
        """Run the lifecycle listener (recovery first), then the engine's workers."""
        if not self._started:
            self.lifecycle_report = self._lifecycle.on_start()
            self.engine.start()
            if self.poller is not None:
                self.poller.start()
            self._started = True
        return self

    def close(self, target: str | None = None) -> int:
        """End this client's sequences (to ``target``, else to every target it sent to)."""
        with self._lock:
            targets = [target] if target is not None else sorted(self._targets)
        return sum(self.engine.close(t, self.key) for t in targets)

    terminate = close

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine; stored messages stay for the next start.  Pending futures are cancelled."""
        if self.poller is not None:
            self.poller.stop(timeout)
        self.engine.stop(timeout)
        unregister_client(self.name, self)
        with self._lock:
            futures, self._futures = list(self._futures.values()), {}
        for future in futures:
            future.cancel()
        self._started = False

    def __enter__(self) -> ReliableClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def listener_address(self) -> str | None:
        return self.engine.endpoint_address


def reliable_client(client: zeep.Client, store: str | StorageManager = "memory:",
                    policy: RMPolicy | None = None, *, tm: Any = None,
                    listen: tuple[str, int] | None = None, key: str = "", name: str | None = None,
                    callback: str | None = None, chain: InterceptorChain | None = None,
                    endpoint_address: str | None = None, active_keys: Iterable[str] | None = None,
                    make_connection: bool = False, poll_interval: float = 0.2,
                    start: bool = True, **engine_options: Any) -> ReliableClient:
    """Make every call of ``client`` reliable (see the module docstring); returns the started client.

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
    """
    if make_connection and listen is not None:
        raise ValueError("make_connection is for clients without a listener: pass listen=None")
    if make_connection and endpoint_address is None:
        endpoint_address = mc_address_for(name or key or "default")
    engine = ReliableEngine(store, policy, tm=tm, application=_unrelated_message(name or key or "default"),
                            endpoint_address=endpoint_address, name=f"wsrm-client-{name or key or 'default'}",
                            **engine_options)
    try:
        if listen is not None:
            host, port = listen
            engine.serve(host, port)
        rc = ReliableClient(client, engine, name=name or key or "default", key=key, callback=callback,
                            chain=chain, tm=tm, active_keys=active_keys, make_connection=make_connection,
                            poll_interval=poll_interval)
    except BaseException:
        engine.stop()
        raise
    return rc.start() if start else rc


def _unrelated_message(name: str) -> Callable[[bytes, Any], None]:
    def application(envelope: bytes, context: Any) -> None:
        log.warning("reliable client %s received message %s (action %s) that answers none of its calls; "
                    "dropped", name, context.message_id, context.action)
    return application
