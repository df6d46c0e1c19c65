"""SQLite: a receive that delivers runs the application outside the store's transactions.

An SQLite store's transactions take turns on the whole file.  A receive that
delivered on receipt in its own transaction held the file while the
application ran, so the receives of every other sequence waited for it, and
their commits, one after the other, could not share an fsync.  Now the
message is buffered in a short transaction and delivered in one that takes the
file only at its first statement (``SqliteStore.begin_deferred``): the
applications of several sequences run at once, and their commits share the
WAL's fsync.  Real HTTP on 127.0.0.1, a real SQLite file; each test waits for
what it asserts.
"""

from __future__ import annotations

import threading
import time

from .conftest import fast_policy
from .support import RM11, Recorder, wait_for
from .test_bad_input import open_sequence, send_ok

SEQUENCES = 4


def _served(engines, store_for, application):
    server = engines(store_for("sqlite", "server"), fast_policy(deliver_on_receive=True, deliver_apart=True),
                     serve=True, application=application, name="server")
    assert server.invoker.delivers_apart
    return server, server.endpoint_address


def test_off_by_default_and_only_on_sqlite_without_a_transaction_manager(engines, store_for) -> None:
    """A quick method is delivered inside the receiving transaction (one commit, less CPU): the
    policy asks for delivery apart, for methods that wait."""
    quiet = engines(store_for("sqlite", "quiet"), fast_policy(deliver_on_receive=True), name="quiet")
    assert not quiet.invoker.delivers_apart
    memory = engines("memory:", fast_policy(deliver_on_receive=True, deliver_apart=True), name="memory")
    assert not memory.invoker.delivers_apart  # its transactions do not take turns on a file


def test_the_applications_of_two_sequences_run_at_once(engines, store_for) -> None:
    """a1's application waits until b1's has run: with the file held while a1's ran, b1 could
    not even be received, and a1 would give up waiting."""
    received = Recorder()
    b_delivered = threading.Event()
    a_saw_b: list[bool] = []

    def application(envelope: bytes, context: object) -> None:
        received(envelope, context)
        text = received.snapshot()[-1]
        if text == "a1":
            a_saw_b.append(b_delivered.wait(20))
        elif text == "b1":
            b_delivered.set()

    server, url = _served(engines, store_for, application)
    a, b = open_sequence(url, RM11), open_sequence(url, RM11)
    answers: dict[str, list[tuple[int, int]]] = {}
    first = threading.Thread(target=lambda: answers.__setitem__("a", send_ok(url, RM11, a, 1, "a1")))
    first.start()
    assert wait_for(lambda: received.snapshot() == ["a1"], timeout=20)  # a1's application runs
    assert send_ok(url, RM11, b, 1, "b1") == [(1, 1)]  # received, delivered, durable meanwhile
    first.join(30)
    assert a_saw_b == [True] and answers == {"a": [(1, 1)]}
    assert received.snapshot() == ["a1", "b1"]
    assert wait_for(lambda: server.status().delivered == 2, timeout=10), server.status()
    assert server.destination.delivered_on_receipt == 2
    with server.store.begin() as tx:
        assert tx.invoker.count() == 0


def test_deliveries_of_several_sequences_share_one_fsync(engines, store_for, monkeypatch) -> None:
    """Four sequences' messages in their applications at once (a barrier); their commits come
    while the first one's fsync runs (slowed to 0.5 s), and the next fsync covers all of them."""
    received = Recorder()
    at_barrier: list[int] = []  # fsyncs run when the four applications were all in
    barrier = threading.Barrier(SEQUENCES, action=lambda: at_barrier.append(sync.syncs))

    def application(envelope: bytes, context: object) -> None:
        received(envelope, context)
        barrier.wait(20)

    server, url = _served(engines, store_for, application)
    identifiers = [open_sequence(url, RM11) for _ in range(SEQUENCES)]
    sync = server.store._sync
    real_fsync = sync._fsync

    def slow_fsync() -> None:
        time.sleep(0.5)
        real_fsync()

    monkeypatch.setattr(sync, "_fsync", slow_fsync)
    answered: dict[str, list[tuple[int, int]]] = {}

    def send(identifier: str, text: str) -> None:
        answered[identifier] = send_ok(url, RM11, identifier, 1, text)

    threads = [threading.Thread(target=send, args=(identifier, f"m{n}"))
               for n, identifier in enumerate(identifiers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(received.snapshot()) == [f"m{n}" for n in range(SEQUENCES)]
    assert answered == {identifier: [(1, 1)] for identifier in identifiers}
    assert len(at_barrier) == 1
    syncs = sync.syncs - at_barrier[0]  # the four deliveries' commits, and what they cover
    assert syncs < SEQUENCES, f"{syncs} fsyncs for {SEQUENCES} deliveries at once: none shared"
    assert server.destination.delivered_on_receipt == SEQUENCES


def test_automatic_apart_when_another_transaction_holds_the_file_as_a_receive_begins(engines, store_for) -> None:
    """Automatic (``deliver_apart=None``): a receive that finds the store's file free delivers
    inside its transaction (one commit: one caller's messages in turn); one that finds another
    transaction holding it (other sequences arriving at once) buffers the message and delivers
    it apart, so that the file is not held while its application runs.  Both delivered once."""
    received = Recorder()
    server = engines(store_for("sqlite", "server"), fast_policy(deliver_on_receive=True, deliver_apart=None),
                     serve=True, application=received, name="server")
    url = server.endpoint_address
    invoker = server.invoker
    assert server.policy.deliver_apart is None and not invoker.delivers_apart
    decisions: list[bool] = []
    decide = invoker.delivers_apart_now

    def recorded(*args: object) -> bool:
        decision = decide(*args)
        decisions.append(decision)
        return decision

    invoker.delivers_apart_now = recorded  # type: ignore[method-assign]
    apart: list[object] = []
    deliver_received = invoker.deliver_received

    def counted(msg: object) -> object:
        apart.append(msg)
        return deliver_received(msg)

    invoker.deliver_received = counted  # type: ignore[method-assign]
    a = open_sequence(url, RM11)
    assert send_ok(url, RM11, a, 1, "a1") == [(1, 1)]  # nothing else holds the file
    assert decisions == [False] and apart == []
    answers: list[list[tuple[int, int]]] = []
    holding = server.store.begin()
    holding.rms.get("nothing")  # its first statement takes the file
    try:
        sender = threading.Thread(target=lambda: answers.append(send_ok(url, RM11, a, 2, "a2")))
        sender.start()
        assert wait_for(lambda: len(decisions) == 2, timeout=20)  # decided while the file was held
    finally:
        holding.rollback()
    sender.join(30)
    assert decisions == [False, True] and len(apart) == 1
    assert answers == [[(1, 2)]]
    assert received.snapshot() == ["a1", "a2"]
    assert server.destination.delivered_on_receipt == 2
    with server.store.begin() as tx:
        assert tx.invoker.count() == 0
