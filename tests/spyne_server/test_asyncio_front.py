"""A reliable service served from asyncio: under uvicorn (ASGI) and aiohttp, tested like the WSGI one.

Real servers on loopback, a real zeep client made reliable, a lossy proxy
between them: every message is delivered exactly once, in order; replies
come back to a client with a listener and to one without (on the HTTP
response, which the front end's lane waits for, not the loop).  aiohttp-spyne
around the same spyne application is shown unsound, as the docs say.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest
import zeep

from interceptors.spyne_server.aio import aiohttp_app, asgi_app
from interceptors.spyne_server.service import ReliableService, reliable_service
from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for
from wsrm_plugin.engine.transport import free_port as _free_port
from wsrm_plugin.tools.proxy import LossyProxy

from . import service
from .conftest import fast_policy


def _serve_uvicorn(svc: ReliableService, port: int) -> Callable[[], None]:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(asgi_app(svc), host="127.0.0.1", port=port, lifespan="on",
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_for(lambda: server.started, timeout=30)

    def stop() -> None:
        server.should_exit = True
        thread.join(15)

    return stop


def _serve_aiohttp(svc: ReliableService, port: int) -> Callable[[], None]:
    from aiohttp import web

    loop = asyncio.new_event_loop()
    runner = web.AppRunner(aiohttp_app(svc))
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)

    def stop() -> None:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(15)

    return stop


FRONTS = {"asgi-uvicorn": _serve_uvicorn, "aiohttp": _serve_aiohttp}


@pytest.fixture(params=sorted(FRONTS))
def served(request, tmp_path) -> Iterator[tuple[ReliableService, str]]:
    """A reliable service with a SQLite store, served by an asyncio front end; (service, its URL)."""
    svc = reliable_service(service.application(), f"sqlite:///{tmp_path}/service.db", fast_policy())
    port = _free_port()
    stop = FRONTS[request.param](svc, port)  # the front end starts the service, and stops it
    yield svc, f"http://127.0.0.1:{port}/"
    stop()
    assert wait_for(lambda: not svc.engine.started, timeout=15)


def test_health_and_wsdl_are_served(served):
    svc, url = served
    assert wait_for(lambda: _status(url + "healthz/ready") == 200)
    assert _status(url + "healthz/live") == 200
    with urllib.request.urlopen(url + "?wsdl", timeout=10) as response:
        assert b"definitions" in response.read()


def test_one_way_through_a_lossy_network_arrives_exactly_once_in_order(served, tmp_path):
    svc, url = served
    with LossyProxy(url, drop=0.2, drop_response=0.1, seed=11) as proxy:
        rc = reliable_client(zeep.Client(proxy.url + "?wsdl"), f"sqlite:///{tmp_path}/client.db", fast_policy())
        try:
            sent = [f"aio-{i:02d}" for i in range(25)]
            for item in sent:
                rc.service.record(item)
            rc.flush(timeout=60)
        finally:
            rc.stop(timeout=5)
    assert wait_for(lambda: len(service.recorded()) >= 25, timeout=30)
    assert service.recorded() == sent


@pytest.mark.parametrize("listener", [True, False], ids=["listener", "back-channel"])
def test_in_out_replies_come_back(served, listener):
    svc, url = served
    rc = reliable_client(zeep.Client(url + "?wsdl"), "memory:", fast_policy(),
                         listen=("127.0.0.1", 0) if listener else None)
    try:
        futures = [rc.service.echo(f"q{i}") for i in range(8)]
        assert [f.result(timeout=60) for f in futures] == [f"re:q{i}" for i in range(8)]
    finally:
        rc.stop(timeout=5, discard_unsent=True)


def test_aiohttp_spyne_around_the_spyne_application_is_not_reliable():
    """What the docs say: AIOSpyne drives spyne directly, the chain never runs, CreateSequence is refused."""
    from aiohttp import web
    from aiohttp_spyne import AIOSpyne

    application = service.application()
    reliable_service(application, "memory:", fast_policy())  # engaged on the WSGI path only
    spyne = AIOSpyne(application, threads=2)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", spyne.post)
    port = _free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    threading.Thread(target=loop.run_forever, daemon=True).start()
    try:
        create = (b'<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/" '
                  b'xmlns:a="http://www.w3.org/2005/08/addressing" '
                  b'xmlns:rm="http://docs.oasis-open.org/ws-rx/wsrm/200702"><s:Header>'
                  b'<a:Action>http://docs.oasis-open.org/ws-rx/wsrm/200702/CreateSequence</a:Action>'
                  b'<a:MessageID>urn:uuid:1</a:MessageID><a:To>http://x/</a:To></s:Header><s:Body>'
                  b'<rm:CreateSequence><rm:AcksTo><a:Address>http://www.w3.org/2005/08/addressing/anonymous'
                  b'</a:Address></rm:AcksTo></rm:CreateSequence></s:Body></s:Envelope>')
        request = urllib.request.Request(f"http://127.0.0.1:{port}/", data=create,
                                         headers={"Content-Type": "text/xml; charset=utf-8"})
        try:
            urllib.request.urlopen(request, timeout=10)
            answer = b""
        except urllib.error.HTTPError as error:
            answer = error.read()
        assert b"Fault" in answer and b"CreateSequenceResponse" not in answer
    finally:
        loop.call_soon_threadsafe(loop.stop)
        time.sleep(0.2)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0
