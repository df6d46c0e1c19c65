"""How envelopes travel: a small client interface and the WSGI endpoint that receives them.

The engine only ever needs "POST these bytes to that address and give me
what came back", so :class:`Transport` is that one method; tests and
adapters plug in their own.  :class:`HttpTransport` is the default: HTTP/1.1
on keep-alive connections that the threads sending to a peer take in turn (a
worker sends many small messages to the same peer; a fresh TCP connection
for each would dominate the cost).

The server side is :class:`RMEndpoint`, a WSGI application that hands
request bodies to the engine and turns its answer into HTTP: 202 for "taken,
nothing to say", 200 with an envelope, or a SOAP fault with the status the
SOAP HTTP bindings prescribe.  It refuses an oversized body from its
Content-Length, before reading a byte of it.  :class:`~.http_server.HttpServer`
(:mod:`.http_server`) runs any WSGI application on waitress in a background thread.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import http.client
import logging
import random
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..wire import SOAP11, SOAP12, MessageTooLargeError, SoapFault, SoapVersion, fault_envelope, to_bytes
from . import after_response
from .faults import BusyFault, UnsupportedMediaType
from .http_client import HttpConnection
from .http_server import HttpServer, HttpServerFailed

__all__ = [
    "Response", "Reply", "Transport", "TransportError", "HttpTransport", "RMEndpoint",
    "HttpServer", "HttpServerFailed", "BasicAuth", "http_status_for", "soap_version_for_content_type",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Response:
    """What came back from a peer: the HTTP status and body (b"" when there was none)."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Where the request went (set by :class:`HttpTransport`; "" when a transport does not say).
    url: str = ""
    #: Copies of the request put on the wire: 2 when a stale keep-alive connection made the
    #: transport send it again (the peer may have got both; the sender's counters include it).
    attempts: int = 1

    @property
    def ok(self) -> bool:
        """2xx, or a SOAP fault (500/400 with a body): the peer got and read the message."""
        return 200 <= self.status < 300

    @property
    def is_xml(self) -> bool:
        """The body is meant as XML (its content type says so, or it starts like XML).

        A proxy's or web server's error page (``502 Bad Gateway`` in text or
        HTML) is not: reading it as a SOAP envelope only yields a misleading
        "malformed XML" instead of the status that says what happened.
        """
        ctype = next((v for k, v in self.headers.items() if k.lower() == "content-type"), "").lower()
        if "xml" in ctype:
            return True
        if ctype and not ctype.startswith("application/octet-stream"):
            return False
        return self.body.lstrip()[:1] == b"<"

    def describe(self, address: str | None = None) -> str:
        """``HTTP 502 Bad Gateway from URL`` and, for a body that is not XML, its first line.

        What an operator needs to tell a broken proxy from a refusing peer.
        """
        reason = http.client.responses.get(self.status, "")
        text = f"HTTP {self.status}{' ' + reason if reason else ''} from {address or self.url or 'the peer'}"
        if self.body and not self.is_xml:
            first = self.body.strip().splitlines()[0][:200].decode("utf-8", "replace") if self.body.strip() else ""
            if first:
                text += f": {first!r}"
        return text


class TransportError(OSError):
    """The message could not be delivered to the peer (refused, reset, timed out, bad URL).

    Nothing is known about whether the peer got it: WS-RM's retransmission is
    what makes that harmless.
    """

    #: Copies of the request that went out before giving up (see :attr:`Response.attempts`).
    attempts: int = 1


class Transport(Protocol):
    """Sends one envelope and returns the peer's response (the whole contract)."""

    def send(self, address: str, envelope: bytes, headers: Mapping[str, str]) -> Response: ...

    def close(self) -> None: ...


class HttpTransport:
    """POST over HTTP/1.1 on keep-alive connections that any thread takes in turn.

    ``timeout`` bounds connecting and each read; a response body beyond
    ``max_response_size`` is a :class:`TransportError` (a peer cannot make us
    buffer without limit).  ``auth`` (user, password)
    adds HTTP basic authentication to every request (the destination then
    ties its sequences to that principal).  A request that fails on a reused
    connection (the peer closed it while idle) is tried once more on a fresh
    one; retrying a POST is safe here because WS-RM discards duplicates.
    The connections are :class:`~.http_client.HttpConnection`: ``http.client``'s
    connect, TLS and errors, without its per-request parsing machinery.

    A request takes the connection to its peer that went idle last (or opens one) and gives it
    back once answered, so a process holds as many connections to a peer as it had requests in
    flight to it at once, whichever threads sent them.  With one connection per thread and peer,
    as before, the sender's lanes held theirs idle beside the callers' own (a one-way caller
    sends its own message, ``one_way_caller_sends``): 16 sequences' client kept about 28
    connections open to the service, whose waitress loop asks every connection whether it is
    readable and writable and registers it with ``poll`` at each turn.  A program that makes a
    thread per call reuses the connections of the threads before it.
    """

    def __init__(self, *, timeout: float = 10.0, auth: tuple[str, str] | None = None,
                 headers: Mapping[str, str] | None = None, max_response_size: int = 64 * 1024 * 1024) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        self.timeout = timeout
        self.max_response_size = max_response_size
        self._extra = dict(headers or {})
        if auth is not None:
            user, password = auth
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            self._extra["Authorization"] = f"Basic {token}"
        #: Every connection open, idle or in use (:meth:`close` closes them all).
        self._all: set[HttpConnection] = set()
        #: Each peer's idle connections, the one given back last at the end.
        self._idle: dict[tuple[str, str, int], list[HttpConnection]] = {}
        self._all_lock = threading.Lock()

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def _split(address: str) -> tuple[tuple[str, str, int], str]:
        """(scheme, host, port) and path of ``address``: parsed once per address (a program sends
        to a few, at every message; a refused one raises each time, never cached)."""
        parts = urlsplit(address)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(f"cannot send to {address!r}: only http:// and https:// addresses are supported")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise TransportError(f"bad port in {address!r}: {exc}") from None
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return (parts.scheme, parts.hostname, port), path

    def _connection(self, peer: tuple[str, str, int], fresh: bool = False) -> tuple[HttpConnection, bool]:
        """A connection to ``peer`` for this thread alone until :meth:`_give_back` or :meth:`_drop`
        (the one that went idle last), and whether it served before (False: opened for this).

        ``fresh``: the one that went idle last was stale, so the peer closed its idle connections
        (a restart, or its keep-alive timeout): every other idle one went idle before it and is
        closed too, and a new one is opened, so a retry does not meet the same end.
        """
        stale: list[HttpConnection] = []
        with self._all_lock:
            idle = self._idle.get(peer)
            if idle and not fresh:
                return idle.pop(), True
            if fresh and idle:
                stale, self._idle[peer] = idle, []
                self._all.difference_update(stale)
            conn = HttpConnection(*peer, timeout=self.timeout)
            self._all.add(conn)
        for old in stale:
            old.close()
        return conn, False

    def _give_back(self, peer: tuple[str, str, int], conn: HttpConnection) -> None:
        """``conn`` answered and stays open: idle, for the next request to ``peer``."""
        with self._all_lock:
            if conn in self._all:  # else close() closed it meanwhile
                self._idle.setdefault(peer, []).append(conn)
                return
        conn.close()

    def _drop(self, conn: HttpConnection) -> None:
        with self._all_lock:
            self._all.discard(conn)
        conn.close()

    def send(self, address: str, envelope: bytes, headers: Mapping[str, str]) -> Response:
        peer, path = self._split(address)
        all_headers = {**self._extra, **headers, "Content-Length": str(len(envelope))}
        limit = self.max_response_size
        for attempt in (1, 2):
            conn, reused = self._connection(peer, fresh=attempt == 2)
            try:
                status, got, body, closing = conn.post(path, all_headers, envelope, limit)
            except BaseException as exc:
                self._drop(conn)
                if not isinstance(exc, (http.client.HTTPException, OSError)):
                    raise
                stale = reused and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError,
                                                    BrokenPipeError))
                if attempt == 1 and stale:
                    log.debug("connection to %s:%s went stale; retrying once on a new one", *peer[1:])
                    continue
                error = TransportError(f"POST {address} failed: {exc!r}")
                error.attempts = attempt
                raise error from exc
            if len(body) > limit:
                self._drop(conn)
                error = TransportError(f"the response from {address} exceeds {limit} bytes")
                error.attempts = attempt
                raise error
            if closing:
                self._drop(conn)
            else:
                self._give_back(peer, conn)
            return Response(status, body, dict(got), address, attempt)
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close every connection this transport opened, idle or in use."""
        with self._all_lock:
            conns, self._all = self._all, set()
            self._idle.clear()
        for conn in conns:
            try:
                conn.close()
            except OSError:
                pass


# -- the server side ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    """The engine's answer to one received envelope, before HTTP."""

    status: int = 202
    body: bytes = b""
    content_type: str | None = None
    #: Seconds for an HTTP ``Retry-After`` header (a 503: the peer should retransmit later).
    retry_after: int | None = None
    #: the lxml tree ``body`` serializes, when the engine built it (an adapter that wants the tree
    #: takes it instead of parsing ``body``); nobody else holds it
    tree: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def accepted(cls) -> Reply:
        return cls(202)

    @classmethod
    def envelope(cls, body: bytes, soap: SoapVersion, action: str | None = None, status: int = 200,
                 tree: Any = None) -> Reply:
        return cls(status, body, soap.http_headers(action)["Content-Type"], tree=tree)

    @classmethod
    def fault(cls, fault: SoapFault, soap: SoapVersion, headers: Iterable[Any] = ()) -> Reply:
        body = to_bytes(fault_envelope(fault, soap, headers))
        return cls(http_status_for(fault, soap), body, soap.http_headers()["Content-Type"],
                   retry_after=getattr(fault, "retry_after", None))


def http_status_for(fault: SoapFault, soap: SoapVersion) -> int:
    """The HTTP status of a fault: the same for the engine's endpoint and the spyne front end.

    413 for a body over the size limit, 503 (with Retry-After) when the
    destination cannot take a message now, 415 when the Content-Type names
    another SOAP version than the envelope's; otherwise the SOAP HTTP
    binding's: 1.1 always 500; 1.2 400 for Sender faults, else 500.
    """
    if isinstance(fault, MessageTooLargeError):
        return 413
    if isinstance(fault, BusyFault):
        return 503
    if isinstance(fault, UnsupportedMediaType):
        return 415
    if soap is SOAP12 and fault.code in ("Sender", "VersionMismatch", "MustUnderstand"):
        return 400 if fault.code == "Sender" else 500
    return 500


def soap_version_for_content_type(content_type: str | None) -> SoapVersion:
    """Best guess of the sender's SOAP version before its envelope is read (for early faults)."""
    return SOAP12 if (content_type or "").lower().startswith("application/soap+xml") else SOAP11


class EnvelopeHandler(Protocol):
    def handle(self, data: bytes, *, principal: str | None = None, content_type: str | None = None,
               remote_addr: str | None = None) -> Reply: ...


class RMEndpoint:
    """A WSGI application feeding POSTed envelopes to an engine (``handler.handle``).

    The authenticated principal is the WSGI ``REMOTE_USER`` (set by
    whatever authenticates in front: :class:`BasicAuth`, a reverse proxy, a
    framework).  Bodies larger than ``max_size`` are refused from the
    Content-Length header with 413 and a SOAP fault, unread; a request
    without a Content-Length is refused with 411 (HTTP/1.1 servers such as
    waitress supply it for chunked bodies).
    """

    def __init__(self, handler: EnvelopeHandler, max_size: int) -> None:
        self.handler = handler
        self.max_size = max_size

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method != "POST":
            return _plain(start_response, "405 Method Not Allowed",
                          b"POST a SOAP envelope here\n", [("Allow", "POST")])
        content_type = environ.get("CONTENT_TYPE")
        soap = soap_version_for_content_type(content_type)
        try:
            length = int(environ.get("CONTENT_LENGTH") or "")
        except ValueError:
            return _plain(start_response, "411 Length Required", b"a Content-Length is required\n")
        if length < 0:
            return _plain(start_response, "400 Bad Request", b"negative Content-Length\n")
        if length > self.max_size:
            log.warning("refused a %d-byte request from %s (limit %d) without reading it",
                        length, environ.get("REMOTE_ADDR"), self.max_size)
            reply = Reply.fault(MessageTooLargeError(length, self.max_size), soap)
            return _respond(start_response, reply)
        data = _read_exactly(environ["wsgi.input"], length)
        def respond() -> list[bytes]:
            reply = self.handler.handle(data, principal=environ.get("REMOTE_USER") or None,
                                        content_type=content_type, remote_addr=environ.get("REMOTE_ADDR"))
            return _respond(start_response, reply)

        return after_response.answering(environ, respond)  # a buffered message's delivery, say: see there


def _read_exactly(stream: Any, length: int) -> bytes:
    chunks, remaining = [], length
    while remaining > 0:
        chunk = stream.read(min(remaining, 65536))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


_REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 403: "Forbidden", 413: "Payload Too Large",
            415: "Unsupported Media Type", 500: "Internal Server Error", 503: "Service Unavailable"}


def _respond(start_response: Callable[..., Any], reply: Reply) -> list[bytes]:
    status = f"{reply.status} {_REASONS.get(reply.status, http.client.responses.get(reply.status, ''))}"
    headers = [("Content-Length", str(len(reply.body)))]
    if reply.content_type:
        headers.append(("Content-Type", reply.content_type))
    if reply.retry_after is not None:
        headers.append(("Retry-After", str(reply.retry_after)))
    start_response(status, headers)
    return [reply.body]


def _plain(start_response: Callable[..., Any], status: str, body: bytes,
           extra: list[tuple[str, str]] | None = None) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body))), *(extra or [])])
    return [body]


class BasicAuth:
    """WSGI middleware: HTTP basic authentication against a user -> password map.

    Sets ``REMOTE_USER`` for the application on success and answers 401
    otherwise.  Meant for tests and small deployments; behind a real
    authenticating proxy, let it set ``REMOTE_USER`` instead.
    """

    def __init__(self, app: Callable[..., Any], users: Mapping[str, str], realm: str = "wsrm") -> None:
        self.app = app
        self.users = dict(users)
        self.realm = realm

    def _user(self, header: str) -> str | None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        expected = self.users.get(user)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            return None
        return user

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        user = self._user(environ.get("HTTP_AUTHORIZATION", ""))
        if user is None:
            return _plain(start_response, "401 Unauthorized", b"authentication required\n",
                          [("WWW-Authenticate", f'Basic realm="{self.realm}"')])
        environ["REMOTE_USER"] = user
        return self.app(environ, start_response)


#: The lowest port :func:`free_port` hands out: above the registered services most machines run.
FREE_PORTS_FROM = 20000


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now: for a server started on it later (another process,
    a restart on the same port), or for a dead address.

    Chosen at random below the kernel's ephemeral range, not by binding port 0: a port from that
    range can be taken between now and its use by any process's outgoing connection (as its
    local port) or by another server bound to port 0, and then the server cannot bind it, or the
    dead address answers.  A loaded machine running tests in parallel does that now and then.
    """
    low = _ephemeral_low()
    if low - FREE_PORTS_FROM >= 1000:
        for _ in range(100):
            port = random.randrange(FREE_PORTS_FROM, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue  # something has it: another one
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below the range
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; the IANA range's elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152
