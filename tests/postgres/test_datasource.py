"""XADataSource under the real TransactionManager, against real databases."""

from __future__ import annotations

import threading

import psycopg2
import pytest

from txmanager import RollbackError, TransactionManager
from txmanager.postgres import PostgresXAResource, XADataSource, accelerated

from tests.postgres.support import insert, prepared_gids, profiled, run, values

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("one_phase_path")]


class Crash(BaseException):
    """Raised by a checkpoint hook: the commit stops dead there, as in a kill -9."""


def test_a_transaction_over_two_databases_commits_both(dbs, tm, sources):
    a, b = sources
    with tm.transaction() as tx:
        with a.connection() as ca:
            insert(ca, "debit")
        with b.connection() as cb:
            insert(cb, "credit")
        assert len(tx.branches) == 2
    assert values(dbs[0]) == ["debit"] and values(dbs[1]) == ["credit"]
    assert prepared_gids(dbs[0]) == prepared_gids(dbs[1]) == []


def test_an_exception_rolls_back_both_databases(dbs, tm, sources):
    a, b = sources
    with pytest.raises(ZeroDivisionError):
        with tm.transaction():
            with a.connection() as ca:
                insert(ca, "debit")
            with b.connection() as cb:
                insert(cb, "credit")
            1 / 0
    assert values(dbs[0]) == values(dbs[1]) == []


def test_one_thread_one_transaction_one_connection_one_branch(dbs, tm, sources):
    a, _ = sources
    with tm.transaction() as tx:
        with a.connection() as first:
            insert(first, "one")
        with a.connection() as second:
            insert(second, "two")
        assert first is second
        assert len(tx.branches) == 1, "both blocks are the same branch (committed in one phase)"
    assert values(dbs[0]) == ["one", "two"]


def test_the_connection_returns_to_the_pool_when_the_transaction_completes(dbs, tm, sources):
    a, _ = sources
    with tm.transaction():
        with a.connection() as conn:
            insert(conn, "x")
            pid = conn.get_backend_pid()
        assert a._idle == [], "the branch is still open after the with block"
    assert len(a._idle) == 1
    with tm.transaction():
        with a.connection() as again:
            assert again.get_backend_pid() == pid, "the pooled session is reused"
            insert(again, "y")
    assert values(dbs[0]) == ["x", "y"]


def test_a_failed_statement_rolls_the_transaction_back_and_the_session_is_reusable(dbs, tm, sources):
    a, b = sources
    with pytest.raises(RollbackError):
        with tm.transaction():
            with b.connection() as cb:
                insert(cb, "credit")
            with a.connection() as ca:
                insert(ca, "before the error")
                try:
                    with ca.cursor() as cur:
                        cur.execute("INSERT INTO t (v) VALUES (NULL)")
                except psycopg2.errors.NotNullViolation:
                    pass  # swallowed by the application: the branch must still roll back
    assert values(dbs[0]) == values(dbs[1]) == []
    with tm.transaction():
        with a.connection() as ca:
            insert(ca, "after")
    assert values(dbs[0]) == ["after"]


def test_outside_a_transaction_the_connection_is_a_local_one(dbs, sources):
    a, _ = sources
    with a.connection() as conn:
        insert(conn, "committed at the end of the block")
    with pytest.raises(RuntimeError):
        with a.connection() as conn:
            insert(conn, "rolled back")
            raise RuntimeError("boom")
    assert values(dbs[0]) == ["committed at the end of the block"]


def test_threads_get_their_own_connections(dbs, tm, sources):
    a, _ = sources
    pids: list[int] = []
    errors: list[BaseException] = []
    inside = threading.Barrier(2, timeout=60)

    def work(n: int) -> None:
        try:
            with tm.transaction():
                with a.connection() as conn:
                    insert(conn, f"thread {n}")
                    pids.append(conn.get_backend_pid())
                    inside.wait()  # both transactions open at once
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(set(pids)) == 2
    assert sorted(values(dbs[0])) == ["thread 0", "thread 1"]


def test_sixteen_transactions_at_once_keep_their_sessions_for_the_next_sixteen(dbs, tm):
    """The default pool keeps 16 idle sessions, enough for a PostgreSQL service given 16 HTTP
    threads (``serve(threads=16)``): a second wave of 16 transactions at once opens no
    session (a session opened per transaction costs PostgreSQL a backend started and ended)."""
    ds = XADataSource(dbs[0], tm)
    at_once = 16
    barrier = threading.Barrier(at_once, timeout=60)
    waves: list[set[int]] = [set(), set()]
    errors: list[BaseException] = []

    def work(wave: int, n: int) -> None:
        try:
            with tm.transaction():
                with ds.connection() as conn:
                    insert(conn, f"{wave}-{n}")
                    waves[wave].add(conn.info.backend_pid)
                    barrier.wait()  # all 16 transactions hold a session at once
        except BaseException as exc:  # noqa: BLE001 -- reported by the assertion below
            errors.append(exc)

    try:
        for wave in (0, 1):
            threads = [threading.Thread(target=work, args=(wave, n)) for n in range(at_once)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert not errors
        assert len(waves[0]) == at_once
        assert waves[1] == waves[0]  # the same backends: every session was kept
        assert len(values(dbs[0])) == 2 * at_once
    finally:
        ds.close()


def test_pool_size_zero_closes_each_session_after_its_transaction(dbs, tm):
    ds = XADataSource(dbs[0], tm, pool_size=0)
    try:
        with tm.transaction():
            with ds.connection() as conn:
                insert(conn, "x")
        assert conn.closed
    finally:
        ds.close()


def test_a_session_released_after_close_is_closed_not_pooled(dbs, tm):
    """The pool's release takes no lock: a transaction that ends after its data source closed
    (and took its idle list) still closes its session rather than leave it in a list."""
    ds = XADataSource(dbs[0], tm)
    with tm.transaction():
        with ds.connection() as conn:
            insert(conn, "x")
        ds.close()
        assert not conn.closed, "the branch is still open: close() leaves it to its transaction"
    assert conn.closed and ds._idle == []
    assert values(dbs[0]) == ["x"]


def test_read_only_branches_drop_out_of_phase_two(dbs, tm):
    a = XADataSource(dbs[0], tm, read_only_check=True)
    b = XADataSource(dbs[1], tm, read_only_check=True)
    run(dbs[1], "INSERT INTO t (v) VALUES ('looked up')")
    try:
        with tm.transaction():
            with b.connection() as cb, cb.cursor() as cur:
                cur.execute("SELECT v FROM t")
                assert cur.fetchall() == [("looked up",)]
            with a.connection() as ca:
                insert(ca, "written")
        assert values(dbs[0]) == ["written"]
    finally:
        a.close()
        b.close()


def test_a_crash_after_the_decision_is_finished_by_recovery_in_a_new_manager(dbs, tmp_path):
    log_path = tmp_path / "crash.log"

    def crash_when_logged(point: str, index: int) -> None:
        if point == "logged":
            raise Crash(point)

    tm1 = TransactionManager(node="crashy", log=log_path, checkpoint=crash_when_logged)
    a1, b1 = (XADataSource(dsn, tm1, resource_name=f"bank-{i}") for i, dsn in enumerate(dbs))
    with pytest.raises(Crash):
        with tm1.transaction():
            with a1.connection() as ca:
                insert(ca, "debit")
            with b1.connection() as cb:
                insert(cb, "credit")
    assert len(prepared_gids(dbs[0])) == len(prepared_gids(dbs[1])) == 1, "both branches in doubt"
    # The "dead" process: its sessions go away, its prepared branches stay.
    for ds in (a1, b1):
        for _tx, resource in list(ds._enlisted.values()):
            resource.close()
        ds.close()
    tm1.close()

    tm2 = TransactionManager(node="crashy", log=log_path)
    try:
        a2, b2 = (XADataSource(dsn, tm2, resource_name=f"bank-{i}") for i, dsn in enumerate(dbs))
        report = tm2.recovery.recover_once()
        assert not report.errors, report.summary()
        assert values(dbs[0]) == ["debit"] and values(dbs[1]) == ["credit"]
        assert prepared_gids(dbs[0]) == prepared_gids(dbs[1]) == []
        a2.close()
        b2.close()
    finally:
        tm2.close()


def test_the_recovery_resource_works_with_fresh_connections(dbs, tm, sources):
    a, _ = sources
    resource = a.xa_resource_for_recovery()
    try:
        assert isinstance(resource, PostgresXAResource)
        assert resource.resource_name == a.resource_name == "ds-0"
        assert resource.recover() == []
    finally:
        resource.close()


def _transaction_module_calls(work) -> dict[str, int]:
    """Python calls into txmanager/transaction.py while ``work()`` runs, by qualified name."""
    import collections

    seen: collections.Counter[str] = collections.Counter()

    def profile(frame, event, arg):  # noqa: ANN001 -- sys.setprofile's signature
        if event == "call" and "/txmanager/" in frame.f_code.co_filename:
            seen["txmanager calls"] += 1  # the manager's, the data source's, the session's
        if event == "call" and frame.f_code.co_filename.endswith("txmanager/transaction.py"):
            seen[frame.f_code.co_qualname] += 1
        elif (event == "c_call" and getattr(arg, "__name__", None) in ("acquire", "__enter__")
              and type(getattr(arg, "__self__", None)).__name__ in ("lock", "RLock")):
            seen["lock acquisitions"] += 1  # any lock's, made by anyone, by call or ``with``
        elif event == "c_call" and getattr(arg, "__name__", None) == "get_transaction_status":
            seen["session state asked"] += 1
        if event == "call":
            seen[f"called {frame.f_code.co_name}"] += 1

    profiled(work, profile)
    return seen


def test_one_database_takes_the_one_phase_path_and_a_second_promotes_it(dbs, tm, sources):
    """Counted, not timed: one database's transaction makes no branch objects and writes no
    log record; a second database's connection in the same transaction turns it two-phase."""
    a, b = sources
    fsyncs = tm.log.fsyncs

    def one() -> None:
        with tm.transaction():
            with a.connection() as conn:
                insert(conn, "one")

    one()  # the pool's first session connects: counted below is a transaction on a pooled one
    seen = _transaction_module_calls(one)
    # the lean one-phase transaction (txmanager.transaction._OnePhase) from begin to commit
    # the data source enlists its first session itself (_OnePhase._enlist_first, inline), and
    # the session goes back to its pool inside its COMMIT's call (its after_completion, inline)
    # (in C, txmanager.postgres.accelerated, the commit and the session's are C's: no Python)
    python = 0 if accelerated.enabled() else 1
    assert seen["_OnePhase._enlist_first"] == 0 and seen["_OnePhase.commit"] == python
    # and a session idle since its last one-phase COMMIT starts its branch inline too
    assert seen["called start_unnamed"] == 0 and seen["called end_and_commit_one_phase"] == python
    assert seen["called after_completion"] == 0
    assert seen["_OnePhase._become_full"] == 0, "nothing promoted it to the general path"
    assert seen["Transaction._commit_sole"] == 0, "commit ends and commits the session in one call"
    assert seen["Transaction._name_sole"] == 0 and seen["Transaction.xid"] == 0, \
        "no xid is made (or formatted) for a transaction whose one branch nobody names"
    assert seen["_Branch.__init__"] == 0 and seen["Transaction._promote"] == 0
    assert seen["lock acquisitions"] == 0, "no lock: the transaction is its thread's until " \
        "promoted, the session the transaction's until completion, the pool's lists atomic"
    # begin, the connection's scope, its enlistment, the statement's cursor and execute, the
    # commit and the session's return: 28 Python calls at the start of the last round of cuts,
    # 21 at its end, 17 after the next, 14 after the one after (the data source's enlistment,
    # the session's COMMIT and its return each one call fewer), 12 after the next (the enlistment
    # and the return inline), 11 now (the session's start inline)
    assert seen["txmanager calls"] <= 11, seen["txmanager calls"]
    assert seen["called _begin_in"] == 0, "the block begins its transaction itself"
    assert seen["called get_transaction"] == 0, "the connection reads the thread's binding itself"
    assert seen["called begin_unnamed"] == 0 and seen["called _finish"] == 0
    assert seen["session state asked"] == python, "psycopg2 is asked before the COMMIT only: the " \
        "start, like the pool's return, takes a session idle on the strength of its last " \
        "one-phase COMMIT (LazyBeginConnection._lagging)"
    assert tm.log.fsyncs == fsyncs, "one phase writes no log record"

    def two() -> None:
        with tm.transaction():
            with a.connection() as conn:
                insert(conn, "two")
            with b.connection() as conn:
                insert(conn, "two")

    seen = _transaction_module_calls(two)
    assert seen["Transaction._promote"] == 1 and seen["_Branch.__init__"] == 2
    assert seen["Transaction._commit_two_phase"] == 1 and seen["Transaction._commit_sole"] == 0
    assert tm.log.fsyncs > fsyncs, "the decision is logged"
    assert values(dbs[0]) == ["one", "one", "two"] and values(dbs[1]) == ["two"]
    assert prepared_gids(dbs[0]) == prepared_gids(dbs[1]) == []
    assert len(a._idle) == 1 and len(b._idle) == 1, "both sessions went back to their pools"


def test_a_transaction_committed_by_itself_still_bound_gives_a_local_connection(dbs, tm, sources):
    """``tx.commit()`` on the transaction object leaves it bound to the thread, finished: the
    data source, which reads the binding itself, must see no transaction there (and unbind it,
    as get_transaction does), not enlist in a finished one."""
    a, _ = sources
    tx = tm.begin()
    with a.connection() as conn:
        insert(conn, "in")
    tx.commit()
    with a.connection() as conn:
        insert(conn, "local")  # a plain local connection: committed at the end of the block
    assert tm._local.tx is None, "unbound, as get_transaction unbinds a finished transaction"
    assert values(dbs[0]) == ["in", "local"]


def test_after_completion_order_and_failures_on_the_one_phase_path(dbs, tm, sources, caplog):
    """The one-phase commit runs the synchronizations itself: in their order of registration
    (the pool's among them), a failing one logged and the next still called, the outcome
    unchanged and the session back in the pool."""
    from txmanager import Status
    from txmanager.transaction import AfterCompletion

    a, _ = sources
    events: list[tuple[str, Status, int]] = []

    class Note(AfterCompletion):
        def __init__(self, name: str, fail: bool = False) -> None:
            self.name, self.fail = name, fail

        def after_completion(self, status: Status) -> None:
            events.append((self.name, status, len(a._idle)))
            if self.fail:
                raise RuntimeError(f"{self.name} failed")

    with a.connection() as conn:
        insert(conn, "warm")  # the pool's session exists: the transaction below takes it
    with tm.transaction() as tx:
        tx.register_synchronization(Note("before the pool's", fail=True))
        with a.connection() as conn:
            insert(conn, "x")
        tx.register_synchronization(Note("after the pool's"))
    assert events == [("before the pool's", Status.COMMITTED, 0), ("after the pool's", Status.COMMITTED, 1)]
    assert tx.status == Status.COMMITTED and values(dbs[0]) == ["warm", "x"]
    assert "after_completion of" in caplog.text and "before the pool's failed" in caplog.text


@pytest.mark.parametrize("how", ["closed by the client", "terminated by the server"])
def test_a_pooled_session_lost_while_idle_gives_the_next_transaction_an_open_one(dbs, tm, sources, how):
    """The enlistment hands out the session its branch started on: a pooled session found
    closed is replaced before the start, and one the server ended while it sat in the pool
    fails only the statement that finds out (its transaction rolls back), never a later one."""
    a, _ = sources
    with tm.transaction():
        with a.connection() as conn:
            insert(conn, "first")
            pid = conn.get_backend_pid()
    if how == "closed by the client":
        a._idle[0]._session.close()
    else:
        run(dbs[0], "SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg2.OperationalError), tm.transaction():
            with a.connection() as conn:
                insert(conn, "lost")
    with tm.transaction():
        with a.connection() as conn:
            assert not conn.closed and conn.get_backend_pid() != pid
            insert(conn, "second")
    assert values(dbs[0]) == ["first", "second"]
