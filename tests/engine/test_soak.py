"""Soak: two engines in separate processes, 1000 messages through a lossy network, every store.

The client peer sends to a :class:`~wsrm_plugin.tools.proxy.LossyProxy` (in this
process) that drops 20 %, duplicates 10 % and reorders 20 % of the requests
on their way to the server peer.  The server's application records every
hand-over, duplicates included, so the check is on what really happened:
each of the 1000 messages exactly once, in the order sent.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from wsrm_plugin.tools.proxy import LossyProxy

from .peer import PeerProcess
from .support import wait_for

COUNT = 1000


def logged_items(path: Path) -> list[str]:
    """Items in a peer's ``--log`` file, in hand-over order ([] before the peer created it)."""
    if not path.exists():
        return []
    conn = sqlite3.connect(path, timeout=30)
    try:
        return [row[0] for row in conn.execute("SELECT item FROM delivered ORDER BY id")]
    except sqlite3.OperationalError:  # the table is not there yet
        return []
    finally:
        conn.close()


def store_urls(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, str]:
    """(server store, client store) of ``kind``: each peer its own."""
    if kind == "memory":
        return "memory:", "memory:"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/server.db", f"sqlite:///{tmp_path}/client.db"
    make = request.getfixturevalue("pg_dsn_factory")
    return "postgresql:" + make("soaksrv"), "postgresql:" + make("soakcli")


@pytest.mark.slow
@pytest.mark.parametrize("kind,rm_version", [
    ("memory", "1.1"), ("sqlite", "1.0"), pytest.param("postgresql", "1.1", marks=pytest.mark.postgres)])
def test_1000_messages_between_processes_through_a_lossy_network(kind, rm_version, tmp_path, request):
    server_store, client_store = store_urls(kind, tmp_path, request)
    log_path = tmp_path / "delivered.db"
    seed = random.SystemRandom().randrange(2**32)
    peers: list[PeerProcess] = []
    try:
        server = PeerProcess("--role", "server", "--rm", rm_version, "--store", server_store, "--log", log_path)
        peers.append(server)
        url = server.ready_url()
        with LossyProxy(url, drop=0.2, duplicate=0.1, reorder=0.2, seed=seed) as proxy:
            client = PeerProcess("--role", "client", "--rm", rm_version, "--store", client_store,
                                 "--target", proxy.url, "--count", COUNT, "--close", "--drain-timeout", 240)
            peers.append(client)
            assert client.proc.wait(300) == 0, f"seed {seed}: {client.status()}\n{client.tail()}"
            proxy.drain()
            stats = proxy.stats
        status = client.status()
        assert status is not None and status["drained"] and status["rms_sequences"] == 0
        assert status["faulted_sequences"] == 0
        # acknowledged means stored at the destination: the invoker may still be handing over
        assert wait_for(lambda: len(logged_items(log_path)) >= COUNT, timeout=60), \
            f"seed {seed}: {len(logged_items(log_path))} delivered\n{server.tail()}"
        assert server.stop() == 0, server.tail()
    finally:
        for peer in peers:
            peer.kill()
    items = logged_items(log_path)
    duplicates = len(items) - len(set(items))
    assert duplicates == 0, f"seed {seed}: {duplicates} messages handed over twice"
    assert items == [f"m{i}" for i in range(COUNT)], f"seed {seed}: out of order or missing"
    # the network really misbehaved, and the engine had to work for it
    assert stats.dropped > 0 and stats.duplicated > 0 and stats.reordered > 0, stats
    assert status["retransmissions"] > 0
