"""Two real PostgreSQL databases under the transaction manager: concurrency,
and a crash of the application (SIGKILL) at every point of two-phase commit,
at random instants, and of the PostgreSQL server itself mid-commit.

After every crash a fresh process recovers from the log; the audit then
demands the total unchanged, every transfer in both ledgers or in neither, and
no prepared transaction left behind.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import uuid

import psycopg2
import pytest

from txmanager import TransactionManager
from wsrm_plugin.tools.bank import audit, create_bank, transfer
from wsrm_plugin.tools.txdemo import ACCOUNTS, BALANCE, recover_in_fresh_process, run_worker
from txmanager.errors import RollbackError
from txmanager.postgres import XADataSource

pytestmark = pytest.mark.postgres
TOTAL = 2 * ACCOUNTS * BALANCE


@pytest.fixture
def banks(pg_server):
    names = [f"bank_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    for name in names:
        pg_server.create_database(name)
    dsn_a, dsn_b = (pg_server.dsn(n) for n in names)
    create_bank(dsn_a, ACCOUNTS, BALANCE)
    create_bank(dsn_b, ACCOUNTS, BALANCE)
    return dsn_a, dsn_b


def test_thousand_transfers_from_four_threads_keep_the_total(banks, tmp_path):
    dsn_a, dsn_b = (d + " options='-c lock_timeout=2000'" for d in banks)
    tm = TransactionManager(node="threads", log=tmp_path / "tx.log")
    bank_a = XADataSource(dsn_a, tm, resource_name="a")
    bank_b = XADataSource(dsn_b, tm, resource_name="b")
    committed: list[str] = []
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        rng = random.Random(n)
        for i in range(250):
            tid = f"th{n}-{i}"
            src, dst = (bank_a, bank_b) if rng.random() < 0.5 else (bank_b, bank_a)
            for _attempt in range(20):  # cross-database lock waits end in lock_timeout
                try:
                    transfer(tm, src, dst, tid, rng.randrange(ACCOUNTS),
                             rng.randrange(ACCOUNTS), rng.randint(1, 50))
                    committed.append(tid)
                    break
                except (RollbackError, psycopg2.errors.LockNotAvailable,
                        psycopg2.errors.DeadlockDetected):
                    assert tm.get_transaction() is None
            else:
                errors.append(AssertionError(f"{tid} never committed"))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
    finally:
        tm.close()
    assert not errors
    assert len(committed) == 1000
    report = audit(*banks, TOTAL)
    assert report.ok, report.summary()
    assert report.transfers_a == report.transfers_b == set(committed)


# (kill point, is the transfer that was in flight committed after recovery?)
CRASH_POINTS = [
    ("before_prepare", False),
    ("prepared:0", False),
    ("before_log", False),
    ("logged", True),
    ("committed:0", True),
    ("before_done", True),
]


@pytest.mark.parametrize("marks", [False, True], ids=["log", "marks"])
@pytest.mark.parametrize("point,committed", CRASH_POINTS, ids=[p for p, _ in CRASH_POINTS])
def test_application_killed_at_each_protocol_point(banks, tmp_path, point, committed, marks):
    """``marks``: bank B keeps commit marks, so only bank A's branch is ever prepared and the
    decision is B's one-phase commit (before_log / logged are just before / after it)."""
    dsn_a, dsn_b = banks
    log_path = str(tmp_path / "tx.log")
    rc = run_worker(dsn_a, dsn_b, log_path, transfers=6, prefix="p", kill_at=point, kill_tx=3,
                    seed=7, node="crash-node", commit_marks=marks)
    assert rc == -signal.SIGKILL, "the worker should have died at the kill point"
    before = audit(dsn_a, dsn_b, TOTAL)
    if point != "before_prepare":
        # with a mark only bank A prepares: once it committed (committed:0) nothing is left
        finished = ("before_done", "committed:0") if marks else ("before_done",)
        assert before.prepared_left or point in finished, "a branch should be in doubt"
        if marks:
            assert len(before.prepared_left) <= 1, "with a mark, only the other bank prepares"

    recover_in_fresh_process(log_path, [dsn_a, dsn_b], node="crash-node")
    report = audit(dsn_a, dsn_b, TOTAL)
    assert report.ok, report.summary()
    assert {"p-0", "p-1", "p-2"} <= report.transfers_a
    assert ("p-3" in report.transfers_a) is committed
    assert "p-4" not in report.transfers_a

    if marks:
        assert marks_left(dsn_b) == 0, "recovery deletes every mark once it is carried out"

    # Idempotent: a second recovery finds nothing to do and changes nothing.
    recover_in_fresh_process(log_path, [dsn_a, dsn_b], node="crash-node")
    assert audit(dsn_a, dsn_b, TOTAL).transfers_a == report.transfers_a


def marks_left(dsn: str) -> int:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT to_regclass('txm_commit_mark') IS NOT NULL")
            if not cur.fetchone()[0]:
                return 0  # killed before it created the table: no mark was ever written
            cur.execute("SELECT count(*) FROM txm_commit_mark")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


@pytest.mark.slow(minutes=1.25)
@pytest.mark.parametrize("marks", [False, True], ids=["log", "marks"])
def test_application_killed_at_fifty_random_instants(banks, tmp_path, marks):
    dsn_a, dsn_b = banks
    log_path = str(tmp_path / "tx.log")
    rng = random.Random(2026)
    kills = 0
    for n in range(50):
        rc = run_worker(dsn_a, dsn_b, log_path, transfers=100_000, prefix=f"r{n}",
                        kill_after=rng.uniform(0.0, 0.6), seed=n, node="crash-node",
                        commit_marks=marks)
        kills += rc == -signal.SIGKILL
        recover_in_fresh_process(log_path, [dsn_a, dsn_b], node="crash-node")
        report = audit(dsn_a, dsn_b, TOTAL)
        assert report.ok, f"after kill {n}: {report.summary()}"
        assert report.transfers_a == report.transfers_b
        if marks:
            assert marks_left(dsn_b) == 0, f"after kill {n}: commit marks left behind"
    assert kills == 50
    assert len(report.transfers_a) > 50, "the workers should have committed work between kills"


@pytest.mark.parametrize("marks", [False, True], ids=["log", "marks"])
def test_postgres_server_killed_mid_commit(pg_server, tmp_path, marks):
    name_a, name_b = (f"bank_{uuid.uuid4().hex[:10]}" for _ in range(2))
    pg_server.create_database(name_a)
    pg_server.create_database(name_b)
    dsn_a, dsn_b = pg_server.dsn(name_a), pg_server.dsn(name_b)
    create_bank(dsn_a, ACCOUNTS, BALANCE)
    create_bank(dsn_b, ACCOUNTS, BALANCE)
    log_path = str(tmp_path / "tx.log")

    # with marks, "logged" is the instant bank B committed with the mark and bank A is prepared
    rc = run_worker(dsn_a, dsn_b, log_path, transfers=6, prefix="s",
                    kill_at="logged" if marks else "committed:0", kill_tx=2, kill_server_pid=pg_server.pid, seed=3, node="crash-node",
                    commit_marks=marks)
    assert rc != 0, "the worker cannot go on once the server is gone"
    pg_server.wait_killed()
    pg_server.start()

    before = audit(dsn_a, dsn_b, TOTAL)
    assert len(before.prepared_left) == 1, "the branch not yet committed survives kill -9"
    recover_in_fresh_process(log_path, [dsn_a, dsn_b], node="crash-node")
    report = audit(dsn_a, dsn_b, TOTAL)
    assert report.ok, report.summary()
    assert {"s-0", "s-1", "s-2"} <= report.transfers_a, "the logged decision is carried out"
    assert "s-3" not in report.transfers_a


def test_wsrm_recover_without_the_marks_database_rolls_back_nothing(banks, tmp_path):
    """Killed right after bank B committed with the mark: the mark is the only record of the
    commit.  An operator who forgets B's --dsn gets an error naming it, and bank A's branch
    stays prepared; with both databases the transfer is completed."""
    dsn_a, dsn_b = banks
    log_path = str(tmp_path / "tx.log")
    rc = run_worker(dsn_a, dsn_b, log_path, transfers=3, prefix="o", kill_at="logged", kill_tx=1,
                    seed=5, node="crash-node", commit_marks=True)
    assert rc == -signal.SIGKILL
    cmd = [sys.executable, "-m", "txmanager.operator", "--log", log_path, "--node", "crash-node",
           "--safety-interval", "0", "--auto", "--dsn", dsn_a]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out
    assert "commit marks" in out.stderr and "bank_" in out.stderr, out.stderr
    assert len(audit(dsn_a, dsn_b, TOTAL).prepared_left) == 1, "nothing presumed aborted"
    recover_in_fresh_process(log_path, [dsn_a, dsn_b], node="crash-node")
    report = audit(dsn_a, dsn_b, TOTAL)
    assert report.ok, report.summary()
    assert {"o-0", "o-1"} <= report.transfers_a and "o-2" not in report.transfers_a
