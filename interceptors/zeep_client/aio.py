"""The asyncio face of a reliable client: ``rc = reliable_client(zeep.AsyncClient(...), store=...)``.

::

    rc = reliable_client(zeep.AsyncClient("http://orders:8080/?wsdl"), store="sqlite:///client.db",
                         start=False)
    async with rc:                                   # started in a thread, not on the loop
        receipt = await rc.service.place("book")    # one-way: returns once stored
        price = await rc.service.quote("book")      # request-reply: the reply's result
        reply = await rc.enqueue.quote("pen")       # stored; reply is an asyncio.Future
        await rc.flush()

The engine is the synchronous one, with its threads, its store and its
policy: nothing of WS-RM runs on the event loop.  What a call must do before
it returns (serialize with zeep, validate, write the store, which may wait
for an fsync or a lock) runs in the client's *lane*, one thread per client
that takes the calls in the order they were made, so the calls one task
makes are stored, and delivered, in that order.  The loop only puts the call
in the lane's queue and gets the answer back through
``loop.call_soon_threadsafe``: neither blocks.  A reply, resolved by the
engine's invoker thread, comes to the awaiting task the same way.

Transactions are the thread-bound ``txmanager`` ones: every task of an event
loop runs in the loop's thread and would share a transaction bound there,
so a call made while one is bound to the loop's thread is refused
(:class:`~interceptors.zeep_client.errors.TransactionNotJoined`).  Run the
transactional unit in the lane instead, where the synchronous client joins
it as it always does::

    def order(sync, item):                           # runs in the client's lane, in a transaction
        with orders_ds.connection() as conn:
            conn.cursor().execute("INSERT INTO orders VALUES (%s)", (item,))
        return sync.service.place(item)
    receipt = await rc.run_in_transaction(order, "book")
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from txmanager.manager import current_transactions

from interceptors.aio_bridge import Lane
from interceptors.zeep_client.errors import TransactionNotJoined

__all__ = ["AsyncReliableClient", "is_async_client", "sync_twin"]

log = logging.getLogger(__name__)


def is_async_client(client: Any) -> bool:
    """Is ``client`` a ``zeep.AsyncClient`` (its transport's ``post_xml`` a coroutine function)?"""
    import inspect

    import zeep

    return isinstance(client, zeep.AsyncClient) or inspect.iscoroutinefunction(
        getattr(getattr(client, "transport", None), "post_xml", None))


def sync_twin(client: Any) -> Any:
    """A ``zeep.Client`` on ``client``'s WSDL, settings and plugins, posting with its ``wsdl_client``.

    The reliable client builds its calls with zeep in its lane, synchronously:
    the twin shares the parsed WSDL (nothing is loaded again) and leaves
    ``client`` as it was.
    """
    import zeep

    from interceptors.zeep_client.httpx_transport import SyncTwinTransport

    twin = zeep.Client.__new__(zeep.Client)
    twin.__dict__.update(client.__dict__)
    twin.plugins = list(client.plugins)
    twin.transport = SyncTwinTransport(client.transport)
    twin._default_service = None  # bound again, on the twin: a synchronous ServiceProxy
    return twin


def _refuse_loop_transaction() -> None:
    """A txmanager transaction bound to the loop's thread belongs to every task of the loop."""
    current = current_transactions()
    if current:
        manager, tx = current[0]
        raise TransactionNotJoined(
            f"transaction {tx.xid} of {manager!r} is bound to the event loop's thread, where every task "
            "shares it: the call is not made.  Run the transactional unit in the client's lane with "
            "await rc.run_in_transaction(fn, ...) (fn gets the synchronous client), or in a thread of yours")


class _AsyncOperation:
    def __init__(self, owner: AsyncReliableClient, name: str, wait_reply: bool) -> None:
        self._owner = owner
        self._name = name
        self._wait_reply = wait_reply

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = self._owner
        if self._wait_reply:
            return owner.call(self._name, *args, **kwargs)
        return owner.submit(self._name, *args, **kwargs)


class _AsyncService:
    def __init__(self, owner: AsyncReliableClient, wait_reply: bool) -> None:
        self._owner = owner
        self._wait_reply = wait_reply

    def __getattr__(self, name: str) -> _AsyncOperation:
        if name.startswith("_"):
            raise AttributeError(name)
        getattr(self._owner.sync.service, name)  # AttributeError for an operation the WSDL lacks
        return _AsyncOperation(self._owner, name, self._wait_reply)


class AsyncReliableClient:
    """A reliable client whose calls are awaited (see the module docstring).

    ``sync`` is the :class:`~interceptors.zeep_client.client.ReliableClient`
    underneath (same engine, same store): use it from threads, and inside
    :meth:`run_in_transaction`.  ``service.Op(...)`` awaits the call's
    outcome: the :class:`~wsrm_plugin.engine.SendReceipt` of a one-way call
    once stored, the reply's result (or its fault, raised) of an in-out
    call.  ``enqueue.Op(...)`` returns once the call is stored: the receipt,
    or an ``asyncio.Future`` of the reply.  The per-call options of the
    synchronous client (``_callback``, ``_context``) are the same.
    """

    def __init__(self, sync: Any) -> None:
        self.sync = sync
        self._lane = Lane(f"wsrm-lane-{sync.name}")
        self._siblings: list[AsyncReliableClient] = []
        self.service = _AsyncService(self, wait_reply=True)
        self.enqueue = _AsyncService(self, wait_reply=False)

    # -- calls ----------------------------------------------------------------------------------

    async def submit(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """Store ``operation``'s call; its receipt (one-way) or an asyncio.Future of its reply."""
        _refuse_loop_transaction()
        outcome = await self._lane.submit(lambda: self.sync.call(operation, *args, _caller_waits=False, **kwargs))
        if isinstance(outcome, Future):
            return asyncio.wrap_future(outcome)
        return outcome

    async def call(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """Store ``operation``'s call and, for an in-out one, wait for its reply's result."""
        outcome = await self.submit(operation, *args, **kwargs)
        if isinstance(outcome, asyncio.Future):
            return await outcome
        return outcome

    async def run_in_transaction(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        """``fn(sync_client, *args)`` in the lane, inside a transaction of the client's ``tm``.

        Committed when ``fn`` returns, rolled back when it raises (the
        exception comes back here); calls made in it on the synchronous client
        are enqueued in that transaction, as in a threaded program.
        """
        tm = self.sync.tm
        if tm is None:
            raise ValueError("run_in_transaction needs the client's transaction manager: "
                             "reliable_client(..., tm=TransactionManager(...))")

        def unit() -> Any:
            with tm.transaction(timeout=timeout):
                return fn(self.sync, *args)

        return await self._lane.submit(unit)

    async def _in_lane(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._lane.submit(fn, *args)

    # -- lifecycle and the rest of the synchronous client, off the loop ---------------------------

    async def start(self) -> AsyncReliableClient:
        """Recovery, then the engine's workers (see ``ReliableClient.start``), in the lane."""
        await self._in_lane(self.sync.start)
        return self

    async def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything this client enqueued is acknowledged (``ReliableClient.flush``).

        Not in the lane: calls made meanwhile are not held up behind it.
        """
        await asyncio.to_thread(self.sync.flush, timeout)

    async def close(self, target: str | None = None) -> int:
        """End this client's sequences once their messages are acknowledged."""
        return int(await self._in_lane(self.sync.close, target))

    async def resend_faulted(self, sequence: str | None = None) -> Any:
        return await self._in_lane(self.sync.resend_faulted, sequence)

    async def unacknowledged(self) -> Any:
        return await asyncio.to_thread(self.sync.unacknowledged)

    async def health(self, *, max_unacknowledged: int | None = None, max_age: float | None = None,
                     max_unreachable_peers: int | None = None) -> Any:
        """The client's :class:`~interceptors.zeep_client.health.ClientHealth` (reads the store;
        thresholds as ``ReliableClient.health``'s)."""
        return await asyncio.to_thread(self.sync.health, max_unacknowledged=max_unacknowledged, max_age=max_age,
                                       max_unreachable_peers=max_unreachable_peers)

    async def stop(self, timeout: float = 10.0, *, discard_unsent: bool = False) -> None:
        """Stop the client (``ReliableClient.stop``), after the calls already submitted."""
        await self._in_lane(lambda: self.sync.stop(timeout, discard_unsent=discard_unsent))
        for lane in [self._lane, *(sibling._lane for sibling in self._siblings)]:
            await asyncio.to_thread(lane.close, timeout)

    def with_key(self, key: str) -> AsyncReliableClient:
        """Another client on this engine sending on sequences of its own (``ReliableClient.with_key``),
        with a lane of its own: its calls are not held up behind this client's."""
        sibling = AsyncReliableClient(self.sync.with_key(key))
        self._siblings.append(sibling)
        return sibling

    async def __aenter__(self) -> AsyncReliableClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- what the synchronous client says, read without the store -------------------------------

    @property
    def engine(self) -> Any:
        return self.sync.engine

    @property
    def name(self) -> str:
        return str(self.sync.name)

    @property
    def key(self) -> str:
        return str(self.sync.key)

    @property
    def tm(self) -> Any:
        return self.sync.tm

    @property
    def lifecycle_report(self) -> Any:
        return self.sync.lifecycle_report

    @property
    def listener_address(self) -> str | None:
        return self.sync.listener_address

    def pending_futures(self) -> int:
        return int(self.sync.pending_futures())
