"""SQLite, delivering apart: a message next in order runs its application before its receipt.

Delivering apart buffered each message in a transaction of its own and then, once the
application had run outside the file, removed it in another: two commits a message.  When the
store's last committed state shows the message will be taken on receipt (its sequence open,
1..n-1 received and delivered, nothing buffered), the application runs first and the receipt
records the message taken, in one transaction shared with other sequences' receipts.  Nothing
in the process may change that state in between: a copy of the message, a Close or a
Terminate waits for that receipt.  And a receive that finds its message behind the buffer
delivers the buffer through itself, so that a sequence that fell behind catches up.  Real HTTP
on 127.0.0.1, a real SQLite file; each test waits for what it asserts.
"""

from __future__ import annotations

import threading
from typing import Any

from wsrm_plugin.statemachine import MessageState, Stage
from wsrm_plugin.store import BufferedMessage
from wsrm_plugin.wire import CloseSequence, SequenceAcknowledgement

from .conftest import fast_policy
from .support import RM11, Recorder, post, protocol_request, wait_for
from .test_bad_input import open_sequence, send_ok


def _served(engines, store_for, application, **policy: Any):
    server = engines(store_for("sqlite", "server"),
                     fast_policy(deliver_on_receive=True, deliver_apart=True, **policy),
                     serve=True, application=application, name="server")
    assert server.invoker.delivers_apart
    return server, server.endpoint_address


def _held_at_a2(engines, store_for) -> tuple[Any, str, str, Recorder, threading.Event]:
    """A server whose application holds message 2 ("a2") until the event returned is set: its
    sequence opened, message 1 delivered and acknowledged; what the application received."""
    received = Recorder()
    release = threading.Event()

    def application(envelope: bytes, context: object) -> None:
        received(envelope, context)
        if received.snapshot()[-1] == "a2":
            assert release.wait(30)

    server, url = _served(engines, store_for, application)
    identifier = open_sequence(url, RM11)
    assert send_ok(url, RM11, identifier, 1, "a1") == [(1, 1)]
    return server, url, identifier, received, release


def _received_and_buffered(server, identifier: str) -> tuple[list[tuple[int, int]], int]:
    with server.store.begin() as tx:
        return list(tx.rmd.get(identifier).received.ranges), tx.invoker.count()


def test_the_application_runs_before_the_receipt(engines, store_for) -> None:
    """Message 2's application finds it neither received nor buffered (buffered first, it
    found both); it is delivered once, acknowledged after its receipt, and the buffer ends empty."""
    received = Recorder()
    seen: list[tuple[list[tuple[int, int]], int]] = []
    box: dict[str, object] = {}

    def application(envelope: bytes, context: object) -> None:
        received(envelope, context)
        if received.snapshot()[-1] == "a2":  # the file is not held while it runs: read it
            seen.append(_received_and_buffered(box["server"], box["id"]))

    server, url = _served(engines, store_for, application)
    box["server"] = server
    box["id"] = identifier = open_sequence(url, RM11)
    assert send_ok(url, RM11, identifier, 1, "a1") == [(1, 1)]
    assert send_ok(url, RM11, identifier, 2, "a2") == [(1, 2)]
    assert received.snapshot() == ["a1", "a2"]
    assert seen == [([(1, 1)], 0)]
    assert server.destination.delivered_before_receipt == 1
    assert wait_for(lambda: server.status().delivered == 2, timeout=10), server.status()
    assert _received_and_buffered(server, identifier) == ([(1, 2)], 0)


def test_a_close_waits_for_the_receipt_of_a_message_that_ran_first(engines, store_for) -> None:
    """A CloseSequence that arrives while message 2's application runs waits for its receipt:
    closed first, the receipt would refuse a message whose application had run.  So message 2
    is acknowledged, and the Close's final acknowledgement covers it."""
    server, url, identifier, received, release = _held_at_a2(engines, store_for)
    answers: dict[str, object] = {}
    second = threading.Thread(target=lambda: answers.__setitem__("a2", send_ok(url, RM11, identifier, 2, "a2")))
    second.start()
    assert wait_for(lambda: received.snapshot() == ["a1", "a2"], timeout=20)  # a2's application runs

    def close() -> None:
        request = protocol_request(RM11, url, RM11.action("CloseSequence"), CloseSequence(identifier, 2).to_xml(RM11))
        answers["close"] = post(url, request)

    closing = threading.Thread(target=close)
    closing.start()
    # the Close waits for a2's receipt (without that wait it would end, and a2 be refused)
    assert wait_for(lambda: not closing.is_alive() or identifier in server.destination._ending, timeout=20)
    release.set()
    second.join(30)
    closing.join(30)
    assert answers["a2"] == [(1, 2)]
    response = answers["close"]
    assert response.status == 200, response.body
    ack, _ = SequenceAcknowledgement.from_xml(response.envelope().header(RM11.qname("SequenceAcknowledgement")))
    assert ack.ranges == [(1, 2)] and ack.final
    assert received.snapshot() == ["a1", "a2"]


def test_a_copy_arriving_while_the_application_runs_waits_for_the_receipt(engines, store_for) -> None:
    """A copy of message 2 (a retransmission) that arrives while 2's application runs waits for
    2's receipt, then finds a duplicate: the application runs once.  (Not waiting, it found
    nothing received, buffered 2 and ran its application a second time.)"""
    server, url, identifier, received, release = _held_at_a2(engines, store_for)
    answers: dict[str, object] = {}
    threads = [threading.Thread(target=lambda n=n: answers.__setitem__(n, send_ok(url, RM11, identifier, 2, "a2")))
               for n in ("first", "copy")]
    threads[0].start()
    assert wait_for(lambda: received.snapshot() == ["a1", "a2"], timeout=20)  # the first's application runs
    threads[1].start()
    assert wait_for(lambda: server.destination.copies_waited == 1 or len(received.snapshot()) > 2, timeout=20)
    release.set()
    for t in threads:
        t.join(30)
    assert answers == {"first": [(1, 2)], "copy": [(1, 2)]}
    assert received.snapshot() == ["a1", "a2"]
    assert server.destination.delivered_before_receipt == 1
    assert wait_for(lambda: server.status().delivered == 2, timeout=10), server.status()
    assert _received_and_buffered(server, identifier) == ([(1, 2)], 0)


def test_a_receive_behind_the_buffer_delivers_it_through(engines, store_for) -> None:
    """With no invoker thread running, message 2 is buffered (the application counted slow);
    message 3's receive, which finds 2 in the buffer, delivers 2 and then 3 before it answers,
    and message 4 runs first again.  (Delivering apart, it left both buffered: every message
    after one that was buffered was buffered too, for the invoker thread to deliver.)"""
    received = Recorder()
    server, url = _served(engines, store_for, received)
    for worker in server.workers:
        if "invoker" in worker.name:
            assert worker.stop(10)
    identifier = open_sequence(url, RM11)
    assert send_ok(url, RM11, identifier, 1, "a1") == [(1, 1)]
    server.invoker.application_seconds = 1.0  # slow: its messages go through the buffer
    assert send_ok(url, RM11, identifier, 2, "a2") == [(1, 2)]
    assert received.snapshot() == ["a1"]
    server.invoker.application_seconds = 0.0  # quick again
    assert send_ok(url, RM11, identifier, 3, "a3") == [(1, 3)]
    assert wait_for(lambda: received.snapshot() == ["a1", "a2", "a3"], timeout=10), received.snapshot()
    before = server.destination.delivered_before_receipt
    assert send_ok(url, RM11, identifier, 4, "a4") == [(1, 4)]
    assert received.snapshot() == ["a1", "a2", "a3", "a4"]
    assert server.destination.delivered_before_receipt == before + 1
    assert _received_and_buffered(server, identifier) == ([(1, 4)], 0)


# -- the delivery machine's stages of delivering apart (statemachine.delivery) ------------------

def test_a_message_its_receive_delivers_apart_is_apart_meanwhile(engines, store_for) -> None:
    """Message 1 (never run first) is buffered and delivered apart by its receive: while its
    application runs, the machine has it APART (KEPT_APART), so an invoker thread's claim is
    refused; the delivery's commit (COMMITTED) leaves nothing kept.  (It was SETTLING, as if
    it had failed, before the machine had the stage.)"""
    received = Recorder()
    running, release = threading.Event(), threading.Event()

    def application(envelope: bytes, context: object) -> None:
        received(envelope, context)
        running.set()
        assert release.wait(30)

    server, url = _served(engines, store_for, application)
    identifier = open_sequence(url, RM11)
    answers: dict[str, object] = {}
    first = threading.Thread(target=lambda: answers.__setitem__("a1", send_ok(url, RM11, identifier, 1, "a1")))
    first.start()
    try:
        assert running.wait(20)
        with server.store.begin() as tx:
            msg = tx.invoker.get(identifier, 1)
        assert msg is not None  # buffered, and committed so
        assert server.invoker.message_state(msg) == MessageState(Stage.APART)
    finally:
        release.set()
        first.join(30)
    assert answers == {"a1": [(1, 1)]}
    assert received.snapshot() == ["a1"]
    assert server.invoker.message_state(msg) == MessageState(Stage.WAITING)  # nothing kept: its row's
    assert _received_and_buffered(server, identifier) == ([(1, 1)], 0)


def _failed_once(server, identifier: str, number: int) -> Any:
    """The buffered message ``number`` once its failed try is counted (its retry far off)."""
    def counted() -> Any:
        with server.store.begin() as tx:
            msg = tx.invoker.get(identifier, number)
        return msg if msg is not None and msg.attempts == 1 else None
    assert wait_for(lambda: counted() is not None, timeout=20)
    return counted()


def test_a_failure_apart_is_judged_as_any(engines, store_for) -> None:
    """Message 1's application fails, delivered apart (APART -> FAILED -> SETTLING, judged): the
    message stays buffered with the application's error counted, as any failed delivery."""
    received = Recorder(fail_on=lambda text: text == "a1")
    server, url = _served(engines, store_for, received, delivery_retry_delay=300.0, max_delivery_retry_delay=300.0)
    identifier = open_sequence(url, RM11)
    assert send_ok(url, RM11, identifier, 1, "a1") == [(1, 1)]  # received: acknowledged all the same
    msg = _failed_once(server, identifier, 1)
    assert "the application refuses 'a1'" in (msg.last_error or ""), msg.last_error
    assert server.invoker.message_state(msg) == MessageState(Stage.RETRY_WAIT, alone=True)
    assert received.calls == 1 and received.snapshot() == []


def test_a_failure_before_the_receipt_buffers_the_message_and_counts_the_try(engines, store_for) -> None:
    """Message 2's application, run before its receipt, fails (RUNNING_FIRST -> FAILED ->
    SETTLING, judged): nothing of it was stored, so it is received into the buffer with the
    application's error counted, as any failed delivery on receipt."""
    received = Recorder(fail_on=lambda text: text == "a2")
    server, url = _served(engines, store_for, received, delivery_retry_delay=300.0, max_delivery_retry_delay=300.0)
    identifier = open_sequence(url, RM11)
    assert send_ok(url, RM11, identifier, 1, "a1") == [(1, 1)]
    assert send_ok(url, RM11, identifier, 2, "a2") == [(1, 2)]
    msg = _failed_once(server, identifier, 2)
    assert "the application refuses 'a2'" in (msg.last_error or ""), msg.last_error
    assert server.invoker.message_state(msg) == MessageState(Stage.RETRY_WAIT, alone=True)
    assert received.calls == 2 and received.snapshot() == ["a1"]
    assert server.destination.delivered_before_receipt == 0


def test_a_message_whose_application_runs_before_its_receipt_is_running_first_meanwhile(engines, store_for) -> None:
    """Message 2 runs first: while its application runs (no row of it yet) the machine has it
    RUNNING_FIRST in the invoker's ledger, so no claim takes it; its receipt's commit
    (COMMITTED) leaves nothing kept.  (Before, the ledger did not know it: WAITING, its
    missing row's reading.)"""
    server, url, identifier, received, release = _held_at_a2(engines, store_for)
    msg = BufferedMessage(identifier, 2, None, "", "soap", b"")  # the ledger knows a message by its number
    answers: dict[str, object] = {}
    second = threading.Thread(target=lambda: answers.__setitem__("a2", send_ok(url, RM11, identifier, 2, "a2")))
    second.start()
    try:
        assert wait_for(lambda: received.snapshot() == ["a1", "a2"], timeout=20)  # a2's application runs
        assert server.invoker.message_state(msg) == MessageState(Stage.RUNNING_FIRST)
    finally:
        release.set()
        second.join(30)
    assert answers == {"a2": [(1, 2)]}
    assert server.destination.delivered_before_receipt == 1
    assert server.invoker.message_state(msg) == MessageState(Stage.WAITING)  # nothing kept
    assert _received_and_buffered(server, identifier) == ([(1, 2)], 0)


# -- the guess from this process's last receipt (Destination._foresee_apart) -------------------

def _counting_reads(server) -> list[int]:
    """The store reads the guesses of receipts run first made (``foresee_in_order``), by number."""
    reads: list[int] = []
    read = server.store.foresee_in_order

    def counted(sequence_id: str, number: int) -> Any:
        reads.append(number)
        return read(sequence_id, number)

    server.store.foresee_in_order = counted
    return reads


def _steady_sequence(engines, store_for, count: int) -> tuple[Recorder, Any, str, list[int], str]:
    """A served service whose store reads are counted, and a sequence of ``count`` messages sent
    to it one by one, each acknowledged with all before it."""
    received = Recorder()
    server, url = _served(engines, store_for, received)
    reads = _counting_reads(server)
    identifier = open_sequence(url, RM11)
    for n in range(1, count + 1):
        assert send_ok(url, RM11, identifier, n, f"a{n}") == [(1, n)]
    return received, server, url, reads, identifier


def test_a_steady_sequence_guesses_from_its_last_receipt_without_reading_the_store(engines, store_for) -> None:
    """Messages 2..6 run first; only 2's guess reads the store, 3..6 guess from the receipt
    before them in this process.  Each is delivered once, in order, nothing left buffered."""
    received, server, url, reads, identifier = _steady_sequence(engines, store_for, 6)
    assert received.snapshot() == [f"a{n}" for n in range(1, 7)]
    assert server.destination.delivered_before_receipt == 5
    assert reads == [2]
    assert server.destination.foreseen_in_memory == 4
    assert _received_and_buffered(server, identifier) == ([(1, 6)], 0)


def test_a_receipt_by_another_store_on_the_file_makes_the_next_guess_read_it(engines, store_for) -> None:
    """Message 4 is received by another service on the same file (another process's, as far as
    this one knows); its copy sent to the first service then finds a duplicate: its guess read
    the store, so its application did not run a second time (guessed from the first service's
    receipt of 3, it ran and its receipt refused it after), and 5 runs first once."""
    received, server, url, reads, identifier = _steady_sequence(engines, store_for, 3)
    assert server.destination.foreseen_in_memory == 1 and reads == [2]
    other, other_url = _served(engines, store_for, received)  # (its workers hold the file now and then too)
    assert send_ok(other_url, RM11, identifier, 4, "a4") == [(1, 4)]
    assert received.snapshot() == ["a1", "a2", "a3", "a4"]
    assert send_ok(url, RM11, identifier, 4, "a4") == [(1, 4)]  # a copy: a duplicate
    assert received.snapshot() == ["a1", "a2", "a3", "a4"]
    assert send_ok(url, RM11, identifier, 5, "a5") == [(1, 5)]
    assert received.snapshot() == ["a1", "a2", "a3", "a4", "a5"]
    assert server.destination.foreseen_in_memory == 1 and reads == [2, 4, 5]
    assert _received_and_buffered(server, identifier) == ([(1, 5)], 0)
