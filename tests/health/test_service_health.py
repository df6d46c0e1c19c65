"""A reliable service's liveness and readiness endpoints, with real servers on loopback.

Readiness follows the store: a PostgreSQL store whose server is stopped
makes the service unready (503) and ready again once the server is back;
haproxy (Debian's, installed by ``scripts/bootstrap.sh``), checking
``/healthz/ready``, then stops sending to that host and sends to it again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import zeep

from interceptors.spyne_server.service import ReliableService, reliable_service
from interceptors.zeep_client.client import reliable_client
from tests.conftest import start_throwaway_server
from tests.engine.support import wait_for
from tests.spyne_server import service
from tests.spyne_server.conftest import fast_policy
from wsrm_plugin.engine.engine import EngineStatus
from wsrm_plugin.engine.transport import free_port as _free_port
from wsrm_plugin.health import CONTENT_TYPE


def get(url: str, timeout: float = 10.0) -> tuple[int, dict, dict]:
    """(status, body as JSON, headers) of a GET; an error status is an answer too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}"), _lower(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}"), _lower(error.headers)


def _lower(headers) -> dict:
    return {name.lower(): value for name, value in headers.items()}


@pytest.fixture
def services() -> Iterator[list[ReliableService]]:
    service.reset()
    made: list[ReliableService] = []
    yield made
    for server in made:
        server.stop(timeout=5)


def _serve(made: list[ReliableService], store: str, **options) -> ReliableService:
    server = reliable_service(service.application(), store, fast_policy(), **options)
    made.append(server)
    server.serve()
    return server


def test_live_and_ready_answer_json_in_the_health_format(services):
    server = _serve(services, "memory:")
    status, body, headers = get(server.url + "healthz/ready")
    assert status == 503 and body["checks"]["recovery"]["status"] == "fail"  # served, not started yet
    server.start()
    assert wait_for(lambda: get(server.url + "healthz/ready")[0] == 200)  # an answer is reused for 1 s
    status, body, headers = get(server.url + "healthz/ready")
    assert headers["content-type"] == CONTENT_TYPE
    assert body["status"] == "pass"
    assert {name: check["status"] for name, check in body["checks"].items()} == {
        "recovery": "pass", "store": "pass", "delivery": "pass", "peers": "pass", "poison": "pass"}
    status, body, _ = get(server.url + "healthz/live")
    assert status == 200 and body["checks"]["workers"]["status"] == "pass"
    assert urllib.request.urlopen(server.url + "?wsdl", timeout=10).status == 200  # the rest is the service's


def test_poison_warns_by_default_and_fails_beyond_max_poison(services, monkeypatch):
    lenient = _serve(services, "memory:").start()
    strict = _serve(services, "memory:", max_poison=0).start()
    for server in (lenient, strict):
        real = server.engine.status
        monkeypatch.setattr(server.engine, "status", lambda real=real: _with(real(), poisoned=2))
    status, body, _ = get(lenient.url + "healthz/ready")
    assert status == 200 and body["status"] == "warn" and body["checks"]["poison"]["poisoned"] == 2
    status, body, _ = get(strict.url + "healthz/ready")
    assert status == 503 and body["checks"]["poison"]["status"] == "fail"


def test_paused_delivery_is_not_ready(services, monkeypatch):
    server = _serve(services, "memory:").start()
    real = server.engine.status
    monkeypatch.setattr(server.engine, "status", lambda: _with(real(), paused=True, paused_since=time.time(),
                                                               pause_error="orders database down", waiting=4))
    status, body, _ = get(server.url + "healthz/ready")
    assert status == 503
    delivery = body["checks"]["delivery"]
    assert delivery["status"] == "fail" and "orders database down" in delivery["output"] and delivery["waiting"] == 4


def test_an_unreachable_peer_makes_the_service_degraded_not_unready_and_clears_once_it_is_back(services):
    # service A sends to service B; B stops (connections refused) and starts again on its port
    from tests.spyne_server.conftest import Envelopes, action

    a = _serve(services, "memory:").start()
    b = reliable_service(service.application(), "memory:", fast_policy())
    services.append(b)
    b_http = b.serve()
    b.start()
    port, build = b_http.port, Envelopes(b.url)
    assert wait_for(lambda: get(a.url + "healthz/ready")[0] == 200)
    assert get(a.url + "healthz/ready")[1]["checks"]["peers"]["status"] == "pass"

    b_http.stop()
    for i in range(2):
        a.engine.send(b.url, build("record", f"to-b-{i}"), action=action("record"))
    assert wait_for(lambda: get(a.url + "healthz/ready")[1]["checks"]["peers"]["status"] == "warn", timeout=30), \
        a.engine.status()
    status, body, _ = get(a.url + "healthz/ready")
    assert status == 200 and body["status"] == "warn", body  # degraded: still in the load balancer
    [peer] = body["checks"]["peers"]["unreachable"]
    assert peer["address"] == b.url and "Refused" in peer["last_error"]
    a.health.max_unreachable_peers = 0  # reliable_service(..., max_unreachable_peers=0)
    assert wait_for(lambda: get(a.url + "healthz/ready")[0] == 503)
    a.health.max_unreachable_peers = None

    b.serve(port=port)
    assert wait_for(lambda: get(a.url + "healthz/ready")[1]["status"] == "pass", timeout=30), \
        get(a.url + "healthz/ready")[1]
    assert wait_for(lambda: a.engine.status().unacked == 0, timeout=30)


def test_a_worker_stuck_in_one_step_is_not_live(services):
    server = _serve(services, "memory:").start()
    server.health.stuck_after = 0.5
    worker = server.engine.workers[0]
    # its next step does not return (a deadlock, a peer that never answers) until released; a
    # busy_since set by hand would be written over by the worker's next step, 50 ms later at most
    released = threading.Event()
    step = worker._step

    def stuck() -> bool:
        released.wait(60)
        return step()

    worker._step = stuck
    try:
        assert wait_for(lambda: get(server.url + "healthz/live")[0] == 503, timeout=30)
        status, body, _ = get(server.url + "healthz/live")
        assert status == 503 and worker.name in body["checks"]["workers"]["stuck"]
    finally:
        released.set()
    assert wait_for(lambda: get(server.url + "healthz/live")[0] == 200, timeout=30)  # its step ended


def test_health_routes_can_be_left_out(services):
    server = _serve(services, "memory:", health_path=None).start()
    status = None
    try:
        urllib.request.urlopen(server.url + "healthz/ready", timeout=10)
    except urllib.error.HTTPError as error:
        status = error.code
    assert status != 200  # spyne's answer, not ours


def _with(status: EngineStatus, **changes) -> EngineStatus:
    import dataclasses

    return dataclasses.replace(status, **changes)


@pytest.mark.postgres
def test_ready_follows_the_stores_postgresql_down_and_back(services):
    pg = start_throwaway_server()
    try:
        server = _serve(services, "postgresql:" + pg.create_database("healthstore")).start()
        # (the store check wants a status read within 2 s, which a loaded machine may miss once)
        assert wait_for(lambda: get(server.url + "healthz/ready")[0] == 200, timeout=30)
        pg.stop()
        assert wait_for(lambda: get(server.url + "healthz/ready")[0] == 503, timeout=30)
        status, body, _ = get(server.url + "healthz/ready")
        assert body["checks"]["store"]["status"] == "fail", body
        assert get(server.url + "healthz/live")[0] == 200  # a database outage is no reason to restart
        pg.start()
        assert wait_for(lambda: get(server.url + "healthz/ready")[0] == 200, timeout=60)
    finally:
        pg.close()


HAPROXY = """\
global
    maxconn 200

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    retries 2
    option redispatch

frontend wsrm
    bind 127.0.0.1:{port}
    default_backend hosts

backend hosts
    balance roundrobin
    option httpchk GET /healthz/ready
    http-check expect status 200
    default-server inter 300ms fall 2 rise 2
    http-response set-header X-Served-By %[srv_name]
{servers}
"""


def _served_by(url: str, count: int) -> list[str]:
    """Which host answered each of ``count`` requests through the balancer ("-": none did)."""
    served = []
    for _ in range(count):
        try:
            served.append(get(url + "healthz/live")[2].get("x-served-by", "?"))
        except OSError:  # haproxy not listening yet, or no host up
            served.append("-")
    return served


@pytest.mark.postgres
def test_haproxy_stops_sending_to_a_host_whose_store_is_down_and_sends_again_once_it_is_back(services,
                                                                                            tmp_path: Path):
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    assert os.path.exists(binary), "haproxy is needed by this test: run scripts/bootstrap.sh (it installs Debian's)"
    pg = start_throwaway_server()
    haproxy = None
    try:
        a = _serve(services, "postgresql:" + pg.create_database("host_a")).start()
        b = _serve(services, f"sqlite:///{tmp_path}/host_b.db").start()
        port = _free_port()
        servers = "\n".join(f"    server {name} {s.url.split('//')[1].rstrip('/')} check"
                            for name, s in (("a", a), ("b", b)))
        config = tmp_path / "haproxy.cfg"
        config.write_text(HAPROXY.format(port=port, servers=servers))
        haproxy = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=open(tmp_path / "haproxy.log", "ab"),
                                   stderr=subprocess.STDOUT)
        front = f"http://127.0.0.1:{port}/"
        assert wait_for(lambda: set(_served_by(front, 4)) == {"a", "b"}, timeout=30), (tmp_path / "haproxy.log").read_text()

        pg.stop()  # host a's store is gone: a turns unready, haproxy takes it out
        assert wait_for(lambda: set(_served_by(front, 6)) == {"b"}, timeout=30)
        assert get(a.url + "healthz/ready")[0] == 503
        # reliable traffic through the balancer now goes to b alone, and arrives
        rc = reliable_client(zeep.Client(front + "?wsdl"), "memory:", fast_policy())
        try:
            for i in range(10):
                rc.service.record(f"via-lb-{i}")
            rc.flush(timeout=60)
        finally:
            rc.stop(timeout=5, discard_unsent=True)
        assert wait_for(lambda: b.engine.status().delivered == 10, timeout=30)
        assert sorted(service.recorded()) == sorted(f"via-lb-{i}" for i in range(10))

        pg.start()  # back: a is ready again, and haproxy sends to it again
        assert wait_for(lambda: get(a.url + "healthz/ready")[0] == 200, timeout=60)
        assert wait_for(lambda: "a" in _served_by(front, 6), timeout=30)
    finally:
        if haproxy is not None:
            haproxy.terminate()
            haproxy.wait(10)
        pg.close()
