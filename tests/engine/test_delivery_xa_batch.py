"""Batched delivery under XA: several messages per global transaction, each still exactly once.

Everything is real: the server's store and the application's table are two
PostgreSQL databases, the application writes through an ``XADataSource``,
and the TransactionManager keeps its recovery log in the test's directory,
so every delivery transaction is a two-phase commit of two prepared
branches.  Each row the application writes carries the gtrid of the global
transaction it ran in: the committed rows themselves show how many
transactions committed, and that nothing of a rolled-back one survived.

The messages are all buffered before the server's workers start, so the
batches do not depend on how fast the client sends.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2
import pytest

from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.engine import FailedDelivery, ReliableEngine

from .conftest import fast_policy
from .support import ACTION, item_text, payload, wait_for

pytestmark = pytest.mark.postgres

COUNT = 50
BATCH = 10
ITEMS = [f"m{i:02d}" for i in range(1, COUNT + 1)]


#: the application's table: a row a message, with the gtrid of the global transaction that wrote it
RECEIVED = "CREATE TABLE received (id serial PRIMARY KEY, item text NOT NULL, gtrid text NOT NULL)"


def xa_application(pg_dsn_factory: Callable[..., str], log: Path, closers: list[Callable[[], None]], *,
                   node: str) -> tuple[str, TransactionManager, XADataSource]:
    """The application's database (the table :data:`RECEIVED`), a transaction manager (its
    recovery log at ``log``) and an XA data source on that database; their closes go on ``closers``."""
    app_db = pg_dsn_factory("xaapp", RECEIVED)
    tm = TransactionManager(node=node, log=log)
    ds = XADataSource(app_db, tm)
    closers.extend([tm.close, ds.close])
    return app_db, tm, ds


def rows(dsn: str) -> list[tuple[str, str]]:
    """(item, gtrid) of every committed row, in the order they were written."""
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT item, gtrid FROM received ORDER BY id")
            return list(cur.fetchall())
    finally:
        conn.close()


@dataclass
class Ledger:
    """The application: writes each message to its own table, in the delivery's XA transaction.

    ``fail(item, attempt)`` decides whether the call raises after the row
    was written (so a rollback has something to undo).
    """

    tm: TransactionManager
    ds: XADataSource
    fail: Callable[[str, int], bool] = lambda item, attempt: False
    calls: Counter = field(default_factory=Counter)
    failed_gtrids: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, envelope: bytes, context: object) -> None:
        item = item_text(envelope)
        assert item is not None
        gtrid = self.tm.get_transaction().xid.gtrid.hex()
        with self._lock:
            self.calls[item] += 1
            attempt = self.calls[item]
        with self.ds.connection() as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO received (item, gtrid) VALUES (%s, %s)", (item, gtrid))
        if self.fail(item, attempt):
            with self._lock:
                self.failed_gtrids.add(gtrid)
            raise RuntimeError(f"the ledger refuses {item} (attempt {attempt})")


@dataclass
class World:
    app_db: str
    ledger: Ledger
    server: ReliableEngine
    failures: list[FailedDelivery]


@pytest.fixture
def world_for(pg_dsn_factory, tmp_path) -> Iterator[Callable[..., World]]:
    """``make(fail=..., **policy)``: COUNT messages buffered at a server whose workers then start."""
    made: list[tuple[ReliableEngine, ...]] = []
    closers: list[Callable[[], None]] = []

    def make(fail: Callable[[str, int], bool] = lambda item, attempt: False, **policy) -> World:
        app_db, tm, ds = xa_application(pg_dsn_factory, tmp_path / "tm.log", closers, node="xa-batch")
        ledger = Ledger(tm, ds, fail)
        failures: list[FailedDelivery] = []
        # batches bounded by their count only: the default time bound (0.05 s) cut them short on
        # a loaded machine, and these tests are about which messages share a transaction
        policy.setdefault("delivery_batch_seconds", 30.0)
        server = ReliableEngine("postgresql:" + pg_dsn_factory("xastore"),
                                fast_policy(delivery_batch=BATCH, **policy), tm=tm, application=ledger,
                                on_delivery_failure=failures.append, name="server")
        client = ReliableEngine("memory:", fast_policy(), name="client")
        made.append((client, server))
        server.serve()  # receives and buffers; its invoker starts below
        client.start()
        for item in ITEMS:
            client.send(server.endpoint_address, payload(item), action=ACTION)
        client.close(server.endpoint_address)
        assert wait_for(lambda: server.status().buffered == COUNT, timeout=60), server.status()
        server.start()
        return World(app_db, ledger, server, failures)

    yield make
    for engines in made:
        for engine in engines:
            engine.stop(timeout=5)
    for close in reversed(closers):
        close()


def delivered_all(world: World, expected: list[str]) -> bool:
    return [item for item, _ in rows(world.app_db)] == expected and world.server.status().buffered == 0


def test_a_batch_is_one_global_transaction_and_every_message_commits_once_in_order(world_for):
    world = world_for()

    assert wait_for(lambda: delivered_all(world, ITEMS), timeout=60), rows(world.app_db)
    committed = rows(world.app_db)
    transactions = Counter(gtrid for _, gtrid in committed)
    assert len(transactions) < COUNT, "each message had its own two-phase commit: no batching under XA"
    assert max(transactions.values()) <= BATCH
    assert all(calls == 1 for calls in world.ledger.calls.values())
    assert world.failures == []
    assert wait_for(lambda: world.server.status().delivered == COUNT, timeout=15)


def test_a_failure_mid_batch_rolls_the_batch_back_and_the_messages_before_it_still_commit(world_for):
    flaky = "m05"  # the fifth message of the first batch, which fails on its first attempt
    world = world_for(fail=lambda item, attempt: item == flaky and attempt == 1)

    assert wait_for(lambda: delivered_all(world, ITEMS), timeout=60), rows(world.app_db)
    committed = rows(world.app_db)
    by_item = dict(committed)
    # nothing of the transaction that failed was committed: not even the rows written before m05
    [failed] = world.ledger.failed_gtrids
    assert failed not in by_item.values()
    assert world.ledger.calls[flaky] == 2
    # m01..m04 ran twice (the first time rolled back with m05) and committed once, before m05
    assert [world.ledger.calls[item] for item in ITEMS[:4]] == [2, 2, 2, 2]
    # the message that broke the batch was retried in a transaction of its own
    assert [item for item, gtrid in committed if gtrid == by_item[flaky]] == [flaky]
    assert len(set(by_item.values())) < COUNT  # and the rest are still batched
    assert world.failures == []


@pytest.mark.parametrize("attempts", [1, 3])
def test_a_message_that_always_fails_is_given_up_after_its_attempts_and_the_rest_delivered(world_for, attempts):
    poison = "m07"
    world = world_for(fail=lambda item, attempt: item == poison, max_delivery_attempts=attempts,
                      max_retry_cycles=0, poison_handling="continue")
    expected = [item for item in ITEMS if item != poison]

    assert wait_for(lambda: delivered_all(world, expected), timeout=60), rows(world.app_db)
    assert wait_for(lambda: len(world.failures) == 1, timeout=15), world.failures
    [failure] = world.failures
    assert item_text(failure.payload) == poison and failure.message_number == 7
    assert isinstance(failure.error, RuntimeError)
    # exactly max_delivery_attempts calls, though its first failure was inside a batch
    assert world.ledger.calls[poison] == attempts
    # kept in the poison store, not dropped
    assert [(p.number, p.total_attempts) for p in world.server.poison_messages()] == [(7, attempts)]
    committed_gtrids = {gtrid for _, gtrid in rows(world.app_db)}
    assert not committed_gtrids & world.ledger.failed_gtrids
    assert len(committed_gtrids) < len(expected)
    status = world.server.status()
    assert status.delivery_failures == 1
    assert wait_for(lambda: world.server.status().delivered == COUNT - 1, timeout=15)
