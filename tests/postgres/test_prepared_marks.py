"""The PostgreSQL store's branch commits its commit mark by statements prepared on its session
(``txmanager.marks.PREPARE``, ``PostgresXAResource(prepare_marks=True)``).

Sent as text, the mark's INSERT (and the INSERT that also deletes the marks of finished
transactions, one text per count of them) was parsed, analysed and planned at every marked
commit: under 16 sequences in XA across two databases, pg_stat_statements counted 1.00 plans a
call on each side's store.  Each session now prepares them once, and a marked commit sends
``EXECUTE``; the forgotten marks it deletes are parameters of their own (``IN ($1, ..., $4)``,
not ``= ANY($1)``, whose custom plans PostgreSQL always found cheaper than its generic one: 0.99
plans a call).  Checked on what the resource sends and on PostgreSQL's plans of the session's
prepared statements; the marks still decide and are still deleted once their transactions are
over.
"""

from __future__ import annotations

from typing import Any

import psycopg2.extensions as ext
import pytest

from txmanager import RollbackError, TransactionManager, marks
from txmanager.postgres import XADataSource
from txmanager.postgres import resource as resource_module
from wsrm_plugin.store.postgres import PostgresStore

from ..store.test_managers import enqueue, new_rms
from .test_datasource import insert, run, values

pytestmark = pytest.mark.postgres

#: enough for PostgreSQL to compare a prepared statement's generic plan with its first five custom ones
TRANSACTIONS = 9


def _sent_marks(monkeypatch: Any) -> list[str]:
    """The statement of every marked commit from now on, as the resource chose it."""
    sent: list[str] = []
    choose = marks.mark_insert

    def recording(*args: Any, **kw: Any) -> tuple[str, tuple[Any, ...]]:
        statement, params = choose(*args, **kw)
        sent.append(statement)
        return statement, params
    monkeypatch.setattr(resource_module._marks, "mark_insert", recording)
    return sent


def _marking_sessions(monkeypatch: Any) -> list[Any]:
    """The session of every marked commit from now on."""
    sessions: list[Any] = []
    commit_marked = resource_module.PostgresXAResource.commit_marked

    def recording(resource: Any, *args: Any, **kw: Any) -> Any:
        sessions.append(resource.connection)
        return commit_marked(resource, *args, **kw)
    monkeypatch.setattr(resource_module.PostgresXAResource, "commit_marked", recording)
    return sessions


def _plans(conn: Any, name: str) -> tuple[int, int]:
    """PostgreSQL's generic and custom plans of statement ``name`` prepared on session ``conn``."""
    with ext.cursor(conn) as cur:
        cur.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = %s", (name,))
        (row,) = cur.fetchall()
    conn.rollback()
    return row


def _transfers(store: PostgresStore, dbs: list[str], tmp_path: Any) -> None:
    """``TRANSACTIONS`` global transactions, each a row in database a and an enqueue in the store
    (database b): b's branch commits last, in one phase, with the mark."""
    tm = TransactionManager(node="prepared-marks", log=tmp_path / "tm.log")
    a = XADataSource(dbs[0], tm, resource_name="a")
    try:
        with store.begin() as tx:
            new_rms(tx)
        for i in range(TRANSACTIONS):
            with tm.transaction():
                with a.connection() as conn:
                    insert(conn, f"row-{i}")
                with store.begin(xa=tm) as tx:
                    enqueue(tx)
    finally:
        a.close()
        tm.close()


@pytest.mark.parametrize("prepare", [True, False], ids=["prepared", "text"])
def test_a_store_branch_commits_its_mark_by_the_statements_prepared_on_its_session(
        dbs: list[str], tmp_path: Any, monkeypatch: Any, prepare: bool) -> None:
    store = PostgresStore(dbs[1], prepare_statements=prepare)
    try:
        sent = _sent_marks(monkeypatch)
        sessions = _marking_sessions(monkeypatch)
        _transfers(store, dbs, tmp_path)
        assert len(sent) == TRANSACTIONS, sent
        if prepare:
            # the first mark alone; each later one deletes those whose transactions are over
            assert sent[0].startswith(f"EXECUTE {marks.PREPARED_INSERT} "), sent
            assert any(s.startswith(f"EXECUTE {marks.PREPARED_SWAP} ") for s in sent[1:]), sent
            assert all(s.startswith("EXECUTE ") for s in sent), sent
            # PostgreSQL keeps the swap's generic plan once it compared it with five custom ones:
            # no plan a call (the session that made most marked commits, more than five)
            busiest = max(set(sessions), key=sessions.count)
            assert sessions.count(busiest) > 6, sessions
            generic, custom = _plans(busiest, marks.PREPARED_SWAP)
            assert custom <= 5 and generic >= sessions.count(busiest) - 1 - 5, (generic, custom)
        else:  # behind a pooler in transaction mode: nothing prepared, the marks go as text
            assert all(s.startswith(("INSERT", "WITH")) for s in sent), sent
        # every transaction committed on both sides, decided by its mark
        assert values(dbs[0]) == [f"row-{i}" for i in range(TRANSACTIONS)]
        with store.begin() as tx:
            assert tx.rms_messages.count_unacked("k1") == TRANSACTIONS
        # the marks of the transactions over were deleted by the later marks' statements
        assert run(dbs[1], f"SELECT count(*) FROM {marks.TABLE}")[0][0] < TRANSACTIONS
    finally:
        store.close()


def test_a_backlog_of_forgotten_marks_or_a_fenced_mark_goes_as_text() -> None:
    row = ("key", "node", "record")
    few, params = marks.mark_insert(["a", "b"], row, prepared=True)
    assert few.startswith(f"EXECUTE {marks.PREPARED_SWAP} ") and params == ("a", "b", "b", "b", *row)
    many = [str(i) for i in range(marks.SWAP_KEYS + 1)]
    assert marks.mark_insert(many, row, prepared=True) == (marks.insert_statement(many), (many, *row))
    fenced = ("key", "node", 7, "record")
    assert marks.mark_insert(["a"], fenced, fenced=True, prepared=True) == (
        marks.insert_statement(["a"], fenced=True), (["a"], *fenced))
    assert marks.mark_insert([], row) == (marks.insert_statement([]), row)


def test_a_session_that_lost_the_marks_statements_fails_one_transaction_then_sends_them_as_text(
        dbs: list[str], tmp_path: Any, monkeypatch: Any) -> None:
    """A pooler's ``DISCARD ALL`` (here a ``DEALLOCATE`` of the marks' statements): the next
    marked commit on that session rolls its transaction back, as a lost statement does in the
    store; the session's later marks go as text and commit."""
    store = PostgresStore(dbs[1])
    tm = TransactionManager(node="lost-marks", log=tmp_path / "tm.log")
    a = XADataSource(dbs[0], tm, resource_name="a")
    sent = _sent_marks(monkeypatch)
    sessions = _marking_sessions(monkeypatch)

    def transfer(i: int) -> None:
        with tm.transaction():
            with a.connection() as conn:
                insert(conn, f"row-{i}")
            with store.begin(xa=tm) as tx:
                enqueue(tx)
    try:
        with store.begin() as tx:
            new_rms(tx)
        transfer(0)
        lost = set(sessions)
        for conn in lost:
            with ext.cursor(conn) as cur:
                cur.execute(f"DEALLOCATE {marks.PREPARED_INSERT}; DEALLOCATE {marks.PREPARED_SWAP}")
            conn.commit()
        outcomes = []
        for i in range(1, len(lost) + 3):
            try:
                transfer(i)
                outcomes.append(i)
            except RollbackError:
                outcomes.append(None)
        # at most one transaction a session that lost them, and every later one committed
        assert 1 <= outcomes.count(None) <= len(lost) and outcomes[-2:] == [len(lost) + 1, len(lost) + 2], outcomes
        assert not sent[-1].startswith("EXECUTE"), sent
        assert values(dbs[0]) == ["row-0", *(f"row-{i}" for i in outcomes if i is not None)]
    finally:
        a.close()
        tm.close()
        store.close()
