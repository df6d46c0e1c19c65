"""The lean one-phase transaction (txmanager.transaction._OnePhase) and what promotes it.

A transaction the manager begins runs as a lean object until something needs the general
path; then it becomes a :class:`Transaction` (its class is set) with its state completed.
test_one_phase_promotion.py covers the ways off the one-phase path that existed before the
lean object (a second resource, suspend and resume, synchronizations with work, failed
commits, another thread); these are the points the lean object added or changed: what reads
it without promoting it (status, rollback-only from another thread, the xid), and what
promotes it (a synchronization of any kind, a rollback, a timeout, a crash-test hook, the
branches asked for, a prepare).  Each must end exactly as the general path ends it.
Real PostgreSQL throughout.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from txmanager import RollbackError, Status, TransactionError, TransactionTimeoutError
from txmanager.postgres import XADataSource
from txmanager.transaction import AfterCompletion, Transaction, _OnePhase

from tests.postgres.support import insert, prepared_gids, run, values

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("one_phase_path")]


@pytest.fixture
def db(pg_dsn_factory):
    dsn = pg_dsn_factory("lean")
    run(dsn, "CREATE TABLE t (id serial PRIMARY KEY, v text NOT NULL)")
    return dsn


@pytest.fixture
def ds(db, tm):
    source = XADataSource(db, tm, resource_name="lean")
    with tm.transaction():  # the pool has a session: the transactions below take it
        with source.connection() as conn:
            insert(conn, "warm")
    yield source
    source.close()


class Note(AfterCompletion):
    def __init__(self, events: list, ds: XADataSource) -> None:
        self.events, self.ds = events, ds

    def after_completion(self, status: Status) -> None:
        self.events.append((status, len(self.ds._idle)))


def test_status_the_xid_and_rollback_only_from_another_thread_leave_it_lean(db, tm, ds):
    """What any thread may ask at any time reads the lean object as it is; the rollback-only
    mark set from another thread is seen by the commit, which rolls back (promoted)."""
    fsyncs = tm.log.fsyncs
    with pytest.raises(RollbackError):
        with tm.transaction() as tx:
            with ds.connection() as conn:
                insert(conn, "marked")
            assert type(tx) is _OnePhase and tx.status == Status.ACTIVE and not tx.finished
            gtrid = tx.xid.gtrid
            assert tm._in_flight.get(gtrid) is tx, "named: running, for recovery to leave alone"
            seen: dict[str, object] = {}

            def other() -> None:
                seen["status"] = tx.status
                tx.set_rollback_only()
                seen["after"] = tx.status

            worker = threading.Thread(target=other)
            worker.start()
            worker.join(60)
            assert seen == {"status": Status.ACTIVE, "after": Status.MARKED_ROLLBACK}
            assert type(tx) is _OnePhase, "reading and marking do not promote"
    assert type(tx) is Transaction and tx.status == Status.ROLLEDBACK
    assert values(db) == ["warm"] and len(ds._idle) == 1
    assert gtrid not in tm._in_flight and tm.log.fsyncs == fsyncs


def test_the_xid_asked_for_leaves_the_running_set_at_the_one_phase_commit(db, tm, ds):
    fsyncs = tm.log.fsyncs
    with tm.transaction() as tx:
        with ds.connection() as conn:
            insert(conn, "named")
        gtrid = tx.xid.gtrid
    assert type(tx) is _OnePhase and tx.status == Status.COMMITTED
    assert gtrid not in tm._in_flight and tm.log.fsyncs == fsyncs
    assert values(db) == ["warm", "named"] and len(ds._idle) == 1


@pytest.mark.parametrize("when", ["before the connection", "after it"])
def test_a_synchronization_promotes_and_the_commit_stays_one_phase(db, tm, ds, when):
    """Even one with nothing to do before completion: its after_completion is told the
    outcome after the pool's (or before, when registered first), and nothing is logged."""
    events: list = []
    fsyncs = tm.log.fsyncs
    with tm.transaction() as tx:
        if when == "before the connection":
            tx.register_synchronization(Note(events, ds))
            assert type(tx) is Transaction, "promoted by the synchronization"
        with ds.connection() as conn:
            insert(conn, "synced")
        if when == "after it":
            tx.register_synchronization(Note(events, ds))
            assert type(tx) is Transaction and tx._sole is not None, "promoted, still one branch"
    assert events == [(Status.COMMITTED, 0 if when == "before the connection" else 1)]
    assert values(db) == ["warm", "synced"] and len(ds._idle) == 1 and tm.log.fsyncs == fsyncs


@pytest.mark.parametrize("how", ["tm.rollback()", "an exception in the block"])
def test_a_rollback_promotes_and_the_session_returns(db, tm, ds, how):
    try:
        with tm.transaction() as tx:
            with ds.connection() as conn:
                insert(conn, "undone")
            if how == "tm.rollback()":
                tm.rollback()
            else:
                raise KeyError("the body failed")
    except KeyError:
        assert how == "an exception in the block"
    assert type(tx) is Transaction and tx.status == Status.ROLLEDBACK
    assert values(db) == ["warm"] and len(ds._idle) == 1
    with tm.transaction():
        with ds.connection() as conn:
            insert(conn, "next")
    assert values(db) == ["warm", "next"]


def _wait_expired(tx) -> None:
    deadline = time.monotonic() + 60
    while not tx.is_expired():
        assert time.monotonic() < deadline, "the transaction never expired"
        time.sleep(0.01)


def test_an_expired_transaction_refuses_the_session_and_rolls_back(db, tm, ds):
    with pytest.raises(TransactionTimeoutError):
        with tm.transaction(timeout=0.05) as tx:
            assert type(tx) is _OnePhase
            _wait_expired(tx)
            assert tx.status == Status.MARKED_ROLLBACK and type(tx) is _OnePhase
            with ds.connection():
                pass
    assert len(ds._idle) == 1 and values(db) == ["warm"]
    with pytest.raises(TransactionTimeoutError):
        with tm.transaction(timeout=0.05) as tx:
            with ds.connection() as conn:
                insert(conn, "too late")
            _wait_expired(tx)
    assert type(tx) is Transaction and tx.status == Status.ROLLEDBACK
    assert values(db) == ["warm"] and len(ds._idle) == 1


def test_a_rollback_only_transaction_refuses_the_session(db, tm, ds):
    with pytest.raises(RollbackError):
        with tm.transaction() as tx:
            tx.set_rollback_only()
            with ds.connection():
                pass
    assert type(tx) is Transaction and tx.status == Status.ROLLEDBACK
    assert len(ds._idle) == 1 and values(db) == ["warm"]


def test_a_first_session_that_cannot_start_raises_and_is_closed(tm):
    """The data source starts its first session itself (``_OnePhase._enlist_first`` inline): a
    start refused (the database cannot be reached) raises what the transaction says it means,
    promoted, and the session is closed rather than pooled."""
    dead = XADataSource("host=127.0.0.1 port=1 dbname=none connect_timeout=5", tm, resource_name="dead",
                        register_for_recovery=False)
    try:
        with pytest.raises(TransactionError, match="refused to start"):
            with tm.transaction() as tx:
                with dead.connection():
                    pass
        assert type(tx) is Transaction and tx.status == Status.ROLLEDBACK
        assert dead._idle == []
    finally:
        dead.close()


def test_a_crash_test_hook_takes_the_general_path(db, tm, ds):
    points: list[str] = []
    tm._checkpoint = lambda point, index: points.append(point)
    with tm.transaction() as tx:
        with ds.connection() as conn:
            insert(conn, "hooked")
    assert points == ["before_commit_one_phase"] and type(tx) is Transaction
    assert values(db) == ["warm", "hooked"] and len(ds._idle) == 1


def test_the_branches_asked_for_promote_and_name_the_one_branch(db, tm, ds):
    with tm.transaction() as tx:
        with ds.connection() as conn:
            insert(conn, "listed")
        ((xid, resource),) = tx.branches
        assert type(tx) is Transaction and xid == tx.xid.branch("0")
        assert resource._pool_return._ds is ds, "the pool's session"
    assert tx.status == Status.COMMITTED and values(db) == ["warm", "listed"]
    assert len(ds._idle) == 1 and prepared_gids(db) == []


def test_a_prepare_and_detach_promotes_and_the_manager_commits_it(db, tm, ds):
    tx = tm.begin()
    assert type(tx) is _OnePhase
    with ds.connection() as conn:
        insert(conn, "prepared")
    branches = tx.prepare_and_detach()
    assert type(tx) is Transaction and tx.status == Status.PREPARED
    assert prepared_gids(db) == [branches[0].xid.to_pg_gid()] and values(db) == ["warm"]
    assert tm.get_transaction() is None, "finished: unbound"
    assert tm.commit_prepared(tx.xid, branches) == []
    assert values(db) == ["warm", "prepared"] and prepared_gids(db) == []


def test_a_session_on_psycopg2s_tpc_begin_names_its_branch_and_stays_one_phase(db, tm):
    """A session with an isolation level of its own runs its branches on psycopg2's
    ``tpc_begin``, which takes the xid at the start: the session names the branch from inside
    the lean transaction's enlistment, which must neither promote it under that call nor lose
    its synchronization (a promotion there once left the pool's return where the general
    path does not look).  Several transactions: each commits in one phase, nothing logged,
    the session back in its pool."""
    import psycopg2.extensions as ext

    class Serializable(XADataSource):
        def _connect(self):
            conn = super()._connect()
            conn.isolation_level = ext.ISOLATION_LEVEL_SERIALIZABLE
            return conn

    ds = Serializable(db, tm, resource_name="tpc")
    fsyncs = tm.log.fsyncs
    try:
        for n in range(3):
            with tm.transaction() as tx:
                with ds.connection() as conn:
                    assert conn._tpc_only, "psycopg2's tpc_begin runs this session's branches"
                    insert(conn, f"tpc {n}")
                assert type(tx) is _OnePhase, "named at the start, still lean"
            assert tx.status == Status.COMMITTED and len(ds._idle) == 1
        assert values(db) == ["tpc 0", "tpc 1", "tpc 2"] and prepared_gids(db) == []
        assert tm.log.fsyncs == fsyncs, "one phase: nothing logged"
    finally:
        ds.close()


@pytest.mark.parametrize("fails", [False, True])
def test_a_sole_synchronization_runs_before_the_one_phase_commit_without_promoting(db, tm, ds, fails):
    """A pool's first session with a SoleSynchronization (the WS-RM store's branch): the lean
    commit runs its before_completion (which may still write in the branch), then the fused
    COMMIT, then its after_completion, the object never promoted; one that raises rolls the
    transaction back as the general path's before-completion pass does."""
    from txmanager.transaction import SoleSynchronization

    events: list[object] = []
    resource = ds._acquire()

    class Flush(SoleSynchronization):
        def before_completion(self) -> None:
            events.append(type(tm.get_transaction()).__name__)
            if fails:
                raise RuntimeError("the store could not flush")
            insert(resource._session, "flushed")

        def after_completion(self, status: Status) -> None:
            events.append(status)
            ds._release(resource)

    tx = _commit_first(tm, resource, Flush(), fails)
    if fails:
        assert type(tx) is Transaction and events == ["_OnePhase", Status.ROLLEDBACK]
        assert values(db) == ["warm"]
    else:
        assert type(tx) is _OnePhase and events == ["_OnePhase", Status.COMMITTED]
        assert sorted(values(db)) == ["flushed", "warm", "work"]


@pytest.mark.parametrize("fails", [False, True])
def test_a_sole_synchronization_that_promotes_its_transaction_before_completion_still_ends_it(db, tm, ds, fails):
    """A SoleSynchronization whose before_completion promotes its transaction (here: registers
    another synchronization) leaves the lean commit on a :class:`Transaction`, where it goes on
    as the general path: committed (its before_completion run again there), or rolled back when
    it raised; never an AttributeError of the lean class's own method on the promoted object."""
    from txmanager.transaction import SoleSynchronization

    events: list[object] = []
    resource = ds._acquire()

    class Late:
        def before_completion(self) -> None:
            pass

        def after_completion(self, status: Status) -> None:
            events.append(("late", status))

    class Flush(SoleSynchronization):
        def before_completion(self) -> None:
            gtx = tm.get_transaction()
            if type(gtx) is _OnePhase:
                gtx.register_synchronization(Late())  # promotes
                if fails:
                    raise RuntimeError("the store could not flush")

        def after_completion(self, status: Status) -> None:
            events.append(status)
            ds._release(resource)

    tx = _commit_first(tm, resource, Flush(), fails)
    assert type(tx) is Transaction
    status = Status.ROLLEDBACK if fails else Status.COMMITTED
    assert sorted(map(str, events)) == sorted(map(str, [status, ("late", status)]))
    assert sorted(values(db)) == (["warm"] if fails else ["warm", "work"])


def _commit_first(tm, resource, sync, fails: bool):
    """A transaction whose first resource (``resource``, with ``sync``) writes "work", committed
    (raising RollbackError when ``fails``): the transaction."""
    with pytest.raises(RollbackError) if fails else contextlib.nullcontext():
        with tm.transaction() as tx:
            assert tx._enlist_first(resource, sync)
            insert(resource._session, "work")
    return tx
