"""The client enqueues inside the caller's XA transaction, with a PostgreSQL row: both or neither."""

from __future__ import annotations

import psycopg2
import pytest

from tests.engine.support import wait_for
from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from txmanager.xid import Xid

from . import service


def _column(dsn: str, sql: str) -> list[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return [row[0] for row in cur.fetchall()]
    finally:
        conn.close()


def _rows(dsn: str) -> list[str]:
    return _column(dsn, "SELECT item FROM orders ORDER BY item")


@pytest.fixture
def orders(pg_dsn_factory):
    return pg_dsn_factory("zeepclient", "CREATE TABLE orders (item text PRIMARY KEY)")


@pytest.fixture
def tm(tmp_path):
    manager = TransactionManager(node="zeep-client", log=tmp_path / "tm.log")
    yield manager
    manager.close()


class Boom(Exception):
    pass


def test_rollback_keeps_neither_row_nor_message_commit_keeps_both(clients, orders, tm, tmp_path):
    ds = XADataSource(orders, tm)
    try:
        rc = clients(f"sqlite:///{tmp_path}/client.db", tm=tm, listen=("127.0.0.1", 0))
        with pytest.raises(Boom):
            with tm.transaction():
                with ds.connection() as conn, conn.cursor() as cur:
                    cur.execute("INSERT INTO orders VALUES ('rolled-back')")
                rc.service.record("rolled-back")
                future = rc.service.echo("rolled-back")
                raise Boom()
        assert _rows(orders) == []
        assert rc.engine.store.status().unacked == 0
        with pytest.raises(Exception, match="rolled back"):
            future.result(timeout=5)

        with tm.transaction():
            with ds.connection() as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO orders VALUES ('committed')")
            rc.service.record("committed")
            future = rc.service.echo("committed")
        assert _rows(orders) == ["committed"]
        assert future.result(timeout=30) == "re:committed"
        assert wait_for(lambda: service.RECEIVED == ["committed"])
        assert service.ECHOED == ["committed"]
    finally:
        ds.close()


def test_a_call_inside_a_transaction_the_client_cannot_join_raises_and_nothing_is_queued(clients, orders, tm,
                                                                                        tmp_path):
    from interceptors.zeep_client.client import TransactionNotJoined

    ds = XADataSource(orders, tm)
    try:
        rc = clients(f"sqlite:///{tmp_path}/client.db")  # tm= forgotten
        with pytest.raises(TransactionNotJoined, match="without tm="):
            with tm.transaction():
                with ds.connection() as conn, conn.cursor() as cur:
                    cur.execute("INSERT INTO orders VALUES ('lost-atomicity')")
                rc.service.record("lost-atomicity")
                raise Boom()  # never reached: the call itself raised
        assert _rows(orders) == []
        assert rc.engine.store.status().rms == ()  # nothing will be sent
        rc.service.record("outside")  # outside a transaction the client works as before
        rc.flush(timeout=30)
        assert service.RECEIVED == ["outside"]
    finally:
        ds.close()


def _orphan(dsn: str, node: str, item: str) -> str:
    """A branch of ``node`` that inserted ``item`` and was prepared by a process killed before
    its decision: it stays prepared, holding the row's key, until recovery rolls it back."""
    gid = Xid.new_global(node).branch(b"0").to_pg_gid()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("INSERT INTO orders VALUES (%s)", (item,))
            cur.execute("PREPARE TRANSACTION %s", (gid,))
    finally:
        conn.close()
    return gid


def _prepared(dsn: str) -> list[str]:
    return _column(dsn, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")


def test_a_data_source_created_after_the_client_started_is_recovered_when_it_registers(
        clients, orders, tmp_path):
    # The CI failure this pins: the demo client started (start-up recovery saw only its store),
    # then opened its application database, where the killed client's branch still held the key
    # of the row it was about to insert again: the insert waited forever.
    gid = _orphan(orders, "zeep-late", "again")
    tm = TransactionManager(node="zeep-late", log=tmp_path / "tm.log", safety_interval=0)
    try:
        rc = clients(f"sqlite:///{tmp_path}/client.db", tm=tm)
        assert rc.lifecycle_report.recovery is not None
        assert _prepared(orders) == [gid]  # the start-up pass could not see this database
        ds = XADataSource(orders, tm)  # registering it runs a pass over it at once
        try:
            assert _prepared(orders) == []
            with tm.transaction():
                with ds.connection() as conn, conn.cursor() as cur:
                    cur.execute("SET LOCAL lock_timeout = '5s'")
                    cur.execute("INSERT INTO orders VALUES ('again')")
            assert _rows(orders) == ["again"]
        finally:
            ds.close()
    finally:
        tm.close()


def test_background_recovery_of_a_client_rolls_back_a_young_orphan_without_a_restart(
        clients, orders, tmp_path):
    gid = _orphan(orders, "zeep-bg", "young")
    tm = TransactionManager(node="zeep-bg", log=tmp_path / "tm.log", safety_interval=1.0)
    ds = XADataSource(orders, tm)
    try:
        with pytest.raises(ValueError, match="recovery_interval"):
            clients("memory:", recovery_interval=0.2)  # no transaction manager: nothing to recover
        rc = clients(f"sqlite:///{tmp_path}/client.db", tm=tm, recovery_interval=0.2)
        # younger than the safety interval at start-up: left alone then, rolled back later
        assert _prepared(orders) in ([gid], [])
        assert tm.recovery.running
        assert wait_for(lambda: _prepared(orders) == [], timeout=30)
        rc.stop(timeout=5)
        assert not tm.recovery.running  # the client stops the recovery it started
    finally:
        ds.close()
        tm.close()


def test_a_young_orphan_and_no_background_recovery_is_a_startup_warning(clients, orders, tmp_path, caplog):
    _orphan(orders, "zeep-warn", "stuck")
    tm = TransactionManager(node="zeep-warn", log=tmp_path / "tm.log", safety_interval=60)
    ds = XADataSource(orders, tm)
    try:
        with caplog.at_level("WARNING", logger="wsrm_plugin.lifecycle"):
            rc = clients(f"sqlite:///{tmp_path}/client.db", tm=tm)
        assert len(rc.lifecycle_report.recovery.waiting) == 1
        assert any("recovery_interval=<seconds>" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        ds.close()
        tm.close()
        _rollback_all(orders)


def _rollback_all(dsn: str) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for gid in _prepared(dsn):
                cur.execute("ROLLBACK PREPARED %s", (gid,))
    finally:
        conn.close()
