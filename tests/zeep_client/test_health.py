"""A reliable client's health: unacknowledged calls, the oldest's age, faulted sequences."""

from __future__ import annotations

import time

import zeep

from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for

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
        assert rc.health(max_age=3600).status == "pass"
        assert rc.health(max_unacknowledged=3).status == "warn"
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
