"""An enqueue riding on its branch's COMMIT (PostgreSQL, XA: ``enqueue_claiming_at_commit``), or a
caller's enqueue and claim in the engine's own transaction (``enqueue_claiming``), reads as much
behind a backlog as behind a few messages (issue 33).  Counted in buffers, from the plan
of the statement as the store sends it (``EXPLAIN (ANALYZE, BUFFERS)``, rolled back), with the
statistics a busy queue has: taken when the table held a few rows.

Its test of whether the caller may claim the message looked at the message before it with a
``NOT EXISTS (... AND NOT acked)``.  With such statistics PostgreSQL planned that as a scan of the
whole table (or of ``rms_message_unacked``, every unacknowledged message of the sequence), and
it ran for every message, the one-way ones that no caller claims included.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg2
import pytest

from wsrm_plugin.store.postgres import PostgresStore
from wsrm_plugin.store.sql import SqlTransaction
from wsrm_plugin.store.sql import placeholders

from .test_managers import started

pytestmark = pytest.mark.postgres

TARGET = "http://server/svc"  # new_rms's
ENVELOPE = b"<x>%s</x>" % (b"y" * 900)  # a one-way call's envelope, about


def _queue(store: PostgresStore, n: int) -> None:
    with store.begin() as tx:
        first = tx.rms.get("k1").next_number
        for number in range(first, first + n):
            tx.rms_messages.enqueue("k1", ENVELOPE, action="urn:op", soap_version="1.1", message_id=f"urn:{number}")


def _statement(store: PostgresStore, monkeypatch: pytest.MonkeyPatch, target: str | None) -> tuple[str, Any]:
    """The enqueue's statement and its parameters, as it would ride on the COMMIT."""
    seen: list[tuple[str, Any]] = []

    def caught(tx: Any, sql: str, params: Any, *args: Any) -> bool:
        seen.append((sql, params))
        return False  # not sent: nothing rides
    monkeypatch.setattr(SqlTransaction, "write_at_commit", caught)
    with store.begin() as tx:
        tx.rms_messages.enqueue_claiming_at_commit(
            "k1", ENVELOPE, action="urn:op", soap_version="1.1", message_id="urn:m", target=target,
            next_send_at=50.0, enqueued=lambda *a: None, otherwise=lambda: None, now=10.0)
    monkeypatch.undo()
    [found] = seen
    return found


def _buffers(dsn: str, sql: str, params: Any) -> tuple[int, str]:
    """The buffers the statement reads (its plan's top node) and its plan, its writes rolled back."""
    settings = re.match(r"(SET LOCAL [^;]*; )*", sql).group(0)
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            if settings:
                cur.execute(settings)
            text, values = placeholders.expand(sql[len(settings):], params)  # (``?N``: a value named again)
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) " + text, values)
            plan = "\n".join(r[0] for r in cur.fetchall())
    finally:
        conn.rollback()
        conn.close()
    return int(re.search(r"shared hit=(\d+)", plan).group(1)), plan


class _Caught(Exception):
    pass


def _claiming_statement(store: PostgresStore, monkeypatch: pytest.MonkeyPatch, target: str | None) -> tuple[str, Any]:
    """A caller's enqueue and claim in the engine's own transaction (``enqueue_claiming``): its
    statement and parameters, not sent."""
    seen: list[tuple[str, Any]] = []

    def caught(tx: Any, sql: str, params: Any = ()) -> Any:
        seen.append((sql, params))
        raise _Caught
    monkeypatch.setattr(SqlTransaction, "write_all", caught)
    with pytest.raises(_Caught), store.begin() as tx:
        tx.rms_messages.enqueue_claiming("k1", ENVELOPE, action="urn:op", soap_version="1.1", message_id="urn:m",
                                         target=TARGET, next_send_at=50.0, now=10.0)
    monkeypatch.undo()
    [found] = seen
    return found


@pytest.mark.parametrize("target,statement", [(None, _statement), (TARGET, _statement), (TARGET, _claiming_statement)],
                         ids=["one-way", "caller-claims", "caller-claims-outside-xa"])
def test_an_enqueue_riding_on_the_commit_reads_as_much_at_any_backlog(fresh_db, monkeypatch, target,
                                                                      statement) -> None:
    store = PostgresStore(fresh_db, lock_timeout=10.0)
    try:
        started(store, messages=0)
        _queue(store, 20)
        conn = psycopg2.connect(fresh_db)
        conn.autocommit = True
        with conn.cursor() as cur:  # a busy queue's statistics: taken when it held a few rows
            cur.execute("VACUUM ANALYZE rms_message")
        conn.close()
        costs = []
        for more in (0, 3000):
            _queue(store, more)
            cost, plan = _buffers(fresh_db, *statement(store, monkeypatch, target))
            costs.append(cost)
            assert "rms_message_unacked" not in plan and not re.search(r"Seq Scan on rms_message\b", plan), plan
        assert costs[1] <= costs[0] + 6, f"the enqueue read {costs[0]} buffers behind 20 queued, {costs[1]} behind 3020"
    finally:
        store.close()
