"""A commit that returns at its decision (Transaction.commit_at_decision, txmanager.phase_two),
against real PostgreSQL databases: the caller returns once the commit mark committed, the other
branch still prepared; the workers commit it after; a crash in between is finished by recovery."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from txmanager import MemoryResource, TransactionManager
from txmanager.phase_two import PhaseTwo, PhaseTwoWorkers
from txmanager.postgres import XADataSource
from txmanager.xa import XA_HEURRB

from tests.postgres.test_commit_marks import _restart_commits_both, die, marks
from tests.postgres.support import insert, prepared_gids, two_sources, values

pytestmark = pytest.mark.postgres


class Held:
    """Phase-2 workers that keep the jobs handed to them until the test runs them."""

    def __init__(self) -> None:
        self.jobs: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self.jobs.append(job)

    def run_all(self) -> int:
        """Run the jobs held now; how many."""
        with self._lock:
            jobs, self.jobs = self.jobs, []
        for job in jobs:
            job()
        return len(jobs)

    def drain(self, timeout: float | None = None) -> bool:
        """(an engine stopping) the jobs held run now"""
        self.run_all()
        return True


def transfer_at_decision(tm, a, b, n: int, workers) -> PhaseTwo:
    with tm.transaction() as tx:
        with a.connection() as ca:
            insert(ca, f"debit-{n}")
        with b.connection() as cb:
            insert(cb, f"credit-{n}")
        return tx.commit_at_decision(workers)


def test_the_commit_returns_at_the_mark_and_the_workers_commit_the_prepared_branch(dbs, tmp_path):
    held = Held()
    with two_sources(dbs, tmp_path / "tx.log", node="atdec") as (tm, a, b):
        done = transfer_at_decision(tm, a, b, 0, held)
        # returned: b committed with its mark, a is prepared and not visible yet
        assert values(dbs[1]) == ["credit-0"] and len(marks(dbs[1])) == 1
        assert values(dbs[0]) == [] and len(prepared_gids(dbs[0])) == 1  # [] without: phase 2 ran
        assert len(held.jobs) == 1 and not done.done
        assert tm.get_transaction() is None  # the thread is free for its next transaction
        held.jobs.pop()()
        assert done.done
        assert values(dbs[0]) == ["debit-0"] and prepared_gids(dbs[0]) == []
        # the next transaction of the thread goes on as usual (and deletes the mark)
        transfer_at_decision(tm, a, b, 1, held)
        held.jobs.pop()()
        assert values(dbs[0]) == ["debit-0", "debit-1"]
    assert marks(dbs[1]) == []


def test_a_crash_between_the_decision_and_the_workers_is_committed_by_recovery(dbs, tmp_path):
    log_path = tmp_path / "crash.log"
    tm1 = TransactionManager(node="crashy", log=log_path)
    a1 = XADataSource(dbs[0], tm1, resource_name="a")
    b1 = XADataSource(dbs[1], tm1, resource_name="b", commit_marks=True)
    held = Held()
    transfer_at_decision(tm1, a1, b1, 0, held)
    held.jobs.pop()()
    done = transfer_at_decision(tm1, a1, b1, 1, held)
    assert not done.done and len(prepared_gids(dbs[0])) == 1
    die(a1, b1)  # the process dies with the job never run
    tm1.close()
    _restart_commits_both(dbs, log_path)


def test_without_a_mark_the_commit_runs_to_its_end(dbs, tmp_path):
    """Decided in the recovery log (no branch keeps marks): nothing is handed over."""
    held = Held()
    with two_sources(dbs, tmp_path / "tx.log", node="atdec", marks=False) as (tm, a, b):
        done = transfer_at_decision(tm, a, b, 0, held)
        assert done.done and not held.jobs
        assert values(dbs[0]) == ["debit-0"] and prepared_gids(dbs[0]) == prepared_gids(dbs[1]) == []


def test_a_rollback_is_done_at_once(dbs, tmp_path):
    held = Held()
    with two_sources(dbs, tmp_path / "tx.log", node="atdec") as (tm, a, b):
        with pytest.raises(RuntimeError):
            with tm.transaction() as tx:
                with a.connection() as ca:
                    insert(ca, "debit-0")
                with b.connection() as cb:
                    insert(cb, "credit-0")
                done = tx.commit_at_decision(held)
                raise RuntimeError("the application failed")
        assert done.done and not held.jobs
        assert values(dbs[0]) == values(dbs[1]) == []


def test_workers_commit_many_at_once_and_drain(dbs, tmp_path):
    workers = PhaseTwoWorkers(threads=3)
    dones: list[PhaseTwo] = []
    lock = threading.Lock()
    with two_sources(dbs, tmp_path / "tx.log", node="atdec", pool_size=8) as (tm, a, b):

        def transfers(first: int) -> None:
            for n in range(first, first + 10):
                done = transfer_at_decision(tm, a, b, n, workers)
                with lock:
                    dones.append(done)

        try:
            threads = [threading.Thread(target=transfers, args=(k * 10,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert workers.drain(timeout=60)
            assert all(d.done for d in dones) and len(dones) == 40
            assert sorted(values(dbs[0])) == sorted(f"debit-{n}" for n in range(40))
            assert prepared_gids(dbs[0]) == []
        finally:
            workers.close(timeout=60)


def test_a_heuristic_outcome_of_the_later_phase_two_is_logged_not_raised(dbs, tmp_path, caplog):
    """The prepared branch (an in-memory resource here) completes heuristically when the workers
    commit it: the job logs the outcome, which the recovery log keeps (nobody waits to be told),
    and the transaction is over all the same."""
    tm = TransactionManager(node="atdec", log=tmp_path / "tx.log")
    b = XADataSource(dbs[1], tm, resource_name="b", commit_marks=True)
    m = MemoryResource("m")
    m.heuristic_on_commit = XA_HEURRB
    held = Held()
    try:
        with tm.transaction() as tx:
            tx.enlist_resource(m)
            m.put("k", 1)
            with b.connection() as cb:
                insert(cb, "credit-0")
            done = tx.commit_at_decision(held)
        assert values(dbs[1]) == ["credit-0"] and not done.done
        with caplog.at_level("ERROR", logger="txmanager.transaction"):
            assert held.run_all() == 1  # raised HeuristicMixedError without the job's own handling
        assert done.done
        assert any("committed after its caller returned at the decision" in r.getMessage() for r in caplog.records)
        assert list(tm.log.pending()[tx.xid].heuristics.values()) == [XA_HEURRB]
    finally:
        b.close()
        tm.close()
