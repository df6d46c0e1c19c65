"""A branch's BEGIN rides on its first statement (txmanager.lazy_begin), and nothing escapes the branch.

psycopg2 marks the connection STATUS_BEGIN when it sends a BEGIN of its own; a
lazy branch's session is in a transaction (libpq says INTRANS) while psycopg2
still says STATUS_READY: the BEGIN went with the statement.  Every test that
could let a statement escape the branch rolls the branch back and checks that
nothing of it is in the table.
"""

from __future__ import annotations

import psycopg2
import psycopg2.extensions as ext
import psycopg2.extras
import pytest
from psycopg2 import sql

from tests.postgres.test_resource import insert, new_xid, prepared_gids, run, values
from txmanager.lazy_begin import LazyBeginConnection
from txmanager.postgres import PostgresXAResource
from txmanager.xa import TMSUCCESS, XA_OK, XA_RBROLLBACK, XA_RDONLY, XAException

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("one_phase_path")]


@pytest.fixture
def db(fresh_db):
    run(fresh_db, "CREATE TABLE t (id serial PRIMARY KEY, v text NOT NULL)")
    return fresh_db


@pytest.fixture
def resource(db):
    r = PostgresXAResource(db)
    yield r
    r.close()


def lazily_begun(conn) -> bool:
    """In a transaction that psycopg2 did not open."""
    return conn.status == ext.STATUS_READY and conn.info.transaction_status == ext.TRANSACTION_STATUS_INTRANS


def begun_by_psycopg2(conn) -> bool:
    return conn.status == ext.STATUS_BEGIN


def roll_back(r: PostgresXAResource, xid) -> None:
    r.end(xid, TMSUCCESS)
    r.rollback(xid)


def test_the_first_statement_carries_the_begin_and_one_phase_commit_commits(resource, db):
    conn = resource.connection
    assert isinstance(conn, LazyBeginConnection)
    xid = new_xid()
    resource.start(xid)
    assert conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE  # nothing sent at start
    insert(resource, "a")
    assert lazily_begun(conn)
    insert(resource, "b")
    assert values(db) == []  # not committed yet: the statements run in the branch
    resource.end(xid, TMSUCCESS)
    resource.commit(xid, one_phase=True)
    assert values(db) == ["a", "b"]
    assert conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE
    assert not conn.autocommit  # between branches a statement opens a transaction psycopg2 knows of


def test_a_rolled_back_branch_leaves_nothing(resource, db):
    xid = new_xid()
    resource.start(xid)
    insert(resource, "a")
    roll_back(resource, xid)
    assert values(db) == []
    assert resource.connection.info.transaction_status == ext.TRANSACTION_STATUS_IDLE


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_two_phase_on_the_session_writes_the_gid_psycopg2_writes(resource, db, commit):
    xid = new_xid()
    resource.start(xid)
    insert(resource, "a")
    resource.end(xid, TMSUCCESS)
    assert resource.prepare(xid) == XA_OK
    assert prepared_gids(db) == [xid.to_pg_gid()]
    other = psycopg2.connect(db)  # psycopg2's own recovery reads it back as the same xid
    try:
        found = [x for x in other.tpc_recover() if x.gtrid == xid.gtrid.decode()]
    finally:
        other.close()
    assert [(x.format_id, x.bqual) for x in found] == [(xid.format_id, xid.bqual.decode())]
    resource.commit(xid) if commit else resource.rollback(xid)
    assert values(db) == (["a"] if commit else []) and prepared_gids(db) == []


def test_a_branch_that_ran_nothing_sends_nothing_and_has_nothing_to_prepare(resource, db):
    conn = resource.connection
    xid = new_xid()
    resource.start(xid)
    resource.end(xid, TMSUCCESS)
    assert resource.prepare(xid) == XA_RDONLY
    assert prepared_gids(db) == []
    assert not resource.in_branch
    xid2 = new_xid()
    resource.start(xid2)
    resource.end(xid2, TMSUCCESS)
    resource.commit(xid2, one_phase=True)
    assert conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE and not conn.autocommit


@pytest.mark.parametrize("bad", ["INSERT INTO t (v) VALUES ('x'", "INSERT INTO missing (v) VALUES ('x')"],
                         ids=["syntax-error", "unknown-table"])
def test_a_failing_first_statement_aborts_the_branch_and_nothing_after_it_escapes(resource, db, bad):
    conn = resource.connection
    xid = new_xid()
    resource.start(xid)
    with pytest.raises(psycopg2.ProgrammingError), conn.cursor() as cur:
        cur.execute(bad)
    # as after psycopg2's own BEGIN: the transaction is aborted, later statements are refused
    assert conn.info.transaction_status == ext.TRANSACTION_STATUS_INERROR
    with pytest.raises(psycopg2.errors.InFailedSqlTransaction):
        insert(resource, "after")
    with pytest.raises(XAException) as raised:
        resource.end(xid, TMSUCCESS)
    assert raised.value.code == XA_RBROLLBACK
    resource.rollback(xid)
    assert values(db) == []


@pytest.mark.parametrize("first", ["executemany", "copy_from", "copy_expert", "callproc", "composable",
                                   "bytes"])
def test_every_way_to_run_a_first_statement_runs_it_in_the_branch(resource, db, first):
    import io

    conn = resource.connection
    run(db, "CREATE FUNCTION put(x text) RETURNS void LANGUAGE sql AS $$ INSERT INTO t (v) VALUES (x) $$")
    xid = new_xid()
    resource.start(xid)
    with conn.cursor() as cur:
        if first == "executemany":
            cur.executemany("INSERT INTO t (v) VALUES (%s)", [("a",), ("b",)])
        elif first == "copy_from":
            cur.copy_from(io.StringIO("a\nb\n"), "t", columns=("v",))
        elif first == "copy_expert":
            cur.copy_expert("COPY t (v) FROM STDIN", io.StringIO("a\nb\n"))
        elif first == "callproc":
            cur.callproc("put", ("a",))
        elif first == "composable":
            cur.execute(sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(sql.Identifier("t")), ("a",))
        else:
            cur.execute(b"INSERT INTO t (v) VALUES (%s)", ("a",))
    assert conn.info.transaction_status == ext.TRANSACTION_STATUS_INTRANS
    assert values(db) == []
    roll_back(resource, xid)
    assert values(db) == []


def test_a_cursor_of_another_factory_runs_in_the_branch_and_later_branches_begin_as_psycopg2_does(resource, db):
    conn = resource.connection
    xid = new_xid()
    resource.start(xid)
    with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute("INSERT INTO t (v) VALUES ('a') RETURNING v")
        assert cur.fetchone() == {"v": "a"}
    roll_back(resource, xid)
    assert values(db) == []
    # such a cursor may outlive a branch and run the next one's first statement: psycopg2 begins
    xid = new_xid()
    resource.start(xid)
    insert(resource, "b")
    assert begun_by_psycopg2(conn)
    resource.end(xid, TMSUCCESS)
    resource.commit(xid, one_phase=True)
    assert values(db) == ["b"]


def test_a_foreign_cursor_kept_from_before_the_branch_cannot_run_outside_it(resource, db):
    conn = resource.connection
    kept = conn.cursor(cursor_factory=psycopg2.extras.DictCursor)
    xid = new_xid()
    resource.start(xid)
    kept.execute("INSERT INTO t (v) VALUES ('a')")
    roll_back(resource, xid)
    assert values(db) == []


def test_a_named_cursor_first_in_a_branch(resource, db):
    run(db, "INSERT INTO t (v) VALUES ('old')")
    conn = resource.connection
    xid = new_xid()
    resource.start(xid)
    with conn.cursor(name="scan") as cur:
        cur.execute("SELECT v FROM t")
        assert [v for (v,) in cur] == ["old"]
    insert(resource, "a")
    roll_back(resource, xid)
    assert values(db) == ["old"]


@pytest.mark.parametrize("two_phase", [False, True], ids=["one-phase", "two-phase"])
def test_a_named_cursor_after_the_first_statement(resource, db, two_phase):
    conn = resource.connection
    xid = new_xid()
    resource.start(xid)
    insert(resource, "a")
    assert lazily_begun(conn)
    with conn.cursor(name="scan") as cur:  # psycopg2 needs a transaction of its own for it
        cur.execute("SELECT v FROM t")
        assert [v for (v,) in cur] == ["a"]  # the same transaction: it sees the branch's row
    insert(resource, "b")
    resource.end(xid, TMSUCCESS)
    if two_phase:
        assert resource.prepare(xid) == XA_OK
        assert values(db) == []
        resource.commit(xid)
    else:
        resource.commit(xid, one_phase=True)
    assert values(db) == ["a", "b"] and prepared_gids(db) == []
    assert conn.status == ext.STATUS_READY and conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE
    xid = new_xid()  # the session goes on
    resource.start(xid)
    insert(resource, "c")
    roll_back(resource, xid)
    assert values(db) == ["a", "b"]


@pytest.mark.parametrize("verb", ["commit", "rollback"])
def test_commit_or_rollback_on_the_connection_inside_a_branch_raises(resource, db, verb):
    conn = resource.connection
    xid = new_xid()
    resource.start(xid)
    insert(resource, "a")
    with pytest.raises(psycopg2.ProgrammingError, match="two-phase transaction"):
        getattr(conn, verb)()
    roll_back(resource, xid)
    assert values(db) == []


def _resource_isolated(db: str, level: str) -> PostgresXAResource:
    """A resource whose sessions run at ``level`` (psycopg2 sends it with its own BEGIN)."""
    def connect():
        conn = psycopg2.connect(db, connection_factory=LazyBeginConnection)
        conn.set_session(isolation_level=level)
        return conn

    return PostgresXAResource(connect, resource_name=level.lower().replace(" ", "-"))


def test_a_session_with_an_isolation_level_begins_as_psycopg2_does(db):
    r = _resource_isolated(db, "SERIALIZABLE")
    try:
        xid = new_xid()
        r.start(xid)
        with r.connection.cursor() as cur:
            cur.execute("SHOW transaction_isolation")
            assert cur.fetchone() == ("serializable",)
        assert begun_by_psycopg2(r.connection)
        insert(r, "a")
        r.end(xid, TMSUCCESS)
        r.commit(xid, one_phase=True)
    finally:
        r.close()
    assert values(db) == ["a"]


@pytest.mark.parametrize("setting", ["isolation_level", "readonly", "deferrable", "set_isolation_level"])
def test_a_session_setting_made_any_way_sends_the_branch_through_psycopg2s_begin(db, setting):
    """The connection keeps one flag for "psycopg2's BEGIN must carry the session settings"
    rather than reading them at every branch: each way of setting them must update it, and
    setting them back must clear it."""
    def connect():
        conn = psycopg2.connect(db, connection_factory=LazyBeginConnection)
        if setting == "set_isolation_level":
            conn.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_SERIALIZABLE)
        else:
            setattr(conn, setting, "SERIALIZABLE" if setting == "isolation_level" else True)
        return conn

    r = PostgresXAResource(connect, resource_name=f"set-{setting}")
    try:
        for value in ("a", "b"):
            xid = new_xid()
            r.start_unnamed(lambda xid=xid: xid)
            with r.connection.cursor() as cur:
                shown = {"readonly": "read_only"}.get(setting, setting)
                cur.execute("SHOW transaction_isolation" if "isolation" in setting
                            else f"SHOW transaction_{shown}")
                assert cur.fetchone()[0] in ("serializable", "on")
            assert begun_by_psycopg2(r.connection)
            if setting != "readonly":
                insert(r, value)
            r.end(xid, TMSUCCESS)
            r.commit(xid, one_phase=True)
        conn = r.connection
        if setting == "set_isolation_level":
            conn.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_DEFAULT)
        else:
            setattr(conn, setting, None)
        xid = new_xid()
        r.start(xid)
        insert(r, "c")
        assert not begun_by_psycopg2(r.connection), "back to the default: the BEGIN goes lazily"
        r.end(xid, TMSUCCESS)
        r.commit(xid, one_phase=True)
    finally:
        r.close()
    assert values(db) == (["c"] if setting == "readonly" else ["a", "b", "c"])


def test_a_plain_psycopg2_connection_still_works_with_its_own_begin(db):
    r = PostgresXAResource(lambda: psycopg2.connect(db), resource_name="plain")
    try:
        xid = new_xid()
        r.start(xid)
        insert(r, "a")
        assert begun_by_psycopg2(r.connection)
        r.end(xid, TMSUCCESS)
        assert r.prepare(xid) == XA_OK
        r.commit(xid)
    finally:
        r.close()
    assert values(db) == ["a"]


def test_the_connection_shows_no_autocommit_during_a_branch_and_keeps_it_from_being_set(resource, db):
    conn = resource.connection
    xid = new_xid()
    resource.start(xid)
    assert conn.autocommit is False  # as in psycopg2's two-phase mode, though its own flag is on
    insert(resource, "a")
    with pytest.raises(psycopg2.ProgrammingError, match="inside a transaction"):
        conn.autocommit = True
    with pytest.raises(psycopg2.ProgrammingError, match="inside a transaction"):
        conn.set_session(autocommit=True)
    insert(resource, "b")
    roll_back(resource, xid)
    assert values(db) == []
    conn.autocommit = True  # between branches it is the application's again
    assert conn.autocommit is True
    conn.autocommit = False


@pytest.mark.parametrize("how", ["new cursor", "kept cursor", "executemany", "with conn"])
def test_after_a_one_phase_commit_the_session_is_out_of_autocommit_for_what_runs_next(resource, db, how):
    """psycopg2's own autocommit flag stays on after a branch's one-phase COMMIT (setting it
    costs more than the rest of the commit, and the next branch wants it on): whatever runs
    outside a branch next still runs in a transaction of its own, as before."""
    conn = resource.connection
    xid = new_xid()
    resource.start(xid)
    kept = conn.cursor()
    kept.execute("INSERT INTO t (v) VALUES ('committed')")
    resource.end(xid, TMSUCCESS)
    resource.commit(xid, one_phase=True)
    assert conn.autocommit is False
    if how == "with conn":
        with pytest.raises(ZeroDivisionError), conn:
            with conn.cursor() as cur:
                cur.execute("INSERT INTO t (v) VALUES ('outside')")
            1 / 0  # noqa: B018 -- the with block fails: psycopg2 rolls its transaction back
    else:
        cur = kept if how == "kept cursor" else conn.cursor()
        if how == "executemany":
            cur.executemany("INSERT INTO t (v) VALUES (%s)", [("outside",)])
        else:
            cur.execute("INSERT INTO t (v) VALUES ('outside')")
        assert conn.info.transaction_status == ext.TRANSACTION_STATUS_INTRANS
        conn.rollback()
    assert values(db) == ["committed"]
    assert conn.autocommit is False and not conn.closed
    xid = new_xid()  # and the next branch begins lazily as ever
    resource.start(xid)
    insert(resource, "next")
    assert lazily_begun(conn)
    resource.end(xid, TMSUCCESS)
    resource.commit(xid, one_phase=True)
    assert values(db) == ["committed", "next"]


def test_with_conn_inside_a_branch_raises_as_in_psycopg2s_two_phase_mode(resource, db):
    conn = resource.connection
    xid = new_xid()
    resource.start(xid)
    with pytest.raises(psycopg2.ProgrammingError, match="two-phase transaction"), conn:
        insert(resource, "a")
    roll_back(resource, xid)
    assert values(db) == []


@pytest.fixture
def bare(db):
    conn = psycopg2.connect(db, connection_factory=LazyBeginConnection)
    yield conn
    conn.close()


def _insert(conn, value: str) -> None:
    with conn.cursor() as cur:
        cur.execute("INSERT INTO t (v) VALUES (%s)", (value,))


@pytest.mark.parametrize("first", [True, False], ids=["with-the-begin", "after-a-statement"])
def test_a_statement_and_the_commit_in_one_query_string(bare, db, first):
    bare.begin_branch(new_xid())
    if not first:
        _insert(bare, "a")
    assert bare.commit_branch_after("INSERT INTO t (v) VALUES (%s)", ("b",)) is True
    assert not bare.in_branch and not bare.autocommit
    assert bare.info.transaction_status == ext.TRANSACTION_STATUS_IDLE
    assert values(db) == (["b"] if first else ["a", "b"])


def test_a_failed_statement_before_the_commit_leaves_the_branch_to_roll_back(bare, db):
    bare.begin_branch(new_xid())
    _insert(bare, "a")
    with pytest.raises(psycopg2.errors.UndefinedTable):
        bare.commit_branch_after("INSERT INTO missing (v) VALUES (%s)", ("b",))
    assert bare.info.transaction_status == ext.TRANSACTION_STATUS_INERROR  # no COMMIT ran after it
    bare.rollback_branch()
    assert values(db) == [] and not bare.in_branch


def test_where_psycopg2_runs_the_branch_the_statement_and_commit_are_left_to_the_caller(db):
    r = _resource_isolated(db, "REPEATABLE READ")
    try:
        xid = new_xid()
        r.start(xid)
        insert(r, "a")
        assert r.connection.commit_branch_after("INSERT INTO t (v) VALUES (%s)", ("b",)) is False
        r.end(xid, TMSUCCESS)
        r.commit(xid, one_phase=True)
    finally:
        r.close()
    assert values(db) == ["a"]


def test_a_setting_made_after_a_one_phase_commit_still_sends_the_next_branch_through_psycopg2(resource, db):
    """After a one-phase COMMIT psycopg2's autocommit flag stays on (``_lagging``), and the next
    unnamed branch starts from there without asking the connection; a session setting made
    in between must still send that branch through psycopg2's BEGIN, which carries it."""
    for value, level in (("a", None), ("b", "SERIALIZABLE"), ("c", None)):
        conn = resource.connection
        conn.isolation_level = level
        xid = new_xid()
        resource.start_unnamed(lambda xid=xid: xid)
        with conn.cursor() as cur:
            cur.execute("SHOW transaction_isolation")
            assert cur.fetchone()[0] == ("serializable" if level else "read committed")
        assert begun_by_psycopg2(conn) == (level is not None)
        insert(resource, value)
        if level is None:
            assert resource.end_and_commit_one_phase(None)
        else:  # psycopg2's branch was named at its start: ended and committed apart
            resource.end(xid, TMSUCCESS)
            resource.commit(xid, one_phase=True)
        assert conn._lagging == (level is None), "a lazy branch's COMMIT leaves the flag on"
    assert values(db) == ["a", "b", "c"]
