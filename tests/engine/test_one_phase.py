"""One database, one phase: the WS-RM store beside the application's tables shares its XA branch.

Both peers are real engines on loopback HTTP with PostgreSQL stores; each side's
application writes through an ``XADataSource`` inside the global transaction that
enqueues (client) or dequeues (server) the message.  The transaction managers'
crash-test hook counts what each commit did: ``prepared`` once per prepared
branch, ``before_log`` once per logged decision, ``before_commit_one_phase`` once
per one-phase commit.  With the store in the application's database every
message must commit in one phase on both sides (0 PREPARE, 0 log writes, the
recovery log file untouched); with two databases it stays two-phase: the store's
branch commits last with the decision as a commit mark (1 PREPARE, no log write),
or, with ``commit_marks=0``, 2 PREPAREs and a logged decision per transaction.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import psycopg2
import pytest

from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.store import open_store

from .conftest import fast_policy
from .support import ACTION, item_text, payload, wait_for

pytestmark = pytest.mark.postgres

COUNT = 20


class Points:
    """The TM checkpoint hook as a counter (thread-safe: the invoker commits from its worker)."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, point: str, index: int) -> None:
        with self._lock:
            self.seen[point] += 1

    def __getitem__(self, point: str) -> int:
        return self.seen[point]

    def __repr__(self) -> str:
        return repr(dict(self.seen))


def _table(dsn: str, ddl: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(ddl)
    finally:
        conn.close()


def _items(dsn: str, table: str) -> list[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f"SELECT item FROM {table} ORDER BY id")
            return [row[0] for row in cur.fetchall()]
    finally:
        conn.close()


def _prepared(dsn: str) -> list[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
            return [row[0] for row in cur.fetchall()]
    finally:
        conn.close()


def _run(pg_dsn_factory, tmp_path: Path, same_database: bool,
         commit_marks: bool = True) -> tuple[Points, Points, dict[str, int]]:
    client_app, server_app = pg_dsn_factory("opcliapp"), pg_dsn_factory("opsrvapp")
    client_store = client_app if same_database else pg_dsn_factory("opclistore")
    server_store = server_app if same_database else pg_dsn_factory("opsrvstore")
    _table(client_app, "CREATE TABLE sent (id serial PRIMARY KEY, item text NOT NULL)")
    _table(server_app, "CREATE TABLE delivered (id serial PRIMARY KEY, item text NOT NULL)")
    client_points, server_points = Points(), Points()
    logs = {"client": tmp_path / "client.tmlog", "server": tmp_path / "server.tmlog"}
    tm_c = TransactionManager(node="op-client", log=logs["client"], checkpoint=client_points)
    tm_s = TransactionManager(node="op-server", log=logs["server"], checkpoint=server_points)
    ds_c, ds_s = XADataSource(client_app, tm_c), XADataSource(server_app, tm_s)

    def application(envelope: bytes, context: object) -> None:
        with ds_s.connection() as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO delivered (item) VALUES (%s)", (item_text(envelope),))

    stores = [open_store("postgresql:" + dsn, commit_marks=commit_marks) for dsn in (server_store, client_store)]
    server = ReliableEngine(stores[0], fast_policy(), tm=tm_s, application=application, name="op-server")
    client = ReliableEngine(stores[1], fast_policy(), tm=tm_c, name="op-client")
    sizes_before: dict[str, int] = {}
    try:
        server.serve()
        server.start()
        client.start()
        # the log's file is preallocated in chunks, so its size says nothing: count its flushes
        sizes_before = {"client": tm_c.log.fsyncs, "server": tm_s.log.fsyncs}
        items = [f"m{i:02d}" for i in range(COUNT)]
        for item in items:
            with tm_c.transaction():
                with ds_c.connection() as conn, conn.cursor() as cur:
                    cur.execute("INSERT INTO sent (item) VALUES (%s)", (item,))
                client.send(server.endpoint_address, payload(item), action=ACTION)
        assert wait_for(lambda: _items(server_app, "delivered") == items, timeout=60), \
            _items(server_app, "delivered")
        assert _items(client_app, "sent") == items
        assert wait_for(lambda: client.status().unacked == 0, timeout=30)
        server_points.seen["on_receipt"] = server.status().delivered_on_receipt
    finally:
        client.stop(timeout=5)
        server.stop(timeout=5)
        for closeable in (ds_c, ds_s, *stores, tm_c, tm_s):
            closeable.close()
    for dsn in {client_app, server_app, client_store, server_store}:
        assert _prepared(dsn) == []
    grown = {"client": tm_c.log.fsyncs - sizes_before["client"], "server": tm_s.log.fsyncs - sizes_before["server"]}
    return client_points, server_points, grown


def test_store_in_the_applications_database_commits_every_message_in_one_phase(pg_dsn_factory, tmp_path):
    client_points, server_points, grown = _run(pg_dsn_factory, tmp_path, same_database=True)
    for side, points in (("client", client_points), ("server", server_points)):
        assert points["before_prepare"] == points["prepared"] == 0, f"{side}: {points}"
        assert points["before_log"] == 0, f"{side}: {points}"
        assert points["before_commit_one_phase"] >= 1, f"{side}: {points}"
    # the client's transactions are the test's own: one each, all in one phase
    assert client_points["before_commit_one_phase"] == COUNT, client_points
    # the server delivers on receipt (the default under a transaction manager): a message that
    # was next when it arrived is received and delivered in one XA transaction, no second one
    assert server_points["on_receipt"] >= 1, server_points
    assert grown == {"client": 0, "server": 0}, "a one-phase commit wrote to the recovery log"


def test_store_in_another_database_keeps_two_phase_commit(pg_dsn_factory, tmp_path):
    client_points, server_points, grown = _run(pg_dsn_factory, tmp_path, same_database=False,
                                               commit_marks=False)
    # each client transaction: two branches (the application's database and the store) prepared
    assert client_points["prepared"] == 2 * COUNT, client_points
    assert client_points["before_log"] == COUNT, client_points
    assert client_points["before_commit_one_phase"] == 0, client_points
    assert server_points["prepared"] >= 2 and server_points["before_log"] >= 1, server_points
    assert server_points["prepared"] == 2 * server_points["before_log"], server_points
    assert grown["client"] > 0 and grown["server"] > 0


def test_store_in_another_database_with_commit_marks_prepares_only_the_application(pg_dsn_factory, tmp_path):
    """The store's default: its branch carries the decision as a commit mark (txmanager.marks):
    one PREPARE per transaction (the application's), and nothing in the recovery log but the
    one note, per side, that the store's database keeps marks."""
    client_points, server_points, grown = _run(pg_dsn_factory, tmp_path, same_database=False)
    assert client_points["prepared"] == client_points["before_log"] == COUNT, client_points
    assert client_points["before_commit_one_phase"] == 0, client_points
    assert server_points["prepared"] >= 1, server_points
    assert server_points["prepared"] == server_points["before_log"], server_points
    assert grown == {"client": 1, "server": 1}, grown
