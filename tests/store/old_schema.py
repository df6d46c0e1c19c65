"""Stores as an older version of the code left them: opened with the migrations up to a version,
and rows written as that code wrote them (raw SQL: today's statements need today's schema).

Before schema version 10 a message named its sequence by its text key (``rms_message.seq_key``);
from 10 on by the sequence's number (``seq``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from wsrm_plugin.store import open_store


@contextlib.contextmanager
def old_store(url: str, version: int, monkeypatch) -> Iterator:
    """A store at schema ``version`` (migrations after it not applied), closed at the end."""
    from wsrm_plugin.store.sql import schema

    with monkeypatch.context() as old_code:
        old_code.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:version])
        old_code.setattr(schema, "LATEST_VERSION", version)
        store = open_store(url)
        try:
            yield store
        finally:
            store.close()


def old_sequence(store, key: str = "k1", sid: str | None = "seq-1", highest: int = 0) -> None:
    """A source sequence's row as any version wrote it: started when it has a sequence id."""
    t = time.time()
    with store.begin() as tx:
        tx.write("INSERT INTO rms_sequence (seq_key, sequence_id, target, acks_to, rm_version, wsa_version, "
                 "started, highest_number, created_at, last_activity) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (key, sid, "http://peer/svc", "http://anon", "1.1", "2005/08", sid is not None, highest, t, t))


def old_messages(store, key: str = "k1", n: int = 3, *, payload=lambda i: f"<env>{i}</env>".encode(),
                 first: int = 1, send_count: int = 0, acked: bool = False, reply_pending: bool = False) -> None:
    """``n`` messages of sequence ``key`` from number ``first``, due now, keyed by ``seq_key`` (before
    version 10), their payloads in their rows; the sequence's highest number moved to the last."""
    t = time.time()
    with store.begin() as tx:
        for number in range(first, first + n):
            tx.write("INSERT INTO rms_message (seq_key, number, message_id, action, soap_version, payload, "
                     "reply_pending, send_count, next_send_at, last_sent_at, acked, created_at) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (key, number, f"urn:uuid:{key}-{number}", "urn:op", "1.2", payload(number - first),
                      reply_pending, send_count, t + 3600 if send_count else t, t if send_count else None,
                      acked, t))
        tx.write("UPDATE rms_sequence SET highest_number = ? WHERE seq_key = ?", (first + n - 1, key))
