"""Kill -9 at random instants, one sequence: client or server peer, again and again, each restarted
on its store; and the client's resume rule those runs lean on (the runs: :mod:`.kills`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from .kills import assert_exactly_once_in_order, kill_run, store_items, store_url
from .peer import PeerProcess
from .support import wait_for


def test_a_resumed_client_enqueues_only_what_was_not_handed_over(tmp_path):
    """The resume rule itself, without kills: runs with the same arguments add nothing twice."""
    server_store, client_store = f"sqlite:///{tmp_path}/srv.db", f"sqlite:///{tmp_path}/cli.db"
    server = PeerProcess("--role", "server", "--store", server_store, "--record-in-store")
    try:
        url = server.ready_url()
        client_args = ["--role", "client", "--store", client_store, "--target", url, "--resume",
                       "--progress", tmp_path / "progress"]
        runs = [("--count", 6), ("--count", 10, "--close"), ("--count", 10, "--close")]
        for extra in runs:  # 6 on an open sequence, then the other 4 and Close, then nothing
            client = PeerProcess(*client_args, *extra)
            assert client.proc.wait(60) == 0, client.tail()
            assert client.status()["drained"], client.status()
        assert wait_for(lambda: len(store_items(server_store)) >= 10, timeout=30)
        assert server.stop() == 0, server.tail()
    finally:
        server.kill()
    assert_exactly_once_in_order(store_items(server_store), 10, server.tail())
    with sqlite3.connect(Path(server_store[len("sqlite:///"):])) as conn:
        assert len({row[0] for row in conn.execute("SELECT sequence_id FROM app_delivered")}) == 1


@pytest.mark.slow(minutes=1.25)
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_random_sigkills_of_either_peer_lose_and_repeat_nothing(kind, tmp_path, request):
    count = 400
    server_store = store_url(kind, "killsrv", tmp_path, request)
    client_store = store_url(kind, "killcli", tmp_path, request)
    items, context = kill_run(["--store", server_store, "--record-in-store", "--base-interval", "0.1"],
                              ["--store", client_store, "--count", count, "--progress", tmp_path / "progress",
                               "--base-interval", "0.1"],
                              count=count, kills=20, delivered=lambda: store_items(server_store))
    assert_exactly_once_in_order(items, count, context)
