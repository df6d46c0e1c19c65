"""``XADataSource.transaction()``: ``with tm.transaction(): with ds.connection() as conn`` as one
block.  It must be that transaction exactly: bound to the thread, joined by other resources,
committed at the end (one phase alone, two with another database), rolled back on an exception,
refused inside another, and undone when the connection cannot be had.  Real PostgreSQL."""

from __future__ import annotations

import psycopg2
import pytest

from txmanager import HeuristicHazardError, NotSupportedError, RollbackError, Status, TransactionManager
from txmanager.postgres import XADataSource, accelerated
from txmanager.transaction import _OnePhase
from txmanager.xa import XA_RBINTEGRITY

from tests.postgres.support import insert, prepared_gids, profiled, run, values

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("one_phase_path")]


@pytest.fixture(params=["cold", "warm"])
def sources(sources, request):
    """The data sources with no session yet ("cold": the block takes the two scopes' way), or
    each with one idle since a one-phase COMMIT ("warm": the block's own way, see
    _TransactionConnectionScope.__enter__): every test here holds for both."""
    if request.param == "warm":
        for ds in sources:
            with ds.transaction() as conn, conn.cursor() as cur:
                cur.execute("SELECT 1")
            assert len(ds._idle) == 1 and ds._idle[0]._session._lagging
    return sources


def test_the_block_is_the_threads_transaction_and_commits_in_one_phase(dbs, tm, sources):
    a, _ = sources
    fsyncs = tm.log.fsyncs
    with a.transaction() as conn:
        tx = tm.get_transaction()
        assert type(tx) is _OnePhase and tx.status == Status.ACTIVE
        insert(conn, "one")
        with a.connection() as again:  # the same branch, as in the nested blocks
            assert again is conn
            insert(again, "two")
    assert tx.status == Status.COMMITTED and tm.get_transaction() is None
    assert values(dbs[0]) == ["one", "two"]
    assert len(a._idle) == 1, "the session went back to the pool with the commit"
    assert tm.log.fsyncs == fsyncs, "one phase: nothing for the recovery log"


def test_another_database_joins_and_both_commit_in_two_phases(dbs, tm, sources):
    a, b = sources
    fsyncs = tm.log.fsyncs
    with a.transaction() as ca:
        insert(ca, "debit")
        with b.connection() as cb:
            insert(cb, "credit")
        assert len(tm.get_transaction().branches) == 2
    assert values(dbs[0]) == ["debit"] and values(dbs[1]) == ["credit"]
    assert prepared_gids(dbs[0]) == prepared_gids(dbs[1]) == []
    assert tm.log.fsyncs > fsyncs, "two phases: the decision was logged"


def test_an_exception_rolls_back_and_is_raised(dbs, tm, sources):
    a, b = sources
    with pytest.raises(ZeroDivisionError):
        with a.transaction() as ca:
            insert(ca, "debit")
            with b.connection() as cb:
                insert(cb, "credit")
            1 / 0
    assert tm.get_transaction() is None
    assert values(dbs[0]) == values(dbs[1]) == []
    with a.transaction() as ca:  # the session is usable again
        insert(ca, "after")
    assert values(dbs[0]) == ["after"]


def test_inside_another_transaction_it_is_refused_and_leaves_that_one_alone(dbs, tm, sources):
    a, _ = sources
    with tm.transaction() as outer:
        with pytest.raises(NotSupportedError):
            with a.transaction():
                pytest.fail("the body must not run")
        assert tm.get_transaction() is outer and outer.status == Status.ACTIVE
        with a.connection() as conn:
            insert(conn, "outer's")
    assert values(dbs[0]) == ["outer's"]


def test_a_connection_that_cannot_be_had_rolls_the_transaction_back_and_unbinds_it(dbs, tm):
    broken = XADataSource(dbs[0] + " port=1", tm, resource_name="dstx-broken",
                          register_for_recovery=False)
    try:
        with pytest.raises(Exception) as raised:
            with broken.transaction():
                pytest.fail("the body must not run")
        assert not isinstance(raised.value, NotSupportedError)
        assert tm.get_transaction() is None, "the begun transaction is unbound"
        with tm.transaction() as tx:  # and the thread can begin another
            assert tx.status == Status.ACTIVE
    finally:
        broken.close()


def test_the_timeout_given_is_the_transactions(dbs, tm, sources):
    a, _ = sources
    with a.transaction(timeout=123.0) as conn:
        assert tm.get_transaction().timeout == 123.0
        insert(conn, "timed")
    with a.transaction() as conn:
        assert tm.get_transaction().timeout == tm.default_timeout
    assert values(dbs[0]) == ["timed"]


def test_a_failed_statement_rolls_back_at_the_end(dbs, tm, sources):
    from txmanager import RollbackError

    a, _ = sources
    with pytest.raises(RollbackError):
        with a.transaction() as conn:
            insert(conn, "before the error")
            try:
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO t (v) VALUES (NULL)")
            except psycopg2.errors.NotNullViolation:
                pass  # swallowed by the application: the branch must still roll back
    assert values(dbs[0]) == []


class OtherManager(TransactionManager):
    """A manager of another class, whose own ``transaction()`` must be the one used (the data
    source cannot assume the manager's own scope)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scopes: list[float | None] = []

    def transaction(self, timeout=None):
        self.scopes.append(timeout)
        return super().transaction(timeout)


def test_a_manager_of_another_class_gets_the_two_blocks_nested(dbs, tmp_path):
    other = OtherManager(node="dstxother", log=tmp_path / "other.log")
    ds = XADataSource(dbs[0], other, resource_name="dstx-other", register_for_recovery=False)
    try:
        with ds.transaction(timeout=7.0) as conn:
            assert other.get_transaction().timeout == 7.0
            insert(conn, "kept")
        with pytest.raises(ZeroDivisionError):
            with ds.transaction() as conn:
                insert(conn, "undone")
                1 / 0
        assert other.get_transaction() is None
        assert other.scopes == [7.0, None], "its own transaction(), each time"
        assert values(dbs[0]) == ["kept"]
    finally:
        ds.close()
        other.close()


def _enters(work) -> list[str]:
    """The ``__enter__`` methods of txmanager that run while ``work()`` runs, by qualified name."""
    seen: list[str] = []

    def profile(frame, event, arg):  # noqa: ANN001 -- sys.setprofile's signature
        if event == "call" and frame.f_code.co_name == "__enter__" and "/txmanager/" in frame.f_code.co_filename:
            seen.append(frame.f_code.co_qualname)

    profiled(work, profile)
    return seen


def test_a_session_idle_since_its_one_phase_commit_starts_in_the_blocks_own_enter(dbs, tm, sources):
    """Counted, not timed: the usual block (a pooled session idle since its last one-phase
    COMMIT) begins and starts in one ``__enter__``, not the two scopes' three; a pooled
    session that cannot (closed meanwhile) sends the block the two scopes' way, on a new one."""
    a, _ = sources

    def one(value: str) -> None:
        with a.transaction() as conn:
            assert type(tm.get_transaction()) is _OnePhase
            insert(conn, value)

    # in C (txmanager.postgres.accelerated) the block's own __enter__ runs no Python
    own = [] if accelerated.enabled() else ["_TransactionConnectionScope.__enter__"]
    one("first")  # the pool's first session (or the warm one): idle after its one-phase COMMIT
    session = a._idle[-1]._session
    assert _enters(lambda: one("second")) == own
    assert a._idle[-1]._session is session, "the same session, back in the pool"
    session.close()  # an idle session closed (a restart of the server would do as much)
    # (off its usual case the C block runs the whole Python method)
    assert _enters(lambda: one("third")) == ["_TransactionConnectionScope.__enter__",
                                             "_TransactionScope.__enter__", "_ConnectionScope.__enter__"]
    assert len(a._idle) == 1 and a._idle[0]._session is not session, "the closed one was dropped"
    assert values(dbs[0]) == ["first", "second", "third"]


def test_a_commit_that_fails_in_the_block_rolls_back_with_its_reason_and_the_session_returns(dbs, tm, sources):
    """A deferred constraint fails at the block's one-phase COMMIT itself (no synchronization
    registered: the fused commit's own failure path, in C as in Python): a rollback with the
    integrity code, nothing logged, the session back in its pool and reusable."""
    a, _ = sources
    run(dbs[0], "CREATE TABLE parent (id int PRIMARY KEY)")
    run(dbs[0], "CREATE TABLE child (parent int REFERENCES parent DEFERRABLE INITIALLY DEFERRED)")
    fsyncs = tm.log.fsyncs
    with pytest.raises(RollbackError) as e:
        with a.transaction() as conn:
            tx = tm.get_transaction()
            insert(conn, "doomed")
            with conn.cursor() as cur:
                cur.execute("INSERT INTO child VALUES (42)")  # checked at COMMIT
    assert getattr(e.value.cause, "code", None) == XA_RBINTEGRITY, e.value.cause
    assert tx.status == Status.ROLLEDBACK and tm.log.fsyncs == fsyncs and tm.get_transaction() is None
    assert values(dbs[0]) == [] and len(a._idle) == 1
    with a.transaction() as conn:
        insert(conn, "next")
    assert values(dbs[0]) == ["next"] and len(a._idle) == 1


def test_a_session_lost_before_the_blocks_commit_is_a_hazard_and_not_pooled(dbs, tm, sources):
    """The server ends the session after the statement, before the block's COMMIT: the outcome
    is not known to the client, the session is closed rather than pooled, the next block gets
    a fresh one and the work was rolled back."""
    a, _ = sources
    with pytest.raises(HeuristicHazardError):
        with a.transaction() as conn:
            insert(conn, "unknown")
            pid = conn.get_backend_pid()
            run(dbs[0], "SELECT pg_terminate_backend(%s)", (pid,))
    assert conn.closed and a._idle == [] and tm.get_transaction() is None
    with a.transaction() as conn:
        assert conn.get_backend_pid() != pid
        insert(conn, "next")
    assert values(dbs[0]) == ["next"], "the terminated session's work was rolled back"


def test_a_first_statement_that_does_not_parse_fails_inside_the_branch(dbs, tm, sources):
    """The first statement's query string (``BEGIN;`` in front) is refused whole: the BEGIN is
    sent alone and the statement fails inside the branch, which rolls back; the next block runs."""
    a, _ = sources
    with pytest.raises(RollbackError):
        with a.transaction() as conn:
            with pytest.raises(psycopg2.errors.SyntaxError), conn.cursor() as cur:
                cur.execute("INSERT INTO t (v) VALUES ('x') garbage")
            assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_INERROR
    with a.transaction() as conn:
        insert(conn, "next")
    assert values(dbs[0]) == ["next"] and len(a._idle) == 1
