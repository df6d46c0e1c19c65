"""``take_next``: a message delivered in the transaction that receives it, never buffered.

Delivery on receipt (``RMPolicy.deliver_on_receive``) records a message as
delivered instead of buffering it, but only when it is the very next one in
order: anything else must be buffered, or in-order delivery and exactly-once
break.  Same behaviour on all three stores.
"""

from __future__ import annotations

import threading
import time

import psycopg2
import pytest

from wsrm_plugin.statemachine.ackranges import AckRanges
from wsrm_plugin.store import StorageManager
from wsrm_plugin.store.sql import placeholders

from .conftest import KINDS


def _put(store: StorageManager, seq: str, number: int) -> None:
    with store.begin() as tx:
        assert tx.invoker.put(seq, number, b"<m/>", action="urn:a", soap_version="urn:s")


def _delivered(store: StorageManager, seq: str) -> AckRanges:
    with store.begin() as tx:
        return tx.invoker.state(seq).delivered


def test_a_new_sequence_takes_its_first_message_and_then_each_next_one(store: StorageManager) -> None:
    with store.begin() as tx:
        assert tx.invoker.take_next("s", 1)
        assert tx.invoker.take_next("s", 2)  # in the same transaction too
    with store.begin() as tx:
        assert tx.invoker.take_next("s", 3)
        assert tx.invoker.count("s") == 0
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 3)])


def test_a_message_after_a_gap_is_not_taken(store: StorageManager) -> None:
    with store.begin() as tx:
        assert not tx.invoker.take_next("s", 2)  # nothing delivered yet: 1 comes first
    with store.begin() as tx:
        assert tx.invoker.take_next("s", 1)
        assert not tx.invoker.take_next("s", 3)
        assert not tx.invoker.take_next("s", 1)  # delivered already
    assert _delivered(store, "s") == AckRanges.of([1])


def test_a_buffered_message_is_never_taken_and_nothing_passes_it(store: StorageManager) -> None:
    _put(store, "s", 1)  # the one before is buffered: the next may not overtake it
    with store.begin() as tx:
        assert not tx.invoker.take_next("s", 1)
        assert not tx.invoker.take_next("s", 2)
    assert _delivered(store, "s") == AckRanges()
    with store.begin() as tx:
        assert tx.invoker.next_deliverable("s").number == 1
        tx.invoker.mark_delivered("s", 1)
    with store.begin() as tx:
        assert tx.invoker.take_next("s", 2)
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 2)])


def test_delivered_ranges_with_a_hole_take_nothing(store: StorageManager) -> None:
    """Delivered 1 and 3 (a message poisoned without holding, then an operator's discard):
    only an exact prefix 1..n-1 lets n through; the buffer path decides the rest."""
    with store.begin() as tx:
        assert tx.invoker.take_next("s", 1)
    _put(store, "s", 3)
    with store.begin() as tx:
        tx.invoker.mark_delivered("s", 3)
    with store.begin() as tx:
        assert not tx.invoker.take_next("s", 2)
        assert not tx.invoker.take_next("s", 4)


def test_a_rollback_takes_nothing(store: StorageManager) -> None:
    with pytest.raises(RuntimeError), store.begin() as tx:
        assert tx.invoker.take_next("s", 1)
        raise RuntimeError("the application failed")
    assert _delivered(store, "s") == AckRanges()
    with store.begin() as tx:
        assert tx.invoker.take_next("s", 1)


def test_the_number_is_checked(store: StorageManager) -> None:
    with store.begin() as tx, pytest.raises(ValueError):
        tx.invoker.take_next("s", 0)


@pytest.mark.parametrize("store_url", [k for k in KINDS if k.id != "sqlite"], indirect=True)
def test_a_take_waits_for_a_delivery_of_the_message_before_it_and_then_goes(open_kind) -> None:
    """The one before is being delivered in another transaction (its buffer held): the take
    waits for that commit, then sees it delivered and takes its own message.  (Not SQLite:
    one writer at a time, so the second transaction waits before any statement.)"""
    store = open_kind(lock_timeout=10.0)
    with store.begin() as tx:
        assert tx.invoker.take_next("s", 1)
    _put(store, "s", 2)
    assert _while_2_is_delivered(store, lambda tx: tx.invoker.take_next("s", 3)) == [True]
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 3)])


def _while_2_is_delivered(store: StorageManager, receive_3) -> list[bool]:
    """Run ``receive_3(tx)`` in another thread while a transaction delivers buffered message 2
    (holding the sequence's buffer): it must wait, not refuse; what it answered after the commit."""
    holding, taken = threading.Event(), []

    def receive() -> None:
        holding.wait(10)
        with store.begin() as tx:
            taken.append(receive_3(tx))

    thread = threading.Thread(target=receive)
    thread.start()
    with store.begin() as tx:
        assert tx.invoker.next_deliverable("s").number == 2  # holds the sequence's buffer
        holding.set()
        time.sleep(0.3)
        assert taken == []  # waiting, not refused
        tx.invoker.mark_delivered("s", 2)
    thread.join(10)
    return taken


# -- receive_and_take: the receipt and the take in one call (one statement on PostgreSQL) -------

def _rmd(store: StorageManager, seq: str) -> None:
    with store.begin() as tx:
        tx.rmd.create(seq, acks_to="http://a", rm_version="urn:rm", wsa_version="urn:wsa")


def _received(store: StorageManager, seq: str):
    with store.begin() as tx:
        return tx.rmd.require(seq)


def test_receive_and_take_records_each_next_message_received_and_delivered(store: StorageManager) -> None:
    _rmd(store, "s")
    for number in (1, 2, 3):  # the first one (the invoker row is created) and the ones after it
        with store.begin() as tx:
            tx.rmd.get("s")  # a receive reads its sequence first (and holds it)
            assert tx.receive_and_take("s", number, now=100.0 + number)
            assert tx.rmd.require("s").received == AckRanges.from_ranges([(1, number)])
            assert tx.invoker.count("s") == 0
    seq = _received(store, "s")
    assert seq.received == AckRanges.from_ranges([(1, 3)])
    assert seq.last_activity == 103.0
    assert seq.last_number is None
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 3)])


def _receive(store: StorageManager, number: int, **options) -> bool:
    """A receive's transaction: the sequence read (and held), then receive_and_take."""
    with store.begin() as tx:
        tx.rmd.get("s")
        return tx.receive_and_take("s", number, **options)


def test_receive_and_take_records_a_message_it_cannot_take(store: StorageManager) -> None:
    """After a gap, or behind a buffered message: received all the same, not delivered (the
    caller buffers it)."""
    _rmd(store, "s")
    assert _receive(store, 1)
    assert not _receive(store, 3)  # 2 has not come
    _put(store, "s", 2)
    assert not _receive(store, 4)  # 2 is buffered: nothing passes it
    assert _received(store, "s").received == AckRanges.from_ranges([(1, 1), (3, 4)])
    assert _delivered(store, "s") == AckRanges.of([1])


def test_receive_and_take_of_the_last_message_records_its_number(store: StorageManager) -> None:
    _rmd(store, "s")
    assert _receive(store, 1)
    with store.begin() as tx:
        tx.rmd.get("s")
        assert tx.receive_and_take("s", 2, last=True)
        assert tx.rmd.require("s").last_number == 2  # what the transaction holds is the new row
    assert _received(store, "s").last_number == 2


def test_receive_and_take_rolls_back_whole(store: StorageManager) -> None:
    _rmd(store, "s")
    with store.begin() as tx:
        tx.rmd.get("s")
        assert tx.receive_and_take("s", 1)
    with pytest.raises(RuntimeError), store.begin() as tx:
        tx.rmd.get("s")
        assert tx.receive_and_take("s", 2)
        raise RuntimeError("the application failed")
    assert _received(store, "s").received == AckRanges.of([1])
    assert _delivered(store, "s") == AckRanges.of([1])


def test_receive_and_take_of_an_unknown_sequence_fails(store: StorageManager) -> None:
    from wsrm_plugin.store import UnknownSequenceError

    with store.begin() as tx, pytest.raises(UnknownSequenceError):
        tx.receive_and_take("nobody", 2)


@pytest.mark.parametrize("store_url", [k for k in KINDS if k.id != "sqlite"], indirect=True)
def test_receive_and_take_waits_for_a_delivery_of_the_message_before_it(open_kind) -> None:
    """As take_next: the invoker row held by a delivery in progress makes it wait, then take."""
    store = open_kind(lock_timeout=10.0)
    _rmd(store, "s")
    with store.begin() as tx:
        tx.rmd.get("s")
        assert tx.receive_and_take("s", 1)
    _put(store, "s", 2)
    with store.begin() as tx:
        tx.rmd.get("s")
        tx.rmd.record_received("s", 2)

    def receive_3(tx) -> bool:
        tx.rmd.get("s")
        return tx.receive_and_take("s", 3)

    assert _while_2_is_delivered(store, receive_3) == [True]
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 3)])
    assert _received(store, "s").received == AckRanges.from_ranges([(1, 3)])


@pytest.mark.parametrize("store_url", [k for k in KINDS if k.id == "postgresql"], indirect=True)
def test_a_take_writes_no_row_lock_and_one_that_cannot_take_changes_nothing(open_kind) -> None:
    """PostgreSQL: ``take_next`` and ``receive_and_take`` update the invoker's row with no
    ``SELECT ... FOR UPDATE`` ahead (each wrote a Heap/LOCK record before: fails without).  A
    take that cannot take (the message before it buffered, not delivered) leaves the delivered
    ranges as they were and holds the row until its transaction ends, as that lock did."""
    from .test_lane_claim_locks import _wal_records

    store = open_kind(lock_timeout=10.0)
    _rmd(store, "s")
    with store.begin() as tx:
        tx.rmd.get("s")
        assert tx.receive_and_take("s", 1)

    def take(number: int, receive: bool = False) -> None:
        with store.begin() as tx:
            if receive:
                tx.rmd.get("s")
                assert tx.receive_and_take("s", number)
            else:
                assert tx.invoker.take_next("s", number)

    for number, receive in ((2, False), (3, True)):
        records = _wal_records(store, lambda: take(number, receive))
        # receive_and_take: the RMD row's, by the caller's read of it (rmd.get) ahead of the receipt
        assert records.count("Heap/LOCK") == (1 if receive else 0), records
        assert records.count("Heap/HOT_UPDATE") == (2 if receive else 1), records
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 3)])
    _put(store, "s", 4)
    with store.begin() as tx:
        assert tx.invoker.take_next("s", 5) is False
        other = psycopg2.connect(store.dsn)
        try:
            with other, other.cursor() as cur:  # held: a delivery of 4 waits for this transaction
                cur.execute("SET lock_timeout = '50ms'")
                with pytest.raises(psycopg2.errors.LockNotAvailable):
                    cur.execute("SELECT 1 FROM invoker_sequence WHERE sequence_id = 's' FOR UPDATE")
        finally:
            other.close()
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 3)])
    with store.begin() as tx:
        assert tx.invoker.next_deliverable("s").number == 4


# -- receive_in_order: the lock, the receipt and the take in one round trip (PostgreSQL) ---------

PG_ONLY = [k for k in KINDS if k.id == "postgresql"]
SQL = [k for k in KINDS if k.id in ("postgresql", "sqlite")]


def test_receive_in_order_is_a_guess_only_the_sql_stores_make(open_kind, store_url) -> None:
    """The memory store has nothing to save: None, nothing written.  PostgreSQL saves a round
    trip, SQLite a statement (the read of the row before its write)."""
    store = open_kind()
    _rmd(store, "s")
    assert _receive(store, 1)
    with store.begin() as tx:
        guessed = tx.receive_in_order("s", 2)
    if store_url().startswith(("postgresql", "sqlite")):
        assert guessed is not None
    else:
        assert guessed is None
        assert _received(store, "s").received == AckRanges.of([1])


@pytest.mark.parametrize("store_url", SQL, indirect=True)
def test_receive_in_order_records_and_takes_the_next_message(open_kind) -> None:
    store = open_kind(lock_timeout=10.0)
    _rmd(store, "s")
    assert _receive(store, 1)
    t = _received(store, "s").last_activity
    for number in (2, 3):
        with store.begin() as tx:
            guessed = tx.receive_in_order("s", number, now=t + 10 * number)
            assert guessed is not None
            before, taken = guessed
            assert taken
            assert before.received == AckRanges.from_ranges([(1, number - 1)])  # as it was
            assert before.acks_to == "http://a" and not before.closed
            assert tx.rmd.require("s").received == AckRanges.from_ranges([(1, number)])  # as it is
            assert tx.receive_in_order("s", number + 1) is None  # once per transaction: held now
    seq = _received(store, "s")
    assert seq.received == AckRanges.from_ranges([(1, 3)]) and seq.last_activity == t + 30
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 3)])


@pytest.mark.parametrize("store_url", SQL, indirect=True)
def test_receive_in_order_writes_the_last_activity_once_a_second_at_most(open_kind) -> None:
    """``last_activity`` to a second (``ACTIVITY_GRAIN``), as an acknowledgement writes a source
    sequence's: a receipt within a second of the one stored leaves it, the row as held says so,
    and one later moves it (PostgreSQL's WAL record of the receipt then carries only the
    received ranges' changed bytes)."""
    from wsrm_plugin.store.sql.statements import ACTIVITY_GRAIN

    store = open_kind(lock_timeout=10.0)
    _rmd(store, "s")
    assert _receive(store, 1)
    t = _received(store, "s").last_activity + 10 * ACTIVITY_GRAIN
    stamps = []
    for number, now in ((2, t), (3, t + ACTIVITY_GRAIN / 2), (4, t + 2 * ACTIVITY_GRAIN)):
        with store.begin() as tx:
            guessed = tx.receive_in_order("s", number, now=now)
            assert guessed is not None and guessed[1]
            held = tx.rmd.require("s")
            assert held.received == AckRanges.from_ranges([(1, number)])
        stamps.append((held.last_activity, _received(store, "s").last_activity))
    assert stamps == [(t, t), (t, t), (t + 2 * ACTIVITY_GRAIN, t + 2 * ACTIVITY_GRAIN)]


@pytest.mark.parametrize("store_url", SQL, indirect=True)
def test_receive_in_order_records_a_message_it_cannot_take(open_kind) -> None:
    """2 is buffered (not delivered yet): 3 is received, not taken (the caller buffers it)."""
    store = open_kind(lock_timeout=10.0)
    _rmd(store, "s")
    assert _receive(store, 1)
    with store.begin() as tx:  # 2 received and buffered, as a receive that could not take it does
        tx.rmd.get("s")
        tx.rmd.record_received("s", 2)
        assert tx.invoker.put("s", 2, b"<m/>", action="urn:a", soap_version="urn:s")
    with store.begin() as tx:
        guessed = tx.receive_in_order("s", 3)
        assert guessed is not None and guessed[1] is False
    assert _received(store, "s").received == AckRanges.from_ranges([(1, 3)])
    assert _delivered(store, "s") == AckRanges.of([1])


def _assert_no_guess_past_the_last_or_closed(store) -> None:
    """Once the last number is known, on a closed sequence and on an unknown one the guess is
    None, and what 1 and 2 left stays as it was."""
    with store.begin() as tx:
        tx.rmd.update("s", last_number=5)
    with store.begin() as tx:
        assert tx.receive_in_order("s", 3) is None
    with store.begin() as tx:
        tx.rmd.update("s", last_number=None, closed=True)
    with store.begin() as tx:
        assert tx.receive_in_order("s", 3) is None
    with store.begin() as tx:
        assert tx.receive_in_order("unknown", 2) is None
    assert _received(store, "s").received == AckRanges.from_ranges([(1, 2)])
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 2)])


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_receive_in_order_is_one_statement_and_writes_no_row_lock(open_kind) -> None:
    """The receipt's UPDATE takes the sequence's lock: no statement ahead of it to lock the
    row, whose lock PostgreSQL wrote to the WAL (a Heap/LOCK record a message) before the update
    (fails without: a second statement, two row locks); and the take's UPDATE the invoker's row,
    with no ``SELECT ... FOR UPDATE`` ahead of it (fails without: one row lock, that one)."""
    from .test_lane_claim_locks import _wal_records

    store = open_kind(lock_timeout=10.0)
    _rmd(store, "s")
    assert _receive(store, 1)
    sent = []

    def receive_2() -> None:
        with store.begin() as tx:
            execute = tx.execute
            noting = lambda *a, **k: sent.append((a[0], k.get("then"))) or execute(*a, **k)  # noqa: E731
            tx.execute = noting  # type: ignore[method-assign]
            assert tx.receive_in_order("s", 2, now=300.0)[1] is True

    records = _wal_records(store, receive_2)
    assert len(sent) == 1 and sent[0][1] is None, sent
    assert records.count("Heap/LOCK") == 0, records
    assert records.count("Heap/HOT_UPDATE") == 2, records  # the sequence's row and the invoker's
    assert _received(store, "s").received == AckRanges.from_ranges([(1, 2)])
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 2)])


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_receive_in_order_plans_one_read_of_the_sequence(open_kind) -> None:
    """The receive's statement reads the sequence's row once, by its UPDATE: the row as it is,
    for a guess found wrong, is read by a statement after it, not by a CTE (and a UNION ALL)
    whose plan every receive set up and tore down (fails without: the row read twice)."""
    store = open_kind(lock_timeout=10.0)
    _rmd(store, "s")
    assert _receive(store, 1)
    sent = []
    with store.begin() as tx:
        execute = tx.execute
        tx.execute = lambda *a, **k: sent.append(a[:2]) or execute(*a, **k)  # type: ignore[method-assign]
        assert tx.receive_in_order("s", 2)[1] is True
    [(sql, params)] = sent
    conn = psycopg2.connect(store.dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("EXPLAIN (FORMAT JSON) " + placeholders.expand(sql, params)[0], placeholders.expand(sql, params)[1])
            plan = cur.fetchone()[0]
    finally:
        conn.close()

    def scanned(node) -> list[str]:  # the tables the plan's scans read (not its UPDATEs' targets)
        return ([node["Relation Name"]] if "Scan" in node["Node Type"] and "Relation Name" in node else []) + [
            name for child in node.get("Plans", []) for name in scanned(child)]

    assert scanned(plan[0]["Plan"]).count("rmd_sequence") == 1, scanned(plan[0]["Plan"])


def _received_and_delivered(open_kind, upto: int) -> StorageManager:
    """A store whose sequence "s" received and delivered exactly 1..upto."""
    store = open_kind(lock_timeout=10.0)
    _rmd(store, "s")
    assert _receive(store, 1)
    with store.begin() as tx:
        tx.rmd.get("s")
        tx.write("UPDATE rmd_sequence SET received = ? WHERE sequence_id = ?", (f"1-{upto}", "s"))
        tx.write("UPDATE invoker_sequence SET delivered = ?, delivered_upto = ? WHERE sequence_id = ?",
                 (f"1-{upto}", upto, "s"))
    return store


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_receive_in_order_sends_each_value_once_and_takes_numbers_past_32_bits(open_kind) -> None:
    """The receipt and take name the sequence, the ranges and the number again (``?N``) instead
    of sending them again: once prepared (a session's second receipt), its ``EXECUTE`` carries
    5 arguments (14 before), typed as the columns are: the number a ``bigint`` (written as
    ``?5 - 1`` PostgreSQL would type it ``integer``, and a number past 2**31 would fail)."""
    high = 2 ** 31 + 5
    store = _received_and_delivered(open_kind, high - 3)
    for number in (high - 2, high - 1, high):  # text, then prepared, then executed
        with store.begin() as tx:
            guessed = tx.receive_in_order("s", number, now=1e9 + number)
            assert guessed is not None and guessed[1], number
            sql, params = tx._text(*_last_receipt(tx, number))
    assert sql.startswith("EXECUTE wsrm_") and len(params) == 5, (sql, params)
    with store.begin() as tx:
        types = tx.one("SELECT parameter_types::text FROM pg_prepared_statements WHERE statement LIKE ?",
                       ("%UPDATE invoker_sequence SET delivered = CASE%",))
    assert types == ('{text,"double precision",text,text,bigint}',), types
    assert _received(store, "s").received == AckRanges.from_ranges([(1, high)])
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, high)])


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_take_next_and_receive_and_take_send_each_value_once_past_32_bits(open_kind) -> None:
    """The take names its number, ranges and sequence again (``?N``): 4 arguments once prepared
    (11 before), after a receipt's own in ``receive_and_take``; numbers past 2**31 taken."""
    from wsrm_plugin.store.sql.statements import _take, _take_params

    high = 2 ** 31 + 6
    store = _received_and_delivered(open_kind, high - 6)
    for number in (high - 5, high - 4, high - 3):  # text, then prepared, then executed
        with store.begin() as tx:
            tx.rmd.get("s")
            assert tx.rmd.record_received("s", number)
            assert tx.invoker.take_next("s", number)
            sql, params = tx._text(_take(), _take_params("s", number + 1))
    assert sql.startswith("EXECUTE wsrm_") and len(params) == 4, (sql, params)
    for number in (high - 2, high - 1, high):
        assert _receive(store, number)
    assert _received(store, "s").received == AckRanges.from_ranges([(1, high)])
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, high)])


def _last_receipt(tx, number: int):
    from wsrm_plugin.store.sql.statements import _RECEIVE_IN_ORDER, _prefix, _receipt_and_take_params

    return _RECEIVE_IN_ORDER, _receipt_and_take_params("s", number + 1, 1e9, _prefix(number))


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_a_wrong_guess_writes_nothing_and_leaves_the_sequence_locked(open_kind) -> None:
    """After a gap, a duplicate, on a closed sequence or once the last number is known: None,
    nothing written, and the row locked (so the caller's read is no new wait)."""
    store = open_kind(lock_timeout=10.0)
    _rmd(store, "s")
    assert _receive(store, 1) and _receive(store, 2)
    for number in (4, 2):  # a gap; a duplicate
        with store.begin() as tx:
            assert tx.receive_in_order("s", number) is None
            executed = []
            execute = tx.execute
            tx.execute = lambda *a, **k: executed.append(a[0]) or execute(*a, **k)  # type: ignore[method-assign]
            assert tx.rmd.get("s").received == AckRanges.from_ranges([(1, 2)])  # read with the guess
            assert executed == []  # no round trip of its own
            other = store.begin()
            try:
                with pytest.raises(Exception, match="(?i)lock"):
                    other.execute("SET LOCAL lock_timeout = '100ms'")
                    other.execute("SELECT 1 FROM rmd_sequence WHERE sequence_id = 's' FOR UPDATE")
            finally:
                other.rollback()
    _assert_no_guess_past_the_last_or_closed(store)


@pytest.mark.parametrize("store_url", [k for k in KINDS if k.id == "sqlite"], indirect=True)
def test_a_wrong_guess_on_sqlite_writes_nothing(open_kind) -> None:
    """SQLite's guess is the receipt's UPDATE: after a gap, a duplicate, on a closed sequence or
    once the last number is known it changes no row, and the caller reads the row as it is."""
    store = open_kind(lock_timeout=10.0)
    _rmd(store, "s")
    assert _receive(store, 1) and _receive(store, 2)
    for number in (4, 2):  # a gap; a duplicate
        with store.begin() as tx:
            before = tx.conn.total_changes
            assert tx.receive_in_order("s", number) is None
            assert tx.conn.total_changes == before
            assert tx.rmd.get("s").received == AckRanges.from_ranges([(1, 2)])
    _assert_no_guess_past_the_last_or_closed(store)


@pytest.mark.parametrize("store_url", SQL, indirect=True)
def test_a_receive_in_order_rolled_back_leaves_nothing(open_kind) -> None:
    """The caller checks the message after the guess wrote it, and rolls back if it refuses it."""
    store = open_kind(lock_timeout=10.0)
    _rmd(store, "s")
    assert _receive(store, 1)
    with pytest.raises(RuntimeError), store.begin() as tx:
        assert tx.receive_in_order("s", 2) is not None
        raise RuntimeError("refused after all")
    assert _received(store, "s").received == AckRanges.of([1])
    assert _delivered(store, "s") == AckRanges.of([1])


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_receive_in_order_waits_for_the_receive_before_it(open_kind) -> None:
    """The receive of 2 holds the sequence until its commit: the one of 3 waits for it in its
    statement, whose snapshot saw 1 received (the guess fails there), and, the row now held and
    its guess holding for it, sends its statement again: it records and takes 3 in two
    statements, as the lock ahead of the write did."""
    store = open_kind(lock_timeout=10.0)
    _rmd(store, "s")
    assert _receive(store, 1)
    holding, results, sent = threading.Event(), [], []

    def receive_3() -> None:
        holding.wait(10)
        with store.begin() as tx:
            execute = tx.execute
            tx.execute = lambda *a, **k: sent.append(a[0]) or execute(*a, **k)  # type: ignore[method-assign]
            results.append(tx.receive_in_order("s", 3))

    thread = threading.Thread(target=receive_3)
    thread.start()
    with store.begin() as tx:
        assert tx.receive_in_order("s", 2) is not None
        holding.set()
        time.sleep(0.3)
        assert results == []  # waiting
    thread.join(10)
    assert len(results) == 1 and results[0] is not None and results[0][1] is True
    assert results[0][0].received == AckRanges.from_ranges([(1, 2)])  # as it was before 3
    # the receipt found its guess wrong against its snapshot, the row as it is now read and
    # locked, the receipt again
    assert len(sent) == 3, sent
    assert _received(store, "s").received == AckRanges.from_ranges([(1, 3)])
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 3)])


def test_mark_next_delivered_removes_the_next_message_and_refuses_one_that_is_not(store: StorageManager) -> None:
    """``mark_next_delivered``: the delivery on receipt that ran its method outside the store's
    transactions (SQLite) marks its buffered message without reading the sequence first; its
    writes refuse a message no longer buffered, or no longer the next, and the transaction
    then rolls back with whatever the method wrote."""
    from wsrm_plugin.store import UnknownMessageError

    _put(store, "s", 1)
    with store.begin() as tx:
        tx.invoker.mark_next_delivered("s", 1)
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 1)])
    _put(store, "s", 3)  # 2 missing: 3 is not the next
    with pytest.raises(UnknownMessageError), store.begin() as tx:
        tx.invoker.mark_next_delivered("s", 3)
    with pytest.raises(UnknownMessageError), store.begin() as tx:
        tx.invoker.mark_next_delivered("s", 2)  # not buffered
    with store.begin() as tx:
        assert tx.invoker.count("s") == 1  # 3 still buffered
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 1)])
    _put(store, "s", 2)
    with store.begin() as tx:
        tx.invoker.mark_next_delivered("s", 2)
        tx.invoker.mark_next_delivered("s", 3)
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 3)])
