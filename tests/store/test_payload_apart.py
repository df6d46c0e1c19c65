"""A large outgoing message costs its payload's bytes once in the SQLite store, not at every change.

SQLite writes a whole row again at every UPDATE, overflow pages included, so
with the payload in ``rms_message`` each send attempt and acknowledgement of a
1 MiB message wrote 1 MiB more to the WAL (and again at its checkpoint).  These
tests count the bytes the process writes (``/proc/self/io``), not time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from wsrm_plugin.store import open_store
from wsrm_plugin.store.sql.rms import PAYLOAD_APART_AT

from .conftest import KINDS
from .test_managers import new_rms

MIB = 1 << 20


def _written() -> int:
    """Bytes this process has handed to write(2)/pwrite(2) so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


@pytest.fixture
def sqlite_store(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    yield store
    store.close()


def test_send_attempts_and_acknowledgements_leave_a_large_payload_unwritten(sqlite_store) -> None:
    payload = b"<env>" + b"x" * MIB + b"</env>"
    before = _written()
    with sqlite_store.begin() as tx:
        new_rms(tx)
        tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)
        for i in range(3):
            tx.rms_messages.enqueue("k1", payload, action="urn:op", soap_version="1.1", message_id=f"urn:m{i}")
    enqueued = _written() - before
    assert 3 * MIB <= enqueued < 4 * MIB  # each payload once
    before = _written()
    for attempt in range(3):
        with sqlite_store.begin() as tx:
            due = tx.rms_messages.due_messages(limit=10, per_sequence=10)
            assert [m.payload for m in due] == [payload] * 3
            tx.rms_messages.record_send_attempts_across({"k1": [1, 2, 3]}, next_send_at=0.0)
    with sqlite_store.begin() as tx:
        assert tx.rms_messages.mark_acked("k1", [(1, 3)]) == [1, 2, 3]
    changed = _written() - before
    assert changed < MIB // 4, f"{changed} bytes written for 3 attempts and an ack of 3 x 1 MiB"
    before = _written()
    with sqlite_store.begin() as tx:
        assert tx.rms_messages.purge_acked("k1") == 3
        assert tx.one("SELECT COUNT(*) FROM rms_payload")[0] == 0
    purged = _written() - before
    assert purged < MIB // 4, f"{purged} bytes written to purge 3 x 1 MiB (secure_delete=FAST: free pages kept)"


@pytest.mark.parametrize(("query", "zeroed"), [("", 2), ("?secure_delete=1", 1)])
def test_secure_delete_is_a_store_option(tmp_path, query: str, zeroed: int) -> None:
    """SQLite's own secure_delete: FAST by default (2), ON (1) from the URL, as Debian builds it."""
    store = open_store(f"sqlite:///{tmp_path}/store.db{query}")
    try:
        assert store.secure_delete is (zeroed == 1)
        with store.begin() as tx:
            assert tx.one("PRAGMA secure_delete")[0] == zeroed
    finally:
        store.close()


def test_deleting_a_sequence_deletes_its_payloads(sqlite_store) -> None:
    large = b"<env>" + b"x" * PAYLOAD_APART_AT + b"</env>"
    with sqlite_store.begin() as tx:
        new_rms(tx)
        tx.rms_messages.enqueue("k1", large, action="urn:op", soap_version="1.1", message_id="urn:m")
    with sqlite_store.begin() as tx:
        assert tx.one("SELECT COUNT(*) FROM rms_payload")[0] == 1
        assert tx.one("SELECT LENGTH(payload) FROM rms_message")[0] == 0
        tx.rms.delete("k1")
    with sqlite_store.begin() as tx:
        assert tx.one("SELECT COUNT(*) FROM rms_payload")[0] == 0


def test_a_small_payload_stays_in_its_messages_row(sqlite_store) -> None:
    """Below ``PAYLOAD_APART_AT`` the payload fits in the page an update of its row writes anyway:
    no row of its own (an INSERT at the enqueue, a DELETE at the acknowledgement).  Both kinds
    are read, acknowledged and purged alike, side by side in one sequence."""
    small, large = b"<env/>", b"<env>" + b"x" * PAYLOAD_APART_AT + b"</env>"
    with sqlite_store.begin() as tx:
        new_rms(tx)
        tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)
        for i, payload in enumerate((small, large, small, large)):
            tx.rms_messages.enqueue("k1", payload, action="urn:op", soap_version="1.1", message_id=f"urn:m{i}")
    with sqlite_store.begin() as tx:
        assert tx.all("SELECT number, LENGTH(payload) FROM rms_message ORDER BY number") == \
            [(1, len(small)), (2, 0), (3, len(small)), (4, 0)]
        assert tx.all("SELECT number FROM rms_payload ORDER BY number") == [(2,), (4,)]
        assert [m.payload for m in tx.rms_messages.list_for("k1")] == [small, large, small, large]
        tx.rms_messages.record_send_attempts_across({"k1": [1, 2, 3, 4]}, next_send_at=0.0)
    with sqlite_store.begin() as tx:
        assert tx.rms_messages.acknowledge("k1", [(1, 2)]) == ([1, 2], True)
        assert tx.all("SELECT number FROM rms_payload ORDER BY number") == [(4,)]
        assert tx.rms_messages.mark_acked("k1", [(3, 4)]) == [3, 4]
        assert tx.rms_messages.purge_acked("k1") == 2
        assert tx.one("SELECT COUNT(*) FROM rms_message")[0] == 0
        assert tx.one("SELECT COUNT(*) FROM rms_payload")[0] == 0


@pytest.mark.parametrize("store_url", [KINDS[2]], indirect=True)
def test_postgresql_compresses_payloads_with_lz4(store_url) -> None:
    """pglz spent about 9 ms of the backend's CPU per compressible MiB at the enqueue; lz4 a fraction."""
    store = open_store(store_url())
    try:
        with store.begin() as tx:
            rows = tx.all("SELECT attrelid::regclass::text, attcompression FROM pg_attribute "
                          "WHERE attname = 'payload' AND attrelid IN "
                          "('rms_message'::regclass, 'invoker_message'::regclass, 'poison_message'::regclass)")
        assert sorted(rows) == [("invoker_message", "l"), ("poison_message", "l"), ("rms_message", "l")]
    finally:
        store.close()


@pytest.mark.parametrize("store_url", KINDS, indirect=True)
def test_status_counts_messages_without_reading_their_payloads(store_url) -> None:
    """``status()`` (``wsrm status``, every health check) tallies each sequence's messages; it
    used to list them, reading every stored payload."""
    import tracemalloc

    store = open_store(store_url())
    try:
        with store.begin() as tx:
            new_rms(tx)
            for i in range(3):
                tx.rms_messages.enqueue("k1", b"<env>" + b"x" * MIB + b"</env>", action="urn:op",
                                        soap_version="1.1", message_id=f"urn:m{i}")
            tx.rms_messages.record_send_attempts_across({"k1": [1, 2]}, next_send_at=0.0)
            tx.rms_messages.record_send_attempts_across({"k1": [1]}, next_send_at=0.0)
        tracemalloc.start()
        try:
            [seq] = store.status().rms
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert (seq.stored, seq.unacked, seq.retransmissions) == (3, 3, 1)
        assert peak < MIB // 4, f"status() held {peak} bytes"
    finally:
        store.close()
