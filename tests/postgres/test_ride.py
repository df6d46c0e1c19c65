"""A write rides on a branch's next round trip (``LazyBeginConnection.ride``): the next statement's
query string, or the branch's one-phase COMMIT or PREPARE TRANSACTION.

Round trips are counted on the connection's own cursor (the one its COMMIT and PREPARE go
through) and on the application's cursors; that the ridden write was not sent before is seen from
another session (``pg_locks``: no lock of its table yet).  Every failure path checks that nothing
of the branch is left and the session is usable.
"""

from __future__ import annotations

import psycopg2
import psycopg2.extensions as ext
import pytest

from tests.postgres.test_resource import insert, new_xid, run, values, xa_code
from txmanager.lazy_begin import LazyBeginConnection
from txmanager.postgres import PostgresXAResource
from txmanager.xa import TMSUCCESS, XA_OK, XA_RBROLLBACK, XAException
from txmanager.xid import Xid

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("one_phase_path")]

RIDE = "INSERT INTO u (v) VALUES (%s)"


class CountingCursor(ext.cursor):
    """A plain cursor that counts its round trips (one per ``execute``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[bytes | str] = []

    def execute(self, query, vars=None):  # noqa: A002 -- psycopg2's name
        self.sent.append(query)
        return super().execute(query, vars)


@pytest.fixture
def db(fresh_db):
    run(fresh_db, "CREATE TABLE t (id serial PRIMARY KEY, v text NOT NULL)")
    run(fresh_db, "CREATE TABLE u (id serial PRIMARY KEY, v text NOT NULL)")
    return fresh_db


@pytest.fixture
def resource(db):
    r = PostgresXAResource(db)
    yield r
    r.close()


def counted(conn: LazyBeginConnection) -> CountingCursor:
    """The connection's own cursor (its COMMIT, PREPARE and riding statements), counting."""
    conn._own_cursor = cur = CountingCursor(conn)
    return cur


def u_values(dsn: str) -> list[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT v FROM u ORDER BY id")
            return [r[0] for r in cur.fetchall()]
    finally:
        conn.close()


def locks_u(dsn: str, conn: LazyBeginConnection) -> bool:
    """Does ``conn``'s backend hold a lock on table u (has a statement touching it run)?"""
    other = psycopg2.connect(dsn)
    try:
        with other.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND relation = 'u'::regclass",
                        (conn.info.backend_pid,))
            return bool(cur.fetchone()[0])
    finally:
        other.close()


def branch(resource: PostgresXAResource, value: str = "a") -> tuple[LazyBeginConnection, Xid]:
    """A branch started on ``resource`` that wrote ``value`` into t: its BEGIN went, a write may ride."""
    xid = new_xid()
    resource.start(xid)
    insert(resource, value)
    return resource.connection, xid


def commit_one_phase(resource: PostgresXAResource, xid: Xid) -> None:
    resource.end(xid, TMSUCCESS)
    resource.commit(xid, one_phase=True)


def commit_rolls_back(resource: PostgresXAResource, xid: Xid) -> BaseException | None:
    """The one-phase commit of ``xid`` rolls it back: the cause it gives."""
    resource.end(xid, TMSUCCESS)
    with pytest.raises(XAException) as excinfo:
        resource.commit(xid, one_phase=True)
    assert xa_code(excinfo) >= XA_RBROLLBACK
    return excinfo.value.__cause__


def another_branch_commits(resource: PostgresXAResource) -> None:
    """The session goes on: a branch after it writes "c" and commits."""
    _, xid = branch(resource, "c")
    commit_one_phase(resource, xid)


def test_a_ridden_write_goes_with_the_one_phase_commit_in_one_round_trip(resource, db):
    conn, xid = branch(resource)
    own = counted(conn)
    assert conn.ride(RIDE, ("100%",)) is True  # a ``%`` in what rides stays one
    assert conn.riding == 1 and not locks_u(db, conn)  # not sent yet
    commit_one_phase(resource, xid)
    assert len(own.sent) == 1 and own.sent[0].endswith(b"COMMIT"), own.sent  # the write and the COMMIT
    assert values(db) == ["a"] and u_values(db) == ["100%"]
    assert conn.riding == 0 and conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE


@pytest.mark.parametrize("params", [("b",), None], ids=["with-parameters", "without"])
def test_a_ridden_write_goes_in_front_of_the_next_statement(resource, db, params):
    conn, xid = branch(resource)
    conn.ride(RIDE, ("50%",))
    conn.ride("INSERT INTO u (v) VALUES ('x')")
    with conn.cursor() as cur:  # the application's next statement sees them: they ran before it
        if params is None:
            cur.execute("SELECT count(*) FROM u")
        else:
            cur.execute("SELECT count(*) FROM u WHERE v <> %s", params)
        assert cur.fetchone()[0] == 2
    assert conn.riding == 0
    own = counted(conn)
    commit_one_phase(resource, xid)
    assert own.sent == [b"COMMIT"]  # nothing left to ride on it
    assert u_values(db) == ["50%", "x"]


def a_failing_ride(resource: PostgresXAResource) -> tuple[LazyBeginConnection, Xid]:
    """A branch that wrote "a" and has a write riding that will fail (no such table)."""
    conn, xid = branch(resource)
    conn.ride("INSERT INTO missing (v) VALUES (%s)", ("b",))
    return conn, xid


def test_a_ridden_write_that_fails_rolls_the_branch_back_at_the_commit_with_its_error(resource, db):
    conn, xid = a_failing_ride(resource)
    assert isinstance(commit_rolls_back(resource, xid), psycopg2.errors.UndefinedTable)
    assert values(db) == [] and conn.riding == 0
    another_branch_commits(resource)
    assert values(db) == ["c"]


def test_a_ridden_write_that_fails_raises_from_the_next_statement(resource, db):
    conn, xid = a_failing_ride(resource)
    with pytest.raises(psycopg2.errors.UndefinedTable) as excinfo:
        insert(resource, "c")
    assert any("ride" in note for note in getattr(excinfo.value, "__notes__", ())), excinfo.value
    assert conn.info.transaction_status == ext.TRANSACTION_STATUS_INERROR
    with pytest.raises(XAException) as ended:  # the branch can only roll back
        resource.end(xid, TMSUCCESS)
    assert xa_code(ended) == XA_RBROLLBACK
    resource.rollback(xid)
    assert values(db) == []


def test_parameters_refused_before_sending_leave_the_ridden_write_to_ride(resource, db):
    conn, xid = branch(resource)
    conn.ride(RIDE, ("b",))
    with conn.cursor() as cur, pytest.raises(IndexError):
        cur.execute("SELECT %s, %s", ("only one",))  # psycopg2 refuses it: nothing is sent
    assert conn.riding == 1
    commit_one_phase(resource, xid)
    assert values(db) == ["a"] and u_values(db) == ["b"]


def test_a_rolled_back_branch_never_sends_its_ridden_write(resource, db):
    conn, xid = branch(resource)
    conn.ride(RIDE, ("b",))
    resource.end(xid, TMSUCCESS)
    resource.rollback(xid)
    assert conn.riding == 0
    another_branch_commits(resource)
    assert values(db) == ["c"] and u_values(db) == []


def test_a_ridden_write_goes_with_prepare_transaction(resource, db):
    conn, xid = branch(resource)
    conn.ride(RIDE, ("b",))
    own = counted(conn)
    resource.end(xid, TMSUCCESS)
    assert resource.prepare(xid) == XA_OK
    assert len(own.sent) == 1, own.sent  # the write and the PREPARE
    assert u_values(db) == []
    resource.commit(xid, one_phase=False)
    assert values(db) == ["a"] and u_values(db) == ["b"]


def test_ride_refuses_where_it_cannot_and_changes_nothing(resource, db):
    conn = resource.connection
    assert conn.ride(RIDE, ("outside",)) is False  # no branch
    xid = new_xid()
    resource.start(xid)
    assert conn.ride(RIDE, ("before-begin",)) is False  # the BEGIN waits for the first statement
    insert(resource, "a")
    resource.end(xid, TMSUCCESS)
    assert resource.prepare(xid) == XA_OK
    assert conn.ride(RIDE, ("prepared",)) is False
    resource.commit(xid, one_phase=False)
    assert conn.riding == 0 and u_values(db) == []


def test_an_applications_write_through_an_xa_data_source_rides_on_the_commit(db, tmp_path):
    from txmanager import TransactionManager
    from txmanager.postgres import XADataSource

    tm = TransactionManager(node="ride-app", log=tmp_path / "tm.log")
    ds = XADataSource(db, tm)
    try:
        with tm.transaction():
            with ds.connection() as conn:
                assert conn.ride(RIDE, ("early",)) is False  # nothing ran in the branch yet: yours to run
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO t (v) VALUES (%s)", ("a",))
                assert conn.ride(RIDE, ("b",)) is True
                assert not locks_u(db, conn)
        assert values(db) == ["a"] and u_values(db) == ["b"]
    finally:
        ds.close()
        tm.close()


# -- a write riding to the one-phase COMMIT, its outcome read after it (ride_to_commit) ---------------

#: inserts into u, keeps the row's id in a session setting, or declines (division by zero) for "no"
TO_COMMIT = ("WITH i AS (INSERT INTO u (v) SELECT %s WHERE %s <> 'no' RETURNING id) "
             "SELECT 1 / CAST(count(set_config('test.rode', CAST(i.id AS text), FALSE)) AS integer) FROM i")
READ = "SELECT current_setting('test.rode'), (SELECT count(*) FROM u)"


def ride_to_commit(conn: LazyBeginConnection, value: str, answers: list, repairs: list) -> bool:
    def repair() -> None:
        repairs.append(value)
        with conn.cursor() as cur:
            cur.execute("INSERT INTO u (v) VALUES ('repaired')")
    return conn.ride_to_commit(TO_COMMIT, (value, value), read=READ, read_params=None,
                               answer=answers.append, declined="22012", repair=repair)


def test_a_write_riding_to_the_commit_is_sent_with_it_and_read_after_it_in_one_round_trip(resource, db):
    conn, xid = branch(resource)
    answers: list = []
    assert ride_to_commit(conn, "b", answers, []) is True
    assert not locks_u(db, conn) and answers == []  # not sent yet
    own = counted(conn)
    commit_one_phase(resource, xid)
    # one query string: the write in its savepoint, the COMMIT, the read after it
    assert len(own.sent) == 1, own.sent
    assert own.sent[0].index(b"INSERT INTO u") < own.sent[0].index(b";COMMIT;") < own.sent[0].index(b"current_setting")
    (read,) = answers
    assert read[1] == 1 and values(db) == ["a"] and u_values(db) == ["b"]
    assert conn.riding == 0 and conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE


def test_a_write_riding_to_the_commit_ends_its_savepoint_with_the_commit(resource, db):
    """The statements a begun branch sends for a write riding to its one-phase COMMIT: the
    savepoint (a decline rolls back only the write), the write, the COMMIT, the read.  No
    ``RELEASE SAVEPOINT`` before the COMMIT (sent before: a statement more for the server a
    message, for nothing; the COMMIT ends the savepoint with the transaction), nor before a
    statement that rides after it to the COMMIT (a commit mark, ``commit_branch_after``)."""
    conn, xid = branch(resource)
    answers: list = []
    assert ride_to_commit(conn, "b", answers, []) is True
    own = counted(conn)
    commit_one_phase(resource, xid)
    (sent,) = own.sent
    write = conn.cursor().mogrify(TO_COMMIT, ("b", "b"))
    assert sent == b"SAVEPOINT txmanager_rider;" + write + b";COMMIT;" + READ.encode(), sent
    assert len(answers) == 1 and u_values(db) == ["b"]
    conn, xid = branch(resource, "c")
    ride_to_commit(conn, "c", answers, [])
    own = counted(conn)
    resource.end(xid, TMSUCCESS)
    assert conn.commit_branch_after("INSERT INTO t (v) VALUES (%s)", ("mark",)) is True
    (sent,) = own.sent
    assert b"RELEASE" not in sent and sent.endswith(b"INSERT INTO t (v) VALUES ('mark');COMMIT;" + READ.encode()), sent
    assert len(answers) == 2 and u_values(db) == ["b", "c"] and "mark" in values(db)


def test_a_write_riding_to_the_fused_commit_is_sent_with_it(db, tmp_path):
    """Through an XA data source and its manager: the sole branch's fused one-phase commit."""
    from txmanager import TransactionManager
    from txmanager.postgres import XADataSource
    tm = TransactionManager(node="rider", log=tmp_path / "tm.log")
    ds = XADataSource(db, tm)
    try:
        answers: list = []
        sent: list = []
        with tm.transaction():
            with ds.connection() as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO t (v) VALUES ('a')")
                assert ride_to_commit(conn, "b", answers, []) is True
                sent = counted(conn).sent
        assert len(sent) == 1 and b";COMMIT;" in sent[0], sent
        assert len(answers) == 1 and values(db) == ["a"] and u_values(db) == ["b"]
    finally:
        ds.close()
        tm.close()


@pytest.mark.parametrize("begun", [True, False], ids=["begun", "unbegun"])
def test_writes_ridden_first_run_in_front_of_the_others_in_the_order_given(resource, db, begun):
    """``first``: each in front of what rides already, after the ``first`` ones before it (a
    batch's receipts, each of one sequence, lock their rows in the order of the batch's parts,
    ascending, as the general way's statements do).  Given in front of each other instead
    (``at=0`` before), they ran last given first: two batches could lock two rows in opposite
    orders.  After a round trip sent them, the next ``first`` write goes in front again."""
    if begun:
        conn, xid = branch(resource)
    else:
        xid = new_xid()
        resource.start(xid)
        conn = resource.connection
    assert conn.ride(RIDE, ("later",), begin=True) is True  # (unbegun: the BEGIN rides, in front)
    for v in ("r1", "r2", "r3"):
        assert conn.ride(RIDE, (v,), first=True, begin=True) is True
    own = counted(conn)
    commit_one_phase(resource, xid)
    assert len(own.sent) == 1, own.sent
    assert u_values(db) == ["r1", "r2", "r3", "later"]
    conn, xid = branch(resource, "c")
    conn.ride(RIDE, ("s1",), first=True)
    with conn.cursor() as cur:
        cur.execute("SELECT 1")  # sends s1
    conn.ride(RIDE, ("later2",))
    conn.ride(RIDE, ("s2",), first=True)
    commit_one_phase(resource, xid)
    assert u_values(db)[-3:] == ["s1", "s2", "later2"]


def test_a_write_riding_to_the_commit_that_declines_is_repaired_before_the_commit(resource, db):
    conn, xid = branch(resource)
    conn.ride(RIDE, ("before",))  # ridden before it: kept, and sent once
    answers: list = []
    repairs: list = []
    assert ride_to_commit(conn, "no", answers, repairs) is True
    commit_one_phase(resource, xid)
    assert repairs == ["no"] and answers == []  # declined: repaired, nothing to read
    assert values(db) == ["a"] and u_values(db) == ["before", "repaired"]
    assert conn.riding == 0 and conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE


def test_a_write_riding_to_the_commit_goes_first_and_is_read_when_a_statement_comes(resource, db):
    conn, xid = branch(resource)
    answers: list = []
    ride_to_commit(conn, "b", answers, [])
    with conn.cursor() as cur:  # the statement sees the write: it ran before it, and was read
        cur.execute("SELECT count(*) FROM u")
        assert cur.fetchone()[0] == 1
    assert len(answers) == 1 and answers[0][1] == 1
    own = counted(conn)
    commit_one_phase(resource, xid)
    assert own.sent == [b"COMMIT"]
    assert u_values(db) == ["b"]


def test_a_write_riding_to_the_commit_is_read_by_its_early_read_when_it_goes_before(resource, db):
    """``early_read``: read in place of the read after the COMMIT where the write goes first,
    inside the branch (here with a statement that comes); with the COMMIT, the read after it."""
    conn, xid = branch(resource)
    answers: list = []
    early = ("SELECT 'early', (SELECT v FROM u WHERE v = %s)", ("b",))
    assert conn.ride_to_commit(TO_COMMIT, ("b", "b"), read=READ, read_params=None, answer=answers.append,
                               declined="22012", repair=lambda: None, early_read=early) is True
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM u")
    assert answers == [("early", "b")]
    commit_one_phase(resource, xid)
    conn, xid = branch(resource, "c")
    assert conn.ride_to_commit(TO_COMMIT, ("c", "c"), read=READ, read_params=None, answer=answers.append,
                               declined="22012", repair=lambda: None, early_read=early) is True
    commit_one_phase(resource, xid)
    assert len(answers) == 2 and answers[1][0] != "early"  # sent with the COMMIT: read after it
    assert u_values(db) == ["b", "c"]


def test_a_write_riding_to_the_commit_that_declines_before_a_statement_is_repaired_first(resource, db):
    conn, xid = branch(resource)
    repairs: list = []
    ride_to_commit(conn, "no", [], repairs)
    with conn.cursor() as cur:
        cur.execute("SELECT v FROM u")
        assert cur.fetchall() == [("repaired",)] and repairs == ["no"]
    commit_one_phase(resource, xid)
    assert values(db) == ["a"] and u_values(db) == ["repaired"]


def test_a_write_riding_to_the_commit_goes_before_prepare_transaction_and_is_read(resource, db):
    conn, xid = branch(resource)
    answers: list = []
    ride_to_commit(conn, "b", answers, [])
    own = counted(conn)
    resource.end(xid, TMSUCCESS)
    assert resource.prepare(xid) == XA_OK
    assert len(own.sent) == 2 and str(own.sent[1]).startswith("PREPARE TRANSACTION"), own.sent  # it, then the PREPARE
    assert len(answers) == 1
    resource.commit(xid, one_phase=False)
    assert values(db) == ["a"] and u_values(db) == ["b"]


def test_a_rolled_back_branch_never_sends_its_write_riding_to_the_commit(resource, db):
    conn, xid = branch(resource)
    answers: list = []
    ride_to_commit(conn, "b", answers, [])
    assert ride_to_commit(conn, "c", answers, []) is False  # one at a time
    resource.end(xid, TMSUCCESS)
    resource.rollback(xid)
    assert conn.riding == 0 and conn._rider is None and answers == []
    another_branch_commits(resource)
    assert values(db) == ["c"] and u_values(db) == []


def test_a_write_riding_to_the_commit_whose_repair_fails_rolls_the_branch_back(resource, db):
    conn, xid = branch(resource)

    def repair() -> None:
        raise ValueError("no other way")
    conn.ride_to_commit(TO_COMMIT, ("no", "no"), read=READ, read_params=None, answer=print, declined="22012",
                        repair=repair)
    assert "no other way" in str(commit_rolls_back(resource, xid))
    assert values(db) == [] and u_values(db) == []
    assert conn.riding == 0 and conn._rider is None
    another_branch_commits(resource)
    assert values(db) == ["c"]


# -- a write riding to the COMMIT of a branch that sent nothing yet: its BEGIN rides too -------------

def unbegun_rider(resource: PostgresXAResource, value: str, answers: list, repairs: list
                  ) -> tuple[LazyBeginConnection, Xid]:
    """A branch started on ``resource`` whose first (and only) write rides to its commit."""
    xid = new_xid()
    resource.start(xid)
    conn = resource.connection
    assert conn.sent_nothing
    assert ride_to_commit(conn, value, answers, repairs) is True
    assert not conn.sent_nothing and not locks_u(resource.connection.dsn, conn)  # nothing sent yet
    return conn, xid


def test_a_write_riding_to_the_commit_of_an_unbegun_branch_sends_its_begin_with_the_commit(resource, db):
    answers: list = []
    conn, xid = unbegun_rider(resource, "b", answers, [])
    own = counted(conn)
    commit_one_phase(resource, xid)
    # one query string: BEGIN, the write (no savepoint: nothing else to keep), the COMMIT, the read
    assert len(own.sent) == 1 and own.sent[0].startswith(b"BEGIN;WITH"), own.sent
    assert b"SAVEPOINT" not in own.sent[0]
    assert len(answers) == 1 and answers[0][1] == 1 and u_values(db) == ["b"]
    assert conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE
    another_branch_commits(resource)
    assert values(db) == ["c"]


def test_an_unbegun_branchs_write_that_declines_is_undone_with_its_transaction_and_repaired(resource, db):
    """No savepoint to roll back to: the transaction, which held only the write, is rolled back
    and begun again in front of the repair's statement; the branch commits the repair alone."""
    repairs: list = []
    conn, xid = unbegun_rider(resource, "no", [], repairs)
    commit_one_phase(resource, xid)
    assert repairs == ["no"] and u_values(db) == ["repaired"] and values(db) == []
    assert conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE and conn.riding == 0
    conn, xid = unbegun_rider(resource, "no", [], repairs)
    insert(resource, "a")  # declined before the statement: repaired, then the statement, in the branch
    resource.end(xid, TMSUCCESS)
    resource.rollback(xid)
    assert u_values(db) == ["repaired"] and values(db) == []
    another_branch_commits(resource)
    assert values(db) == ["c"]


def test_an_unbegun_branchs_write_riding_to_the_commit_goes_first_with_its_begin(resource, db):
    """A statement after it, PREPARE TRANSACTION, a rollback: the write (and the BEGIN) go first,
    or never."""
    answers: list = []
    conn, xid = unbegun_rider(resource, "b", answers, [])
    insert(resource, "a")  # runs in the branch, after the write and its BEGIN
    assert len(answers) == 1 and conn.info.transaction_status == ext.TRANSACTION_STATUS_INTRANS
    resource.end(xid, TMSUCCESS)
    resource.rollback(xid)
    assert values(db) == [] and u_values(db) == []
    answers.clear()
    conn, xid = unbegun_rider(resource, "b", answers, [])
    resource.end(xid, TMSUCCESS)
    assert resource.prepare(xid) == XA_OK and len(answers) == 1
    resource.commit(xid, one_phase=False)
    assert u_values(db) == ["b"]
    conn, xid = unbegun_rider(resource, "never", answers, [])
    resource.end(xid, TMSUCCESS)
    resource.rollback(xid)  # nothing was sent: nothing to roll back
    assert conn.riding == 0 and conn._rider is None and conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE
    another_branch_commits(resource)
    assert values(db) == ["c"] and u_values(db) == ["b"]


def test_an_unbegun_branchs_write_refused_whole_leaves_no_statement_outside_the_branch(resource, db):
    """A write the server refuses whole (a syntax error: nothing of its query string ran, its
    BEGIN neither): the statement after it fails, and the branch, begun after all, can only roll
    back; without the BEGIN sent again, the statement would have committed on its own."""
    xid = new_xid()
    resource.start(xid)
    conn = resource.connection
    assert conn.ride_to_commit("INSERT INTO u (v) VALUES (%s) RETURNING", ("b",), read=READ, read_params=None,
                               answer=print, declined="22012", repair=lambda: None) is True
    with pytest.raises(psycopg2.errors.SyntaxError):
        insert(resource, "a")
    assert conn.info.transaction_status == ext.TRANSACTION_STATUS_INERROR
    with pytest.raises(psycopg2.errors.InFailedSqlTransaction):
        insert(resource, "a")
    with pytest.raises(XAException):
        resource.end(xid, TMSUCCESS)
    resource.rollback(xid)
    assert values(db) == [] and u_values(db) == []
    another_branch_commits(resource)
    assert values(db) == ["c"]


@pytest.mark.parametrize("value", ["b", "no"], ids=["rides", "declines"])
def test_a_write_riding_on_the_commit_mark_of_an_unbegun_branch_takes_one_round_trip(dbs, tmp_path, value):
    """Two databases, b keeping the commit marks: b's only write rides to its COMMIT, and its
    BEGIN, the write, the mark and the COMMIT go in one query string (two before: the write
    with its BEGIN, then the mark with the COMMIT).  A write that declines is repaired before
    the mark: the mark still commits with the rest, in b's next round trip."""
    from .support import two_sources
    run(dbs[1], "CREATE TABLE u (id serial PRIMARY KEY, v text NOT NULL)")
    answers: list = []
    repairs: list = []
    with two_sources(dbs, tmp_path / "tx.log", node="unbegun") as (tm, a, b):
        with tm.transaction():
            with a.connection() as ca:
                with ca.cursor() as cur:
                    cur.execute("INSERT INTO t (v) VALUES ('a')")
            with b.connection() as cb:
                assert ride_to_commit(cb, value, answers, repairs) is True
                sent = counted(cb).sent
        assert sent[0].startswith(b"BEGIN;WITH") and b"SAVEPOINT" not in sent[0], sent
        if value == "b":
            (one,) = sent
            assert one.index(b"INSERT INTO u") < one.index(b"txm_commit_mark") < one.index(b";COMMIT;") \
                < one.index(b"current_setting")
            assert len(answers) == 1 and repairs == [] and u_values(dbs[1]) == ["b"]
        else:  # declined: the string stopped there; begun again and repaired, then the mark
            assert repairs == ["no"] and answers == [] and u_values(dbs[1]) == ["repaired"]
            assert cb.info.transaction_status == ext.TRANSACTION_STATUS_IDLE
            assert len(sent) == 2 and sent[1].endswith(b";COMMIT") and b"txm_commit_mark" in sent[1], sent
        assert values(dbs[0]) == ["a"]
        assert run(dbs[1], "SELECT count(*) FROM txm_commit_mark")[0][0] == 1
