"""The commit protocol, path by path, with real in-memory resources and a real log."""

from __future__ import annotations

import pytest

from txmanager import (
    HeuristicCommitError, HeuristicHazardError, HeuristicMixedError, HeuristicRollbackError,
    IllegalStateError, MemoryLog, MemoryResource, RecoveryLogError, RollbackError, Status,
    TransactionManager, TransactionTimeoutError,
)
from txmanager.xa import (
    TMFAIL, TMJOIN, TMNOFLAGS, TMONEPHASE, TMRESUME, TMSUCCESS, TMSUSPEND, XA_HEURCOM, XA_HEURHAZ, XA_HEURRB,
    XA_RBROLLBACK, XAER_RMFAIL, XAException,
)

from .conftest import Recorder, log_records, work


def calls(res: MemoryResource) -> list[str]:
    return [name for name, _, _ in res.history]


def no_branches(*resources: MemoryResource) -> bool:
    return all(not r.store.branch_xids() and not r.store.locked_keys() for r in resources)


# -- the successful paths ---------------------------------------------------------------


def test_two_phase_commit_of_three_resources(make_tm, log_path, a, b, c):
    points: list[str] = []
    tm = make_tm(checkpoint=lambda p, i: points.append(f"{p}:{i}"))
    tx = tm.begin()
    for n, res in enumerate((a, b, c)):
        work(tx, res, "k", n)
    tm.commit()
    assert (a.snapshot(), b.snapshot(), c.snapshot()) == ({"k": 0}, {"k": 1}, {"k": 2})
    assert tx.status == Status.COMMITTED and tm.get_transaction() is None
    for res in (a, b, c):
        assert calls(res) == ["start", "end", "prepare", "commit"]
        assert res.history[-1][2] == TMNOFLAGS, "two-phase commit, not one-phase"
    assert points == ["before_prepare:0", "prepared:0", "prepared:1", "prepared:2",
                      "before_log:0", "logged:0", "committed:0", "committed:1", "committed:2",
                      "before_done:0"]
    records = log_records(log_path)
    assert [r["t"] for r in records] == ["commit", "done"]
    assert [name for _, name in records[0]["b"]] == ["a", "b", "c"]
    assert tm.log.pending() == {}
    assert no_branches(a, b, c)


def test_the_decision_is_durable_before_any_phase_two_call(make_tm, log_path, a, b):
    seen = {}

    def hook(point: str, index: int) -> None:
        if point == "logged":
            seen["records"] = [r["t"] for r in log_records(log_path)]
            seen["commits"] = calls(a).count("commit") + calls(b).count("commit")

    tm = make_tm(checkpoint=hook)
    with tm.transaction() as tx:
        work(tx, a, "x", 1)
        work(tx, b, "y", 1)
    assert seen == {"records": ["commit"], "commits": 0}


def test_one_branch_commits_in_one_phase_without_logging(make_tm, log_path, a):
    points: list[str] = []
    tm = make_tm(checkpoint=lambda p, i: points.append(p))
    with tm.transaction() as tx:
        work(tx, a, "k", "v")
    assert a.snapshot() == {"k": "v"}
    assert calls(a) == ["start", "end", "commit"] and a.history[-1][2] == TMONEPHASE
    assert points == ["before_commit_one_phase"]
    assert log_records(log_path) == []


def test_no_resources_commits_trivially(tm):
    tx = tm.begin()
    tm.commit()
    assert tx.status == Status.COMMITTED


def test_all_read_only_logs_nothing_and_commits_nothing(tm, log_path, a, b):
    with tm.transaction() as tx:
        for res in (a, b):
            tx.enlist_resource(res)
            res.get("k")
    assert tx.status == Status.COMMITTED
    assert calls(a) == calls(b) == ["start", "end", "prepare"]
    assert log_records(log_path) == []


def test_read_only_branches_skip_phase_two(tm, log_path, a, b, c):
    with tm.transaction() as tx:
        work(tx, a, "k", 1)
        tx.enlist_resource(b)  # reads only
        work(tx, c, "k", 3)
    assert calls(b) == ["start", "end", "prepare"]
    assert calls(a)[-1] == calls(c)[-1] == "commit"
    decision = log_records(log_path)[0]
    assert [name for _, name in decision["b"]] == ["a", "c"]
    assert a.snapshot() == {"k": 1} and c.snapshot() == {"k": 3}


def test_join_puts_two_connections_of_one_rm_in_one_branch(tm, a):
    twin = MemoryResource("a-twin", a.store)
    with tm.transaction() as tx:
        work(tx, a, "x", 1)
        work(tx, twin, "y", 2)
    assert twin.history[0][2] == TMJOIN and twin.history[0][1] == a.history[0][1]
    assert len(tx.branches) == 1
    assert a.history[-1] == ("commit", a.history[0][1], TMONEPHASE)
    assert a.snapshot() == {"x": 1, "y": 2}


def test_enlisting_again_is_a_no_op_and_after_delist_rejoins(tm, a):
    tx = tm.begin()
    assert tx.enlist_resource(a) is True
    assert tx.enlist_resource(a) is False
    a.put("x", 1)
    assert tx.delist_resource(a) is True
    assert tx.enlist_resource(a) is True
    a.put("y", 2)
    tm.commit()
    assert [f for _, _, f in a.history[:3]] == [TMNOFLAGS, TMSUCCESS, TMJOIN]
    assert a.snapshot() == {"x": 1, "y": 2}


# -- rollbacks before the decision ---------------------------------------------------------


def test_a_no_vote_rolls_back_every_branch(tm, log_path, a, b, c):
    b.vote_no = True
    events: list = []
    tx = tm.begin()
    tx.register_synchronization(Recorder(events, "s"))
    for res in (a, b, c):
        work(tx, res, "k", 1)
    with pytest.raises(RollbackError) as info:
        tm.commit()
    assert isinstance(info.value.cause, XAException) and info.value.cause.code == XA_RBROLLBACK
    assert info.value.xid == tx.xid
    assert tx.status == Status.ROLLEDBACK and tm.get_transaction() is None
    assert a.snapshot() == b.snapshot() == c.snapshot() == {}
    assert no_branches(a, b, c)
    assert "prepare" not in calls(c), "no point preparing after a no"
    assert calls(b)[-1] == "prepare", "b rolled itself back when it voted no"
    assert events[-1] == ("after", "s", Status.ROLLEDBACK)
    assert log_records(log_path) == []


def test_prepare_raising_rolls_back_every_branch(tm, a, b):
    b.prepare_error = XAER_RMFAIL
    with pytest.raises(RollbackError) as info:
        with tm.transaction() as tx:
            work(tx, a, "k", 1)
            work(tx, b, "k", 1)
    assert info.value.cause.code == XAER_RMFAIL
    assert calls(b)[-2:] == ["prepare", "rollback"], "its state is unknown: roll it back too"
    assert no_branches(a, b) and a.snapshot() == {}


def test_prepare_outliving_the_deadline_rolls_back(tm, a, b, c):
    b.prepare_delay = 0.6
    tx = tm.begin(timeout=0.3)
    for res in (a, b, c):
        work(tx, res, "k", 1)
    with pytest.raises(TransactionTimeoutError) as info:
        tm.commit()
    assert isinstance(info.value, RollbackError)
    assert "prepare" not in calls(c)
    assert calls(a)[-1] == calls(b)[-1] == calls(c)[-1] == "rollback"
    assert no_branches(a, b, c) and a.snapshot() == b.snapshot() == {}


def test_rollback_only_commits_nothing(tm, a, b):
    tx = tm.begin()
    work(tx, a, "k", 1)
    work(tx, b, "k", 1)
    tm.set_rollback_only()
    assert tx.status == Status.MARKED_ROLLBACK
    with pytest.raises(RollbackError) as info:
        tm.commit()
    assert info.value.cause is None and "rollback-only" in str(info.value)
    assert "prepare" not in calls(a) + calls(b)
    assert no_branches(a, b)


def test_delist_with_tmfail_forces_rollback(tm, a, b):
    tx = tm.begin()
    work(tx, a, "k", 1)
    tx.enlist_resource(b)
    b.put("k", 1)
    tx.delist_resource(b, TMFAIL)
    assert tx.status == Status.MARKED_ROLLBACK
    with pytest.raises(RollbackError):
        tm.commit()
    assert no_branches(a, b)


def test_a_decision_that_cannot_be_logged_is_a_rollback(tm, a, b):
    tx = tm.begin()
    work(tx, a, "k", 1)
    work(tx, b, "k", 1)
    tm.log.close()  # the disk went away
    with pytest.raises(RollbackError) as info:
        tm.commit()
    assert isinstance(info.value.cause, RecoveryLogError)
    assert "commit" not in calls(a) + calls(b)
    assert no_branches(a, b)


def test_one_phase_no_vote_is_a_rollback(tm, a):
    a.vote_no = True
    with pytest.raises(RollbackError):
        with tm.transaction() as tx:
            work(tx, a, "k", 1)
    assert no_branches(a) and a.snapshot() == {}


def test_enlist_after_prepare_is_refused_and_changes_nothing(make_tm, a, b, c):
    refused = []

    def hook(point: str, index: int) -> None:
        if point == "prepared" and index == 0:
            with pytest.raises(IllegalStateError, match="PREPARING"):
                tx.enlist_resource(c)
            refused.append(True)

    tm = make_tm(checkpoint=hook)
    tx = tm.begin()
    work(tx, a, "k", 1)
    work(tx, b, "k", 1)
    tm.commit()
    assert refused == [True]
    assert c.history == [] and len(tx.branches) == 2
    assert a.snapshot() == b.snapshot() == {"k": 1}


# -- phase two trouble ---------------------------------------------------------------------


def test_commit_failure_is_retried(make_tm, log_path, a, b):
    tm = make_tm(retries=3)
    b.commit_failures = 2
    with tm.transaction() as tx:
        work(tx, a, "k", 1)
        work(tx, b, "k", 2)
    assert calls(b).count("commit") == 3
    assert b.snapshot() == {"k": 2}
    assert [r["t"] for r in log_records(log_path)] == ["commit", "done"]


def test_a_branch_still_failing_is_left_to_recovery(make_tm, log_path, a, b):
    tm = make_tm(retries=2)
    tm.register_resource(a)
    tm.register_resource(b)
    b.commit_failures = 100
    with tm.transaction() as tx:  # no exception: the decision is commit
        work(tx, a, "k", 1)
        work(tx, b, "k", 2)
    assert tx.status == Status.COMMITTED
    assert calls(b).count("commit") == 3
    assert a.snapshot() == {"k": 1} and b.snapshot() == {}
    assert tm.log.pending()[tx.xid].committing, "no done record yet"
    b.commit_failures = 0
    report = tm.recovery.recover_once()
    assert report.committed == [tx.xid.branch("1")] and report.done == [tx.xid]
    assert b.snapshot() == {"k": 2}
    assert tm.log.pending() == {}
    assert not tm.recovery.recover_once().acted


def test_heuristic_rollback_of_one_branch_is_mixed(tm, log_path, a, b):
    tm.register_resource(b)
    b.heuristic_on_commit = XA_HEURRB
    tx = tm.begin()
    work(tx, a, "k", 1)
    work(tx, b, "k", 2)
    with pytest.raises(HeuristicMixedError) as info:
        tm.commit()
    assert info.value.outcomes == ((tx.xid.branch("1"), XA_HEURRB),)
    assert tx.status == Status.UNKNOWN
    assert a.snapshot() == {"k": 1} and b.snapshot() == {}
    entry = tm.log.pending()[tx.xid]
    assert dict(entry.heuristics) == {tx.xid.branch("1"): XA_HEURRB} and not entry.committing
    assert [r["t"] for r in log_records(log_path)] == ["commit", "heur", "done"]
    # The record stays, and recovery keeps reporting it, until someone forgets it.
    assert tm.recovery.recover_once().heuristics == [(tx.xid.branch("1"), XA_HEURRB)]
    assert tm.log.pending()[tx.xid].heuristics
    assert tm.recovery.forget(tx.xid) is True
    assert calls(b)[-1] == "forget"
    assert tm.log.pending() == {} and no_branches(b)
    assert tm.recovery.forget(tx.xid) is False


def test_every_branch_rolled_back_heuristically(tm, a, b):
    a.heuristic_on_commit = b.heuristic_on_commit = XA_HEURRB
    with pytest.raises(HeuristicRollbackError):
        with tm.transaction() as tx:
            work(tx, a, "k", 1)
            work(tx, b, "k", 2)
    assert tx.status == Status.ROLLEDBACK


def test_heuristic_hazard(tm, a, b):
    b.heuristic_on_commit = XA_HEURHAZ
    with pytest.raises(HeuristicHazardError):
        with tm.transaction() as tx:
            work(tx, a, "k", 1)
            work(tx, b, "k", 2)
    assert tm.log.pending()[tx.xid].heuristics == {tx.xid.branch("1"): XA_HEURHAZ}


def test_heuristic_commit_matching_the_decision_is_forgotten_silently(tm, a, b):
    b.heuristic_on_commit = XA_HEURCOM
    with tm.transaction() as tx:
        work(tx, a, "k", 1)
        work(tx, b, "k", 2)
    assert b.snapshot() == {"k": 2} and calls(b)[-1] == "forget"
    assert tm.log.pending() == {} and no_branches(b)


def test_heuristic_commit_during_rollback(tm, a, b):
    a.heuristic_on_rollback = XA_HEURCOM
    tx = tm.begin()
    work(tx, a, "k", 1)
    work(tx, b, "k", 2)
    with pytest.raises(HeuristicMixedError):
        tm.rollback()
    assert a.snapshot() == {"k": 1} and b.snapshot() == {}
    assert tm.log.pending()[tx.xid].heuristics == {tx.xid.branch("0"): XA_HEURCOM}


def test_heuristic_commit_of_the_only_branch_during_rollback(tm, a):
    a.heuristic_on_rollback = XA_HEURCOM
    tx = tm.begin()
    work(tx, a, "k", 1)
    with pytest.raises(HeuristicCommitError):
        tm.rollback()
    assert tx.status == Status.COMMITTED


def test_heuristic_commit_while_rolling_back_a_no_vote(tm, a, b):
    a.heuristic_on_rollback = XA_HEURCOM
    b.vote_no = True
    with pytest.raises(HeuristicMixedError):  # a committed, b rolled itself back
        with tm.transaction() as tx:
            work(tx, a, "k", 1)
            work(tx, b, "k", 2)


def test_one_phase_commit_with_lost_answer_is_a_hazard(tm, a):
    a.commit_failures = 1
    with pytest.raises(HeuristicHazardError):
        with tm.transaction() as tx:
            work(tx, a, "k", 1)
    assert tm.log.pending()[tx.xid].heuristics == {tx.xid.branch("0"): XA_HEURHAZ}
    assert calls(a).count("commit") == 1, "a one-phase commit is never blindly retried"


# -- synchronizations ----------------------------------------------------------------------


def test_synchronizations_run_around_completion_in_order(make_tm, a, b):
    events: list = []
    tm = make_tm(checkpoint=lambda p, i: events.append(("cp", p)))
    tx = tm.begin()
    tx.register_synchronization(Recorder(events, "s1"))
    tx.register_synchronization(Recorder(events, "s2"))
    work(tx, a, "k", 1)
    work(tx, b, "k", 1)
    tm.commit()
    assert events[:3] == [("before", "s1"), ("before", "s2"), ("cp", "before_prepare")]
    assert events[-3:] == [("cp", "before_done"), ("after", "s1", Status.COMMITTED),
                           ("after", "s2", Status.COMMITTED)]


def test_failing_before_completion_rolls_back(tm, a, b):
    events: list = []
    boom = ValueError("cache flush failed")
    tx = tm.begin()
    tx.register_synchronization(Recorder(events, "s1", fail_before=boom))
    tx.register_synchronization(Recorder(events, "s2"))
    work(tx, a, "k", 1)
    work(tx, b, "k", 1)
    with pytest.raises(RollbackError) as info:
        tm.commit()
    assert info.value.cause is boom
    assert events == [("before", "s1"), ("after", "s1", Status.ROLLEDBACK),
                      ("after", "s2", Status.ROLLEDBACK)]
    assert no_branches(a, b) and "prepare" not in calls(a)


def test_before_completion_may_do_work_and_register_more(tm, a, b):
    events: list = []

    class Flush:
        def before_completion(self) -> None:
            work(tx, b, "flushed", True)
            tx.register_synchronization(Recorder(events, "late"))

        def after_completion(self, status) -> None:
            events.append(("after", "flush", status))

    tx = tm.begin()
    tx.register_synchronization(Flush())
    work(tx, a, "k", 1)
    tm.commit()
    assert b.snapshot() == {"flushed": True}
    assert ("before", "late") in events and ("after", "late", Status.COMMITTED) in events


def test_failing_after_completion_does_not_change_the_outcome(tm, a):
    events: list = []
    tx = tm.begin()
    tx.register_synchronization(Recorder(events, "s", fail_after=RuntimeError("oops")))
    work(tx, a, "k", 1)
    tm.commit()
    assert tx.status == Status.COMMITTED and a.snapshot() == {"k": 1}


def test_rollback_calls_after_completion_but_not_before(tm, a):
    events: list = []
    tx = tm.begin()
    tx.register_synchronization(Recorder(events, "s"))
    work(tx, a, "k", 1)
    tm.rollback()
    assert events == [("after", "s", Status.ROLLEDBACK)]
    assert no_branches(a) and a.snapshot() == {}


def test_re_enlisting_a_suspended_resource_resumes_it(tm, a):
    tx = tm.begin()
    tx.enlist_resource(a)
    a.put("x", 1)
    tx.delist_resource(a, TMSUSPEND)
    assert tx.enlist_resource(a) is True
    a.put("y", 2)
    tm.commit()
    assert [f for n, _, f in a.history if n in ("start", "end")] == [
        TMNOFLAGS, TMSUSPEND, TMRESUME, TMSUCCESS]
    assert a.snapshot() == {"x": 1, "y": 2}


def test_a_branch_that_vanished_before_phase_two_is_a_hazard(make_tm, a, b):
    def dba_rolls_back_b(point: str, index: int) -> None:
        if point == "logged":
            b.rollback(tx.xid.branch("1"))  # gone behind the manager's back

    tm = make_tm(checkpoint=dba_rolls_back_b)
    tx = tm.begin()
    work(tx, a, "k", 1)
    work(tx, b, "k", 2)
    with pytest.raises(HeuristicHazardError):
        tm.commit()
    assert a.snapshot() == {"k": 1}
    assert tm.log.pending()[tx.xid].heuristics == {tx.xid.branch("1"): XA_HEURHAZ}


def test_a_log_that_cannot_note_mark_databases_keeps_every_decision_itself(tmp_path):
    """A TransactionLog of the caller's own, without log_mark_source: a resource that keeps
    commit marks is prepared like the others, and the decision goes to that log."""
    class OwnLog(MemoryLog):
        log_mark_source = property(lambda self: (_ for _ in ()).throw(AttributeError("no")))

    class MarkKeeper(MemoryResource):
        holds_commit_marks = True

    points: list[str] = []
    log = OwnLog()
    assert not hasattr(log, "log_mark_source")
    tm = TransactionManager(node="own", log=log, checkpoint=lambda p, i: points.append(f"{p}:{i}"))
    a, b = MemoryResource("a"), MarkKeeper("b")
    try:
        with tm.transaction() as tx:
            tx.enlist_resource(a)
            a.put("k", 1)
            tx.enlist_resource(b)
            b.put("k", 2)
        assert points.count("prepared:0") == points.count("prepared:1") == 1
        assert a.snapshot() == {"k": 1} and b.snapshot() == {"k": 2}
    finally:
        tm.close()
