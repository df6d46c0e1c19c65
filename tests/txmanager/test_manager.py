"""The manager's JTA-like API: thread binding, suspend/resume, the ``with`` form,
timeouts, misuse."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from txmanager import (
    IllegalStateError, LogLockedError, MemoryLog, MemoryResource, NotSupportedError, RollbackError, Status,
    TransactionManager, TransactionTimeoutError, Xid,
)
from txmanager.xa import TMNOFLAGS, TMRESUME, TMSUCCESS, TMSUSPEND

from .conftest import Crash, crash_at, log_records, work


def run_in_thread(fn):
    """Run ``fn`` in another thread; return its result or re-raise its exception."""
    out: dict = {}

    def target():
        try:
            out["result"] = fn()
        except BaseException as e:  # noqa: BLE001 -- handed back to the test
            out["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join(30)
    assert not t.is_alive(), "thread hung"
    if "error" in out:
        raise out["error"]
    return out.get("result")


def test_begin_binds_to_the_thread(tm):
    assert tm.get_status() == Status.NO_TRANSACTION and tm.get_transaction() is None
    tx = tm.begin()
    assert tm.get_transaction() is tx and tm.get_status() == Status.ACTIVE
    assert tx.xid.is_ours("test-node") and tx.xid.bqual == b""
    assert run_in_thread(tm.get_transaction) is None, "other threads do not see it"
    tm.commit()
    assert tm.get_transaction() is None


def test_threads_have_independent_transactions(tm, a, b):
    tx = tm.begin()
    work(tx, a, "main", 1)

    def other():
        with tm.transaction() as tx2:
            work(tx2, b, "other", 2)
        return tx2.xid

    other_xid = run_in_thread(other)
    assert other_xid != tx.xid and b.snapshot() == {"other": 2}
    assert tm.get_transaction() is tx
    tm.rollback()
    assert a.snapshot() == {}


def test_nested_begin_is_not_supported(tm):
    tx = tm.begin()
    with pytest.raises(NotSupportedError, match="nested"):
        tm.begin()
    assert tm.get_transaction() is tx


def test_completion_calls_without_a_transaction_are_illegal(tm):
    for call in (tm.commit, tm.rollback, tm.set_rollback_only):
        with pytest.raises(IllegalStateError, match="no transaction"):
            call()


def test_a_finished_transaction_refuses_completion_and_enlistment(tm, a):
    tx = tm.begin()
    tm.commit()
    for call in (tx.commit, tx.rollback, tx.set_rollback_only):
        with pytest.raises(IllegalStateError):
            call()
    with pytest.raises(IllegalStateError):
        tx.enlist_resource(a)
    assert a.history == []


def test_commit_through_the_transaction_object_unbinds_it(tm, a):
    tx = tm.begin()
    work(tx, a, "k", 1)
    tx.commit()
    assert tm.get_transaction() is None
    tm.begin()  # not a nested begin
    tm.rollback()


def test_delist_of_a_stranger_is_illegal(tm, a):
    tx = tm.begin()
    with pytest.raises(IllegalStateError, match="not enlisted"):
        tx.delist_resource(a)
    with pytest.raises(ValueError):
        tx.delist_resource(a, TMNOFLAGS)
    tm.rollback()


def test_a_closed_manager_leaves_no_current_transaction_behind(make_tm):
    """A transaction left bound to this thread by a manager since closed must not make a
    reliable client built without tm= refuse every call ("a transaction is current")."""
    from txmanager.manager import current_transactions

    tm = make_tm()
    tm.begin()
    assert any(m is tm for m, _ in current_transactions())
    tm.close()
    assert not any(m is tm for m, _ in current_transactions())


def test_with_commits_on_normal_exit(tm, a, b):
    with tm.transaction() as tx:
        work(tx, a, "k", 1)
        work(tx, b, "k", 2)
    assert tx.status == Status.COMMITTED
    assert a.snapshot() == {"k": 1} and b.snapshot() == {"k": 2}


def test_with_rolls_back_on_exception_and_reraises(tm, a, b):
    with pytest.raises(KeyError):
        with tm.transaction() as tx:
            work(tx, a, "k", 1)
            work(tx, b, "k", 2)
            raise KeyError("application error")
    assert tx.status == Status.ROLLEDBACK and tm.get_transaction() is None
    assert a.snapshot() == b.snapshot() == {}


def test_with_leaves_a_transaction_the_body_completed_alone(tm, a):
    with tm.transaction() as tx:
        work(tx, a, "k", 1)
        tm.rollback()
    assert tx.status == Status.ROLLEDBACK and a.snapshot() == {}


def test_with_raises_rollback_error_when_marked(tm, a):
    with pytest.raises(RollbackError):
        with tm.transaction() as tx:
            work(tx, a, "k", 1)
            tx.set_rollback_only()
    assert a.snapshot() == {}


def test_suspend_in_one_thread_resume_and_commit_in_another(tm, a, b):
    tx = tm.begin()
    tx.enlist_resource(a)
    a.put("from", "thread 1")
    assert tm.suspend() is tx
    assert tm.get_transaction() is None and tx.status == Status.ACTIVE

    def second_thread():
        tm.resume(tx)
        assert tm.get_transaction() is tx
        a.put("and", "thread 2")
        work(tx, b, "k", 2)
        tm.commit()
        return tm.get_transaction()

    assert run_in_thread(second_thread) is None
    assert a.snapshot() == {"from": "thread 1", "and": "thread 2"}
    assert b.snapshot() == {"k": 2}
    assert [f for n, _, f in a.history if n in ("start", "end")] == [
        TMNOFLAGS, TMSUSPEND, TMRESUME, TMSUCCESS]


def test_suspend_without_transaction_returns_none(tm):
    assert tm.suspend() is None


def test_resume_needs_a_free_thread_and_a_live_transaction(tm):
    tx = tm.begin()
    with pytest.raises(IllegalStateError, match="already has"):
        tm.resume(tx)
    tm.suspend()
    tm.resume(tx)
    tm.commit()
    with pytest.raises(IllegalStateError, match="COMMITTED"):
        tm.resume(tx)


def test_a_new_transaction_may_run_while_another_is_suspended(tm, a, b):
    outer = tm.begin()
    work(outer, a, "outer", 1)
    tm.suspend()
    with tm.transaction() as inner:
        work(inner, b, "inner", 1)
    tm.resume(outer)
    tm.rollback()
    assert a.snapshot() == {} and b.snapshot() == {"inner": 1}


# -- timeouts ------------------------------------------------------------------------


def test_the_timeout_is_passed_to_resources(make_tm, a):
    tm = make_tm(default_timeout=120)
    tx = tm.begin()
    tx.enlist_resource(a)
    assert 119 <= a.get_transaction_timeout() <= 120
    assert tx.timeout == 120 and tx.deadline is not None and not tx.is_expired()
    tm.rollback()
    tx = tm.begin(timeout=0)
    assert tx.timeout is None and tx.deadline is None
    tm.rollback()


def test_an_expired_transaction_can_only_roll_back(tm, a, b):
    tx = tm.begin(timeout=0.05)
    work(tx, a, "k", 1)
    time.sleep(0.1)
    assert tx.is_expired() and tx.status == Status.MARKED_ROLLBACK
    with pytest.raises(TransactionTimeoutError, match="timed out"):
        tx.enlist_resource(b)
    assert b.history == []
    with pytest.raises(TransactionTimeoutError):
        tm.commit()
    assert tx.status == Status.ROLLEDBACK and a.snapshot() == {}
    assert a.store.branch_xids() == []


def test_explicit_rollback_of_an_expired_transaction_is_quiet(tm, a):
    tx = tm.begin(timeout=0.05)
    work(tx, a, "k", 1)
    time.sleep(0.1)
    tm.rollback()
    assert tx.status == Status.ROLLEDBACK


# -- the log and the node ------------------------------------------------------------------


def test_two_managers_cannot_share_a_log(make_tm):
    make_tm()
    with pytest.raises(LogLockedError):
        make_tm()


def test_a_gtrid_still_pending_in_the_log_cannot_be_reused(make_tm, a, b):
    tm = make_tm(checkpoint=crash_at("logged"))
    tx = tm.begin()
    work(tx, a, "k", 1)
    work(tx, b, "k", 1)
    with pytest.raises(Crash):
        tm.commit()
    tm.close()
    fresh = make_tm()
    with pytest.raises(IllegalStateError, match="pending"):
        fresh.begin(xid=tx.xid)
    with pytest.raises(ValueError, match="branch"):
        fresh.begin(xid=tx.xid.branch("0"))
    mine = Xid.new_global("test-node")
    assert fresh.begin(xid=mine).xid == mine
    fresh.rollback()


def test_without_a_log_it_warns_once_and_still_works(caplog, a, b):
    with caplog.at_level(logging.WARNING, logger="txmanager.manager"):
        first = TransactionManager(node="volatile-node", log=None)
        TransactionManager(node="volatile-node", log=None).close()
    assert sum("no recovery log" in r.message for r in caplog.records) == 1
    assert isinstance(first.log, MemoryLog)
    with first.transaction() as tx:
        work(tx, a, "k", 1)
        work(tx, b, "k", 1)
    assert a.snapshot() == b.snapshot() == {"k": 1}
    first.close()


def test_bad_node_names_are_refused_at_construction():
    with pytest.raises(ValueError, match="node name"):
        TransactionManager(node="has spaces", log=None)


def test_a_closed_manager_begins_nothing(make_tm):
    tm = make_tm()
    tm.close()
    tm.close()
    with pytest.raises(IllegalStateError, match="closed"):
        tm.begin()


def test_many_threads_commit_concurrently_through_one_log(tm, log_path, a, b):
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        ra, rb = MemoryResource("a", a.store), MemoryResource("b", b.store)  # one connection each
        try:
            for i in range(50):
                with tm.transaction() as tx:
                    work(tx, ra, f"{n}-{i}", i)
                    work(tx, rb, f"{n}-{i}", -i)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(a.snapshot()) == len(b.snapshot()) == 200
    assert tm.log.pending() == {}
    with_records = log_records(log_path)
    assert sorted(r["t"] for r in with_records) == ["commit"] * 200 + ["done"] * 200


def test_transaction_also_works_as_a_decorator(tm, a):
    @tm.transaction()
    def transfer(value):
        work(tm.get_transaction(), a, "k", value)
        return tm.get_transaction()

    first = transfer(1)
    second = transfer(2)  # a fresh transaction per call
    assert first is not second
    assert first.status == second.status == Status.COMMITTED
    assert a.snapshot() == {"k": 2} and tm.get_transaction() is None
