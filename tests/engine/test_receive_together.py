"""SQLite, delivering inside: receives of several sequences waiting for the file at once run together.

An SQLite store's transactions take turns on the whole file, so receives that
deliver in their own transaction (``deliver_apart`` off, the default) run one
after the other, each holding the file through its application.  Those that
wait for the file at the same time are now recorded and delivered in one
transaction by the first of them (``RMPolicy.receive_together``), each in a
savepoint of its own: one BEGIN, one COMMIT, one fsync for all, and a part
that fails rolls back alone.  Real HTTP on 127.0.0.1, a real SQLite file; each
test waits for what it asserts.
"""

from __future__ import annotations

import threading

from wsrm_plugin.wire import UnknownSequence

from .conftest import fast_policy
from .support import RM11, Recorder, application_message, batches_on_disk, post, wait_for
from .test_bad_input import first_message_senders, open_sequence

SEQUENCES = 4


def _served(engines, store_for, application, **policy):
    server = engines(store_for("sqlite", "server"), fast_policy(deliver_on_receive=True, **policy),
                     serve=True, application=application, name="server")
    return server, server.endpoint_address


def _while_the_file_is_held(server, combiner, sends) -> None:
    """Run ``sends`` (threads) while another transaction holds the file: the first receive waits
    for it with its own message, the others queue behind it and form the next batch."""
    holding = server.store.begin()
    holding.rms.get("nothing")  # its first statement takes the file
    try:
        for t in sends:
            t.start()
        assert wait_for(lambda: combiner.queued(None) == len(sends) - 1, timeout=20)
    finally:
        holding.rollback()
    for t in sends:
        t.join(60)


def test_on_by_default_on_sqlite_only_and_one_turns_it_off(engines, store_for) -> None:
    inside = engines(store_for("sqlite", "inside"), fast_policy(deliver_on_receive=True), serve=True,
                     application=Recorder(), name="inside")
    assert inside.policy.receive_together is None and inside.destination._together is not None
    alone = engines(store_for("sqlite", "alone"), fast_policy(deliver_on_receive=True, receive_together=1),
                    serve=True, application=Recorder(), name="alone")
    assert alone.destination._together is None
    memory = engines("memory:", fast_policy(deliver_on_receive=True), serve=True, application=Recorder(),
                     name="memory")
    assert memory.destination._together is None  # its transactions do not take turns on a file


def test_receives_of_several_sequences_deliver_in_one_transaction(engines, store_for) -> None:
    """Four sequences' messages arrive while another transaction holds the file: the first leads
    alone, the three behind it are recorded and delivered in one transaction, one commit.  Each
    is delivered once, on receipt, and acknowledged."""
    received = Recorder()
    server, url = _served(engines, store_for, received)
    identifiers = [open_sequence(url, RM11) for _ in range(SEQUENCES)]
    combiner = server.destination._together
    batches, items = combiner.batches, combiner.items
    sync = server.store._sync
    senders, answered = first_message_senders(url, RM11, identifiers)
    commits = sync.commits
    _while_the_file_is_held(server, combiner, senders)
    assert answered == {identifier: [(1, 1)] for identifier in identifiers}
    assert sorted(received.snapshot()) == [f"m{n}" for n in range(SEQUENCES)]
    assert (combiner.batches - batches, combiner.items - items) == (2, SEQUENCES)
    assert sync.commits - commits == 2  # one for the first, one for the three together
    assert server.destination.delivered_on_receipt == SEQUENCES
    with server.store.begin() as tx:
        assert tx.invoker.count() == 0


def test_a_batch_is_on_disk_before_its_other_receives_wake(engines, store_for) -> None:
    """The batch of three returns (and so wakes the two receives behind its first) only once its
    commit is on disk: they find it there instead of sleeping again on its fsync, and the next
    batch was let in before it (fails without: the batch returned right after its commit)."""
    received = Recorder()
    server, url = _served(engines, store_for, received)
    identifiers = [open_sequence(url, RM11) for _ in range(SEQUENCES)]
    combiner = server.destination._together
    returned = batches_on_disk(combiner, server.store,
                               lambda outcome: outcome[2] if isinstance(outcome, tuple) else None)
    handed_on = combiner.handed_on
    senders, answered = first_message_senders(url, RM11, identifiers)
    _while_the_file_is_held(server, combiner, senders)
    assert answered == {identifier: [(1, 1)] for identifier in identifiers}
    assert sorted(received.snapshot()) == [f"m{n}" for n in range(SEQUENCES)]
    assert [parts for parts, _, _ in returned] == [1, SEQUENCES - 1], returned
    assert returned[-1][1], returned  # the three woken with their commit on disk
    assert returned[-1][2] == handed_on + 1, returned  # the three let the next batch in before their fsync


def _a_batch_whose_part_fails_once(engines, store_for, failing: str, hold):
    """Messages m0..m2 on sequences of their own, queued by ``hold`` while the file is held,
    ``failing``'s application failing on its first try: each acknowledged, each delivered once
    (all but the failed one on receipt, that one by the invoker).  The server."""
    failed: list[str] = []

    def fail_first_try(text: str | None) -> bool:
        if text == failing and not failed:
            failed.append(text)
            return True
        return False

    received = Recorder(fail_on=fail_first_try)
    server, url = _served(engines, store_for, received)
    identifiers = [open_sequence(url, RM11) for _ in range(SEQUENCES)]
    combiner = server.destination._together
    senders, answered = first_message_senders(url, RM11, identifiers)
    hold(server, combiner, senders)
    assert failed == [failing]
    assert answered == {identifier: [(1, 1)] for identifier in identifiers}
    assert wait_for(lambda: sorted(received.snapshot()) == [f"m{n}" for n in range(SEQUENCES)], timeout=30), \
        received.snapshot()
    assert server.destination.delivered_on_receipt == SEQUENCES - 1
    assert wait_for(lambda: server.status().delivered == SEQUENCES, timeout=20), server.status()
    return server


def test_a_failed_application_in_a_batch_rolls_back_alone(engines, store_for) -> None:
    """m2's application fails on its first try (in the batch of three, or leading alone): its part
    rolls back to its savepoint, the others commit (delivered on receipt), and m2 is buffered and
    delivered by the invoker; every message acknowledged, each delivered once."""
    server = _a_batch_whose_part_fails_once(engines, store_for, "m2", _while_the_file_is_held)
    with server.store.begin() as tx:
        assert tx.invoker.count() == 0


def test_a_refused_receive_in_a_batch_is_refused_alone(engines, store_for) -> None:
    """A message on an unknown sequence waits for the file with three good ones: it gets its
    fault, the others are delivered and acknowledged."""
    received = Recorder()
    server, url = _served(engines, store_for, received)
    identifiers = [open_sequence(url, RM11) for _ in range(SEQUENCES - 1)]
    combiner = server.destination._together
    sends, answered = first_message_senders(url, RM11, identifiers)
    refused: list[object] = []

    def stray() -> None:
        response = post(url, application_message(RM11, url, "urn:uuid:not-a-sequence-of-yours", 1, "stray"))
        refused.append((response.status, type(response.fault())))

    sends.insert(1, threading.Thread(target=stray))
    _while_the_file_is_held(server, combiner, sends)
    assert refused == [(400, UnknownSequence)]
    assert answered == {identifier: [(1, 1)] for identifier in identifiers}
    assert sorted(received.snapshot()) == [f"m{n}" for n in range(SEQUENCES - 1)]


def _in_order_while_the_file_is_held(server, combiner, sends) -> None:
    """:func:`_while_the_file_is_held`, each receive queued only once the one before it is: the
    first leads alone, the others form the next batch in this order."""
    holding = server.store.begin()
    holding.rms.get("nothing")
    try:
        sends[0].start()
        assert wait_for(lambda: None in combiner._waiting, timeout=20)
        for queued, t in enumerate(sends[1:], start=1):
            t.start()
            assert wait_for(lambda queued=queued: combiner.queued(None) == queued, timeout=20)
    finally:
        holding.rollback()
    for t in sends:
        t.join(60)


def _savepoints(server) -> list[str]:
    """The SAVEPOINT statements SQLite runs on the service store's connections from now on."""
    seen: list[str] = []
    store = server.store
    connect = store._connect

    def traced():
        conn = connect()
        conn.set_trace_callback(lambda sql: seen.append(sql) if sql.startswith("SAVEPOINT") else None)
        return conn

    store._connect = traced
    with store._pool_lock:
        idle, store._idle = store._idle, []
    for conn in idle:
        conn.close()
    return seen


def test_the_first_part_of_a_batch_takes_no_savepoint(engines, store_for) -> None:
    """A batch of three: savepoints for the second and third parts only (fails without: three)."""
    received = Recorder()
    server, url = _served(engines, store_for, received)
    identifiers = [open_sequence(url, RM11) for _ in range(SEQUENCES)]
    combiner = server.destination._together
    senders, answered = first_message_senders(url, RM11, identifiers)
    savepoints = _savepoints(server)
    _in_order_while_the_file_is_held(server, combiner, senders)
    assert answered == {identifier: [(1, 1)] for identifier in identifiers}
    assert sorted(received.snapshot()) == [f"m{n}" for n in range(SEQUENCES)]
    assert len(savepoints) == SEQUENCES - 2, savepoints


def test_a_failed_first_part_rolls_the_batch_back_and_the_others_are_received_alone(engines, store_for) -> None:
    """m1 leads the batch of three and its application fails on its first try: the batch rolls
    back, m1 is buffered and delivered by the invoker, m2 and m3 are received (and delivered)
    alone; every message acknowledged, each delivered once."""
    _a_batch_whose_part_fails_once(engines, store_for, "m1", _in_order_while_the_file_is_held)
