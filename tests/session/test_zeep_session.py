"""Reliable sends go through the zeep client's own HTTP session: its proxies and its TLS settings.

Real parts on loopback: a reliable spyne service on waitress, a small forward
proxy that counts what it forwards, a TLS front with a self-signed certificate
made by ``openssl`` for this test.
"""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import zeep
from spyne import Application, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11

from wsrm_plugin import RMPolicy, reliable_client, reliable_service
from wsrm_plugin.engine.transport import HttpServer

TNS = "urn:wsrm-session-test"
FAST = dict(base_retransmission_interval=0.2, exponential_backoff=False, poll_interval=0.05, http_timeout=5.0)
_lock = threading.Lock()
RECORDED: list[str] = []


class NoteService(ServiceBase):
    @rpc(Unicode, _is_async=True)
    def note(ctx, text):  # noqa: N805 -- spyne's signature
        with _lock:
            RECORDED.append(text)


class Counting:
    """WSGI middleware: counts POSTs reaching the service; optionally claims https (behind the TLS front)."""

    def __init__(self, app: Any, scheme: str = "http") -> None:
        self.app, self.scheme, self.posts = app, scheme, 0

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        environ["wsgi.url_scheme"] = self.scheme
        if environ.get("REQUEST_METHOD") == "POST":
            with _lock:
                self.posts += 1
        return self.app(environ, start_response)


@pytest.fixture
def service() -> Iterator[Any]:
    """``make(scheme) -> (counting middleware, server)``: a started reliable NoteService."""
    made: list[tuple[Any, HttpServer]] = []

    def make(scheme: str = "http") -> tuple[Counting, HttpServer, Any]:
        app = Application([NoteService], tns=TNS, in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())
        svc = reliable_service(app, "memory:", RMPolicy(soap_version="1.1", **FAST))
        counting = Counting(svc, scheme)
        server = HttpServer(counting).start()
        made.append((svc.start(), server))
        return counting, server, svc

    with _lock:
        RECORDED.clear()
    yield make
    for svc, server in reversed(made):
        server.stop(5)
        svc.stop(5)


def _wait(predicate: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# -- a forward proxy ------------------------------------------------------------------------------

class ForwardProxy(ThreadingHTTPServer):
    """An HTTP forward proxy for http:// targets (absolute-URI requests), counting by method."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.counts: dict[str, int] = {"GET": 0, "POST": 0}
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        target = urlsplit(self.path)
        assert target.scheme == "http", self.path  # a proxied request names the absolute URI
        with _lock:
            self.server.counts[self.command] += 1  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-connection", "connection")}
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        try:
            conn.request(self.command, target.path + (f"?{target.query}" if target.query else ""),
                         body=body or None, headers=headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _forward


@pytest.fixture
def no_proxy_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy",
                 "ALL_PROXY", "all_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)


def test_reliable_messages_go_through_the_zeep_sessions_proxy(service, no_proxy_from_env):
    counting, server, _ = service()
    proxy = ForwardProxy()
    try:
        session = requests.Session()
        session.proxies = {"http": proxy.url}
        client = zeep.Client(server.url + "?wsdl", transport=zeep.Transport(session=session))
        rc = reliable_client(client, "memory:", RMPolicy(**FAST))
        try:
            for i in range(10):
                rc.service.note(f"n{i}")
            assert _wait(lambda: RECORDED == [f"n{i}" for i in range(10)]), RECORDED
            rc.close()
            assert _wait(lambda: rc.engine.status().rms_sequences == 0)
        finally:
            rc.stop(timeout=5)
        # CreateSequence, 10 messages, Close/Terminate: every POST the service saw came through the proxy
        assert proxy.counts["POST"] >= 12
        assert proxy.counts["POST"] == counting.posts
        assert proxy.counts["GET"] >= 1  # the WSDL, as zeep itself loads it
    finally:
        proxy.stop()


# -- a TLS front ------------------------------------------------------------------------------------

class TlsFront:
    """Terminates TLS on a loopback port and relays the bytes to a plain HTTP backend."""

    def __init__(self, backend_port: int, cert: str, key: str, *, client_ca: str | None = None) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        if client_ca is not None:  # mutual TLS: a client must present a certificate signed by client_ca
            self.context.verify_mode = ssl.CERT_REQUIRED
            self.context.load_verify_locations(client_ca)
        self.backend_port = backend_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.handshakes = 0
        self.refused = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/"

    def _accept(self) -> None:
        while not self._closed:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            tls = self.context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            with _lock:
                self.refused += 1  # the client refused our certificate
            raw.close()
            return
        with _lock:
            self.handshakes += 1
        backend = socket.create_connection(("127.0.0.1", self.backend_port))

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=pump, args=(backend, tls), daemon=True).start()
        pump(tls, backend)

    def stop(self) -> None:
        self._closed = True
        self.listener.close()


def test_reliable_messages_use_the_sessions_tls_verification(service, certificate, caplog, no_proxy_from_env):
    cert, key = certificate
    counting, server, svc = service("https")
    front = TlsFront(server.port, cert, key)
    try:
        svc.engine.endpoint_address = front.url
        session = requests.Session()
        session.verify = cert                      # trust exactly the test's certificate
        client = zeep.Client(front.url + "?wsdl", transport=zeep.Transport(session=session))
        assert client.service._binding_options["address"].startswith("https://")
        rc = reliable_client(client, "memory:", RMPolicy(**FAST))
        try:
            rc.service.note("trusted")
            assert _wait(lambda: RECORDED == ["trusted"]), RECORDED

            # the system's trust store does not know the certificate: sends fail, visibly, and wait
            session.verify = True
            refused_before = front.refused
            with caplog.at_level(logging.WARNING, logger="interceptors.zeep_client.session"):
                rc.service.note("held back")
                assert _wait(lambda: front.refused > refused_before + 1)
                assert _wait(lambda: rc.engine.status().send_failures > 0)
            assert RECORDED == ["trusted"]
            assert any("TLS to https://127.0.0.1" in r.getMessage() and "CERTIFICATE_VERIFY_FAILED" in r.getMessage()
                       for r in caplog.records), [r.getMessage() for r in caplog.records]
            assert rc.engine.status().unacked >= 1  # kept, not dropped

            session.verify = cert                  # fixed: the held-back message goes out
            assert _wait(lambda: RECORDED == ["trusted", "held back"]), RECORDED
        finally:
            rc.stop(timeout=5)
        # every POST reached the service through the TLS front (the client only knows its https URL)
        assert front.handshakes >= 1 and counting.posts >= 3
    finally:
        front.stop()


def test_reliable_messages_present_the_sessions_client_certificate(service, certificate, no_proxy_from_env):
    cert, key = certificate
    counting, server, svc = service("https")
    front = TlsFront(server.port, cert, key, client_ca=cert)
    try:
        svc.engine.endpoint_address = front.url
        session = requests.Session()
        session.verify = cert
        session.cert = (cert, key)                 # what the front requires
        client = zeep.Client(front.url + "?wsdl", transport=zeep.Transport(session=session))
        rc = reliable_client(client, "memory:", RMPolicy(**FAST))
        try:
            session.cert = None                    # without it the front refuses every send...
            session.close()                        # (no pooled connection from the WSDL load left)
            rc.service.note("needs a certificate")
            assert _wait(lambda: front.refused >= 2)
            assert RECORDED == []
            session.cert = (cert, key)             # ...with it, the stored message goes through
            assert _wait(lambda: RECORDED == ["needs a certificate"]), RECORDED
        finally:
            rc.stop(timeout=5)
        assert counting.posts >= 2
    finally:
        front.stop()
