"""In-out calls with an Offer through the load balancer, whichever host runs them (issue 31).

Three zeep reliable clients, each listening for its replies (its AcksTo and
ReplyTo) and offering a sequence for them, call ``echo`` through haproxy
round robin: a request may be received by one host, delivered by another
and its reply sent by a third, since the sequences and the replies are in
the shared store.  One host is SIGKILLed while calls are in flight and never
restarted: the replies it had stored but not sent are sent by the others.
Every call gets its reply, each request ran once.

Expected duration: under a minute.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest
import zeep

from interceptors.zeep_client.client import reliable_client

from .clients import client_policy
from .cluster import Cluster, wait_for

pytestmark = [pytest.mark.slow(minutes=0.75), pytest.mark.postgres, pytest.mark.timeout(600)]

CALLS = 60


@pytest.fixture
def cluster(tmp_path: Path):
    made = Cluster(tmp_path, 3).start()
    try:
        made.start_hosts()
        yield made
    finally:
        made.close()


def _port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def test_replies_reach_every_client_whichever_host_ran_the_request(cluster: Cluster) -> None:
    clients = [reliable_client(zeep.Client(cluster.public_url + "?wsdl"), "memory:", client_policy(),
                               listen=(cluster.gateway, _port(cluster.gateway)), key=f"c{k}", name=f"inout-{k}")
               for k in range(3)]
    try:
        futures = {}
        for n in range(CALLS):
            for k, rc in enumerate(clients):
                futures[f"c{k}-{n:03d}"] = rc.service.echo(f"c{k}-{n:03d}")
            if n == CALLS // 3:
                victim = random.choice(cluster.hosts)

                def ran_there_unanswered(dying: str | None = victim.node) -> list[str]:
                    return [item for item, node in cluster.orders() if node == dying and not futures[item].done()]
                # killed once it ran a request whose reply the client has not got (when that is caught in time)
                wait_for(lambda: bool(ran_there_unanswered()), 30, interval=0.005)
                orphaned = ran_there_unanswered()
                victim.kill()
                print(f"\nhost {victim.node} killed after running {len(orphaned)} request(s) whose replies "
                      f"had not reached their clients: {orphaned[:5]}")
        replies = {text: future.result(timeout=300) for text, future in futures.items()}
        assert replies == {text: "re:" + text for text in futures}
        items = [item for item, _ in cluster.orders()]
        assert sorted(items) == sorted(futures), "each request ran once"
        ran_on = {node for _, node in cluster.orders()}
        assert len(ran_on) == 3, f"requests ran on {ran_on}"
        assert wait_for(lambda: cluster.prepared() == [], 60), cluster.prepared()
    finally:
        for rc in clients:
            rc.stop()
