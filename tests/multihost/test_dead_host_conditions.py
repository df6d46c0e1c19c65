"""A host that dies for good while its delivery is paused leaves no stale pause behind (issues 30, 31).

Host A's orders database refuses its connections (``OUTAGE_FILE``), so its
delivery pauses; it also holds a message for a peer nobody answers, so it
reports that peer unreachable.  Both reports are in the shared store's
``node_condition`` table, under A's node.  Host B starts (its start
withdraws only its own reports), delivers what A could not, and A is
SIGKILLed and never restarted: B's watcher takes A's node over and, with
it, withdraws A's reports.  ``wsrm status`` and the metrics stop showing
A's pause within the takeover bound (the measured time is printed), B stays
ready, and messages sent afterwards through haproxy are delivered once.

Expected duration: 15-30 s.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.metrics import exposition
from wsrm_plugin.status import format_report, report
from wsrm_plugin.store import NodeCondition, open_store
from tests.spyne_server.conftest import Envelopes, action

from .clients import Clients, check_exactly_once_in_order, client_policy
from .cluster import Cluster, wait_for

pytestmark = [pytest.mark.slow(minutes=0.5), pytest.mark.postgres, pytest.mark.timeout(600)]

BOUND = 5.0
FIRST = 6  # messages sent to host A while its database is down


@pytest.fixture
def cluster(tmp_path: Path):
    made = Cluster(tmp_path, 2, takeover_within=BOUND).start()
    try:
        yield made
    finally:
        made.close()


def _conditions(store, node: str) -> list[NodeCondition]:
    """The conditions reported from ``node`` (its reporter ends with ``/node``)."""
    with store.begin() as tx:
        return [c for c in tx.conditions.list_all() if c.reporter.endswith(f"/{node}")]


def test_a_host_killed_while_paused_leaves_no_stale_pause_once_taken_over(cluster: Cluster) -> None:
    a, b = cluster.hosts
    outage = cluster.marks / "orders-down"
    outage.touch()
    a.start({"OUTAGE_FILE": str(outage), "UNREACHABLE_PEER": "http://127.0.0.1:9/"})
    store = open_store("postgresql:" + cluster.store_dsn)
    sender = ReliableEngine("memory:", client_policy(), name="to-a").start()
    try:
        build = Envelopes(a.url)
        for n in range(FIRST):
            sender.send(a.url, build("record", f"a-{n:05d}"), action=action("record"))
        # stored (acknowledged) although A cannot deliver; A pauses, and says so in the store
        assert wait_for(lambda: sender.status().unacked == 0, 120), a.output()
        assert wait_for(lambda: {c.kind for c in _conditions(store, a.node or "?")}
                        == {NodeCondition.DELIVERY_PAUSED, NodeCondition.UNREACHABLE_PEER}, 120), (
            _conditions(store, a.node or "?"), a.output())
        assert wait_for(lambda: a.status("healthz/ready") == 503, 30)  # A's own readiness: delivery paused
        assert "DELIVERY PAUSED" in format_report(report(store))

        b.start()  # B's start withdraws its own reports only
        assert {c.kind for c in _conditions(store, a.node or "?")} >= {NodeCondition.DELIVERY_PAUSED}
        assert wait_for(lambda: sorted(i for i, _ in cluster.orders()) == [f"a-{n:05d}" for n in range(FIRST)],
                        120), (cluster.orders(), b.output())  # B delivers what A could not

        killed = a.kill()
        assert wait_for(lambda: not _conditions(store, a.node or "?"), 60), (
            _conditions(store, a.node or "?"), b.output())
        cleared = time.monotonic() - killed
        print(f"host A's pause and unreachable-peer reports withdrawn {cleared:.2f} s after its SIGKILL "
              f"(takeover bound {BOUND:g} s)")
        assert cleared <= BOUND, cleared
        shown = report(store)
        assert not shown.paused_delivery, format_report(shown)
        assert "DELIVERY PAUSED" not in format_report(shown)
        assert "wsrm_delivery_paused 0\n" in exposition(shown)
        assert wait_for(lambda: b.status("healthz/ready") == 200, 30)

        # and messages flow: through haproxy, B alone alive, once haproxy's health checks say so
        # (B was started by hand, and A was down for paused delivery: routing to neither, haproxy
        # answered the clients' first request with a 503 in a loaded run)
        assert wait_for(lambda: (f"h{b.index}" in cluster.lb_up()) and f"h{a.index}" not in cluster.lb_up(), 60), (
            cluster.lb_up())
        clients = Clients(cluster, 1)
        try:
            clients.send(20)
            assert wait_for(lambda: len([i for i, _ in cluster.orders() if i.startswith("c0-")]) >= 20, 120), (
                cluster.orders(), b.output())
            check_exactly_once_in_order([(i, n) for i, n in cluster.orders() if i.startswith("c0-")],
                                        clients.sent)
        finally:
            clients.stop()
        items = [i for i, _ in cluster.orders()]
        assert sorted(i for i in items if i.startswith("a-")) == [f"a-{n:05d}" for n in range(FIRST)]
        assert cluster.prepared() == []
    finally:
        sender.stop(timeout=2)
        store.close()
