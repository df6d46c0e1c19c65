"""The client enqueues inside the caller's XA transaction, with a PostgreSQL row: both or neither."""

from __future__ import annotations

import psycopg2
import pytest

from tests.engine.support import wait_for
from txmanager import TransactionManager
from txmanager.postgres import XADataSource

from . import service


def _rows(dsn: str) -> list[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT item FROM orders ORDER BY item")
            return [row[0] for row in cur.fetchall()]
    finally:
        conn.close()


@pytest.fixture
def orders(pg_dsn_factory):
    dsn = pg_dsn_factory("zeepclient")
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE orders (item text PRIMARY KEY)")
    finally:
        conn.close()
    return dsn


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
