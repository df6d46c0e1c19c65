"""A sending lane's refill (``claim_first_sends_of``): its sequence read beside callers'
enqueues and its next never-sent messages claimed, on every store; on PostgreSQL in one
statement, where reading the sequence first was a round trip of its own."""

from __future__ import annotations

import pytest

from wsrm_plugin.store import StorageManager

from .test_managers import enqueue, new_rms, started


def _sent(store: StorageManager, key: str = "k1") -> list[tuple[int, int]]:
    with store.begin() as tx:
        return [(m.number, m.send_count) for m in tx.rms_messages.list_for(key)]


def test_a_transmitting_sequences_next_messages_are_claimed(store: StorageManager) -> None:
    started(store, messages=5, sent=False)
    with store.begin(durable=False) as tx:
        seq, msgs = tx.rms_messages.claim_first_sends_of("k1", 3, next_send_at=1e12)
        assert (seq.key, seq.sequence_id, seq.next_number) == ("k1", "seq-1", 6)
        assert [(m.number, m.send_count, m.payload) for m in msgs] == \
            [(1, 0, b"<env>0</env>"), (2, 0, b"<env>1</env>"), (3, 0, b"<env>2</env>")]
        assert tx.rms.get("k1") == seq  # held: the transaction's next look at it
    assert _sent(store) == [(1, 1), (2, 1), (3, 1), (4, 0), (5, 0)]


def test_nothing_is_claimed_of_a_sequence_not_transmitting(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rms(tx)  # not started: no sequence id yet
        enqueue(tx, n=2)
    with store.begin(durable=False) as tx:
        seq, msgs = tx.rms_messages.claim_first_sends_of("k1", 3, next_send_at=1e12)
        assert (seq.key, seq.started, msgs) == ("k1", False, [])
    started(store, key="k2", sid="seq-2", messages=2, sent=False)
    with store.begin() as tx:
        tx.rms.update("k2", faulted=True, fault_reason="test")
    with store.begin(durable=False) as tx:
        seq, msgs = tx.rms_messages.claim_first_sends_of("k2", 3, next_send_at=1e12)
        assert (seq.key, seq.faulted, msgs) == ("k2", True, [])
    assert _sent(store) == [(1, 0), (2, 0)]
    assert _sent(store, "k2") == [(1, 0), (2, 0)]


def test_no_sequence_no_claim(store: StorageManager) -> None:
    with store.begin(durable=False) as tx:
        assert tx.rms_messages.claim_first_sends_of("nope", 3, next_send_at=1e12) == (None, [])


def test_a_sequence_closed_to_enqueues_is_still_claimed_from(store: StorageManager) -> None:
    """Its last message known: no enqueue goes beside it any more, its messages are still sent."""
    started(store, messages=3, sent=False)
    with store.begin() as tx:
        tx.rms.mark_last("k1")
    with store.begin(durable=False) as tx:
        seq, msgs = tx.rms_messages.claim_first_sends_of("k1", 5, next_send_at=1e12)
        assert seq.last_message and [m.number for m in msgs] == [1, 2, 3]
    assert _sent(store) == [(1, 1), (2, 1), (3, 1)]


def test_a_retransmission_due_leaves_the_claim_to_the_round(store: StorageManager) -> None:
    started(store, messages=3, sent=False)
    with store.begin() as tx:
        tx.rms_messages.record_send_attempts("k1", [2], next_send_at=0.0)  # sent, and due again at once
    with store.begin(durable=False) as tx:
        seq, msgs = tx.rms_messages.claim_first_sends_of("k1", 3, next_send_at=1e12)
        assert seq.key == "k1" and msgs == []
    assert _sent(store) == [(1, 0), (2, 1), (3, 0)]


def test_the_claim_passes_over_the_messages_its_lane_knows_acknowledged(store: StorageManager) -> None:
    """A lane's answers acknowledged messages 1 and 2 (the store hears it at its round's end):
    due again in the store, they are passed over (``after``), not taken for a retransmission
    that leaves the claim to the round; a due one past them still is."""
    started(store, messages=6, sent=False)
    with store.begin() as tx:
        tx.rms_messages.record_send_attempts("k1", [1, 2], next_send_at=0.0)  # sent, and due again at once
    with store.begin(durable=False) as tx:
        assert tx.rms_messages.claim_first_sends_of("k1", 3, next_send_at=1e12, after=1)[1] == []
    with store.begin(durable=False) as tx:
        seq, msgs = tx.rms_messages.claim_first_sends_of("k1", 3, next_send_at=1e12, after=2)
        assert seq.key == "k1" and [(m.number, m.send_count) for m in msgs] == [(3, 0), (4, 0), (5, 0)]
    assert _sent(store) == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 0)]
    with store.begin(durable=False) as tx:
        assert [m.number for m in tx.rms_messages.claim_first_sends("k1", 3, next_send_at=1e12, after=5)] == [6]


class _RoundTrips:
    """A transaction's connection that notes every query string sent through it."""

    def __init__(self, conn) -> None:
        self._conn = conn
        self.sent: list[str] = []

    def __getattr__(self, name: str):
        return getattr(self._conn, name)

    def cursor(self, *args, **kwargs):
        return _NotedCursor(self._conn.cursor(*args, **kwargs), self.sent)


class _NotedCursor:
    def __init__(self, cur, sent: list[str]) -> None:
        self._cur = cur
        self._sent = sent

    def __getattr__(self, name: str):
        return getattr(self._cur, name)

    def execute(self, query, params=None):
        self._sent.append(query)
        return self._cur.execute(query, params)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._cur.close()


@pytest.mark.parametrize("store_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
def test_a_refill_is_one_round_trip_on_postgresql(store: StorageManager) -> None:
    """``next_write_commits``: the claim goes without BEGIN, PostgreSQL commits it as its query
    string ends (another session sees it before the commit is asked for), and the commit sends
    nothing: one round trip for the transaction, where BEGIN with the claim and the COMMIT were
    two (and the sequence's read a third)."""
    started(store, messages=5, sent=False)
    tx = store.begin(durable=False)
    tx.conn = noted = _RoundTrips(tx.conn)
    tx.next_write_commits()
    _, msgs = tx.rms_messages.claim_first_sends_of("k1", 3, next_send_at=1e12)
    assert [m.number for m in msgs] == [1, 2, 3]
    assert _sent(store) == [(1, 1), (2, 1), (3, 1), (4, 0), (5, 0)]  # committed already
    tx.commit()
    assert len(noted.sent) == 1 and "BEGIN" not in noted.sent[0], noted.sent
    assert "synchronous_commit TO OFF" in noted.sent[0]  # the transaction's settings go with it


@pytest.mark.parametrize("store_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
def test_what_a_transaction_writes_after_the_write_that_committed_alone_is_its_own(store: StorageManager) -> None:
    """A rollback then undoes what came after that write, not the write."""
    started(store, messages=3, sent=False)
    with pytest.raises(RuntimeError):
        with store.begin(durable=False) as tx:
            tx.next_write_commits()
            tx.rms_messages.claim_first_sends_of("k1", 1, next_send_at=1e12)
            tx.rms_messages.record_send_attempts("k1", [2], next_send_at=1e12)
            raise RuntimeError("undone")
    assert _sent(store) == [(1, 1), (2, 0), (3, 0)]


def test_next_write_commits_leaves_a_savepoint_and_an_enqueue_batch_as_they_were(store: StorageManager) -> None:
    """Only a transaction's first write commits alone: a savepoint needs its BEGIN, and an
    enqueue's number handed out is written with the commit of what follows."""
    started(store, messages=0)
    with store.begin() as tx:
        tx.next_write_commits()
        with pytest.raises(RuntimeError):
            with tx.savepoint():
                enqueue(tx, n=1)
                raise RuntimeError("undone")
        enqueue(tx, n=2)
        enqueue(tx, n=1)
        assert tx.rms.get("k1").next_number == 4
    with store.begin() as tx:
        tx.next_write_commits()
        enqueue(tx, n=1)
        tx.next_write_commits()  # after a write: changes nothing (the next enqueue's number is
        enqueue(tx, n=1)  # written at the commit, with it)
    with pytest.raises(RuntimeError):
        with store.begin() as tx:
            enqueue(tx, n=1)
            tx.next_write_commits()
            enqueue(tx, n=1)
            raise RuntimeError("undone")
    assert [n for n, _ in _sent(store)] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("store_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
@pytest.mark.parametrize("analyzed", [False, True], ids=["stale-statistics", "fresh-statistics"])
def test_a_refill_is_planned_once_a_session_and_reads_about_its_rows_at_a_backlog(
        store: StorageManager, analyzed: bool) -> None:
    """The claim goes after ``SET LOCAL plan_cache_mode TO force_generic_plan`` (``rms._GENERIC_PLAN``):
    PostgreSQL planned it at 0.35-0.53 of the claims, about 0.37 ms each.  Its one generic plan
    must then be safe at a backlog, with the statistics of a busy queue (stale: nearly empty)
    as with fresh ones: both its read and its update go by the primary key.  Before, the
    generic plan read every due message of the sequence (stale) or the whole table (fresh)
    for a claim of 16: about the backlog's 4,000 rows."""
    from .test_backlog import BATCH, LARGE, _plans, _rows_touched, _started_backlog

    _started_backlog(store, analyzed)
    claimed: list[int] = []
    for _ in range(8):  # as a lane's refill claims (retransmission._refill)
        with store.begin(durable=False) as tx:
            tx.next_write_commits()
            _, msgs = tx.rms_messages.claim_first_sends_of("a", 16, next_send_at=1e12)
            claimed.extend(m.number for m in msgs)
    touched = [_rows_touched(store, lambda tx: claimed.extend(
        m.number for m in tx.rms_messages.claim_first_sends_of("a", 16, next_send_at=1e12)[1]))
        for _ in range(4)]
    assert claimed == list(range(BATCH + 1, BATCH + 1 + 12 * 16))  # the first never sent, in order
    plans = _plans(store, "%u AS (UPDATE rms_message SET send_count%")
    assert plans and sum(g for g, _ in plans) >= 10 and sum(c for _, c in plans) == 0, plans
    # the rows passed over (those in flight: 178 to 226) and the claim's own, an index entry
    # and a row each (420-516): not the backlog's (8,037 before, either statistics)
    assert max(touched) < LARGE // 4, touched


@pytest.mark.parametrize("store_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
def test_a_refill_with_nothing_due_leaves_the_sequence_unlocked(store: StorageManager) -> None:
    """A lane refills after each round; when its sequence has nothing due (all sent), the row
    is read, not held ``FOR KEY SHARE``: the lock alone took a transaction id and wrote a
    commit record, 0.03-0.05 a message (XA in one database, 16 callers), and held nothing a
    claim needs.  A row lock sets the row's ``xmax``: it stays as it was."""

    def xmax() -> str:
        with store.begin() as tx:
            return tx.one("SELECT xmax::text FROM rms_sequence WHERE seq_key = ?", ("k1",))[0]

    started(store, messages=2)  # both sent once, due again only at 1e12
    before = xmax()
    with store.begin(durable=False) as tx:
        tx.next_write_commits()
        seq, msgs = tx.rms_messages.claim_first_sends_of("k1", 3, next_send_at=1e12)
    assert (seq.key, seq.sequence_id, msgs) == ("k1", "seq-1", [])
    assert xmax() == before
    with store.begin() as tx:
        enqueue(tx, n=1)  # 3, never sent: claimed, the row held as before
    with store.begin(durable=False) as tx:
        seq, msgs = tx.rms_messages.claim_first_sends_of("k1", 3, next_send_at=1e12)
        assert [m.number for m in msgs] == [3] and tx.rms.get("k1") == seq
    assert xmax() != before


@pytest.mark.parametrize("store_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
def test_a_refill_with_a_retransmission_due_first_leaves_the_sequence_unlocked(store: StorageManager) -> None:
    """The claim leaves a sequence whose first due message was sent already to the round (above);
    its row is then read, not held: the lock alone was a commit record, 0.05-0.08 a message (XA
    in one database, 16 callers under load: the first sends' retries came due while their
    acknowledgements were still to come)."""

    def xmax() -> str:
        with store.begin() as tx:
            return tx.one("SELECT xmax::text FROM rms_sequence WHERE seq_key = ?", ("k1",))[0]

    started(store, messages=3, sent=False)
    with store.begin() as tx:
        tx.rms_messages.record_send_attempts("k1", [1], next_send_at=0.0)  # sent, and due again at once
    before = xmax()
    with store.begin(durable=False) as tx:
        tx.next_write_commits()
        seq, msgs = tx.rms_messages.claim_first_sends_of("k1", 3, next_send_at=1e12)
    assert (seq.key, msgs) == ("k1", [])
    assert xmax() == before
    assert _sent(store) == [(1, 1), (2, 0), (3, 0)]
