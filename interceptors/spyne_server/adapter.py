"""Put an interceptor chain in front of a spyne service: ``engage(application) -> WSGI app``.

The Axis2 way of making a service reliable is to engage a module; here it is::

    from interceptors.spyne_server.adapter import engage
    wsgi_app = engage(Application([MyService], tns=..., in_protocol=Soap11(), out_protocol=Soap11()))

The returned :class:`ChainMiddleware` is a WSGI application wrapping spyne's
``WsgiApplication``.  Every POSTed envelope is parsed safely (size limit, no
DTD) and run through the in chain; an interceptor may consume it and answer
itself (WS-RM answers CreateSequence, or takes a message into its store and
answers 202) and spyne never sees it.  Otherwise spyne gets the (possibly
changed) envelope, and its answer goes through the out chain before it is
sent.  A SOAP fault raised by an interceptor is answered as that fault, in the
request's SOAP version, through the out chain (so it gets its WS-A headers).
Other requests (GET ?wsdl) go straight to spyne.

Two spyne defects are fixed on the way: the WSDL of one-way operations
references undefined header messages (zeep refuses it), and one-way
operations answer 200 with an empty response element where WS-I BP (R2750)
wants 202 Accepted with no envelope.  The WSDL can also advertise the WS-RM
policy (:class:`~interceptors.wsdl.RMPolicyAssertion`).

A worker that took a message out of the flow (``message.suspend()``) hands it
back with :meth:`ChainMiddleware.deliver`, from any thread and without HTTP.
"""

from __future__ import annotations

import functools
import io
import logging
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit
from wsgiref.util import request_uri, setup_testing_defaults

from lxml import etree
from spyne import Application
from spyne.model.fault import Fault
from spyne.protocol.soap.soap11 import resolve_hrefs
from spyne.server.wsgi import WsgiApplication

from wsrm_plugin.engine import after_response
from wsrm_plugin.engine.faults import UnsupportedMediaType
from wsrm_plugin.engine.transport import http_status_for
from wsrm_plugin.wire.faults import MalformedMessageError, MessageTooLargeError, SoapFault
from wsrm_plugin.wire.namespaces import RM_VERSIONS, SOAP11, SOAP12, WSMC_NS, SoapVersion
from wsrm_plugin.wire.soap import Envelope, fault_envelope
from wsrm_plugin.wire.xmlsafe import DEFAULT_MAX_SIZE, parse_xml

from interceptors.chain import (
    Direction, HttpHeaders, InterceptorChain, Message, Phase, Response, Role, action_from_http,
)
from interceptors.spyne_server import contexts, direct
from interceptors.understood import UnderstoodHeaders
from interceptors.wsdl import RMPolicyAssertion, attach_policy, drop_undefined_header_messages

__all__ = ["ENVIRON_KEY", "WSGI_ENVIRON_KEY", "ChainMiddleware", "engage", "current_message"]

log = logging.getLogger(__name__)

#: The WSGI environ key under which spyne's request environ holds the current :class:`Message`.
ENVIRON_KEY = "wsrm.message"
#: The ``Message.context`` key of the WSGI environ a received request came with.
WSGI_ENVIRON_KEY = "wsgi.environ"
_ONE_WAY_KEY = "wsrm.one_way"
#: spyne's request environ: the chain's tree of the envelope, which spyne reads instead of a parse
_TREE_KEY = "wsrm.envelope_tree"
#: In the environ of a request the adapter runs, when spyne may leave a one-way call's answer
#: unwritten (the adapter throws it away: WS-I BP R2750); only a chunked WsgiApplication, whose
#: empty answer is an empty list (the other kind joins str and bytes).
_QUIET_ONE_WAY_KEY = "wsrm.quiet_one_way"
#: In the environ of a request the adapter runs (a chunked WsgiApplication only): spyne leaves its
#: answer's tree here instead of writing it out (:func:`_give_out_trees`)
_OUT_TREE_KEY = "wsrm.out_tree"
_ENGAGED = "_wsrm_interceptors_engaged"
_TREES_TAKEN = "_wsrm_takes_chain_trees"
_TREES_GIVEN = "_wsrm_gives_out_trees"
#: spyne's events whose listeners may read or change the answer's bytes: while any has one, spyne
#: writes its answer out as usual
_STRING_EVENTS = ("method_return_string", "method_exception_string")
_WSGI_STRING_EVENTS = ("wsgi_return", "wsgi_exception")


def _elements_by_id(tree: etree._Element) -> dict[str, etree._Element]:
    """What lxml's ``XMLID`` (spyne's parse) maps: the elements by their (non-empty) ``id`` attribute.

    Found by walking the tree, not by an XPath: lxml evaluates an XPath
    without the GIL, and beside a busy thread taking it back costs hundreds of
    microseconds (an XPath of 1.5 us took 570 us beside one CPU-bound thread),
    paid here by the thread that holds its sequence's turn (``bench_compare``,
    4 rounds: xa1 0.79 of the outbox with spyne's two XPaths and this one per
    message, 0.83 without).
    """
    return {str(id_): e for e in tree.iter(etree.Element) if (id_ := e.get("id"))}

StartResponse = Callable[..., Any]


def current_message(ctx: Any) -> Message | None:
    """The chain's message for a spyne method context (``ctx`` in an ``@rpc`` method).

    Lets service code read what the interceptors found (``message.addressing``,
    ``message.context``).
    """
    environ = getattr(getattr(ctx, "transport", None), "req_env", None)
    return environ.get(ENVIRON_KEY) if isinstance(environ, dict) else None


def _version_from_content_type(content_type: str | None) -> SoapVersion:
    return SOAP12 if "application/soap+xml" in (content_type or "").lower() else SOAP11


_PROTOCOL_NAMESPACES = frozenset([*(v.ns for v in RM_VERSIONS), WSMC_NS])


def _for_the_service(envelope: Envelope) -> bool:
    """Is the body an operation of the service (not a WS-RM/WS-MC protocol body, not empty)?"""
    body = envelope.body_element
    if body is None or not isinstance(body.tag, str):
        return False
    return etree.QName(body).namespace not in _PROTOCOL_NAMESPACES


def _utf8(content_type: str | None, version: SoapVersion) -> str:
    """The request's Content-Type with charset=utf-8: the chain re-serializes envelopes as UTF-8."""
    return _utf8_content_type(content_type, version.content_type)


@functools.lru_cache(maxsize=64)
def _utf8_content_type(content_type: str | None, default: str) -> str:
    """:func:`_utf8` of a Content-Type and a SOAP version's media type (a delivery's is one of a few)."""
    if not content_type:
        return f"{default}; charset=utf-8"
    parts = [p.strip() for p in content_type.split(";")]
    params = [p for p in parts[1:] if p and not p.lower().startswith("charset=")]
    return "; ".join([parts[0], *params, "charset=utf-8"])


@functools.lru_cache(maxsize=256)
def _header_name(key: str) -> str:
    """``HTTP_SOAPACTION`` -> ``Soapaction``: the environ key of a request header as a header name."""
    return "-".join(w.capitalize() for w in key[5:].split("_"))


@functools.lru_cache(maxsize=256)
@functools.lru_cache(maxsize=256)
def _environ_key(name: str) -> str | None:
    """``SOAPAction`` -> ``HTTP_SOAPACTION``: a request header's environ key (None for the two
    that have their own, Content-Type and Content-Length); every delivery names the same few."""
    key = name.upper().replace("-", "_")
    return None if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"


@functools.lru_cache(maxsize=256)
def _request_uri(scheme: str, host: str | None, server: str | None, port: str | None,
                 script: str, path: str) -> str:
    """``wsgiref.util.request_uri`` without the query, of a request with these environ values.

    Cached: a service sees the same few URLs again and again.
    """
    environ = {"wsgi.url_scheme": scheme, "SCRIPT_NAME": script, "PATH_INFO": path}
    for key, value in (("HTTP_HOST", host), ("SERVER_NAME", server), ("SERVER_PORT", port)):
        if value is not None:
            environ[key] = value
    return request_uri(environ, include_query=False)


def _request_url(environ: dict[str, Any]) -> str:
    return _request_uri(environ["wsgi.url_scheme"], environ.get("HTTP_HOST"), environ.get("SERVER_NAME"),
                        environ.get("SERVER_PORT"), environ.get("SCRIPT_NAME", ""), environ.get("PATH_INFO", ""))


def _headers_from_environ(environ: dict[str, Any]) -> list[tuple[str, str]]:
    headers = [(_header_name(key), value) for key, value in environ.items() if key[:5] == "HTTP_"]
    if environ.get("CONTENT_TYPE"):
        headers.append(("Content-Type", environ["CONTENT_TYPE"]))
    if environ.get("CONTENT_LENGTH"):
        headers.append(("Content-Length", environ["CONTENT_LENGTH"]))
    return headers


def _fault_status(version: SoapVersion, fault: SoapFault) -> int:
    """The engine's own endpoint's mapping (:func:`~wsrm_plugin.engine.transport.http_status_for`),
    so a peer sees the same status whichever front end it reached: 413 for a body over the
    limit, 503 to retry later, 415 for a Content-Type naming the other SOAP version, else
    SOAP 1.2's 400 for Sender faults and 500 for the rest (SOAP 1.1, WS-I BP: 500)."""
    return http_status_for(fault, version)


def _retry_after(fault: SoapFault) -> dict[str, str]:
    seconds = getattr(fault, "retry_after", None)
    return {"Retry-After": str(seconds)} if seconds is not None else {}


class ChainMiddleware:
    """The WSGI application :func:`engage` returns: the chain in front of spyne.

    ``application`` is spyne's ``WsgiApplication``; ``max_message_size``
    bounds request bodies (bytes), checked before parsing.
    """

    def __init__(self, application: WsgiApplication, chain: InterceptorChain, *,
                 max_message_size: int = DEFAULT_MAX_SIZE, understands: Iterable[str] = ()) -> None:
        self.application = application
        self.chain = chain
        self.max_message_size = max_message_size
        #: the server whose request handling is run without its WSGI call (:mod:`.direct`), if it may be
        self._direct = application if direct.follows(application) else None
        #: what runs a request there: spyne's ``handle_rpc``, making its contexts without a call per
        #: field where it may (:mod:`.contexts`)
        self._handle_rpc: Callable[[dict[str, Any], StartResponse], Iterable[bytes]] | None = None
        if self._direct is not None:
            direct.watch(application)
            self._handle_rpc = application.handle_rpc
            if contexts.handles_quickly(application):
                self._handle_rpc = functools.partial(contexts.handle_rpc, application)
                contexts.read_quickly(application)
                contexts.copy_quickly(application.app.in_protocol)
        #: What the chain and the service process of SOAP headers (SOAP's mustUnderstand rule).
        self.understood = UnderstoodHeaders(chain, getattr(application, "app", None), understands)

    # -- WSGI --------------------------------------------------------------------
    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET").upper() != "POST":
            return self.application(environ, start_response)
        version = _version_from_content_type(environ.get("CONTENT_TYPE"))
        try:
            request = self._read(environ)
        except SoapFault as fault:
            log.info("refused a request to %s: %s", request_uri(environ, False), fault)
            return self._send(Response(_fault_status(version, fault), fault_envelope(fault, version),
                                       _retry_after(fault)), start_response)
        return after_response.answering(  # a buffered message's delivery, say: see there
            environ, lambda: self._send(self._process(request, environ, after=None), start_response))

    def _read(self, environ: dict[str, Any]) -> Message:
        raw_length = environ.get("CONTENT_LENGTH") or "0"
        if not raw_length.strip().isdigit():
            raise MalformedMessageError(f"Content-Length {raw_length!r} is not a byte count")
        length = int(raw_length)
        if length > self.max_message_size:
            raise MessageTooLargeError(length, self.max_message_size)
        stream = environ["wsgi.input"]
        if length:
            data = stream.read(length)
        elif environ.get("wsgi.input_terminated"):  # chunked, the server knows where it ends
            data = stream.read(self.max_message_size + 1)
        else:
            data = b""
        if not data:
            raise MalformedMessageError("the request has no body; a SOAP envelope was expected")
        root = parse_xml(data, max_size=self.max_message_size)
        envelope = Envelope.from_element(root)  # VersionMismatch / malformed structure
        content_type = environ.get("CONTENT_TYPE")
        if content_type and _version_from_content_type(content_type) is not envelope.version:
            raise UnsupportedMediaType(
                f"a SOAP {envelope.version.name} envelope was sent as {content_type.split(';')[0].strip()!r}; "
                f"SOAP {envelope.version.name} is sent as {envelope.version.content_type!r}")
        served = self._served_version()
        if served is not None and envelope.version is not served and _for_the_service(envelope):
            # spyne would fail on it only when the invoker delivers it, long after it was acknowledged
            # (WS-RM's own messages -- CreateSequence, acknowledgements -- may use either version)
            raise SoapFault(f"this service speaks SOAP {served.name}, not SOAP {envelope.version.name}",
                            code="VersionMismatch")
        self.understood.check(envelope)  # SOAP's processing model: before anything runs or is recorded
        headers = _headers_from_environ(environ)
        message = Message(root, Direction.IN, Role.SERVER, http_headers=headers,
                          address=_request_url(environ),
                          context={WSGI_ENVIRON_KEY: environ})  # who sent it: REMOTE_USER, TLS, address
        message.action = action_from_http(message.http_headers, envelope.version)
        if _utf8_as_sent(data, root):
            # the request as received stands for its tree until an interceptor may change it: the
            # WS-RM interceptor stores these bytes rather than a serialization of the tree
            message.serialized_as(data, read=envelope)
        return message

    def _served_version(self) -> SoapVersion | None:
        """The SOAP version spyne's in protocol reads (None: not a SOAP protocol spyne names)."""
        protocol = getattr(getattr(self.application, "app", None), "in_protocol", None)
        name = type(protocol).__name__ if protocol is not None else ""
        return {"Soap11": SOAP11, "Soap12": SOAP12}.get(name)

    def _send(self, response: Response, start_response: StartResponse) -> list[bytes]:
        body = response.body()
        start_response(response.status_line, response.headers(body).pairs())
        return [body]

    # -- the flow ----------------------------------------------------------------
    def deliver(self, message: Message, *, after: str | None = None,
                environ: dict[str, Any] | None = None) -> Response:
        """Finish a suspended request: the rest of the in chain, spyne, the out chain.

        For workers (the WS-RM invoker): ``message`` may be rebuilt from
        stored bytes (:meth:`Message.from_bytes` with ``resume_point`` set, or
        pass ``after``; with neither, the whole in chain runs).  Runs spyne in
        the calling thread with a synthetic WSGI environ unless ``environ`` is
        given.  Returns what the client would have been sent.
        """
        if message.direction is not Direction.IN or message.role is not Role.SERVER:
            raise ValueError(f"deliver() takes a server's received message, not {message!r}")
        return self._process(message, environ, after=after or message.resume_point)

    def _process(self, request: Message, environ: dict[str, Any] | None,
                 after: str | None) -> Response:
        try:
            if after is not None:
                self.chain.resume(request, after)
            else:
                self.chain.handle_in(request)
        except Exception as exc:
            return self._fault(request, exc)
        if request.stopped:
            return request.response or Response()
        return self._invoke(request, environ)

    def _invoke(self, request: Message, environ: dict[str, Any] | None) -> Response:
        status, headers, body, one_way, tree = self._call_spyne(request, environ)
        if one_way and status == 200:
            body, tree = b"", None  # WS-I BP R2750: nothing to say to a one-way call (so nothing to parse)
        envelope: etree._Element | None
        try:
            if tree is not None:  # spyne's own tree of its answer: not written out, so not parsed
                envelope = tree
            else:
                envelope = parse_xml(body, max_size=max(len(body), 1)) if body.strip() else None
            if envelope is not None:
                Envelope.from_element(envelope)
        except SoapFault as exc:
            log.error("spyne answered %s with HTTP %s and no readable envelope: %s",
                      request, status, exc)
            return self._fault(request, RuntimeError("unreadable service response"))
        if one_way and status == 200:
            envelope, status = None, 202  # WS-I BP R2750: nothing to say to a one-way call
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        if envelope is None:
            headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
            if self.chain.quiet_without_envelope():
                # nothing in the out chain would touch it: the answer _response_of would give
                return Response(202 if status == 200 else status, None, dict(HttpHeaders(headers).pairs()))
        reply = Message(envelope, Direction.OUT, Role.SERVER, http_headers=headers,
                        http_status=status, exchange=request.exchange, address=request.address,
                        operation=request.operation)
        try:
            self.chain.handle_out(reply)
        except Exception as exc:
            return self._fault(request, exc, through_out_chain=False)
        if reply.stopped:
            return reply.response or Response()
        return self._response_of(reply)

    @staticmethod
    def _response_of(reply: Message) -> Response:
        status = reply.http_status
        if reply.envelope is None and status in (None, 200):
            status = 202
        elif reply.envelope is not None and status in (None, 202, 204):
            status = 200
        headers = {k: v for k, v in reply.http_headers.items() if k.lower() != "content-length"}
        return Response(status, reply.envelope, headers)

    def _call_spyne(self, request: Message, environ: dict[str, Any] | None
                    ) -> tuple[int, list[tuple[str, str]], bytes, bool, etree._Element | None]:
        """spyne's answer: status, headers, body, whether the call was one-way, and the tree of
        the answer when spyne left it unwritten (:func:`_give_out_trees`; the body is empty then)."""
        body = request.to_bytes()  # the stored bytes when the tree is still theirs (a delivery)
        env = self._environ_for(request, environ)
        env["wsgi.input"] = io.BytesIO(body)
        env["CONTENT_LENGTH"] = str(len(body))
        env[ENVIRON_KEY] = request
        env[_TREE_KEY] = request.envelope  # parsed safely already: spyne reads it, not the bytes
        env.pop(_ONE_WAY_KEY, None)
        chunked = bool(getattr(self.application, "chunked", False))
        env[_QUIET_ONE_WAY_KEY] = chunked
        env.pop(_OUT_TREE_KEY, None)
        if chunked and not _listens(getattr(self.application, "event_manager", None), _WSGI_STRING_EVENTS):
            env[_OUT_TREE_KEY] = None  # spyne may leave its answer's tree here, unwritten
        server = self._direct
        if server is not None and self.application is server:  # spyne's handle_rpc without its WSGI call
            assert self._handle_rpc is not None
            direct.watching(env)
            try:
                status_line, headers, body = self._call_wsgi(env, self._handle_rpc)
            finally:
                direct.let_go(env)
        else:
            status_line, headers, body = self._call_wsgi(env, self.application)
        status = int(status_line.split(" ", 1)[0])
        return status, headers, body, bool(env.get(_ONE_WAY_KEY)), env.get(_OUT_TREE_KEY)

    @staticmethod
    def _call_wsgi(env: dict[str, Any], call: Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
                   ) -> tuple[str, list[tuple[str, str]], bytes]:
        """spyne's answer to ``call`` (its WSGI call, or its ``handle_rpc``): status line, headers and body."""
        captured: dict[str, Any] = {}
        written: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None):
            captured["status"], captured["headers"] = status, headers
            return written.append

        result = call(env, start_response)
        try:
            written.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if "status" not in captured:
            raise RuntimeError("spyne returned without calling start_response")
        return captured["status"], captured["headers"], b"".join(written)

    @staticmethod
    def _environ_for(request: Message, environ: dict[str, Any] | None) -> dict[str, Any]:
        if environ is not None:
            env = {k: v for k, v in environ.items() if not k.startswith("HTTP_")}
        else:
            env = _synthetic_environ(request.address)
        env["REQUEST_METHOD"] = "POST"
        env.pop("QUERY_STRING", None)
        version = request.soap_version or SOAP11
        for name, value in request.http_headers.items():
            key = _environ_key(name)
            if key is not None:
                env[key] = value
        env["CONTENT_TYPE"] = _utf8(request.http_headers.get("Content-Type"), version)
        return env

    def _fault(self, request: Message, error: Exception, *, through_out_chain: bool = True) -> Response:
        if isinstance(error, SoapFault):
            fault = error
            log.info("answering %s with a fault: %s", request, fault)
        else:
            log.error("could not process %s", request, exc_info=error)
            fault = SoapFault("the server could not process the message (see the server's log)",
                              code="Receiver")
        version = request.soap_version or SOAP11
        status = _fault_status(version, fault)
        reply = Message(fault_envelope(fault, version), Direction.OUT, Role.SERVER,
                        http_headers=_retry_after(fault),
                        http_status=status, exchange=request.exchange, address=request.address)
        reply.fault = fault
        if through_out_chain:
            try:
                self.chain.handle_out(reply)
            except Exception:
                log.exception("the out chain failed on the fault for %s; sending it as it is", request)
                reply.envelope = fault_envelope(fault, version)
            else:
                if reply.stopped:
                    return reply.response or Response()
        return Response(status, reply.envelope, _retry_after(fault))


def _utf8_as_sent(data: bytes, root: etree._Element) -> bool:
    """May ``data``, the bytes ``root`` was parsed from, be kept as its serialized form?  When
    they are UTF-8 without a byte order mark, as :func:`serialize` writes: a message stored
    from them reads the same anywhere a serialized one does."""
    return data[:1] == b"<" and (root.getroottree().docinfo.encoding or "").upper() in ("UTF-8", "UTF8")


@functools.lru_cache(maxsize=64)
def _base_environ(address: str | None) -> tuple[tuple[str, Any], ...]:
    """The synthetic WSGI environ of a delivery to ``address``, without its streams (computed once)."""
    env: dict[str, Any] = {}
    if address:
        url = urlsplit(address)
        env.update(SERVER_NAME=url.hostname or "127.0.0.1",
                   SERVER_PORT=str(url.port or (443 if url.scheme == "https" else 80)),
                   PATH_INFO=url.path or "/")
        env["wsgi.url_scheme"] = url.scheme or "http"
    setup_testing_defaults(env)
    return tuple((k, v) for k, v in env.items()
                 if not k.startswith("HTTP_") and k not in ("wsgi.input", "wsgi.errors"))


def _synthetic_environ(address: str | None) -> dict[str, Any]:
    """What ``wsgiref.util.setup_testing_defaults`` makes for a request to ``address`` (no HTTP_
    headers), with streams of its own."""
    env = dict(_base_environ(address))
    env["wsgi.input"] = io.BytesIO()
    env["wsgi.errors"] = io.StringIO()
    return env


def _take_chain_trees(protocol: Any) -> None:
    """Let spyne's SOAP protocol read the chain's tree of a request instead of parsing its bytes.

    The chain parsed the envelope safely (size limit, no DTD) and spyne would
    parse the serialized tree again, building the same tree: the protocol's
    ``create_in_document`` takes the tree the adapter put in the request's
    environ, and keeps its own parse for every other request.  Only where
    spyne's parser would build that same tree: a SOAP protocol reading
    documents the standard way, with no parser option that changes the tree
    (blank text removed, namespaces cleaned, another encoding forced).
    """
    from spyne.protocol.soap import Soap11

    if not isinstance(protocol, Soap11) or getattr(protocol, _TREES_TAKEN, False):
        return
    if type(protocol).create_in_document is not Soap11.create_in_document:
        return  # a protocol that reads its documents its own way
    options = getattr(protocol, "parser_kwargs", None) or {}
    encoding = (options.get("encoding") or "utf-8").lower().replace("-", "").replace("_", "")
    if options.get("remove_blank_text") or options.get("ns_clean") or encoding != "utf8":
        return
    parse = protocol.create_in_document

    def create_in_document(ctx: Any, charset: str | None = None) -> None:
        environ = getattr(ctx.transport, "req_env", None)
        tree = environ.pop(_TREE_KEY, None) if isinstance(environ, dict) else None
        if tree is None:
            parse(ctx, charset)
            return
        ctx.in_document = (tree, _elements_by_id(tree))  # what spyne's parse (lxml's XMLID) gives

    protocol.create_in_document = create_in_document
    if type(protocol).decompose_incoming_envelope is Soap11.decompose_incoming_envelope:
        protocol.decompose_incoming_envelope = functools.partial(_decompose_incoming_envelope, protocol)
    setattr(protocol, _TREES_TAKEN, True)


def _fire_event(events: Any, event_name: str, ctx: Any, *args: Any, **kwargs: Any) -> None:
    """spyne's ``EventManager.fire_event`` without the empty ordered set it builds for every event.

    spyne looks an event's handlers up with ``handlers.get(event_name, oset())``,
    building the default each time: an ``oset`` whose sentinel list refers to
    itself, a reference cycle left to the garbage collector, about 15 a message
    on a service (11 of a message's 94 cyclic objects at 16 sequences,
    ``bench_sequences_cpu.py``) and 3 Python calls each.  The same handlers run,
    in the same order."""
    handlers = events.handlers.get(event_name)
    if handlers:
        for handler in handlers:
            handler(ctx, *args, **kwargs)


def _quick_events(managers: Iterable[Any]) -> None:
    """Let each of spyne's event managers fire its events with :func:`_fire_event` (once each)."""
    from spyne import EventManager

    for events in managers:
        if (isinstance(events, EventManager) and type(events).fire_event is EventManager.fire_event
                and "fire_event" not in vars(events)):
            events.fire_event = functools.partial(_fire_event, events)


def _event_managers(application: Any, wsgi_application: Any) -> list[Any]:
    """The event managers spyne fires a request's events on: the application's, its protocols',
    the WSGI server's and those of each method (its service class's among them)."""
    managers = [application.event_manager, wsgi_application.event_manager]
    for protocol in (application.in_protocol, application.out_protocol):
        managers.append(getattr(protocol, "event_manager", None))
    for descriptors in application.interface.service_method_map.values():
        for descriptor in descriptors:
            managers.extend(getattr(descriptor, "event_managers", None) or ())
    return managers


def _listens(events: Any, names: Iterable[str]) -> bool:
    """Has spyne event manager ``events`` a listener for any of ``names``?"""
    handlers = getattr(events, "handlers", None)
    if handlers is None:
        return True
    for name in names:  # (every delivery asks: a loop, not a generator)
        if handlers.get(name):
            return True
    return False


def _give_out_trees(protocol: Any) -> None:
    """Let spyne's SOAP protocol hand its answer's tree to the adapter instead of writing it out.

    The adapter reads spyne's answer as a tree (its out chain adds headers, the
    reliable service stores it and stamps it for the HTTP response), and spyne
    builds that tree before writing it to bytes, which the adapter would parse
    again into the same tree.  For a request the adapter runs and marks
    (``_OUT_TREE_KEY`` in its environ: a chunked ``WsgiApplication`` with no
    listener of the events that see the written answer), the protocol's
    ``create_out_string`` leaves ``ctx.out_document`` there and writes nothing;
    for every other request, and where writing could change the tree (pretty
    printing), a method's own ``out_string`` or the events that read it
    (``method_return_string``), MTOM, or a protocol that writes its answer its own
    way, spyne writes it as usual.
    """
    from spyne.protocol.soap import Soap11

    if not isinstance(protocol, Soap11) or getattr(protocol, _TREES_GIVEN, False):
        return
    if type(protocol).create_out_string is not Soap11.create_out_string:
        return
    write = protocol.create_out_string

    def create_out_string(ctx: Any, charset: str | None = None) -> None:
        environ = getattr(ctx.transport, "req_env", None)
        tree = ctx.out_document
        if (not isinstance(environ, dict) or _OUT_TREE_KEY not in environ or tree is None
                or protocol.pretty_print or ctx.out_string is not None
                or getattr(ctx.descriptor, "mtom", False) or not _method_string_unheard(ctx)):
            write(ctx, charset)
            return
        environ[_OUT_TREE_KEY] = tree
        ctx.out_string = []

    protocol.create_out_string = create_out_string
    setattr(protocol, _TREES_GIVEN, True)


def _method_string_unheard(ctx: Any) -> bool:
    """No listener of the events that see the answer's bytes (the application's, the method's)."""
    if _listens(getattr(ctx.app, "event_manager", None), _STRING_EVENTS):
        return False
    descriptor = ctx.descriptor
    return descriptor is None or not any(_listens(events, _STRING_EVENTS)
                                         for events in getattr(descriptor, "event_managers", ()))


def _decompose_incoming_envelope(protocol: Any, ctx: Any, message: Any = None) -> None:
    """spyne's ``Soap11.decompose_incoming_envelope``, with ``find`` where it runs two XPaths
    per request (see :func:`_elements_by_id` for why)."""
    if message is None:
        message = protocol.REQUEST
    envelope_xml, xmlids = ctx.in_document
    soap = protocol.ns_soap_env
    if xmlids:
        resolve_hrefs(envelope_xml, xmlids)
    if envelope_xml.tag != f"{{{soap}}}Envelope":
        raise Fault("Client.SoapError", f"No {{{soap}}}Envelope element was found!")
    header_envelope = envelope_xml.find(f"{{{soap}}}Header")
    body_envelope = envelope_xml.find(f"{{{soap}}}Body")
    if header_envelope is None and body_envelope is None:
        raise Fault("Client.SoapError", "Soap envelope is empty!")
    header = list(header_envelope) if header_envelope is not None else None
    body = body_envelope[0] if body_envelope is not None and len(body_envelope) else None
    ctx.in_document = envelope_xml
    if body is not None and body.tag == f"{{{soap}}}Fault":
        ctx.in_body_doc = body
    elif body is None:  # spyne fails on it too, with an AttributeError ("Internal Error")
        raise Fault("Client.SoapError", "Soap body is empty!")
    else:
        ctx.in_header_doc = header
        ctx.in_body_doc = body
        ctx.method_request_string = body.tag
        protocol.validate_body(ctx, message)


def engage(application: Application, chain: InterceptorChain | None = None, *,
           rm_policy: RMPolicyAssertion | bool | None = None, fix_one_way_wsdl: bool = True,
           max_message_size: int = DEFAULT_MAX_SIZE,
           wsgi_application: WsgiApplication | None = None, understands: Iterable[str] = ()) -> ChainMiddleware:
    """Make ``application`` run through ``chain``; returns the WSGI app to serve.

    ``chain`` defaults to :func:`interceptors.default_chain` (WS-Addressing
    plus whatever is installed under the ``wsrm_interceptors`` entry point
    group).  ``rm_policy``: an :class:`RMPolicyAssertion` to publish, True for
    the default one (WS-RM 1.1 + wsam:Addressing), False for none, None (the
    default) to publish the default one exactly when the chain has a
    RELIABLE_MESSAGING interceptor when the WSDL is built.  Pass
    ``wsgi_application`` to wrap a spyne ``WsgiApplication`` you configured
    yourself (its WSDL must not have been built yet).  ``understands`` names
    header blocks (``"{namespace}local"``) processed in front of the chain (a
    WS-Security middleware's): with the chain's interceptors' and the methods'
    declared headers, they are what a header marked mustUnderstand may be
    (:mod:`interceptors.understood`); any other is refused with a MustUnderstand fault.
    """
    if chain is None:
        from interceptors import default_chain
        chain = default_chain()
    if wsgi_application is None:
        wsgi_application = WsgiApplication(application)
    elif wsgi_application.app is not application:
        raise ValueError("wsgi_application serves another spyne Application than the one given")
    wsdl = wsgi_application.doc.wsdl11
    if wsdl is not None and wsdl.get_interface_document() is not None:
        raise ValueError("the WSDL of this WsgiApplication was already built; engage() must "
                         "run before the first ?wsdl request so it can fix and extend it")
    if isinstance(rm_policy, bool):
        rm_policy = RMPolicyAssertion() if rm_policy else False

    if wsdl is not None and not getattr(wsdl, _ENGAGED, False):
        def on_wsdl_built(document: Any) -> None:
            definitions = document.root_elt
            if fix_one_way_wsdl:
                drop_undefined_header_messages(definitions)
            policy = rm_policy
            if policy is None:
                policy = RMPolicyAssertion() if chain.has_phase(Phase.RELIABLE_MESSAGING) else False
            if isinstance(policy, RMPolicyAssertion):  # True became one above; False: none
                attach_policy(definitions, policy)

        wsdl.event_manager.add_listener("wsdl_document_built", on_wsdl_built)
        setattr(wsdl, _ENGAGED, True)

    if not getattr(application, _ENGAGED, False):
        def note_one_way(ctx: Any) -> None:
            environ = getattr(ctx.transport, "req_env", None)
            if isinstance(environ, dict) and ENVIRON_KEY in environ:
                environ[_ONE_WAY_KEY] = bool(getattr(ctx.descriptor, "is_async", False))

        def leave_one_way_answer_unwritten(ctx: Any) -> None:
            # The adapter answers a one-way call with 202 and no body, so spyne's serialization
            # of its empty answer (an envelope built, then written) would be thrown away.
            environ = getattr(ctx.transport, "req_env", None)
            if (isinstance(environ, dict) and environ.get(_QUIET_ONE_WAY_KEY)
                    and getattr(ctx.descriptor, "is_async", False) and ctx.out_error is None):
                ctx.out_string = []  # spyne leaves an out_string set by the application alone

        application.event_manager.add_listener("method_call", note_one_way)
        application.event_manager.add_listener("method_return_object", leave_one_way_answer_unwritten)
        _take_chain_trees(getattr(application, "in_protocol", None))
        _give_out_trees(getattr(application, "out_protocol", None))
        setattr(application, _ENGAGED, True)
    _quick_events(_event_managers(application, wsgi_application))
    return ChainMiddleware(wsgi_application, chain, max_message_size=max_message_size, understands=understands)
