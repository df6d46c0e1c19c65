"""A SQLite store's transaction writes its WAL frames and nothing else.

SQLite keeps a statement's journal (the pages a statement changes, as they
were, to undo that statement alone) in memory up to 64 KiB and in a temporary
file past it, unless temporary storage is in memory.  A transaction of the
sender that acknowledges and purges many messages passes that, and each page
then cost two more writes to a file nobody reads after a crash.  These tests
count the bytes the process writes (``/proc/self/io``) against the WAL's
frames (its index's header, in the mapped ``-shm`` file), not time.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import pytest

from wsrm_plugin.store import open_store

from .test_managers import new_rms

#: a WAL frame: its 24-byte header and a page of the default 4096 bytes
FRAME = 24 + 4096


def _written() -> int:
    """Bytes this process has handed to write(2)/pwrite(2) so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def _frames(db: Path) -> int:
    """The frames in the WAL now (``mxFrame`` of the WAL index's header)."""
    with open(f"{db}-shm", "rb") as f, mmap.mmap(f.fileno(), 48, access=mmap.ACCESS_READ) as shm:
        return struct.unpack_from("=I", shm, 16)[0]


@pytest.fixture
def store(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    yield store
    store.close()


def test_acknowledging_and_purging_many_messages_writes_only_the_wal(store, tmp_path) -> None:
    body = b"<env>" + b"x" * 1000 + b"</env>"
    with store.begin() as tx:
        for k in range(4):
            new_rms(tx, key=f"k{k}")
            tx.rms.update(f"k{k}", sequence_id=f"seq-{k}", started=True, next_control_at=None)
            for i in range(100):
                msg = tx.rms_messages.enqueue(f"k{k}", body, action="urn:op", soap_version="1.1",
                                              message_id=f"urn:{k}:{i}")
                tx.rms_messages.record_send_attempt(f"k{k}", msg.number, next_send_at=1e12)
    db = tmp_path / "store.db"
    frames, before = _frames(db), _written()
    with store.begin() as tx:
        for k in range(4):
            assert len(tx.rms_messages.mark_acked(f"k{k}", [(1, 100)])) == 100
            assert tx.rms_messages.purge_acked(f"k{k}") == 100
    frames = _frames(db) - frames
    written = _written() - before
    assert frames > 16  # past the 64 KiB a statement's journal keeps in memory anyway
    assert written == frames * FRAME, f"{written} bytes written for {frames} WAL frames of {FRAME}"
