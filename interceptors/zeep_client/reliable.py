"""The client-side WS-RM interceptor: a zeep request goes into the RM Source store, not on the wire.

On the out chain of a zeep client, :class:`ReliableClientInterceptor` takes
the envelope zeep built, enqueues it with :meth:`ReliableEngine.send` (inside
the caller's current ``txmanager`` transaction when there is one, so "update
my database AND send this call" commits or rolls back as one) and consumes
the request with an empty 202: zeep returns at once, the engine's RMS worker
sends, retransmits and finishes the sequence later.

An in-out call cannot hand its result back to the caller that way, so its
reply is routed through :func:`dispatch_reply`, an import path persisted
with the message (``reply_callback``) together with a small JSON
``reply_context`` naming the client, the operation and the user's own
callback path.  Both are strings in the store, not Python objects: after a
crash and restart the reply still finds its way to the callback, once the
application has re-created its reliable client under the same name
(:func:`register_client`).  The reply is deserialized with the zeep client's
own binding, so the callback gets the same object ``client.service.Op``
would have returned (or the zeep ``Fault``).

Per-call options (a callback, a context, the future to resolve) travel from
:class:`~interceptors.zeep_client.client.ReliableClient` to the interceptor through a
context variable, so one engaged zeep client can be used from many threads.
"""

from __future__ import annotations

import contextvars
import importlib
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from wsrm_plugin.engine.parsed import TREES
from wsrm_plugin.wire.xmlsafe import parse_xml

from interceptors.chain import Direction, Interceptor, Message, Phase, Response, Role

if TYPE_CHECKING:
    from wsrm_plugin.engine import DeliveryContext, ReliableEngine, SendReceipt

__all__ = [
    "ReliableClientInterceptor", "ReliableReply", "CallOptions", "dispatch_reply", "register_client",
    "unregister_client", "registered_client", "import_callback", "DISPATCH_PATH",
]

log = logging.getLogger(__name__)

#: The import path persisted as every in-out message's ``reply_callback``.
DISPATCH_PATH = "interceptors.zeep_client.reliable:dispatch_reply"


@dataclass(frozen=True)
class ReliableReply:
    """What an in-out call's callback receives when the reply arrives.

    ``result`` is what ``client.service.Op(...)`` would have returned; when
    the service answered with a SOAP fault, ``fault`` is the zeep ``Fault``
    and ``result`` is None (when the call's sequence was given up, ``fault``
    is a :class:`~wsrm_plugin.engine.source.SequenceFaulted` and
    ``envelope`` is empty).  ``context`` is the engine's DeliveryContext: the
    callback runs inside the delivery's transaction (``context.transaction``),
    so raising makes the engine roll back and deliver the reply again.

    Exactly once: the reply is consumed in the transaction the callback
    runs in, so what the callback does *in that transaction* happens exactly
    once with it (with ``tm=``, the delivery is an XA transaction: a database
    connection enlisted there commits or rolls back with the reply).  What it
    does outside (a file, an HTTP call, a non-XA database) can run again when
    the process dies between the callback and that commit; every such second
    run has ``redelivered=True``: the reply may have been handled before, and
    ``request_message_id`` is the key to check it by (an idempotent
    callback).  ``redelivered`` is also True for a reply received before the
    client started that the previous process never got to: conservatively,
    "maybe", never a false "no".  (That needs the reply recorded before its
    callback runs: a client's policy with ``deliver_on_receive=True`` hands
    a reply over in the transaction that receives it, and one whose callback
    ran before a crash then comes again as a new one.)
    """

    operation: str
    request_message_id: str
    envelope: bytes
    result: Any = None
    fault: BaseException | None = None
    user_context: str | None = None
    context: Any = field(default=None, repr=False)
    redelivered: bool = False

    def value(self) -> Any:
        """The result, or raise the fault (like a synchronous call would)."""
        if self.fault is not None:
            raise self.fault
        return self.result


@dataclass
class CallOptions:
    """Per-call settings handed from :class:`ReliableClient` to the interceptor (context variable)."""

    callback: str | None = None
    user_context: str | None = None
    future: Future | None = None
    receipt: SendReceipt | None = None
    one_way: bool | None = None
    #: the WSDL operation called (its reply is read with that operation's output)
    operation: str | None = None


_call: contextvars.ContextVar[CallOptions | None] = contextvars.ContextVar("wsrm_reliable_call", default=None)


def current_call() -> contextvars.ContextVar[CallOptions | None]:
    return _call


# -- the registry of clients replies are dispatched to -------------------------------------------

_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def register_client(name: str, client: Any) -> None:
    """Make ``client`` (a :class:`~interceptors.zeep_client.client.ReliableClient`) receive replies for ``name``.

    The name is persisted with every in-out message, so a client re-created
    under the same name after a restart receives the replies to calls made
    before the crash.  Two live clients may not share a name.
    """
    with _clients_lock:
        existing = _clients.get(name)
        if existing is not None and existing is not client:
            raise ValueError(f"a reliable client named {name!r} is already registered in this process; "
                             "stop() it first or choose another name")
        _clients[name] = client


def unregister_client(name: str, client: Any) -> None:
    with _clients_lock:
        if _clients.get(name) is client:
            del _clients[name]


def registered_client(name: str) -> Any | None:
    with _clients_lock:
        return _clients.get(name)


def import_callback(path: str) -> Callable[..., Any]:
    """The function named by ``"package.module:function"``; ValueError/ImportError say what is wrong."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"callback {path!r} must be an import path like 'package.module:function'")
    target: Any = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"callback {path!r} names {type(target).__name__}, not a function")
    return target


def encode_reply_context(client: str, operation: str, callback: str | None, user_context: str | None) -> bytes:
    return json.dumps({"client": client, "operation": operation, "callback": callback,
                       "context": user_context}, separators=(",", ":")).encode()


def decode_reply_context(data: bytes | None) -> dict[str, Any]:
    try:
        value = json.loads((data or b"").decode())
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"reply context {data!r} was not written by the reliable zeep client") from None
    if not isinstance(value, dict) or "client" not in value or "operation" not in value:
        raise ValueError(f"reply context {data!r} was not written by the reliable zeep client")
    return value


def dispatch_reply(envelope: bytes, context: DeliveryContext, reply_context: bytes | None) -> None:
    """The persisted ``reply_callback`` of every in-out call: hand the reply to its client.

    Runs in the engine's invoker thread inside the delivery transaction.  It
    raises (so the delivery is retried, then reported as failed) when no
    client of that name is registered: the reply must not be dropped silently.
    """
    info = decode_reply_context(reply_context)
    client = registered_client(info["client"])
    if client is None:
        raise LookupError(f"a reply for reliable client {info['client']!r} arrived but no client of that "
                          "name is registered: create it with reliable_client(..., name=...) before start")
    client._on_reply(envelope, context, info)


# -- the interceptor --------------------------------------------------------------------------------


class ReliableClientInterceptor(Interceptor):
    """Enqueues a client's outgoing requests into the engine's RM Source and consumes them.

    ``is_one_way(operation_name)`` tells in-out from one-way (from the WSDL);
    ``client_name`` is the name replies are dispatched to; ``key`` separates
    this client's sequences from others' in a shared store (CXF's internal
    key); ``default_callback`` is used for in-out calls made straight through
    ``zeep_client.service`` without per-call options.  ``check(message)``
    runs first and raises to refuse a call (nothing is stored).
    """

    name = "ReliableClient"
    phase = Phase.RELIABLE_MESSAGING

    def __init__(self, engine: ReliableEngine, *, client_name: str, key: str = "",
                 is_one_way: Callable[[str | None], bool], default_callback: str | None = None,
                 on_enqueued: Callable[[str, SendReceipt, CallOptions], None] | None = None,
                 check: Callable[[Message], None] | None = None) -> None:
        super().__init__()
        self.engine = engine
        self.client_name = client_name
        self.key = key
        self.is_one_way = is_one_way
        self.default_callback = default_callback
        self._on_enqueued = on_enqueued
        self._check = check

    def handle_out(self, message: Message) -> None:
        if message.direction is not Direction.OUT or message.role is not Role.CLIENT:
            return
        if not message.address:
            raise ValueError(f"request {message.operation or ''} has no address to send to")
        if self._check is not None:
            self._check(message)  # refuse a call that cannot be kept before anything is stored
        options = _call.get() or CallOptions()
        one_way = options.one_way if options.one_way is not None else self.is_one_way(message.operation)
        callback = options.callback or self.default_callback
        if callback is not None:
            import_callback(callback)  # refuse a wrong path now, not when the reply comes
        reply_callback = reply_context = None
        if not one_way:
            reply_callback = DISPATCH_PATH
            reply_context = encode_reply_context(self.client_name, message.operation or "", callback,
                                                 options.user_context)
        if message.envelope is None:
            message.to_bytes()  # raises the chain's error for a message with no envelope
        # the tree itself: the engine adds its headers in place and hands it to the first transmission
        # (no parse on the way); the message is consumed here, nobody else reads it
        # a future its caller may wait on: the caller's thread may send the request (call_future)
        caller_may_send = not one_way and callable(getattr(options.future, "send_when_waited", None))
        receipt = self.engine.send(message.address, message.envelope, action=_action_of(message),
                                   key=self.key, expect_reply=not one_way, reply_callback=reply_callback,
                                   reply_context=reply_context, caller_may_send=caller_may_send,
                                   caller_sends=one_way)
        options.receipt = receipt
        if self._on_enqueued is not None:
            self._on_enqueued(message.address, receipt, options)
        log.debug("%s enqueued: %r", message.operation, receipt)  # (its number may come with its commit)
        message.abort(Response())  # 202: zeep returns at once (after the caller's own send, one_way_caller_sends)


def _action_of(message: Message) -> str | None:
    """The SOAPAction zeep would have sent, or None to let the envelope's wsa:Action decide."""
    action = message.action
    if not action:
        return None
    return action.strip('"') or None


def deserialize_reply(zeep_client: Any, operation_name: str, envelope: bytes,
                      max_size: int) -> tuple[Any, BaseException | None]:
    """Turn a reply envelope into (result, fault) with zeep's own binding, without its plugins."""
    binding = zeep_client.service._binding
    operation = binding.get(operation_name)
    doc = TREES.take(envelope)  # the reply's tree, when this process read it moments ago
    if doc is None:
        doc = parse_xml(envelope, max_size=max_size)
    fault = doc.find("soap-env:Body/soap-env:Fault", namespaces=binding.nsmap)
    if fault is not None:
        try:
            binding.process_error(doc, operation)
        except Exception as exc:  # noqa: BLE001 -- zeep raises the Fault: that is the value here
            return None, exc
        return None, RuntimeError("the service answered with a fault zeep could not read")
    return operation.process_reply(doc), None

