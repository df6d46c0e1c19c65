"""Durable delivery retries and the poison store, the same in every store; the v2 -> v3 upgrade."""

from __future__ import annotations

import pytest

from wsrm_plugin.store import StorageManager, UnknownMessageError, open_store
from wsrm_plugin.store import sqlite as _sqlite  # noqa: F401 -- imported before any patching (it binds LATEST_VERSION)
from wsrm_plugin.store.sql import LATEST_VERSION

from .conftest import KINDS
from .test_managers import new_rmd

SQL_KINDS = [KINDS[1], KINDS[2]]
T0 = 1_000_000.0


def buffered(store: StorageManager, numbers=(1, 2, 3), sid: str = "s1") -> None:
    with store.begin() as tx:
        new_rmd(tx, sid)
        for n in numbers:
            tx.rmd.record_received(sid, n)
            assert tx.invoker.put(sid, n, f"<m{n}/>".encode(), action="urn:a", soap_version="v",
                                  message_id=f"urn:m{n}", now=T0)


def claim(store: StorageManager, now: float = T0):
    with store.begin() as tx:
        msg = tx.invoker.claim_next(now=now)
        return None if msg is None else (msg.number, msg.attempts, msg.cycle)


def deliver(store: StorageManager, number: int, now: float = T0) -> None:
    with store.begin() as tx:
        msg = tx.invoker.claim_next(now=now)
        assert msg is not None and msg.number == number, msg
        tx.invoker.mark_delivered(msg.sequence_id, msg.number)


def test_a_failure_is_recorded_durably_and_the_message_waits_until_its_next_attempt(store) -> None:
    buffered(store)
    with store.begin() as tx:
        tx.invoker.record_failure("s1", 1, attempts=2, cycle=1, next_attempt_at=T0 + 30, error="db down")
    assert claim(store, T0 + 29) is None           # InOrder: nothing before 1 is retried
    with store.begin() as tx:
        assert tx.invoker.count_retrying() == 1 and tx.invoker.count_retrying("s1") == 1
        assert tx.invoker.next_deliverable("s1").number == 1          # still the next in line
        assert tx.invoker.next_deliverable("s1", now=T0 + 29) is None  # ...but not due yet
    assert claim(store, T0 + 30) == (1, 2, 1)
    with store.begin() as tx:
        msg = tx.invoker.get("s1", 1)
        assert msg.last_error == "db down" and msg.waiting_for_retry
        assert tx.invoker.get("s1", 9) is None
    status = store.status()
    assert status.retrying == 1 and status.rmd[0].retrying == 1


def test_unordered_delivery_skips_a_message_waiting_for_its_retry(store) -> None:
    buffered(store)
    with store.begin() as tx:
        tx.invoker.record_failure("s1", 1, attempts=1, cycle=0, next_attempt_at=T0 + 30, error="x")
    with store.begin() as tx:
        assert tx.invoker.claim_next(in_order=False, now=T0).number == 2


def test_hold_keeps_the_gap_and_retry_puts_the_message_back_in_order(store) -> None:
    buffered(store)
    with store.begin() as tx:
        tx.invoker.get("s1", 1)
        tx.invoker.record_failure("s1", 1, attempts=9, cycle=3, next_attempt_at=None, error="bug")
        poisoned = tx.invoker.poison("s1", 1, hold=True, now=T0 + 5)
    assert poisoned.poison_id == "s1#1" and poisoned.total_attempts == 9 and poisoned.cycles == 3
    assert claim(store) is None                      # held: 2 and 3 wait
    with store.begin() as tx:
        [listed] = tx.invoker.list_poison()
        assert listed == poisoned and listed.payload == b"<m1/>" and listed.held
        assert listed.last_error == "bug" and listed.message_id == "urn:m1"
        assert tx.invoker.get_poison("s1", 1) == poisoned and tx.invoker.count_poison() == 1
        assert tx.invoker.count("s1") == 2 and tx.invoker.count_retrying() == 0
    assert store.status().poisoned == 1 and store.status().rmd[0].poisoned == 1
    with store.begin() as tx:
        back = tx.invoker.retry_poison("s1", 1)
    assert (back.number, back.attempts, back.cycle, back.next_attempt_at) == (1, 0, 0, None)
    for n in (1, 2, 3):
        deliver(store, n)
    with store.begin() as tx:
        assert tx.invoker.count_poison() == 0 and tx.invoker.state("s1").delivered_count == 3


def test_continue_goes_on_and_a_retried_message_is_delivered_before_later_arrivals(store) -> None:
    buffered(store, numbers=(1, 2, 3))
    with store.begin() as tx:
        tx.invoker.get("s1", 1)
        assert not tx.invoker.poison("s1", 1, hold=False, error="bug").held
    deliver(store, 2)
    with store.begin() as tx:
        tx.invoker.retry_poison("s1", 1)
    deliver(store, 1)                                # back in line before 3
    deliver(store, 3)
    assert claim(store) is None
    with store.begin() as tx:
        assert str(tx.invoker.state("s1").delivered) == "1-3"


def test_discard_is_final_and_lets_a_held_sequence_go_on(store) -> None:
    buffered(store)
    with store.begin() as tx:
        tx.invoker.get("s1", 1)
        tx.invoker.poison("s1", 1, hold=True)
    with store.begin() as tx:
        assert tx.invoker.discard_poison("s1", 1).number == 1
    deliver(store, 2)
    with store.begin() as tx:
        assert tx.invoker.list_poison() == []
        with pytest.raises(UnknownMessageError):
            tx.invoker.discard_poison("s1", 1)
    with store.begin() as tx:
        with pytest.raises(UnknownMessageError):
            tx.invoker.retry_poison("s1", 7)


def test_a_poison_message_outlives_its_released_sequence_and_can_still_be_retried(store) -> None:
    buffered(store, numbers=(1, 2))
    deliver(store, 1)
    with store.begin() as tx:
        tx.invoker.get("s1", 2)
        tx.invoker.poison("s1", 2, hold=False)
    with store.begin() as tx:
        tx.rmd.delete("s1")                        # the sequence is released
        tx.invoker.discard("s1")
    with store.begin() as tx:
        assert [p.number for p in tx.invoker.list_poison("s1")] == [2]
        tx.invoker.retry_poison("s1", 2)
    deliver(store, 2)


def test_a_rolled_back_poisoning_leaves_the_message_in_the_buffer(store) -> None:
    buffered(store, numbers=(1,))
    tx = store.begin()
    tx.invoker.get("s1", 1)
    tx.invoker.poison("s1", 1, hold=True)
    tx.rollback()
    assert claim(store) == (1, 0, 0)
    with store.begin() as tx:
        assert tx.invoker.count_poison() == 0


@pytest.mark.parametrize("store_url", SQL_KINDS, indirect=True)
def test_a_version_2_store_is_upgraded_to_3_with_its_buffered_messages(store_url, monkeypatch) -> None:
    """Version 3 adds the retry columns to invoker_message and the poison_message table."""
    from wsrm_plugin.store.api import BufferedMessage
    from wsrm_plugin.store.sql import invoker, rows, schema

    assert LATEST_VERSION >= 3
    with monkeypatch.context() as old_code:  # the code of version 2: its migrations and its columns
        old_code.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:2])
        old_code.setattr(schema, "LATEST_VERSION", 2)
        old_columns = rows._BUF_COLS[:8]
        for module in (rows, invoker):  # each binds the names it reads
            old_code.setattr(module, "_BUF_COLS", old_columns)
            old_code.setattr(module, "_buf", lambda row: BufferedMessage(**dict(zip(old_columns, row))))
        old = open_store(store_url())
        buffered(old, numbers=(1, 2))
        with old.begin() as tx:
            assert [r[0] for r in tx.all("SELECT version FROM schema_version ORDER BY version")] == [1, 2]
        old.close()
    upgraded = open_store(store_url())
    try:
        assert upgraded.schema_version_found == 2
        with upgraded.begin() as tx:
            versions = [r[0] for r in tx.all("SELECT version FROM schema_version ORDER BY version")]
            assert versions == list(range(1, LATEST_VERSION + 1))
            msg = tx.invoker.claim_next(now=T0)
            assert (msg.number, msg.attempts, msg.cycle, msg.next_attempt_at, msg.payload) == (1, 0, 0, None, b"<m1/>")
            tx.invoker.record_failure("s1", 1, attempts=1, cycle=0, next_attempt_at=None, error="e")
            tx.invoker.poison("s1", 1, hold=True)
        with upgraded.begin() as tx:
            assert [p.number for p in tx.invoker.list_poison()] == [1]
    finally:
        upgraded.close()
