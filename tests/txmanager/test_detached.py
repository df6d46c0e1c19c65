"""Transactions prepared in one place and decided in another (the shape of a Spark job).

Workers (each with its own TransactionManager, as separate processes would
have) do their work under one global xid with their own branch prefixes and
``prepare_and_detach``; a coordinator logs the decision and commits exactly the
branches it accepts; recovery rolls back the others.
"""

from __future__ import annotations

import pytest

from txmanager import IllegalStateError, MemoryLog, MemoryResource, RollbackError, TransactionManager
from txmanager.memory import MemoryStore
from txmanager.transaction import PreparedBranch, Status

from .conftest import log_records


def _worker_prepares(gxid, prefix: str, store: MemoryStore, key: str, value):
    """One 'process': its own manager and connection, prepares and detaches."""
    tm = TransactionManager(node="worker", log=MemoryLog())
    resource = MemoryResource("mem", store)
    tx = tm.begin(xid=gxid, branch_prefix=prefix)
    tx.enlist_resource(resource)
    resource.put(key, value)
    branches = tx.prepare_and_detach()
    assert tx.status == Status.PREPARED and tm.get_transaction() is None
    return branches


@pytest.fixture
def coordinator(tmp_path):
    store = MemoryStore()
    tm = TransactionManager(node="driver", log=tmp_path / "tm.log", safety_interval=0)
    tm.register_resource(MemoryResource("mem", store))
    yield tm, store
    tm.close()


def test_accepted_branches_commit_and_a_failed_attempt_is_rolled_back(coordinator, tmp_path):
    tm, store = coordinator
    gxid = tm.begin_detached()
    p0 = _worker_prepares(gxid, "p0.t0.", store, "row0", "a")
    p1_failed = _worker_prepares(gxid, "p1.t1.", store, "row1-failed", "b")
    p1 = _worker_prepares(gxid, "p1.t2.", store, "row1", "b")
    assert [b.xid.bqual for b in p0 + p1_failed + p1] == [b"p0.t0.0", b"p1.t1.0", b"p1.t2.0"]
    assert all(b.xid.global_xid() == gxid for b in p0 + p1)

    # running: recovery (safety interval 0) must not touch the job's branches yet
    report = tm.recovery.recover_once()
    assert report.rolled_back == [] and len(store.branch_xids()) == 3

    assert tm.commit_prepared(gxid, p0 + p1) == []
    assert store.snapshot() == {"row0": "a", "row1": "b"}
    assert [b.xid for b in p1_failed] == store.branch_xids()  # still prepared, not decided

    report = tm.recovery.recover_once()
    assert report.rolled_back == [p1_failed[0].xid] and report.committed == []
    assert store.branch_xids() == [] and store.snapshot() == {"row0": "a", "row1": "b"}
    kinds = [r.get("type") or r.get("kind") or next(iter(r)) for r in log_records(tmp_path / "tm.log")]
    assert len(kinds) == 2  # the decision and its "done"


def test_recovery_commits_only_the_decided_branches_after_a_crash(tmp_path):
    store = MemoryStore()
    tm = TransactionManager(node="driver", log=tmp_path / "tm.log", safety_interval=0, retries=0)
    down = MemoryResource("mem", store)
    tm.register_resource(down)
    gxid = tm.begin_detached()
    accepted = _worker_prepares(gxid, "p0.t5.", store, "k", 1)
    straggler = _worker_prepares(gxid, "p0.t6.", store, "k2", 2)
    down.down = True  # phase 2 cannot reach the resource: the decision is logged, commit is left
    assert tm.commit_prepared(gxid, accepted) == accepted
    tm.close()

    restarted = TransactionManager(node="driver", log=tmp_path / "tm.log", safety_interval=0)
    restarted.register_resource(MemoryResource("mem", store))
    report = restarted.recovery.recover_once()
    restarted.close()
    assert report.committed == [accepted[0].xid]
    assert report.rolled_back == [straggler[0].xid]
    assert report.done == [gxid]
    assert store.snapshot() == {"k": 1}


def test_rollback_prepared_and_presumed_abort(coordinator):
    tm, store = coordinator
    gxid = tm.begin_detached()
    branches = _worker_prepares(gxid, "p0.t0.", store, "x", 1)
    assert tm.rollback_prepared(gxid, branches) == []
    assert store.snapshot() == {} and store.branch_xids() == []
    # a driver that died before deciding: recovery presumes abort once the job is not running
    gxid2 = tm.begin_detached()
    _worker_prepares(gxid2, "p0.t0.", store, "y", 1)
    tm._release_detached(gxid2)  # what a new driver process looks like: the job is not running
    assert len(tm.recovery.recover_once().rolled_back) == 1
    assert store.snapshot() == {}


def test_a_no_vote_rolls_every_branch_back(coordinator):
    tm, store = coordinator
    gxid = tm.begin_detached()
    worker = TransactionManager(node="worker", log=MemoryLog())
    good = MemoryResource("mem", store)
    bad = MemoryResource("other", MemoryStore())
    bad.vote_no = True
    tx = worker.begin(xid=gxid, branch_prefix=b"p3.t9.")
    for resource, key in ((good, "a"), (bad, "b")):
        tx.enlist_resource(resource)
        resource.put(key, 1)
        tx.delist_resource(resource)
    with pytest.raises(RollbackError, match="voted no"):
        tx.prepare_and_detach()
    assert store.branch_xids() == [] and bad.store.branch_xids() == []
    assert store.snapshot() == {}


def test_decisions_are_checked_before_anything_is_logged(coordinator):
    tm, store = coordinator
    gxid = tm.begin_detached()
    branches = _worker_prepares(gxid, "p0.t0.", store, "x", 1)
    stranger = PreparedBranch(branches[0].xid, "not-registered")
    with pytest.raises(IllegalStateError, match="register_resource"):
        tm.commit_prepared(gxid, [stranger])
    other = tm.begin_detached()
    with pytest.raises(ValueError, match="not a branch of"):
        tm.commit_prepared(other, branches)
    assert tm.log.pending() == {}
    with pytest.raises(IllegalStateError, match="already running"):
        tm.begin_detached(gxid)
    # the text form travels between processes and comes back equal
    assert [PreparedBranch.from_text(b.to_text()) for b in branches] == branches
    assert tm.commit_prepared(gxid, branches) == []
    assert store.snapshot() == {"x": 1}
