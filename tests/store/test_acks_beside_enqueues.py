"""On PostgreSQL a caller's enqueue, the sender's claim and an acknowledgement of one sequence do
not wait for each other; whatever changes the sequence's state still waits for all of them.

The enqueue takes its number with an UPDATE of the sequence's row, held until the caller's
transaction commits (under XA, after its PREPARE or its one-phase commit); the claim and an
acknowledgement of a sequence still open to enqueues hold the row ``FOR KEY SHARE``, which
that UPDATE does not wait for.  Close, terminate, fault and delete lock the row ``FOR UPDATE``
and wait for all three.  Each test opens one transaction and then another on a store whose
``lock_timeout`` is short: a wait that should not happen ends in ``LockTimeoutError`` (the test
fails), a wait that should happen is asserted by that error.
"""

from __future__ import annotations

import pytest

from wsrm_plugin.store import LockTimeoutError, StorageManager, open_store

from .test_managers import enqueue, started
from .test_statements import statements

pytestmark = pytest.mark.postgres

WAIT = 0.5  # seconds before a lock wait gives up: only the tests that expect the wait wait it


@pytest.fixture
def store(fresh_db):
    opened = open_store(fresh_db if fresh_db.startswith("postgresql") else "postgresql:" + fresh_db,
                        lock_timeout=WAIT)
    yield opened
    opened.close()


def _claim(store: StorageManager) -> dict[int, int]:
    """A sender's claim, as the sender makes it: number -> send count, left open."""
    tx = store.begin(durable=False)
    due = tx.rms_messages.due_messages(limit=50, per_sequence=50)
    return tx, {m.number: m.send_count for m in due}


def test_an_acknowledgement_and_a_callers_enqueue_do_not_wait_for_each_other(store) -> None:
    started(store, messages=3)
    caller = store.begin()
    [msg] = enqueue(caller, n=1)  # the caller's transaction holds the sequence's number
    assert msg.number == 4
    with store.begin(durable=False) as ack:
        seq = ack.rms.get_by_sequence_id("seq-1", beside_enqueues=True)
        assert ack.rms_messages.acknowledge(seq.key, [(1, 2)]) == ([1, 2], True)
    caller.commit()
    # and the other way round: an acknowledgement's transaction open, a caller enqueues
    ack = store.begin(durable=False)
    seq = ack.rms.get_by_sequence_id("seq-1", beside_enqueues=True)
    assert ack.rms_messages.acknowledge(seq.key, [(3, 3)]) == ([3], True)
    with store.begin() as caller:
        assert [m.number for m in enqueue(caller, n=1)] == [5]
    ack.commit()
    with store.begin() as tx:
        assert [m.number for m in tx.rms_messages.list_for("k1")] == [4, 5]
        assert tx.rms.get("k1").next_number == 6


def test_a_senders_claim_and_a_callers_enqueue_do_not_wait_for_each_other(store) -> None:
    started(store, messages=0)
    with store.begin() as tx:
        enqueue(tx, n=2)  # due, never sent
    caller = store.begin()
    enqueue(caller, n=1)
    claim, claimed = _claim(store)  # the caller's open transaction does not hide the sequence
    assert claimed == {1: 0, 2: 0}
    claim.rms_messages.record_send_attempts_across({"k1": [1, 2]}, next_send_at=1e12)
    with store.begin() as other:  # another caller's enqueue goes on beside the open claim
        caller.commit()
        assert [m.number for m in enqueue(other, n=1)] == [4]
    claim.commit()
    with store.begin() as tx:
        assert [(m.number, m.send_count) for m in tx.rms_messages.list_for("k1")] == \
            [(1, 1), (2, 1), (3, 0), (4, 0)]


def test_a_lanes_claim_of_its_sequences_next_messages_goes_on_beside_a_callers_enqueue(store) -> None:
    """What a sending lane done before its round's others does (``claim_first_sends``), after
    reading its sequence as the sender does (``get(beside_enqueues=True)``)."""
    started(store, messages=0)
    with store.begin() as tx:
        enqueue(tx, n=2)
    caller = store.begin()
    enqueue(caller, n=1)
    with store.begin(durable=False) as lane:
        assert lane.rms.get("k1", beside_enqueues=True).next_number == 3  # the caller's number not seen
        assert [m.number for m in lane.rms_messages.claim_first_sends("k1", 5, next_send_at=1e12)] == [1, 2]
    caller.commit()
    with store.begin() as tx:
        assert [(m.number, m.send_count) for m in tx.rms_messages.list_for("k1")] == [(1, 1), (2, 1), (3, 0)]


def test_a_lanes_refill_in_one_statement_goes_on_beside_a_callers_enqueue(store) -> None:
    """``claim_first_sends_of``: the sequence read in the claim's statement, ``FOR KEY SHARE``
    as ``get(beside_enqueues=True)`` reads it; a close waits for it until it ends."""
    started(store, messages=0)
    with store.begin() as tx:
        enqueue(tx, n=2)
    caller = store.begin()
    enqueue(caller, n=1)
    lane = store.begin(durable=False)
    seq, msgs = lane.rms_messages.claim_first_sends_of("k1", 5, next_send_at=1e12)
    assert seq.next_number == 3 and [m.number for m in msgs] == [1, 2]  # the caller's number not seen
    caller.commit()
    with pytest.raises(LockTimeoutError):
        with store.begin() as closing:
            closing.rms.mark_last("k1")
    lane.commit()
    with store.begin() as tx:
        assert [(m.number, m.send_count) for m in tx.rms_messages.list_for("k1")] == [(1, 1), (2, 1), (3, 0)]
        assert tx.rms.mark_last("k1").last_message


def test_a_close_waits_for_an_open_acknowledgement_and_claim(store) -> None:
    started(store, messages=3)
    ack = store.begin(durable=False)
    seq = ack.rms.get_by_sequence_id("seq-1", beside_enqueues=True)
    ack.rms_messages.acknowledge(seq.key, [(1, 1)])
    with pytest.raises(LockTimeoutError):
        with store.begin() as closing:
            closing.rms.mark_last("k1")
    ack.commit()
    claim, claimed = _claim(store)
    assert claimed == {}  # sent once each, not due before 1e12
    claim.rms_messages.due_messages(now=2e12, limit=50, per_sequence=50)  # now they are: held
    with pytest.raises(LockTimeoutError):
        with store.begin() as closing:
            closing.rms.update("k1", closed=True)
    claim.commit()
    with store.begin() as closing:
        assert closing.rms.mark_last("k1").last_message


def test_an_acknowledgement_of_a_sequence_closed_to_enqueues_locks_it_against_every_writer(store) -> None:
    """Its last message known, an acknowledgement may owe the Close or Terminate: one at a time,
    as any change of the sequence's state."""
    started(store, messages=3)
    with store.begin() as tx:
        tx.rms.mark_last("k1")
    first = store.begin(durable=False)
    seq = first.rms.get_by_sequence_id("seq-1", beside_enqueues=True)
    assert seq.last_message
    first.rms_messages.acknowledge(seq.key, [(1, 3)])
    with pytest.raises(LockTimeoutError):
        with store.begin(durable=False) as second:
            second.rms.get_by_sequence_id("seq-1", beside_enqueues=True)
    first.rms.update("k1", next_control_at=1.0)  # what the engine does when it owes the Close
    first.commit()
    with store.begin() as tx:
        assert tx.rms.get("k1").next_control_at == 1.0


def test_an_acknowledgement_writes_the_sequence_row_once_a_second_at_most(store) -> None:
    """``last_activity`` to a second (ACTIVITY_GRAIN): the row is otherwise left alone, so that
    the acknowledgement holds nothing a caller's enqueue waits for."""
    from wsrm_plugin.store.sql.rms import ACTIVITY_GRAIN

    started(store, messages=4)
    with store.begin() as tx:
        t = tx.rms.peek("k1").last_activity + 10 * ACTIVITY_GRAIN
    stamps = []
    for number, now in ((1, t), (2, t + ACTIVITY_GRAIN / 2), (3, t + 2 * ACTIVITY_GRAIN)):
        with store.begin(durable=False) as tx:
            seq = tx.rms.get_by_sequence_id("seq-1", beside_enqueues=True)
            seen = statements(tx)
            tx.rms_messages.acknowledge(seq.key, [(1, number)], now=now)
            assert len(seen) == 1, seen
        with store.begin() as tx:
            stamps.append(tx.rms.peek("k1").last_activity)
    assert stamps == [t, t, t + 2 * ACTIVITY_GRAIN]


def test_retransmitted_messages_acknowledged_beside_a_caller_are_counted_by_the_next_acknowledgement(store) -> None:
    """The row's count of purged retransmissions needs the row: while a caller holds it, the
    retransmitted messages acknowledged are only marked; the next acknowledgement that gets the
    row purges and counts them (nothing waits, nothing is lost from the count)."""
    started(store, messages=3)
    with store.begin() as tx:
        tx.rms_messages.record_send_attempt("k1", 1, next_send_at=1e12)  # sent twice
    caller = store.begin()
    enqueue(caller, n=1)
    with store.begin(durable=False) as ack:
        seq = ack.rms.get_by_sequence_id("seq-1", beside_enqueues=True)
        assert ack.rms_messages.acknowledge(seq.key, [(1, 3)]) == ([1, 2, 3], False)
    caller.commit()
    with store.begin() as tx:
        assert [(m.number, m.acked, m.send_count) for m in tx.rms_messages.list_for("k1")] == \
            [(1, True, 2), (4, False, 0)]
        assert tx.rms_messages.tally("k1") == (2, 1, 1)
        tx.rms_messages.record_send_attempt("k1", 4, next_send_at=1e12)
    with store.begin(durable=False) as ack:
        seq = ack.rms.get_by_sequence_id("seq-1", beside_enqueues=True)
        assert ack.rms_messages.acknowledge(seq.key, [(1, 4)]) == ([4], False)
    with store.begin() as tx:
        assert tx.rms_messages.list_for("k1") == []
        assert tx.rms.get("k1").purged_retransmissions == 1


def test_an_acknowledgement_that_waited_for_its_sequence_sees_what_the_holder_committed(fresh_db) -> None:
    """An acknowledgement riding on a request names its sequence by the peer's identifier; on
    PostgreSQL one statement locks the row and acknowledges (``acknowledge_sequence``).  When the
    row is held, that statement waits; its reads are as of before the wait.  Should the holder
    have changed the sequence (here: a message enqueued and sent), the acknowledgement must
    still count it: it is applied again under the lock, not from what the statement read."""
    import threading

    import psycopg2

    url = fresh_db if fresh_db.startswith("postgresql") else "postgresql:" + fresh_db
    store = open_store(url)
    try:
        started(store, messages=3)
        holder = store.begin()
        [msg] = enqueue(holder, n=1)
        holder.rms_messages.record_send_attempt("k1", msg.number, next_send_at=1e12)
        found: list = []

        def acknowledge() -> None:
            with store.begin(durable=False) as tx:
                found.append(tx.rms_messages.acknowledge_sequence("seq-1", [(1, 3)]))
        thread = threading.Thread(target=acknowledge)
        thread.start()
        watch = psycopg2.connect(url.removeprefix("postgresql:"))
        try:
            watch.autocommit = True
            with watch.cursor() as cur:
                for _ in range(6000):  # until the acknowledgement waits for the holder's lock (60 s at most)
                    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                "AND wait_event_type = 'Lock'")
                    if cur.fetchone()[0]:
                        break
                    thread.join(0.01)
                else:
                    pytest.fail("the acknowledgement never waited for the sequence's row")
        finally:
            watch.close()
        holder.commit()
        thread.join(60)
        assert not thread.is_alive()
        [(seq, done)] = found
        assert seq.next_number == 5
        assert done == ([1, 2, 3], True)  # message 4, sent by the holder, still unacknowledged
        with store.begin() as tx:
            assert [(m.number, m.acked) for m in tx.rms_messages.list_for("k1")] == [(4, False)]
    finally:
        store.close()


def test_an_acknowledgement_alone_is_one_round_trip_beside_a_callers_enqueue(store) -> None:
    """The sender's acknowledgement transaction (``acknowledge_sequence(beside_enqueues=True,
    alone=True)``): the row held ``FOR KEY SHARE`` and the acknowledgement written in one query
    string without BEGIN, which PostgreSQL commits as it ends (another session sees it before the
    commit is asked for), and the commit sends nothing.  Three round trips before (BEGIN with the
    row's read, the acknowledgement, COMMIT).  A caller's open enqueue is not waited for."""
    from .test_refill_claim import _RoundTrips

    started(store, messages=3)
    caller = store.begin()
    [msg] = enqueue(caller, n=1)  # the caller's transaction holds the sequence's number
    tx = store.begin(durable=False)
    tx.conn = noted = _RoundTrips(tx.conn)
    seq, done = tx.rms_messages.acknowledge_sequence("seq-1", [(1, 2)], beside_enqueues=True, alone=True)
    assert (seq.key, seq.next_number, done) == ("k1", 4, ([1, 2], True))  # the caller's number not seen
    with store.begin() as other:  # committed already
        assert [m.number for m in other.rms_messages.list_for("k1")] == [3]
    tx.commit()
    assert len(noted.sent) == 1 and "BEGIN" not in noted.sent[0] and "FOR KEY SHARE" in noted.sent[0], noted.sent
    caller.commit()
    with store.begin() as tx:
        assert [m.number for m in tx.rms_messages.list_for("k1")] == [3, msg.number]


def test_an_acknowledgement_alone_of_a_sequence_closed_to_enqueues_locks_it_against_every_writer(store) -> None:
    """Its last message known, the acknowledgement may owe the Close or Terminate: the one round
    trip leaves it alone (nothing held nor written), and it is locked and applied as without
    ``beside_enqueues``, in a transaction the commit ends (the Close's schedule goes with it)."""
    started(store, messages=3)
    with store.begin() as tx:
        tx.rms.mark_last("k1")
    first = store.begin(durable=False)
    seq, done = first.rms_messages.acknowledge_sequence("seq-1", [(1, 3)], beside_enqueues=True, alone=True)
    assert seq.last_message and done == ([1, 2, 3], False)
    with pytest.raises(LockTimeoutError):
        with store.begin(durable=False) as second:
            second.rms.get_by_sequence_id("seq-1", beside_enqueues=True)
    first.rms.update("k1", next_control_at=1.0)  # what the engine does when it owes the Close
    first.commit()
    with store.begin() as tx:
        assert tx.rms.get("k1").next_control_at == 1.0 and tx.rms_messages.list_for("k1") == []


def test_an_acknowledgement_alone_refused_or_unknown_writes_nothing(store) -> None:
    from wsrm_plugin.store import InvalidAcknowledgementError

    started(store, messages=2)
    with store.begin() as tx:
        enqueue(tx, n=1)  # number 3: never sent
    with pytest.raises(InvalidAcknowledgementError):
        with store.begin(durable=False) as tx:
            tx.rms_messages.acknowledge_sequence("seq-1", [(1, 3)], beside_enqueues=True, alone=True)
    with store.begin(durable=False) as tx:
        assert tx.rms_messages.acknowledge_sequence("nope", [(1, 1)], beside_enqueues=True, alone=True) is None
    with store.begin() as tx:
        assert [(m.number, m.acked) for m in tx.rms_messages.list_for("k1")] == [(1, False), (2, False), (3, False)]


@pytest.mark.parametrize("analyzed", [False, True], ids=["stale-statistics", "fresh-statistics"])
def test_an_acknowledgement_alone_is_planned_once_a_session_and_reads_about_its_rows_at_a_backlog(
        store, analyzed: bool) -> None:
    """Its query string goes after ``SET LOCAL plan_cache_mode TO force_generic_plan``
    (``rms._PLANNED_ONCE``): left to choose, PostgreSQL made a custom plan of the acknowledgement
    at 0.20-0.33 of the calls at 16 sequences.  Its generic plan must then be safe at a backlog,
    with the statistics of a busy queue (stale: nearly empty) as with fresh ones: a cumulative
    acknowledgement of what was sent touches about the rows it purges and the ones still in
    flight, not the 4,000 queued behind them."""
    from .test_backlog import BATCH, LARGE, _plans, _rows_touched, _started_backlog

    _started_backlog(store, analyzed)
    upto = BATCH
    for _ in range(8):  # as the sender applies the acknowledgements of its sends
        with store.begin() as tx:
            tx.rms_messages.record_send_attempts("a", range(upto + 1, upto + 17), next_send_at=1e12)
        upto += 16
        with store.begin(durable=False) as tx:
            seq, done = tx.rms_messages.acknowledge_sequence("sid-a", [(1, upto - 8)], beside_enqueues=True,
                                                             alone=True)
            assert done is not None and done[0][-1] == upto - 8 and done[1]
    plans = _plans(store, "%g AS (SELECT id, offered_id IS NOT NULL%")
    assert plans and sum(g for g, _ in plans) >= 3 and sum(c for _, c in plans) == 0, plans

    def generic_ack(tx) -> None:  # the same statement, planned as the query string above plans it
        tx.execute("SET LOCAL plan_cache_mode TO force_generic_plan").close()
        tx.rms_messages.acknowledge_sequence("sid-a", [(1, upto + 8)], beside_enqueues=True)

    with store.begin() as tx:
        tx.rms_messages.record_send_attempts("a", range(upto + 1, upto + 17), next_send_at=1e12)
    touched = _rows_touched(store, generic_ack)
    with store.begin() as tx:
        assert [m.number for m in tx.rms_messages.list_for("a")][:2] == [upto + 9, upto + 10]
    # the 16 purged and the 16 in flight after them, each an index entry and a row, read by the
    # statement's parts: 194 either way (custom plans too), not the backlog's 4,000
    assert touched < LARGE // 10, touched


def test_an_acknowledgement_of_a_sequence_behind_a_backlog_reads_about_its_own_rows(store) -> None:
    """Whether a message stays unacknowledged after the acknowledgement was an EXISTS that
    PostgreSQL planned, with the fresh statistics of a backlog, as a sequential scan stopping at
    the first row of the sequence outside the ranges: through every row that lies before the
    sequence's in the table (one such scan a batch while 100,000 queued messages drained, about
    50 rows each: the acknowledged ones; here another sequence's backlog), planned as the
    acknowledgement alone is (generic).  It now asks for the least such number, from the primary
    key."""
    from .test_backlog import LARGE, SMALL, _queue, _rows_touched

    def generic_ack(key: str):
        def ack(tx) -> None:
            tx.execute("SET LOCAL plan_cache_mode TO force_generic_plan").close()
            seq, done = tx.rms_messages.acknowledge_sequence(f"sid-{key}", [(1, 2)], beside_enqueues=True)
            assert done == ([1, 2], True)
        return ack

    costs = []
    for queued in (SMALL, LARGE):
        big, small = f"big{queued}", f"a{queued}"
        _queue(store, {big: queued, small: 5})  # the backlog's rows first in the table
        with store.begin() as tx:
            tx.rms.update(small, started=True)
            tx.rms_messages.record_send_attempts(small, range(1, 6), next_send_at=1e12)
        with store.begin() as tx:
            tx.execute("ANALYZE rms_message").close()
        costs.append(_rows_touched(store, generic_ack(small)))
        with store.begin() as tx:
            tx.rms.delete(big)
            tx.rms.delete(small)
    assert costs[1] <= 2 * costs[0] + 30, f"{costs[0]} rows behind {SMALL} queued, {costs[1]} behind {LARGE}"
