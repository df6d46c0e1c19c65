"""SQLite: callers' enqueues waiting for the store's file at once are done in one transaction.

An SQLite store's transactions take turns on the whole file, so callers that
each enqueue in a local transaction of their own queue for it, one turn, one
BEGIN, one look for in-doubt branches and one COMMIT each.  Those waiting at
the same time are now enqueued by the first of them in one transaction
(``RMPolicy.enqueue_together``), one commit and one fsync for all; each caller
returns once that commit is on disk.  Should the batch fail, nothing of it
stays and each caller enqueues alone.  Real HTTP on 127.0.0.1, real SQLite
files; each test waits for what it asserts.
"""

from __future__ import annotations

import sqlite3
import threading

import pytest

from .conftest import fast_policy
from .support import ACTION, Recorder, payload, wait_for

CALLERS = 4


def _pair(engines, store_for, **policy):
    received = Recorder()
    server = engines("memory:", fast_policy(), serve=True, application=received, name="server")
    client = engines(store_for("sqlite", "client"), fast_policy(**policy), name="client")
    return client, server.endpoint_address, received


def _while_the_file_is_held(client, sends) -> None:
    """Run ``sends`` (threads) while another transaction holds the client's file: the first
    caller (started first, and alone until it leads) waits for it with its own enqueue, the
    others queue behind it and form the next batch."""
    combiner = client.source._enqueues
    holding = client.store.begin()
    holding.rms.get("nothing")  # its first statement takes the file
    try:
        sends[0].start()
        assert wait_for(lambda: None in combiner._waiting, timeout=20)  # it leads (and waits for the file)
        for t in sends[1:]:
            t.start()
        assert wait_for(lambda: combiner.queued(None) == len(sends) - 1, timeout=20)
    finally:
        holding.rollback()
    for t in sends:
        t.join(60)


def _numbers(client) -> dict[str, list[int]]:
    """Each client sequence's message numbers in the store (acknowledged ones purged or not)."""
    conn = sqlite3.connect(client.store.path)
    try:
        numbers: dict[str, list[int]] = {}
        for key, high in conn.execute("SELECT seq_key, highest_number FROM rms_sequence"):
            numbers[key] = list(range(1, high + 1))
        return numbers
    finally:
        conn.close()


def test_on_by_default_on_sqlite_only_and_one_turns_it_off(engines, store_for) -> None:
    together = engines(store_for("sqlite", "together"), fast_policy(), name="together")
    assert together.policy.enqueue_together is None and together.source._enqueues is not None
    alone = engines(store_for("sqlite", "alone"), fast_policy(enqueue_together=1), name="alone")
    assert alone.source._enqueues is None
    memory = engines("memory:", fast_policy(), name="memory")
    assert memory.source._enqueues is None  # its transactions do not take turns on a file
    with pytest.raises(ValueError):
        fast_policy(enqueue_together=0)


def test_callers_waiting_for_the_file_enqueue_in_one_transaction(engines, store_for) -> None:
    """Four callers (a sequence each) send while another transaction holds the file: the first
    enqueues alone, the three behind it in one transaction.  Each caller gets its own receipt,
    each message is number 1 of its sequence, and each is delivered once."""
    client, url, received = _pair(engines, store_for)
    combiner = client.source._enqueues
    receipts = {}

    def send(n: int) -> None:
        receipts[n] = client.send(url, payload(f"m{n}"), action=ACTION, key=f"k{n}")

    _while_the_file_is_held(client, [threading.Thread(target=send, args=(n,)) for n in range(CALLERS)])
    assert (combiner.batches, combiner.items) == (2, CALLERS)
    assert len({r.sequence_key for r in receipts.values()}) == CALLERS
    assert [r.number for r in receipts.values()] == [1] * CALLERS
    assert wait_for(lambda: sorted(received.snapshot()) == [f"m{n}" for n in range(CALLERS)], timeout=30)


def test_a_batch_that_fails_leaves_nothing_and_each_caller_enqueues_alone(engines, store_for) -> None:
    """The store refuses one caller's message (a trigger on the client's file): the batch it is
    in rolls back, the others are enqueued alone, each once and without a gap in their
    sequence's numbers, and only the refused caller gets the error."""
    client, url, received = _pair(engines, store_for)
    conn = sqlite3.connect(client.store.path)
    conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON rms_message WHEN NEW.message_id = 'urn:refused' "
                 "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    conn.close()
    combiner = client.source._enqueues
    receipts, errors = {}, {}

    def send(n: int) -> None:
        try:
            receipts[n] = client.send(url, payload(f"m{n}"), action=ACTION, key=f"k{n}",
                                      message_id="urn:refused" if n == CALLERS - 1 else None)
        except sqlite3.Error as exc:
            errors[n] = exc

    _while_the_file_is_held(client, [threading.Thread(target=send, args=(n,)) for n in range(CALLERS)])
    assert list(errors) == [CALLERS - 1] and "refused by the test" in str(errors[CALLERS - 1])
    assert sorted(receipts) == list(range(CALLERS - 1))
    assert [r.number for r in receipts.values()] == [1] * (CALLERS - 1)
    # the first alone, then the batch of three rolled back: its callers each alone (not counted)
    assert (combiner.batches, combiner.items) == (2, 1)
    assert wait_for(lambda: sorted(received.snapshot()) == [f"m{n}" for n in range(CALLERS - 1)], timeout=30)
    numbers = _numbers(client)
    assert sorted(len(n) for n in numbers.values() if n) == [1] * (CALLERS - 1)  # no number lost to the rollback
