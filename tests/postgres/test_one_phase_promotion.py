"""The one-phase path of XADataSource's first session, and every way out of it, end to end.

A transaction whose only resource is one pooled session commits it in one phase with nothing
of the general path made (see test_datasource.py for the counts).  Whatever that path cannot
take -- a second database, the same database's connection asked for again, a suspend and
resume, a synchronization registered mid-transaction (with work before completion, or one
that fails), a COMMIT that fails, a session lost under the transaction -- must end exactly as
the general path ends it: the data committed or not, the synchronizations called in order
with the outcome, the recovery log untouched unless the outcome is in doubt, and the session
back in its pool (or closed, when it cannot run another branch).  Real PostgreSQL throughout.
"""

from __future__ import annotations

import psycopg2
import pytest

from txmanager import HeuristicHazardError, RollbackError, Status
from txmanager.postgres import XADataSource
from txmanager.transaction import AfterCompletion
from txmanager.xa import XA_RBINTEGRITY

from tests.postgres.support import insert, run, values

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("one_phase_path")]


@pytest.fixture
def sources(sources, tm):
    """The shared two data sources, each pool given a session: the transactions below take it."""
    for ds in sources:
        with tm.transaction():
            with ds.connection() as conn:
                insert(conn, "warm")
    return sources


class Note(AfterCompletion):
    """Records the outcome it is told, and how many sessions its pool held at that moment."""

    def __init__(self, events: list, name: str, ds: XADataSource) -> None:
        self.events, self.name, self.ds = events, name, ds

    def after_completion(self, status: Status) -> None:
        self.events.append((self.name, status, len(self.ds._idle)))


class Sync:
    """A full Synchronization (no AfterCompletion: its before_completion is called)."""

    def __init__(self, events: list, name: str, ds: XADataSource) -> None:
        self.events, self.name, self.ds = events, name, ds

    def before_completion(self) -> None:
        pass

    def after_completion(self, status: Status) -> None:
        self.events.append((self.name, status, len(self.ds._idle)))


def test_the_same_database_asked_again_and_then_a_second_database(dbs, tm, sources):
    """The first session is the transaction's sole resource; asked for again in the same
    transaction it is the same connection (one branch), and a second database then turns the
    transaction two-phase with that session as its first branch: both commit, both back."""
    a, b = sources
    fsyncs = tm.log.fsyncs
    with tm.transaction() as tx:
        with a.connection() as first:
            insert(first, "a1")
        with a.connection() as again:
            assert again is first, "one thread, one transaction, one session per database"
            insert(again, "a2")
        assert tx._sole is not None, "still on the one-phase path"
        with b.connection() as other:
            insert(other, "b1")
        assert tx._sole is None and len(tx.branches) == 2, "promoted by the second database"
        with a.connection() as after:
            assert after is first, "the promoted first branch is still this thread's session"
            insert(after, "a3")
    assert tx.status == Status.COMMITTED
    assert values(dbs[0]) == ["warm", "a1", "a2", "a3"] and values(dbs[1]) == ["warm", "b1"]
    assert tm.log.fsyncs > fsyncs, "two databases: the decision was logged"
    assert len(a._idle) == 1 and len(b._idle) == 1 and not a._enlisted and not b._enlisted


def test_suspend_and_resume_promote_and_the_work_stays_one_branch(dbs, tm, sources):
    a, _ = sources
    fsyncs = tm.log.fsyncs
    with tm.transaction() as tx:
        with a.connection() as conn:
            insert(conn, "before suspend")
            pid = conn.get_backend_pid()
        assert tm.suspend() is tx
        assert tx._sole is None, "a suspend needs the branch as an object: promoted"
        with a.connection() as local:  # no transaction now: a local connection, another session
            assert local.get_backend_pid() != pid
            assert [v for v in values(dbs[0])] == ["warm"], "the suspended work is not visible"
        tm.resume(tx)
        with a.connection() as conn:
            assert conn.get_backend_pid() == pid, "resumed: the same session, the same branch"
            insert(conn, "after resume")
    assert tx.status == Status.COMMITTED
    assert values(dbs[0]) == ["warm", "before suspend", "after resume"]
    assert tm.log.fsyncs == fsyncs, "one branch: committed in one phase, nothing logged"
    assert any(r._session.get_backend_pid() == pid for r in a._idle), "the session is back"


def test_a_synchronization_registered_mid_transaction_runs_before_and_after(dbs, tm, sources):
    """One with work before completion takes the transaction off the one-phase shortcut: it
    runs first (and its work, in the same database, is in the same commit), then every
    after_completion in order of registration, the pool's first."""
    a, _ = sources
    events: list = []

    class Flush(Sync):
        def before_completion(self) -> None:
            events.append(("before", len(a._idle)))
            with a.connection() as conn:
                insert(conn, "flushed")

    with tm.transaction() as tx:
        with a.connection() as conn:
            insert(conn, "x")
        tx.register_synchronization(Flush(events, "flush", a))
        tx.register_synchronization(Note(events, "note", a))
    assert events == [("before", 0), ("flush", Status.COMMITTED, 1), ("note", Status.COMMITTED, 1)]
    assert values(dbs[0]) == ["warm", "x", "flushed"] and len(a._idle) == 1


def test_a_failing_before_completion_rolls_back_and_the_session_returns(dbs, tm, sources):
    a, _ = sources
    events: list = []

    class Refuse(Sync):
        def before_completion(self) -> None:
            raise ValueError("not today")

    with pytest.raises(RollbackError) as e:
        with tm.transaction() as tx:
            with a.connection() as conn:
                insert(conn, "refused")
            tx.register_synchronization(Refuse(events, "refuse", a))
    assert isinstance(e.value.cause, ValueError)
    assert events == [("refuse", Status.ROLLEDBACK, 1)], "the pool took the session first"
    assert values(dbs[0]) == ["warm"]
    with tm.transaction():
        with a.connection() as conn:
            insert(conn, "next")
    assert values(dbs[0]) == ["warm", "next"] and len(a._idle) == 1


def test_a_commit_that_fails_rolls_back_with_its_reason_and_the_session_returns(dbs, tm, sources):
    """A deferred constraint fails at the one-phase COMMIT itself: a rollback with the
    integrity code, the after_completion calls told so, nothing logged, the session reusable."""
    a, _ = sources
    run(dbs[0], "CREATE TABLE parent (id int PRIMARY KEY)")
    run(dbs[0], "CREATE TABLE child (parent int REFERENCES parent DEFERRABLE INITIALLY DEFERRED)")
    events: list = []
    fsyncs = tm.log.fsyncs
    with pytest.raises(RollbackError) as e:
        with tm.transaction() as tx:
            with a.connection() as conn:
                insert(conn, "doomed")
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO child VALUES (42)")  # checked at COMMIT
            tx.register_synchronization(Note(events, "note", a))
    assert getattr(e.value.cause, "code", None) == XA_RBINTEGRITY, e.value.cause
    assert events == [("note", Status.ROLLEDBACK, 1)]
    assert tx.status == Status.ROLLEDBACK and tm.log.fsyncs == fsyncs
    assert values(dbs[0]) == ["warm"]
    with tm.transaction():
        with a.connection() as conn:
            insert(conn, "next")
    assert values(dbs[0]) == ["warm", "next"] and len(a._idle) == 1


def test_a_failed_statement_then_commit_rolls_back_and_the_session_returns(dbs, tm, sources):
    a, _ = sources
    with pytest.raises(RollbackError):
        with tm.transaction():
            with a.connection() as conn:
                insert(conn, "lost with the failure")
                with pytest.raises(psycopg2.Error), conn.cursor() as cur:
                    cur.execute("SELECT 1/0")
    assert values(dbs[0]) == ["warm"] and len(a._idle) == 1
    with tm.transaction():
        with a.connection() as conn:
            insert(conn, "next")
    assert values(dbs[0]) == ["warm", "next"]


def test_a_session_lost_under_the_transaction_is_a_hazard_and_not_pooled(dbs, tm, sources):
    """The server ends the session after the statement, before the COMMIT: the outcome is
    not known to the client (the hazard is recorded), the session is closed rather than
    pooled, and the next transaction gets a fresh one."""
    a, _ = sources
    events: list = []
    with pytest.raises(HeuristicHazardError):
        with tm.transaction() as tx:
            with a.connection() as conn:
                insert(conn, "unknown")
                pid = conn.get_backend_pid()
            tx.register_synchronization(Note(events, "note", a))
            run(dbs[0], "SELECT pg_terminate_backend(%s)", (pid,))
    assert conn.closed and events == [("note", Status.UNKNOWN, 0)] and a._idle == []
    with tm.transaction():
        with a.connection() as conn:
            assert conn.get_backend_pid() != pid
            insert(conn, "next")
    assert values(dbs[0]) == ["warm", "next"], "the terminated session's work was rolled back"


def test_another_thread_of_the_transaction_gets_its_own_session_where_none_is_shared(dbs, tm):
    """The first session belongs to the thread it was handed to: another thread working in
    the same transaction (resumed there) with a data source that shares no sessions gets a
    session of its own, and the first thread still finds its own afterwards."""
    import threading

    ds = XADataSource(dbs[0], tm, resource_name="own", share_sessions=False)
    seen: dict[str, object] = {}
    try:
        with tm.transaction() as tx:
            with ds.connection() as mine:
                insert(mine, "first thread")

            def other() -> None:
                tm.resume(tx)
                try:
                    with ds.connection() as theirs:
                        seen["same"] = theirs is mine
                        insert(theirs, "second thread")
                except BaseException as e:  # noqa: BLE001 -- reported below
                    seen["error"] = e
                finally:
                    tm.suspend()

            worker = threading.Thread(target=other)
            worker.start()
            worker.join(60)
            assert seen == {"same": False}
            with ds.connection() as again:
                assert again is mine, "this thread's first session, found again"
                insert(again, "first thread again")
        assert sorted(values(dbs[0])) == ["first thread", "first thread again", "second thread"]
        assert len(ds._idle) == 2 and not ds._enlisted
    finally:
        ds.close()
