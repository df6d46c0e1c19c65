"""Commit marks (txmanager.marks): the decision of a two-database transaction kept in one
participant's database instead of the recovery log, against real PostgreSQL databases.

Crashes are simulated in-process here (a checkpoint raising a BaseException, then the
"dead" process's sessions closed); tests/integration/test_bank_crashes.py kills real
processes with SIGKILL at the same points and at random instants.
"""

from __future__ import annotations

import psycopg2
import pytest

from tests.txmanager.conftest import log_records
from txmanager import RollbackError, TransactionManager
from txmanager.log import commit_record, parse_mark_record
from txmanager.marks import TABLE, gxid_of
from txmanager.marks import key as marks_key
from txmanager.postgres import LazyBeginConnection, XADataSource
from txmanager.xid import Xid

from .support import two_sources
from .test_datasource import Crash, insert, prepared_gids, run, values

pytestmark = pytest.mark.postgres


def marks(dsn: str) -> list[str]:
    return [g for (g,) in run(dsn, f"SELECT gtrid FROM {TABLE}")]


def transfer(tm, a, b, n: int) -> None:
    with tm.transaction():
        with a.connection() as ca:
            insert(ca, f"debit-{n}")
        with b.connection() as cb:
            insert(cb, f"credit-{n}")


def crash_in_the_second_transfer(dbs, log, point: str) -> None:
    """Transfer 0 commits (the log notes b as a keeper of marks), transfer 1 "dies" at
    ``point``: nothing is cleaned up, and the dead process's sessions close."""
    armed = {"on": False}

    def hook(p: str, i: int) -> None:
        if p == point and armed["on"]:
            raise Crash(p)

    tm1 = TransactionManager(node="crashy", log=log, checkpoint=hook)
    a1 = XADataSource(dbs[0], tm1, resource_name="a")
    b1 = XADataSource(dbs[1], tm1, resource_name="b", commit_marks=True)
    transfer(tm1, a1, b1, 0)
    armed["on"] = True
    with pytest.raises(Crash):
        transfer(tm1, a1, b1, 1)
    die(a1, b1)
    tm1.close()


def die(*sources: XADataSource) -> None:
    """What SIGKILL does to the data sources: every session closes, prepared branches stay."""
    for ds in sources:
        for _tx, resource in list(ds._enlisted.values()):
            resource.close()
        ds._marks = None  # a dead process deletes no marks on its way out
        ds.close()



def _restart_commits_both(dbs, log_path) -> None:
    """A restart's recovery (node "crashy") of the transaction left prepared in "a" with its mark
    in "b": both committed, nothing prepared and no mark left."""
    tm2 = TransactionManager(node="crashy", log=log_path, safety_interval=0)
    a2 = XADataSource(dbs[0], tm2, resource_name="a")
    b2 = XADataSource(dbs[1], tm2, resource_name="b")
    try:
        report = tm2.recovery.recover_once()
        assert not report.errors, report.summary()
        assert values(dbs[0]) == ["debit-0", "debit-1"] and values(dbs[1]) == ["credit-0", "credit-1"]
        assert prepared_gids(dbs[0]) == [] and marks(dbs[1]) == []
    finally:
        a2.close()
        b2.close()
        tm2.close()

def test_the_mark_decides_and_the_log_writes_no_decision(dbs, tmp_path):
    points: list[tuple[str, int]] = []
    with two_sources(dbs, tmp_path / "tx.log", node="marks",
                     checkpoint=lambda p, i: points.append((p, i))) as (tm, a, b):
        for n in range(3):
            transfer(tm, a, b, n)
        assert values(dbs[0]) == [f"debit-{n}" for n in range(3)]
        assert values(dbs[1]) == [f"credit-{n}" for n in range(3)]
        assert prepared_gids(dbs[0]) == prepared_gids(dbs[1]) == []
        # only a's branch is prepared: b commits in one phase, with the mark
        assert [p for p in points if p[0] == "prepared"] == [("prepared", 0)] * 3
        # each mark is deleted by the next one's insert; the last waits for close()
        assert len(marks(dbs[1])) == 1
        records = log_records(tmp_path / "tx.log", meta=True)
        assert not [r for r in records if r["t"] in ("commit", "done")], records
        assert [r for r in records if r["t"] == "marks"] == [{"t": "marks", "db": b.database}]
    assert marks(dbs[1]) == []


# (kill point, is the transfer committed after recovery?)
POINTS = [("prepared", False), ("before_log", False), ("logged", True), ("committed", True),
          ("before_done", True)]


@pytest.mark.parametrize("point,committed", POINTS, ids=[p for p, _ in POINTS])
def test_a_crash_at_each_point_is_finished_alike_on_both_databases(dbs, tmp_path, point, committed):
    log_path = tmp_path / "crash.log"
    crash_in_the_second_transfer(dbs, log_path, point)

    tm2 = TransactionManager(node="crashy", log=log_path, safety_interval=0)
    a2 = XADataSource(dbs[0], tm2, resource_name="a")
    b2 = XADataSource(dbs[1], tm2, resource_name="b")  # reading marks needs no commit_marks
    try:
        report = tm2.recovery.recover_once()
        assert not report.errors, report.summary()
        want_a = ["debit-0", "debit-1"] if committed else ["debit-0"]
        want_b = ["credit-0", "credit-1"] if committed else ["credit-0"]
        assert values(dbs[0]) == want_a and values(dbs[1]) == want_b
        assert prepared_gids(dbs[0]) == prepared_gids(dbs[1]) == []
        assert marks(dbs[1]) == [], "recovery deletes the marks it carried out, and leftovers"
        assert not tm2.recovery.recover_once().acted, "a second pass finds nothing to do"
    finally:
        a2.close()
        b2.close()
        tm2.close()


def test_a_mark_keeps_only_what_its_row_does_not_say_and_an_older_whole_record_still_decides(dbs, tmp_path):
    """The mark's record names its branches by their qualifiers and repeats neither the
    transaction's gid nor a record type (``mark_record``); a mark written by an earlier version,
    with the log's whole commit record, decides its transaction all the same."""
    log_path = tmp_path / "crash.log"
    crash_in_the_second_transfer(dbs, log_path, "logged")  # the mark committed, a's branch prepared
    [(gtrid, node, record)] = run(dbs[1], f"SELECT gtrid, node, record FROM {TABLE}")
    [prepared] = prepared_gids(dbs[0])
    assert gtrid not in record and '"t"' not in record, record
    entry = parse_mark_record(gtrid, record, node)
    gid = entry.gxid.to_pg_gid()
    assert prepared.startswith(gid) and f'"+{prepared[len(gid):]}"' in record, record
    assert [(x.to_pg_gid(), name) for x, name in entry.branches] == [(prepared, "a")]
    run(dbs[1], f"UPDATE {TABLE} SET record = %s", (commit_record(entry.gxid, entry.branches, entry.logged_at),))

    _restart_commits_both(dbs, log_path)


@pytest.mark.parametrize("point,committed", [("prepared", False), ("logged", True)])
def test_no_branch_is_presumed_aborted_before_the_marks_are_read(dbs, tmp_path, point, committed):
    """After a crash at "logged" the only record of the commit is b's mark: a recovery
    that did not ask b would roll a's branch back and break atomicity.  The log says b
    keeps marks, so recovery waits, and says why, until b is registered.  (Before a
    database's first mark, the log notes it; a crash before that note leaves no mark
    anywhere, and presumed abort is right.)"""
    log_path = tmp_path / "crash.log"

    crash_in_the_second_transfer(dbs, log_path, point)

    tm2 = TransactionManager(node="crashy", log=log_path, safety_interval=0)
    a2 = XADataSource(dbs[0], tm2, resource_name="a")
    try:
        report = tm2.recovery.recover_once()
        assert len(report.waiting) == 1 and not report.rolled_back and not report.committed
        assert any("commit marks" in e and "register" in e for e in report.errors), report.errors
        assert len(prepared_gids(dbs[0])) == 1, "a's branch stays prepared"
        b2 = XADataSource(dbs[1], tm2, resource_name="b")  # registering it runs a pass at once
        report = tm2.recovery.recover_once()
        assert not report.errors and not report.waiting, report.summary()
        assert prepared_gids(dbs[0]) == []
        assert values(dbs[0]) == (["debit-0", "debit-1"] if committed else ["debit-0"])
        assert values(dbs[1]) == (["credit-0", "credit-1"] if committed else ["credit-0"])
        b2.close()
    finally:
        a2.close()
        tm2.close()


def test_a_mark_that_cannot_be_written_rolls_every_branch_back(dbs, tmp_path):
    with two_sources(dbs, tmp_path / "tx.log", node="marks") as (tm, a, b):
        transfer(tm, a, b, 0)
        run(dbs[1], f"DROP TABLE {TABLE}")  # behind the data source's back
        with pytest.raises(RollbackError):
            transfer(tm, a, b, 1)
        assert values(dbs[0]) == ["debit-0"] and values(dbs[1]) == ["credit-0"]
        assert prepared_gids(dbs[0]) == prepared_gids(dbs[1]) == []
        assert tm.get_transaction() is None


def test_a_read_only_other_branch_leaves_the_holder_a_plain_one_phase_commit(dbs, tmp_path):
    tm = TransactionManager(node="marks", log=tmp_path / "tx.log")
    a = XADataSource(dbs[0], tm, resource_name="a", read_only_check=True)
    b = XADataSource(dbs[1], tm, resource_name="b", commit_marks=True)
    try:
        with tm.transaction():
            with a.connection() as ca, ca.cursor() as cur:
                cur.execute("SELECT count(*) FROM t")
            with b.connection() as cb:
                insert(cb, "alone")
        assert values(dbs[1]) == ["alone"]
        assert marks(dbs[1]) == [], "no other branch prepared: nothing to mark"
    finally:
        a.close()
        b.close()
        tm.close()


def test_a_manager_without_a_durable_log_still_finds_the_marks_of_registered_databases(dbs):
    """With log=None the decision of a marked transaction is still durable: it is in b.
    Recovery reads the marks of every registered database, named in a log or not."""
    crash_in_the_second_transfer(dbs, None, "logged")

    tm2 = TransactionManager(node="crashy", log=None, safety_interval=0)
    a2 = XADataSource(dbs[0], tm2, resource_name="a")
    b2 = XADataSource(dbs[1], tm2, resource_name="b")
    try:
        tm2.recovery.recover_once()
        assert values(dbs[0]) == ["debit-0", "debit-1"] and values(dbs[1]) == ["credit-0", "credit-1"]
        assert prepared_gids(dbs[0]) == [] and marks(dbs[1]) == []
    finally:
        a2.close()
        b2.close()
        tm2.close()


class LosingConnection(psycopg2.extensions.connection):
    """A session whose answer to the next COMMIT is lost: after the commit ("after") or
    before it reached the server ("before"), the connection drops."""

    lose: str | None = None

    def tpc_commit(self, *args):
        lose, LosingConnection.lose = LosingConnection.lose, None
        if lose == "after":
            super().tpc_commit(*args)
        if lose is not None:
            self.close()
            raise psycopg2.OperationalError("server closed the connection unexpectedly")
        return super().tpc_commit(*args)


class LosingLazyConnection(LazyBeginConnection):
    """The same, where the mark and the COMMIT go in one query string (txmanager.lazy_begin)."""

    def commit_branch_after(self, statement, params):
        lose, LosingConnection.lose = LosingConnection.lose, None
        if lose == "after":
            assert super().commit_branch_after(statement, params)
        if lose is not None:
            self.close()
            raise psycopg2.OperationalError("server closed the connection unexpectedly")
        return super().commit_branch_after(statement, params)


class LosingDataSource(XADataSource):
    connection_class: type = LosingConnection

    def _connect(self):
        conn = psycopg2.connect(self.dsn, connection_factory=self.connection_class)
        if self._marks is not None and not self._mark_table_ready:
            from txmanager.postgres import create_mark_table
            create_mark_table(conn)
            self._mark_table_ready = True
        self.identity = None  # never shared with the other data source's session
        return conn


@pytest.mark.parametrize("connection_class", [LosingConnection, LosingLazyConnection],
                         ids=["mark-then-commit", "mark-and-commit-in-one"])
@pytest.mark.parametrize("lose,committed", [("after", True), ("before", False)])
def test_a_lost_answer_to_the_marked_commit_is_settled_by_the_mark(dbs, tmp_path, lose, committed,
                                                                   connection_class):
    """The connection drops during the holder's COMMIT: once its backend is gone, the mark
    says whether it committed, and the transaction ends that way at once, on both databases,
    instead of leaving the caller with "outcome unknown"."""
    tm = TransactionManager(node="marks", log=tmp_path / "tx.log")
    a = XADataSource(dbs[0], tm, resource_name="a")
    b = LosingDataSource(dbs[1], tm, resource_name="b", commit_marks=True, share_sessions=False)
    b.connection_class = connection_class
    try:
        LosingConnection.lose = lose
        if committed:
            transfer(tm, a, b, 0)
        else:
            with pytest.raises(RollbackError):
                transfer(tm, a, b, 0)
        assert LosingConnection.lose is None, "the commit's answer was lost"
        assert values(dbs[0]) == (["debit-0"] if committed else [])
        assert values(dbs[1]) == (["credit-0"] if committed else [])
        assert prepared_gids(dbs[0]) == prepared_gids(dbs[1]) == []
        transfer(tm, a, b, 1)  # and the data sources go on
        assert values(dbs[1])[-1] == "credit-1"
    finally:
        a.close()
        b.close()
        tm.close()


def test_a_mark_is_keyed_by_the_unique_part_of_its_gtrid_and_one_keyed_by_its_gid_still_decides(dbs, tmp_path):
    """The mark's key (its table's primary key, written in the row and in the index) is what
    the gtrid ``node|<unique hex>`` says beside the ``node`` column: the hex, 30 characters
    instead of the 72 of the whole gid (:func:`txmanager.marks.key`).  A mark an earlier
    version wrote, keyed by the gid, decides its transaction all the same, and recovery
    deletes it."""
    log_path = tmp_path / "crash.log"
    crash_in_the_second_transfer(dbs, log_path, "logged")  # the mark committed, a's branch prepared
    [(gtrid, node)] = run(dbs[1], f"SELECT gtrid, node FROM {TABLE}")
    [prepared] = prepared_gids(dbs[0])
    gxid = Xid.from_text(prepared).global_xid()
    assert node == "crashy" and gxid.gtrid == b"crashy|" + gtrid.encode(), (gtrid, gxid)
    assert len(gtrid) == 30 and gtrid == marks_key(gxid) and gxid_of(gtrid, node) == gxid
    assert marks_key(Xid(1, b"crashy|0123")) == Xid(1, b"crashy|0123").to_pg_gid(), "a foreign format: the gid"
    run(dbs[1], f"UPDATE {TABLE} SET gtrid = %s", (gxid.to_pg_gid(),))  # as an earlier version keyed it

    _restart_commits_both(dbs, log_path)
