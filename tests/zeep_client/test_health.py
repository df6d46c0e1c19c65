"""A reliable client's health: unacknowledged calls, the oldest's age, faulted sequences."""

from __future__ import annotations

import time

import zeep

from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for
from wsrm_plugin.engine import ReliableEngine

from . import service
from .conftest import fast_policy


def test_a_client_whose_service_answers_is_pass_with_nothing_unacknowledged(clients, tmp_path):
    rc = clients(f"sqlite:///{tmp_path}/c.db")
    for i in range(3):
        rc.service.record(f"h{i}")
    rc.flush(timeout=30)
    health = rc.health()
    assert (health.status, health.unacknowledged, health.oldest_unacknowledged_age) == ("pass", 0, None)
    assert health.running and health.to_json()["checks"]["store"]["status"] == "pass"


def test_calls_waiting_for_a_silent_service_age_and_warn_past_max_age(server, tmp_path):
    wsdl = server.endpoint_address + "?wsdl"
    zc = zeep.Client(wsdl)
    server.stop(timeout=5)  # nobody answers any more
    rc = reliable_client(zc, f"sqlite:///{tmp_path}/c.db", fast_policy(), wsdl_policy=False)
    try:
        before = time.time()
        for i in range(4):
            rc.service.record(f"w{i}")
        assert wait_for(lambda: (rc.health().oldest_unacknowledged_age or 0) >= 0.5, timeout=30)
        health = rc.health(max_age=0.2)
        assert health.unacknowledged == 4
        assert 0.5 <= health.oldest_unacknowledged_age <= time.time() - before + 1
        assert health.status == "warn" and health.to_json()["checks"]["acknowledgements"]["unacknowledged"] == 4
        # nothing late for an hour's patience (the service, refusing connections, is unreachable: a
        # warning of its own, test_an_unreachable_service_...)
        assert rc.health(max_age=3600).to_json()["checks"]["acknowledgements"]["status"] == "pass"
        assert rc.health(max_unacknowledged=3).to_json()["checks"]["acknowledgements"]["status"] == "warn"
    finally:
        rc.stop(timeout=5)


def test_a_faulted_sequence_warns_and_a_stopped_client_fails(plain_server):
    rc = reliable_client(zeep.Client(plain_server + "?wsdl"), "memory:", fast_policy())
    rc.service.record("refused")
    assert wait_for(lambda: rc.health().faulted, timeout=30)
    health = rc.health()
    assert health.status == "warn" and "refused" in next(iter(health.faulted.values())).lower()
    rc.stop(timeout=5, discard_unsent=True)
    assert rc.health().status == "fail"


def test_an_unreachable_service_makes_the_client_degraded_and_it_passes_again_once_back(tmp_path):
    # the service stopped (connections refused) and started again on its port: the sender's circuit
    # breaker opens (peer unreachable) and closes; the client is degraded meanwhile, not failed
    service.reset()
    receiver = service.SpyneReceiver()
    engine = ReliableEngine("memory:", fast_policy(), application=receiver, name="server")
    http = engine.serve(middleware=receiver.middleware)
    engine.start()
    port = http.port
    rc = reliable_client(zeep.Client(engine.endpoint_address + "?wsdl"), f"sqlite:///{tmp_path}/c.db",
                         fast_policy(), wsdl_policy=False)
    try:
        rc.service.record("before")
        rc.flush(timeout=30)
        health = rc.health()
        assert health.status == "pass" and health.unreachable_peers == ()
        assert health.to_json()["checks"]["peers"] == {"status": "pass", "output": "every peer answers"}

        http.stop()
        for i in range(3):
            rc.service.record(f"while-down-{i}")
        assert wait_for(lambda: rc.health().unreachable_peers, timeout=30), rc.engine.status()
        health = rc.health()
        [address] = health.unreachable_peers
        assert address.startswith(f"http://127.0.0.1:{port}/")
        peers = health.to_json()["checks"]["peers"]
        assert health.status == "warn" and peers["status"] == "warn", peers
        assert "1 peer(s) unreachable" in peers["output"] and "Refused" in peers["output"], peers
        assert peers["unreachable"][0]["address"] == address
        assert rc.health(max_unreachable_peers=0).status == "fail"  # for who would rather stop taking work
        assert rc.health(max_unreachable_peers=1).status == "warn"

        engine.serve(port=port, middleware=receiver.middleware)  # back on its address
        assert wait_for(lambda: rc.health().status == "pass", timeout=30), rc.health().to_json()
        rc.flush(timeout=30)
        assert rc.health(max_unreachable_peers=0).status == "pass"
    finally:
        rc.stop(timeout=5)
        engine.stop(timeout=5)
