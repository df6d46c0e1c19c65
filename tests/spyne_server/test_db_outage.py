"""The application's database goes away while messages arrive: nothing accepted is dropped.

The service's PostgreSQL server (its own throwaway server, not the store's)
is really stopped for 5 s (and 60 s, marked slow) while 100 one-way and 20
in-out messages arrive.  Every one is acknowledged to the client at once and
waits in the store (``wsrm status`` says so); the first delivery fails, is
rolled back and retried with backoff, in retry cycles; when the database is
back every message is in the table exactly once and every request answered.
Each delivery is one XA transaction (the store's branch and the database's).
"""

from __future__ import annotations

import time
from collections import Counter

import psycopg2
import pytest

from tests.conftest import start_throwaway_server
from tests.engine.support import wait_for
from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.wire import parse_envelope

from . import service
from .conftest import Envelopes, action, fast_policy
from .test_poison import wsrm

ITEMS = [f"e{i:03d}" if i % 6 == 5 else f"r{i:03d}" for i in range(120)]  # 20 in-out, 100 one-way


@pytest.fixture
def app_pg():
    """The application's own PostgreSQL server, which the test stops and starts again."""
    server = start_throwaway_server()
    try:
        yield server
    finally:
        server.close()


def _counts(dsn: str) -> Counter[str]:
    conn = psycopg2.connect(dsn, connect_timeout=10)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT item FROM orders")
            return Counter(row[0] for row in cur.fetchall())
    finally:
        conn.close()


def _prepared(dsn: str) -> int:
    conn = psycopg2.connect(dsn, connect_timeout=10)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()")
            return cur.fetchone()[0]
    finally:
        conn.close()


def _outage(servers, clients, app_pg, pg_dsn_factory, tmp_path, *, kind: str, seconds: float, policy) -> None:
    app_dsn = app_pg.create_database("orders")
    conn = psycopg2.connect(app_dsn)
    with conn, conn.cursor() as cur:
        cur.execute(service.SCHEMA)
    conn.close()
    store_url = (f"sqlite:///{tmp_path}/server.db" if kind == "sqlite"
                 else f"postgresql:{pg_dsn_factory('outagestore')}")
    tm = TransactionManager(node="outage", log=tmp_path / "tm.log")
    ds = XADataSource(app_dsn, tm)
    service.configure(ds=ds)
    try:
        server = servers(store_url, policy, tm=tm)
        answers: list[bytes] = []
        client = clients("memory:", application=lambda envelope, context: answers.append(envelope))
        build = Envelopes(server.url)

        app_pg.stop()  # the database is down from here on
        down_since = time.monotonic()
        for item in ITEMS:
            operation = "echo" if item.startswith("e") else "record"
            client.send(server.url, build(operation, item), action=action(operation),
                        expect_reply=operation == "echo")

        # every message is accepted (acknowledged) although none can be processed
        assert wait_for(lambda: client.status().unacked == 0, timeout=120), client.status()
        # one sequence for the one-way messages, one (with an offer) for the requests: the first
        # message of each fails and is retried, the others wait behind it (InOrder)
        assert wait_for(lambda: server.engine.status().retrying == 2, timeout=60)
        shown = wsrm("status", "--store", store_url)
        assert shown.returncode == 0, shown.stderr
        assert f"messages awaiting delivery {len(ITEMS)}" in shown.stdout, shown.stdout
        assert "waiting for a retry       2" in shown.stdout, shown.stdout
        assert "poison messages           0" in shown.stdout
        assert service.recorded() == []

        time.sleep(max(0.0, seconds - (time.monotonic() - down_since)))
        app_pg.start()  # the database is back

        expected = {item: 1 for item in ITEMS}
        assert wait_for(lambda: len(answers) >= 20 and sum(_counts(app_dsn).values()) >= len(ITEMS),
                        timeout=180), (len(answers), sum(_counts(app_dsn).values()))
        assert wait_for(lambda: server.engine.status().buffered == 0, timeout=60)
        assert dict(_counts(app_dsn)) == expected  # every message, exactly once: none dropped
        replies = [parse_envelope(envelope) for envelope in answers]
        assert not any(r.is_fault for r in replies)
        assert len(replies) == 20
        status = server.engine.status()
        assert status.poisoned == 0 and status.retrying == 0 and status.delivery_failures == 0
        assert status.delivery_retries >= 1
        for prefix in ("r", "e"):  # each sequence delivered in order
            assert [i for i in service.recorded() if i.startswith(prefix)] == [i for i in ITEMS if i.startswith(prefix)]
        assert wait_for(lambda: _prepared(app_dsn) == 0, timeout=60)
    finally:
        service.configure()
        if not app_pg.running:
            app_pg.start()
        ds.close()
        tm.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_5s_database_outage_loses_and_duplicates_nothing(servers, clients, app_pg, pg_dsn_factory, tmp_path, kind):
    policy = fast_policy(max_delivery_attempts=3, delivery_retry_delay=0.1, max_retry_cycles=30,
                         retry_cycle_delay=0.5)
    _outage(servers, clients, app_pg, pg_dsn_factory, tmp_path, kind=kind, seconds=5, policy=policy)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_60s_database_outage_loses_and_duplicates_nothing(servers, clients, app_pg, pg_dsn_factory, tmp_path, kind):
    policy = fast_policy(max_delivery_attempts=3, delivery_retry_delay=0.2, max_retry_cycles=60,
                         retry_cycle_delay=2.0)
    _outage(servers, clients, app_pg, pg_dsn_factory, tmp_path, kind=kind, seconds=60, policy=policy)
