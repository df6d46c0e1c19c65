"""Make an existing spyne service reliable with one call: :func:`reliable_service`.

::

    service = reliable_service(Application([OrderService], tns=..., in_protocol=Soap11(),
                                           out_protocol=Soap11()),
                               store="sqlite:///var/rm.db", policy=RMPolicy(), tm=tm)
    service.serve("0.0.0.0", 8080)      # or hand service.wsgi_app to gunicorn/waitress, then start()
    service.start()                     # the engine's workers: acks, replies, the invoker

What happens to a request: the chain's WS-RM interceptor
(:class:`~interceptors.spyne_server.reliable.ReliableMessagingInterceptor`) stores it in
the engine's destination and answers 202; the engine's invoker worker later
runs the spyne method in its own thread, inside one transaction that also
takes the message out of the store and enqueues the method's reply on the
offered sequence.  With ``tm`` (a ``txmanager.TransactionManager``) that is an
XA transaction and the method's database work joins it::

    @rpc(Unicode)
    def place(ctx, item):
        with orders_ds.connection() as conn:     # txmanager.postgres.XADataSource: enlisted
            conn.cursor().execute("INSERT INTO orders VALUES (%s)", (item,))
        delivery = delivery_context(ctx)          # sequence id, message number, ...

A method that raises rolls all of it back.  Its own ``spyne.Fault`` (a
declared application fault) then goes back on the response sequence in a
new transaction (retried up to the policy's ``max_delivery_attempts`` first,
except Client/Sender faults).  Any other exception (a database down, a bug),
or a request spyne cannot read, is a failure to process: the message stays
in the store, is retried with backoff and in retry cycles, and finally kept
in the poison store for an operator (``wsrm poison``).

The WSDL gets spyne's one-way defect fixed and the WS-RM policy assertion.
Several processes may serve one PostgreSQL store: each invoker claims work
with SKIP LOCKED, a sequence at a time, so order and exactly-once hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from lxml import etree
from spyne import Application

from wsrm_plugin.engine import DeliveryAssurance, DeliveryContext, FailedDelivery, ReliableEngine, RMPolicy
from wsrm_plugin.engine.transport import HttpServer, HttpTransport, Transport
from wsrm_plugin.health import HealthRoutes, NodeHealth
from wsrm_plugin.lifecycle import LifecycleListener, LifecycleReport, check_recovery_interval
from wsrm_plugin.makeconnection import Mailbox
from wsrm_plugin.store import StorageManager

from interceptors import default_chain
from interceptors.chain import InterceptorChain
from interceptors.spyne_server.reliable import (
    DELIVERY_KEY, ChainDeliverer, ReliableMessagingInterceptor, current_delivery,
)
from interceptors.spyne_server.adapter import ChainMiddleware, current_message, engage
from interceptors.wsdl import RMPolicyAssertion

__all__ = ["ReliableService", "reliable_service", "delivery_context", "policy_assertion"]

log = logging.getLogger(__name__)


def delivery_context(ctx: Any = None) -> DeliveryContext | None:
    """The WS-RM delivery a spyne method is running for (``ctx`` is the method's ctx).

    None when the method was not called by the invoker (a plain, unreliable
    call to an RM-optional service).  Without ``ctx`` the current thread's
    delivery is returned.
    """
    if ctx is not None:
        message = current_message(ctx)
        if message is not None:
            found = message.exchange.properties.get(DELIVERY_KEY)
            if found is not None:
                return found
    return current_delivery()


def policy_assertion(policy: RMPolicy) -> RMPolicyAssertion:
    """What the WSDL says about an engine policy: its WS-RM version and (1.1) delivery assurance."""
    if not policy.rm_version.is_11:
        return RMPolicyAssertion(version=policy.rm_version)
    delivery = policy.delivery
    if delivery & DeliveryAssurance.EXACTLY_ONCE == DeliveryAssurance.EXACTLY_ONCE:
        name = "ExactlyOnce"
    elif delivery & DeliveryAssurance.AT_LEAST_ONCE:
        name = "AtLeastOnce"
    else:
        name = "AtMostOnce"
    return RMPolicyAssertion(version=policy.rm_version, delivery_assurance=name,
                             in_order=bool(delivery & DeliveryAssurance.IN_ORDER))


class ReliableService:
    """A spyne Application behind WS-RM: the WSGI app to serve and the engine behind it.

    ``wsgi_app`` is a WSGI application (so is the service itself); serve it
    with anything, or with :meth:`serve`.  The engine's workers run between
    :meth:`start` and :meth:`stop`; messages received while they are stopped
    wait in the store.  ``wsgi_app`` also answers ``GET {health_path}/live`` and
    ``/ready`` (:mod:`wsrm_plugin.health`; ``health_path=None``: not served;
    ``max_poison``: poison messages beyond which it is not ready;
    ``max_unreachable_peers``: unreachable peers beyond which it is not ready,
    None: they only make it degraded).
    ``endpoint_address`` is this service's public URL (the
    AcksTo of the reply sequences it opens); by default the URL :meth:`serve`
    listens on, else the first request's URL.  ``recovery_interval`` (seconds,
    with a ``tm``) runs the transaction manager's recovery in the background
    while the service runs, so a branch a crashed transaction left prepared
    in the store is resolved (rolled back past the manager's safety
    interval) without a restart; None runs it only at :meth:`start`.

    ``make_connection=True`` serves WS-MakeConnection: replies for a client
    that cannot accept connections (its Offer endpoint and ReplyTo a WS-MC
    anonymous URI) wait in :attr:`mailbox` until the client polls for them
    (``reliable_client(..., make_connection=True)``), and are retransmitted
    there until acknowledged.  ``understands`` names SOAP header blocks
    (``"{namespace}local"``) processed in front of the service (a WS-Security
    middleware's): a header marked mustUnderstand that neither they, the
    chain's interceptors nor the service's declared headers cover is refused
    with a MustUnderstand fault before it is recorded.  ``transport`` is what the
    engine sends with (acknowledgements to an addressable AcksTo, replies to a
    listener); the caller keeps it and closes it.
    """

    def __init__(self, application: Application, store: str | StorageManager = "memory:",
                 policy: RMPolicy | None = None, *, tm: Any = None, required: bool = True,
                 chain: InterceptorChain | None = None, endpoint_address: str | None = None,
                 on_delivery_failure: Callable[[FailedDelivery], None] | None = None,
                 publish_policy: RMPolicyAssertion | bool = True, name: str = "wsrm-server",
                 recovery_interval: float | None = None, health_path: str | None = "/healthz",
                 max_poison: int | None = None, make_connection: bool = False,
                 understands: Iterable[str] = (), transport: Transport | None = None,
                 max_unreachable_peers: int | None = None) -> None:
        check_recovery_interval(recovery_interval, tm)
        self.policy = policy or RMPolicy()
        self.recovery_interval = recovery_interval
        self.lifecycle_report: LifecycleReport | None = None
        #: The WS-MakeConnection mailbox (``make_connection=True``), else None.
        self.mailbox: Mailbox | None = None
        self._transport: Transport | None = None  # ours to close
        if make_connection:
            self.mailbox = Mailbox(max_message_size=self.policy.max_message_size)
            if transport is None:
                transport = self._transport = HttpTransport(timeout=self.policy.http_timeout)
            transport = self.mailbox.transport(transport)
        # the deliverer needs the middleware, which needs the engine: bind it late
        self.engine = ReliableEngine(store, self.policy, tm=tm, endpoint_address=endpoint_address,
                                     transport=transport,
                                     application=lambda payload, context: self._deliver(payload, context),
                                     on_delivery_failure=on_delivery_failure, answers=_answering(application),
                                     understands=None, knows=_knowing(application), name=name)
        if self.mailbox is not None:
            self.mailbox.owner_of = self.engine.destination.owner_of
            self.mailbox.acknowledged = self.engine.source.acknowledged
        self.interceptor = ReliableMessagingInterceptor(self.engine, required=required)
        self.chain = chain if chain is not None else default_chain()
        self.chain.add(self.interceptor)
        if publish_policy is True:
            publish_policy = policy_assertion(self.policy)
        self.chain_app: ChainMiddleware = engage(application, self.chain, rm_policy=publish_policy,
                                                 max_message_size=self.policy.max_message_size,
                                                 understands=understands)
        self._deliver = ChainDeliverer(self.chain_app, self.interceptor)
        #: liveness and readiness (:mod:`wsrm_plugin.health`), served at ``health_path`` + /live, /ready
        self.health = NodeHealth(self.engine, lambda: self.lifecycle_report is not None, max_poison=max_poison,
                                 servers=lambda: (*self._servers, *self.engine.servers),
                                 max_unreachable_peers=max_unreachable_peers)
        # the chain, behind the MakeConnection mailbox when there is one
        front: Callable[..., Iterable[bytes]] = (self.chain_app if self.mailbox is None
                                                 else self.mailbox.middleware(self.chain_app))
        self.wsgi_app: Callable[..., Iterable[bytes]] = (
            HealthRoutes(front, self.health, health_path) if health_path else front)
        self._servers: list[HttpServer] = []
        self._lifecycle = LifecycleListener(self.engine, tm=tm, active_keys=None, hooks=self.chain.plugins.hook)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        return self.wsgi_app(environ, start_response)

    def serve(self, host: str = "127.0.0.1", port: int = 0, *, path: str = "/", threads: int | None = None,
              **options: Any) -> HttpServer:
        """Serve the service with waitress in a background thread; returns the server (``.url``).

        ``threads``: waitress's threads; None: the engine's
        :attr:`~wsrm_plugin.engine.engine.ReliableEngine.http_threads` (4; more let more
        receives on PostgreSQL share a WAL flush, at the cost of thread switches; 16 on SQLite
        delivering apart, where each thread runs its application outside the store's file).

        ``options`` go to :class:`~wsrm_plugin.engine.http_server.HttpServer` (``connection_limit``,
        ``channel_timeout``, ``request_timeout``, ``on_failure``...).  Block on the server with
        ``server.wait(stop)``: it raises :class:`~wsrm_plugin.engine.http_server.HttpServerFailed`
        if the server's loop failed for good, which ends the process for its supervisor to restart.
        """
        threads = self.engine.http_threads if threads is None else threads
        self.engine.serving()
        server = HttpServer(self.wsgi_app, host, port, threads=threads, path=path,
                            max_body=max(4 * self.policy.max_message_size, 16 * 1024 * 1024), **options).start()
        self._servers.append(server)
        if self.engine.endpoint_address is None:
            self.engine.endpoint_address = server.url
        return server

    @property
    def url(self) -> str | None:
        return self.engine.endpoint_address

    def start(self) -> ReliableService:
        """Run the lifecycle listener, then the engine's workers (and background recovery).

        After a crash the store may hold branches prepared by the previous
        process; they block the store until the manager's log decides them, so
        the listener (:class:`~wsrm_plugin.lifecycle.LifecycleListener`) runs
        recovery once before any worker touches the store, then resumes the
        sequences in flight; its report is :attr:`lifecycle_report`.  Branches
        with no logged decision are rolled back only once older than the
        manager's safety interval: by the background recovery
        (``recovery_interval``), or at the next start.
        """
        if self.lifecycle_report is None:
            self.lifecycle_report = self._lifecycle.on_start()
        self.engine.start()
        self._lifecycle.start_recovery(self.recovery_interval, self.lifecycle_report)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the servers :meth:`serve` started, then the engine (and its store, if it opened it)."""
        self._lifecycle.stop_recovery(timeout)
        for server in self._servers:
            server.stop(timeout)
        self._servers.clear()
        self.engine.stop(timeout)
        if self._transport is not None:
            self._transport.close()

    def __enter__(self) -> ReliableService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _answering(application: Application) -> Callable[[etree._Element], bool]:
    """Does the operation a request body element calls answer?  spyne's own lookup (the
    element's qualified name); a one-way method (``_is_async``) does not, nor an unknown one."""
    methods = application.interface.service_method_map

    def answers(body: etree._Element) -> bool:
        found = methods.get(body.tag)
        return bool(found) and not getattr(found[0], "is_async", False)

    return answers


def _knowing(application: Application) -> Callable[[etree._Element | None, str | None], bool]:
    """Does a reliable message name an operation of the service?  spyne dispatches on the body
    element's qualified name: a message without one, or with one no method has, can never run."""
    methods = application.interface.service_method_map

    def knows(body: etree._Element | None, action: str | None) -> bool:
        return body is not None and isinstance(body.tag, str) and body.tag in methods

    return knows


def reliable_service(application: Application, store: str | StorageManager = "memory:",
                     policy: RMPolicy | None = None, *, tm: Any = None, **options: Any) -> ReliableService:
    """Engage WS-RM on ``application``; see :class:`ReliableService` for ``options``."""
    return ReliableService(application, store, policy, tm=tm, **options)
