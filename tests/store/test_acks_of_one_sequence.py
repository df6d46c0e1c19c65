"""On PostgreSQL two acknowledgements of one sequence, each beside the callers' enqueues, take
their messages one after the other, never crosswise.

Engines sharing a store send each other's sequences, so the answers to two engines' sends of one
sequence carry acknowledgements of it at once.  Each holds the sequence's row only ``FOR KEY
SHARE`` (callers' enqueues go on beside it), which does not keep the other out.  The one that
also got the row for its write (``lk``) deletes its retransmitted messages; the other only marks
them acknowledged, in a second pass after its deletes: its rows in another order than the first
one's, so the two deadlocked (16 client engines on one store, 2 of 4 runs; PostgreSQL chose one
as the victim and the engine retried it).
"""

from __future__ import annotations

import threading
import time

import psycopg2
import pytest

from wsrm_plugin.store import open_store

from .test_managers import started

pytestmark = pytest.mark.postgres


def _waiting(conn, count: int, extra: object = None) -> None:
    """Until ``count`` sessions of this database wait for a lock (what the test lines up)."""
    deadline = time.monotonic() + 15
    with conn.cursor() as cur:
        while time.monotonic() < deadline:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'")
            if cur.fetchone()[0] >= count:
                return
            time.sleep(0.02)
    pytest.fail(f"{count} sessions never waited for a lock: {extra}")


def test_two_acknowledgements_of_one_sequence_do_not_deadlock(fresh_db) -> None:
    # a short deadlock_timeout: the old order's deadlock is found in 50 ms, not the server's 1 s
    store = open_store("postgresql:" + fresh_db + " options='-c deadlock_timeout=50'", lock_timeout=15)
    blocker = psycopg2.connect(fresh_db)
    watch = psycopg2.connect(fresh_db)
    watch.autocommit = True
    try:
        started(store, messages=3)  # 1, 2 and 3 sent once
        with store.begin() as tx:  # 1 sent again: the acknowledgement that holds the row deletes it
            tx.rms_messages.record_send_attempt("k1", 1, next_send_at=1e12)
        with blocker.cursor() as cur:  # 2 held: the first acknowledgement stops there, holding 1
            cur.execute("SELECT 1 FROM rms_message WHERE number = 2 FOR UPDATE")
        outcome: dict[str, object] = {}

        def acknowledge(name: str, ranges: list[tuple[int, int]]) -> None:
            try:
                with store.begin(durable=False) as tx:
                    tx.rms_messages.acknowledge_sequence("seq-1", ranges, beside_enqueues=True, alone=True)
            except Exception as exc:  # noqa: BLE001 -- asserted below
                outcome[name] = exc
            else:
                outcome[name] = "acknowledged"

        first = threading.Thread(target=acknowledge, args=("first", [(1, 3)]))
        first.start()
        _waiting(watch, 1, outcome)  # 1 deleted, the row's lock taken (lk), waiting for 2
        # the second: 3 deleted at once (no one holds it), then 1 marked: held by the first
        second = threading.Thread(target=acknowledge, args=("second", [(1, 1), (3, 3)]))
        second.start()
        _waiting(watch, 2, outcome)
        blocker.rollback()  # the first goes on to 3
        first.join(30)
        second.join(30)
        assert outcome == {"first": "acknowledged", "second": "acknowledged"}
        with store.begin() as tx:
            assert tx.rms_messages.list_for("k1") == []
            assert tx.rms.get("k1").purged_retransmissions == 1
    finally:
        blocker.close()
        watch.close()
        store.close()
