"""A finished memory-store transaction is freed by reference counting, not left to the collector.

Its managers (``tx.rms``...) hold the transaction, which held them: each transaction made a
reference cycle, and at 16 sequences the memory store runs 3-4 transactions a message, so the
garbage collector's youngest generation filled with them (a collection every 5-6 messages).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from wsrm_plugin.store.memory import MemoryStore

RM11 = "http://docs.oasis-open.org/ws-rx/wsrm/200702"
WSA = "http://www.w3.org/2005/08/addressing"


@pytest.fixture
def no_collector() -> Iterator[None]:
    """The collector off: only reference counting may free what the test lets go of."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@pytest.mark.parametrize("end", ["commit", "rollback", "raise"])
def test_an_ended_transaction_and_its_managers_are_freed_at_once(no_collector: None, end: str) -> None:
    store = MemoryStore()
    tx = store.begin()
    try:
        with tx:
            tx.rmd.get("s1")
            tx.invoker.count("s1")
            tx.rms.create("k1", target="http://server/svc", acks_to="http://client/acks",
                          rm_version=RM11, wsa_version=WSA)
            tx.rms_messages.enqueue("k1", b"<env/>", action="urn:op", soap_version="1.2", message_id="urn:m1")
            tx.conditions.list_all()
            managers = [weakref.ref(getattr(tx, name))
                        for name in ("rms", "rms_messages", "rmd", "invoker", "conditions")]
            if end == "commit":
                tx.commit()
            elif end == "rollback":
                tx.rollback()
            else:
                raise RuntimeError("the block failed")
    except RuntimeError:
        pass
    ref = weakref.ref(tx)
    del tx
    assert ref() is None and all(m() is None for m in managers)

def test_a_manager_read_after_the_end_refuses_as_before() -> None:
    store = MemoryStore()
    with store.begin() as tx:
        kept = tx.rms
        kept.create("k1", target="http://server/svc", acks_to="http://client/acks", rm_version=RM11,
                    wsa_version=WSA)
    from wsrm_plugin.store import TransactionClosedError
    for manager in (kept, tx.rms):
        with pytest.raises(TransactionClosedError):
            manager.get("k1")
