"""Put an interceptor chain in a zeep client: ``engage_client(client, chain) -> client``.

zeep's plugin hooks see every envelope: ``egress`` runs the out chain on the
request, ``ingress`` the in chain on the reply (:class:`ChainPlugin`).  A
plugin cannot stop zeep from posting, though, so :func:`engage_client` also
wraps the client's transport: when an out interceptor consumed the request
(``message.abort(response)``: WS-RM put it in its store and its worker will
send it), nothing goes on the wire and zeep gets ``response`` as the reply
(by default an empty 202, which zeep returns as None).

The request and its reply are tied together through a context variable (set
in ``egress``, read by the transport and ``ingress``, all in the caller's
thread), so one engaged client can be used from many threads.

A worker that suspended a request finishes it with :func:`resume_send`: the
rest of the out chain, the HTTP post, the in chain on the reply.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import Mapping
from typing import Any

import requests
import zeep
from lxml import etree
from requests.structures import CaseInsensitiveDict
from zeep.exceptions import TransportError

from wsrm_plugin.wire.xmlsafe import DEFAULT_MAX_SIZE, parse_xml

from interceptors.chain import (
    ChainError, Direction, InterceptorChain, Message, MessageConsumed, Response, Role,
)

__all__ = ["ChainPlugin", "engage_client", "resume_send", "plugin_of"]

log = logging.getLogger(__name__)

#: The request of the call under way (its exchange refers to it weakly: this holds it until the reply)
_current: contextvars.ContextVar[Message | None] = contextvars.ContextVar(
    "wsrm_zeep_exchange", default=None)
_ANSWERED = "zeep_adapter.answered"
_HTTP_STATUS = "zeep_adapter.http_status"


class ChainPlugin(zeep.Plugin):
    """The zeep plugin that runs ``chain``; use :func:`engage_client` to install it."""

    def __init__(self, chain: InterceptorChain) -> None:
        self.chain = chain
        self.transport_engaged = False

    def egress(self, envelope: etree._Element, http_headers: dict[str, str], operation: Any,
               binding_options: Mapping[str, Any]) -> tuple[etree._Element, dict[str, str]]:
        message = Message(envelope, Direction.OUT, Role.CLIENT, http_headers=http_headers,
                          address=binding_options.get("address"),
                          action=getattr(operation, "soapaction", None) or None,
                          operation=getattr(operation, "name", None))
        _current.set(message)
        self.chain.handle_out(message)
        if message.stopped:
            if not self.transport_engaged:
                raise ChainError(
                    f"{message.stopped_by} consumed the request "
                    "but the client's transport cannot hold it back: install the chain with "
                    "engage_client(client, chain), not by adding ChainPlugin to client.plugins")
            return envelope, http_headers
        return _envelope_of(message), dict(message.http_headers)

    def ingress(self, envelope: etree._Element, http_headers: Mapping[str, str],
                operation: Any) -> tuple[etree._Element, Mapping[str, str]]:
        request = _current.get()
        exchange = request.exchange if request is not None else None
        if request is not None and request.stopped:
            return envelope, http_headers  # an interceptor made this reply; it is final
        message = Message(envelope, Direction.IN, Role.CLIENT, http_headers=http_headers,
                          operation=getattr(operation, "name", None), exchange=exchange,
                          address=request.address if request is not None else None,
                          http_status=exchange.properties.get(_HTTP_STATUS) if exchange else None)
        self.chain.handle_in(message)
        if message.stopped:
            if message.response is not None and message.response.envelope is not None:
                return message.response.envelope, http_headers
            raise MessageConsumed(
                f"an in interceptor consumed the reply to {message.operation or 'the request'}; "
                "there is no result to return (answer with message.abort(Response(envelope=...)) "
                "to give the caller one)")
        return _envelope_of(message), http_headers


def _requests_response(response: Response, address: str) -> requests.Response:
    """An interceptor's Response as the requests.Response zeep expects from a transport."""
    result = requests.Response()
    result.status_code = response.status_code
    result.reason = response.status_line.split(" ", 1)[1]
    body = response.body()
    result.headers = CaseInsensitiveDict(response.headers(body))
    result._content = body
    result.encoding = "utf-8"
    result.url = address
    return result


class _ChainTransport:
    """Delegates to zeep's transport, except for requests an interceptor consumed."""

    def __init__(self, inner: Any, plugin: ChainPlugin) -> None:
        self._inner = inner
        self._plugin = plugin

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:  # client.transport.session = ... configures the real transport
            setattr(self._inner, name, value)

    def post_xml(self, address: str, envelope: etree._Element, headers: Mapping[str, str]) -> Any:
        request = _current.get()
        exchange = request.exchange if request is not None else None
        if (request is not None and request.stopped and exchange is not None
                and not exchange.properties.get(_ANSWERED)):
            exchange.properties[_ANSWERED] = True
            log.debug("%s consumed by the chain; not posted to %s", request, address)
            return _requests_response(request.response or Response(), address)
        response = self._inner.post_xml(address, envelope, headers)
        if exchange is not None:
            exchange.properties[_HTTP_STATUS] = response.status_code
        return response


class _AsyncChainTransport(_ChainTransport):
    """The same for a ``zeep.AsyncClient``: zeep awaits ``post_xml``.

    zeep runs the plugins (the chain) synchronously inside the awaited call,
    in the event loop's thread, and the context variable tying a request to
    its reply is the task's own; an interceptor that blocks blocks the loop
    (the reliable client runs its chain in a thread of its own instead:
    :mod:`.aio`).
    """

    async def post_xml(self, address: str, envelope: etree._Element,
                       headers: Mapping[str, str]) -> Any:
        request = _current.get()
        exchange = request.exchange if request is not None else None
        if (request is not None and request.stopped and exchange is not None
                and not exchange.properties.get(_ANSWERED)):
            exchange.properties[_ANSWERED] = True
            return _requests_response(request.response or Response(), address)
        response = await self._inner.post_xml(address, envelope, headers)
        if exchange is not None:
            exchange.properties[_HTTP_STATUS] = response.status_code
        return response


def plugin_of(client: zeep.Client) -> ChainPlugin | None:
    """The ChainPlugin engaged on ``client``, if any."""
    return next((p for p in client.plugins if isinstance(p, ChainPlugin)), None)


def engage_client(client: zeep.Client, chain: InterceptorChain | None = None) -> zeep.Client:
    """Run ``chain`` on every request and reply of ``client``; returns the same client.

    ``chain`` defaults to :func:`interceptors.default_chain`.  Engaging the
    same chain twice is a no-op; another chain on an engaged client is an error.
    A ``zeep.AsyncClient`` is engaged too: its awaited calls run the chain.
    """
    if chain is None:
        from interceptors import default_chain
        chain = default_chain()
    existing = plugin_of(client)
    if existing is not None:
        if existing.chain is chain:
            return client
        raise ChainError("this client already runs another interceptor chain; "
                         "add interceptors to that chain instead")
    plugin = ChainPlugin(chain)
    client.plugins = [*client.plugins, plugin]
    if inspect.iscoroutinefunction(getattr(client.transport, "post_xml", None)):
        client.transport = _AsyncChainTransport(client.transport, plugin)
    else:
        client.transport = _ChainTransport(client.transport, plugin)
    plugin.transport_engaged = True
    return client


def resume_send(client: zeep.Client, message: Message, after: str | None = None, *,
                max_message_size: int = DEFAULT_MAX_SIZE) -> Message | None:
    """Finish a suspended request: rest of the out chain, POST, in chain on the reply.

    For workers (the WS-RM source): ``message`` may be rebuilt from stored
    bytes (:meth:`Message.from_bytes` with ``address`` and ``resume_point``).
    Returns the reply as a :class:`Message` after its in chain (it may be a
    fault: check ``reply.is_fault``), or None when the peer answered with an
    empty 202/201 or the chain consumed the request again.  Raises zeep's
    TransportError for an HTTP error without a body.
    """
    plugin = plugin_of(client)
    if plugin is None:
        raise ChainError("resume_send needs a client engaged with engage_client(client, chain)")
    if message.direction is not Direction.OUT or message.role is not Role.CLIENT:
        raise ValueError(f"resume_send takes a client's outgoing message, not {message!r}")
    if not message.address:
        raise ValueError("the message has no address to send to (set message.address)")
    plugin.chain.resume(message, after)
    if message.stopped:
        return None
    transport = client.transport
    inner = transport._inner if isinstance(transport, _ChainTransport) else transport
    response = inner.post_xml(message.address, message.envelope, dict(message.http_headers))
    if not response.content:
        if response.status_code in (200, 201, 202, 204):
            return None
        raise TransportError(f"Server returned HTTP status {response.status_code} (no content)",
                             status_code=response.status_code)
    reply = Message(parse_xml(response.content, max_size=max_message_size), Direction.IN,
                    Role.CLIENT, http_headers=response.headers, http_status=response.status_code,
                    exchange=message.exchange, address=message.address,
                    operation=message.operation)
    plugin.chain.handle_in(reply)
    if reply.stopped:
        return None
    return reply


def _envelope_of(message: Message) -> etree._Element:
    """The envelope the chain leaves; zeep has nothing to send or parse without one."""
    if message.envelope is None:
        which = "request" if message.direction is Direction.OUT else "reply"
        raise ChainError(f"the interceptors left the {which} without an envelope and did not stop it")
    return message.envelope
