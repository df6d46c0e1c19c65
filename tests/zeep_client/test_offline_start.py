"""A reliable client restarting while its server is down (issue 14.9).

The user's situation: a client queued calls, the process restarted, and the
server is down at that moment.  ``zeep.Client(wsdl_url)`` reads the WSDL from
the server first, so without a kept copy the client cannot even be built and
its stored messages wait for a human.  With :class:`StoredWsdlTransport` the
copy kept in the client's store at the previous start serves the WSDL, the
calls are enqueued, and they go out once the server is back.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import requests
import zeep

from interceptors.zeep_client.client import reliable_client
from interceptors.zeep_client.wsdl_cache import StoredWsdlTransport, WsdlUnavailableError
from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.engine.transport import free_port

from . import service
from .conftest import fast_policy
from tests.engine.support import wait_for

pytestmark = pytest.mark.timeout(120)


def _server(port: int, store: str) -> ReliableEngine:
    """The server, on a durable store: it restarts knowing the client's open sequence."""
    receiver = service.SpyneReceiver()
    engine = ReliableEngine(store, fast_policy(), application=receiver, name="server")
    engine.serve(port=port, middleware=receiver.middleware)
    return engine.start()


def test_client_restarts_and_enqueues_while_the_server_is_down(tmp_path: Path, caplog) -> None:
    service.reset()
    store = f"sqlite:///{tmp_path}/client.db"
    port = free_port()
    server_store = f"sqlite:///{tmp_path}/server.db"
    server = _server(port, server_store)
    wsdl_url = f"http://127.0.0.1:{port}/?wsdl"
    try:
        # First start: the server is up; the WSDL and its copy come from it.
        transport = StoredWsdlTransport(store)
        rc = reliable_client(zeep.Client(wsdl_url, transport=transport), store, fast_policy(), name="c")
        rc.service.record("first")
        assert wait_for(lambda: service.RECEIVED == ["first"], timeout=30), service.RECEIVED
        rc.stop(timeout=5)
        transport.close()
    finally:
        server.stop(timeout=5)

    # The server is down: a plain zeep client cannot even be built.
    with pytest.raises(requests.ConnectionError):
        zeep.Client(wsdl_url)

    # The restarted reliable client can: it reads the copy in its store, and the call is queued.
    caplog.set_level(logging.WARNING, logger="interceptors.zeep_client.wsdl_cache")
    transport = StoredWsdlTransport(store)
    rc = reliable_client(zeep.Client(wsdl_url, transport=transport), store, fast_policy(), name="c")
    try:
        receipt = rc.service.record("while the server was down")
        assert receipt.number >= 1
        assert any("using the copy kept in" in r.getMessage() and wsdl_url in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
        server = _server(port, server_store)  # back, on the address the WSDL names
        try:
            assert wait_for(lambda: service.RECEIVED == ["first", "while the server was down"], timeout=60), \
                service.RECEIVED
        finally:
            rc.stop(timeout=5)
            server.stop(timeout=5)
    finally:
        transport.close()


def test_first_start_without_the_server_says_why(tmp_path: Path) -> None:
    """No copy was ever kept: a clear error naming the URL, not a stale or empty WSDL."""
    url = f"http://127.0.0.1:{free_port()}/?wsdl"
    transport = StoredWsdlTransport(f"sqlite:///{tmp_path}/fresh.db")
    try:
        with pytest.raises(WsdlUnavailableError, match="holds no copy"):
            zeep.Client(url, transport=transport)
    finally:
        transport.close()


@pytest.mark.postgres
def test_the_copy_is_kept_in_a_postgresql_store_too(pg_dsn_factory) -> None:
    """The table is created on first use; a newer fetch replaces the copy; two processes' stores agree."""
    store = f"postgresql:{pg_dsn_factory('wsdlcache')}"
    first, second = StoredWsdlTransport(store), StoredWsdlTransport(store)
    try:
        assert first.stored_copy("http://127.0.0.1:1/?wsdl") is None
        first.put("http://127.0.0.1:1/?wsdl", b"<definitions/>")
        first.put("http://127.0.0.1:1/?wsdl", b"<definitions name='v2'/>")
        content, _ = second.stored_copy("http://127.0.0.1:1/?wsdl")
        assert content == b"<definitions name='v2'/>"
        # the server is down (nothing listens on port 1): the stored copy answers
        assert second.load("http://127.0.0.1:1/?wsdl") == b"<definitions name='v2'/>"
    finally:
        first.close()
        second.close()


def test_stored_wsdl_transport_keeps_zeeps_http_get(tmp_path: Path) -> None:
    """zeep's HTTP GET bindings call ``transport.get(address, params, headers)``.

    The transport once named its store lookup ``get(url)``, shadowing zeep's method: every
    HTTP GET operation through it failed with a TypeError.
    """
    import http.server
    import threading

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *_args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    transport = StoredWsdlTransport(f"sqlite:///{tmp_path}/get.db")
    try:
        response = transport.get(f"http://127.0.0.1:{server.server_port}/op", {"a": "1"}, {"X-T": "y"})
        assert response.status_code == 200 and response.content == b"ok"
        assert seen == ["/op?a=1"]
    finally:
        transport.close()
        server.shutdown()
        server.server_close()
