"""PostgresXAResource driven directly with XA calls, against a real server."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psycopg2
import psycopg2.extensions
import pytest

from tests.conftest import start_throwaway_server
from txmanager.lazy_begin import psycopg_xid as _psycopg_xid
from txmanager.postgres import PostgresXAResource, default_resource_name
from txmanager.xa import (
    TMENDRSCAN, TMFAIL, TMJOIN, TMNOFLAGS, TMRESUME, TMSTARTRSCAN, TMSUCCESS, TMSUSPEND, XA_OK,
    XA_RBCOMMFAIL, XA_RBINTEGRITY, XA_RBROLLBACK, XA_RDONLY, XAER_DUPID, XAER_INVAL, XAER_NOTA,
    XAER_OUTSIDE, XAER_PROTO, XAER_RMFAIL, XAException,
)
from txmanager.xid import FORMAT_ID, Xid

from tests.postgres.support import prepared_gids, run, values

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("one_phase_path")]


@pytest.fixture
def db(fresh_db):
    run(fresh_db, "CREATE TABLE t (id serial PRIMARY KEY, v text NOT NULL)")
    return fresh_db


@pytest.fixture
def resources(db):
    made: list[PostgresXAResource] = []

    def make(dsn: str = db, **kwargs) -> PostgresXAResource:
        r = PostgresXAResource(dsn, **kwargs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def new_xid(bqual: str = "0") -> Xid:
    return Xid.new_global("pgtest").branch(bqual)


def insert(r: PostgresXAResource, value: str) -> None:
    with r.connection.cursor() as cur:
        cur.execute("INSERT INTO t (v) VALUES (%s)", (value,))


def prepared_branch(r: PostgresXAResource, value: str) -> Xid:
    xid = new_xid()
    r.start(xid)
    insert(r, value)
    r.end(xid, TMSUCCESS)
    assert r.prepare(xid) == XA_OK
    return xid


def xa_code(excinfo) -> int:
    return excinfo.value.code


# -- the protocol -----------------------------------------------------------------


def test_two_phase_commit(db, resources):
    r = resources()
    xid = prepared_branch(r, "two-phase")
    assert prepared_gids(db) == [xid.to_pg_gid()]
    assert values(db) == [], "prepared work is not visible yet"
    r.commit(xid, one_phase=False)
    assert values(db) == ["two-phase"]
    assert prepared_gids(db) == []
    assert not r.in_branch


@pytest.mark.parametrize("xid,as_object", [
    (Xid(FORMAT_ID, b"pgtest|printable ~ ascii", b"0"), True),
    (Xid(FORMAT_ID, b"pgtest|\x00\xff\x7f binary", b"\x01\n"), False),
    (Xid(7, "pgtest|caf\u00e9", "\u00e9"), False),
], ids=["printable", "binary", "utf-8"])
def test_any_xid_prepares_under_its_documented_gid(db, resources, xid, as_object):
    """Printable ASCII xids reach psycopg2 as its Xid object (no gid parsing),
    others as their gid string; the server sees the same gid either way."""
    handed = _psycopg_xid(xid)
    assert isinstance(handed, psycopg2.extensions.Xid) is as_object
    assert str(handed) == xid.to_pg_gid()
    r = resources()
    r.start(xid)
    insert(r, "any")
    r.end(xid, TMSUCCESS)
    assert r.prepare(xid) == XA_OK
    assert prepared_gids(db) == [xid.to_pg_gid()]
    assert xid in resources().recover()
    r.commit(xid)
    assert prepared_gids(db) == [] and values(db) == ["any"]


def test_one_phase_commit_skips_prepare(db, resources):
    r = resources()
    xid = new_xid()
    r.start(xid)
    insert(r, "one-phase")
    r.end(xid, TMSUCCESS)
    r.commit(xid, one_phase=True)
    assert values(db) == ["one-phase"]
    assert prepared_gids(db) == []


def test_rollback_of_a_prepared_branch(db, resources):
    r = resources()
    xid = prepared_branch(r, "undone")
    r.rollback(xid)
    assert values(db) == [] and prepared_gids(db) == []


def test_rollback_of_an_ended_and_of_an_active_branch(db, resources):
    r = resources()
    for end_first in (True, False):
        xid = new_xid()
        r.start(xid)
        insert(r, "undone")
        if end_first:
            r.end(xid, TMSUCCESS)
        r.rollback(xid)
        assert not r.in_branch
    assert values(db) == []


def test_the_session_serves_one_branch_after_another(db, resources):
    r = resources()
    for i in range(3):
        r.commit(prepared_branch(r, f"v{i}"))
    assert values(db) == ["v0", "v1", "v2"]


def test_join_and_suspend_resume_keep_one_branch(db, resources):
    r = resources()
    xid = new_xid()
    r.start(xid)
    insert(r, "a")
    r.end(xid, TMSUSPEND)
    r.start(xid, TMRESUME)
    insert(r, "b")
    r.end(xid, TMSUCCESS)
    r.start(xid, TMJOIN)
    insert(r, "c")
    r.end(xid, TMSUCCESS)
    assert r.prepare(xid) == XA_OK
    assert prepared_gids(db) == [xid.to_pg_gid()], "one branch, one prepared transaction"
    r.commit(xid)
    assert values(db) == ["a", "b", "c"]


def test_end_with_tmfail_makes_the_branch_roll_back(db, resources):
    r = resources()
    xid = new_xid()
    r.start(xid)
    insert(r, "failed work")
    r.end(xid, TMFAIL)
    with pytest.raises(XAException) as e:
        r.start(xid, TMJOIN)
    assert xa_code(e) == XA_RBROLLBACK
    with pytest.raises(XAException) as e:
        r.prepare(xid)
    assert xa_code(e) == XA_RBROLLBACK and e.value.is_rollback
    r.rollback(xid)  # what the transaction manager does next: quietly fine
    assert values(db) == [] and prepared_gids(db) == []


def test_a_failed_statement_makes_end_vote_rollback(db, resources):
    r = resources()
    xid = new_xid()
    r.start(xid)
    insert(r, "lost with the branch")
    with pytest.raises(psycopg2.errors.NotNullViolation):
        with r.connection.cursor() as cur:
            cur.execute("INSERT INTO t (v) VALUES (NULL)")
    with pytest.raises(XAException) as e:
        r.end(xid, TMSUCCESS)
    assert xa_code(e) == XA_RBROLLBACK
    # PREPARE TRANSACTION would silently roll back here; the resource says so instead.
    with pytest.raises(XAException) as e:
        r.prepare(xid)
    assert xa_code(e) == XA_RBROLLBACK
    r.rollback(xid)
    assert values(db) == [] and prepared_gids(db) == []
    r.commit(prepared_branch(r, "the session is usable again"))
    assert values(db) == ["the session is usable again"]


def test_a_deferred_constraint_failing_at_prepare_votes_rbintegrity(db, resources):
    run(db, "CREATE TABLE parent (id int PRIMARY KEY)")
    run(db, "CREATE TABLE child (parent int REFERENCES parent DEFERRABLE INITIALLY DEFERRED)")
    r = resources()
    xid = new_xid()
    r.start(xid)
    with r.connection.cursor() as cur:
        cur.execute("INSERT INTO child VALUES (42)")  # checked only at PREPARE
    r.end(xid, TMSUCCESS)
    with pytest.raises(XAException) as e:
        r.prepare(xid)
    assert xa_code(e) == XA_RBINTEGRITY
    assert "child" in str(e.value)
    assert prepared_gids(db) == []
    r.rollback(xid)
    assert run(db, "SELECT count(*) FROM child") == [(0,)]


def test_a_read_only_branch_votes_rdonly_and_needs_no_phase_two(db, resources):
    run(db, "INSERT INTO t (v) VALUES ('existing')")
    r = resources(read_only_check=True)
    xid = new_xid()
    r.start(xid)
    with r.connection.cursor() as cur:
        cur.execute("SELECT v FROM t")
        assert cur.fetchall() == [("existing",)]
    r.end(xid, TMSUCCESS)
    assert r.prepare(xid) == XA_RDONLY
    assert prepared_gids(db) == [] and not r.in_branch
    with pytest.raises(XAException) as e:
        r.commit(xid)
    assert xa_code(e) == XAER_NOTA


def test_without_the_read_only_check_every_branch_that_ran_a_statement_is_prepared(db, resources):
    r = resources()
    xid = new_xid()
    r.start(xid)
    with r.connection.cursor() as cur:
        cur.execute("SELECT v FROM t")
    r.end(xid, TMSUCCESS)
    assert r.prepare(xid) == XA_OK
    assert prepared_gids(db) == [xid.to_pg_gid()]
    r.commit(xid)
    assert prepared_gids(db) == []


def test_a_row_lock_makes_the_branch_not_read_only(db, resources):
    run(db, "INSERT INTO t (v) VALUES ('locked')")
    r = resources(read_only_check=True)
    xid = new_xid()
    r.start(xid)
    with r.connection.cursor() as cur:
        cur.execute("SELECT v FROM t FOR UPDATE")
    r.end(xid, TMSUCCESS)
    assert r.prepare(xid) == XA_OK, "the lock must be held until phase 2"
    r.rollback(xid)


# -- protocol misuse -------------------------------------------------------------------


def test_protocol_errors_have_their_xa_codes(db, resources):
    r = resources()
    xid, other = new_xid(), new_xid()
    with pytest.raises(XAException) as e:
        r.end(xid, TMSUCCESS)
    assert xa_code(e) == XAER_NOTA
    with pytest.raises(XAException) as e:
        r.start(xid, 0x1234)
    assert xa_code(e) == XAER_INVAL
    r.start(xid)
    with pytest.raises(XAException) as e:
        r.start(xid)
    assert xa_code(e) == XAER_DUPID
    with pytest.raises(XAException) as e:
        r.start(other)
    assert xa_code(e) == XAER_PROTO and "one transaction at a time" in str(e.value)
    with pytest.raises(XAException) as e:
        r.prepare(xid)
    assert xa_code(e) == XAER_PROTO, "prepare before end"
    with pytest.raises(XAException) as e:
        r.start(xid, TMRESUME)
    assert xa_code(e) == XAER_PROTO, "resume of a branch that is not suspended"
    with pytest.raises(XAException) as e:
        r.end(xid, TMJOIN)
    assert xa_code(e) == XAER_INVAL
    insert(r, "x")
    r.end(xid, TMSUCCESS)
    with pytest.raises(XAException) as e:
        r.commit(xid, one_phase=False)
    assert xa_code(e) == XAER_PROTO, "two-phase commit of a branch never prepared"
    assert r.prepare(xid) == XA_OK
    with pytest.raises(XAException) as e:
        r.commit(xid, one_phase=True)
    assert xa_code(e) == XAER_PROTO, "one-phase commit of a prepared branch"
    r.commit(xid)
    assert values(db) == ["x"]


def test_sql_outside_a_branch_must_be_finished_before_start(db, resources):
    r = resources()
    insert(r, "local")  # a local transaction, left open
    with pytest.raises(XAException) as e:
        r.start(new_xid())
    assert xa_code(e) == XAER_OUTSIDE
    r.connection.rollback()
    r.commit(prepared_branch(r, "global"))
    assert values(db) == ["global"]


def test_commit_and_rollback_of_an_unknown_xid_are_nota(db, resources):
    r = resources()
    for call in (lambda x: r.commit(x), lambda x: r.rollback(x), lambda x: r.commit(x, one_phase=True)):
        with pytest.raises(XAException) as e:
            call(new_xid())
        assert xa_code(e) == XAER_NOTA


def test_a_second_commit_is_nota(db, resources):
    r = resources()
    xid = prepared_branch(r, "once")
    r.commit(xid)
    with pytest.raises(XAException) as e:
        r.commit(xid)
    assert xa_code(e) == XAER_NOTA
    with pytest.raises(XAException) as e:
        resources().commit(xid)  # from another session too
    assert xa_code(e) == XAER_NOTA
    assert values(db) == ["once"]


def test_forget_has_nothing_to_forget(resources):
    with pytest.raises(XAException) as e:
        resources().forget(new_xid())
    assert xa_code(e) == XAER_NOTA


# -- recovery ---------------------------------------------------------------------------


def test_recover_lists_the_branches_of_this_database_only(pg_dsn_factory, resources):
    db1, db2 = pg_dsn_factory("rec1"), pg_dsn_factory("rec2")
    for dsn in (db1, db2):
        run(dsn, "CREATE TABLE t (id serial PRIMARY KEY, v text NOT NULL)")
    r1 = resources(db1)
    xid = prepared_branch(r1, "in db1")
    assert resources(db2).recover() == [], "db2 sees nothing of db1"
    fresh = resources(db1)
    assert fresh.recover() == [xid]
    assert fresh.recover(TMSTARTRSCAN) == [xid]
    assert fresh.recover(TMNOFLAGS) == [], "everything came with the first call of the scan"
    assert fresh.recover(TMENDRSCAN) == []
    with pytest.raises(XAException) as e:
        fresh.recover(TMNOFLAGS)
    assert xa_code(e) == XAER_PROTO, "no scan open"
    with pytest.raises(XAException) as e:
        resources(db2).commit(xid)
    assert xa_code(e) == XAER_NOTA, "db2's resource cannot reach db1's branch"
    fresh.commit(xid)
    assert values(db1) == ["in db1"]
    assert fresh.recover() == []


def test_prepared_age_comes_from_the_server(db, resources):
    r = resources()
    xid = prepared_branch(r, "aged")
    age = resources().prepared_age(xid)
    assert age is not None and age >= 0.0
    assert resources().prepared_age(new_xid()) is None
    r.rollback(xid)
    assert resources().prepared_age(xid) is None


def test_plain_gids_are_not_listed_and_foreign_formats_are_not_ours(db, resources):
    conn = psycopg2.connect(db)
    try:
        conn.tpc_begin("someone-elses-plain-gid")
        with conn.cursor() as cur:
            cur.execute("INSERT INTO t (v) VALUES ('plain')")
        conn.tpc_prepare()
    finally:
        conn.close()
    conn = psycopg2.connect(db)
    try:
        conn.tpc_begin(conn.xid(42, "java-tm-gtrid", "branch"))  # another TM's XA branch
        conn.tpc_prepare()
    finally:
        conn.close()
    r = resources()
    mine = prepared_branch(r, "mine")
    recovered = resources().recover()
    assert "someone-elses-plain-gid" in prepared_gids(db)
    assert sorted(x.format_id for x in recovered) == sorted([42, FORMAT_ID])
    foreign = next(x for x in recovered if x.format_id == 42)
    assert foreign == Xid(42, b"java-tm-gtrid", b"branch") and not foreign.is_ours()
    assert [x for x in recovered if x.is_ours("pgtest")] == [mine]
    r.commit(mine)


def test_commit_from_a_fresh_process_of_an_xid_prepared_elsewhere(db, resources):
    script = textwrap.dedent(
        """
        import os, sys
        from txmanager.postgres import PostgresXAResource
        from txmanager.xa import TMSUCCESS
        from txmanager.xid import Xid
        r = PostgresXAResource(sys.argv[1])
        xid = Xid.new_global("pgtest").branch("p")
        r.start(xid)
        with r.connection.cursor() as cur:
            cur.execute("INSERT INTO t (v) VALUES ('from another process')")
        r.end(xid, TMSUCCESS)
        assert r.prepare(xid) == 0
        print(xid.to_text(), flush=True)
        os._exit(0)  # no commit, no clean close: the branch stays in doubt
        """
    )
    out = subprocess.run([sys.executable, "-c", script, db], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    xid = Xid.from_text(out.stdout.strip())
    assert values(db) == []
    r = resources()
    assert r.recover() == [xid]
    r.commit(xid)
    assert values(db) == ["from another process"]
    assert r.recover() == []


# -- failures ------------------------------------------------------------------------------


def terminate_session(dsn: str, r: PostgresXAResource) -> None:
    run(dsn, "SELECT pg_terminate_backend(%s, 10000)", (r.connection.get_backend_pid(),))


def test_a_killed_session_met_before_prepare_votes_rbcommfail(db, resources):
    r = resources(read_only_check=True)  # its query meets the dead session, before any PREPARE
    xid = new_xid()
    r.start(xid)
    insert(r, "dies with the session")
    r.end(xid, TMSUCCESS)
    terminate_session(db, r)
    with pytest.raises(XAException) as e:
        r.prepare(xid)
    assert xa_code(e) == XA_RBCOMMFAIL and e.value.is_rollback
    r.rollback(xid)
    assert values(db) == [] and prepared_gids(db) == []
    r.commit(prepared_branch(r, "a new session"))
    assert values(db) == ["a new session"]


def test_a_connection_lost_during_prepare_is_rmfail_and_rollback_cleans_up(db, resources):
    r = resources()  # PREPARE is the statement that meets the dead session
    xid = new_xid()
    r.start(xid)
    insert(r, "in doubt")
    r.end(xid, TMSUCCESS)
    terminate_session(db, r)
    with pytest.raises(XAException) as e:
        r.prepare(xid)
    assert xa_code(e) == XAER_RMFAIL and "may be prepared" in str(e.value)
    r.rollback(xid)
    assert values(db) == [] and prepared_gids(db) == []


def test_a_lost_session_at_end_is_rbcommfail(db, resources):
    r = resources()
    xid = new_xid()
    r.start(xid)
    terminate_session(db, r)
    with pytest.raises(psycopg2.OperationalError):
        insert(r, "never")
    with pytest.raises(XAException) as e:
        r.end(xid, TMSUCCESS)
    assert xa_code(e) == XA_RBCOMMFAIL
    r.rollback(xid)


def test_server_down_is_rmfail_and_phase_two_works_after_restart():
    pg = start_throwaway_server()
    try:
        dsn = pg.create_database("crashdb")
        run(dsn, "CREATE TABLE t (id serial PRIMARY KEY, v text NOT NULL)")
        r = PostgresXAResource(dsn)
        recovery = PostgresXAResource(dsn)
        assert recovery.recover() == []  # opens its control connection before the crash
        xid = prepared_branch(r, "survives")
        pg.kill()
        with pytest.raises(XAException) as e:
            r.commit(xid)
        assert xa_code(e) == XAER_RMFAIL
        with pytest.raises(XAException) as e:
            recovery.recover()
        assert xa_code(e) == XAER_RMFAIL
        pg.start()
        assert recovery.recover() == [xid], "a stale control connection is replaced"
        assert recovery.prepared_age(xid) >= 0
        r.commit(xid)  # the retry the transaction manager makes
        assert values(dsn) == ["survives"]
        r.close()
        recovery.close()
    finally:
        pg.close()


# -- identity -------------------------------------------------------------------------------


def test_is_same_rm_only_for_the_same_session(db, resources):
    a, b = resources(), resources()
    assert a.is_same_rm(a)
    assert not a.is_same_rm(b), "a PostgreSQL transaction cannot span two sessions"
    assert a.resource_name == b.resource_name == default_resource_name(db)
    assert a.resource_name.startswith("pg:t_")
    assert a.set_transaction_timeout(30) is False and a.get_transaction_timeout() == 0


def test_a_connection_factory_needs_a_resource_name(db):
    with pytest.raises(TypeError, match="resource_name is required"):
        PostgresXAResource(lambda: psycopg2.connect(db))
    r = PostgresXAResource(lambda: psycopg2.connect(db), resource_name="orders")
    try:
        r.commit(prepared_branch(r, "via factory"))
        assert values(db) == ["via factory"]
    finally:
        r.close()
