"""A kill storm: 20 SIGKILLs of random hosts, restarted or not, during 2,000 XA deliveries (issue 31).

Three hosts behind haproxy; four clients send 500 messages each.  Spread
over the run, a random live host is SIGKILLed twenty times (never the last
one alive); half of the time a dead host is started again (it claims a node
name anew, the lowest free one), and always before a kill that would leave
none.  Every message is delivered exactly once and in order per
client, and at the end nothing is in doubt: no prepared transaction, no
commit decision left undone, no node claimed by a dead host.

Expected duration: 2-4 minutes on a loaded 2-core machine.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from .clients import Clients, check_exactly_once_in_order, wait_delivered
from .cluster import Cluster, wait_for

pytestmark = [pytest.mark.slow(minutes=1.5), pytest.mark.postgres, pytest.mark.timeout(1200)]

KILLS = 20
PER_CLIENT = 500


@pytest.fixture
def cluster(tmp_path: Path):
    made = Cluster(tmp_path, 3).start()
    try:
        made.start_hosts()
        yield made
    finally:
        made.close()


def test_twenty_random_kills_during_two_thousand_messages(cluster: Cluster) -> None:
    rng = random.Random()
    clients = Clients(cluster, 4)
    total = 4 * PER_CLIENT
    kills: list[str] = []
    started = time.monotonic()
    try:
        clients.send(PER_CLIENT)
        for i in range(KILLS):
            # spread the kills over the messages: the i-th once about (i+1)/(KILLS+2) of them landed
            target = int(total * (i + 1) / (KILLS + 2))
            assert wait_for(lambda t=target: len(cluster.orders()) >= t, 300, interval=0.2), (
                f"stuck at {len(cluster.orders())} of {total} after {kills}", cluster.outputs())
            if sum(h.alive for h in cluster.hosts) == 1:  # never kill the last one: start another first
                rng.choice([h for h in cluster.hosts if not h.alive]).start()
                kills.append("(start)")
            victim = rng.choice([h for h in cluster.hosts if h.alive])
            victim.kill()
            kills.append(victim.node or "?")
            if rng.random() < 0.5:
                rng.choice([h for h in cluster.hosts if not h.alive]).start()
                kills[-1] += "+restart"
        print(f"\n{KILLS} kills: {' '.join(kills)}")
        assert wait_delivered(cluster, clients, 600), cluster.outputs()
        assert wait_for(clients.all_acknowledged, 300), cluster.outputs()
        check_exactly_once_in_order(cluster.orders(), clients.sent)
        # nothing in doubt: no prepared transaction, no undone decision, no dead host's claim left
        assert wait_for(lambda: cluster.prepared() == [], 60), cluster.prepared()
        live_nodes = {h.node for h in cluster.hosts if h.alive}
        assert wait_for(lambda: all(cluster.released(name) for (name,) in
                                    cluster.query(cluster.store_dsn, "SELECT name FROM txm_node")
                                    if name not in live_nodes), 60)
        assert cluster.query(cluster.store_dsn, "SELECT node, gtrid FROM txm_decision WHERE kind = 'commit'") == []
        print(f"{total} messages, each delivered once and in order, in {time.monotonic() - started:.0f}s")
    finally:
        clients.stop()
