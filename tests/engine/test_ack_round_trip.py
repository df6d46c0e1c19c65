"""The sender's acknowledgement transaction on PostgreSQL is one round trip.

An acknowledgement in the response to a send is applied in a store transaction of its own
(not durable: a crash that forgets it learns it again).  It was three round trips: BEGIN with
the sequence's row read ``FOR KEY SHARE``, the acknowledgement's statement, COMMIT.  Now the row's
lock and the acknowledgement go in one query string without BEGIN, which PostgreSQL commits as
it ends; the store's commit sends nothing.  Real engines on loopback HTTP: the client on a
PostgreSQL store, the server on a memory store.  Counts, never time.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.engine.source import Source
from wsrm_plugin.store import open_store
from wsrm_plugin.store.sql import SqlTransaction

from .conftest import fast_policy
from .support import ACTION, item_text, payload, wait_for

pytestmark = pytest.mark.postgres

MESSAGES = 12


def test_each_acknowledgement_the_sender_applies_is_one_round_trip(fresh_db: str, monkeypatch) -> None:
    delivered: list[str] = []
    lock = threading.Lock()

    def application(envelope: bytes, context: object) -> None:
        with lock:
            delivered.append(item_text(envelope) or "")

    store = open_store(fresh_db if fresh_db.startswith("postgresql") else "postgresql:" + fresh_db)
    server = ReliableEngine("memory:", fast_policy(), application=application, name="ackrt-server")
    client = ReliableEngine(store, fast_policy(), name="ackrt-client")
    inside = threading.local()
    applied: list[tuple[int, bool]] = []  # each acknowledgement transaction: (round trips, COMMIT sent)
    trips: dict[int, int] = {}
    execute, on_ack, finish = SqlTransaction.execute, Source.on_ack, store._finish

    def counted(tx: Any, sql: str, params: Any = (), **kw: Any) -> Any:
        if getattr(inside, "ack", False):
            trips[id(tx)] = trips.get(id(tx), 0) + 1
        return execute(tx, sql, params, **kw)

    def applying(self: Source, ack: Any, version: Any) -> None:
        inside.ack = True
        try:
            on_ack(self, ack, version)
        finally:
            inside.ack = False

    def ending(tx: Any, commit: bool) -> None:
        if getattr(inside, "ack", False) and id(tx) in trips:
            applied.append((trips.pop(id(tx)), tx.begun))
        finish(tx, commit)

    monkeypatch.setattr(SqlTransaction, "execute", counted)
    monkeypatch.setattr(Source, "on_ack", applying)
    store._finish = ending
    try:
        server.serve()
        server.start()
        client.start()
        for i in range(MESSAGES):
            client.send(server.endpoint_address, payload(f"m{i}"), action=ACTION)
        assert wait_for(lambda: len(delivered) == MESSAGES and client.status().unacked == 0)
        assert sorted(delivered) == sorted(f"m{i}" for i in range(MESSAGES))
        assert applied and applied == [(1, False)] * len(applied), applied
    finally:
        client.stop(timeout=5)
        server.stop(timeout=5)
        store.close()
