"""Delivery on receipt: a message next in order is handed over in the transaction that receives it.

``RMPolicy.deliver_on_receive`` (on by default under a transaction manager;
switched on here for the memory and SQLite stores) saves the second
transaction of every message: no buffer row, no invoker thread.  What must
not change: every message exactly once, in order, nothing accepted lost when
the application fails, duplicates and out-of-order arrivals handled.  The
PostgreSQL + transaction manager deployment is covered in
``test_one_phase.py`` and by the kill runs.
"""

from __future__ import annotations

import threading
import time

import pytest

from wsrm_plugin.engine import DeliveryAssurance, ReliableEngine, RMPolicy
from wsrm_plugin.engine import destination as destination_module
from wsrm_plugin.engine import invoker as invoker_module

from .conftest import fast_policy
from .support import ACTION, RM11, Recorder, application_message, payload, post, wait_for
from .test_bad_input import open_sequence, send_ok


class ThreadRecorder(Recorder):
    """Also notes the thread each message was delivered on."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.threads: list[str] = []

    def __call__(self, envelope: bytes, context: object) -> None:
        super().__call__(envelope, context)
        self.threads.append(threading.current_thread().name)


def _store(kind: str, request) -> str:
    if kind == "memory":
        return "memory:"
    if kind == "sqlite":  # deliver_apart: outside its receive's transaction (test_deliver_apart.py)
        return f"sqlite:///{request.getfixturevalue('tmp_path')}/dor.db"
    return "postgresql:" + request.getfixturevalue("pg_dsn_factory")("dor")


#: PostgreSQL records a steady stream's message in the round trip that locks its sequence, before
#: the checks (``StoreTransaction.receive_in_order``): its rollbacks and wrong guesses, tested here
KINDS = ["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def served(engines, application, store: str = "memory:") -> tuple[ReliableEngine, str, str]:
    """A server that delivers on receipt, and a sequence opened on it by hand."""
    server = engines(store, fast_policy(deliver_on_receive=True, deliver_apart=True), serve=True,
                     application=application, name="server")
    url = server.endpoint_address
    return server, url, open_sequence(url, RM11)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgresql"])
def test_messages_are_delivered_by_the_receiving_thread_and_never_buffered(engines, store_for, kind,
                                                                           request, monkeypatch) -> None:
    """(On PostgreSQL each receive after the first records and takes its message in one
    statement: ``StoreTransaction.receive_and_take``.)

    Each message must arrive after the one before it was delivered: the client sends one at a
    time, waits as long as it takes for each answer and retransmits nothing meanwhile (a copy
    sent again while the first is still being delivered arrives out of turn), and a stall of a
    loaded machine does not make the application count as slow (a moving average of its wall
    time above ``QUICK_APPLICATION`` sends messages through the buffer, by design: the test of
    that is ``test_a_slow_application_gets_its_messages_through_the_buffer_until_it_is_quick_again``)."""
    monkeypatch.setattr(invoker_module, "QUICK_APPLICATION", 60.0)
    if kind == "postgresql":
        make = request.getfixturevalue("pg_dsn_factory")
        server_store, client_store = f"postgresql:{make('dor')}", f"postgresql:{make('dor')}"
    else:
        server_store, client_store = store_for(kind, "server"), store_for(kind, "client")
    received = ThreadRecorder()
    server = engines(server_store, fast_policy(deliver_on_receive=True), serve=True,
                     application=received, name="server")
    client = engines(client_store, fast_policy(send_concurrency=1, base_retransmission_interval=60.0,
                                               http_timeout=60.0), name="client")
    for i in range(10):
        client.send(server.endpoint_address, payload(f"m{i}"), action=ACTION)
    assert wait_for(lambda: len(received.snapshot()) == 10, timeout=60), received.snapshot()
    assert received.snapshot() == [f"m{i}" for i in range(10)]
    # one at a time, in order: each was next when it arrived, so none went through the buffer
    # (counted after each commit, which may follow the application's last call by a moment)
    assert wait_for(lambda: server.status().delivered == 10, timeout=10), server.status()
    assert server.destination.delivered_on_receipt == server.status().delivered_on_receipt == 10
    assert not any("invoker" in name for name in received.threads), received.threads
    with server.store.begin() as tx:
        assert tx.invoker.count() == 0


def test_off_by_default_without_a_transaction_manager_where_a_commit_is_cheap(engines) -> None:
    assert RMPolicy().delivers_on_receive(transaction_manager=False) is False
    # where a commit is costly (SQLite, PostgreSQL) a second transaction costs a second flush
    assert RMPolicy().delivers_on_receive(transaction_manager=False, costly_commits=True) is True
    assert RMPolicy(delivery=DeliveryAssurance.EXACTLY_ONCE).delivers_on_receive(False, True) is False
    assert RMPolicy().delivers_on_receive(transaction_manager=True) is True
    assert RMPolicy(deliver_on_receive=False).delivers_on_receive(transaction_manager=True) is False
    from wsrm_plugin.store import open_store
    from wsrm_plugin.store.postgres import PostgresStore
    from wsrm_plugin.store.sqlite import SqliteStore
    assert SqliteStore.commits_are_costly and PostgresStore.commits_are_costly
    assert not open_store("memory:").commits_are_costly
    with pytest.raises(ValueError, match="deliver_on_receive"):
        RMPolicy(deliver_on_receive="yes")  # type: ignore[arg-type]
    received = ThreadRecorder()
    server = engines("memory:", fast_policy(), serve=True, application=received, name="server")
    client = engines("memory:", fast_policy(), name="client")
    client.send(server.endpoint_address, payload("m0"), action=ACTION)
    assert wait_for(lambda: received.snapshot() == ["m0"], timeout=30)
    # buffered, then delivered from the buffer (by its receiving thread once it answered: see
    # test_deliver_after_response)
    assert server.destination.delivered_on_receipt == 0 and server.invoker.delivered == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_delivery_on_receipt_keeps_the_message_for_the_invoker(engines, kind, request) -> None:
    """The application fails on m2's first try: its receipt rolls back with the delivery, it is
    received again into the buffer, and the invoker delivers it (and what came after) in order."""
    failed = []

    def fail_first_m2(text: str | None) -> bool:
        if text == "m2" and not failed:
            failed.append(text)
            return True
        return False

    received = ThreadRecorder(fail_on=fail_first_m2)
    server = engines(_store(kind, request), fast_policy(deliver_on_receive=True, deliver_apart=True),
                     serve=True, application=received, name="server")
    client = engines("memory:", fast_policy(send_concurrency=1), name="client")
    for i in range(5):
        client.send(server.endpoint_address, payload(f"m{i}"), action=ACTION)
    assert wait_for(lambda: received.snapshot() == [f"m{i}" for i in range(5)], timeout=30), received.snapshot()
    assert failed == ["m2"]
    assert wait_for(lambda: client.status().unacked == 0, timeout=20)
    assert wait_for(lambda: server.status().delivered == 5, timeout=10), server.status()  # counted after commit
    assert server.destination.delivered_on_receipt < 5
    with server.store.begin() as tx:
        assert tx.invoker.count() == 0


@pytest.mark.parametrize("kind", KINDS)
def test_duplicates_and_overtaking_messages_are_delivered_once_in_order(engines, kind, request) -> None:
    """Raw posts: 2 before 1 (2 is buffered, 1 fills the gap on receipt, the invoker delivers
    2), then both again (duplicates: acknowledged, not delivered)."""
    received = ThreadRecorder()
    server, url, identifier = served(engines, received, _store(kind, request))
    assert send_ok(url, RM11, identifier, 2, "two") == [(2, 2)]
    assert received.snapshot() == []
    assert send_ok(url, RM11, identifier, 1, "one") == [(1, 2)]
    assert wait_for(lambda: received.snapshot() == ["one", "two"], timeout=20), received.snapshot()
    assert send_ok(url, RM11, identifier, 1, "one") == [(1, 2)]
    assert send_ok(url, RM11, identifier, 2, "two") == [(1, 2)]
    assert send_ok(url, RM11, identifier, 3, "three") == [(1, 3)]
    assert wait_for(lambda: received.snapshot() == ["one", "two", "three"], timeout=20)
    assert server.destination.delivered_on_receipt == 2  # one and three; two came through the buffer
    assert received.snapshot() == ["one", "two", "three"]


def test_receives_overtaking_each_other_in_bursts_deliver_each_message_once_in_order(engines) -> None:
    """Bursts of 8 concurrent requests sent in reverse order (more than the server's 4 HTTP
    threads): whichever way each is handled, on receipt or through the buffer, every message
    is delivered exactly once and in order."""
    received = ThreadRecorder()
    server, url, identifier = served(engines, received)
    bodies = [application_message(RM11, url, identifier, n, f"m{n}") for n in range(1, 41)]
    results: dict[int, int] = {}

    def send(n: int) -> None:
        results[n] = post(url, bodies[n - 1]).status

    for start in range(1, 41, 8):
        threads = [threading.Thread(target=send, args=(n,)) for n in reversed(range(start, start + 8))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert sorted(results) == list(range(1, 41)) and set(results.values()) == {200}
    assert wait_for(lambda: len(received.snapshot()) == 40, timeout=30), received.snapshot()
    assert received.snapshot() == [f"m{n}" for n in range(1, 41)]
    assert wait_for(lambda: server.status().delivered == 40, timeout=10), server.status()  # counted after commit
    with server.store.begin() as tx:
        assert tx.invoker.count() == 0


def test_a_message_that_overtook_the_one_before_it_waits_for_it(engines, monkeypatch) -> None:
    """3 arrives before 2 (1 taken): it waits for 2 (here up to 5 s, not the default moment,
    so the test does not race the clock), 2 arrives and is taken, then 3: none buffered."""
    from wsrm_plugin.engine import destination

    monkeypatch.setattr(destination, "REORDER_WAIT", 5.0)
    received = ThreadRecorder()
    server, url, identifier = served(engines, received)
    assert send_ok(url, RM11, identifier, 1, "m1") == [(1, 1)]
    third: list[list[tuple[int, int]]] = []
    thread = threading.Thread(target=lambda: third.append(send_ok(url, RM11, identifier, 3, "m3")))
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and received.snapshot() == ["m1"]  # 3 is in, waiting for 2
    assert send_ok(url, RM11, identifier, 2, "m2") == [(1, 2)]
    thread.join(10)
    assert third == [[(1, 3)]]
    assert received.snapshot() == ["m1", "m2", "m3"]
    assert server.destination.delivered_on_receipt == 3


def test_the_next_message_waits_for_the_delivery_before_it_to_commit(engines) -> None:
    """2's application is still running when 3 arrives: 3 waits in the store for 2's commit
    (it does not overtake it, and is not buffered either), then is taken."""
    entered, release = threading.Event(), threading.Event()
    received = ThreadRecorder()

    def application(envelope: bytes, context: object) -> None:
        received(envelope, context)
        if received.snapshot()[-1] == "m2":
            entered.set()
            release.wait(30)

    server, url, identifier = served(engines, application)
    assert send_ok(url, RM11, identifier, 1, "m1") == [(1, 1)]
    answers: dict[int, list[tuple[int, int]]] = {}
    threads = [threading.Thread(target=lambda n=n: answers.__setitem__(n, send_ok(url, RM11, identifier, n, f"m{n}")))
               for n in (2, 3)]
    threads[0].start()
    assert entered.wait(10)
    threads[1].start()
    threads[1].join(0.5)
    assert threads[1].is_alive() and received.snapshot() == ["m1", "m2"]  # 3 waits for 2's commit
    release.set()
    for t in threads:
        t.join(10)
    assert answers == {2: [(1, 2)], 3: [(1, 3)]}
    assert received.snapshot() == ["m1", "m2", "m3"]
    assert server.destination.delivered_on_receipt == 3


def test_a_gap_does_not_hold_the_receives_after_it(engines) -> None:
    """Message 1 never comes: 2..6 are buffered at once (a receive waits for a missing number
    only a moment, once), acknowledged, and delivered after 1 finally arrives."""
    received = ThreadRecorder()
    server, url, identifier = served(engines, received)
    for n in range(2, 7):
        assert send_ok(url, RM11, identifier, n, f"m{n}") == [(2, n)]
    assert received.snapshot() == []
    assert send_ok(url, RM11, identifier, 1, "m1") == [(1, 6)]
    assert wait_for(lambda: received.snapshot() == [f"m{n}" for n in range(1, 7)], timeout=20), \
        received.snapshot()
    assert server.destination.delivered_on_receipt == 1



@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_receipt_behind_a_gap_says_its_message_waits_in_the_buffer(engines, kind, request, monkeypatch) -> None:
    """A receive that delivers on receipt, inside its transaction (memory) or apart (SQLite),
    whose receipt finds its message behind a gap buffers it: the delivery machine's NOT_TAKEN
    moves the receive's message from DELIVERING or APART to MISSED, in the buffer (it stayed
    DELIVERING or APART, a way that had not happened).  The receive reads from that stage alone
    (no flag beside it) that it still owes its delivery on receipt: it delivers the buffer up to
    its message before it answers.  1 arrives, and its receive delivers the buffer behind it."""
    seen: list[tuple[str, str, str]] = []
    real = destination_module.message_transition

    def spy(state, event):
        result = real(state, event)
        seen.append((state.label, event.name, result.state.label))
        return result

    monkeypatch.setattr(destination_module, "message_transition", spy)
    received = ThreadRecorder()
    server, url, identifier = served(engines, received, _store(kind, request))
    caught_up: list[int] = []
    real_through = server.invoker.deliver_through

    def through(sequence_id: str, number: int, *args, **kwargs) -> None:
        if sequence_id == identifier:
            caught_up.append(number)
        real_through(sequence_id, number, *args, **kwargs)

    monkeypatch.setattr(server.invoker, "deliver_through", through)
    assert send_ok(url, RM11, identifier, 2, "m2") == [(2, 2)]
    before = {"memory": "DELIVERING", "sqlite": "APART"}[kind]
    assert seen == [(before, "NOT_TAKEN", "MISSED")]
    assert caught_up == [2]  # MISSED: its receive caught up on the buffer (nothing deliverable yet)
    assert send_ok(url, RM11, identifier, 1, "m1") == [(1, 2)]
    assert wait_for(lambda: received.snapshot() == ["m1", "m2"], timeout=20), received.snapshot()
    assert server.destination.delivered_on_receipt == 1
    assert [event for _, event, _ in seen].count("NOT_TAKEN") == 1  # 1 was next: taken
    assert caught_up == [2]  # 1 was taken: nothing owed


def test_a_slow_application_gets_its_messages_through_the_buffer_until_it_is_quick_again(engines) -> None:
    """A receive that delivers holds its HTTP thread while the application runs: once the
    application has been slow lately (1 s a message here), a receive buffers its message and
    answers at once, and delivery on receipt comes back after the application is quick again."""
    received = ThreadRecorder()
    finished: list[str | None] = []
    m2_may_finish = threading.Event()

    def application(envelope: bytes, context: object) -> None:
        received(envelope, context)
        text = received.snapshot()[-1]
        if text == "m2":  # still running when its receive has answered, however loaded the machine
            m2_may_finish.wait(timeout=60)
        if text in ("m1", "m2"):
            time.sleep(1.0)
        finished.append(text)

    server, url, identifier = served(engines, application)
    assert send_ok(url, RM11, identifier, 1, "m1") == [(1, 1)]  # quick so far: on receipt, answered after 1 s
    assert server.destination.delivered_on_receipt == 1 and not server.invoker.quick
    try:
        assert send_ok(url, RM11, identifier, 2, "m2") == [(1, 2)]
        assert "m2" not in finished  # answered before the application was done with it
    finally:
        m2_may_finish.set()
    assert wait_for(lambda: received.snapshot() == ["m1", "m2"], timeout=20)
    for n in range(3, 21):
        assert send_ok(url, RM11, identifier, n, f"m{n}") == [(1, n)]
        assert wait_for(lambda n=n: len(received.snapshot()) == n, timeout=20), received.snapshot()
    assert received.snapshot() == [f"m{n}" for n in range(1, 21)]
    # the moving average and the counters follow the application's return and the commit after it
    assert wait_for(lambda: server.invoker.quick and server.status().delivered == 20, timeout=20), server.status()
    assert server.destination.delivered_on_receipt > 1  # on receipt again

