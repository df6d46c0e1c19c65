"""The stores as XA resources, with the project's real transaction manager."""

from __future__ import annotations

import uuid

import psycopg2
import pytest

from txmanager import MemoryResource, RollbackError, TransactionManager
from txmanager.marks import CREATE_TABLE
from txmanager.xa import (
    TMFAIL, TMJOIN, TMNOFLAGS, TMSUCCESS, XA_OK, XA_RDONLY, XAER_DUPID, XAER_NOTA, XAER_PROTO,
    XAException,
)
from txmanager.xid import Xid
from tests.txmanager.conftest import log_records
from wsrm_plugin.store import InDoubtBranchesError, LockTimeoutError, StorageManager, StoreError, open_store
from wsrm_plugin.store.sqlite import SqliteStore

from .conftest import KINDS
from .test_managers import enqueue, new_rmd, new_rms, put


class Crash(BaseException):
    """Raised by a checkpoint: the process 'dies' there, nothing is cleaned up."""


@pytest.fixture
def tm(tmp_path):
    manager = TransactionManager(node="storetest", log=tmp_path / "tm.log", default_timeout=60)
    yield manager
    manager.close()


@pytest.fixture
def store_2pc(open_kind, store_url) -> StorageManager:
    """The store, prepared like any other branch: on PostgreSQL without commit marks (its
    default, which commits its branch last with the decision: see the marks test below)."""
    if store_url().startswith("postgresql"):
        return open_kind(lock_timeout=10.0, commit_marks=False)
    return open_kind(lock_timeout=10.0)


def visible(store: StorageManager) -> set[str]:
    """RMS keys committed so far, read without waiting for any lock."""
    return {s.key for s in store.status().rms}


def test_one_phase_commit_when_the_store_is_alone(store: StorageManager, tm) -> None:
    with tm.transaction() as gtx:
        with store.begin(xa=tm) as tx:
            new_rms(tx)
            enqueue(tx, n=2)
        assert visible(store) == set()  # not committed yet
        assert len(gtx.branches) == 1
    assert visible(store) == {"k1"}
    with store.begin() as tx:
        assert [m.number for m in tx.rms_messages.list_for("k1")] == [1, 2]
        assert tx.rms.get("k1").next_number == 3  # the numbers the branch handed out, written with it


def test_two_phase_commit_with_another_resource(store_2pc: StorageManager, tmp_path) -> None:
    store = store_2pc
    points: list[str] = []
    tm = TransactionManager(node="storetest", log=tmp_path / "tm2.log",
                            checkpoint=lambda p, i: points.append(f"{p}:{i}"))
    db = MemoryResource("app-db")
    try:
        with tm.transaction() as gtx:
            gtx.enlist_resource(db)
            db.put("order-1", "placed")
            with store.begin(xa=tm) as tx:
                new_rms(tx)
                enqueue(tx, n=1)
            with store.begin(xa=tm) as again:  # the same branch, joined
                assert again is tx
                enqueue(again, n=1)
        assert points[:4] == ["before_prepare:0", "prepared:0", "prepared:1", "before_log:0"]
        assert "logged:0" in points
        assert db.snapshot() == {"order-1": "placed"}
        with store.begin() as tx:
            assert [m.number for m in tx.rms_messages.list_for("k1")] == [1, 2]
            assert enqueue(tx, n=1)[0].number == 3
        assert store.xa_resource().recover() == []
    finally:
        tm.close()


def test_a_no_vote_rolls_the_store_back(store: StorageManager, tm) -> None:
    with store.begin() as tx:
        new_rms(tx)
        enqueue(tx, n=1)
    db = MemoryResource("app-db")
    db.vote_no = True
    with pytest.raises(RollbackError):
        with tm.transaction() as gtx:
            with store.begin(xa=tm) as tx:
                new_rmd(tx, "in-1")
                put(tx, "in-1", 1)
                enqueue(tx, n=2)
            gtx.enlist_resource(db)
            db.put("x", 1)
    with store.begin() as tx:  # nothing of the branch, and nothing left locked
        assert tx.rmd.get("in-1") is None and tx.invoker.count() == 0
        assert [m.number for m in tx.rms_messages.list_for("k1")] == [1]
        assert enqueue(tx, n=1)[0].number == 2


def test_an_error_inside_the_block_rolls_everything_back(store: StorageManager, tm) -> None:
    with pytest.raises(ValueError):
        with tm.transaction():
            with store.begin(xa=tm) as tx:
                new_rms(tx)
                raise ValueError("application failure")
    assert visible(store) == set()
    with store.begin() as tx:
        new_rms(tx)  # the key is free again


def test_branch_transactions_belong_to_the_manager(store: StorageManager, tm) -> None:
    with tm.transaction():
        tx = store.begin(xa=tm)
        new_rms(tx)
        with pytest.raises(StoreError, match="through the transaction manager"):
            tx.commit()
    assert visible(store) == {"k1"}


def test_without_a_current_transaction_the_store_works_locally(store: StorageManager, tm) -> None:
    with store.begin(xa=tm) as tx:
        new_rms(tx)
    assert visible(store) == {"k1"}
    with pytest.raises(TypeError, match="TransactionManager"):
        store.begin(xa=object())


def test_a_logged_decision_is_finished_by_recovery(store_2pc: StorageManager, tmp_path) -> None:
    """The TM 'dies' right after logging commit: recovery commits the store's branch."""
    store = store_2pc
    def crash(point: str, index: int) -> None:
        if point == "logged":
            raise Crash()

    tm = TransactionManager(node="storetest", log=tmp_path / "crash.log", checkpoint=crash)
    db = MemoryResource("app-db")
    gtx = tm.begin()
    gtx.enlist_resource(db)
    db.put("k", "v")
    with store.begin(xa=tm) as tx:
        new_rms(tx)
        enqueue(tx, n=1)
    with pytest.raises(Crash):
        tm.commit()
    prepared = store.xa_resource().recover()
    assert [x.gtrid for x in prepared] == [gtx.xid.gtrid]
    tm.close()

    again = TransactionManager(node="storetest", log=tmp_path / "crash.log")
    try:
        again.register_resource(store.xa_resource())
        again.register_resource(db)
        again.recovery.recover_once()
        assert store.xa_resource().recover() == []
        assert visible(store) == {"k1"}
        with store.begin() as tx:
            assert enqueue(tx, n=1)[0].number == 2
    finally:
        again.close()


# -- the XA verbs driven by hand (memory and SQLite implement them here) ----------------

OWN_XA = [KINDS[0], KINDS[1]]


def xid(n: int = 1) -> Xid:
    return Xid.new_global("storetest").branch(str(n))


@pytest.mark.parametrize("store_url", OWN_XA, indirect=True)
def test_prepare_then_commit_by_hand(store: StorageManager) -> None:
    xa = store.xa_resource()
    x = xid()
    xa.start(x, TMNOFLAGS)
    new_rms(xa.transaction_of(x))
    with pytest.raises(XAException) as dup:
        xa.start(x, TMNOFLAGS)
    assert dup.value.code == XAER_DUPID
    xa.end(x, TMSUCCESS)
    xa.start(x, TMJOIN)
    enqueue(xa.transaction_of(x), n=1)
    xa.end(x, TMSUCCESS)
    with pytest.raises(XAException) as unprepared:
        xa.commit(x, one_phase=False)
    assert unprepared.value.code == XAER_PROTO
    assert xa.prepare(x) == XA_OK
    assert xa.recover() == [x]
    assert visible(store) == ({"k1"} if isinstance(store, SqliteStore) else set())
    with pytest.raises(XAException) as one_phase:
        xa.commit(x, one_phase=True)
    assert one_phase.value.code == XAER_PROTO
    xa.commit(x, one_phase=False)
    assert xa.recover() == []
    assert visible(store) == {"k1"}
    with pytest.raises(XAException) as twice:
        xa.commit(x, one_phase=False)
    assert twice.value.code == XAER_NOTA


@pytest.mark.parametrize("store_url", OWN_XA, indirect=True)
def test_prepare_then_rollback_restores_every_row(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rmd(tx, "in-1")
        tx.rmd.record_received("in-1", 1)
        put(tx, "in-1", 1)
        new_rms(tx)
        enqueue(tx, n=2)
    before = store.status()
    xa = store.xa_resource()
    x = xid()
    xa.start(x)
    tx = xa.transaction_of(x)
    tx.rmd.record_received("in-1", 2)
    tx.rmd.update("in-1", closed=True)
    new_rmd(tx, "in-2")
    put(tx, "in-1", 2)
    tx.invoker.mark_delivered("in-1", 1)
    tx.rms_messages.record_send_attempt("k1", 1, next_send_at=5.0)
    tx.rms_messages.mark_acked("k1", [(1, 1)])
    tx.rms_messages.purge_acked()
    enqueue(tx, n=1)
    tx.rms.update("k1", started=True)
    xa.end(x)
    assert xa.prepare(x) == XA_OK
    xa.rollback(x)
    assert store.status() == before
    with store.begin() as tx:
        assert tx.rmd.get("in-2") is None
        assert tx.rmd.get("in-1").received.ranges == ((1, 1),) and not tx.rmd.get("in-1").closed
        assert tx.invoker.next_deliverable("in-1").number == 1
        msgs = tx.rms_messages.list_for("k1")
        assert [(m.number, m.send_count, m.acked) for m in msgs] == [(1, 0, False), (2, 0, False)]
        assert [m.payload for m in msgs] == [b"<env>0</env>", b"<env>1</env>"]  # purged, then restored
        assert enqueue(tx, n=1)[0].number == 3


@pytest.mark.parametrize("store_url", OWN_XA, indirect=True)
def test_read_only_and_failed_branches(store: StorageManager) -> None:
    xa = store.xa_resource()
    x = xid(1)
    xa.start(x)
    xa.transaction_of(x).rms.list_all()
    xa.end(x)
    assert xa.prepare(x) == XA_RDONLY
    assert xa.recover() == []

    y = xid(2)
    xa.start(y)
    new_rms(xa.transaction_of(y))
    xa.end(y, TMFAIL)
    with pytest.raises(XAException) as failed:
        xa.prepare(y)
    assert failed.value.is_rollback
    assert visible(store) == set()

    z = xid(3)
    xa.start(z)
    new_rms(xa.transaction_of(z))
    xa.end(z)
    xa.commit(z, one_phase=True)
    assert visible(store) == {"k1"}
    with pytest.raises(XAException) as unknown:
        xa.rollback(xid(4))
    assert unknown.value.code == XAER_NOTA


def test_a_prepared_branch_keeps_what_it_touched_locked(open_kind, tmp_path) -> None:
    store = open_kind(lock_timeout=0.3)
    with store.begin() as tx:
        new_rms(tx)
        new_rms(tx, "other")
    db = MemoryResource("app-db")
    seen: list[BaseException] = []

    def probe(point: str, index: int) -> None:
        if point == "before_log":  # every branch prepared, nothing decided yet
            try:
                with store.begin() as other:
                    enqueue(other, n=1)
            except LockTimeoutError as exc:
                seen.append(exc)

    tm = TransactionManager(node="storetest", log=tmp_path / "tm3.log", checkpoint=probe)
    with tm.transaction() as gtx:
        gtx.enlist_resource(db)
        db.put("a", 1)
        with store.begin(xa=tm) as tx:
            enqueue(tx, n=1)
    tm.close()
    assert len(seen) == 1
    if isinstance(store, SqliteStore):
        assert isinstance(seen[0], InDoubtBranchesError) and len(seen[0].xids) == 1
    with store.begin() as tx:
        assert enqueue(tx, n=1)[0].number == 2


def test_status_counts_prepared_branches(store: StorageManager) -> None:
    xa = store.xa_resource()
    x = xid()
    if not hasattr(xa, "transaction_of"):  # PostgreSQL: prepare a branch through its own resource
        from txmanager.postgres import PostgresXAResource
        assert isinstance(xa, PostgresXAResource)
        res = PostgresXAResource(store.dsn, resource_name="probe")
        res.start(x)
        with res.connection.cursor() as cur:
            cur.execute("INSERT INTO rmd_sequence (sequence_id, acks_to, rm_version, wsa_version, "
                        "created_at, last_activity) VALUES ('s', 'a', 'v', 'w', 0, 0)")
    else:
        res = xa
        res.start(x)
        new_rmd(res.transaction_of(x), "s")
    res.end(x)
    assert res.prepare(x) == XA_OK
    assert store.status().prepared_branches == 1
    xa.rollback(x)
    assert store.status().prepared_branches == 0
    if res is not xa:
        res.close()


@pytest.mark.postgres
@pytest.mark.parametrize("crash_at", [None, "before_log", "logged"])
def test_a_postgresql_store_with_commit_marks_carries_the_decision(fresh_db, tmp_path, crash_at) -> None:
    """``commit_marks`` (the default): the store's branch commits in one phase with the transaction's
    decision in its own database (txmanager.marks); the other branch is the only one
    prepared, the log writes no decision, and after a crash recovery reads the mark."""
    url = fresh_db if fresh_db.startswith("postgresql") else "postgresql:" + fresh_db
    store = open_store(url)  # commit marks are the PostgreSQL store's default
    points: list[str] = []

    def hook(point: str, index: int) -> None:
        points.append(f"{point}:{index}")
        if point == crash_at:
            raise Crash()

    tm = TransactionManager(node="storetest", log=tmp_path / "marks.log", checkpoint=hook)
    db = MemoryResource("app-db")
    try:
        gtx = tm.begin()
        gtx.enlist_resource(db)
        db.put("order-1", "placed")
        with store.begin(xa=tm) as tx:
            new_rms(tx)
            enqueue(tx, n=1)
        if crash_at is None:
            tm.commit()
            assert points == ["before_prepare:0", "prepared:0", "before_log:0", "logged:0",
                              "committed:0", "before_done:0"]
            assert db.snapshot() == {"order-1": "placed"} and visible(store) == {"k1"}
            assert not [r for r in log_records(tmp_path / "marks.log") if r["t"] == "commit"]
            return
        with pytest.raises(Crash):
            tm.commit()
        assert db.recover() != [], "the other branch is prepared, in doubt"
        for tx_ in list(store._enlisted.values()):  # the 'dead' process's store session
            tx_._resource.close()
        store._enlisted.clear()
        tm.close()

        tm = TransactionManager(node="storetest", log=tmp_path / "marks.log", safety_interval=0)
        tm.register_resource(store.xa_resource())
        tm.register_resource(db)
        report = tm.recovery.recover_once()
        assert not report.errors, report.summary()
        assert db.recover() == [] and store.xa_resource().recover() == []
        if crash_at == "logged":
            assert db.snapshot() == {"order-1": "placed"} and visible(store) == {"k1"}
        else:
            assert db.snapshot() == {} and visible(store) == set()
    finally:
        tm.close()
        store.close()


@pytest.mark.postgres
@pytest.mark.parametrize("table_there", [False, True])
def test_a_store_role_without_create_privilege_opens_an_existing_store(fresh_db, table_there, caplog) -> None:
    """A deployment's store role may only read and write the tables the schema's owner made.
    It opens the store; with the mark table there it keeps marks, without it it says so and
    prepares its branches like any other."""
    url = fresh_db if fresh_db.startswith("postgresql") else "postgresql:" + fresh_db
    open_store(url, commit_marks=False).close()  # the schema, made by its owner
    role = f"limited_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(fresh_db)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE ROLE {role} LOGIN")
        cur.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        cur.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        if table_there:
            cur.execute(CREATE_TABLE)
        cur.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
    admin.close()
    store = open_store(url + f" user={role}")
    try:
        assert (store._marks is not None) is table_there
        assert ("cannot create the commit-mark table" in caplog.text) is not table_there
        with store.begin() as tx:  # and it works
            new_rms(tx)
            enqueue(tx, n=1)
        assert visible(store) == {"k1"}
    finally:
        store.close()


@pytest.mark.postgres
@pytest.mark.parametrize("promote", [False, True])
def test_the_store_branch_first_in_one_database_stays_on_the_one_phase_path(fresh_db, tm, promote) -> None:
    """A delivery's transaction under XA in one database: the store's branch first (its
    ``begin(xa=tm)``), the application's INSERT through an XADataSource on the same database in
    that branch.  The transaction stays the lean one-phase object to its commit: the store's
    synchronization goes with its session (``_enlist_first``, a SoleSynchronization) and the data
    source joins the shared session without one of its own; the store's work before completion
    (its buffered statements) still runs before the COMMIT.  Promoted (a synchronization of
    another kind), the general path runs that work as well."""
    from txmanager.postgres import XADataSource
    from txmanager.transaction import AfterCompletion, Transaction, _OnePhase

    url = fresh_db if fresh_db.startswith("postgresql") else "postgresql:" + fresh_db
    dsn = url.split(":", 1)[1]
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE app_row (v text NOT NULL)")
    conn.close()
    store = open_store(url)
    ds = XADataSource(dsn, tm)
    seen: list[object] = []

    class Note(AfterCompletion):
        def after_completion(self, status: object) -> None:
            seen.append(status)

    try:
        with tm.transaction() as gtx:
            with store.begin(xa=tm) as tx:
                new_rms(tx)
                enqueue(tx, n=2)
                with ds.connection() as c, c.cursor() as cur:
                    cur.execute("INSERT INTO app_row VALUES ('placed')")
                assert type(gtx) is _OnePhase, "the store's branch and the shared session leave it lean"
                assert gtx.branch_count == 1 and type(gtx) is _OnePhase
            if promote:
                gtx.register_synchronization(Note())
                assert type(gtx) is Transaction
            assert visible(store) == set()
        assert type(gtx) is (Transaction if promote else _OnePhase)
        assert seen == ([gtx.status] if promote else [])
        assert visible(store) == {"k1"}
        with store.begin() as tx:
            assert [m.number for m in tx.rms_messages.list_for("k1")] == [1, 2]
        conn = psycopg2.connect(dsn)
        with conn, conn.cursor() as cur:
            cur.execute("SELECT v FROM app_row")
            assert cur.fetchall() == [("placed",)]
        conn.close()
        assert not store._enlisted and not ds._enlisted, "both gave their session back"
        with pytest.raises(RollbackError):  # a failure in the block still rolls both back
            with tm.transaction() as gtx:
                with store.begin(xa=tm) as tx:
                    tx.rms.get("k1")
                    with ds.connection() as c, c.cursor() as cur:
                        cur.execute("INSERT INTO app_row VALUES ('doomed')")
                    gtx.set_rollback_only()
        assert not store._enlisted
        conn = psycopg2.connect(dsn)
        with conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM app_row")
            assert cur.fetchone() == (1,)
        conn.close()
    finally:
        ds.close()
        store.close()
