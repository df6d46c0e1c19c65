"""A PostgreSQL store commit that waits for the disk later returns before its WAL flush, and
whatever reads it ends only once it is flushed (``wsrm_plugin.store.late_commits``).

A server of its own whose WAL writer sleeps 10 s (and no autovacuum): a commit made with
``synchronous_commit`` off then stays unflushed until something flushes the WAL, so
``pg_current_wal_flush_lsn()`` against the commit's position says exactly whether it was.
Positions, never time.  About 3 s (the server's start).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

from tests.conftest import start_throwaway_server
from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres

RM11 = "http://docs.oasis-open.org/ws-rx/wsrm/200702"
WSA = "http://www.w3.org/2005/08/addressing"
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"


@pytest.fixture(scope="module")
def lazy_wal() -> Iterator[Any]:
    server = start_throwaway_server(settings={"wal_writer_delay": "10s", "autovacuum": "off"})
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def store(lazy_wal: Any) -> Iterator[PostgresStore]:
    name = "late"
    lazy_wal.create_database(name)
    store = PostgresStore(lazy_wal.dsn(name))
    try:
        yield store
    finally:
        store.close()
        lazy_wal.drop_database(name)


def _positions(store: PostgresStore) -> tuple[int, int]:
    """(WAL written so far, WAL flushed so far), read without writing or flushing anything."""
    conn = psycopg2.connect(store.dsn)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn, "
                        "pg_current_wal_flush_lsn() - '0/0'::pg_lsn")
            inserted, flushed = cur.fetchone()
        return int(inserted), int(flushed)
    finally:
        conn.close()


def _record_later(store: PostgresStore, identifier: str) -> int:
    """A consumed reply's record, in short: a write whose commit waits for the disk later; the
    WAL position its commit reached."""
    with store.begin() as tx:
        tx.rmd.create(identifier, acks_to="http://peer/acks", rm_version=RM11, wsa_version=WSA)
        tx.wait_for_disk_later()
    return _positions(store)[0]


def test_the_commit_returns_before_its_flush_and_a_reader_ends_after_it(store):
    _, flushed = _positions(store)
    written = _record_later(store, "s1")
    assert _positions(store)[1] < written  # committed, visible, and not flushed

    with store.begin() as tx:  # a reader: it could send an acknowledgement of what it read
        assert tx.rmd.get("s1") is not None
    assert _positions(store)[1] >= written
    assert store._late.owed() == 0  # known flushed: the next reader sends nothing more
    assert flushed < written


def test_a_reader_that_rolls_back_or_commits_without_durability_waits_too(store):
    written = _record_later(store, "s1")
    with pytest.raises(RuntimeError), store.begin() as tx:
        tx.rmd.get("s1")
        raise RuntimeError("the reader fails after its read")
    assert _positions(store)[1] >= written

    written = _record_later(store, "s2")
    with store.begin(durable=False) as tx:
        tx.rmd.get("s2")
    assert _positions(store)[1] >= written


def test_wait_for_disk_flushes_a_commit_that_returned_before_it(store):
    with store.begin() as tx:
        tx.rmd.create("s1", acks_to="http://peer/acks", rm_version=RM11, wsa_version=WSA)
        tx.wait_for_disk_later()
    written = _positions(store)[0]
    assert _positions(store)[1] < written
    tx.wait_for_disk()
    assert _positions(store)[1] >= written


def test_an_enqueue_commit_covers_it_without_a_statement_more(store, tmp_path):
    """The next call's enqueue, in a global transaction committed in one phase on the
    application's session: its commit flushes the WAL past the record, so nobody flushes again."""
    written = _record_later(store, "s1")
    tm = TransactionManager(node="late", log=tmp_path / "tx.log")
    ds = XADataSource(store.dsn, tm)
    try:
        statements: list[str] = []
        with tm.transaction():
            with ds.connection() as conn, conn.cursor() as cur:
                cur.execute("SELECT 1")
            with store.begin(xa=tm) as tx:
                seq = tx.rms.create("k", target="http://peer/svc", acks_to="urn:a", rm_version=RM11,
                                    wsa_version=WSA)
                execute = tx.execute

                def counted(sql: str, *args: Any, **kw: Any) -> Any:
                    statements.append(sql)
                    return execute(sql, *args, **kw)
                tx.execute = counted  # type: ignore[method-assign]
                tx.rms_messages.enqueue(seq.key, b"<e/>", action="a", soap_version=SOAP12, message_id="urn:m1")
        assert _positions(store)[1] >= written
        assert store._late.owed() == 0
        assert not any("wsrm-flush" in sql for sql in statements), statements
    finally:
        ds.close()
        tm.close()


def test_a_store_whose_role_is_no_superuser_flushes_all_the_same(lazy_wal):
    """The flush a reader owes needs no privilege of its own (nor a table): the role of an
    application that owns only its database."""
    admin = psycopg2.connect(lazy_wal.dsn("postgres"))
    try:
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute("CREATE ROLE late_app LOGIN PASSWORD 'late' NOSUPERUSER")
            cur.execute("CREATE DATABASE late_app OWNER late_app")
    finally:
        admin.close()
    params = psycopg2.extensions.parse_dsn(lazy_wal.dsn("late_app"))
    store = PostgresStore(psycopg2.extensions.make_dsn(**{**params, "user": "late_app", "password": "late"}))
    try:
        written = _record_later(store, "s1")
        assert _positions(store)[1] < written
        with store.begin() as tx:
            assert tx.rmd.read("s1") is not None  # a read outside the transaction: the flush is its own
        assert _positions(store)[1] >= written
    finally:
        store.close()
        lazy_wal.drop_database("late_app")
