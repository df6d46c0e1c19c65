"""The one-phase path: a transaction with one resource makes no branch objects, and turns into
the general (two-phase) path the moment a second resource enlists.

What each transaction does is counted (the calls it makes, the XA calls the resources see, the
recovery log's records), not timed: the path is a matter of what runs, not of how fast this
machine runs it today.
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from txmanager import HeuristicHazardError, MemoryResource, RollbackError, Status
from txmanager.xa import TMONEPHASE, XA_HEURHAZ, XAER_RMFAIL, XAException

from .conftest import Recorder, log_records


def calls(res: MemoryResource) -> list[str]:
    return [name for name, _, _ in res.history]


@contextmanager
def counted() -> Iterator[collections.Counter[str]]:
    """Python calls made meanwhile in the transaction module, by qualified name."""
    seen: collections.Counter[str] = collections.Counter()

    def profile(frame, event, arg):  # noqa: ANN001 -- sys.setprofile's signature
        if event == "call" and frame.f_code.co_filename.endswith("txmanager/transaction.py"):
            seen[frame.f_code.co_qualname] += 1

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def test_one_resource_makes_no_branch_objects_and_commits_in_one_phase(tm, log_path, a):
    with counted() as seen:
        with tm.transaction() as tx:
            assert tx.enlist_resource(a)
            a.put("k", "v")
            assert not tx.enlist_resource(a), "already active: enlisting again is a no-op"
            assert tx.branches == ((tx.xid.branch("0"), a),)
    assert seen["Transaction._enlist_sole"] == 1 and seen["Transaction._commit_sole"] == 1
    assert seen["_Branch.__init__"] == 0 and seen["_Enlistment.__init__"] == 0
    assert seen["Transaction._commit_one_phase"] == 0 and seen["Transaction._end_all"] == 0
    assert calls(a) == ["start", "end", "commit"] and a.history[-1][2] == TMONEPHASE
    assert a.snapshot() == {"k": "v"} and tx.status == Status.COMMITTED
    assert log_records(log_path) == []


def test_a_second_resource_promotes_the_transaction_to_two_phase(tm, log_path, a, b):
    with counted() as seen:
        with tm.transaction() as tx:
            tx.enlist_resource(a)
            a.put("x", 1)
            tx.enlist_resource(b)  # the first one's branch becomes an object here
            b.put("y", 2)
            assert [x for x, _ in tx.branches] == [tx.xid.branch("0"), tx.xid.branch("1")]
    assert seen["Transaction._enlist_sole"] == 1 and seen["Transaction._commit_sole"] == 0
    assert seen["_Branch.__init__"] == 2 and seen["_Enlistment.__init__"] == 2
    assert seen["Transaction._commit_two_phase"] == 1
    assert calls(a) == ["start", "end", "prepare", "commit"]
    assert calls(b) == ["start", "end", "prepare", "commit"]
    assert a.snapshot() == {"x": 1} and b.snapshot() == {"y": 2}
    assert [r["t"] for r in log_records(log_path)] == ["commit", "done"]


@pytest.mark.parametrize("how", ["delist", "suspend", "rollback", "checkpoint"])
def test_what_needs_the_branch_objects_promotes_the_one_resource(make_tm, log_path, a, how):
    points: list[str] = []
    tm = make_tm(checkpoint=(lambda p, i: points.append(p)) if how == "checkpoint" else None)
    with counted() as seen:
        tx = tm.begin()
        tx.enlist_resource(a)
        a.put("k", 1)
        if how == "delist":
            tx.delist_resource(a)
        elif how == "suspend":
            tm.resume(tm.suspend())
        if how == "rollback":
            tm.rollback()
        else:
            tm.commit()
    assert seen["_Branch.__init__"] == 1 and seen["Transaction._commit_sole"] == 0
    if how == "rollback":
        assert calls(a) == ["start", "end", "rollback"] and a.snapshot() == {}
        return
    assert calls(a)[-1] == "commit" and a.history[-1][2] == TMONEPHASE and a.snapshot() == {"k": 1}
    assert points == (["before_commit_one_phase"] if how == "checkpoint" else [])
    assert log_records(log_path) == []


def test_synchronizations_keep_their_order_around_the_one_phase_path(tm, a):
    events: list = []
    tx = tm.begin()
    tx.register_synchronization(Recorder(events, "first"))
    tx.enlist_resource(a)
    tx.register_synchronization(Recorder(events, "second"))
    tm.commit()
    assert events == [("before", "first"), ("before", "second"),
                      ("after", "first", Status.COMMITTED), ("after", "second", Status.COMMITTED)]


def test_a_no_vote_on_the_one_phase_path_is_a_rollback(tm, a):
    a.vote_no = True
    with pytest.raises(RollbackError):
        with tm.transaction() as tx:
            tx.enlist_resource(a)
            a.put("k", 1)
    assert a.snapshot() == {} and tx.status == Status.ROLLEDBACK


def test_a_lost_answer_on_the_one_phase_path_is_a_hazard_in_the_log(tm, a):
    a.commit_failures = 1
    with pytest.raises(HeuristicHazardError):
        with tm.transaction() as tx:
            tx.enlist_resource(a)
            a.put("k", 1)
    assert tm.log.pending()[tx.xid].heuristics == {tx.xid.branch("0"): XA_HEURHAZ}
    assert calls(a).count("commit") == 1, "a one-phase commit is never blindly retried"


class _EndFails(MemoryResource):
    """A resource whose ``end`` fails as a lost connection does (XAER_RMFAIL)."""

    def end(self, xid, flags=0):  # noqa: ANN001 -- XAResource's signature
        self.history.append(("end", xid, flags))
        raise XAException(XAER_RMFAIL, "connection lost")


def test_an_end_that_fails_on_the_one_phase_path_rolls_back_as_the_general_path_does(make_tm,
                                                                                      tmp_path):
    histories = []
    for n, checkpoint in enumerate((None, lambda p, i: None)):  # a hook takes the general path
        tm = make_tm(checkpoint=checkpoint, log=tmp_path / f"tx{n}.log")
        res = _EndFails("endfails")
        with pytest.raises(RollbackError) as info:
            with tm.transaction() as tx:
                tx.enlist_resource(res)
                res.put("k", 1)
        assert isinstance(info.value.cause, XAException) and info.value.cause.code == XAER_RMFAIL
        assert tx.status == Status.ROLLEDBACK and res.snapshot() == {}
        histories.append(calls(res))
    assert histories[0] == histories[1] and histories[0][:3] == ["start", "end", "rollback"]


class _CountingLocal(threading.local):
    """The manager's thread-local binding, counting every attribute read and write made on it."""

    touched: collections.Counter[str] = collections.Counter()

    def __getattribute__(self, name: str):  # noqa: ANN204 -- object's signature
        _CountingLocal.touched[f"get {name}"] += 1
        return super().__getattribute__(name)

    def __setattr__(self, name: str, value: object) -> None:
        _CountingLocal.touched[f"set {name}"] += 1
        super().__setattr__(name, value)


def test_a_transaction_block_reads_the_thread_binding_once(tm, a):
    """Each read or write of a threading.local costs what three dict operations do: a ``with
    tm.transaction()`` block takes the thread's dict once, for its start and its end alike,
    and a suspend in the body is still seen (the block then leaves the transaction alone)."""
    tm._local = _CountingLocal()
    for _ in range(2):
        _CountingLocal.touched.clear()
        with tm.transaction() as tx:
            tx.enlist_resource(a)
            a.put("k", 1)
        assert dict(_CountingLocal.touched) == {"get __dict__": 1}
        assert tx.status == Status.COMMITTED and tm.get_transaction() is None
    with tm.transaction() as tx:
        assert tm.suspend() is tx
    assert tx.status == Status.ACTIVE, "suspended in the block: the block does not commit it"
    tm.resume(tx)
    tm.rollback()
