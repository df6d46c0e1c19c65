"""The engine's failure model on its own (no spyne): what goes to the poison store, and how.

A failure to process (any exception) and an application fault nobody can be
answered with (a one-way message) both end in the poison store, kept; the
store's transaction in the XA case is a branch of the delivery's global
transaction (SQLite XA keeps undo images of the poison table too).
"""

from __future__ import annotations

import pytest

from txmanager import MemoryResource, TransactionManager
from wsrm_plugin.engine import ApplicationFault
from wsrm_plugin.wire import SOAP12, SoapFault, fault_envelope, to_bytes

from .conftest import fast_policy
from .support import ACTION, Recorder, item_text, payload, wait_for

QUICK = dict(max_delivery_attempts=2, delivery_retry_delay=0.02, max_retry_cycles=1, retry_cycle_delay=0.1)


@pytest.fixture
def tm():
    manager = TransactionManager(node="poison-test", log=None)
    yield manager
    manager.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_one_way_application_fault_nobody_can_hear_is_kept_as_poison(engines, store_for, tm, kind):
    failures = []
    db = MemoryResource("ledger")
    seen = Recorder()

    def app(envelope, context):
        tm.get_transaction().enlist_resource(db)
        db.put(item_text(envelope), "done")
        if item_text(envelope) == "refused":
            raise ApplicationFault(to_bytes(fault_envelope(SoapFault("no such item", code="Receiver"), SOAP12)))
        seen(envelope, context)

    server = engines(store_for(kind, "s"), fast_policy(**QUICK), serve=True, application=app, tm=tm,
                     on_delivery_failure=failures.append)
    client = engines(store_for("memory", "c"))
    for text in ("a", "refused", "b"):
        client.send(server.endpoint_address, payload(text), action=ACTION)

    assert wait_for(lambda: server.status().poisoned == 1 and failures, timeout=30), server.status()
    [kept] = server.poison_messages()
    # an application fault is the service's answer, not a transient failure: no retry cycles
    assert (kept.number, kept.total_attempts, kept.held) == (2, 2, True)
    assert "no such item" in failures[0].error.envelope.decode()
    assert seen.snapshot() == ["a"]  # held: "b" waits
    assert db.snapshot() == {"a": "done"}  # the faulted attempts' writes rolled back with them
    server.discard_poison(kept.poison_id)
    assert wait_for(lambda: seen.snapshot() == ["a", "b"], timeout=30), seen.snapshot()
    # "b" is seen inside its delivery's transaction: its row is there once that commits
    assert wait_for(lambda: db.snapshot() == {"a": "done", "b": "done"}, timeout=30), db.snapshot()
    assert server.status().poisoned == 0


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_failure_to_process_is_retried_in_cycles_under_xa_then_kept(engines, store_for, tm, kind):
    calls = Recorder(fail_on=lambda text: text == "bug")
    server = engines(store_for(kind, "s"), fast_policy(**QUICK), serve=True, application=calls, tm=tm)
    client = engines(store_for("memory", "c"))
    for text in ("a", "bug"):
        client.send(server.endpoint_address, payload(text), action=ACTION)

    assert wait_for(lambda: server.status().poisoned == 1, timeout=30), server.status()
    assert calls.calls == 1 + 4  # "a", then 2 attempts x 2 cycles
    [kept] = server.poison_messages()
    assert (kept.total_attempts, kept.cycles) == (4, 2) and "refuses 'bug'" in kept.last_error
    assert server.poison_message(kept.poison_id) == kept
    # this process's counters move just after the commit the store's count shows
    assert wait_for(lambda: server.status().delivery_failures == 1, timeout=30), server.status()
    status = server.status()
    assert status.retrying == 0 and status.delivery_retries == 4 and status.delivery_failures == 1
    with pytest.raises(ValueError, match="not a poison message id"):
        server.poison_message("bug")


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_several_invoker_threads_spend_exactly_the_configured_attempts(engines, store_for, kind):
    """Between a failed delivery's rollback and the transaction that counts the attempt, another
    invoker thread must not take the message and run the application once more."""
    import threading
    from collections import Counter

    attempts: Counter[str] = Counter()
    lock = threading.Lock()

    def app(envelope, context):
        with lock:
            attempts[item_text(envelope)] += 1
        raise RuntimeError("the database is down")

    policy = fast_policy(max_delivery_attempts=3, delivery_retry_delay=0.0, max_retry_cycles=0,
                         invoker_threads=4, poison_handling="continue")
    server = engines(store_for(kind, "s"), policy, serve=True, application=app)
    clients = [engines(store_for("memory", f"c{i}")) for i in range(4)]
    texts = [f"m{i}" for i in range(24)]
    for i, text in enumerate(texts):
        clients[i % 4].send(server.endpoint_address, payload(text), action=ACTION)
    assert wait_for(lambda: server.status().poisoned == len(texts), timeout=60), server.status()
    assert {text: attempts[text] for text in texts} == {text: 3 for text in texts}
    assert all(kept.total_attempts == 3 for kept in server.poison_messages())
