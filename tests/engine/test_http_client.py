"""HttpTransport's own HTTP/1.1 reading and writing against a peer that answers byte by byte as scripted.

Real sockets on 127.0.0.1.  The scripted peer answers each request with the
next canned answer, so every way a real server may frame an answer (chunked,
interim 100, HTTP/1.0, up to the close, cut short) is met on the wire.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time

import pytest

from wsrm_plugin.engine import HttpTransport, TransportError


class ScriptedPeer:
    """Accepts connections; answers the n-th request with ``answers[n]`` (bytes), then does what
    ``after[n]`` says: ``"keep"`` the connection, ``"close"`` it."""

    def __init__(self, answers: list[bytes], after: list[str] | None = None,
                 tls: tuple[str, str] | None = None) -> None:
        self.answers = answers
        self.after = after or ["keep"] * len(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self.handshakes_refused = 0
        self._tls: ssl.SSLContext | None = None
        if tls is not None:  # (certificate, key): answer over TLS
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(*tls)
        self._listener = socket.create_server(("127.0.0.1", 0))
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self._listener.getsockname()[1]}/svc"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while len(self.requests) < len(self.answers):
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            if self._tls is not None:
                try:
                    conn = self._tls.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError):
                    self.handshakes_refused += 1  # the client refused our certificate
                    conn.close()
                    continue
            with conn:
                while len(self.requests) < len(self.answers):
                    request = _read_request(conn)
                    if request is None:
                        break
                    n = len(self.requests)
                    self.requests.append(request)
                    conn.sendall(self.answers[n])
                    if self.after[n] == "close":
                        break

    def close(self) -> None:
        self._listener.close()
        self._thread.join(5)

    def __enter__(self) -> ScriptedPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_request(conn: socket.socket) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nContent-Length: 5\r\n\r\n<a/>\n"


@pytest.fixture
def transport():
    t = HttpTransport(timeout=5, max_response_size=1000)
    yield t
    t.close()


def test_the_request_on_the_wire(transport):
    with ScriptedPeer([OK]) as peer:
        response = transport.send(peer.url + "?wsdl=no", b"<e/>", {"SOAPAction": '"urn:a"'})
    assert (response.status, response.body, response.headers["Content-Type"]) == (200, b"<a/>\n", "text/xml")
    head, body = peer.requests[0].split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /svc?wsdl=no HTTP/1.1"
    port = peer.url.split(":")[2].split("/")[0]
    assert sorted(lines[1:]) == sorted([f"Host: 127.0.0.1:{port}".encode(), b"Accept-Encoding: identity",
                                        b'SOAPAction: "urn:a"', b"Content-Length: 4"])
    assert body == b"<e/>"


def test_a_chunked_answer_with_extensions_and_a_trailer_keeps_the_connection(transport):
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"3;name=value\r\n<a>\r\n4\r\n</a>\r\n0\r\nX-Trailer: t\r\n\r\n")
    with ScriptedPeer([chunked, OK]) as peer:
        assert transport.send(peer.url, b"1", {}).body == b"<a></a>"
        assert transport.send(peer.url, b"2", {}).body == b"<a/>\n"
    assert peer.connections == 1


def test_an_interim_100_continue_is_skipped(transport):
    with ScriptedPeer([b"HTTP/1.1 100 Continue\r\n\r\n" + OK]) as peer:
        assert transport.send(peer.url, b"x", {}).status == 200


@pytest.mark.parametrize("answer", [
    b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n<a/>\n",              # HTTP/1.0 without keep-alive
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\n<a/>\n",
    b"HTTP/1.1 200 OK\r\n\r\n<a/>\n",                                    # no length: up to the close
])
def test_an_answer_that_ends_the_connection_is_read_whole_and_the_next_request_reconnects(transport, answer):
    with ScriptedPeer([answer, OK], after=["close", "keep"]) as peer:
        response = transport.send(peer.url, b"1", {})
        assert (response.body, response.attempts) == (b"<a/>\n", 1)
        assert transport.send(peer.url, b"2", {}).attempts == 1  # a fresh connection, not a retry
    assert peer.connections == 2


def test_http_1_0_with_keep_alive_keeps_the_connection(transport):
    kept = b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\n<a/>\n"
    with ScriptedPeer([kept, OK]) as peer:
        transport.send(peer.url, b"1", {})
        transport.send(peer.url, b"2", {})
    assert peer.connections == 1


def test_a_folded_header_is_joined(transport):
    folded = b"HTTP/1.1 202 Accepted\r\nX-Note: one\r\n two\r\nContent-Length: 0\r\n\r\n"
    with ScriptedPeer([folded]) as peer:
        response = transport.send(peer.url, b"x", {})
    assert (response.status, response.body, response.headers["X-Note"]) == (202, b"", "one two")


def test_a_body_cut_short_is_a_transport_error_not_a_short_body(transport):
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n<a/>"
    with ScriptedPeer([cut], after=["close"]) as peer:
        with pytest.raises(TransportError, match="IncompleteRead") as caught:
            transport.send(peer.url, b"x", {})
    assert caught.value.attempts == 1


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000,
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + (b"258\r\n" + b"x" * 600 + b"\r\n") * 2
    + b"0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 2000,
])
def test_an_answer_over_the_limit_is_refused(transport, answer):
    with ScriptedPeer([answer], after=["close"]) as peer:
        with pytest.raises(TransportError, match="exceeds 1000 bytes"):
            transport.send(peer.url, b"x", {})


@pytest.mark.parametrize("answer, error", [
    (b"HTTP/1.1 2OO OK\r\n\r\n", "BadStatusLine"),
    (b"SMTP ready\r\n\r\n", "BadStatusLine"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-H: v\r\n" * 101 + b"\r\n", "more than 100 headers"),
    (b"HTTP/1.1 200 OK\r\nX-Long: " + b"v" * 70000 + b"\r\n\r\n", "LineTooLong"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "IncompleteRead"),
])
def test_a_broken_answer_is_a_transport_error(transport, answer, error):
    with ScriptedPeer([answer], after=["close"]) as peer:
        with pytest.raises(TransportError, match=error):
            transport.send(peer.url, b"x", {})


def test_a_keep_alive_connection_the_peer_closed_is_replaced_once(transport):
    with ScriptedPeer([OK, OK], after=["close", "keep"]) as peer:
        assert transport.send(peer.url, b"1", {}).attempts == 1
        # the peer closed without saying so: the request fails on the old connection and goes
        # once more on a new one
        response = transport.send(peer.url, b"2", {})
    assert (response.status, response.attempts, peer.connections) == (200, 2, 2)


def test_header_injection_and_a_bad_path_are_refused_before_anything_is_sent(transport):
    with ScriptedPeer([OK]) as peer:
        with pytest.raises(ValueError, match="Invalid header value"):
            transport.send(peer.url, b"x", {"SOAPAction": '"urn:a"\r\nX-Evil: 1'})
        with pytest.raises(ValueError, match="Invalid header name"):
            transport.send(peer.url, b"x", {"Bad Name:": "v"})
        with pytest.raises(TransportError, match="control characters"):
            transport.send(peer.url.replace("/svc", "/s vc"), b"x", {})
        assert transport.send(peer.url, b"ok", {}).status == 200
    assert len(peer.requests) == 1 and peer.requests[0].endswith(b"ok")


def test_https_is_verified_with_the_default_trust_store(transport, certificate, monkeypatch):
    """TLS as http.client's default context does it: a certificate nobody vouches for is refused;
    trusted (here through SSL_CERT_FILE, read when a connection is made), the answers come over
    one connection."""
    cert, key = certificate
    with ScriptedPeer([OK, OK], tls=(cert, key)) as peer:
        with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
            transport.send(peer.url, b"x", {})
        deadline = time.monotonic() + 5  # the peer's side of the refused handshake ends in its thread
        while peer.handshakes_refused == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert peer.requests == [] and peer.handshakes_refused == 1
        monkeypatch.setenv("SSL_CERT_FILE", cert)
        assert transport.send(peer.url, b"1", {}).body == b"<a/>\n"
        assert transport.send(peer.url, b"2", {}).body == b"<a/>\n"
    assert peer.connections == 2  # the refused one, then one for both requests
    assert [r.split(b"\r\n\r\n")[1] for r in peer.requests] == [b"1", b"2"]


def test_a_thread_per_call_reuses_the_connection_of_the_thread_before_it(transport):
    # callers' threads send their own requests: a thread per call must not keep a socket per thread
    with ScriptedPeer([OK, OK, OK]) as peer:
        for _ in range(2):
            thread = threading.Thread(target=lambda: transport.send(peer.url, b"<e/>", {}))
            thread.start()
            thread.join(30)
        assert transport.send(peer.url, b"<e/>", {}).status == 200
        assert len(transport._all) == 1 and peer.connections == 1


class HeldPeer:
    """Answers every request with OK on a thread per connection; the first request of each of the
    first ``held`` connections is answered only once ``held`` requests are in (so that many are
    under way at once).  :meth:`drop_all` closes every connection without a word, as a peer's
    restart or keep-alive timeout does."""

    def __init__(self, held: int) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/svc"
        self.all_in = threading.Barrier(held + 1, timeout=30)
        self.accepted: list[socket.socket] = []
        self._held = held
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.accepted.append(conn)
            threading.Thread(target=self._serve, args=(conn, len(self.accepted) <= self._held),
                             daemon=True).start()

    def _serve(self, conn: socket.socket, first_waits: bool) -> None:
        n = 0
        try:
            while conn.recv(65536):
                if n == 0 and first_waits:
                    self.all_in.wait()
                conn.sendall(OK)
                n += 1
        except OSError:
            pass  # dropped by drop_all
        finally:
            conn.close()

    def drop_all(self) -> None:
        for conn in self.accepted:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already

    def close(self) -> None:
        self._listener.close()
        self.drop_all()


def _send_at_once(transport: HttpTransport, peer: HeldPeer, count: int) -> list[int]:
    results: list[int] = []
    senders = [threading.Thread(target=lambda: results.append(transport.send(peer.url, b"<e/>", {}).status))
               for _ in range(count)]
    for t in senders:
        t.start()
    peer.all_in.wait()
    for t in senders:
        t.join(30)
    return results


def test_requests_in_flight_at_once_get_a_connection_each_and_leave_them_idle_for_the_next(transport):
    """Two requests under way at once: two connections; then either thread's next request reuses
    one of them (a thread owns no connection), and none is opened for the third."""
    peer = HeldPeer(2)
    try:
        assert _send_at_once(transport, peer, 2) == [200, 200] and len(transport._all) == 2
        for _ in range(3):
            assert transport.send(peer.url, b"<e/>", {}).status == 200
        assert len(peer.accepted) == 2 and len(transport._all) == 2
    finally:
        peer.close()


def test_when_the_peer_dropped_its_idle_connections_the_retry_opens_a_new_one(transport):
    """Several idle connections, all closed by the peer (it restarted, or its keep-alive timeout
    passed): the request fails once on the one that went idle last and goes again on a new
    connection, not on another of the dead ones, which are closed."""
    peer = HeldPeer(3)
    try:
        assert _send_at_once(transport, peer, 3) == [200, 200, 200] and len(transport._all) == 3
        peer.drop_all()
        response = transport.send(peer.url, b"<e/>", {})
        assert (response.status, response.attempts) == (200, 2)
        assert len(peer.accepted) == 4 and len(transport._all) == 1
        assert transport.send(peer.url, b"<e/>", {}).attempts == 1
    finally:
        peer.close()
