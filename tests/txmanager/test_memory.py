"""MemoryResource driven directly through the XA calls: the resource the other
tests rely on must itself obey the XA state rules."""

from __future__ import annotations

import pytest

from txmanager import MemoryResource, MemoryStore, Xid
from txmanager.memory import KeyLockedError
from txmanager.xa import (
    TMFAIL, TMJOIN, TMNOFLAGS, TMRESUME, TMSTARTRSCAN, TMSUCCESS, TMSUSPEND, XA_HEURCOM,
    XA_HEURMIX, XA_HEURRB, XA_OK, XA_RBINTEGRITY, XA_RBROLLBACK, XA_RBTIMEOUT, XA_RDONLY,
    XAER_DUPID, XAER_INVAL, XAER_NOTA, XAER_PROTO, XAER_RMFAIL, XAException, XAResource,
)

X = Xid.new_global("mem").branch("0")
Y = Xid.new_global("mem").branch("0")


def xa_code(call, *args, **kwargs) -> int:
    with pytest.raises(XAException) as info:
        call(*args, **kwargs)
    return info.value.code


def staged(res: MemoryResource, xid: Xid, **writes) -> None:
    res.start(xid)
    for k, v in writes.items():
        res.put(k, v)
    res.end(xid)


def test_is_an_xa_resource():
    assert isinstance(MemoryResource("m"), XAResource)


def test_two_phase_commit_applies_staged_writes_only_at_commit():
    res = MemoryResource("m")
    res.start(X)
    res.put("k", 1)
    assert res.get("k") == 1, "a branch sees its own writes"
    res.end(X)
    assert res.snapshot() == {}
    assert res.prepare(X) == XA_OK
    assert res.snapshot() == {}
    assert res.recover(TMSTARTRSCAN) == [X]
    res.commit(X)
    assert res.snapshot() == {"k": 1}
    assert res.recover(TMSTARTRSCAN) == []


def test_rollback_drops_writes_and_releases_locks():
    res = MemoryResource("m")
    staged(res, X, k=1)
    assert res.store.locked_keys() == {"k": X}
    res.prepare(X)
    res.rollback(X)
    assert res.snapshot() == {} and res.store.locked_keys() == {}
    assert res.store.branch_xids() == []


def test_one_phase_commit_without_prepare():
    res = MemoryResource("m")
    staged(res, X, k="v")
    res.commit(X, one_phase=True)
    assert res.snapshot() == {"k": "v"}


def test_branch_without_writes_votes_read_only_and_is_gone():
    res = MemoryResource("m")
    res.start(X)
    res.get("k")
    res.end(X)
    assert res.prepare(X) == XA_RDONLY
    assert res.store.branch_xids() == []
    assert xa_code(res.commit, X) == XAER_NOTA


def test_writes_of_another_branch_are_locked_out_until_it_ends():
    store = MemoryStore()
    r1, r2 = MemoryResource("r1", store), MemoryResource("r2", store)
    r1.start(X)
    r1.put("k", 1)
    r2.start(Y)
    with pytest.raises(KeyLockedError):
        r2.put("k", 2)
    with pytest.raises(KeyLockedError):
        MemoryResource("auto", store).put("k", 3)  # autocommit write
    assert r2.get("k") is None, "uncommitted writes are invisible to other branches"
    r1.end(X)
    r1.commit(X, one_phase=True)
    r2.put("k", 2)
    r2.end(Y)
    r2.commit(Y, one_phase=True)
    assert store.snapshot() == {"k": 2}


def test_delete_is_staged():
    res = MemoryResource("m")
    res.put("k", 1)
    res.start(X)
    res.delete("k")
    assert res.get("k", "gone") == "gone"
    res.end(X)
    assert res.snapshot() == {"k": 1}
    res.commit(X, one_phase=True)
    assert res.snapshot() == {}


# -- flag misuse ------------------------------------------------------------------


def test_start_twice_without_join_is_dupid_or_proto():
    res = MemoryResource("m")
    res.start(X)
    assert xa_code(res.start, X) == XAER_PROTO, "this connection is already associated"
    res.end(X)
    other = MemoryResource("m2", res.store)
    assert xa_code(other.start, X, TMNOFLAGS) == XAER_DUPID
    other.start(X, TMJOIN)
    other.end(X)


def test_end_without_start_is_proto():
    res = MemoryResource("m")
    assert xa_code(res.end, X, TMSUCCESS) == XAER_PROTO
    res.start(X)
    assert xa_code(res.end, Y, TMSUCCESS) == XAER_PROTO, "ending another branch"
    res.end(X)
    assert xa_code(res.end, X, TMSUCCESS) == XAER_PROTO, "ended twice"


def test_join_or_resume_of_unknown_branch_fails():
    res = MemoryResource("m")
    assert xa_code(res.start, X, TMJOIN) == XAER_NOTA
    assert xa_code(res.start, X, TMRESUME) == XAER_PROTO


def test_invalid_flags_are_rejected():
    res = MemoryResource("m")
    assert xa_code(res.start, X, TMSUCCESS) == XAER_INVAL
    res.start(X)
    assert xa_code(res.end, X, TMJOIN) == XAER_INVAL


def test_prepare_while_associated_or_twice_is_proto():
    res = MemoryResource("m")
    res.start(X)
    res.put("k", 1)
    assert xa_code(res.prepare, X) == XAER_PROTO
    res.end(X)
    res.prepare(X)
    assert xa_code(res.prepare, X) == XAER_PROTO
    assert xa_code(res.commit, X, one_phase=True) == XAER_PROTO


def test_commit_of_unprepared_branch_in_two_phase_is_proto():
    res = MemoryResource("m")
    staged(res, X, k=1)
    assert xa_code(res.commit, X) == XAER_PROTO
    assert xa_code(res.commit, Y) == XAER_NOTA
    assert xa_code(res.rollback, Y) == XAER_NOTA


def test_suspend_and_resume():
    res = MemoryResource("m")
    res.start(X)
    res.put("a", 1)
    res.end(X, TMSUSPEND)
    assert res.current_xid is None
    res.put("outside", 0)  # autocommit while suspended
    assert xa_code(res.prepare, X) == XAER_PROTO, "a suspended branch is not ended"
    res.start(X, TMRESUME)
    res.put("b", 2)
    res.end(X)
    res.commit(X, one_phase=True)
    assert res.snapshot() == {"outside": 0, "a": 1, "b": 2}


def test_a_suspended_branch_can_be_ended():
    res = MemoryResource("m")
    staged(res, X, k=1)
    res.start(Y)
    res.put("j", 1)
    res.end(Y, TMSUSPEND)
    res.end(Y, TMSUCCESS)
    assert res.prepare(Y) == XA_OK


def test_end_tmfail_makes_the_branch_vote_no():
    res = MemoryResource("m")
    res.start(X)
    res.put("k", 1)
    res.end(X, TMFAIL)
    assert xa_code(res.prepare, X) == XA_RBROLLBACK
    assert res.store.branch_xids() == [] and res.store.locked_keys() == {}


def test_join_shares_the_branch():
    store = MemoryStore()
    r1, r2 = MemoryResource("r1", store), MemoryResource("r2", store)
    assert r1.is_same_rm(r2) and not r1.is_same_rm(MemoryResource("other"))
    r1.start(X)
    r1.put("a", 1)
    r2.start(X, TMJOIN)
    r2.put("b", 2)
    r1.end(X)
    assert xa_code(r1.prepare, X) == XAER_PROTO, "r2 is still associated"
    r2.end(X)
    assert r1.prepare(X) == XA_OK
    r1.commit(X)
    assert store.snapshot() == {"a": 1, "b": 2}


# -- failure injection ----------------------------------------------------------------


def test_vote_no_rolls_back():
    res = MemoryResource("m")
    res.vote_no = True
    staged(res, X, k=1)
    assert xa_code(res.prepare, X) == XA_RBROLLBACK
    assert res.store.branch_xids() == []


def test_constraint_is_checked_on_the_after_image():
    res = MemoryResource("m", constraint=lambda data: data.get("balance", 0) >= 0)
    staged(res, X, balance=-5)
    assert xa_code(res.prepare, X) == XA_RBINTEGRITY
    staged(res, Y, balance=5)
    assert res.prepare(Y) == XA_OK


def test_commit_failures_count_down():
    res = MemoryResource("m")
    staged(res, X, k=1)
    res.prepare(X)
    res.commit_failures = 2
    assert xa_code(res.commit, X) == XAER_RMFAIL
    assert xa_code(res.commit, X) == XAER_RMFAIL
    assert res.recover(TMSTARTRSCAN) == [X], "still prepared after a failed commit"
    res.commit(X)
    assert res.snapshot() == {"k": 1}


def test_heuristic_is_remembered_until_forget():
    res = MemoryResource("m")
    staged(res, X, k=1)
    res.prepare(X)
    res.heuristic_on_commit = XA_HEURRB
    assert xa_code(res.commit, X) == XA_HEURRB
    assert res.snapshot() == {}
    assert res.recover(TMSTARTRSCAN) == [X]
    assert xa_code(res.commit, X) == XA_HEURRB, "asked again, same answer"
    res.forget(X)
    assert res.recover(TMSTARTRSCAN) == []
    assert xa_code(res.forget, X) == XAER_NOTA


def test_heuristic_mixed_applies_part_of_the_writes():
    res = MemoryResource("m")
    staged(res, X, a=1, b=2)
    res.prepare(X)
    res.heuristic_on_commit = XA_HEURMIX
    assert xa_code(res.commit, X) == XA_HEURMIX
    assert res.snapshot() == {"a": 1}


def test_heuristic_commit_on_rollback():
    res = MemoryResource("m")
    staged(res, X, k=1)
    res.prepare(X)
    res.heuristic_on_rollback = XA_HEURCOM
    assert xa_code(res.rollback, X) == XA_HEURCOM
    assert res.snapshot() == {"k": 1}


def test_branch_timeout_votes_no():
    now = [0.0]
    res = MemoryResource("m", clock=lambda: now[0])
    assert res.set_transaction_timeout(5) and res.get_transaction_timeout() == 5
    staged(res, X, k=1)
    now[0] = 6.0
    assert xa_code(res.prepare, X) == XA_RBTIMEOUT


def test_down_resource_answers_rmfail():
    res = MemoryResource("m")
    res.down = True
    assert xa_code(res.recover, TMSTARTRSCAN) == XAER_RMFAIL
    assert xa_code(res.start, X) == XAER_RMFAIL


def test_prepared_age_hint():
    now = [10.0]
    res = MemoryResource("m", clock=lambda: now[0])
    staged(res, X, k=1)
    assert res.prepared_age(X) is None
    res.prepare(X)
    now[0] = 12.5
    assert res.prepared_age(X) == 2.5
