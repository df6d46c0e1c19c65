"""Recovery after a 'crash' at each point of the protocol: a checkpoint hook stops
the commit dead, the manager is abandoned, and a fresh manager on the same log
file and the same (surviving) resources must finish the job."""

from __future__ import annotations

import time

import pytest

from txmanager import (
    HeuristicMixedError, IllegalStateError, MemoryResource, RecoveryLog, RecoveryManager,
    TransactionManager, Xid,
)
from txmanager.xa import XA_HEURRB

from .conftest import Crash, crash_at, log_records, work


class Clock:
    """A clock the test moves by hand, so ages are exact and no test waits."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class NoAgeResource(MemoryResource):
    """A resource that cannot say how old its prepared branches are."""

    def prepared_age(self, xid: Xid) -> float | None:
        return None


def crashed_transaction(make_tm, point: str, *resources, index: int = 0) -> Xid:
    """Run a transaction over ``resources`` that 'dies' at ``point``; return its xid."""
    tm = make_tm(checkpoint=crash_at(point, index))
    tx = tm.begin()
    for n, res in enumerate(resources):
        work(tx, res, "k", n + 1)
    with pytest.raises(Crash):
        tm.commit()
    tm.close()  # the process is gone; its log lock with it
    return tx.xid


def restarted(make_tm, *resources, **kwargs) -> TransactionManager:
    tm = make_tm(**kwargs)
    for res in resources:
        tm.register_resource(res)
    return tm


@pytest.mark.parametrize("point,index", [("logged", 0), ("committed", 0), ("committed", 1)])
def test_a_logged_decision_is_finished_after_a_crash(make_tm, log_path, a, b, c, point, index):
    gxid = crashed_transaction(make_tm, point, a, b, c, index=index)
    assert log_path.exists() and [r["t"] for r in log_records(log_path)] == ["commit"]
    tm = restarted(make_tm, a, b, c)
    report = tm.recovery.recover_once()
    assert len(report.committed) == 3 - (index + 1 if point == "committed" else 0)
    assert report.done == [gxid] and not report.errors
    assert (a.snapshot(), b.snapshot(), c.snapshot()) == ({"k": 1}, {"k": 2}, {"k": 3})
    assert tm.log.pending() == {}
    again = tm.recovery.recover_once()
    assert not again.acted and again.committed == again.done == []


def test_a_crash_before_done_only_needs_the_done_record(make_tm, a, b):
    gxid = crashed_transaction(make_tm, "before_done", a, b)
    tm = restarted(make_tm, a, b)
    report = tm.recovery.recover_once()
    assert report.committed == [] and report.done == [gxid]
    assert tm.log.pending() == {}


@pytest.mark.parametrize("point,index", [("prepared", 0), ("prepared", 1), ("before_log", 0)])
def test_unlogged_prepared_branches_are_presumed_aborted_after_the_safety_interval(
        make_tm, point, index):
    clock = Clock()
    a, b = MemoryResource("a", clock=clock), MemoryResource("b", clock=clock)
    gxid = crashed_transaction(make_tm, point, a, b, index=index)
    prepared = [x for x in (gxid.branch("0"), gxid.branch("1"))
                if x in a.store.branch_xids() + b.store.branch_xids()
                and (a.store.branch_state(x) == "prepared" or b.store.branch_state(x) == "prepared")]
    assert prepared, "the crash left prepared branches"
    tm = restarted(make_tm, a, b, safety_interval=30)
    report = tm.recovery.recover_once()
    assert report.rolled_back == [] and sorted(report.waiting, key=str) == sorted(prepared, key=str)
    clock.now += 31
    report = tm.recovery.recover_once()
    assert sorted(report.rolled_back, key=str) == sorted(prepared, key=str)
    assert a.snapshot() == b.snapshot() == {}
    assert [s for s in (a.store.branch_state(x) or b.store.branch_state(x) for x in prepared)
            if s == "prepared"] == []
    assert not tm.recovery.recover_once().acted


def test_without_an_age_hint_the_interval_counts_from_first_sight(make_tm, log_path):
    a, b = NoAgeResource("a"), NoAgeResource("b")
    gxid = crashed_transaction(make_tm, "before_log", a, b)
    clock = Clock()
    rm = RecoveryManager(make_tm().log, [a, b], "test-node", safety_interval=10, clock=clock)
    assert len(rm.recover_once().waiting) == 2
    clock.now += 9
    assert len(rm.recover_once().waiting) == 2
    clock.now += 2
    assert sorted(rm.recover_once().rolled_back, key=str) == [gxid.branch("0"), gxid.branch("1")]


def test_foreign_branches_are_never_touched(make_tm, a):
    other_node = Xid.new_global("other-node").branch("0")
    not_ours = Xid(1, b"someone-elses-gtrid", b"b1")
    for xid in (other_node, not_ours):
        a.start(xid)
        a.put(f"k-{xid.gtrid[:5]!r}", 1)
        a.end(xid)
        a.prepare(xid)
    tm = restarted(make_tm, a, safety_interval=0)
    report = tm.recovery.recover_once()
    assert sorted(report.foreign, key=str) == sorted([other_node, not_ours], key=str)
    assert report.rolled_back == [] and not report.acted
    assert a.store.branch_state(other_node) == a.store.branch_state(not_ours) == "prepared"
    doubts = {d.xid: d for d in tm.recovery.in_doubt()}
    assert not doubts[other_node].ours and doubts[other_node].decision == "none"


def test_a_running_transaction_is_not_recovered_under_its_feet(make_tm, a, b):
    reports = []

    def hook(point: str, index: int) -> None:
        if point == "prepared" and index == 1:  # both prepared, no decision yet
            reports.append(tm.recovery.recover_once())

    tm = make_tm(checkpoint=hook, safety_interval=0)
    tm.register_resource(a)
    tm.register_resource(b)
    with tm.transaction() as tx:
        work(tx, a, "k", 1)
        work(tx, b, "k", 2)
    assert reports and reports[0].rolled_back == [] and reports[0].waiting == []
    assert a.snapshot() == {"k": 1} and b.snapshot() == {"k": 2}


def test_an_unreachable_resource_keeps_the_decision_pending(make_tm, a, b):
    gxid = crashed_transaction(make_tm, "logged", a, b)
    tm = restarted(make_tm, a, b)
    b.down = True
    report = tm.recovery.recover_once()
    assert report.committed == [gxid.branch("0")] and report.done == []
    assert report.unfinished == [gxid] and any("recover() on b" in e for e in report.errors)
    assert tm.log.pending()[gxid].committing
    unreachable = [d for d in tm.recovery.in_doubt() if d.resource_name == "b"]
    assert [(d.xid, d.decision) for d in unreachable] == [
        (gxid.branch("1"), "commit (resource unreachable)")]
    b.down = False
    report = tm.recovery.recover_once()
    assert report.committed == [gxid.branch("1")] and report.done == [gxid]
    assert b.snapshot() == {"k": 2}


def test_an_unregistered_resource_keeps_the_decision_pending(make_tm, a, b):
    gxid = crashed_transaction(make_tm, "logged", a, b)
    tm = restarted(make_tm, a)  # b forgotten by the operator
    report = tm.recovery.recover_once()
    assert report.unfinished == [gxid] and report.done == []
    tm.register_resource(b)  # registered after a pass: it gets a pass of its own at once
    assert gxid not in tm.log.pending()
    assert not tm.recovery.recover_once().acted


def test_a_failing_commit_is_retried_on_the_next_pass(make_tm, a, b):
    gxid = crashed_transaction(make_tm, "logged", a, b)
    tm = restarted(make_tm, a, b)
    b.commit_failures = 1
    report = tm.recovery.recover_once()
    assert report.unfinished == [gxid] and report.errors
    assert tm.recovery.recover_once().done == [gxid]
    assert b.snapshot() == {"k": 2}


def test_twin_connections_of_one_rm_are_scanned_once(make_tm, a, b):
    gxid = crashed_transaction(make_tm, "logged", a, b)
    tm = restarted(make_tm, a, MemoryResource("a", a.store), b)
    report = tm.recovery.recover_once()
    assert sorted(report.committed, key=str) == [gxid.branch("0"), gxid.branch("1")]
    assert report.done == [gxid] and not report.errors
    assert [n for n, _, _ in a.history].count("recover") == 1


def test_a_heuristic_found_by_recovery_is_reported_until_forgotten(make_tm, a, b):
    gxid = crashed_transaction(make_tm, "logged", a, b)
    b.heuristic_on_commit = XA_HEURRB
    tm = restarted(make_tm, a, b)
    report = tm.recovery.recover_once()
    assert report.heuristics == [(gxid.branch("1"), XA_HEURRB)]
    assert report.done == [gxid], "every branch answered"
    entry = tm.log.pending()[gxid]
    assert not entry.committing and entry.heuristics == {gxid.branch("1"): XA_HEURRB}
    doubt = [d for d in tm.recovery.in_doubt() if d.xid == gxid.branch("1")]
    assert doubt[0].decision == "heuristic XA_HEURRB"
    assert tm.recovery.recover_once().heuristics == report.heuristics, "still reported"
    forgetting = tm.recovery.recover_once(forget_heuristics=True)
    assert forgetting.forgotten == [gxid]
    assert tm.log.pending() == {} and b.store.branch_xids() == []
    assert tm.recovery.recover_once().heuristics == []


def test_operator_lists_and_resolves_in_doubt_branches(make_tm, a, b):
    clock = Clock()
    a, b = MemoryResource("a", clock=clock), MemoryResource("b", clock=clock)
    gxid = crashed_transaction(make_tm, "before_log", a, b)
    tm = restarted(make_tm, a, b)
    clock.now += 5
    doubts = sorted(tm.recovery.in_doubt(), key=lambda d: d.resource_name)
    assert [(d.xid, d.resource_name, d.decision, d.age, d.ours) for d in doubts] == [
        (gxid.branch("0"), "a", "none", 5.0, True), (gxid.branch("1"), "b", "none", 5.0, True)]
    assert tm.recovery.resolve(gxid.branch("0"), commit=True) == "committed"
    assert tm.recovery.resolve(gxid.branch("1"), commit=False) == "rolled back"
    assert a.snapshot() == {"k": 1} and b.snapshot() == {}
    assert tm.recovery.in_doubt() == []
    with pytest.raises(IllegalStateError, match="not prepared"):
        tm.recovery.resolve(gxid.branch("0"), commit=True)


def test_resolving_against_the_log_is_recorded_as_heuristic(make_tm, a, b):
    gxid = crashed_transaction(make_tm, "logged", a, b)
    tm = restarted(make_tm, a, b)
    assert tm.recovery.resolve(gxid.branch("1"), commit=False) == "rolled back"
    entry = tm.log.pending()[gxid]
    assert entry.heuristics == {gxid.branch("1"): XA_HEURRB} and entry.committing
    report = tm.recovery.recover_once()
    assert report.committed == [gxid.branch("0")] and report.done == [gxid]


def test_background_recovery_finishes_the_work(make_tm, a, b):
    gxid = crashed_transaction(make_tm, "logged", a, b)
    tm = restarted(make_tm, a, b)
    tm.recovery.start(interval=0.01)
    try:
        assert tm.recovery.running
        with pytest.raises(IllegalStateError):
            tm.recovery.start(interval=1)
        deadline = time.monotonic() + 30
        while tm.log.is_pending(gxid) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        tm.recovery.stop()
    assert not tm.recovery.running
    assert not tm.log.is_pending(gxid)
    assert a.snapshot() == {"k": 1} and b.snapshot() == {"k": 2}


def test_close_stops_background_recovery(make_tm, a):
    tm = restarted(make_tm, a)
    tm.recovery.start(interval=10)
    tm.close()
    assert not tm.recovery.running


def test_a_decision_with_a_heuristic_and_an_unreachable_branch(make_tm, a, b):
    """Phase 2 left a to recovery and b answered heuristically: recovery commits a,
    leaves b's heuristic alone, and then the decision is done."""
    tm = make_tm(retries=0)
    for res in (a, b):
        tm.register_resource(res)
    a.commit_failures = 1
    b.heuristic_on_commit = XA_HEURRB
    tx = tm.begin()
    work(tx, a, "k", 1)
    work(tx, b, "k", 2)
    with pytest.raises(HeuristicMixedError):  # a will commit, b rolled back
        tm.commit()
    entry = tm.log.pending()[tx.xid]
    assert entry.committing and entry.heuristics == {tx.xid.branch("1"): XA_HEURRB}
    report = tm.recovery.recover_once()
    assert report.committed == [tx.xid.branch("0")] and report.done == [tx.xid]
    assert not tm.log.pending()[tx.xid].committing
    assert [n for n, _, _ in b.history].count("commit") == 1, "b's heuristic is left alone"


def test_a_stand_alone_recovery_manager_after_the_process_is_gone(make_tm, log_path, a, b):
    """What an operator tool does: no TransactionManager, just the log and resources."""
    gxid = crashed_transaction(make_tm, "logged", a, b)
    rm = RecoveryManager(RecoveryLog(log_path), [a, b], "test-node", safety_interval=0)
    try:
        report = rm.recover_once()
        assert report.done == [gxid] and len(report.committed) == 2
    finally:
        rm.close()
    with RecoveryLog(log_path) as lg:  # closing released the lock
        assert lg.pending() == {}
