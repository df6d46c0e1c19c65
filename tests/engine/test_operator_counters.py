"""What an operator reads when the network misbehaves: log lines and counters that say what happened.

The counters are checked against the lossy proxy's own count of what it
received from the client, by SOAP action: every copy of an application
message beyond the first is a retransmission, every CreateSequence,
CloseSequence or TerminateSequence beyond a sequence's first a retried
control message.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from wsrm_plugin.store import StorageManager, open_store
from wsrm_plugin.tools.proxy import LossyProxy

from .conftest import fast_policy
from .support import ACTION, Recorder, payload, wait_for

pytestmark = pytest.mark.timeout(300)

CONTROL = ("/CreateSequence", "/CloseSequence", "/TerminateSequence")


@pytest.fixture
def client_store(store_for) -> Iterator[StorageManager]:
    """The client's store, open beyond the engine's stop (its counters are read after it)."""
    store = open_store(store_for("sqlite", "client"))
    yield store
    store.close()


def _control_counts(by_action: dict[str, int]) -> dict[str, int]:
    return {a: n for a, n in by_action.items() if a.endswith(CONTROL)}


def test_a_502_is_logged_with_status_url_and_sequence_and_each_retry_counted(engines, store_for, client_store,
                                                                            caplog):
    """A proxy answering 502 to everything: the log says 502 and where, and the retries are counted."""
    server = engines(store_for("memory", "server"), fast_policy(), serve=True, application=Recorder())
    client = engines(client_store, fast_policy(max_retries=None), name="client")
    caplog.set_level(logging.INFO, logger="wsrm_plugin")
    with LossyProxy(server.endpoint_address, drop=1.0, drop_mode="502", seed=1) as proxy:
        client.send(proxy.url, payload("m0"), action=ACTION)
        assert wait_for(lambda: sum(_control_counts(proxy.received_by_action()).values()) >= 5, timeout=60)
        client.stop(timeout=10)
        creates = _control_counts(proxy.received_by_action())
    assert list(creates) and all(a.endswith("/CreateSequence") for a in creates)
    status = client.status()
    assert status.control_retries == sum(creates.values()) - 1
    lines = [r.getMessage() for r in caplog.records]
    assert not [line for line in lines if "malformed XML" in line], lines
    about_502 = [line for line in lines if f"HTTP 502 Bad Gateway from {proxy.url}" in line]
    assert about_502 and all("CreateSequence" in line and "[seq " in line for line in about_502), lines
    assert "dropped on purpose" in about_502[0]


@pytest.mark.parametrize("rm_version", ["1.0", "1.1"])
def test_retransmission_counters_match_what_the_proxy_received(engines, store_for, client_store, rm_version):
    policy = fast_policy(rm_version=rm_version)
    received = Recorder()
    server = engines(store_for("memory", "server"), policy, serve=True, application=received, name="server")
    client = engines(client_store, policy, name="client")
    with LossyProxy(server.endpoint_address, drop=0.25, drop_response=0.2, seed=11) as proxy:
        for i in range(60):
            client.send(proxy.url, payload(f"m{i}"), action=ACTION)
        client.close(proxy.url)
        assert wait_for(lambda: not client.store.status().rms, timeout=120), client.status()
        client.stop(timeout=10)
        by_action = proxy.received_by_action()
        stats = proxy.stats
    assert received.snapshot() == [f"m{i}" for i in range(60)]
    status = client.status()
    assert stats.dropped + stats.responses_dropped > 10  # the network really lost things
    assert by_action[ACTION] > 60
    # WS-RM 1.0 ends a sequence with a LastMessage, a message of the sequence like the others
    last = {a: n for a, n in by_action.items() if a.endswith("/LastMessage")}
    assert len(last) == (rm_version == "1.0")
    assert status.retransmissions == by_action[ACTION] - 60 + sum(n - 1 for n in last.values())
    control = _control_counts(by_action)
    assert status.control_retries == sum(n - 1 for n in control.values()), (control, status)
