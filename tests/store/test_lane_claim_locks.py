"""A lane's follow-on claim on PostgreSQL locks only the messages it writes (issue 33).

``claim_first_sends`` read its candidates ``FOR UPDATE`` before updating them: each message
claimed cost a row lock in the WAL before its update (3.6 row locks a message under 16
sequences in XA, this one of them), and a claim that wrote nothing (a candidate sent
already) held every candidate until its transaction ended.  The claim now reads without a
lock and its UPDATE writes only a message still unsent once it holds it.  These tests check
the WAL (``pg_walinspect``), that a claim that writes nothing holds nothing, and that a claim
meeting a send in progress waits for it and leaves that message out: no message is claimed
twice.
"""

from __future__ import annotations

import threading
import time

import psycopg2
import pytest

from .conftest import KINDS
from .test_managers import started

pytestmark = pytest.mark.parametrize("store_url", [KINDS[2]], indirect=True)


def _dsn(store) -> str:
    return store.dsn


def _wal_records(store, work) -> list[str]:
    """The WAL record types ``work()`` wrote (heap and B-tree ones), read with pg_walinspect."""
    conn = psycopg2.connect(_dsn(store))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            cur.execute("SELECT pg_current_wal_insert_lsn()")
            start = cur.fetchone()[0]
            work()
            # a durable commit that wrote WAL flushes what the work's asynchronous commit left
            # unflushed (pg_walinspect reads only flushed WAL)
            cur.execute("SELECT pg_logical_emit_message(TRUE, 'test', '')")
            end = cur.fetchone()[0]
            cur.execute("SELECT resource_manager || '/' || split_part(record_type, ' ', 1) "
                        "FROM pg_get_wal_records_info(%s, %s) "
                        "WHERE resource_manager IN ('Heap', 'Heap2', 'Btree')", (start, end))
            return [r[0] for r in cur.fetchall()]
    finally:
        conn.close()


def test_a_claim_writes_no_row_lock_before_its_updates(store) -> None:
    started(store, messages=6, sent=False)

    def claim() -> None:
        with store.begin(durable=False) as lane:
            lane.rms.get("k1", beside_enqueues=True)
            assert [m.number for m in lane.rms_messages.claim_first_sends("k1", 3, next_send_at=1e12)] == [1, 2, 3]

    records = _wal_records(store, claim)
    assert records.count("Heap/HOT_UPDATE") == 3, records
    assert records.count("Heap/LOCK") == 1, records  # the sequence's row (FOR KEY SHARE), no message's
    with store.begin() as tx:
        assert [tx.rms_messages.get("k1", n).send_count for n in range(1, 7)] == [1, 1, 1, 0, 0, 0]


def test_a_refill_locks_its_sequence_once_and_no_message(store) -> None:
    """``claim_first_sends_of``: the sequence's row read and locked in the claim's statement."""
    started(store, messages=6, sent=False)

    def claim() -> None:
        with store.begin(durable=False) as lane:
            _, msgs = lane.rms_messages.claim_first_sends_of("k1", 3, next_send_at=1e12)
            assert [m.number for m in msgs] == [1, 2, 3]

    records = _wal_records(store, claim)
    assert records.count("Heap/HOT_UPDATE") == 3, records
    assert records.count("Heap/LOCK") == 1, records


def test_a_claim_that_writes_nothing_holds_nothing(store) -> None:
    started(store, messages=3, sent=False)
    with store.begin() as tx:
        tx.rms_messages.record_send_attempts("k1", [2], next_send_at=0.0)  # sent, and due again at once
    with store.begin(durable=False) as lane:
        lane.rms.get("k1", beside_enqueues=True)
        assert lane.rms_messages.claim_first_sends("k1", 3, next_send_at=1e12) == []
        other = psycopg2.connect(_dsn(store))
        try:
            with other, other.cursor() as cur:  # the messages are free while the lane's transaction goes on
                cur.execute("SELECT number FROM rms_message WHERE seq = "
                            "(SELECT id FROM rms_sequence WHERE seq_key = 'k1') ORDER BY number FOR UPDATE NOWAIT")
                assert [r[0] for r in cur.fetchall()] == [1, 2, 3]
        finally:
            other.close()
    with store.begin() as tx:
        assert [tx.rms_messages.get("k1", n).send_count for n in (1, 2, 3)] == [0, 1, 0]


def test_a_claim_meeting_a_send_in_progress_leaves_that_message_out(store) -> None:
    """A sender's round has recorded message 1's attempt and not committed yet: the lane's claim
    waits for it, then claims from the others only; every message is counted once."""
    started(store, messages=5, sent=False)
    sending = store.begin(durable=False)
    committed = False
    claimed: list[int] = []
    errors: list[BaseException] = []
    try:
        sending.rms_messages.record_send_attempts("k1", [1], next_send_at=1e12)

        def lane() -> None:
            try:
                with store.begin(durable=False) as tx:
                    tx.rms.get("k1", beside_enqueues=True)
                    claimed.extend(m.number for m in tx.rms_messages.claim_first_sends("k1", 3, next_send_at=1e12))
            except BaseException as exc:  # noqa: BLE001 -- reported below
                errors.append(exc)

        thread = threading.Thread(target=lane)
        thread.start()
        watcher = psycopg2.connect(_dsn(store))
        watcher.autocommit = True
        try:
            deadline = time.monotonic() + 60
            with watcher.cursor() as cur:
                while True:  # the lane's statement waits for message 1's row
                    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                "AND datname = current_database()")
                    if cur.fetchone()[0] or not thread.is_alive():
                        break
                    assert time.monotonic() < deadline, "the lane's claim never waited for the send in progress"
                    time.sleep(0.01)
        finally:
            watcher.close()
        assert thread.is_alive() and not claimed
        sending.commit()
        committed = True
    finally:
        if not committed:
            sending.rollback()
    thread.join(60)
    assert not errors, errors
    assert claimed and 1 not in claimed and claimed == sorted(claimed) and set(claimed) <= {2, 3, 4}, claimed
    with store.begin() as tx:
        counts = {n: tx.rms_messages.get("k1", n).send_count for n in range(1, 6)}
    assert counts == {n: 1 if n == 1 or n in claimed else 0 for n in range(1, 6)}
