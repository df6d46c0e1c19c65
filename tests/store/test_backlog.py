"""A backlog does not make a send batch or an acknowledgement cost more (issue 33).

When a peer comes back after an outage, the sender drains what queued meanwhile: every batch asks
for each sequence's first due messages, every acknowledgement for the messages in its ranges.  If
either cost grew with the backlog, draining N messages would cost N squared.  Measured in rows
touched, not time: the memory store's index counts what it visits and the copies of its tables,
SQLite counts virtual machine steps, PostgreSQL its tuples read in the transaction
(``pg_stat_get_xact_tuples_*`` of the message table and its indexes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


from wsrm_plugin.store import StorageManager, open_store
from wsrm_plugin.store.sql.rows import _MSG_COLS

SMALL, LARGE = 200, 4000
BATCH = 50


def _queue(store: StorageManager, queued: dict[str, int]) -> None:
    """Started sequences (``sid-<key>``), each with its number of messages queued."""
    with store.begin() as tx:
        for key, count in queued.items():
            tx.rms.create(key, target="http://127.0.0.1:9/", acks_to="urn:a", rm_version="v", wsa_version="w")
            tx.rms.update(key, sequence_id=f"sid-{key}")
            for i in range(count):
                tx.rms_messages.enqueue(key, b"<x/>", action="a", soap_version="1.1", message_id=f"{key}-{i}")


def _backlog(store: StorageManager, queued: int) -> None:
    """Two started sequences: "a" with ``queued`` messages, of which the first BATCH were sent
    once (waiting for their acknowledgement), and "b" with a few."""
    _queue(store, {"a": queued, "b": 5})
    with store.begin() as tx:
        tx.rms_messages.record_send_attempts("a", range(1, BATCH + 1), next_send_at=time.time() + 3600)


def _started_backlog(store: StorageManager, analyzed: bool) -> None:
    """:func:`_backlog` of :data:`LARGE`, "a" started; PostgreSQL's statistics of the messages
    fresh (``analyzed``), or stale as a busy queue's are (nearly empty)."""
    _backlog(store, LARGE)
    with store.begin() as tx:
        tx.rms.update("a", started=True)
    if analyzed:
        with store.begin() as tx:
            tx.execute("ANALYZE rms_message").close()


def _plans(store: StorageManager, like: str) -> list[tuple[int, int]]:
    """(generic plans, custom plans) of each statement prepared on a session of ``store``'s (the
    pool gives the last one back) whose text is ``LIKE`` ``like`` (PostgreSQL)."""
    with store.begin() as tx, tx.conn.cursor() as cur:
        cur.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
                    (like,))
        return cur.fetchall()


def _rows_touched(store: StorageManager, work: Callable[[Any], Any]) -> int:
    """Rows (or their proxy) the store touched doing ``work(tx)`` in one transaction."""
    kind = store.url.split(":", 1)[0]
    with store.begin() as tx:
        if kind == "memory":
            index = store._messages  # type: ignore[attr-defined]
            copied = [0]
            snapshot, group = store._snapshot, store._snapshot_group  # type: ignore[attr-defined]

            def counted(fn: Callable[..., dict[Any, Any]]) -> Callable[..., dict[Any, Any]]:
                def wrapper(*args: Any) -> dict[Any, Any]:
                    rows = fn(*args)
                    copied[0] += len(rows)
                    return rows
                return wrapper
            store._snapshot, store._snapshot_group = counted(snapshot), counted(group)  # type: ignore[attr-defined]
            before = index.rows_visited
            try:
                work(tx)
            finally:
                del store._snapshot, store._snapshot_group  # type: ignore[attr-defined]
            return index.rows_visited - before + copied[0]
        if kind == "sqlite":
            steps = [0]

            def step() -> int:
                steps[0] += 1
                return 0
            tx.conn.set_progress_handler(step, 20)
            try:
                work(tx)
            finally:
                tx.conn.set_progress_handler(None, 0)
            return steps[0]
        # PostgreSQL: the tuples this backend read, not yet reported (they are reported when it is
        # idle outside a transaction): read inside one transaction, opened by a statement that locks
        tx.one("SELECT seq_key FROM rms_sequence WHERE seq_key = ? FOR UPDATE", ("none",))
        before = _tuples_read(tx)
        work(tx)
        return _tuples_read(tx) - before


def _tuples_read(tx: Any) -> int:
    """Tuples of the message table and its indexes this PostgreSQL backend read so far."""
    return int(tx.one(
        "SELECT sum(pg_stat_get_xact_tuples_returned(c.oid) + pg_stat_get_xact_tuples_fetched(c.oid)) "
        "FROM pg_class c WHERE c.oid = 'rms_message'::regclass "
        "OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'rms_message'::regclass)")[0])


def _costs(open_kind: Callable[..., StorageManager], queued: int) -> tuple[int, ...]:
    store = open_kind()
    _backlog(store, queued)
    batch = _rows_touched(store, lambda tx: tx.rms_messages.due_messages(limit=BATCH, per_sequence=BATCH))
    # the batch's sends recorded, one sequence's (the sender's round) and across sequences
    sent = _rows_touched(store, lambda tx: tx.rms_messages.record_send_attempts(
        "a", range(BATCH + 1, 2 * BATCH + 1), next_send_at=time.time() + 3600))
    sent_across = _rows_touched(store, lambda tx: tx.rms_messages.record_send_attempts_across(
        {"a": range(2 * BATCH + 1, 3 * BATCH + 1), "b": range(1, 6)}, next_send_at=time.time() + 3600))
    # a round's count of the messages in flight, against a window (max_unacknowledged)
    window = _rows_touched(store, lambda tx: tx.rms_messages.count_in_flight("a", 16))
    # a peer's cumulative acknowledgement of what was sent, as every acknowledgement repeats:
    # marked only (the first half), then applied and purged as the sender does (all of it)
    marked = _rows_touched(store, lambda tx: tx.rms_messages.mark_acked("a", [(1, BATCH // 2)]))
    applied = _rows_touched(store, lambda tx: tx.rms_messages.acknowledge("a", [(1, BATCH)]))
    # what a round does with its evidence: a fast retransmission of the batch, the peer's
    # acknowledgement naming the sequence by its identifier (the sender's), and the check
    # whether anything is left to acknowledge
    resent = _rows_touched(store, lambda tx: tx.rms_messages.make_due("a", range(BATCH + 1, 2 * BATCH + 1)))
    with store.begin() as tx:  # acknowledged only while transmitting
        tx.rms.update("a", started=True)
    by_id = _rows_touched(store, lambda tx: tx.rms_messages.acknowledge_sequence("sid-a", [(1, 2 * BATCH)]))
    left = _rows_touched(store, lambda tx: tx.rms_messages.has_unacked("a"))
    return batch, sent, sent_across, window, marked, applied, resent, by_id, left


def _wipe(open_kind: Callable[..., StorageManager]) -> None:
    store = open_kind()
    with store.begin() as tx:
        for key in ("a", "b"):
            if tx.rms.get(key) is not None:
                tx.rms.delete(key)


def test_a_send_batch_and_an_acknowledgement_touch_as_many_rows_at_any_backlog(
        open_kind: Callable[..., StorageManager]) -> None:
    small = _costs(open_kind, SMALL)
    _wipe(open_kind)
    large = _costs(open_kind, LARGE)
    for what, at_small, at_large in zip(("send batch", "send attempts recorded",
                                         "send attempts recorded across sequences", "window count",
                                         "acknowledgement marked", "acknowledgement applied", "fast retransmission",
                                         "acknowledgement by the sequence's identifier", "unacknowledged check"),
                                        small, large, strict=True):
        # 20 times the backlog: a cost that grew with it would be about 20 times as high
        assert at_large <= 2 * at_small + 30, (
            f"a {what} touched {at_small} rows at {SMALL} queued and {at_large} at {LARGE}")


def test_an_acknowledgement_naming_its_sequence_by_id_touches_as_many_rows_beside_any_number_of_sequences(
        open_kind: Callable[..., StorageManager]) -> None:
    """An acknowledgement rides on every request and reply and names its sequence by the peer's
    identifier; a service keeps a reply sequence for every client.  Finding it must not read
    every open sequence (the memory store copied its whole RMS table for it)."""
    costs = []
    for others in (5, 400):
        store = open_kind()
        _queue(store, {"a": 3, **{f"idle-{i}": 0 for i in range(others)}})
        with store.begin() as tx:
            tx.rms_messages.record_send_attempts("a", range(1, 4), next_send_at=time.time() + 3600)
        costs.append(_rows_touched(store, lambda tx: tx.rms_messages.acknowledge_sequence("sid-a", [(1, 2)])))
        with store.begin() as tx:
            for key in ("a", *(f"idle-{i}" for i in range(others))):
                tx.rms.delete(key)
    assert costs[1] <= 2 * costs[0] + 30, f"{costs[0]} rows beside 5 sequences, {costs[1]} beside 400"


def test_the_messages_in_flight_are_those_sent_and_not_acknowledged(store: StorageManager) -> None:
    """What a round counts against its window: 10 of 30 sent, 3 of those acknowledged (the
    first two, and one in the middle), one sent again (its next time moved on); a window of 4
    is full, whatever else it counts."""
    _queue(store, {"a": 30})
    now = time.time()
    with store.begin() as tx:
        tx.rms_messages.record_send_attempts("a", range(1, 11), next_send_at=now + 3600, now=now)
        tx.rms_messages.record_send_attempt("a", 7, next_send_at=now + 60, now=now)
        tx.rms_messages.mark_acked("a", [(1, 2), (5, 5)])
        assert tx.rms_messages.count_in_flight("a", 16, now) == 7  # its own changes counted
    with store.begin() as tx:
        assert tx.rms_messages.count_in_flight("a", 16, now) == 7
        assert tx.rms_messages.count_in_flight("a", 4, now) >= 4


def test_messages_sent_once_out_of_number_order_count_against_the_window(store: StorageManager) -> None:
    """Messages 1-5 held for an unreachable peer (unsent, due in an hour), then 6 and 7 sent
    once: a restart forgot the hold and the peer answers, or a probe took them.  Both are in
    flight, and a window of 2 is full.  The SQL stores counted none of them (a first send keeps
    its due time; the first two by number are unsent), so every round let two more out."""
    _queue(store, {"a": 10})
    now = time.time()
    with store.begin() as tx:
        tx.rms_messages.make_due("a", range(1, 6), at=now + 3600)
        tx.rms_messages.record_send_attempts("a", [6, 7], next_send_at=now + 60, now=now)
    with store.begin() as tx:
        assert tx.rms_messages.count_in_flight("a", 2, now) == 2
        assert tx.rms_messages.count_in_flight("a", 16, now) == 2


def test_the_batch_is_each_sequences_first_due_messages_in_round_robin(store: StorageManager) -> None:
    """What the indexed (memory) and correlated (SQLite) batches return is the round robin the
    sender asks for: every sequence's first due message, then the seconds..."""
    _backlog(store, BATCH + 10)
    with store.begin() as tx:
        due = tx.rms_messages.due_messages(limit=8, per_sequence=3)
    assert [(m.sequence_key, m.number) for m in due] == [
        ("a", BATCH + 1), ("b", 1), ("a", BATCH + 2), ("b", 2), ("a", BATCH + 3), ("b", 3)]


@pytest.mark.parametrize("slack", [64, 0], ids=["default", "rebuilt-often"])
def test_the_memory_stores_index_answers_as_its_rows_do_through_any_history(monkeypatch, slack) -> None:
    """Random enqueues, send attempts, resends, acknowledgements and purges on two sequences
    (rebuilds of the due heaps included): every indexed answer equals one read off the rows."""
    import random

    from wsrm_plugin.store import backlog
    from wsrm_plugin.store.memory import MemoryStore

    monkeypatch.setattr(backlog, "HEAP_SLACK", slack)

    rng = random.Random(33)
    store = MemoryStore()
    clock = [1000.0]
    with store.begin() as tx:
        for key in ("a", "b"):
            tx.rms.create(key, target="http://127.0.0.1:9/", acks_to="urn:a", rm_version="v", wsa_version="w")
            tx.rms.update(key, sequence_id=f"sid-{key}")
    for _ in range(800):
        key = rng.choice("ab")
        clock[0] += 1
        with store.begin() as tx:
            msgs = tx.rms_messages.list_for(key)
            unacked = [m for m in msgs if not m.acked]
            op = rng.random()
            if op < 0.1 or len(unacked) < 4:  # few unacked, many changes: the heaps get rebuilt
                tx.rms_messages.enqueue(key, b"<x/>", action="a", soap_version="1.1",
                                        message_id=f"{key}{len(msgs)}-{clock[0]}", now=clock[0])
            elif op < 0.6:
                m = rng.choice(unacked)
                tx.rms_messages.record_send_attempt(key, m.number, next_send_at=clock[0] + rng.choice((-5, 5, 50)))
            elif op < 0.7:
                tx.rms_messages.make_due(key, [m.number for m in rng.sample(unacked, min(3, len(unacked)))],
                                         at=rng.choice((1.0, clock[0] + 3)))
            elif op < 0.9:
                sent = [m.number for m in unacked if m.send_count]
                if sent:
                    hi = rng.choice(sent)
                    tx.rms_messages.mark_acked(key, [(1, hi)] if all(
                        m.send_count or m.acked for m in msgs if m.number <= hi) else [(hi, hi)])
            else:
                tx.rms_messages.purge_acked(key)
        with store.begin() as tx:
            rows = {k: tx.rms_messages.list_for(k) for k in ("a", "b")}
            for k in ("a", "b"):
                assert tx.rms_messages.count_unacked(k) == sum(not m.acked for m in rows[k])
                assert tx.rms_messages.count_in_flight(k, 10_000, clock[0]) == sum(
                    bool(m.send_count) and not m.acked for m in rows[k])
                assert tx.rms_messages.has_unacked(k) == any(not m.acked for m in rows[k])
            due = tx.rms_messages.due_messages(clock[0], limit=1000, per_sequence=1000)
            expected = sorted(((m.next_send_at, m.sequence_key, m.number) for k in rows for m in rows[k]
                               if not m.acked and m.next_send_at <= clock[0]))
            assert sorted((m.next_send_at, m.sequence_key, m.number) for m in due) == expected
            for k in ("a", "b"):
                for m in rows[k]:
                    assert tx.rms_messages.find_by_message_id(m.message_id) == m


def test_a_sqlite_batch_reads_the_rows_only_of_the_messages_it_takes(tmp_path, monkeypatch) -> None:
    """Many sequences with messages queued (16 callers ahead of the sender): the batch ranks every
    sequence's first due messages by their keys, and reads the rows (payload, sequence) only of the
    ``limit`` it takes.  Reading every candidate's row read 16 x 50 payloads for a batch of 50
    (6.4 ms of the sender's claim, holding the file every enqueue waits for)."""
    from wsrm_plugin.store import open_store
    from wsrm_plugin.store.sql import rms, rows

    store = open_store(f"sqlite:///{tmp_path}/s.db")
    _queue(store, {f"k{s:02d}": 60 for s in range(16)})
    built = [0]
    real = rows._msg

    def counted(row: Any) -> Any:
        built[0] += 1
        return real(row)
    monkeypatch.setattr(rms, "_msg", counted)
    with store.begin() as tx:
        due = tx.rms_messages.due_messages(limit=BATCH, per_sequence=BATCH)
    # the round robin: every sequence's first three, then the fourth of the first two
    assert [(m.sequence_key, m.number) for m in due] == (
        [(f"k{s:02d}", n) for n in (1, 2, 3) for s in range(16)] + [("k00", 4), ("k01", 4)])
    assert built[0] == BATCH, f"{built[0]} message rows read for a batch of {BATCH}"


@pytest.mark.parametrize("counts", [(40, 1, 2, 0, 30, 3, 1, 25), (9,) * 8, (60, 60), (2,) * 16 + (70,)],
                         ids=["uneven", "even", "two", "one-long"])
def test_a_round_robin_batch_is_the_same_whoever_has_few_or_many(store: StorageManager, counts) -> None:
    """A batch asks each sequence first for about its share (twice the batch over the sequences);
    where that leaves it short while a sequence had more, it asks again: the batch is always the
    round robin over every due message, whatever the sequences hold."""
    _queue(store, {f"q{s:02d}": count for s, count in enumerate(counts)})
    with store.begin() as tx:
        due = tx.rms_messages.due_messages(limit=BATCH, per_sequence=BATCH)
    ranked = sorted((n, f"q{s:02d}") for s, count in enumerate(counts) for n in range(1, min(count, BATCH) + 1))
    assert [(m.sequence_key, m.number) for m in due] == [(key, n) for n, key in ranked[:BATCH]]


def test_a_memory_batch_over_many_sequences_visits_about_what_it_takes() -> None:
    """16 sequences of 60 queued messages, a batch of 50: each sequence is asked for about twice
    its share (8), not for a whole batch (800 index entries popped, rows read and sorted).  The
    SQL stores ask the same way (the test above counts SQLite's rows read; PostgreSQL's tuples
    read depend on its planner's statistics: 3,552 -> 2,208 here, fresh, and a claim's read of
    16 sequences of 100 messages, analyzed, 17 -> 9 ms on a loaded machine)."""
    from wsrm_plugin.store.memory import MemoryStore

    store = MemoryStore()
    _queue(store, {f"k{s:02d}": 60 for s in range(16)})
    visited = _rows_touched(store, lambda tx: tx.rms_messages.due_messages(limit=BATCH, per_sequence=BATCH))
    assert visited <= 3 * BATCH, f"{visited} rows visited for a batch of {BATCH}"


def _blocks_touched(store: StorageManager, work: Callable[[Any], Any]) -> int:
    """PostgreSQL: blocks of the message table and its indexes (shared buffers hit or read) that
    ``work(tx)`` touched in one transaction, its statements planned generically (as a statement
    prepared on a session and run many times is planned)."""
    query = ("SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid)) FROM pg_class c "
             "WHERE c.oid = 'rms_message'::regclass "
             "OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'rms_message'::regclass)")
    with store.begin() as tx:
        tx.one("SELECT seq_key FROM rms_sequence WHERE seq_key = ? FOR UPDATE", ("none",))
        tx.execute("SET LOCAL plan_cache_mode TO force_generic_plan").close()
        before = int(tx.one(query)[0])
        work(tx)
        return int(tx.one(query)[0]) - before


@pytest.mark.postgres
def test_a_cumulative_acknowledgement_does_not_walk_the_drained_prefix(fresh_db: str) -> None:
    """A peer's acknowledgement names every message from the first on, so as a backlog drains its
    ranges span a prefix whose rows were deleted, their index entries left until a vacuum.  With a
    backlog's statistics (20,000 queued, not analyzed: autovacuum had no turn yet), PostgreSQL read
    the ranges by bitmap scans, which visit the heap page of every dead entry and never mark one
    dead: the acknowledgement's check, its deletes and its marks each read the pages the drain had
    emptied (173 blocks 100 messages into the drain, 627 at 1,000).  They now begin at the first
    message still there (found by the primary key, whose scan marks the dead entries it passes)."""
    store = open_store(fresh_db if fresh_db.startswith("postgresql") else "postgresql:" + fresh_db)
    try:
        with store.begin() as tx:  # 20,000 queued of 400 bytes: 200, then those again 99 times, numbered on
            tx.rms.create("a", target="http://127.0.0.1:9/", acks_to="urn:a", rm_version="v", wsa_version="w")
            tx.rms.update("a", sequence_id="sid-a")
            for i in range(200):
                tx.rms_messages.enqueue("a", b"<x/>" * 100, action="a", soap_version="1.1", message_id=f"a-{i}")
            tx.execute("ALTER TABLE rms_message SET (autovacuum_enabled = false)").close()
            rest = [c for c in _MSG_COLS if c not in ("number", "message_id")]
            tx.execute(f"INSERT INTO rms_message (number, message_id, {', '.join(rest)}) "
                       f"SELECT number + 200 * k, message_id || '-' || k, {', '.join(rest)} "
                       "FROM rms_message, generate_series(1, 99) AS k").close()
            tx.execute("UPDATE rms_sequence SET highest_number = 20000, started = TRUE WHERE seq_key = 'a'").close()
        costs = {}
        for upto in range(BATCH, 1000 + 1, BATCH):  # sent and acknowledged, a batch at a time
            with store.begin() as tx:
                tx.rms_messages.record_send_attempts("a", range(upto - BATCH + 1, upto + 1),
                                                     next_send_at=time.time() + 3600)
            costs[upto] = _blocks_touched(store, lambda tx, upto=upto: tx.rms_messages.acknowledge_sequence(
                "sid-a", [(1, upto)], beside_enqueues=True))
        assert costs[1000] <= costs[100] + 30, f"{costs[100]} blocks 100 messages into the drain, {costs[1000]} at 1000"
    finally:
        store.close()
