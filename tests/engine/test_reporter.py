"""Who reports conditions into the store, and withdrawing a node's reports (wsrm_plugin.engine.reporter).
The takeover that calls it, on real hosts: tests/multihost/test_dead_host_conditions.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from txmanager import TransactionManager
from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.engine.reporter import NodeReports, reporter_name
from wsrm_plugin.store import NodeCondition, open_store


def _put(store, kind: str, subject: str, reporter: str) -> None:
    with store.begin() as tx:
        tx.conditions.put(NodeCondition(kind, subject, reporter, "paused", 1.0, "refused", "", 2.0))


def test_each_process_reports_under_a_name_of_its_own():
    """Several processes of one host on one store (gunicorn workers) must not share a reporter:
    under a transaction manager each has its node (NodeSlots), without one its pid."""
    host = socket.gethostname()
    assert reporter_name("orders") == f"orders@{host}#{os.getpid()}"
    tm = TransactionManager(node="orders-7")  # a node of one host (NodeSlots, or named by hand)
    try:
        assert reporter_name("orders", tm) == f"orders@{host}/orders-7"
        assert NodeReports(open_store("memory:"), tm).nodes is None
    finally:
        tm.close()


_REPORTING_PROCESS = """
import sys, time
from wsrm_plugin.engine.outage import PauseRecord, PauseReport
from wsrm_plugin.engine.reporter import reporter_name
from wsrm_plugin.statemachine import ServiceMode
from wsrm_plugin.store import open_store
store = open_store(sys.argv[1])
PauseReport(store, reporter_name("orders"))(PauseRecord("orders", ServiceMode.PAUSED, time.time(), "refused", 1))
store.close()
print("REPORTED", flush=True)
sys.stdin.read()  # runs until its stdin closes (or it is killed)
"""


def _reporting_process(url: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _REPORTING_PROCESS, url], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parents[2]))
    assert proc.stdout.readline().strip() == "REPORTED"
    return proc


def test_a_start_withdraws_what_dead_processes_of_its_host_reported_and_spares_the_living(tmp_path):
    """Two worker processes of one host on one SQLite store each report a paused delivery; one is
    SIGKILLed.  A new engine's start withdraws the dead one's report (the kernel says it no longer
    runs) and keeps the living sibling's (with one reporter name per host it withdrew both)."""
    url = f"sqlite:///{tmp_path}/store.db"
    living, dead = _reporting_process(url), _reporting_process(url)
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=30)
        store = open_store(url)
        _put(store, NodeCondition.DELIVERY_PAUSED, "orders", f"orders@elsewhere#{dead.pid}")  # not this host's
        with store.begin() as tx:
            assert len(tx.conditions.list_all()) == 3
        engine = ReliableEngine(store, name="orders")
        try:
            engine.start()
            with store.begin() as tx:
                left = sorted(c.reporter for c in tx.conditions.list_all())
        finally:
            engine.stop(timeout=10)
        host = socket.gethostname()
        assert left == sorted([f"orders@{host}#{living.pid}", f"orders@elsewhere#{dead.pid}"]), left
        store.close()
    finally:
        living.stdin.close()
        living.wait(timeout=30)


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
