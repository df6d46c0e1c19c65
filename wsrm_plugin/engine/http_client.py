"""One keep-alive HTTP/1.1 connection that POSTs a body and reads the answer, in few Python steps.

The engine's sender posts thousands of small envelopes to one peer and reads
as many short answers (202, or an acknowledgement).  ``http.client`` spends
most of its time per request outside the network: the request goes out
through ``putrequest``/``putheader``/``endheaders`` (a validation and a list
append per header), and the answer's headers are parsed by the ``email``
package (a feed parser, a policy object, a ``Message`` whose every lookup
re-folds the header).  Measured in ``bench_compare``'s XA scenario, that was
about a sixth of the sending process's CPU per message.

:class:`HttpConnection` keeps what is worth keeping from ``http.client``:
its ``connect()`` opens the socket (TCP_NODELAY, TLS with the default
verifying context and SNI), and its exception classes are raised where it
would raise them, so callers tell a stale keep-alive connection
(:class:`http.client.RemoteDisconnected`) from a broken answer as before.
What it does itself: one ``sendall`` of the request line, the headers and the
body; the status line and headers read with ``readline`` on a buffered reader
of the socket; the body by Content-Length, chunked, or up to the close.  It
is stricter than ``http.client`` in one place: a body cut short of its
Content-Length is an :class:`http.client.IncompleteRead`, not a short body.
"""

from __future__ import annotations

import http.client
import re
import socket
from typing import IO

__all__ = ["HttpConnection"]

#: http.client's limits: a status or header line, and the number of headers
_MAX_LINE = 65536
_MAX_HEADERS = 100

# http.client's own checks of what goes into a request (header injection, bad URLs)
_bad_path = re.compile("[\x00-\x20\x7f]").search
_legal_header_name = re.compile(r"[^:\s][^:\r\n]*").fullmatch
_illegal_header_value = re.compile(r"\n(?![ \t])|\r(?![ \t\n])").search

_NO_BODY = frozenset((204, 304))
#: From this size on a body is not copied behind the request's head: both go out from where they
#: are, in one sendmsg (a 1 MiB message was copied once more for its head); a small one is joined.
_GATHER_FROM = 64 * 1024


class HttpConnection:
    """One HTTP/1.1 connection to ``host:port`` (``https``: TLS), opened on the first request.

    Not thread-safe: one thread uses it at a time (the transport keeps one
    per thread and peer).  After an error the connection must be closed.
    """

    __slots__ = ("_conn", "_file", "_host_header")

    def __init__(self, scheme: str, host: str, port: int, timeout: float) -> None:
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        self._conn = cls(host, port, timeout=timeout)
        self._file: IO[bytes] | None = None
        name = host if host.isascii() else host.encode("idna").decode("ascii")
        if ":" in name:
            name = f"[{name}]"
        default = 443 if scheme == "https" else 80
        self._host_header = name if port == default else f"{name}:{port}"

    def post(self, path: str, headers: dict[str, str], body: bytes, limit: int
             ) -> tuple[int, list[tuple[str, str]], bytes, bool]:
        """POST ``body`` to ``path``: (status, headers, response body, whether the peer closes).

        A body longer than ``limit`` comes back cut to ``limit + 1`` bytes, and the
        connection as closing (the rest is unread)."""
        if _bad_path(path):
            raise http.client.InvalidURL(f"URL can't contain control characters: {path!r}")
        lines = [f"POST {path} HTTP/1.1", f"Host: {self._host_header}", "Accept-Encoding: identity"]
        for name, value in headers.items():
            if not _legal_header_name(name):
                raise ValueError(f"Invalid header name {name!r}")
            if _illegal_header_value(value):
                raise ValueError(f"Invalid header value {value!r}")
            lines.append(f"{name}: {value}")
        lines.append("\r\n")
        head = "\r\n".join(lines).encode("latin-1")
        rfile = self._file
        if rfile is None:
            self._conn.connect()
            rfile = self._file = self._conn.sock.makefile("rb")
        _send(self._conn.sock, head, body)
        return _read_response(rfile, limit)

    def close(self) -> None:
        rfile, self._file = self._file, None
        try:
            if rfile is not None:
                rfile.close()
        finally:
            self._conn.close()


def _send(sock: socket.socket, head: bytes, body: bytes) -> None:
    """``head`` then ``body``, without joining a large body to its head (a copy of it)."""
    if len(body) < _GATHER_FROM or type(sock) is not socket.socket:  # TLS: no sendmsg
        sock.sendall(head + body)
        return
    parts = [memoryview(head), memoryview(body)]
    while parts:
        sent = sock.sendmsg(parts)
        while parts and sent >= len(parts[0]):
            sent -= len(parts.pop(0))
        if sent:
            parts[0] = parts[0][sent:]


def _read_line(rfile: IO[bytes], what: str) -> bytes:
    line = rfile.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise http.client.LineTooLong(what)
    return line


def _read_response(rfile: IO[bytes], limit: int) -> tuple[int, list[tuple[str, str]], bytes, bool]:
    while True:  # interim answers (100 Continue, 103 Early Hints) come before the final one
        line = _read_line(rfile, "status line")
        if not line:
            raise http.client.RemoteDisconnected("Remote end closed connection without response")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or len(parts[1]) != 3 \
                or not parts[1].isdigit():
            raise http.client.BadStatusLine(repr(line))
        status = int(parts[1])
        if status < 100:
            raise http.client.BadStatusLine(repr(line))
        headers = _read_headers(rfile)
        if status >= 200:
            break
    version = parts[0]
    length_text = chunked = connection = keep_alive = None
    for name, value in headers:
        key = name.lower()
        if key == "content-length":
            length_text = value
        elif key == "transfer-encoding":
            chunked = value.lower().rsplit(",", 1)[-1].strip() == "chunked"
        elif key == "connection":
            connection = value.lower()
        elif key == "keep-alive":
            keep_alive = value
    tokens = {t.strip() for t in connection.split(",")} if connection else set()
    if version == b"HTTP/1.0":
        closing = "keep-alive" not in tokens and keep_alive is None
    else:
        closing = "close" in tokens
    if status in _NO_BODY:
        return status, headers, b"", closing
    if chunked:
        body, cut = _read_chunked(rfile, limit)
        return status, headers, body, closing or cut
    length = _length(length_text)
    if length is None:  # the body ends where the peer closes the connection
        return status, headers, rfile.read(limit + 1), True
    if length > limit:
        return status, headers, rfile.read(limit + 1), True
    body = rfile.read(length)
    if len(body) < length:
        raise http.client.IncompleteRead(body, length - len(body))
    return status, headers, body, closing


def _read_headers(rfile: IO[bytes]) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    while True:
        line = _read_line(rfile, "header line")
        if line in (b"\r\n", b"\n", b""):
            return headers
        text = line.decode("iso-8859-1")
        if text[0] in " \t":  # an obsolete folded continuation of the header before
            if headers:
                name, value = headers[-1]
                headers[-1] = (name, f"{value} {text.strip()}")
            continue
        name, colon, value = text.partition(":")
        if colon:
            headers.append((name.strip(), value.strip()))
            if len(headers) > _MAX_HEADERS:
                raise http.client.HTTPException(f"got more than {_MAX_HEADERS} headers")


def _length(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        length = int(text)
    except ValueError:
        return None  # as http.client: read to the close
    return length if length >= 0 else None


def _read_chunked(rfile: IO[bytes], limit: int) -> tuple[bytes, bool]:
    """The chunks' data, and True when it was cut at ``limit + 1`` bytes (the rest unread)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        line = _read_line(rfile, "chunk size")
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            size = -1
        if size < 0:
            raise http.client.IncompleteRead(b"".join(chunks))
        if size == 0:
            _read_headers(rfile)  # the trailer
            return b"".join(chunks), False
        if total + size > limit:
            chunks.append(rfile.read(limit + 1 - total))
            return b"".join(chunks), True
        data = rfile.read(size)
        if len(data) < size:
            raise http.client.IncompleteRead(b"".join(chunks) + data, size - len(data))
        chunks.append(data)
        total += size
        rfile.read(2)  # the CRLF after the chunk
