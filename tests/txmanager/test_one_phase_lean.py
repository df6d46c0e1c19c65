"""The lean one-phase transaction's promotion, by construction: every method of Transaction
that reads more than the lean object keeps promotes it first (a method added to Transaction
later cannot forget to), and what it keeps is enough for what any thread may ask."""

from __future__ import annotations

from txmanager import Status
from txmanager.transaction import _LEAN_SAFE, Transaction, _OnePhase


def test_every_method_but_the_lean_safe_ones_promotes_first():
    for name, member in Transaction.__dict__.items():
        if not (callable(member) or isinstance(member, property)) or isinstance(member, type):
            continue
        if name.startswith("__"):  # __init__ is not run on a made object; __repr__ is lean-safe
            continue
        if name in _LEAN_SAFE:
            assert name not in _OnePhase.__dict__, name
        else:
            assert name in _OnePhase.__dict__, f"Transaction.{name} would run on a lean object"


def test_what_any_thread_may_ask_leaves_it_lean_and_an_enlistment_promotes(tm, a):
    tx = tm.begin()
    assert type(tx) is _OnePhase
    assert tx.status == Status.ACTIVE and not tx.finished and tx.rollback_cause is None
    assert tx.xid.bqual == b"" and repr(tx).startswith("<Transaction ")
    assert not tx.is_expired()
    assert type(tx) is _OnePhase
    tx.enlist_resource(a)  # a resource of its own kind: the general path's _enlist_sole
    assert type(tx) is Transaction and tx._sole is a and tx._lock is not None
    a.put("k", "v")
    tm.commit()
    assert tx.status == Status.COMMITTED and a.snapshot() == {"k": "v"}


def test_a_lean_transaction_with_nothing_enlisted_commits_and_rolls_back(tm):
    with tm.transaction() as tx:
        pass
    assert tx.status == Status.COMMITTED
    tx = tm.begin()
    tx.set_rollback_only()
    assert type(tx) is _OnePhase and tx.status == Status.MARKED_ROLLBACK
    tm.rollback()
    assert tx.status == Status.ROLLEDBACK and type(tx) is Transaction
