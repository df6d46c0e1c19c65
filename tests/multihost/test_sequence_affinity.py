"""Per-sequence affinity: haproxy hashing on the ``WSRM-Sequence`` HTTP header (issue 31).

The engine names the sequence of every message it sends in the
``WSRM-Sequence`` header; haproxy ``balance hdr(WSRM-Sequence)`` with
consistent hashing then keeps each sequence on one host while that host
lives (its messages in flight at once are recorded together there), and
moves the dead host's sequences to the others.  Four clients, 200 messages
each, one host SIGKILLed midway and never restarted: before the kill, every
request of a sequence went to one host (haproxy's log says), and all ran
once and in order.

Expected duration: under a minute.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from .clients import Clients, check_exactly_once_in_order, wait_delivered
from .cluster import Cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(600)]


@pytest.fixture
def cluster(tmp_path: Path):
    made = Cluster(tmp_path, 3, balance="hdr(WSRM-Sequence)").start()
    try:
        made.start_hosts()
        yield made
    finally:
        made.close()


def test_each_sequence_stays_on_one_host_until_it_dies(cluster: Cluster) -> None:
    clients = Clients(cluster, 4)
    try:
        clients.send(100)
        assert wait_delivered(cluster, clients, 300), cluster.outputs()
        before = cluster.orders()
        # haproxy's log: every request of a sequence went to one host (CreateSequence, without the
        # header, went round robin)
        by_sequence: dict[str, Counter[str]] = {}
        for server, sequence in cluster.routed():
            if sequence:
                by_sequence.setdefault(sequence, Counter())[server] += 1
        assert len(by_sequence) == 4, by_sequence
        assert all(len(servers) == 1 for servers in by_sequence.values()), by_sequence
        victim = random.choice(cluster.hosts)
        victim.kill()
        clients.send(100)
        assert wait_delivered(cluster, clients, 300), cluster.outputs()
        assert wait_for(clients.all_acknowledged, 120), cluster.outputs()
        check_exactly_once_in_order(cluster.orders(), clients.sent)
        after = cluster.orders()[len(before):]
        assert victim.node not in {node for _, node in after[len(after) // 2:]}
        assert wait_for(lambda: cluster.prepared() == [], 60), cluster.prepared()
    finally:
        clients.stop()
