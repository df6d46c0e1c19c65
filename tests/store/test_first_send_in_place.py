"""A message's first send changes no indexed column (issue 33, schema version 7).

Under 16 sequences in XA the first send's UPDATE of each message moved ``next_send_at``, which
two indexes hold: PostgreSQL wrote the row again elsewhere plus an entry in each of the table's
four indexes (about 0.8 kB of WAL a message).  The first send now writes when the message is
due again into ``retry_at`` instead.  These tests check that PostgreSQL updates such a row in
place (HOT, counted by its statistics in the transaction), and on every store that a message
is due exactly when it was before: a message sent once waits for its retry time, a later send
or a make-due moves it, and a store written before version 7 keeps its schedule.
"""

from __future__ import annotations

import time

import pytest

from wsrm_plugin.store import open_store
from wsrm_plugin.store.sql import LATEST_VERSION
from wsrm_plugin.store.sql.schema import RMS_MESSAGE_FILLFACTOR

from .conftest import KINDS
from .old_schema import old_messages, old_sequence, old_store
from .test_managers import enqueue, new_rms

SQL_KINDS = [KINDS[1], KINDS[2]]


def _started(store, n: int) -> None:
    with store.begin() as tx:
        new_rms(tx)
        tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)
        enqueue(tx, n=n)


def _due(store, now: float) -> list[int]:
    with store.begin() as tx:
        # sorted: a store may rank a message sent once by its first due time or by its retry time
        return sorted(m.number for m in tx.rms_messages.due_messages(now, limit=50, per_sequence=50))


def _counts(tx) -> tuple[int, int]:
    return tuple(tx.one("SELECT pg_stat_get_xact_tuples_updated(c.oid), pg_stat_get_xact_tuples_hot_updated(c.oid) "
                        "FROM pg_class c WHERE c.oid = 'rms_message'::regclass"))


def _updates(store, work) -> tuple[int, int]:
    """Rows of ``rms_message`` that ``work(tx)`` updated in one transaction, and of those how many
    in place (HOT).  The backend reports its counts when idle: read inside the transaction,
    opened by a statement that locks."""
    with store.begin() as tx:
        tx.one("SELECT seq_key FROM rms_sequence WHERE seq_key = ? FOR UPDATE", ("none",))
        before = _counts(tx)
        work(tx)
        after = _counts(tx)
    return after[0] - before[0], after[1] - before[1]


@pytest.mark.parametrize("store_url", [KINDS[2]], indirect=True)
def test_postgresql_updates_a_first_send_in_place(open_kind) -> None:
    """Each way the engine records a first send (the sender's round, a lane's follow-on claim, a
    waiting caller's own claim) is a HOT update; a retransmission moves the indexed time."""
    store = open_kind()
    _started(store, 9)
    now = time.time()

    def first_sends(tx) -> None:
        claimed = tx.rms_messages.due_messages(now, limit=3, per_sequence=3)
        assert [m.number for m in claimed] == [1, 2, 3]
        tx.rms_messages.record_send_attempts_across({"k1": [1, 2, 3]}, next_send_at=now + 60, now=now)
        assert [m.number for m in tx.rms_messages.claim_first_sends("k1", 3, next_send_at=now + 60, now=now)] \
            == [4, 5, 6]
        tx.rms_messages.record_send_attempts("k1", [7], next_send_at=now + 60, now=now)
    assert _updates(store, first_sends) == (7, 7)
    # retransmissions: the indexed time moves
    assert _updates(store, lambda tx: tx.rms_messages.record_send_attempts(
        "k1", [1, 2, 3], next_send_at=now + 120, now=now + 60)) == (3, 0)
    with store.begin() as tx:
        tx.rms_messages.mark_acked("k1", [(1, 7)])
    # a waiting caller's claim of its own request
    assert _updates(store, lambda tx: tx.rms_messages.claim_first_send(
        "k1", 8, next_send_at=now + 60, now=now)) == (1, 1)
    with store.begin() as tx:
        assert tx.rms_messages.get("k1", 8).send_count == 1


@pytest.mark.parametrize("size", [1000, 1900])
@pytest.mark.parametrize("store_url", [KINDS[2]], indirect=True)
def test_postgresql_claims_many_messages_in_place_in_one_transaction(open_kind, size) -> None:
    """A lane's refill claims 16 messages in one transaction, and every one of them is a HOT
    update however many of the claimed rows share a page (schema version 9: pages half filled by
    inserts).  Envelopes of 1 kB and 1.9 kB (a row just under TOAST's threshold) are stored
    inline.  At fillfactor 70 a page of 1 kB rows kept room for fewer new versions than it had
    rows, and the rest were written again on another page: 7 of 16 in place (fails without)."""
    store = open_kind()
    with store.begin() as tx:
        new_rms(tx)
        tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)
        for i in range(16):
            payload = (b"<env>%05d</env>" % i).ljust(size, b"x")
            tx.rms_messages.enqueue("k1", payload, action="urn:op", soap_version="1.2",
                                    message_id=f"urn:uuid:k1-{i}-{size}")
    now = time.time()
    claimed: list[int] = []
    assert _updates(store, lambda tx: claimed.extend(
        m.number for m in tx.rms_messages.claim_first_sends("k1", 16, next_send_at=now + 60, now=now))) \
        == (16, 16)
    assert claimed == list(range(1, 17))


@pytest.mark.parametrize("store_url", KINDS, indirect=True)
def test_a_message_sent_once_is_due_at_its_retry_time_and_a_later_send_moves_it(open_kind) -> None:
    store = open_kind()
    _started(store, 3)
    now = time.time() + 1
    assert _due(store, now) == [1, 2, 3]
    with store.begin() as tx:
        tx.rms_messages.record_send_attempts("k1", [1, 2], next_send_at=now + 10, now=now)
    assert _due(store, now) == [3]
    assert _due(store, now + 9.9) == [3]
    assert _due(store, now + 10) == [1, 2, 3]
    with store.begin() as tx:
        assert tx.rms_messages.get("k1", 1).next_send_at == now + 10
        # a retransmission of 1, due again later; 2 made due at once (a Nack)
        tx.rms_messages.record_send_attempts("k1", [1], next_send_at=now + 30, now=now + 10)
        tx.rms_messages.make_due("k1", [2], at=now)
    with store.begin() as tx:
        one, two = tx.rms_messages.get("k1", 1), tx.rms_messages.get("k1", 2)
    assert (one.send_count, one.next_send_at) == (2, now + 30)
    assert (two.send_count, two.next_send_at) == (1, now)
    assert _due(store, now) == [2, 3]
    assert _due(store, now + 29) == [2, 3]
    assert _due(store, now + 30) == [1, 2, 3]
    with store.begin() as tx:  # a single attempt (a probe, a reply sent in its HTTP response)
        tx.rms_messages.record_send_attempt("k1", 3, next_send_at=now + 50, now=now)
    assert _due(store, now + 49) == [1, 2]
    with store.begin() as tx:
        assert tx.rms_messages.get("k1", 3).next_send_at == now + 50


@pytest.mark.parametrize("store_url", SQL_KINDS, indirect=True)
def test_a_version_6_store_keeps_its_schedule_when_upgraded(store_url, monkeypatch) -> None:
    """Messages the old code sent once (their ``next_send_at`` moved) stay not due until then."""
    with old_store(store_url(), 6, monkeypatch) as old:
        old_sequence(old)
        old_messages(old, n=2)
        now = time.time() + 1
        with old.begin() as tx:  # what the old code's first send wrote
            tx.write("UPDATE rms_message SET send_count = 1, last_sent_at = ?, next_send_at = ? "
                     "WHERE seq_key = 'k1' AND number = 1", (now, now + 10))
    upgraded = open_store(store_url())
    try:
        assert upgraded.schema_version_found == 6
        assert upgraded.schema_version() == LATEST_VERSION
        assert _due(upgraded, now) == [2]
        assert _due(upgraded, now + 10) == [1, 2]
        with upgraded.begin() as tx:
            if store_url().startswith("postgresql"):  # room on the page for the first send's version
                assert f"fillfactor={RMS_MESSAGE_FILLFACTOR}" in tx.one("SELECT reloptions FROM pg_class WHERE relname = 'rms_message'")[0]
            assert tx.rms_messages.get("k1", 1).next_send_at == now + 10
            tx.rms_messages.record_send_attempts("k1", [2], next_send_at=now + 20, now=now)
        assert _due(upgraded, now + 10) == [1]
    finally:
        upgraded.close()


@pytest.mark.parametrize("store_url", [KINDS[2]], indirect=True)
def test_postgresql_prepares_the_statement_that_records_sends(open_kind) -> None:
    """Its ``retry_at`` value is a CASE's only value: without a CAST PostgreSQL took it for text,
    refused to PREPARE the statement, and it was planned again at every send."""
    store = open_kind(pool_size=1)
    _started(store, 6)
    now = time.time()
    for first in (1, 3, 5):
        with store.begin() as tx:  # the pool gives the same session back
            tx.rms_messages.record_send_attempts("k1", [first, first + 1], next_send_at=now + 60, now=now)
            with tx.conn.cursor() as cur:
                cur.execute("SELECT statement FROM pg_prepared_statements")
                prepared = [row[0] for row in cur.fetchall()]
    assert any("UPDATE rms_message SET send_count" in text for text in prepared), prepared
    with store.begin() as tx:
        assert [tx.rms_messages.get("k1", n).next_send_at for n in (1, 6)] == [now + 60, now + 60]
