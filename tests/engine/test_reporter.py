"""Who reports conditions into the store, and withdrawing a node's reports (wsrm_plugin.engine.reporter).
The takeover that calls it, on real hosts: tests/multihost/test_dead_host_conditions.py."""

from __future__ import annotations

import socket

from txmanager import TransactionManager
from wsrm_plugin.engine.reporter import NodeReports, reporter_name
from wsrm_plugin.store import NodeCondition, open_store


def _put(store, kind: str, subject: str, reporter: str) -> None:
    with store.begin() as tx:
        tx.conditions.put(NodeCondition(kind, subject, reporter, "paused", 1.0, "refused", "", 2.0))


def test_one_host_reports_under_its_name_and_host_only():
    host = socket.gethostname()
    assert reporter_name("orders") == f"orders@{host}"
    tm = TransactionManager(node="orders-7")  # a node of one host (NodeSlots, or named by hand)
    try:
        assert reporter_name("orders", tm) == f"orders@{host}"
        assert NodeReports(open_store("memory:"), tm).nodes is None
    finally:
        tm.close()


def test_forgetting_a_node_removes_its_reports_of_every_kind_and_nobody_elses():
    store = open_store("memory:")
    paused, unreachable = NodeCondition.DELIVERY_PAUSED, NodeCondition.UNREACHABLE_PEER
    _put(store, paused, "orders", "orders@web1/orders-2")
    _put(store, unreachable, "http://peer/", "orders@web1/orders-2")
    _put(store, paused, "orders", "orders@web1/orders-12")  # another node, a name that ends alike
    _put(store, paused, "orders", "orders@web2/orders-0")
    _put(store, unreachable, "http://peer/", "orders@web3")  # a one-host reporter
    reports = NodeReports(store)
    assert reports.forget("orders-2") == 2 and reports.cleared == {"orders-2": 2}
    with store.begin() as tx:
        left = sorted((c.kind, c.reporter) for c in tx.conditions.list_all())
    assert left == [(paused, "orders@web1/orders-12"), (paused, "orders@web2/orders-0"),
                    (unreachable, "orders@web3")]
    assert reports.forget("orders-2") == 0


def test_forgetting_a_node_may_spare_the_reports_of_this_host():
    store = open_store("memory:")
    paused = NodeCondition.DELIVERY_PAUSED
    _put(store, paused, "orders", "orders@old-vm/orders-0")  # a dead earlier holder of the name
    _put(store, paused, "client", "client@new-vm/orders-0")  # a sibling engine of this process
    assert NodeReports(store).forget("orders-0", except_host="new-vm") == 1
    with store.begin() as tx:
        assert [c.reporter for c in tx.conditions.list_all()] == ["client@new-vm/orders-0"]
