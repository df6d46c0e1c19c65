"""Kill -9 at random instants while the client sends on 16 sequences at once (the runs: :mod:`.kills`)."""

from __future__ import annotations


import pytest

from .kills import assert_exactly_once_in_order_per_key, kill_run, store_items, store_url


@pytest.mark.slow(minutes=1)
@pytest.mark.parametrize("kind", ["sqlite", "sqlite-auto", "sqlite-waits",
                                  pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_random_sigkills_with_16_sequences_at_once_lose_and_repeat_nothing(kind, tmp_path, request):
    """The client sends on 16 sequences at once (a thread each, one engine): the sender's rounds
    carry all of them and the service delivers them side by side, each in its own order, through
    random kills of either peer (about 1 minute each).  ``sqlite``: the application runs in
    the receive's transaction (the default), or, when a receive finds a batch holding the file,
    first, its receipt after (``RMPolicy.first_when_busy``, ``Destination._first_when_busy``);
    ``sqlite-waits``: always in the receive's transaction (``first_when_busy`` off); ``sqlite-auto``: outside the store's transactions
    whenever another sequence's receive is under way (``RMPolicy.deliver_apart=None``; receipts
    waiting for the file together are buffered in one transaction), so a kill may come between a
    batch's buffering and its deliveries' commits."""
    auto, waits = kind == "sqlite-auto", kind == "sqlite-waits"
    kind = "sqlite" if auto or waits else kind
    count, keys = 480, 16
    server_store = store_url(kind, "killsrv16", tmp_path, request)
    client_store = store_url(kind, "killcli16", tmp_path, request)
    items, context = kill_run(["--store", server_store, "--record-in-store", "--base-interval", "0.1",
                               *(["--deliver-auto"] if auto else []), *(["--no-first-when-busy"] if waits else [])],
                              ["--store", client_store, "--count", count, "--keys", keys, "--progress",
                               tmp_path / "progress", "--base-interval", "0.1"],
                              count=count, kills=16, delivered=lambda: store_items(server_store))
    assert_exactly_once_in_order_per_key(items, count, keys, context)
