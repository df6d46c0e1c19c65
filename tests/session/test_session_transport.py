"""ZeepSessionTransport on its own: the zeep session's auth and timeout, bounded responses, clear errors."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from interceptors.zeep_client.session import ZeepSessionTransport
from wsrm_plugin.engine.transport import TransportError, free_port


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 -- http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(dict(self.headers))  # type: ignore[attr-defined]
        if self.path == "/slow":
            time.sleep(3)
        body = b"x" * (5000 if self.path == "/big" else 10)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out closed its end: the slow handler's write fails, as expected


@pytest.fixture
def peer():
    server = _Server(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class FakeZeepTransport:
    """What the transport reads of zeep's: ``session`` and ``operation_timeout``."""

    def __init__(self, session: requests.Session, operation_timeout: float | None = None) -> None:
        self.session = session
        self.operation_timeout = operation_timeout


class FakeClient:
    def __init__(self, transport: Any) -> None:
        self.transport = transport


def test_the_sessions_auth_and_headers_go_with_every_send(peer):
    server, url = peer
    session = requests.Session()
    session.auth = ("shop", "secret")
    session.headers["X-Tenant"] = "north"
    transport = ZeepSessionTransport(FakeClient(FakeZeepTransport(session)))
    response = transport.send(url + "/", b"<e/>", {"Content-Type": "text/xml"})
    assert response.status == 200 and response.body == b"x" * 10
    seen = server.seen[-1]
    assert seen["Authorization"].startswith("Basic ") and seen["X-Tenant"] == "north"


def test_a_session_swapped_on_the_client_later_is_followed(peer):
    server, url = peer
    zeep_transport = FakeZeepTransport(requests.Session())
    transport = ZeepSessionTransport(FakeClient(zeep_transport))
    transport.send(url + "/", b"<e/>", {})
    replacement = requests.Session()
    replacement.headers["X-Replaced"] = "yes"
    zeep_transport.session = replacement
    transport.send(url + "/", b"<e/>", {})
    assert "X-Replaced" not in server.seen[0] and server.seen[1]["X-Replaced"] == "yes"


def test_zeeps_operation_timeout_bounds_a_send(peer):
    _, url = peer
    transport = ZeepSessionTransport(FakeClient(FakeZeepTransport(requests.Session(), operation_timeout=0.5)),
                                     timeout=30)
    with pytest.raises(TransportError, match="failed"):
        transport.send(url + "/slow", b"<e/>", {})


def test_without_an_operation_timeout_the_policys_timeout_bounds_it(peer):
    _, url = peer
    transport = ZeepSessionTransport(FakeClient(FakeZeepTransport(requests.Session())), timeout=0.5)
    with pytest.raises(TransportError):
        transport.send(url + "/slow", b"<e/>", {})


def test_an_oversized_response_is_refused(peer):
    _, url = peer
    transport = ZeepSessionTransport(FakeClient(FakeZeepTransport(requests.Session())), max_response_size=1000)
    with pytest.raises(TransportError, match="exceeds 1000 bytes"):
        transport.send(url + "/big", b"<e/>", {})


def test_a_refused_connection_is_a_transport_error():
    transport = ZeepSessionTransport(FakeClient(FakeZeepTransport(requests.Session())), timeout=5)
    with pytest.raises(TransportError, match="POST http://127.0.0.1"):
        transport.send(f"http://127.0.0.1:{free_port()}/", b"<e/>", {})


def test_a_bad_timeout_is_refused_at_once():
    with pytest.raises(ValueError, match="timeout must be > 0"):
        ZeepSessionTransport(FakeClient(None), timeout=0)


def test_only_a_session_with_nothing_to_honour_takes_the_fast_path(monkeypatch):
    """zeep's default session posts through the engine's keep-alive transport; any setting a user
    makes (proxy, auth, certificate, header, adapter, an https peer, an environment proxy) keeps
    the requests path, so that setting is honoured."""
    import requests
    import zeep.transports

    from interceptors.zeep_client.session import _nothing_to_honour

    url = "http://127.0.0.1:8080/svc"
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)

    def fresh():
        return zeep.transports.Transport().session

    assert _nothing_to_honour(fresh(), url)
    assert not _nothing_to_honour(fresh(), "https://127.0.0.1:8443/svc")
    changes = [
        lambda s: s.proxies.update(http="http://127.0.0.1:3128"),
        lambda s: setattr(s, "auth", ("user", "secret")),
        lambda s: setattr(s, "cert", "/tmp/client.pem"),
        lambda s: s.headers.update({"X-Tenant": "a"}),
        lambda s: s.cookies.set("session", "1"),
        lambda s: s.hooks["response"].append(lambda r, **kw: r),
        lambda s: s.mount("http://", requests.adapters.HTTPAdapter(max_retries=3)),
    ]
    for change in changes:
        session = fresh()
        change(session)
        assert not _nothing_to_honour(session, url)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:3128")
    assert not _nothing_to_honour(fresh(), url)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    assert _nothing_to_honour(fresh(), url)
