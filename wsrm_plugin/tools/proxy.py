"""A lossy HTTP/1.1 proxy for loopback: the unreliable network WS-RM is built for.

``wsrm proxy`` (and :class:`LossyProxy`) sits between a WS-RM client and its
server and misbehaves on purpose, the way seed 004 used tcpmon: it DROPS,
DUPLICATES, DELAYS and REORDERS requests and can drop responses.  Every
decision is drawn from one seeded RNG in arrival order, so a run with one
client and the same ``seed`` makes the same decisions again; with no seed a
random one is chosen and logged so a failing run can be replayed.

What each fault looks like to the sender:

* drop: the body is read, nothing is forwarded, and ``drop_mode`` says what the
  sender sees: ``close`` (default) closes the connection without a response
  (a connection error, as a lost packet followed by a reset looks), ``502``
  answers 502 Bad Gateway, ``timeout`` holds the connection ``drop_timeout``
  seconds and then closes it.
* drop_response: the request IS forwarded (the server acts on it), then the
  response is thrown away as ``drop_mode`` says.  This is the case that makes
  retransmissions arrive as duplicates.
* duplicate: the request is forwarded and answered normally, and a second copy
  is sent ``duplicate_delay`` seconds later (its response is discarded).
* delay: a uniform ``delay=(low, high)`` seconds wait before forwarding.
* reorder: HTTP is request/response per connection, so a request cannot
  overtake another on the same connection.  A request picked for reordering is
  therefore answered at once with ``202 Accepted`` (what a WS-RM 1.x
  destination answers for a one-way message) and held back until
  ``reorder_window`` later requests have been forwarded, or ``reorder_hold``
  seconds have passed; the target then receives it after those later ones.
  This trick is only right for ONE-WAY traffic: a request-response operation
  (or CreateSequence) would get an empty 202 instead of its answer.  Pass a
  ``reorderable(request)`` predicate to keep such requests synchronous; a
  request it refuses is forwarded in order and its response passed through.
  As with netem's ``reorder``, the held fraction is what moves: reorder=1.0
  holds everything and therefore reorders nothing.

Faults apply to POST (the SOAP traffic).  Other methods, such as the GET that
fetches a WSDL, are always passed through so a client can load its service
description; in a WSDL fetched through the proxy the target's address is
rewritten to the proxy's (``rewrite_wsdl``), so zeep then posts to the proxy.

Only loopback is allowed, for the target and for the listening address: this
is a test tool and must not send traffic to, or accept it from, any other
host.  Host names other than ``localhost`` are refused without resolving them.

Forwarding keeps persistent HTTP/1.1 connections to the target in a small
pool: a proxy thread takes one, uses it for a whole exchange and gives it
back, so keep-alive works as it would without the proxy.
"""

from __future__ import annotations

import argparse
import heapq
import http.client
import ipaddress
import itertools
import logging
import random
import re
import signal
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TextIO
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

DROP_MODES = ("close", "502", "timeout")
MAX_BODY = 64 * 1024 * 1024

# Hop-by-hop headers (RFC 9110 7.6.1) describe one connection, not the message:
# a proxy must not pass them on.  Host and the framing headers are rebuilt.
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
    "proxy-authorization", "te", "trailer", "trailers", "transfer-encoding",
    "upgrade", "host", "content-length", "expect",
})


class NotLoopbackError(ValueError):
    """The target or listening address is not a loopback address."""


class UpstreamError(OSError):
    """The target could not be reached or broke the exchange."""


@dataclass(frozen=True)
class ProxyStats:
    """A consistent snapshot of the proxy's counters.

    ``forwarded`` counts every copy the target answered, so it equals what the
    target saw; it includes the ``duplicated`` second copies and the released
    ``reordered`` requests.  Hence, once :meth:`LossyProxy.drain` returned:
    ``forwarded == received - dropped + duplicated - failed - discarded``.
    """

    received: int = 0           # POST requests read from clients
    forwarded: int = 0          # copies delivered to the target (answered by it)
    dropped: int = 0            # requests never forwarded
    duplicated: int = 0         # extra copies delivered
    reordered: int = 0          # requests answered 202 and held back
    delayed: int = 0            # requests forwarded after a delay
    responses_dropped: int = 0  # responses thrown away after forwarding
    failed: int = 0             # forwards the target did not answer
    discarded: int = 0          # held requests / copies thrown away by stop(flush=False)
    passed_through: int = 0     # non-POST requests (e.g. WSDL GETs), never faulted

    def __str__(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


@dataclass(frozen=True)
class ProxiedRequest:
    """A request as read from the client, ready to be forwarded (maybe twice)."""

    seq: int
    method: str
    path: str                       # the path sent to the target
    headers: tuple[tuple[str, str], ...]  # end-to-end headers only
    body: bytes

    def header(self, name: str, default: str | None = None) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), default)


@dataclass(frozen=True)
class _Response:
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True)
class _Decision:
    drop: bool
    reorder: bool
    duplicate: bool
    drop_response: bool
    delay: float


@dataclass(eq=False)
class _Held:
    request: ProxiedRequest
    duplicate: bool
    seen: int = 0  # later requests forwarded since it was held
    timer: _Task | None = None


def lose_first(marker: bytes, *, response: bool = False) -> Callable[[ProxiedRequest], str | None]:
    """A :class:`LossyProxy` ``script`` losing the first POST whose body contains ``marker``.

    Its request is dropped (the target never sees it), or with ``response``
    its response (the target acted on it; the sender hears nothing and sends
    it again, which the target then gets as a duplicate).  Later copies pass.
    """
    lost = threading.Event()

    def script(request: ProxiedRequest) -> str | None:
        if request.method != "POST" or marker not in request.body or lost.is_set():
            return None
        lost.set()
        return "drop_response" if response else "drop"

    return script


def is_post(request: ProxiedRequest) -> bool:
    """The default ``reorderable`` predicate: every POST may be answered 202."""
    return request.method == "POST"


# --------------------------------------------------------------------------- #
# Address checks


_ACTION_PARAM = re.compile(r';\s*action\s*=\s*"?([^";]*)"?', re.IGNORECASE)


def soap_action(request: ProxiedRequest) -> str:
    """The request's SOAP action: SOAP 1.1's SOAPAction header or SOAP 1.2's ``action`` parameter."""
    header = request.header("SOAPAction")
    if header is not None and header.strip('" '):
        return header.strip().strip('"')
    match = _ACTION_PARAM.search(request.header("Content-Type") or "")
    return match.group(1) if match else ""


def require_loopback(host: str, what: str = "address") -> None:
    """Refuse anything but 127.0.0.0/8, ::1 and ``localhost`` (never resolved)."""
    if host.lower() == "localhost":
        return
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise NotLoopbackError(
            f"refusing {what} {host!r}: only loopback addresses are allowed "
            "(127.0.0.1, ::1 or localhost); other host names are not resolved so "
            "that no traffic can leave this machine") from None
    if not ip.is_loopback:
        raise NotLoopbackError(
            f"refusing {what} {host}: only loopback addresses (127.0.0.0/8, ::1, "
            "localhost) are allowed; this proxy is a test tool and must not talk "
            "to other hosts")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _probability(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability between 0 and 1, got {value}")
    return value


# --------------------------------------------------------------------------- #
# Background work: second copies and held-back requests


class _Task:
    __slots__ = ("due", "seq", "fn", "kind", "cancelled")

    def __init__(self, due: float, seq: int, fn: Callable[[], None], kind: str) -> None:
        self.due, self.seq, self.fn, self.kind = due, seq, fn, kind
        self.cancelled = False

    def __lt__(self, other: _Task) -> bool:
        return (self.due, self.seq) < (other.due, other.seq)


class _Scheduler:
    """One thread running delayed work in due order.

    One thread (not a timer per task) keeps the order in which copies reach
    the target the order in which they fell due, and is one thing to join.
    """

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._heap: list[_Task] = []
        self._seq = itertools.count()
        self._live = 0          # scheduled, not cancelled, not finished
        self._closed = False
        self._run_pending = True
        self.discarded: dict[str, int] = {}
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def call_later(self, delay: float, fn: Callable[[], None], kind: str) -> _Task:
        with self._cond:
            if self._closed:
                raise RuntimeError("the proxy is stopped")
            task = _Task(time.monotonic() + delay, next(self._seq), fn, kind)
            heapq.heappush(self._heap, task)
            self._live += 1
            self._cond.notify_all()
            return task

    def cancel(self, task: _Task) -> None:
        with self._cond:
            if not task.cancelled and task in self._heap:
                task.cancelled = True
                self._live -= 1
                self._cond.notify_all()

    def wait_idle(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._live == 0, timeout)

    def close(self, run_pending: bool) -> None:
        with self._cond:
            self._closed = True
            self._run_pending = run_pending
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0].cancelled:
                        heapq.heappop(self._heap)
                    if self._closed:
                        if not self._heap:
                            return
                        task = heapq.heappop(self._heap)
                        if not self._run_pending:
                            self.discarded[task.kind] = self.discarded.get(task.kind, 0) + 1
                            self._live -= 1
                            continue
                        break
                    if self._heap and self._heap[0].due <= time.monotonic():
                        task = heapq.heappop(self._heap)
                        break
                    timeout = self._heap[0].due - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
            try:
                task.fn()
            except Exception:  # noqa: BLE001 -- one broken task must not stop the others
                log.exception("proxy background task %s failed", task.kind)
            finally:
                with self._cond:
                    self._live -= 1
                    self._cond.notify_all()


# --------------------------------------------------------------------------- #
# Connections to the target


class _UpstreamPool:
    """Persistent connections to the target, reused across exchanges."""

    def __init__(self, host: str, port: int, host_header: str, timeout: float,
                 max_idle: int = 8) -> None:
        # "localhost" is dialled as 127.0.0.1: a resolver cannot send us elsewhere.
        self._dial = "127.0.0.1" if host.lower() == "localhost" else host
        self._port = port
        self._host_header = host_header
        self._timeout = timeout
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._all: set[http.client.HTTPConnection] = set()
        self._closed = False

    def request(self, method: str, path: str, headers: tuple[tuple[str, str], ...],
                body: bytes) -> _Response:
        """Forward one exchange; a reused connection that fails before any answer is retried once.

        A target that restarted closed every connection the pool keeps, and
        the first request on each finds out only when it writes or waits: the
        request never reached the target, so a fresh connection is safe.  The
        retry never takes another pooled connection (it is as stale as the
        first), and the other idle ones are dropped with it.
        """
        for attempt in (1, 2):
            conn, reused = self._acquire(fresh=attempt > 1)
            try:
                conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                conn.putheader("Host", self._host_header)
                for name, value in headers:
                    conn.putheader(name, value)
                if body or method in ("POST", "PUT", "PATCH"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body or None)
                resp = conn.getresponse()  # raises before any byte of a status line arrived
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                    ConnectionAbortedError) as exc:
                self._discard(conn)
                if reused and attempt == 1 and not self._closed:
                    log.info("a kept-alive connection to the target was closed (%s); dropping the idle "
                             "ones and retrying on a new connection", exc)
                    self._discard_idle()
                    continue
                raise UpstreamError(f"the target closed the connection: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                self._discard(conn)
                raise UpstreamError(f"cannot reach the target: {exc!r}") from exc
            try:
                data = b"" if method == "HEAD" else resp.read()
            except (OSError, http.client.HTTPException) as exc:  # the answer began: never resent
                self._discard(conn)
                raise UpstreamError(f"the target broke off its response: {exc!r}") from exc
            response = _Response(resp.status, resp.reason, tuple(resp.getheaders()), data)
            if resp.will_close:
                self._discard(conn)
            else:
                self._release(conn)
            return response
        raise AssertionError("unreachable")

    def _discard_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._all.difference_update(idle)
        for conn in idle:
            conn.close()

    def _acquire(self, fresh: bool = False) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._closed:
                raise UpstreamError("the proxy is stopped")
            if self._idle and not fresh:
                return self._idle.pop(), True
            conn = http.client.HTTPConnection(self._dial, self._port, timeout=self._timeout)
            self._all.add(conn)
            return conn, False

    def _release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        self._discard(conn)

    def _discard(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._all.discard(conn)
        conn.close()

    def interrupt(self) -> None:
        """Break exchanges in progress (their threads see an error and finish)."""
        with self._lock:
            conns = list(self._all)
        for conn in conns:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._all, self._idle = list(self._all), set(), []
        for conn in conns:
            conn.close()


# --------------------------------------------------------------------------- #
# The listening side


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the body waits for
    # the peer's delayed ACK (40 ms per exchange on Linux).
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        self.timeout = self.server.proxy.idle_timeout  # type: ignore[misc]  # typeshed: a ClassVar; setup() reads it per instance
        super().setup()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 -- base name
        log.debug("%s %s", self.address_string(), format % args)

    def _dispatch(self) -> None:
        self.server.proxy._serve(self)

    do_POST = do_GET = do_HEAD = do_PUT = do_DELETE = do_OPTIONS = do_PATCH = _dispatch

    def read_body(self) -> bytes:
        encoding = self.headers.get("Transfer-Encoding")
        if encoding is not None:
            if encoding.strip().lower() != "chunked":
                raise _BadRequest(501, f"unsupported Transfer-Encoding {encoding!r}: "
                                       "send a Content-Length or a chunked body")
            return self._read_chunked()
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        try:
            size = int(length)
            if size < 0:
                raise ValueError
        except ValueError:
            raise _BadRequest(400, f"invalid Content-Length {length!r}") from None
        if size > MAX_BODY:
            raise _BadRequest(413, f"body of {size} bytes is over the {MAX_BODY} byte limit")
        body = self.rfile.read(size)
        if len(body) != size:
            raise _BadRequest(400, "the body is shorter than its Content-Length")
        return body

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _BadRequest(400, f"bad chunk size line {line[:40]!r}") from None
            if size == 0:
                while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers: not forwarded
                return b"".join(parts)
            total += size
            if total > MAX_BODY:
                raise _BadRequest(413, f"chunked body is over the {MAX_BODY} byte limit")
            chunk = self.rfile.read(size)
            if len(chunk) != size:
                raise _BadRequest(400, "the chunked body ended early")
            parts.append(chunk)
            self.rfile.readline(3)

    def end_to_end_headers(self) -> tuple[tuple[str, str], ...]:
        listed = {t.strip().lower() for v in self.headers.get_all("Connection", [])
                  for t in v.split(",")}
        return tuple((k, v) for k, v in self.headers.items()
                     if k.lower() not in _HOP_BY_HOP and k.lower() not in listed)

    def send_plain(self, status: int, text: str = "") -> None:
        body = text.encode()
        self.send_response(status)
        if body:
            self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_upstream(self, resp: _Response) -> None:
        self.send_response_only(resp.status, resp.reason)
        for name, value in resp.headers:
            if name.lower() not in _HOP_BY_HOP or (
                    self.command == "HEAD" and name.lower() == "content-length"):
                self.send_header(name, value)
        no_body = resp.status < 200 or resp.status in (204, 304)
        if self.command != "HEAD" and not no_body:
            self.send_header("Content-Length", str(len(resp.body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and not no_body:
            self.wfile.write(resp.body)

    def drop_connection(self) -> None:
        """Close without a response: the sender sees the connection go away."""
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    """Tracks its connections so stop() can close them and join their threads."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], proxy: LossyProxy) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.proxy = proxy
        self._conn_lock = threading.Lock()
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._conn_seq = itertools.count(1)
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls getfqdn(), a reverse DNS lookup: not needed.
        socketserver.TCPServer.server_bind(self)
        host, self.server_port = self.server_address[:2]
        self.server_name = str(host)

    def process_request(self, request, client_address) -> None:
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address),
            name=f"wsrm-proxy-{self.server_port}-conn-{next(self._conn_seq)}", daemon=True)
        with self._conn_lock:
            self._conns[request] = thread
        thread.start()

    def _serve_connection(self, request: socket.socket, client_address) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 -- reported by handle_error
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._conn_lock:
                self._conns.pop(request, None)

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.debug("connection from %s ended: %r", client_address, exc)
        else:
            log.exception("proxy error on the connection from %s", client_address)

    def close_connections(self) -> list[threading.Thread]:
        with self._conn_lock:
            items = list(self._conns.items())
        for sock, _ in items:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return [thread for _, thread in items]


# --------------------------------------------------------------------------- #
# The proxy


class LossyProxy:
    """A seeded, misbehaving HTTP/1.1 proxy from a loopback port to a loopback target.

    Use it as a context manager (or call :meth:`start` and :meth:`stop`); send
    to :attr:`url` instead of the target.  Call :meth:`drain` before comparing
    :attr:`stats` with what the target saw: held requests and second copies
    are sent in the background.
    """

    def __init__(
        self,
        target: str,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        drop: float = 0.0,
        duplicate: float = 0.0,
        delay: tuple[float, float] | float = (0.0, 0.0),
        reorder: float = 0.0,
        drop_response: float = 0.0,
        seed: int | None = None,
        path_rewrite: bool = False,
        *,
        drop_mode: str = "close",
        drop_timeout: float = 5.0,
        reorder_window: int = 3,
        reorder_hold: float = 0.2,
        duplicate_delay: float = 0.01,
        reorderable: Callable[[ProxiedRequest], bool] = is_post,
        rewrite_wsdl: bool = True,
        forward_timeout: float = 30.0,
        idle_timeout: float = 120.0,
        script: Callable[[ProxiedRequest], str | None] | None = None,
    ) -> None:
        """
        :param target: ``http://127.0.0.1:PORT/prefix`` (loopback only).
        :param path_rewrite: False (default): request paths are forwarded
            unchanged and :attr:`url` has the target's path, so it is a drop-in
            replacement.  True: the proxy serves the target's prefix at its
            root (``/x`` is forwarded as ``/prefix/x``, ``/`` as ``/prefix``).
        :param drop_mode: what the sender of a dropped request (or the waiter
            for a dropped response) sees: ``close``, ``502`` or ``timeout``
            (held ``drop_timeout`` seconds, then closed).
        :param reorderable: which POSTs may be answered 202 and held back;
            refuse request-response operations here.
        :param script: a fault chosen for a request rather than drawn:
            ``script(request)`` returns ``"drop"``, ``"drop_response"`` or None
            (the drawn decision stands); see :func:`lose_first`.  The draws are
            made all the same, so a script does not shift the seeded decisions.
        """
        parts = urlsplit(target)
        if parts.scheme != "http":
            raise ValueError(f"target {target!r} must be an http:// URL (https is not "
                             "supported: the proxy has to read the messages)")
        if not parts.hostname:
            raise ValueError(f"target {target!r} has no host")
        if parts.query or parts.fragment:
            raise ValueError(f"target {target!r} must not have a query or fragment")
        require_loopback(parts.hostname, "target")
        require_loopback(listen[0], "listening address")
        try:
            target_port = parts.port or 80
        except ValueError as exc:
            raise ValueError(f"target {target!r}: {exc}") from None
        if drop_mode not in DROP_MODES:
            raise ValueError(f"drop_mode must be one of {', '.join(DROP_MODES)}, got {drop_mode!r}")
        if isinstance(delay, (int, float)):
            delay = (float(delay), float(delay))
        low, high = (float(x) for x in delay)
        if not 0.0 <= low <= high:
            raise ValueError(f"delay must be a (low, high) range with 0 <= low <= high, got {delay}")
        if reorder_window < 1:
            raise ValueError(f"reorder_window must be at least 1, got {reorder_window}")
        for name, value in (("drop_timeout", drop_timeout), ("reorder_hold", reorder_hold),
                            ("duplicate_delay", duplicate_delay)):
            if value < 0:
                raise ValueError(f"{name} must not be negative, got {value}")
        for name, value in (("forward_timeout", forward_timeout), ("idle_timeout", idle_timeout)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")

        self.target = target
        self.drop = _probability("drop", drop)
        self.duplicate = _probability("duplicate", duplicate)
        self.reorder = _probability("reorder", reorder)
        self.drop_response = _probability("drop_response", drop_response)
        self.delay = (low, high)
        self.drop_mode = drop_mode
        self.drop_timeout = drop_timeout
        self.reorder_window = reorder_window
        self.reorder_hold = reorder_hold
        self.duplicate_delay = duplicate_delay
        self.reorderable = reorderable
        self.rewrite_wsdl = rewrite_wsdl
        self.path_rewrite = path_rewrite
        self.script = script
        self.idle_timeout = idle_timeout
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**32)
        self._rng = random.Random(self.seed)

        self._listen = listen
        self._target_host = parts.hostname
        self._target_port = target_port
        self._target_origin = f"http://{parts.netloc}"
        self._prefix = parts.path or "/"
        self._pool = _UpstreamPool(parts.hostname, target_port, parts.netloc, forward_timeout)

        self._lock = threading.Lock()
        self._counts = {f.name: 0 for f in fields(ProxyStats)}
        self._by_action: dict[str, int] = {}
        self._seq = itertools.count(1)
        self._held: list[_Held] = []
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._accept_thread: threading.Thread | None = None
        self._scheduler: _Scheduler | None = None
        self._stopped = False

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> LossyProxy:
        if self._server is not None or self._stopped:
            raise RuntimeError("a LossyProxy starts once; create a new one")
        self._server = _Server(self._listen, self)
        self._scheduler = _Scheduler(f"wsrm-proxy-{self.port}-scheduler")
        self._scheduler.start()
        self._accept_thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
            name=f"wsrm-proxy-{self.port}-accept", daemon=True)
        self._accept_thread.start()
        log.info("lossy proxy %s -> %s (seed %d, drop %.2f/%s, duplicate %.2f, delay %s, "
                 "reorder %.2f, drop_response %.2f)", self.url, self.target, self.seed,
                 self.drop, self.drop_mode, self.duplicate, self.delay, self.reorder,
                 self.drop_response)
        return self

    def stop(self, flush: bool = True, timeout: float = 10.0) -> None:
        """Stop listening, close every connection and join every thread.

        With ``flush`` the requests still held back and the copies still due
        are forwarded first (to a target that is gone, that fails quickly);
        without it they are counted as ``discarded``.  ``timeout`` bounds the
        wait for exchanges in progress before their connections are cut.
        """
        if self._server is None or self._stopped:
            self._stopped = True
            return
        self._stopped = True
        self._stopping.set()  # cuts delays and drop_mode="timeout" holds short
        self._server.shutdown()
        assert self._accept_thread is not None and self._scheduler is not None
        self._accept_thread.join()
        self._server.server_close()
        threads = self._server.close_connections()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            log.warning("exchanges still in progress after %.1f s; cutting them", timeout)
            self._pool.interrupt()
            for thread in threads:
                thread.join()
        if flush:
            self.flush()
        else:
            with self._lock:
                held, self._held = self._held, []
            for h in held:
                if h.timer is not None:
                    self._scheduler.cancel(h.timer)
            self._count("discarded", len(held))
        self._scheduler.close(run_pending=flush)
        self._count("discarded", sum(self._scheduler.discarded.values()))
        self._pool.close()
        log.info("lossy proxy %s stopped: %s", self.url, self.stats)

    def __enter__(self) -> LossyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        return self._server.server_port

    @property
    def url(self) -> str:
        """Where clients send instead of the target."""
        path = "/" if self.path_rewrite else self._prefix
        return f"http://{_url_host(self._listen[0])}:{self.port}{path}"

    @property
    def stats(self) -> ProxyStats:
        with self._lock:
            return ProxyStats(**self._counts)

    def received_by_action(self) -> dict[str, int]:
        """POST requests read from clients, by SOAP action ("" when a request names none).

        What a sender's counters can be checked against: every CreateSequence
        beyond a sequence's first is a retry, every copy of an application
        message beyond its first a retransmission, whatever the proxy then did
        with it.
        """
        with self._lock:
            return dict(self._by_action)

    def flush(self) -> None:
        """Forward every held-back request now (they still arrive late)."""
        with self._lock:
            held, self._held = self._held, []
        self._send_held(held)

    def drain(self, timeout: float | None = 30.0) -> bool:
        """Flush held requests and wait until every background copy was sent.

        Returns False if that took longer than ``timeout``.
        """
        self.flush()
        if self._scheduler is None:
            return True
        return self._scheduler.wait_idle(timeout)

    # -- the decisions --------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self._counts[name] += n

    def _decide(self) -> _Decision:
        # Always draw the same numbers in the same order, whatever the outcome,
        # so that one decision never shifts the ones after it.
        with self._lock:
            r = self._rng
            return _Decision(
                drop=r.random() < self.drop,
                reorder=r.random() < self.reorder,
                duplicate=r.random() < self.duplicate,
                drop_response=r.random() < self.drop_response,
                delay=r.uniform(*self.delay),
            )

    def _target_path(self, raw: str) -> str:
        if raw.startswith(("http://", "https://")):  # absolute-form request target
            p = urlsplit(raw)
            raw = (p.path or "/") + (f"?{p.query}" if p.query else "")
        if not self.path_rewrite:
            return raw
        path, sep, query = raw.partition("?")
        base = self._prefix.rstrip("/")
        mapped = self._prefix if path in ("", "/") else base + path
        return mapped + sep + query

    def _serve(self, h: _Handler) -> None:
        try:
            body = h.read_body()
        except _BadRequest as exc:
            h.close_connection = True
            h.send_plain(exc.status, f"{exc}\n")
            return
        seq = next(self._seq)
        request = ProxiedRequest(seq, h.command, self._target_path(h.path),
                                 h.end_to_end_headers(), body)
        if request.method != "POST":
            self._count("passed_through")
            self._pass_through(h, request)
            return

        self._count("received")
        action = soap_action(request)
        with self._lock:
            self._by_action[action] = self._by_action.get(action, 0) + 1
        d = self._decide()
        scripted = self.script(request) if self.script is not None else None
        if scripted is not None:
            if scripted not in ("drop", "drop_response"):
                raise ValueError(f"a proxy script returns 'drop', 'drop_response' or None, not {scripted!r}")
            d = replace(d, drop=scripted == "drop", drop_response=scripted == "drop_response",
                        reorder=False, duplicate=False)
        if d.drop:
            log.debug("#%d %s: drop (%s)", seq, request.path, self.drop_mode)
            self._count("dropped")
            self._fail_sender(h)
            return
        if d.reorder and self.reorderable(request):
            log.debug("#%d %s: hold back for reordering, answer 202", seq, request.path)
            self._hold(request, d.duplicate)
            h.send_plain(202)
            return
        if d.delay > 0:
            log.debug("#%d %s: delay %.3f s", seq, request.path, d.delay)
            self._count("delayed")
            self._stopping.wait(d.delay)
        try:
            response = self._forward(request)
        except UpstreamError as exc:
            log.debug("#%d %s: target failed: %s", seq, request.path, exc)
            self._count("failed")
            self._release_due()
            h.send_plain(502, f"wsrm proxy: {exc}\n")
            return
        if d.duplicate:
            self._schedule_copy(request)
        self._release_due()
        if d.drop_response:
            log.debug("#%d %s: drop the response (%s)", seq, request.path, self.drop_mode)
            self._count("responses_dropped")
            self._fail_sender(h)
            return
        h.send_upstream(response)

    def _pass_through(self, h: _Handler, request: ProxiedRequest) -> None:
        try:
            response = self._pool.request(request.method, request.path, request.headers,
                                          request.body)
        except UpstreamError as exc:
            h.send_plain(502, f"wsrm proxy: {exc}\n")
            return
        if self.rewrite_wsdl:
            response = self._rewrite_addresses(response)
        h.send_upstream(response)

    def _rewrite_addresses(self, response: _Response) -> _Response:
        """Point a fetched WSDL's service address at the proxy, not the target."""
        headers = {k.lower(): v for k, v in response.headers}
        if (response.status != 200 or "xml" not in headers.get("content-type", "")
                or headers.get("content-encoding", "identity") != "identity"):
            return response
        if self.path_rewrite:
            old = self._target_origin + self._prefix.rstrip("/")
            new = self.url.rstrip("/")
        else:
            old, new = self._target_origin, self.url[: -len(self._prefix)]
        pattern = re.compile(re.escape(old.encode()) + rb"(?![0-9A-Za-z.\-])")
        body = pattern.sub(new.encode().replace(b"\\", b"\\\\"), response.body)
        return _Response(response.status, response.reason, response.headers, body)

    def _fail_sender(self, h: _Handler) -> None:
        if self.drop_mode == "502":
            h.send_plain(502, "wsrm proxy: dropped on purpose\n")
            return
        if self.drop_mode == "timeout":
            self._stopping.wait(self.drop_timeout)
        h.drop_connection()

    def _forward(self, request: ProxiedRequest) -> _Response:
        response = self._pool.request(request.method, request.path, request.headers,
                                      request.body)
        self._count("forwarded")
        log.debug("#%d %s: forwarded, target answered %d", request.seq, request.path,
                  response.status)
        return response

    def _forward_quietly(self, request: ProxiedRequest, why: str) -> bool:
        try:
            self._forward(request)
            return True
        except UpstreamError as exc:
            log.debug("#%d %s: %s copy not delivered: %s", request.seq, request.path, why, exc)
            self._count("failed")
            return False

    # -- duplicates and reordering -------------------------------------------

    def _schedule_copy(self, request: ProxiedRequest) -> None:
        assert self._scheduler is not None
        log.debug("#%d %s: second copy in %.3f s", request.seq, request.path,
                  self.duplicate_delay)
        try:
            self._scheduler.call_later(self.duplicate_delay, lambda: self._send_copy(request),
                                       "duplicate")
        except RuntimeError:
            self._count("discarded")

    def _send_copy(self, request: ProxiedRequest) -> None:
        if self._forward_quietly(request, "duplicate"):
            self._count("duplicated")

    def _hold(self, request: ProxiedRequest, duplicate: bool) -> None:
        assert self._scheduler is not None
        held = _Held(request, duplicate)
        self._count("reordered")
        with self._lock:
            self._held.append(held)
            try:
                held.timer = self._scheduler.call_later(
                    self.reorder_hold, lambda: self._release_one(held), "reorder")
            except RuntimeError:  # stopping: flush() or stop() takes it from the list
                pass

    def _release_one(self, held: _Held) -> None:
        with self._lock:
            if held not in self._held:
                return
            self._held.remove(held)
        log.debug("#%d %s: hold time over", held.request.seq, held.request.path)
        self._send_held([held])

    def _release_due(self) -> None:
        """Count one more overtaking request for each held one; release the due ones."""
        with self._lock:
            due = []
            for held in self._held:
                held.seen += 1
                if held.seen >= self.reorder_window:
                    due.append(held)
            for held in due:
                self._held.remove(held)
        self._send_held(due)

    def _send_held(self, held: list[_Held]) -> None:
        for h in held:
            if h.timer is not None and self._scheduler is not None:
                self._scheduler.cancel(h.timer)
            log.debug("#%d %s: forwarding the held-back request", h.request.seq, h.request.path)
            if self._forward_quietly(h.request, "reordered") and h.duplicate:
                self._schedule_copy(h.request)


# --------------------------------------------------------------------------- #
# Command line


def _probability_arg(text: str) -> float:
    try:
        return _probability("value", float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _delay_arg(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    try:
        lo = float(low)
        hi = float(high) if high else lo
    except ValueError:
        raise argparse.ArgumentTypeError(f"delay {text!r} is not SECONDS or LOW:HIGH") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"delay {text!r} needs 0 <= LOW <= HIGH")
    return lo, hi


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``wsrm proxy`` options (also used by ``python -m wsrm_plugin.tools.proxy``)."""
    p.add_argument("--target", required=True, metavar="URL",
                   help="the server to forward to, e.g. http://127.0.0.1:8000/svc (loopback only)")
    p.add_argument("--listen", default="127.0.0.1", metavar="HOST",
                   help="loopback address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0,
                   help="port to listen on (default 0: any free port, printed at start)")
    for name, what in (("drop", "drop a request"), ("duplicate", "send a request twice"),
                       ("reorder", "hold a request back and answer 202 (one-way traffic only)"),
                       ("drop-response", "forward a request but drop its response")):
        p.add_argument(f"--{name}", type=_probability_arg, default=0.0, metavar="P",
                       help=f"probability to {what} (default 0)")
    p.add_argument("--delay", type=_delay_arg, default=(0.0, 0.0), metavar="LOW[:HIGH]",
                   help="seconds to wait before forwarding, uniform in LOW..HIGH (default 0)")
    p.add_argument("--drop-mode", choices=DROP_MODES, default="close",
                   help="what the sender of a dropped message sees (default close)")
    p.add_argument("--drop-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="with --drop-mode timeout: how long to hold the connection (default 5)")
    p.add_argument("--reorder-window", type=int, default=3, metavar="N",
                   help="release a held request after N later ones were forwarded (default 3)")
    p.add_argument("--reorder-hold", type=float, default=0.2, metavar="SECONDS",
                   help="release a held request after this long at the latest (default 0.2)")
    p.add_argument("--duplicate-delay", type=float, default=0.01, metavar="SECONDS",
                   help="when the second copy of a duplicated request is sent (default 0.01)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the fault decisions; a run with one client is reproducible")
    p.add_argument("--path-rewrite", action="store_true",
                   help="serve the target's path prefix at the proxy's root")
    p.add_argument("--no-wsdl-rewrite", dest="rewrite_wsdl", action="store_false",
                   help="do not point WSDLs fetched through the proxy at the proxy")
    p.add_argument("--stats-interval", type=_interval_arg, default=0.0, metavar="SECONDS",
                   help="print the counters every SECONDS while running (default: only when "
                        "stopped; SIGUSR1 prints them at any time)")


def _interval_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"interval {text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"interval {text!r} must be >= 0 (0: only when stopped)")
    return value


def _install_signal_handlers(stop: threading.Event, show: threading.Event) -> Callable[[], None]:
    """SIGINT/SIGTERM stop the proxy; SIGUSR1 asks for the counters (as ``dd`` does with SIGUSR1)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    wanted = [(signal.SIGINT, stop), (signal.SIGTERM, stop)]
    if hasattr(signal, "SIGUSR1"):
        wanted.append((signal.SIGUSR1, show))
    previous = {sig: signal.getsignal(sig) for sig, _ in wanted}
    for sig, event in wanted:
        def on_signal(signum: int, frame: object, event: threading.Event = event) -> None:
            event.set()
        signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return restore


def run(args: argparse.Namespace, stop: threading.Event | None = None,
        out: TextIO | None = None) -> int:
    """Run the proxy until SIGINT/SIGTERM (or ``stop`` is set), then print its counters.

    The counters are also printed every ``--stats-interval`` seconds and on
    SIGUSR1, so a long run can be watched without stopping it.
    """
    out = out or sys.stdout
    stop = stop or threading.Event()
    show = threading.Event()
    interval = getattr(args, "stats_interval", 0.0) or 0.0
    try:
        proxy = LossyProxy(
            args.target, listen=(args.listen, args.port), drop=args.drop,
            duplicate=args.duplicate, delay=args.delay, reorder=args.reorder,
            drop_response=args.drop_response, seed=args.seed, path_rewrite=args.path_rewrite,
            drop_mode=args.drop_mode, drop_timeout=args.drop_timeout,
            reorder_window=args.reorder_window, reorder_hold=args.reorder_hold,
            duplicate_delay=args.duplicate_delay, rewrite_wsdl=args.rewrite_wsdl)
    except ValueError as exc:
        sys.stderr.write(f"wsrm proxy: error: {exc}\n")
        return 2
    restore = _install_signal_handlers(stop, show)
    try:
        with proxy:
            out.write(f"proxying {proxy.url} -> {proxy.target} (seed {proxy.seed})\n")
            out.flush()
            next_show = time.monotonic() + interval if interval else None
            while not stop.wait(0.1):
                if next_show is not None and time.monotonic() >= next_show:
                    next_show += interval
                    show.set()
                if show.is_set():
                    show.clear()
                    out.write(f"stats: {proxy.stats}\n")
                    out.flush()
    finally:
        restore()
    out.write(f"stats: {proxy.stats}\n")
    out.flush()
    return 0


def main(argv: list[str] | None = None, stop: threading.Event | None = None,
         out: TextIO | None = None) -> int:
    p = argparse.ArgumentParser(prog="wsrm proxy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="more logging (-v info, -vv every decision)")
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(args, stop=stop, out=out)


if __name__ == "__main__":
    sys.exit(main())
