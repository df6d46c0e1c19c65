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
from .support import RM11, Recorder, batches_on_disk, wait_for
from .test_bad_input import first_message_senders, open_sequence, send_ok

SEQUENCES = 4


def _served(engines, store_for, application):
    server = engines(store_for("sqlite", "server"), fast_policy(deliver_on_receive=True, deliver_apart=True),
                     serve=True, application=application, name="server")
    assert server.invoker.delivers_apart
    return server, server.endpoint_address


def test_off_by_default_and_only_on_sqlite_without_a_transaction_manager(engines, store_for) -> None:
    """By default every receive delivers inside its transaction (``deliver_apart=False``; ``None``
    chooses per receive, see the automatic test below); ``True`` always delivers apart, and only
    on a store whose transactions take the file."""
    quiet = engines(store_for("sqlite", "quiet"), fast_policy(deliver_on_receive=True), name="quiet")
    assert quiet.policy.deliver_apart is False and not quiet.invoker.delivers_apart
    assert not quiet.invoker.delivers_apart_now(others_receiving=True)
    memory = engines("memory:", fast_policy(deliver_on_receive=True, deliver_apart=True), name="memory")
    assert not memory.invoker.delivers_apart  # its transactions do not take turns on a file
    assert not memory.invoker.delivers_apart_now(others_receiving=True)


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
    threads, answered = first_message_senders(url, RM11, identifiers)
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


def test_automatic_apart_when_another_sequences_receive_is_under_way(engines, store_for) -> None:
    """Automatic (``deliver_apart=None``): a receive delivers inside its transaction
    (one commit) unless a receive of another sequence is under way in the process as it begins;
    then it buffers the message and delivers it apart, so that neither waits for the file while
    the other's application runs.  A background transaction that holds the file (the old
    rule's trigger, which sent one client's 1 MiB messages apart) does not count.  Each message
    is delivered once, and the buffer ends empty."""
    received = Recorder()
    release_a1 = threading.Event()

    def application(envelope: bytes, context: object) -> None:
        received(envelope, context)
        if received.snapshot()[-1] == "a1":
            assert release_a1.wait(30)

    server = engines(store_for("sqlite", "server"), fast_policy(deliver_on_receive=True, deliver_apart=None),
                     serve=True, application=application, name="server")
    url = server.endpoint_address
    invoker = server.invoker
    decisions: list[bool] = []
    decide = invoker.delivers_apart_now

    def recorded(*args: object) -> bool:
        decision = decide(*args)  # type: ignore[arg-type]
        decisions.append(decision)
        return decision

    invoker.delivers_apart_now = recorded  # type: ignore[method-assign]
    apart: list[object] = []
    deliver_received = invoker.deliver_received

    def counted(msg: object, *more: object) -> object:
        apart.append(msg)
        return deliver_received(msg, *more)  # type: ignore[arg-type]

    invoker.deliver_received = counted  # type: ignore[method-assign]
    a, b = open_sequence(url, RM11), open_sequence(url, RM11)
    answers: dict[str, list[tuple[int, int]]] = {}

    def send(identifier: str, number: int, text: str) -> threading.Thread:
        def run() -> None:
            answers[text] = send_ok(url, RM11, identifier, number, text)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    first = send(a, 1, "a1")
    assert wait_for(lambda: received.snapshot() == ["a1"], timeout=20)  # inside: nothing else under way
    assert decisions == [False]
    second = send(b, 1, "b1")
    assert wait_for(lambda: len(decisions) == 2, timeout=20)  # decided while a1's receive is under way
    release_a1.set()
    first.join(30)
    second.join(30)
    assert decisions == [False, True] and len(apart) == 1
    assert answers == {"a1": [(1, 1)], "b1": [(1, 1)]}
    holding = server.store.begin()
    holding.rms.get("nothing")  # its first statement takes the file
    try:
        third = send(a, 2, "a2")
        assert wait_for(lambda: len(decisions) == 3, timeout=20)  # decided while the file was held
    finally:
        holding.rollback()
    third.join(30)
    assert decisions == [False, True, False] and len(apart) == 1
    assert answers["a2"] == [(1, 2)]
    assert sorted(received.snapshot()) == ["a1", "a2", "b1"]
    assert server.destination.delivered_on_receipt == 3
    with server.store.begin() as tx:
        assert tx.invoker.count() == 0


def test_receives_of_several_sequences_buffer_in_one_transaction(engines, store_for) -> None:
    """Four sequences' messages arrive while another transaction holds the file: the first
    receive waits for the file with its own message, the three behind it queue, and once the
    file is free the first of those records all three in one transaction (group commit across
    sequences: one turn on the file, one commit).  Each is delivered once and acknowledged."""
    received = Recorder()
    server, url = _served(engines, store_for, received)
    identifiers = [open_sequence(url, RM11) for _ in range(SEQUENCES)]
    combiner = server.destination._apart_receipts
    kinds = _batches_of(combiner)
    threads, answered = first_message_senders(url, RM11, identifiers)
    holding = server.store.begin()
    holding.rms.get("nothing")  # its first statement takes the file
    try:
        for t in threads:
            t.start()
        # one leads (waiting for the file), the others wait for its batch to end
        assert wait_for(lambda: combiner.queued(None) == SEQUENCES - 1, timeout=20)
    finally:
        holding.rollback()
    for t in threads:
        t.join(60)
    assert answered == {identifier: [(1, 1)] for identifier in identifiers}
    assert sorted(received.snapshot()) == [f"m{n}" for n in range(SEQUENCES)]
    receipts = [batch.count("_Receipt") for batch in kinds if "_Receipt" in batch]
    assert receipts == [1, SEQUENCES - 1]
    assert server.destination.delivered_on_receipt == SEQUENCES
    with server.store.begin() as tx:
        assert tx.invoker.count() == 0


def _batches_of(combiner) -> list[list[str]]:
    """The kinds of the items of each batch ``combiner`` runs from now on (receipts, removals)."""
    kinds: list[list[str]] = []
    run = combiner._batch

    def recorded(items: list[object]) -> list[object]:
        kinds.append([type(item).__name__ for item in items])
        return run(items)

    combiner._batch = recorded
    return kinds


def test_removals_from_the_buffer_of_several_deliveries_share_one_transaction(engines, store_for) -> None:
    """Four sequences' applications run apart at once; while another transaction holds the file
    they end, and each delivery's removal of its message from the buffer waits for the file: the
    first with its own, the three behind it queued, which the first of them then removes in one
    transaction (one turn on the file and one commit for three, where each took its own).  Each
    message is delivered once and acknowledged only after that commit; the buffer ends empty."""
    received = Recorder()
    go = threading.Event()

    def application(envelope: bytes, context: object) -> None:
        received(envelope, context)
        assert go.wait(30)

    server, url = _served(engines, store_for, application)
    identifiers = [open_sequence(url, RM11) for _ in range(SEQUENCES)]
    combiner = server.destination._apart_receipts
    threads, answered = first_message_senders(url, RM11, identifiers)
    for t in threads:
        t.start()
    assert wait_for(lambda: len(received.snapshot()) == SEQUENCES, timeout=20)  # buffered, applications in
    kinds = _batches_of(combiner)
    returned = batches_on_disk(combiner, server.store, lambda outcome: outcome)
    handed_on, commits = combiner.handed_on, server.store._sync.commits
    holding = server.store.begin()
    holding.rms.get("nothing")  # its first statement takes the file
    try:
        go.set()
        # one removal leads (waiting for the file), the others wait for its batch to end
        assert wait_for(lambda: combiner.queued(None) == SEQUENCES - 1, timeout=20)
        assert answered == {}  # nothing answered before its removal is on disk
    finally:
        holding.rollback()
    for t in threads:
        t.join(60)
    assert answered == {identifier: [(1, 1)] for identifier in identifiers}
    assert kinds == [["_Removal"], ["_Removal"] * (SEQUENCES - 1)]
    assert server.store._sync.commits - commits == 2
    # the three woken with their removal on disk, the next batch let in before its fsync
    assert returned[-1] == (SEQUENCES - 1, True, handed_on + 1), returned
    assert sorted(received.snapshot()) == [f"m{n}" for n in range(SEQUENCES)]
    assert server.destination.delivered_on_receipt == SEQUENCES
    with server.store.begin() as tx:
        assert tx.invoker.count() == 0
