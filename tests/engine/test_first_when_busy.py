"""SQLite, delivering inside: a receive that finds a batch holding the file runs its application first.

Delivering inside (``deliver_apart`` off, the default), a batch of receives holds the SQLite
file through its applications, one after the other, each waiting for its own database.  A
receive of another sequence that begins meanwhile used to wait for the file, then hold it
through its own application.  When its receipt will surely take its message (the same test as
delivering apart: its sequence open with 1..n-1 received and delivered, nothing buffered), it
runs its application at once (``RMPolicy.first_when_busy``, on by default), while that
batch holds the file, and only its receipt waits for the file.  Real HTTP on 127.0.0.1, a real SQLite file; each test waits for what it asserts.
"""

from __future__ import annotations

import threading
from typing import Any

from .conftest import fast_policy
from .support import RM11, Recorder, holding_at, wait_for
from .test_bad_input import open_sequence, send_ok


def _server_holding_a2(engines, store_for, **policy: Any) -> tuple[Any, str, Recorder, threading.Event]:
    """A SQLite service delivering inside whose application holds message "a2" until the event
    returned is set."""
    received, release, application = holding_at("a2")
    server = engines(store_for("sqlite", "server"), fast_policy(deliver_on_receive=True, **policy),
                     serve=True, application=application, name="server")
    assert server.policy.deliver_apart is False and not server.invoker.delivers_apart
    return server, server.endpoint_address, received, release


def test_a_receive_runs_its_application_while_a_batch_holds_the_file(engines, store_for) -> None:
    """Message 2 of sequence b arrives while a's message 2 holds the file in its application:
    b2's application runs meanwhile (before, it waited for a2's commit), its receipt after a2's
    commit; each is delivered once and acknowledged, and nothing is left in the buffer."""
    server, url, received, release = _server_holding_a2(engines, store_for, first_when_busy=True)
    a, b = open_sequence(url, RM11), open_sequence(url, RM11)
    assert send_ok(url, RM11, a, 1, "a1") == [(1, 1)]
    assert send_ok(url, RM11, b, 1, "b1") == [(1, 1)]
    answers: dict[str, object] = {}
    second = None
    first = threading.Thread(target=lambda: answers.__setitem__("a2", send_ok(url, RM11, a, 2, "a2")))
    first.start()
    try:
        assert wait_for(lambda: received.snapshot()[-1:] == ["a2"], timeout=20)  # a2's batch holds the file
        assert server.destination._together.busy(None)
        second = threading.Thread(target=lambda: answers.__setitem__("b2", send_ok(url, RM11, b, 2, "b2")))
        second.start()
        # b2's application runs while a2's still holds the file (waiting for it, it would not)
        assert wait_for(lambda: "b2" in received.snapshot(), timeout=20), received.snapshot()
        assert first.is_alive() and "b2" not in answers  # b2's receipt waits for the file
    finally:
        release.set()
    first.join(30)
    assert second is not None
    second.join(30)
    assert answers == {"a2": [(1, 2)], "b2": [(1, 2)]}
    assert sorted(received.snapshot()) == ["a1", "a2", "b1", "b2"]
    assert server.destination.delivered_before_receipt == 1
    assert wait_for(lambda: server.status().delivered == 4, timeout=10), server.status()
    with server.store.begin() as tx:
        assert tx.invoker.count() == 0
        assert [list(tx.rmd.get(s).received.ranges) for s in (a, b)] == [[(1, 2)], [(1, 2)]]


def test_a_receive_that_finds_no_batch_stays_inside(engines, store_for) -> None:
    """One sequence's messages in turn find no batch running: each is received and delivered in
    its receive's transaction, as before (one commit a message), none before its receipt."""
    server, url, received, release = _server_holding_a2(engines, store_for, first_when_busy=True)
    release.set()
    a = open_sequence(url, RM11)
    for n in range(1, 5):
        assert send_ok(url, RM11, a, n, f"a{n}") == [(1, n)]
    assert received.snapshot() == ["a1", "a2", "a3", "a4"]
    assert server.destination.delivered_before_receipt == 0


def test_turned_off_a_receive_waits_for_the_batch_holding_the_file(engines, store_for) -> None:
    """``first_when_busy=False``: b2, arriving while a2's batch holds the file, waits for it and
    runs its application after a2's, inside its own receipt's transaction."""
    server, url, received, release = _server_holding_a2(engines, store_for, first_when_busy=False)
    a, b = open_sequence(url, RM11), open_sequence(url, RM11)
    assert send_ok(url, RM11, a, 1, "a1") == [(1, 1)]
    assert send_ok(url, RM11, b, 1, "b1") == [(1, 1)]
    answers: dict[str, object] = {}
    threads = [threading.Thread(target=lambda: answers.__setitem__("a2", send_ok(url, RM11, a, 2, "a2"))),
               threading.Thread(target=lambda: answers.__setitem__("b2", send_ok(url, RM11, b, 2, "b2")))]
    threads[0].start()
    try:
        assert wait_for(lambda: received.snapshot()[-1:] == ["a2"], timeout=20)
        threads[1].start()
        assert wait_for(lambda: server.destination._together.queued(None) == 1, timeout=20)  # b2 waits
    finally:
        release.set()
    for t in threads:
        t.join(30)
    assert answers == {"a2": [(1, 2)], "b2": [(1, 2)]}
    assert received.snapshot() == ["a1", "b1", "a2", "b2"]
    assert server.destination.delivered_before_receipt == 0


def test_receipts_of_messages_run_first_join_the_batch_holding_the_file(engines, store_for) -> None:
    """b2 and c2 run their applications while a2's batch holds the file; their receipts then wait
    for the file among the receives that deliver inside, and a2's batch, its application done,
    takes them before its commit: one transaction and one commit for the three, where they
    were a batch of receipts of their own (two commits, or three)."""
    server, url, received, release = _server_holding_a2(engines, store_for, first_when_busy=True)
    a, b, c = (open_sequence(url, RM11) for _ in range(3))
    for s, name in ((a, "a"), (b, "b"), (c, "c")):
        assert send_ok(url, RM11, s, 1, f"{name}1") == [(1, 1)]
    together, apart = server.destination._together, server.destination._apart_receipts
    batches, apart_batches, commits = together.batches, apart.batches, server.store._sync.commits
    answers: dict[str, object] = {}

    def send(s: str, name: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: answers.__setitem__(name, send_ok(url, RM11, s, 2, name)))
        thread.start()
        return thread

    threads = [send(a, "a2")]
    try:
        assert wait_for(lambda: received.snapshot()[-1:] == ["a2"], timeout=20)  # a2's batch holds the file
        threads += [send(b, "b2"), send(c, "c2")]
        # both ran first; their receipts wait for the file, in the batch of receives that deliver inside
        assert wait_for(lambda: together.queued(None) == 2, timeout=20), received.snapshot()
        assert sorted(received.snapshot()[-3:]) == ["a2", "b2", "c2"]
    finally:
        release.set()
    for t in threads:
        t.join(30)
    assert answers == {"a2": [(1, 2)], "b2": [(1, 2)], "c2": [(1, 2)]}
    assert server.destination.delivered_before_receipt == 2
    assert (together.batches - batches, apart.batches - apart_batches) == (1, 0)  # a2's, with b2's and c2's
    assert server.store._sync.commits - commits == 1
    with server.store.begin() as tx:
        assert tx.invoker.count() == 0
        assert [list(tx.rmd.get(s).received.ranges) for s in (a, b, c)] == [[(1, 2)]] * 3
