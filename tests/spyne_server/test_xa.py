"""XA: the method's database work, the dequeue and the reply commit together (PostgreSQL)."""

from __future__ import annotations

import psycopg2
import pytest

from tests.engine.support import wait_for
from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.wire import parse_envelope

from . import service
from .conftest import Envelopes, action, fast_policy


def _orders(dsn: str) -> list[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT item FROM orders ORDER BY id")
            return [row[0] for row in cur.fetchall()]
    finally:
        conn.close()


@pytest.fixture
def orders_db(pg_dsn_factory):
    return pg_dsn_factory("spyne", service.SCHEMA)


@pytest.fixture
def xa(tmp_path, orders_db):
    tm = TransactionManager(node="spyne-xa", log=tmp_path / "tm.log")
    ds = XADataSource(orders_db, tm)
    service.configure(ds=ds)
    yield tm
    service.configure()
    ds.close()
    tm.close()


@pytest.mark.parametrize("store", ["postgres", "sqlite"])
def test_rows_dequeue_and_replies_commit_together_and_faults_roll_back(
        servers, clients, orders_db, xa, tmp_path, store):
    store_url = f"postgresql:{orders_db}" if store == "postgres" else f"sqlite:///{tmp_path}/server.db"
    server = servers(store_url, fast_policy(max_delivery_attempts=2), tm=xa)
    answers: list[tuple[bytes, object]] = []
    client = clients("memory:", application=lambda envelope, context: answers.append((envelope, context)))
    build = Envelopes(server.url)
    texts = ["a", "fail-b", "c"]
    for text in texts:
        client.send(server.url, build("echo", text), action=action("echo"), expect_reply=True)
    client.send(server.url, build("record", "d"), action=action("record"))

    assert wait_for(lambda: len(answers) >= 3 and "d" in service.recorded()), (answers, service.recorded())
    assert wait_for(lambda: server.engine.status().buffered == 0)
    # each success inserted its row exactly once; the failing call's inserts (two attempts) rolled back
    assert sorted(_orders(orders_db)) == ["a", "c", "d"]
    replies = [parse_envelope(envelope) for envelope, _ in answers]
    assert [r.is_fault for r in replies] == [False, True, False]
    assert "the service refuses fail-b" in replies[1].fault().reason
    # counted once the fault reply's transaction committed: the reply may be answered before that
    assert wait_for(lambda: server.engine.status().delivery_failures == 1), server.engine.status()
    # nothing is left prepared: every branch was committed or rolled back
    conn = psycopg2.connect(orders_db)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()")
            assert cur.fetchone()[0] == 0
    finally:
        conn.close()
