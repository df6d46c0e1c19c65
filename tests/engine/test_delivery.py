"""Delivery to the application: transactions, failures, and the caller's XA transaction.

With a transaction manager, "update my database AND send" (client) and
"take the message AND update my database" (server) are one XA transaction
each: here the database is txmanager's in-memory XA resource, a real
resource manager with locks, prepare and rollback.
"""

from __future__ import annotations

import pytest

from txmanager import MemoryResource, TransactionManager

from .conftest import fast_policy
from .support import ACTION, Recorder, item_text, payload, wait_for


#: One message per store transaction (the default), and batches whose members each run in
#: a savepoint, so that a failing member is settled alone, exactly as without batching.
BATCHES = pytest.mark.parametrize("batch", [1, 16], ids=["one-by-one", "batched"])


@BATCHES
def test_a_failing_message_is_given_up_after_its_attempts_and_reported(engines, store_for, batch):
    failures = []
    app = Recorder(fail_on=lambda text: text == "poison")
    policy = fast_policy(max_delivery_attempts=3, delivery_batch=batch, delivery_retry_delay=0.05,
                         max_retry_cycles=1, retry_cycle_delay=0.2, poison_handling="continue")
    server = engines(store_for("sqlite", "s"), policy,
                     serve=True, application=app, on_delivery_failure=failures.append, name="server")
    client = engines(store_for("memory", "c"), name="client")
    for text in ("a", "poison", "b"):
        client.send(server.endpoint_address, payload(text), action=ACTION)
    client.close(server.endpoint_address)

    assert wait_for(lambda: app.snapshot() == ["a", "b"] and failures, timeout=30), app.snapshot()
    assert app.calls == 8  # a, poison 3 x 2 cycles (each rolled back), b: no endless redelivery
    [failure] = failures
    assert item_text(failure.payload) == "poison" and failure.message_number == 2
    assert isinstance(failure.error, RuntimeError)
    # given up, not dropped: it waits in the poison store for an operator
    [kept] = server.poison_messages()
    assert kept.poison_id == failure.poison_id and kept.number == 2 and kept.total_attempts == 6
    assert item_text(kept.payload) == "poison" and not kept.held
    # the counter goes up after the delivery's commit, which may follow the application's call
    assert wait_for(lambda: server.status().delivered == 2), server.status()
    assert server.status().delivery_failures == 1
    assert wait_for(lambda: not server.store.status().rmd, timeout=30)


@BATCHES
def test_a_message_that_fails_once_is_delivered_on_retry(engines, store_for, batch):
    flaky = {"left": 1}

    def app(envelope, context):
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("database restarting")
        seen.append(item_text(envelope))

    seen: list[str | None] = []
    failures = []
    server = engines(store_for("memory", "s"), fast_policy(delivery_batch=batch), serve=True, application=app,
                     on_delivery_failure=failures.append)
    client = engines(store_for("memory", "c"))
    for text in ("x", "y"):
        client.send(server.endpoint_address, payload(text), action=ACTION)
    assert wait_for(lambda: seen == ["x", "y"])
    assert failures == []


@pytest.fixture
def tm():
    manager = TransactionManager(node="engine-test", log=None)
    yield manager
    manager.close()


def test_send_joins_the_callers_xa_transaction(engines, store_for, tm):
    received = Recorder()
    server = engines(store_for("memory", "s"), serve=True, application=received, name="server")
    client = engines(store_for("sqlite", "c"), tm=tm, name="client")
    db = MemoryResource("orders")
    target = server.endpoint_address

    with pytest.raises(RuntimeError):
        with tm.transaction() as tx:
            tx.enlist_resource(db)
            db.put("order-1", "placed")
            client.send(target, payload("order-1"), action=ACTION)
            raise RuntimeError("the order is cancelled before commit")
    assert db.snapshot() == {} and not client.store.status().rms

    with tm.transaction() as tx:
        tx.enlist_resource(db)
        db.put("order-2", "placed")
        client.send(target, payload("order-2"), action=ACTION)
    assert db.snapshot() == {"order-2": "placed"}
    assert wait_for(lambda: received.snapshot() == ["order-2"])


def test_delivery_and_the_applications_database_commit_together(engines, store_for, tm):
    db = MemoryResource("ledger")
    attempts: dict[str, int] = {}

    def app(envelope, context):
        text = item_text(envelope)
        tm.get_transaction().enlist_resource(db)
        db.put(text, context.message_number)
        attempts[text] = attempts.get(text, 0) + 1
        if text == "t2" and attempts[text] == 1:
            raise RuntimeError("fails after writing: the write must roll back with the delivery")

    server = engines(store_for("sqlite", "s"), serve=True, application=app, tm=tm, name="server")
    client = engines(store_for("memory", "c"), name="client")
    for i in range(4):
        client.send(server.endpoint_address, payload(f"t{i}"), action=ACTION)
    client.close(server.endpoint_address)
    assert wait_for(lambda: len(db.snapshot()) == 4, timeout=30), db.snapshot()
    assert db.snapshot() == {"t0": 1, "t1": 2, "t2": 3, "t3": 4}
    assert attempts == {"t0": 1, "t1": 1, "t2": 2, "t3": 1}
    assert wait_for(lambda: not server.store.status().rmd, timeout=30)
    assert wait_for(lambda: server.status().delivered == 4, timeout=15)  # counted after the commit
