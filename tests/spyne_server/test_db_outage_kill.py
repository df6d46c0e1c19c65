"""The database dies under a delivery's XA transaction, and the service is SIGKILLed while delivery
is paused: after both come back, nothing is lost, nothing is doubled, nothing is left prepared.

The service runs in its own process (``server_process``) with a SQLite store and a recovery log;
its method inserts into its own PostgreSQL (an ``XADataSource`` branch of the delivery's XA
transaction) and then lingers, so the database can be killed (SIGKILL to its postmaster: a crash,
no clean shutdown) while a backend is idle in that transaction.  Delivery pauses (``wsrm status``,
another process, reads it from the store); the service is then SIGKILLed too.  The database starts
again (crash recovery), the service starts again (the transaction manager's recovery, then
delivery).  Slow: about 40 s.
"""

from __future__ import annotations

from collections import Counter

import psycopg2
import pytest

from tests.engine.support import wait_for

from . import service
from .conftest import Envelopes, action
from .test_poison import wsrm
from .test_processes import ServerProcess, _free_port

KEYS = ("k0", "k1")
ITEMS = {key: [f"{key}-{i:03d}" for i in range(20)] for key in KEYS}


def _query(dsn: str, sql: str) -> list[tuple]:
    conn = psycopg2.connect(dsn, connect_timeout=10)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        conn.close()


def _items(dsn: str) -> list[str]:
    return [row[0] for row in _query(dsn, "SELECT item FROM orders ORDER BY id")]


@pytest.mark.slow(minutes=0.75)
def test_database_killed_inside_an_xa_delivery_and_service_killed_during_the_pause(
        clients, app_pg, tmp_path):
    dsn = app_pg.create_database("orders")
    _query(dsn, service.SCHEMA + "; SELECT 1")
    store = f"sqlite:///{tmp_path}/server.db"
    options = dict(store=store, port=_free_port(), dsn=dsn, node="outage-kill", tm_log=tmp_path / "tm.log",
                   delay=0.3, policy='{"invoker_threads": 2}')
    server = ServerProcess(**options)
    try:
        client = clients("memory:")
        build = Envelopes(server.url)
        for i in range(20):
            for key in KEYS:
                client.send(server.url, build("record", ITEMS[key][i]), action=action("record"), key=key)
        assert wait_for(lambda: len(_items(dsn)) >= 4, timeout=60)
        # a delivery has inserted its row and lingers inside its XA transaction: kill the database now
        assert wait_for(lambda: _query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                            "current_database() AND state = 'idle in transaction'")[0][0] > 0,
                        timeout=30, interval=0.005)
        app_pg.kill()

        def paused() -> bool:
            shown = wsrm("status", "--store", store)
            return shown.returncode == 0 and "DELIVERY PAUSED" in shown.stdout

        assert wait_for(paused, timeout=60), wsrm("status", "--store", store).stdout
        server.kill()  # SIGKILL while delivery is paused
        app_pg.start()  # crash recovery of the database
        delivered_before = len(_items(dsn))
        assert delivered_before < 40, "the outage came too late to test anything"
        server = ServerProcess(**options)  # same store, node and log: recovery, then the rest

        everything = [item for key in KEYS for item in ITEMS[key]]
        assert wait_for(lambda: len(_items(dsn)) >= len(everything), timeout=120), len(_items(dsn))
        assert wait_for(lambda: client.status().unacked == 0, timeout=60)
        items = _items(dsn)
        assert Counter(items) == {item: 1 for item in everything}  # nothing lost, nothing doubled
        for key in KEYS:
            assert [item for item in items if item.startswith(f"{key}-")] == ITEMS[key]  # in order
        assert wait_for(lambda: _query(dsn, "SELECT count(*) FROM pg_prepared_xacts")[0][0] == 0, timeout=60)
        assert wait_for(lambda: "delivery                  running" in wsrm("status", "--store", store).stdout,
                        timeout=60)
        print(f"\n{delivered_before} of {len(everything)} delivered before the crashes, the rest after")
    finally:
        server.stop()
