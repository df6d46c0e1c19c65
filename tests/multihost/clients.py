"""Reliable clients of the multi-host tests (one WS-RM sequence each) and the checks of what was delivered."""

from __future__ import annotations

from collections.abc import Iterable

from wsrm_plugin.engine import ReliableEngine, RMPolicy

from tests.spyne_server.conftest import Envelopes, action

from .cluster import Cluster, wait_for


def client_policy() -> RMPolicy:
    # a message a dead host swallowed is sent again soon; the window keeps each sequence moving
    return RMPolicy(base_retransmission_interval=0.5, exponential_backoff=False, poll_interval=0.05,
                    http_timeout=5.0, soap_version="1.1", max_retries=None)


class Clients:
    """``count`` one-way senders to the cluster's public address, items ``c<k>-<n>``."""

    def __init__(self, cluster: Cluster, count: int) -> None:
        self.cluster = cluster
        self.engines = [ReliableEngine("memory:", client_policy(), name=f"client-{k}") for k in range(count)]
        self.build = Envelopes(cluster.public_url)
        self.sent: dict[int, int] = {k: 0 for k in range(count)}
        for engine in self.engines:
            engine.start()

    def send(self, per_client: int) -> None:
        """Enqueue the next ``per_client`` items of every client (the engines send them)."""
        for k, engine in enumerate(self.engines):
            start = self.sent[k]
            for n in range(start, start + per_client):
                engine.send(self.cluster.public_url, self.build("record", f"c{k}-{n:05d}"), action=action("record"))
            self.sent[k] = start + per_client

    def expected(self) -> int:
        return sum(self.sent.values())

    def all_acknowledged(self) -> bool:
        return all(engine.status().unacked == 0 for engine in self.engines)

    def stop(self) -> None:
        for engine in self.engines:
            engine.stop(timeout=5)


def check_exactly_once_in_order(rows: Iterable[tuple[str, str]], sent: dict[int, int]) -> None:
    """Every item once, and each client's items in the order sent."""
    items = [item for item, _ in rows if not item.startswith("probe-")]
    duplicates = sorted({i for i in items if items.count(i) > 1})
    assert not duplicates, f"delivered more than once: {duplicates[:10]}"
    for k, count in sent.items():
        mine = [item for item in items if item.startswith(f"c{k}-")]
        assert mine == [f"c{k}-{n:05d}" for n in range(count)], (
            f"client {k}: {len(mine)} of {count} delivered, in order: "
            f"{mine == sorted(mine)}; missing {sorted(set(f'c{k}-{n:05d}' for n in range(count)) - set(mine))[:10]}")


def wait_delivered(cluster: Cluster, clients: Clients, timeout: float) -> bool:
    expected = clients.expected()
    return wait_for(lambda: len([1 for item, _ in cluster.orders() if not item.startswith("probe-")]) >= expected,
                    timeout, interval=0.5)
