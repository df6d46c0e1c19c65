"""A method that fails on one message only, with an error an outage raises too, in the middle of
a stream while the others are delivered: that message is a poison message, not an outage (issue 30).

The bad message's query outlives its statement timeout in the service's own PostgreSQL (a real
``QueryCanceledError``, an ``OperationalError`` like a dropped connection's), inside the delivery's
XA transaction.  Another sequence keeps being delivered meanwhile, so the failures are the
message's own: it goes through its attempts and cycles into the poison store exactly as a plain
bug would, and the rest of its sequence holds or goes on as ``poison_handling`` says.  About 10 s
per case.
"""

from __future__ import annotations

import threading
import time

import psycopg2
import pytest

from tests.engine.support import wait_for
from txmanager import TransactionManager
from txmanager.postgres import XADataSource

from . import service
from .conftest import Envelopes, action, fast_policy

STREAM = [f"k0-{i:03d}" for i in range(16)]
BAD = "k0-008"


def _items(dsn: str) -> list[str]:
    conn = psycopg2.connect(dsn, connect_timeout=10)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT item FROM orders ORDER BY id")
            return [row[0] for row in cur.fetchall()]
    finally:
        conn.close()


@pytest.mark.parametrize("handling", ["continue", "hold"])
def test_one_message_failing_like_an_outage_while_others_are_delivered_is_poisoned(
        servers, clients, pg_dsn_factory, tmp_path, handling):
    dsn = pg_dsn_factory("poisonoutage", service.SCHEMA)
    tm = TransactionManager(node="poison-outage", log=tmp_path / "tm.log")
    ds = XADataSource(dsn, tm)
    service.configure(ds=ds, too_slow={BAD})
    failures = []
    try:
        policy = fast_policy(max_delivery_attempts=2, delivery_retry_delay=0.1, max_retry_cycles=1,
                             retry_cycle_delay=0.5, poison_handling=handling, invoker_threads=2)
        server = servers(f"sqlite:///{tmp_path}/server.db", policy, tm=tm,
                         on_delivery_failure=failures.append)
        client = clients("memory:")
        build = Envelopes(server.url)
        for item in STREAM:
            client.send(server.url, build("record", item), action=action("record"), key="k0")
        stop = threading.Event()
        others: list[str] = []

        def stream() -> None:  # the other sequence keeps being delivered: the service works
            while not stop.is_set():
                item = f"k1-{len(others):04d}"
                client.send(server.url, build("record", item), action=action("record"), key="k1")
                others.append(item)
                time.sleep(0.05)

        sender = threading.Thread(target=stream, daemon=True)
        sender.start()
        try:
            assert wait_for(lambda: failures, timeout=90), server.engine.status()
        finally:
            stop.set()
            sender.join()
        [failure] = failures
        assert failure.poison_id.endswith("#9")  # k0-008 is the 9th message of its sequence
        assert "QueryCanceled" in repr(failure.error.__cause__) or "statement timeout" in str(failure.error)
        [kept] = server.engine.poison_messages()
        assert kept.total_attempts == 4 and kept.cycles == 2  # 2 attempts x 2 cycles, as for any poison
        assert kept.held == (handling == "hold")
        assert wait_for(lambda: set(others) <= set(_items(dsn)), timeout=60)  # the other sequence: all of it
        before = [item for item in STREAM if item < BAD]
        after = [item for item in STREAM if item > BAD]
        if handling == "continue":
            assert wait_for(lambda: [i for i in _items(dsn) if i.startswith("k0-")] == before + after, timeout=60)
        else:
            time.sleep(1.0)  # time in which the held messages would have been delivered
            assert [i for i in _items(dsn) if i.startswith("k0-")] == before
            assert server.engine.status().buffered == len(after)
        status = server.engine.status()
        assert status.poisoned == 1 and not status.paused
    finally:
        service.configure()
        ds.close()
        tm.close()
