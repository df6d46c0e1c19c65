"""``ReliableClient.with_key``: calling threads on one engine, each key on sequences of its own.

The messages of one sequence are delivered one after the other; a thread per
key lets the service deliver them side by side, with one engine (one sender
whose rounds carry every sequence) behind all the clients.
"""

from __future__ import annotations

import threading

import pytest

from tests.engine.support import wait_for
from wsrm_plugin.engine.source import SequenceKey

from . import service


def _keys_in_store(rc) -> dict[str, str]:
    """key -> sequence id of the client's store."""
    found = {}
    for seq in rc.engine.store.status().rms:
        parsed = SequenceKey.decode(seq.key)
        if parsed is not None:
            found[parsed.key] = seq.sequence_id
    return found


def test_threads_on_keys_of_one_engine_get_a_sequence_each_and_keep_their_own_order(clients, server) -> None:
    keys = ["orders", "orders-1", "orders-2"]
    rc = clients(key="orders", active_keys=keys)
    lanes = [rc, rc.with_key("orders-1"), rc.with_key("orders-2")]
    assert all(lane.engine is rc.engine for lane in lanes)  # one engine, one sender

    def calls(n: int) -> None:
        for i in range(15):
            lanes[n].service.record(f"k{n}-{i}")

    threads = [threading.Thread(target=calls, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wait_for(lambda: len(service.RECEIVED) >= 45, timeout=30), service.RECEIVED
    assert len(service.RECEIVED) == len(set(service.RECEIVED)) == 45  # each exactly once
    for n in range(3):  # each key's calls in the order they were made
        assert [m for m in service.RECEIVED if m.startswith(f"k{n}-")] == [f"k{n}-{i}" for i in range(15)]
    sequences = _keys_in_store(rc)
    assert sorted(sequences) == keys and len(set(sequences.values())) == 3  # three sequences


def test_a_key_must_be_active_and_new(clients) -> None:
    rc = clients(key="orders", active_keys=["orders", "orders-1"])
    with pytest.raises(ValueError, match="active_keys"):
        rc.with_key("orders-9")  # a restart's lifecycle listener would terminate its sequences
    with pytest.raises(ValueError, match="already sends under key"):
        rc.with_key("orders")


def test_stopping_a_keyed_client_leaves_the_engine_to_the_first(clients) -> None:
    rc = clients(key="orders", active_keys=["orders", "orders-1"])
    other = rc.with_key("orders-1")
    other.service.record("from-1")
    assert wait_for(lambda: service.RECEIVED == ["from-1"], timeout=30)
    other.stop(timeout=5)
    assert rc.engine.started
    rc.service.record("after")  # the first client still sends
    assert wait_for(lambda: service.RECEIVED == ["from-1", "after"], timeout=30)
    rc.stop(timeout=5)
    assert not rc.engine.started


def test_a_keyed_client_of_a_client_not_started_starts_only_after_it(server) -> None:
    import zeep

    from interceptors.zeep_client.client import reliable_client

    from .conftest import fast_policy

    rc = reliable_client(zeep.Client(server.endpoint_address + "?wsdl"), "memory:", fast_policy(),
                         key="orders", active_keys=["orders", "orders-1"], start=False)
    other = rc.with_key("orders-1")
    with pytest.raises(RuntimeError, match="start that client first"):
        other.start()
    rc.start()
    other.start().service.record("late")
    assert wait_for(lambda: service.RECEIVED == ["late"], timeout=30)
    other.stop(timeout=5)
    rc.stop(timeout=5)
