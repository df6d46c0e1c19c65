"""What the SQL stores send to the database on the hot paths: each sequence row read once per
transaction, a batch of deliveries reading its messages ahead, a sender's round counted in one
statement per sequence.  Counted on the transaction's own ``execute`` (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from wsrm_plugin.store import StorageManager

from .conftest import KINDS
from .test_managers import awaiting_requests, enqueue, new_rmd, new_rms, put, started

pytestmark = pytest.mark.parametrize("store_url", KINDS[1:], indirect=True)


def statements(tx) -> list[str]:
    """Every statement ``tx`` executes from now on, appended to the returned list."""
    seen: list[str] = []
    execute = tx.execute

    def counting(sql, params=(), **kw):
        seen.append(" ".join(sql.split()))
        return execute(sql, params, **kw)

    tx.execute = counting
    return seen


def count(seen: list[str], prefix: str) -> int:
    return sum(1 for s in seen if s.startswith(prefix))


def test_a_receive_reads_its_destination_sequence_once(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rmd(tx)
    with store.begin() as tx:
        seen = statements(tx)
        tx.rmd.get("s1")
        tx.rmd.record_received("s1", 1)
        tx.rmd.request_ack("s1", due_at=5.0)
        assert tx.rmd.get("s1").ack_due_at == 5.0
    reads = [s for s in seen if s.startswith("SELECT") and "FROM rmd_sequence" in s]
    assert len(reads) == 1, seen


def test_an_enqueue_batch_writes_its_source_sequence_twice_and_never_reads_it(store: StorageManager) -> None:
    """Two row versions per batch: one per message would stay alive until the commit, and every
    later lookup of the row in the transaction would walk them all (quadratic partitions).  The
    first enqueue locks the row and takes its number in one UPDATE ... RETURNING; the others
    only remember theirs, written by one UPDATE before the commit."""
    with store.begin() as tx:
        new_rms(tx)
    with store.begin() as tx:
        seen = statements(tx)
        numbers = [m.number for m in enqueue(tx, n=20)]
    assert numbers == list(range(1, 21))
    assert not [s for s in seen if s.startswith("SELECT") and "FROM rms_sequence" in s], seen
    if store.url.startswith("postgresql"):  # the first enqueue's UPDATE and INSERT are one statement
        assert count(seen, "WITH s AS (UPDATE rms_sequence") == 1, seen
        assert count(seen, "INSERT INTO rms_message") == 19
        assert count(seen, "UPDATE rms_sequence") == 1, seen
    else:
        assert count(seen, "INSERT INTO rms_message") == 20
        assert count(seen, "UPDATE rms_sequence") == 2, seen
    with store.begin() as tx:
        assert tx.rms.get("k1").next_number == 21


def test_a_statement_on_the_sequences_sees_the_numbers_handed_out(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rms(tx)
    with store.begin() as tx:
        enqueue(tx, n=3)
        [listed] = tx.rms.list_all()  # SQL of its own, not the remembered row
        assert listed.next_number == 4
        with pytest.raises(RuntimeError):
            with tx.savepoint():
                enqueue(tx, n=2)
                assert tx.rms.list_all()[0].next_number == 6
                raise RuntimeError("undone")
        assert tx.rms.list_all()[0].next_number == 4
        enqueue(tx, n=1, last=True)
    with store.begin() as tx:
        seq = tx.rms.get("k1")
    assert (seq.next_number, seq.last_message, seq.last_number) == (5, True, 4)


def test_a_batch_of_deliveries_reads_its_messages_ahead(store: StorageManager) -> None:
    with store.begin() as tx:
        for n in range(1, 31):
            put(tx, "in", n)
    with store.begin() as tx:
        seen = statements(tx)
        msg = tx.invoker.claim_next()
        delivered = []
        while msg is not None:
            delivered.append(msg.number)
            tx.invoker.mark_delivered("in", msg.number)
            msg = tx.invoker.next_deliverable("in")
    assert delivered == list(range(1, 31))
    # the claim's own row, then the rest in one read (and one more that finds the buffer empty)
    assert len([s for s in seen if s.startswith("SELECT") and "FROM invoker_message" in s]) <= 4, seen


def test_a_message_put_after_the_read_ahead_is_still_delivered(store: StorageManager) -> None:
    with store.begin() as tx:
        for n in (1, 2):
            put(tx, "in", n)
    with store.begin() as tx:
        assert tx.invoker.claim_next().number == 1
        tx.invoker.mark_delivered("in", 1)
        assert tx.invoker.next_deliverable("in").number == 2  # read ahead: only 2 was there
        tx.invoker.mark_delivered("in", 2)
        put(tx, "in", 3)  # (a receive in another transaction, in production)
        assert tx.invoker.next_deliverable("in").number == 3


def test_a_senders_round_is_counted_in_one_statement_per_sequence(store: StorageManager) -> None:
    started(store, messages=40, sent=False)
    with store.begin() as tx:
        seen = statements(tx)
        assert tx.rms_messages.record_send_attempts("k1", range(1, 41), next_send_at=1e12) == 40
    assert count(seen, "UPDATE rms_message") == 1, seen


def test_a_lanes_claim_reads_and_counts_its_messages_in_one_statement_on_postgresql(store: StorageManager) -> None:
    """A lane's follow-on claim of first sends (``claim_first_sends``): the messages read and
    their attempts recorded by one statement on PostgreSQL, which returns them as they were
    before (two on SQLite); nothing written when one of them was sent already."""
    started(store, messages=6, sent=False)
    with store.begin() as tx:
        tx.rms.get("k1")  # the sequence's row held already, as the lane's transaction holds it
        seen = statements(tx)
        claimed = tx.rms_messages.claim_first_sends("k1", 3, next_send_at=1e12)
        assert [(m.number, m.send_count) for m in claimed] == [(1, 0), (2, 0), (3, 0)]
        assert len(seen) == (1 if store.url.startswith("postgresql") else 2), seen
    with store.begin() as tx:
        assert [tx.rms_messages.get("k1", n).send_count for n in range(1, 5)] == [1, 1, 1, 0]
        tx.rms_messages.record_send_attempts("k1", [5], next_send_at=0.0)  # sent, and due again at once
    with store.begin() as tx:
        assert tx.rms_messages.claim_first_sends("k1", 3, next_send_at=1e12) == []  # 4 and 5: 5 was sent
    with store.begin() as tx:
        assert [tx.rms_messages.get("k1", n).send_count for n in (4, 5, 6)] == [0, 1, 0]


def test_a_lanes_refill_reads_its_sequence_in_its_claims_statement_on_postgresql(store: StorageManager) -> None:
    """One statement on PostgreSQL (the sequence's read was one of its own, ahead of the
    claim's: a statement and a round trip for every few messages a lane sends); on SQLite the
    sequence and its messages in one read, then the attempts recorded (three before)."""
    started(store, messages=5, sent=False)
    with store.begin(durable=False) as tx:
        seen = statements(tx)
        _, msgs = tx.rms_messages.claim_first_sends_of("k1", 3, next_send_at=1e12)
        assert [m.number for m in msgs] == [1, 2, 3]
        tx.rms.get("k1")  # held: no statement
        assert len(seen) == (1 if store.url.startswith("postgresql") else 2), seen


def test_a_senders_round_with_no_sequence_sending_sends_one_read(store: StorageManager) -> None:
    """A side that only receives (a one-way service) polls its sender all the same: the count
    of sequences that may send finds none, and the due scan (on PostgreSQL with its
    transaction's BEGIN, settings and COMMIT) is not sent (fails without: two statements)."""
    with store.begin() as tx:
        new_rms(tx)  # not started: nothing of it can be due
        enqueue(tx, n=2)
    with store.begin(durable=False) as tx:
        seen = statements(tx)
        assert tx.rms_messages.due_messages(now=1e12, limit=50, per_sequence=50) == []
        assert len(seen) == 1 and seen[0].startswith("SELECT count(*)"), seen
        assert not getattr(tx, "begun", False)  # PostgreSQL: nothing to commit


def test_a_claim_reads_the_message_with_its_sequence_row(store: StorageManager) -> None:
    with store.begin() as tx:
        for n in (1, 2):
            put(tx, "in", n)
    with store.begin() as tx:
        seen = statements(tx)
        msg = tx.invoker.claim_next()
        assert (msg.number, msg.payload, msg.message_id) == (1, b"<m>1</m>", "urn:in:1")
        assert len(seen) == 1, seen
        tx.invoker.mark_delivered("in", 1)
        assert tx.invoker.next_deliverable("in").number == 2  # the batch goes on from the claim
    removal = [s for s in seen[1:] if not s.startswith("SELECT")]
    if store.url.startswith("postgresql"):  # the removal and the sequence's row in one statement
        assert len(removal) == 1 and removal[0].startswith("WITH gone AS (DELETE"), seen
    else:
        assert len(removal) == 2, seen


def test_a_delivery_of_a_message_no_longer_buffered_changes_nothing(store: StorageManager) -> None:
    with store.begin() as tx:
        put(tx, "in", 1)
    with store.begin() as tx:
        tx.invoker.claim_next()
        tx.invoker.mark_delivered("in", 1)
        with pytest.raises(Exception, match="not in the invoker buffer"):
            tx.invoker.mark_delivered("in", 1)
    with store.begin() as tx:
        assert list(tx.invoker.state("in").delivered.ranges) == [(1, 1)]


def test_an_acknowledgement_marks_without_reading_first(store: StorageManager) -> None:
    started(store, messages=5)
    with store.begin() as tx:
        seen = statements(tx)
        assert tx.rms_messages.mark_acked("k1", [(1, 3)]) == [1, 2, 3]
        assert tx.rms_messages.mark_acked("k1", [(1, 4)]) == [4]
    assert not [s for s in seen if s.startswith("SELECT number FROM rms_message") and "NOT acked" in s], seen
    with store.begin() as tx:
        assert [m.number for m in tx.rms_messages.list_for("k1") if not m.acked] == [5]


def test_an_acknowledgement_applied_reads_its_source_sequence_once(store: StorageManager) -> None:
    """What the sender does with an acknowledgement: the sequence by the peer's identifier, its
    messages marked, its acknowledged ones purged; the row read once, then held (it is locked)."""
    started(store, messages=5)
    with store.begin() as tx:
        seen = statements(tx)
        seq = tx.rms.get_by_sequence_id("seq-1")
        assert tx.rms_messages.mark_acked(seq.key, [(1, 3)]) == [1, 2, 3]
        assert tx.rms_messages.has_unacked(seq.key)
        assert tx.rms_messages.purge_acked(seq.key) == 3
        assert tx.rms.get(seq.key).last_activity is not None
    assert count(seen, "SELECT seq_key, target") == 1, seen


def test_one_enqueue_is_one_statement_on_postgresql_two_on_sqlite(store: StorageManager) -> None:
    """The transactional outbox's insert, plus the sequence's number: what a one-message
    transaction of an application pays for reliable sending.  PostgreSQL takes the number and
    inserts the message in one statement (a data-modifying WITH): no round trip more than the
    outbox's own insert.  SQLite (in the process: no round trips) takes the number, then inserts;
    a small payload stays in the message's row (a large one gets a row of its own, which the
    message's later updates leave alone: test_payload_apart.py)."""
    with store.begin() as tx:
        new_rms(tx)
    for expected in (1, 2):
        with store.begin() as tx:
            seen = statements(tx)
            [msg] = enqueue(tx, n=1)
            assert msg.number == expected
        one = store.url.startswith("postgresql")
        assert [s.split()[0] for s in seen] == (["WITH"] if one else ["UPDATE", "INSERT"]), seen
    with store.begin() as tx:
        assert [(m.number, m.payload) for m in tx.rms_messages.list_for("k1")] == \
            [(1, msg.payload), (2, msg.payload)]
    with store.begin() as tx:
        [last] = enqueue(tx, n=1, last=True)
    with store.begin() as tx:
        seq = tx.rms.get("k1")
        assert (seq.next_number, seq.last_message, seq.last_number) == (4, True, 3)
        with pytest.raises(Exception, match="already has its last message"):  # refused, nothing changed
            enqueue(tx, n=1)
    with store.begin() as tx:
        assert tx.rms.get("k1").next_number == 4


def test_an_acknowledgement_is_one_statement_on_postgresql_two_on_sqlite(store: StorageManager) -> None:
    """``acknowledge``: the check that every number named was sent, the messages acknowledged and
    purged, the sequence's row written and "anything left?" -- six statements in three steps, one
    on PostgreSQL; on SQLite (no statement writes two tables there) one read and the messages'
    delete: small payloads are in their rows, and the sequence's row is written only when it
    has something to write, as on PostgreSQL (a purged retransmission, or a last activity older
    than ACTIVITY_GRAIN; then a third statement, and a fourth for payloads kept apart); the
    sequence's row held after it (no read of it follows)."""
    started(store, messages=5)
    with store.begin() as tx:
        seq = tx.rms.get_by_sequence_id("seq-1")
        seen = statements(tx)
        assert tx.rms_messages.acknowledge(seq.key, [(1, 3)]) == ([1, 2, 3], True)
        assert tx.rms.get(seq.key).last_activity is not None
    if store.url.startswith("postgresql"):
        assert len(seen) == 1, seen
    else:
        assert [s.split()[0] for s in seen] == ["SELECT", "DELETE"], seen
    with store.begin() as tx:
        assert [m.number for m in tx.rms_messages.list_for("k1")] == [4, 5]
        assert tx.rms.get("k1").last_activity is not None


def test_an_acknowledgement_writes_its_sequence_when_it_has_something_to_write(store: StorageManager) -> None:
    """A last activity older than ACTIVITY_GRAIN, or a retransmitted message purged (whose count
    the row keeps): the sequence's row is written, with both."""
    started(store, messages=3)
    with store.begin() as tx:
        tx.rms_messages.record_send_attempt("k1", 2, next_send_at=1e12)  # 2 sent twice
        tx.write("UPDATE rms_sequence SET last_activity = 5.0 WHERE seq_key = 'k1'")
    with store.begin() as tx:
        tx.rms.get("k1")
        seen = statements(tx)
        assert tx.rms_messages.acknowledge("k1", [(1, 2)], now=100.0) == ([1, 2], True)
        seq = tx.rms.get("k1")
    assert (seq.last_activity, seq.purged_retransmissions) == (100.0, 1)
    if store.url.startswith("sqlite"):
        assert [s.split()[0] for s in seen] == ["SELECT", "DELETE", "UPDATE"], seen
    with store.begin() as tx:
        seq = tx.rms.get("k1")
    assert (seq.last_activity, seq.purged_retransmissions) == (100.0, 1)


def test_a_callers_claim_and_a_replys_request_are_one_statement_each_on_postgresql(store: StorageManager) -> None:
    """What a caller's thread and the reply's record do to the request: claim its first send
    (read, check the one before, record the attempt), then mark it answered (update and read)."""
    started(store, messages=0)
    with store.begin() as tx:
        tx.rms_messages.enqueue("k1", b"<req/>", action="urn:op", soap_version="1.1", message_id="urn:r1",
                                awaits_reply=True)
    with store.begin() as tx:
        tx.rms.get("k1")
        seen = statements(tx)
        claimed = tx.rms_messages.claim_first_send("k1", 1, next_send_at=1e12)
        assert (claimed.number, claimed.send_count, claimed.payload) == (1, 0, b"<req/>")  # as it was
        claims = len(seen)
        assert not tx.rms_messages.reply_received("k1", 1).reply_pending
    if store.url.startswith("postgresql"):
        assert len(seen) == 2, seen
    else:  # the message read with the one before it checked, then its attempt recorded
        assert [s.split()[0] for s in seen[:claims]] == ["SELECT", "UPDATE"], seen
    with store.begin() as tx:
        assert tx.rms_messages.get("k1", 1).send_count == 1


def test_a_callers_claim_reads_its_replies_sequence_in_the_same_statement_on_postgresql(store: StorageManager) -> None:
    """A caller's claim in its global transaction also reads the sequence of the replies whose
    acknowledgement its request carries (no lock, no round trip of its own after the commit)."""
    started(store, messages=0)
    with store.begin() as tx:
        new_rmd(tx, "replies-1")
        tx.rmd.record_received("replies-1", 1)
        for i in (1, 2):
            tx.rms_messages.enqueue("k1", b"<req/>", action="urn:op", soap_version="1.1",
                                    message_id=f"urn:r{i}", awaits_reply=True)
    with store.begin() as tx:
        tx.rms.get("k1")
        seen = statements(tx)
        msg, rmd = tx.rms_messages.claim_first_send_reading("k1", 1, "replies-1", next_send_at=1e12)
        assert msg is not None and msg.number == 1
        # message 2 waits for 1 (unacknowledged): not claimed, the sequence read all the same
        later, again = tx.rms_messages.claim_first_send_reading("k1", 2, "replies-1", next_send_at=1e12)
        assert later is None
        assert tx.rms_messages.claim_first_send_reading("k1", 1, "unknown", next_send_at=1e12) == (None, None)
    if store.url.startswith("postgresql"):
        assert len(seen) == 3, seen
        for read in (rmd, again):
            assert read is not None and read.sequence_id == "replies-1"
            assert [tuple(r) for r in read.received.ranges] == [(1, 1)], read.received
    else:  # not read with the claim: its caller reads it when it sends
        assert rmd is None and again is None
    with store.begin() as tx:
        assert tx.rms_messages.get("k1", 1).send_count == 1 and tx.rms_messages.get("k1", 2).send_count == 0


def test_a_replys_record_marks_its_request_answered_in_one_round_trip_on_postgresql(store: StorageManager) -> None:
    """The client's record of a reply: its request found by message id, the request's sequence
    locked, the request marked answered -- three statements, one round trip on PostgreSQL, after
    which the sequence's row is held (the acknowledgements that follow read no row)."""
    started(store, messages=0)
    with store.begin() as tx:
        tx.rms_messages.enqueue("k1", b"<req/>", action="urn:op", soap_version="1.1", message_id="urn:r1",
                                awaits_reply=True)
        tx.rms_messages.enqueue("k1", b"<req/>", action="urn:op", soap_version="1.1", message_id="urn:r2")
    with store.begin() as tx:
        seen = statements(tx)
        assert tx.rms_messages.mark_answered("urn:r1") == ("k1", 1, False)
        assert tx.rms.get("k1").highest_number == 2
        first = len(seen)
        assert tx.rms_messages.mark_answered("urn:r1") is None  # answered already
        assert tx.rms_messages.mark_answered("urn:r2") is None  # waits for no reply
        assert tx.rms_messages.mark_answered("urn:nobody") is None
    with store.begin() as tx:
        assert not tx.rms_messages.get("k1", 1).reply_pending
    if store.url.startswith("postgresql"):
        assert first == 1, seen
    else:
        assert first >= 3, seen


def test_a_reply_enqueued_after_its_sequence_was_read_is_one_statement_on_postgresql(store: StorageManager) -> None:
    """A delivery reads the reply's sequence (its checks), then enqueues on it: the number taken
    and the message inserted in one statement all the same (no UPDATE left for the commit)."""
    started(store, messages=0)
    with store.begin() as tx:
        tx.rms.get("k1")
        seen = statements(tx)
        (msg,) = enqueue(tx)
        tx.flush()
    assert msg.number == 1
    if store.url.startswith("postgresql"):
        assert len(seen) == 1 and seen[0].startswith("WITH s AS (UPDATE rms_sequence"), seen


def test_a_source_sequence_held_is_found_by_its_identifier_without_a_statement(store: StorageManager) -> None:
    """A reply's record holds its request's sequence (it marked the request answered), then applies
    the acknowledgement riding on the reply, which names the sequence by the peer's identifier."""
    started(store, messages=1)
    with store.begin() as tx:
        held = tx.rms.get("k1")
        seen = statements(tx)
        assert tx.rms.get_by_sequence_id("seq-1") == held
        assert tx.rms.get_by_sequence_id("seq-unknown") is None
    assert len(seen) == 1, seen


def test_an_acknowledgement_naming_its_sequence_by_the_peers_identifier_is_one_statement_on_postgresql(
        store: StorageManager) -> None:
    """An acknowledgement riding on a service's request names the sequence of its replies by the
    peer's identifier: PostgreSQL looks the row up and locks it in the acknowledgement's own
    statement, which then holds the row (no read of it follows).  Wrong ones write nothing."""
    from wsrm_plugin.store import InvalidAcknowledgementError

    started(store, messages=5)
    with store.begin() as tx:
        seen = statements(tx)
        seq, done = tx.rms_messages.acknowledge_sequence("seq-1", [(1, 3)])
        assert (seq.key, done) == ("k1", ([1, 2, 3], True))
        assert tx.rms.get("k1").last_activity is not None
        assert tx.rms_messages.acknowledge_sequence("seq-unknown", [(1, 1)]) is None
    if store.url.startswith("postgresql"):
        assert len(seen) == 2, seen
    with store.begin() as tx:
        assert [m.number for m in tx.rms_messages.list_for("k1")] == [4, 5]
        enqueue(tx, n=1)  # 6, never sent
    for wrong in ([(4, 7)], [(4, 6)]):  # above the highest number handed out; a message not sent yet
        with store.begin() as tx:
            with pytest.raises(InvalidAcknowledgementError):
                tx.rms_messages.acknowledge_sequence("seq-1", wrong)
        with store.begin() as tx:
            assert [(m.number, m.acked) for m in tx.rms_messages.list_for("k1")] == \
                [(4, False), (5, False), (6, False)]
    with store.begin() as tx:
        tx.rms.update("k1", faulted=True)
    with store.begin() as tx:  # no longer transmitting: read, nothing written
        seq, done = tx.rms_messages.acknowledge_sequence("seq-1", [(4, 5)])
        assert seq.faulted and done is None
    with store.begin() as tx:
        assert [m.number for m in tx.rms_messages.list_for("k1")] == [4, 5, 6]


def test_an_acknowledgement_naming_its_sequence_keeps_an_offering_sequences_requests_waiting(
        store: StorageManager) -> None:
    """``keep_offered_awaiting``: requests waiting for their replies stay unacknowledged, on a
    sequence that carries an Offer only (its replies come back on the back-channel)."""
    for key, sid, offered in (("k1", "seq-1", "urn:offer"), ("k2", "seq-2", None)):
        with store.begin() as tx:
            new_rms(tx, key, offered_id=offered)
            tx.rms.update(key, sequence_id=sid, started=True, next_control_at=None)
            for i in (1, 2):
                msg = tx.rms_messages.enqueue(key, b"<req/>", action="urn:op", soap_version="1.1",
                                              message_id=f"urn:{key}-{i}", awaits_reply=True)
                tx.rms_messages.record_send_attempt(key, msg.number, next_send_at=1e12)
    with store.begin() as tx:
        _, kept = tx.rms_messages.acknowledge_sequence("seq-1", [(1, 2)], keep_offered_awaiting=True)
        _, marked = tx.rms_messages.acknowledge_sequence("seq-2", [(1, 2)], keep_offered_awaiting=True)
    assert kept == ([], True) and marked == ([1, 2], False)


def test_a_replys_record_marks_its_request_answered_and_applies_the_riding_acknowledgement_in_one_round_trip(
        store: StorageManager) -> None:
    """The client's record of a reply: its request marked answered, and the acknowledgement that
    rode on the reply applied when it names the request (one round trip on PostgreSQL).  One that
    names another sequence, or a request acknowledged already, is not applied: the mark alone."""
    with store.begin() as tx:
        awaiting_requests(tx)
    with store.begin() as tx:
        seen = statements(tx)
        answered, applied = tx.rms_messages.mark_answered_acknowledging(
            "urn:r1", "seq-1", [(1, 1)], keep_offered_awaiting=True)
        assert answered == ("k1", 1, False)
        seq, newly, pending = applied
        assert (seq.key, newly, pending) == ("k1", [1], True)
        assert tx.rms.get("k1").sequence_id == "seq-1"  # held: no statement
        first = len(seen)
        # answered already: nothing, as mark_answered
        assert tx.rms_messages.mark_answered_acknowledging("urn:r1", "seq-1", [(1, 1)]) == (None, None)
        # names another sequence: the mark alone
        assert tx.rms_messages.mark_answered_acknowledging("urn:r2", "seq-other", [(1, 2)]) == \
            (("k1", 2, False), None)
    if store.url.startswith("postgresql"):
        assert first == 1, seen
    with store.begin() as tx:
        assert [(m.number, m.reply_pending, m.acked) for m in tx.rms_messages.list_for("k1")] == \
            [(2, False, False), (3, True, False)]
    with store.begin() as tx:  # does not name the request: the mark alone, the other untouched
        assert tx.rms_messages.mark_answered_acknowledging("urn:r3", "seq-1", [(2, 2)]) == \
            (("k1", 3, False), None)
    with store.begin() as tx:
        assert [(m.number, m.reply_pending, m.acked) for m in tx.rms_messages.list_for("k1")] == \
            [(2, False, False), (3, False, False)]


def test_a_receipt_to_buffer_guesses_in_order_on_sqlite(store: StorageManager) -> None:
    """``receive_in_order(take=False)`` (a receive that buffers its message to deliver it apart):
    on SQLite the receipt's UPDATE is the guess (the row's read before it is gone), and nothing is
    taken; PostgreSQL saves nothing so (its round trip is the lock's) and leaves it to the general
    way, sending nothing."""
    with store.begin() as tx:
        new_rmd(tx)
        tx.rmd.record_received("s1", 1)
    with store.begin() as tx:
        seen = statements(tx)
        guessed = tx.receive_in_order("s1", 2, take=False)
        if store.url.startswith("postgresql"):
            assert guessed is None and seen == []
            return
        assert guessed is not None
        before, taken = guessed
        assert not taken and before.received.ranges == ((1, 1),)
        assert len(seen) == 1 and seen[0].startswith("UPDATE rmd_sequence"), seen
        assert put(tx, "s1", 2)
    with store.begin() as tx:
        assert tx.rmd.get("s1").received.ranges == ((1, 2),)
        assert tx.invoker.next_deliverable("s1", in_order=False).number == 2  # buffered, not taken


def test_a_put_reads_the_delivered_ranges_in_its_insert_on_sqlite(store: StorageManager) -> None:
    """SQLite's transaction holds the whole file, so nobody delivers between the insert and the
    read of what is delivered: one statement (the read in the INSERT's RETURNING) where
    PostgreSQL reads again after it.  A number delivered already is still not buffered."""
    with store.begin() as tx:
        assert put(tx, "s1", 1)  # the sequence's invoker row made
    with store.begin() as tx:
        tx.invoker.mark_delivered("s1", 1)
    with store.begin() as tx:
        seen = statements(tx)
        assert put(tx, "s1", 2)
        assert not put(tx, "s1", 1)  # delivered already: undone
    inserts = count(seen, "INSERT INTO invoker_message")
    reads = [s for s in seen if s.startswith("SELECT") and "FROM invoker_sequence" in s]
    if store.url.startswith("postgresql"):
        assert inserts == 2 and len(reads) == 2, seen
    else:
        assert inserts == 2 and reads == [], seen
    with store.begin() as tx:
        assert tx.invoker.next_deliverable("s1").number == 2 and tx.invoker.count() == 1


def test_a_savepoint_whose_part_succeeded_stays_open_until_the_commit_on_sqlite(store: StorageManager) -> None:
    """Receives delivered together each run in a savepoint of their own, in the store's file:
    on SQLite a part that succeeded sends no RELEASE (its COMMIT ends them all), a part that
    fails is still rolled back alone, and the others commit."""
    with store.begin() as tx:
        new_rmd(tx)
    with store.begin() as tx:
        tx.rmd.get("s1")
        seen = statements(tx)
        for number in (1, 2, 3):
            try:
                with tx.savepoint():
                    tx.rmd.record_received("s1", number)
                    if number == 2:
                        raise LookupError("this part fails")
            except LookupError:
                pass
    with store.begin() as tx:
        assert list(tx.rmd.get("s1").received.ranges) == [(1, 1), (3, 3)]
    assert count(seen, "SAVEPOINT") == 3, seen
    assert count(seen, "ROLLBACK TO SAVEPOINT") == 1, seen
    # the failed part's RELEASE after its ROLLBACK TO; on PostgreSQL every part's
    assert count(seen, "RELEASE SAVEPOINT") == (1 if store.url.startswith("sqlite") else 3), seen
