"""The SQL stores keep no index of all unacknowledged messages by due time (issue 33: PostgreSQL
from schema 8, SQLite from 12).

Every enqueue wrote an entry into ``rms_message_due`` that nothing the engine runs read: the
sender takes each sequence's due messages by the sequence's own index.  These tests check that
the index is gone (also from a store upgraded from version 7), and that ``due_messages``
without ``per_sequence`` (oldest first across the sequences) answers as before and reads no
more of a long backlog than its batch.
"""

from __future__ import annotations

import time

import pytest

from wsrm_plugin.store import open_store
from wsrm_plugin.store.sql import LATEST_VERSION

from .conftest import KINDS
from .old_schema import old_messages, old_sequence, old_store
from .test_backlog import _queue, _rows_touched

pytestmark = pytest.mark.parametrize("store_url", [KINDS[1], KINDS[2]], indirect=True)


def _indexes(store) -> set[str]:
    with store.begin() as tx:
        if store.url.startswith("sqlite"):
            return {r[0] for r in tx.all("SELECT name FROM sqlite_master WHERE type = 'index' "
                                         "AND tbl_name = 'rms_message'")}
        return {r[0] for r in tx.all("SELECT indexrelid::regclass::text FROM pg_index "
                                     "WHERE indrelid = 'rms_message'::regclass")}


def test_the_message_table_has_no_due_index(open_kind) -> None:
    """An enqueue inserts into the four left (the key, the message id, the unacknowledged ones
    by sequence and due time), the fifth only takes acknowledged requests awaiting replies."""
    store = open_kind()
    key = "sqlite_autoindex_rms_message_1" if store.url.startswith("sqlite") else "rms_message_pkey"
    assert _indexes(store) == {key, "rms_message_msgid", "rms_message_unacked", "rms_message_acked"}


def test_a_version_7_store_loses_the_index_when_upgraded(store_url, monkeypatch) -> None:
    with old_store(store_url(), 7, monkeypatch) as old:
        assert "rms_message_due" in _indexes(old)
        old_sequence(old, "a", "sid-a")
        old_messages(old, "a", 3)
    upgraded = open_store(store_url())
    try:
        assert upgraded.schema_version_found == 7
        assert upgraded.schema_version() == LATEST_VERSION
        assert "rms_message_due" not in _indexes(upgraded)
        with upgraded.begin() as tx:
            assert [m.number for m in tx.rms_messages.due_messages()] == [1, 2, 3]
    finally:
        upgraded.close()


def test_due_messages_oldest_first_across_sequences(open_kind) -> None:
    store = open_kind()
    _queue(store, {"a": 3, "b": 3, "c": 2})
    now = time.time()
    with store.begin() as tx:  # a's due first, then c's, then b's; a sent once waits for its retry
        for key, at in (("a", now - 30), ("b", now - 10), ("c", now - 20)):
            tx.write("UPDATE rms_message SET next_send_at = ? + number "
                     "WHERE seq = (SELECT id FROM rms_sequence WHERE seq_key = ?)", (at, key))
        tx.rms_messages.record_send_attempts("a", [1], next_send_at=now + 60, now=now)
    with store.begin() as tx:
        due = [(m.sequence_key, m.number) for m in tx.rms_messages.due_messages(now, limit=5)]
    assert due == [("a", 2), ("a", 3), ("c", 1), ("c", 2), ("b", 1)]
    with store.begin() as tx:
        assert len(tx.rms_messages.due_messages(now)) == 7


def test_due_messages_reads_no_more_of_a_backlog_than_its_batch(open_kind) -> None:
    """Rows read for a batch of 10 from 3 sequences, one with 3,000 queued: about the batch per
    sequence, not the backlog (the sort of every due message, without an index to read them
    in order, read them all)."""
    store = open_kind()
    _queue(store, {"a": 3000, "b": 5, "c": 5})
    read = _rows_touched(store, lambda tx: tx.rms_messages.due_messages(limit=10))
    assert read < 200, read
