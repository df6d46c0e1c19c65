"""Concurrency: numbering under threads, lock waits, pollers that skip locked rows,
and purging that keeps the store bounded."""

from __future__ import annotations

import threading
import time

import pytest

from wsrm_plugin.store import LockTimeoutError, StorageManager, TransactionClosedError
from wsrm_plugin.store.memory import MemoryStore
from wsrm_plugin.store.sqlite import SqliteStore

from .conftest import KINDS
from .test_managers import enqueue, new_rms, put, started


def test_message_numbers_are_unique_and_gap_free_under_four_threads(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rms(tx)
    got: dict[int, list[int]] = {i: [] for i in range(4)}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for round_ in range(15):
                tx = store.begin()
                numbers = [m.number for m in enqueue(tx, n=1 + round_ % 3)]
                if round_ % 4 == 3:
                    tx.rollback()  # its numbers go back to the pool
                else:
                    tx.commit()
                    got[i].extend(numbers)
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    everything = sorted(n for numbers in got.values() for n in numbers)
    assert everything == list(range(1, len(everything) + 1))
    assert len(everything) == 4 * sum(1 + r % 3 for r in range(15) if r % 4 != 3)
    with store.begin() as tx:
        assert [m.number for m in tx.rms_messages.list_for("k1")] == everything
        assert tx.rms.get("k1").next_number == len(everything) + 1


def test_a_locked_sequence_makes_others_wait_then_time_out(open_kind) -> None:
    store = open_kind(lock_timeout=0.3)
    with store.begin() as tx:
        new_rms(tx)
    holder = store.begin()
    holder.rms.get("k1")
    try:
        with pytest.raises(LockTimeoutError):
            with store.begin() as other:
                other.rms_messages.enqueue("k1", b"x", action="a", soap_version="1.2",
                                           message_id="m")
    finally:
        holder.rollback()
    with store.begin() as tx:  # free again
        assert enqueue(tx)[0].number == 1


def test_peek_reads_a_sequence_another_transaction_holds_without_waiting_for_it(open_kind) -> None:
    """``peek`` (the look a back-channel request takes at its reply sequence on every call, and a
    transaction holding RMD locks takes before an RMS lock) never waits for a lock, sees its own
    transaction's changes, and answers by key or by identifier as ``get`` does.  (SQLite runs one
    transaction at a time, so there nobody else holds a lock while it looks.)"""
    store = open_kind(lock_timeout=0.3)
    with store.begin() as tx:
        new_rms(tx)
        new_rms(tx, "k2")
        tx.rms.update("k2", sequence_id="seq-2")
    holder = store.begin() if store.concurrent_sequences else None
    if holder is not None:
        holder.rms.get("k1")
    try:
        with store.begin() as other:
            assert other.rms.peek("k1").key == "k1"  # would raise LockTimeoutError if it waited
            assert other.rms.peek_by_sequence_id("seq-2").key == "k2"
            assert other.rms.peek("nope") is None and other.rms.peek_by_sequence_id("nope") is None
            other.rms.update("k2", expires=500.0)
            assert other.rms.peek("k2").expires == 500.0  # its own change
            assert other.rms.peek_by_sequence_id("seq-2").expires == 500.0
    finally:
        if holder is not None:
            holder.rollback()


def test_waiters_proceed_when_the_holder_commits(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rms(tx)
    holder = store.begin()
    enqueue(holder, n=2)
    result: list[int] = []

    def waiter() -> None:
        with store.begin() as tx:
            result.extend(m.number for m in enqueue(tx, n=1))

    t = threading.Thread(target=waiter)
    t.start()
    t.join(timeout=0.2)
    assert t.is_alive() and result == []  # waiting for the holder's lock
    holder.commit()
    t.join(timeout=30)
    assert result == [3]


@pytest.mark.parametrize("store_url", [KINDS[0], KINDS[2]], indirect=True)
def test_pollers_skip_what_another_transaction_holds(store: StorageManager) -> None:
    """Row-level stores; SQLite serializes whole transactions (next test)."""
    started(store, "a", "sa", messages=2, sent=False)
    started(store, "b", "sb", messages=1, sent=False)
    with store.begin() as tx:
        put(tx, "in-a", 1)
        put(tx, "in-b", 1)
    first = store.begin()
    try:
        assert first.invoker.claim_next().sequence_id == "in-a"
        assert {m.sequence_key for m in first.rms_messages.due_messages(limit=2)} == {"a"}
        with store.begin() as second:
            assert second.invoker.claim_next().sequence_id == "in-b"
            assert [(m.sequence_key, m.number) for m in second.rms_messages.due_messages()] == [("b", 1)]
    finally:
        first.rollback()


@pytest.mark.parametrize("store_url", [KINDS[0], KINDS[2]], indirect=True)
def test_a_senders_round_robin_round_skips_a_sequence_being_enqueued_to(store: StorageManager) -> None:
    """The sender's round (each sequence's first due messages, then the seconds...) skips a
    sequence whose row an application transaction holds (its enqueue took the next number) and
    still fills its batch from the others, without waiting for that transaction."""
    started(store, "a", "sa", messages=3, sent=False)
    started(store, "b", "sb", messages=2, sent=False)
    enqueuing = store.begin()
    try:
        enqueuing.rms.get("a")  # what an enqueue holds until its transaction ends
        with store.begin() as sender:
            due = sender.rms_messages.due_messages(limit=2, per_sequence=50)
            assert [(m.sequence_key, m.number) for m in due] == [("b", 1), ("b", 2)]
    finally:
        enqueuing.rollback()
    with store.begin() as sender:
        due = sender.rms_messages.due_messages(limit=3, per_sequence=50)
        assert [(m.sequence_key, m.number) for m in due] == [("a", 1), ("b", 1), ("a", 2)]


@pytest.mark.parametrize("store_url", [KINDS[0], KINDS[2]], indirect=True)
def test_reception_does_not_wait_for_a_delivery_of_the_same_sequence(open_kind) -> None:
    """A delivery holds its sequence from claim to (two-phase) commit; a receive must not queue behind it."""
    store = open_kind(lock_timeout=0.5)
    with store.begin() as tx:
        put(tx, "in", 1)
    delivery = store.begin()
    try:
        claimed = delivery.invoker.claim_next()
        assert (claimed.sequence_id, claimed.number) == ("in", 1)
        delivery.invoker.mark_delivered("in", 1)
        with store.begin() as receive:  # would raise LockTimeoutError if it waited for the delivery
            assert put(receive, "in", 2)
            assert put(receive, "in", 3)
        delivery.commit()
    finally:
        if not delivery.closed:
            delivery.rollback()
    with store.begin() as tx:
        state = tx.invoker.state("in")
        assert list(state.delivered.ranges) == [(1, 1)] and state.buffered == 2
        assert tx.invoker.claim_next().number == 2


@pytest.mark.parametrize("store_url", [KINDS[2]], indirect=True)
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_duplicate_that_races_its_own_delivery_is_not_buffered_again(store: StorageManager,
                                                                         outcome: str) -> None:
    """The unlocked put reads "not delivered" while a delivery of that very number is in flight.

    Its insert meets the row the delivery is deleting and waits for the
    outcome; after a commit the second read of the delivered ranges sees the
    number and the insert is undone, after a rollback the row is still there.
    Either way: one copy, never two.
    """
    with store.begin() as tx:
        put(tx, "in", 1)
    delivery = store.begin()
    delivery.invoker.claim_next()
    delivery.invoker.mark_delivered("in", 1)
    result: list[bool] = []

    def duplicate() -> None:
        with store.begin() as tx:
            result.append(put(tx, "in", 1))

    t = threading.Thread(target=duplicate)
    t.start()
    t.join(timeout=0.5)
    assert t.is_alive() and result == []  # its insert waits for the delivery's outcome
    getattr(delivery, outcome)()
    t.join(timeout=30)
    assert result == [False]
    with store.begin() as tx:
        state = tx.invoker.state("in")
        if outcome == "commit":
            assert list(state.delivered.ranges) == [(1, 1)] and state.buffered == 0
        else:
            assert list(state.delivered.ranges) == [] and state.buffered == 1


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_memory_a_duplicate_put_during_its_delivery_is_refused_at_once(outcome: str) -> None:
    """The memory store's put reads the committed buffer without the lock the delivery holds:
    the number is still buffered there, so the duplicate is refused, and one copy remains."""
    store = MemoryStore(lock_timeout=0.5)
    with store.begin() as tx:
        put(tx, "in", 1)
    delivery = store.begin()
    assert delivery.invoker.claim_next().number == 1
    delivery.invoker.mark_delivered("in", 1)
    with store.begin() as tx:  # would raise LockTimeoutError if it waited for the delivery
        assert not put(tx, "in", 1)
    getattr(delivery, outcome)()
    with store.begin() as tx:
        state = tx.invoker.state("in")
        delivered = [(1, 1)] if outcome == "commit" else []
        assert (list(state.delivered.ranges), state.buffered) == (delivered, 1 - len(delivered))


def test_memory_puts_that_race_a_delivery_never_undo_it() -> None:
    """Two receives of one sequence without the RMD lock between them (the store alone), each
    reading before the other commits: a put's rows are inserted only if still absent at commit.

    ``late`` reads an empty buffer and no delivery record; meanwhile message 1 is buffered and
    delivered by others.  Its copy of message 1 must not come back, nor its empty delivery
    record replace the one that says 1 was delivered (that would deliver a later duplicate
    of 1 again).
    """
    store = MemoryStore(lock_timeout=0.5)
    late = store.begin()
    assert put(late, "in", 1)  # a duplicate, read before the first copy committed
    assert put(late, "in", 2)
    with store.begin() as tx:
        assert put(tx, "in", 1)
    with store.begin() as tx:
        assert tx.invoker.claim_next().number == 1
        tx.invoker.mark_delivered("in", 1)
    late.commit()
    with store.begin() as tx:
        state = tx.invoker.state("in")
        assert (list(state.delivered.ranges), state.buffered) == ([(1, 1)], 1)
        assert not put(tx, "in", 1)  # a later duplicate is known as delivered
        assert tx.invoker.claim_next().number == 2


def test_memory_a_transaction_that_put_then_delivers_keeps_the_others_deliveries() -> None:
    """A put stages the sequence's delivery record as absent; once the same transaction locks
    the buffer it must work from the committed record, not from that stale empty one."""
    store = MemoryStore(lock_timeout=0.5)
    mixed = store.begin()
    assert put(mixed, "in", 3)
    with store.begin() as tx:
        assert put(tx, "in", 1) and put(tx, "in", 2)
    with store.begin() as tx:
        assert tx.invoker.claim_next().number == 1
        tx.invoker.mark_delivered("in", 1)
    assert mixed.invoker.claim_next().number == 2  # the committed record: 1 is delivered
    mixed.invoker.mark_delivered("in", 2)
    mixed.commit()
    with store.begin() as tx:
        state = tx.invoker.state("in")
        assert (list(state.delivered.ranges), state.buffered) == ([(1, 2)], 1)
        assert tx.invoker.claim_next().number == 3


def test_sqlite_pollers_serialize(tmp_path) -> None:
    store = SqliteStore(tmp_path / "s.db", lock_timeout=0.2)
    started(store, "a", "sa", messages=1, sent=False)
    first = store.begin()
    first.rms_messages.due_messages()
    with pytest.raises(LockTimeoutError, match="held the store"):
        store.begin()
    first.commit()
    with store.begin() as tx:
        assert len(tx.rms_messages.due_messages()) == 1


def _count_rows(store: StorageManager, table: str) -> int:
    if isinstance(store, MemoryStore):
        return len(store._snapshot({"rms_message": "rms_message", "invoker_message": "buffer"}[table]))
    with store.begin() as tx:
        return int(tx.one(f"SELECT COUNT(*) FROM {table}")[0])


def test_purging_keeps_the_store_bounded(store: StorageManager) -> None:
    """10,000 messages through each side; the rows come back to zero."""
    started(store, messages=0)
    batch, total = 500, 10_000
    most = 0
    for start in range(1, total + 1, batch):
        with store.begin() as tx:
            for n in range(start, start + batch):
                assert put(tx, "in", n)
            numbers = [m.number for m in enqueue(tx, n=batch)]
            assert numbers == list(range(start, start + batch))
            for n in numbers:
                tx.rms_messages.record_send_attempt("k1", n, next_send_at=1e12)
        most = max(most, _count_rows(store, "rms_message"), _count_rows(store, "invoker_message"))
        with store.begin() as tx:
            for n in range(start, start + batch):
                tx.invoker.mark_delivered("in", n)
            assert len(tx.rms_messages.mark_acked("k1", [(start, start + batch - 1)])) == batch
            assert tx.rms_messages.purge_acked() == batch
    assert most == batch
    assert _count_rows(store, "rms_message") == 0
    assert _count_rows(store, "invoker_message") == 0
    with store.begin() as tx:
        assert tx.invoker.state("in").delivered.ranges == ((1, total),)
        assert tx.rms.get("k1").next_number == total + 1


@pytest.mark.parametrize("store_url", [KINDS[0], KINDS[2]], indirect=True)
def test_a_lock_timeout_dooms_the_waiting_transaction(open_kind) -> None:
    """PostgreSQL aborts a transaction whose statement timed out; every store acts alike."""
    store = open_kind(lock_timeout=0.3)
    with store.begin() as tx:
        new_rms(tx, "a")
        new_rms(tx, "b")
    holder = store.begin()
    holder.rms.get("b")
    waiter = store.begin()
    waiter.rms.update("a", started=True)
    with pytest.raises(LockTimeoutError):
        waiter.rms.get("b")
    with pytest.raises(TransactionClosedError, match="can only roll back"):
        waiter.rms.get("a")
    with pytest.raises(TransactionClosedError, match="rolled back"):
        waiter.commit()
    holder.rollback()
    with store.begin() as tx:
        assert not tx.rms.get("a").started


def test_memory_a_commit_wakes_only_the_waiters_of_its_own_locks(monkeypatch: pytest.MonkeyPatch) -> None:
    """With many sequences at once, a transaction waiting for one sequence's lock is woken when
    that lock is released, not by every other sequence's commit (each woke every waiter, which
    looked and slept again: 16 sequences, a few wake-ups per message for nothing)."""
    waits, wakes = [], []

    class CountingCondition(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(threading.current_thread().name)
            try:
                return super().wait(timeout)
            finally:
                wakes.append(threading.current_thread().name)

    monkeypatch.setattr(threading, "Condition", CountingCondition)
    store = MemoryStore(lock_timeout=60)
    with store.begin() as tx:
        for key in ("k1", "k2"):
            new_rms(tx, key)
    holder = store.begin()
    holder.rms.get("k1")  # holds k1's lock
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(_read_in_a_transaction(store, "k1")), name="waiter")
    waiter.start()
    try:
        deadline = time.monotonic() + 60
        while "waiter" not in waits and time.monotonic() < deadline:  # the waiter waits for k1
            time.sleep(0.001)
        assert "waiter" in waits, "the waiter never waited for k1's lock"
        for _ in range(50):  # other sequences' transactions come and go
            with store.begin() as other:
                other.rms.update("k2", last_activity=time.time())
        assert wakes.count("waiter") == 0
    finally:
        holder.rollback()
    waiter.join(timeout=60)
    assert got and got[0] is not None
    assert wakes.count("waiter") == 1
    assert not store._waiting


def _read_in_a_transaction(store: MemoryStore, key: str) -> object:
    with store.begin() as tx:
        return tx.rms.get(key)
