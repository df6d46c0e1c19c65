"""What every store must do, run against memory, SQLite and PostgreSQL alike."""

from __future__ import annotations

import pytest

from wsrm_plugin.store import (
    DuplicateSequenceError, InvalidAcknowledgementError, LockOrderError, SequenceNotOpenError,
    StorageManager, TransactionClosedError, UnknownMessageError, UnknownSequenceError,
)
from wsrm_plugin.store.api import MAX_MESSAGE_NUMBER

RM11 = "http://docs.oasis-open.org/ws-rx/wsrm/200702"
WSA = "http://www.w3.org/2005/08/addressing"


def new_rms(tx, key="k1", **kw):
    return tx.rms.create(key, target="http://server/svc", acks_to="http://client/acks",
                         rm_version=RM11, wsa_version=WSA, **kw)


def awaiting_requests(tx) -> None:
    """Sequence "seq-1" (key "k1", offering "urn:offer") with requests urn:r1..urn:r3 sent, each
    waiting for its reply."""
    new_rms(tx, offered_id="urn:offer")
    tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)
    for i in (1, 2, 3):
        msg = tx.rms_messages.enqueue("k1", b"<req/>", action="urn:op", soap_version="1.1",
                                      message_id=f"urn:r{i}", awaits_reply=True)
        tx.rms_messages.record_send_attempt("k1", msg.number, next_send_at=1e12)


def enqueue(tx, key="k1", n=1, **kw):
    return [tx.rms_messages.enqueue(key, b"<env>%d</env>" % i, action="urn:op",
                                    soap_version="1.2", message_id=f"urn:uuid:{key}-{i}-{id(tx)}",
                                    **kw) for i in range(n)]


def new_rmd(tx, sid="s1", **kw):
    return tx.rmd.create(sid, acks_to="http://client/acks", rm_version=RM11, wsa_version=WSA, **kw)


def started(store, key="k1", sid="seq-1", messages=0, sent=True):
    """A started RMS sequence with ``messages`` messages, all sent once."""
    with store.begin() as tx:
        new_rms(tx, key)
        tx.rms.update(key, sequence_id=sid, started=True, next_control_at=None)
        for m in enqueue(tx, key, messages):
            if sent:
                tx.rms_messages.record_send_attempt(key, m.number, next_send_at=1e12)


# -- RMS sequences -----------------------------------------------------------------------


def test_rms_sequence_create_get_update_delete(store: StorageManager) -> None:
    with store.begin() as tx:
        seq = new_rms(tx, offered_id="urn:offer", now=100.0)
        assert (seq.key, seq.next_number, seq.started, seq.sequence_id) == ("k1", 1, False, None)
        assert seq.offered_id == "urn:offer" and seq.next_control_at == 100.0
    with store.begin() as tx:
        assert tx.rms.get("k1") == seq
        assert tx.rms.get("nope") is None
        assert tx.rms.get_by_sequence_id("seq-9") is None
        new = tx.rms.update("k1", sequence_id="seq-9", started=True, expires=500.0,
                            next_control_at=None)
        assert new.started and new.sequence_id == "seq-9" and new.expires == 500.0
    with store.begin() as tx:
        assert tx.rms.get_by_sequence_id("seq-9").key == "k1"
        tx.rms.update("k1", faulted=True, fault_reason="max retries")
    with store.begin() as tx:
        got = tx.rms.get("k1")
        assert got.faulted and got.fault_reason == "max retries" and got.created_at == 100.0
        tx.rms.delete("k1")
    with store.begin() as tx:
        assert tx.rms.get("k1") is None and tx.rms.list_all() == []


def test_rms_errors_are_precise(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rms(tx, "a")
        new_rms(tx, "b")
        tx.rms.update("a", sequence_id="same")
        with pytest.raises(DuplicateSequenceError):
            new_rms(tx, "a")
        with pytest.raises(DuplicateSequenceError, match="already belongs"):
            tx.rms.update("b", sequence_id="same")
        with pytest.raises(UnknownSequenceError, match="no RMS sequence 'zz'"):
            tx.rms.update("zz", started=True)
        with pytest.raises(TypeError, match="next_number"):
            tx.rms.update("a", next_number=7)
        with pytest.raises(ValueError):
            new_rms(tx, "")


def test_rms_needing_work_and_listing(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rms(tx, "new", now=10.0)                       # wants CreateSequence at 10
        new_rms(tx, "idle", now=10.0, next_control_at=0)
        tx.rms.update("idle", next_control_at=None)        # nothing to do
        new_rms(tx, "later", now=10.0, next_control_at=50.0)
        new_rms(tx, "expiring", now=10.0, next_control_at=0)
        tx.rms.update("expiring", next_control_at=None, expires=20.0)
    with store.begin() as tx:
        assert [s.key for s in tx.rms.needing_work(now=15.0)] == ["new"]
        assert [s.key for s in tx.rms.needing_work(now=30.0)] == ["new", "expiring"]
        assert {s.key for s in tx.rms.needing_work(now=60.0)} == {"new", "expiring", "later"}
        assert len(tx.rms.needing_work(now=60.0, limit=2)) == 2
        assert {s.key for s in tx.rms.list_all()} == {"new", "idle", "later", "expiring"}


# -- RMS messages ------------------------------------------------------------------------


def test_enqueue_numbers_messages_and_keeps_everything(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rms(tx)
        a, b = enqueue(tx, n=2, now=5.0)
        c = tx.rms_messages.enqueue("k1", b"\x00\xffbinary", action="urn:act", soap_version="1.1",
                                    message_id="urn:m3", reply_callback="pkg.mod:on_reply",
                                    reply_context=b"\x01ctx", send_at=9.0, now=6.0)
    assert (a.number, b.number, c.number) == (1, 2, 3)
    with store.begin() as tx:
        got = tx.rms_messages.get("k1", 3)
        assert got == c
        assert (got.payload, got.reply_context, got.reply_pending) == (b"\x00\xffbinary", b"\x01ctx", True)
        assert (got.next_send_at, got.created_at, got.send_count, got.acked) == (9.0, 6.0, 0, False)
        assert tx.rms_messages.find_by_message_id("urn:m3") == c
        assert tx.rms_messages.find_by_message_id("urn:none") is None
        assert tx.rms.get("k1").next_number == 4
        assert [m.number for m in tx.rms_messages.list_for("k1")] == [1, 2, 3]
        assert tx.rms_messages.get("k1", 99) is None
        with pytest.raises(UnknownSequenceError):
            tx.rms_messages.enqueue("zz", b"x", action="a", soap_version="1.2", message_id="m")
        with pytest.raises(TypeError, match="bytes"):
            tx.rms_messages.enqueue("k1", "text", action="a", soap_version="1.2", message_id="m")


def test_rolled_back_enqueue_gives_its_numbers_back(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rms(tx)
        enqueue(tx, n=2)
    tx = store.begin()
    assert [m.number for m in enqueue(tx, n=3)] == [3, 4, 5]
    tx.rollback()
    with store.begin() as tx:
        assert [m.number for m in enqueue(tx, n=1)] == [3]
        assert tx.rms_messages.count_unacked("k1") == 3


def test_last_message_closes_the_sequence_for_sending(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rms(tx)
        enqueue(tx, n=2)
        last = enqueue(tx, n=1, last=True)[0]
        assert last.last and last.number == 3
        seq = tx.rms.get("k1")
        assert seq.last_message and seq.last_number == 3
        with pytest.raises(SequenceNotOpenError, match="last message"):
            enqueue(tx)
        new_rms(tx, "k2")
        enqueue(tx, "k2", 2)
        assert tx.rms.mark_last("k2").last_number == 2
        new_rms(tx, "k3")
        tx.rms.update("k3", faulted=True, fault_reason="CreateSequenceRefused")
        with pytest.raises(SequenceNotOpenError, match="faulted .CreateSequenceRefused"):
            enqueue(tx, "k3")


def test_acks_mark_messages_once_and_reject_unsent_numbers(store: StorageManager) -> None:
    started(store, messages=5)
    with store.begin() as tx:
        enqueue(tx, n=1)  # number 6: handed out, never sent
        assert tx.rms_messages.mark_acked("k1", [(1, 2), (4, 4)]) == [1, 2, 4]
        assert tx.rms_messages.mark_acked("k1", [(1, 4)]) == [3]
        assert tx.rms_messages.mark_acked("k1", [(1, 5)]) == [5]
        assert tx.rms_messages.count_unacked("k1") == 1
    with store.begin() as tx:
        with pytest.raises(InvalidAcknowledgementError) as beyond:
            tx.rms_messages.mark_acked("k1", [(1, 5), (7, 8)])
        assert beyond.value.numbers == (7, 8) and beyond.value.highest_number == 6
        with pytest.raises(InvalidAcknowledgementError) as unsent:
            tx.rms_messages.mark_acked("k1", [(6, 6)])
        assert unsent.value.numbers == (6,)
        assert not tx.rms_messages.get("k1", 6).acked  # nothing changed
        with pytest.raises(UnknownSequenceError):
            tx.rms_messages.mark_acked("nope", [(1, 1)])
        with pytest.raises(ValueError):
            tx.rms_messages.mark_acked("k1", [(0, 3)])
        with pytest.raises(ValueError):
            tx.rms_messages.mark_acked("k1", [(3, 1)])


@pytest.mark.parametrize("size", [10, 40 * 1024], ids=["small", "copied"])
def test_a_reply_enqueued_handed_out_is_stored_as_sent_once(store: StorageManager, size: int) -> None:
    """A back-channel reply its receiving thread hands out itself is enqueued as sent once (no
    record_send_attempt after it): its client may acknowledge it.  A large payload goes by COPY
    on PostgreSQL: the same columns."""
    started(store, messages=0)
    with store.begin() as tx:
        msg = tx.rms_messages.enqueue("k1", b"x" * size, action="urn:op", soap_version="1.2",
                                      message_id="urn:reply-1", send_at=1e12, handed_out=True)
        other = tx.rms_messages.enqueue("k1", b"<reply/>", action="urn:op", soap_version="1.2",
                                        message_id="urn:reply-2", send_at=1e12)
        assert (msg.send_count, other.send_count) == (1, 0) and msg.last_sent_at is not None
    with store.begin() as tx:
        stored = tx.rms_messages.get("k1", msg.number)
        assert stored.send_count == 1 and stored.last_sent_at == pytest.approx(msg.last_sent_at)
        assert stored.next_send_at == 1e12 and len(stored.payload) == size
        assert tx.rms_messages.get("k1", other.number).send_count == 0
        assert tx.rms_messages.mark_acked("k1", [(msg.number, msg.number)]) == [msg.number]
        with pytest.raises(InvalidAcknowledgementError):
            tx.rms_messages.mark_acked("k1", [(other.number, other.number)])


def test_acks_of_purged_messages_are_not_invalid(store: StorageManager) -> None:
    started(store, messages=3)
    with store.begin() as tx:
        tx.rms_messages.mark_acked("k1", [(1, 3)])
        assert tx.rms_messages.purge_acked("k1") == 3
        assert tx.rms_messages.mark_acked("k1", [(1, 3)]) == []


def test_acknowledge_marks_purges_and_says_what_is_left(store: StorageManager) -> None:
    """``acknowledge``: mark_acked, has_unacked and purge_acked as one step (the PostgreSQL store
    runs it as one statement): the same outcome on every store."""
    started(store, messages=4)
    with store.begin() as tx:
        req = tx.rms_messages.enqueue("k1", b"<req/>", action="urn:op", soap_version="1.2",
                                      message_id="urn:req-5", awaits_reply=True)
        tx.rms_messages.record_send_attempt("k1", req.number, next_send_at=1e12)
        for _ in range(2):  # message 1 went three times
            tx.rms_messages.record_send_attempt("k1", 1, next_send_at=1e12)
        enqueue(tx, n=1)  # number 6: handed out, never sent
    with store.begin() as tx:
        assert tx.rms_messages.acknowledge("k1", [(1, 2)]) == ([1, 2], True)
        assert [m.number for m in tx.rms_messages.list_for("k1")] == [3, 4, 5, 6]  # purged
        assert tx.rms.get("k1").purged_retransmissions == 2
        # a request waiting for its reply is kept unacknowledged when asked to
        assert tx.rms_messages.acknowledge("k1", [(1, 5)], keep_awaiting=True) == ([3, 4], True)
        assert not tx.rms_messages.get("k1", 5).acked
        with pytest.raises(InvalidAcknowledgementError) as unsent:
            tx.rms_messages.acknowledge("k1", [(5, 6)])
        assert unsent.value.numbers == (6,)
        with pytest.raises(InvalidAcknowledgementError) as beyond:
            tx.rms_messages.acknowledge("k1", [(1, 8)], keep_awaiting=True)
        assert beyond.value.numbers == (7, 8)
        assert not tx.rms_messages.get("k1", 5).acked  # nothing changed by either
        # acknowledged, it stays while its reply is pending, then goes with the next acknowledgement
        assert tx.rms_messages.acknowledge("k1", [(1, 5)]) == ([5], True)
        assert tx.rms_messages.get("k1", 5).acked
        tx.rms_messages.reply_received("k1", 5)
        tx.rms_messages.record_send_attempt("k1", 6, next_send_at=1e12)
        assert tx.rms_messages.acknowledge("k1", [(1, 6)]) == ([6], False)
        assert tx.rms_messages.list_for("k1") == []
        assert tx.rms_messages.acknowledge("k1", [(1, 6)]) == ([], False)
        assert tx.rms_messages.acknowledge("k1", []) == ([], False)
    assert store.status().retransmissions == 2


def test_a_replys_record_applies_the_riding_acknowledgement_only_where_it_may(store: StorageManager) -> None:
    """``mark_answered_acknowledging``: the request marked answered, and the acknowledgement that
    rode on its reply applied when it names the request's sequence and the request, the sequence
    transmits and the ranges are valid; else the mark alone, nothing of the acknowledgement
    written.  Requests still waiting for their replies stay unacknowledged (an offering sequence)."""
    with store.begin() as tx:
        new_rms(tx, offered_id="urn:offer")
        tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)
        for i in (1, 2, 3, 4):
            msg = tx.rms_messages.enqueue("k1", b"<req/>", action="urn:op", soap_version="1.1",
                                          message_id=f"urn:r{i}", awaits_reply=True)
            if i < 4:  # 4: handed out, never sent
                tx.rms_messages.record_send_attempt("k1", msg.number, next_send_at=1e12)
    with store.begin() as tx:  # names 4, never sent: refused whole, the mark alone
        assert tx.rms_messages.mark_answered_acknowledging("urn:r1", "seq-1", [(1, 4)]) == \
            (("k1", 1, False), None)
    with store.begin() as tx:
        assert [(m.number, m.reply_pending, m.acked) for m in tx.rms_messages.list_for("k1")] == \
            [(1, False, False), (2, True, False), (3, True, False), (4, True, False)]
        # 2 and 3 named: 2 answered now, 3 still waits for its reply and stays unacknowledged
        answered, (seq, newly, pending) = tx.rms_messages.mark_answered_acknowledging(
            "urn:r2", "seq-1", [(1, 3)], keep_offered_awaiting=True)
        assert (answered, seq.key, newly, pending) == (("k1", 2, False), "k1", [1, 2], True)
        assert [(m.number, m.acked) for m in tx.rms_messages.list_for("k1")] == [(3, False), (4, False)]
        tx.rms.update("k1", faulted=True)
    with store.begin() as tx:  # no longer transmitting: the mark alone
        assert tx.rms_messages.mark_answered_acknowledging("urn:r3", "seq-1", [(3, 3)]) == \
            (("k1", 3, False), None)
        assert not tx.rms_messages.get("k1", 3).acked


def test_claim_first_send_takes_only_an_unsent_message_next_in_line(store: StorageManager) -> None:
    """What a caller's thread may send itself: unsent, unacknowledged, the message before it
    acknowledged (or purged); claimed, its first attempt is recorded."""
    started(store, messages=1)
    with store.begin() as tx:
        enqueue(tx, n=2)  # 2 and 3, unsent
    with store.begin() as tx:
        assert tx.rms_messages.claim_first_send("k1", 2, next_send_at=50.0, now=10.0) is None  # 1 is out
        assert tx.rms_messages.claim_first_send("k1", 1, next_send_at=50.0, now=10.0) is None  # sent already
        assert tx.rms_messages.claim_first_send("k1", 9, next_send_at=50.0, now=10.0) is None  # unknown
        assert tx.rms_messages.get("k1", 2).send_count == 0
        tx.rms_messages.acknowledge("k1", [(1, 1)])  # purged
        claimed = tx.rms_messages.claim_first_send("k1", 2, next_send_at=50.0, now=10.0)
        assert (claimed.number, claimed.send_count, claimed.payload) == (2, 0, b"<env>0</env>")  # as it was
        after = tx.rms_messages.get("k1", 2)
        assert (after.send_count, after.next_send_at, after.last_sent_at) == (1, 50.0, 10.0)
        assert tx.rms_messages.claim_first_send("k1", 2, next_send_at=60.0) is None  # once
        assert tx.rms_messages.claim_first_send("k1", 3, next_send_at=60.0) is None  # 2 is out
        tx.rms_messages.acknowledge("k1", [(2, 2)])
        assert tx.rms_messages.claim_first_send("k1", 3, next_send_at=60.0).number == 3


def test_due_messages_and_send_attempts(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rms(tx, "unstarted")
        enqueue(tx, "unstarted", 2, now=0.0)
        new_rms(tx, "k1")
        tx.rms.update("k1", sequence_id="s", started=True)
        enqueue(tx, "k1", 3, now=1.0)
    with store.begin() as tx:
        due = tx.rms_messages.due_messages(now=10.0)
        assert [(m.sequence_key, m.number) for m in due] == [("k1", 1), ("k1", 2), ("k1", 3)]
        first = tx.rms_messages.record_send_attempt("k1", 1, next_send_at=20.0, now=10.0)
        assert (first.send_count, first.next_send_at, first.last_sent_at) == (1, 20.0, 10.0)
        tx.rms_messages.record_send_attempt("k1", 2, next_send_at=30.0, now=10.0)
        tx.rms_messages.record_send_attempt("k1", 3, next_send_at=40.0, now=10.0)
        with pytest.raises(UnknownMessageError):
            tx.rms_messages.record_send_attempt("k1", 4, next_send_at=1.0)
    with store.begin() as tx:
        assert [m.number for m in tx.rms_messages.due_messages(now=25.0)] == [1]
        assert len(tx.rms_messages.due_messages(now=100.0, limit=2)) == 2
        tx.rms_messages.mark_acked("k1", [(1, 1)])
        assert [m.number for m in tx.rms_messages.due_messages(now=35.0)] == [2]
        assert tx.rms_messages.make_due("k1", [1, 3, 99], at=0.0) == 1  # 1 is acked, 99 unknown
        assert [m.number for m in tx.rms_messages.due_messages(now=5.0)] == [3]
        tx.rms.update("k1", faulted=True)
        assert tx.rms_messages.due_messages(now=100.0) == []


def test_reply_pending_messages_survive_purge_until_the_reply(store: StorageManager) -> None:
    started(store, messages=0)
    with store.begin() as tx:
        m = tx.rms_messages.enqueue("k1", b"<req/>", action="urn:op", soap_version="1.2",
                                    message_id="urn:req", reply_callback="app:handle")
        tx.rms_messages.record_send_attempt("k1", m.number, next_send_at=1e12)
        enqueue(tx, n=1)
        tx.rms_messages.record_send_attempt("k1", 2, next_send_at=1e12)
        tx.rms_messages.mark_acked("k1", [(1, 2)])
        assert tx.rms_messages.purge_acked() == 1
        assert tx.rms_messages.get("k1", 1).reply_pending
        assert not tx.rms_messages.reply_received("k1", 1).reply_pending
        assert tx.rms_messages.purge_acked() == 1
        assert tx.rms_messages.list_for("k1") == []


def test_status_counts_retransmissions_across_purges(store: StorageManager) -> None:
    started(store, messages=2)
    with store.begin() as tx:
        for _ in range(3):
            tx.rms_messages.record_send_attempt("k1", 1, next_send_at=1e12)
        tx.rms_messages.mark_acked("k1", [(1, 1)])
    assert store.status().retransmissions == 3
    with store.begin() as tx:
        tx.rms_messages.purge_acked()
    status = store.status()
    assert status.retransmissions == 3 and status.unacked == 1
    (rms,) = status.rms
    assert (rms.state, rms.stored, rms.unacked, rms.next_number) == ("started", 1, 1, 3)
    with store.begin() as tx:
        tx.rms.update("k1", faulted=True, fault_reason="retries exhausted")
    assert store.status().faulted == 1
    assert store.status().by_state() == {"rms faulted": 1}


def test_message_number_rollover_is_refused() -> None:
    from wsrm_plugin.store.api import MessageNumberRolloverError, RmsSequence, check_enqueue
    seq = RmsSequence(key="k", target="t", acks_to="a", rm_version="v", wsa_version="w",
                      next_number=MAX_MESSAGE_NUMBER)
    assert check_enqueue(seq, b"x") == MAX_MESSAGE_NUMBER
    with pytest.raises(MessageNumberRolloverError, match="new sequence"):
        check_enqueue(RmsSequence(key="k", target="t", acks_to="a", rm_version="v",
                                  wsa_version="w", next_number=MAX_MESSAGE_NUMBER + 1), b"x")


# -- RMD sequences -----------------------------------------------------------------------


def test_rmd_sequence_lifecycle(store: StorageManager) -> None:
    with store.begin() as tx:
        seq = new_rmd(tx, principal="CN=client", offered_id="urn:resp", now=7.0)
        assert (seq.principal, seq.offered_id, seq.received.ranges, seq.created_at) == (
            "CN=client", "urn:resp", (), 7.0)
        with pytest.raises(DuplicateSequenceError):
            new_rmd(tx)
    with store.begin() as tx:
        assert [tx.rmd.record_received("s1", n, now=8.0) for n in (1, 2, 5, 2, 4)] == [
            True, True, True, False, True]
        seq = tx.rmd.get("s1")
        assert seq.received.ranges == ((1, 2), (4, 5)) and seq.last_activity == 8.0
        assert not seq.every_received
        assert tx.rmd.record_received("s1", 6, last=True)
        assert tx.rmd.get("s1").last_number == 6 and not tx.rmd.get("s1").every_received
        tx.rmd.record_received("s1", 3)
        assert tx.rmd.get("s1").received.ranges == ((1, 6),) and tx.rmd.get("s1").every_received
        closed = tx.rmd.update("s1", closed=True)
        assert closed.closed and not closed.terminated
        with pytest.raises(TypeError):
            tx.rmd.update("s1", received=None)
        with pytest.raises(ValueError):
            tx.rmd.record_received("s1", 0)
        with pytest.raises(UnknownSequenceError):
            tx.rmd.record_received("nope", 1)
    with store.begin() as tx:
        tx.rmd.update("s1", terminated=True)
        assert [s.sequence_id for s in tx.rmd.list_all()] == ["s1"]
        tx.rmd.delete("s1")
        assert tx.rmd.get("s1") is None


def test_open_ids_are_the_sequences_not_terminated(store: StorageManager) -> None:
    """What the open-sequence limits count at each CreateSequence, without reading rows."""
    with store.begin() as tx:
        new_rmd(tx, "a", principal="CN=one")
        new_rmd(tx, "b", principal="CN=two")
        new_rmd(tx, "c", principal="CN=one")
        new_rmd(tx, "d")
        tx.rmd.update("c", terminated=True)
        tx.rmd.update("b", closed=True)
        assert sorted(tx.rmd.open_ids()) == ["a", "b", "d"]
        assert tx.rmd.open_ids("CN=one") == ["a"]
        assert tx.rmd.open_ids("CN=nobody") == []
    with store.begin() as tx:
        assert sorted(tx.rmd.open_ids()) == ["a", "b", "d"]


def test_rmd_huge_numbers_stay_compact(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rmd(tx)
        for n in (MAX_MESSAGE_NUMBER, 1, MAX_MESSAGE_NUMBER - 1):
            tx.rmd.record_received("s1", n)
    with store.begin() as tx:
        assert tx.rmd.get("s1").received.ranges == ((1, 1), (MAX_MESSAGE_NUMBER - 1, MAX_MESSAGE_NUMBER))


def test_ack_duty_flag(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rmd(tx, "a")
        new_rmd(tx, "b")
        tx.rmd.request_ack("a", due_at=10.0)
        tx.rmd.request_ack("a", due_at=20.0)   # an earlier due time wins
        tx.rmd.request_ack("b", due_at=15.0)
    with store.begin() as tx:
        assert [s.sequence_id for s in tx.rmd.needing_ack(now=12.0)] == ["a"]
        assert [s.sequence_id for s in tx.rmd.needing_ack(now=16.0)] == ["a", "b"]
        tx.rmd.ack_sent("a")
        assert tx.rmd.request_ack("b", due_at=5.0).ack_due_at == 5.0
    with store.begin() as tx:
        assert [s.sequence_id for s in tx.rmd.needing_ack(now=100.0)] == ["b"]


# -- invoker buffer ----------------------------------------------------------------------


def put(tx, sid, n, **kw):
    return tx.invoker.put(sid, n, b"<m>%d</m>" % n, action="urn:op", soap_version="1.2",
                          message_id=f"urn:{sid}:{n}", **kw)


def test_in_order_delivery_waits_for_the_gap(store: StorageManager) -> None:
    with store.begin() as tx:
        assert put(tx, "s1", 2, reply_to="http://client/reply", now=3.0)
        assert put(tx, "s1", 3)
        assert not put(tx, "s1", 3)  # duplicate
        assert tx.invoker.next_deliverable("s1") is None
        assert tx.invoker.next_deliverable("s1", in_order=False).number == 2
        assert put(tx, "s1", 1)
    with store.begin() as tx:
        first = tx.invoker.next_deliverable("s1")
        assert (first.number, first.message_id, first.payload) == (1, "urn:s1:1", b"<m>1</m>")
        tx.invoker.mark_delivered("s1", 1)
        second = tx.invoker.next_deliverable("s1")
        assert (second.number, second.reply_to, second.received_at) == (2, "http://client/reply", 3.0)
    with store.begin() as tx:
        assert not put(tx, "s1", 1)  # delivered already: a duplicate
        tx.invoker.mark_delivered("s1", 2)
        tx.invoker.mark_delivered("s1", 3)
        state = tx.invoker.state("s1")
        assert (state.delivered.ranges, state.buffered, state.next_in_order) == (((1, 3),), 0, 4)
        with pytest.raises(UnknownMessageError):
            tx.invoker.mark_delivered("s1", 3)
        assert tx.invoker.next_deliverable("unknown") is None


def test_unordered_delivery_and_claiming_across_sequences(store: StorageManager) -> None:
    with store.begin() as tx:
        put(tx, "a", 3)
        put(tx, "b", 1)
        put(tx, "b", 2)
    with store.begin() as tx:
        claimed = tx.invoker.claim_next()
        assert (claimed.sequence_id, claimed.number) == ("b", 1)
        tx.invoker.mark_delivered("b", 1)
    with store.begin() as tx:
        assert (tx.invoker.claim_next().sequence_id, tx.invoker.claim_next().number) == ("b", 2)
        tx.invoker.mark_delivered("b", 2)
    with store.begin() as tx:
        assert tx.invoker.claim_next() is None           # a waits for 1 and 2
        got = tx.invoker.claim_next(in_order=False)
        assert (got.sequence_id, got.number) == ("a", 3)
        tx.invoker.mark_delivered("a", 3)
        state = tx.invoker.state("a")
        assert state.delivered.ranges == ((3, 3),) and state.next_in_order == 1
        assert tx.invoker.count() == 0


def test_discard_drops_a_sequences_buffer(store: StorageManager) -> None:
    with store.begin() as tx:
        for n in (1, 2, 4):
            put(tx, "a", n)
        put(tx, "b", 1)
        tx.invoker.mark_delivered("a", 1)
    with store.begin() as tx:
        assert tx.invoker.count("a") == 2 and tx.invoker.count() == 3
        assert tx.invoker.discard("a") == 2
        assert tx.invoker.count() == 1 and not tx.invoker.state("a").delivered


# -- transactions and locks --------------------------------------------------------------


def test_rollback_and_exceptions_leave_nothing(store: StorageManager) -> None:
    with pytest.raises(RuntimeError):
        with store.begin() as tx:
            new_rmd(tx)
            put(tx, "s1", 1)
            new_rms(tx)
            raise RuntimeError("boom")
    with store.begin() as tx:
        assert tx.rmd.get("s1") is None and tx.rms.get("k1") is None
        assert tx.invoker.count() == 0
    with pytest.raises(TransactionClosedError):
        tx.rms.get("k1")
    with pytest.raises(TransactionClosedError):
        tx.commit()


def test_lock_order_is_enforced(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rmd(tx)
        put(tx, "s1", 1)
        new_rms(tx)            # RMD -> invoker -> RMS: fine
        tx.rmd.get("s1")        # already held: fine
        with pytest.raises(LockOrderError, match="RMD sequence, invoker buffer, RMS sequence"):
            tx.rmd.get("s2")
        with pytest.raises(LockOrderError):
            put(tx, "s2", 1)
    with store.begin() as tx:
        tx.invoker.next_deliverable("s1")
        with pytest.raises(LockOrderError):
            new_rmd(tx, "s3")


def test_due_messages_round_robin_across_sequences(store: StorageManager) -> None:
    """Every sequence's first due message, then the seconds...; at most ``per_sequence`` each.

    Messages not yet due or acknowledged, and sequences not started or
    faulted, are never claimed.
    """
    started(store, "a", "sa", messages=4, sent=False)
    started(store, "b", "sb", messages=2, sent=False)
    started(store, "c", "sc", messages=3, sent=False)
    started(store, "f", "sf", messages=2, sent=False)
    with store.begin() as tx:
        new_rms(tx, "u")  # not started: no sequence id yet
        enqueue(tx, "u", 2)
        tx.rms.update("f", faulted=True, fault_reason="test")
        tx.rms_messages.record_send_attempt("a", 1, next_send_at=1e12)  # sent, not due again yet
        tx.rms_messages.record_send_attempt("c", 1, next_send_at=0.0)
        tx.rms_messages.record_send_attempt("c", 2, next_send_at=0.0)
        tx.rms_messages.mark_acked("c", [(1, 1)])
    with store.begin() as tx:
        due = tx.rms_messages.due_messages(limit=100, per_sequence=2)
        picked = [(m.sequence_key, m.number) for m in due]
        assert sorted(picked[:3]) == [("a", 2), ("b", 1), ("c", 2)]  # each sequence's first
        assert sorted(picked[3:]) == [("a", 3), ("b", 2), ("c", 3)]  # then the seconds, no thirds
        assert len(tx.rms_messages.due_messages(limit=4, per_sequence=2)) == 4


def test_a_delivery_rolled_back_to_its_savepoint_is_deliverable_again(store: StorageManager) -> None:
    """What a transaction remembers of the buffers it holds is rewound with the savepoint."""
    with store.begin() as tx:
        for n in (1, 2):
            put(tx, "in", n)
    with store.begin() as tx:
        assert tx.invoker.claim_next().number == 1
        tx.invoker.mark_delivered("in", 1)
        with pytest.raises(RuntimeError):
            with tx.savepoint():
                assert tx.invoker.next_deliverable("in").number == 2
                tx.invoker.mark_delivered("in", 2)
                assert tx.invoker.next_deliverable("in") is None
                raise RuntimeError("the application failed on 2")
        assert tx.invoker.next_deliverable("in").number == 2  # 2 is back, 1 stays delivered
        tx.invoker.mark_delivered("in", 2)
    with store.begin() as tx:
        assert list(tx.invoker.state("in").delivered.ranges) == [(1, 2)]
        assert tx.invoker.count("in") == 0


def test_record_send_attempts_counts_a_round_at_once(store: StorageManager) -> None:
    started(store, messages=3, sent=False)
    with store.begin() as tx:
        assert tx.rms_messages.record_send_attempts("k1", [1, 3, 9], next_send_at=50.0, now=10.0) == 2
        assert tx.rms_messages.record_send_attempts("k1", [3], next_send_at=60.0, now=20.0) == 1
    with store.begin() as tx:
        got = {m.number: (m.send_count, m.last_sent_at, m.next_send_at) for m in tx.rms_messages.list_for("k1")}
    assert got[1] == (1, 10.0, 50.0) and got[3] == (2, 20.0, 60.0)
    assert got[2][0] == 0  # not named, not counted


def test_record_send_attempts_across_sequences_counts_a_round_of_several(store: StorageManager) -> None:
    started(store, messages=3, sent=False)
    started(store, key="k2", sid="seq-2", messages=2, sent=False)
    with store.begin() as tx:
        assert tx.rms_messages.due_messages(limit=10, per_sequence=10)  # what the claim does first
        assert tx.rms_messages.record_send_attempts_across({"k1": [1, 3, 9], "k2": [2]}, next_send_at=50.0,
                                                           now=10.0) == 3
    with store.begin() as tx:
        got = {(m.sequence_key, m.number): (m.send_count, m.last_sent_at, m.next_send_at)
               for k in ("k1", "k2") for m in tx.rms_messages.list_for(k)}
    assert got[("k1", 1)] == got[("k1", 3)] == got[("k2", 2)] == (1, 10.0, 50.0)
    assert got[("k1", 2)][0] == got[("k2", 1)][0] == 0


def test_held_is_what_was_received_and_not_yet_delivered(store: StorageManager) -> None:
    from wsrm_plugin.store.api import AckRanges

    with store.begin() as tx:
        for n in (1, 2, 3, 5):
            put(tx, "in", n)
    received = AckRanges.from_ranges([(1, 3), (5, 5)])
    with store.begin() as tx:
        assert tx.invoker.held("in", received) == 4
        assert tx.invoker.claim_next().number == 1
        tx.invoker.mark_delivered("in", 1)
        tx.invoker.mark_delivered("in", 2)
    with store.begin() as tx:
        assert tx.invoker.held("in", received) == tx.invoker.count("in") == 2


def test_a_transaction_sees_its_own_changes_to_the_sequences_it_holds(store: StorageManager) -> None:
    """What a transaction remembers of the sequence rows it locked follows its writes and savepoints."""
    with store.begin() as tx:
        new_rmd(tx)
        new_rms(tx)
    with store.begin() as tx:  # locks in the order RMD, then RMS
        assert tx.rmd.get("s1").received.count == 0
        tx.rmd.record_received("s1", 1)
        assert list(tx.rmd.get("s1").received.ranges) == [(1, 1)]
        assert tx.rms.get("k1").next_number == 1
        enqueue(tx, n=2)
        assert tx.rms.get("k1").next_number == 3
        tx.rms.update("k1", sequence_id="seq-1", started=True)
        assert tx.rms.get("k1").sequence_id == "seq-1"
        with pytest.raises(RuntimeError):
            with tx.savepoint():
                tx.rmd.record_received("s1", 2)
                enqueue(tx, n=1, last=True)
                assert tx.rms.get("k1").last_message and tx.rms.get("k1").next_number == 4
                raise RuntimeError("undone")
        assert tx.rms.get("k1").next_number == 3 and not tx.rms.get("k1").last_message
        assert list(tx.rmd.get("s1").received.ranges) == [(1, 1)]
        assert enqueue(tx, n=1)[0].number == 3
    with store.begin() as tx:
        tx.rmd.delete("s1")
        assert tx.rmd.get("s1") is None
        assert tx.rms.get("k1").next_number == 4


def test_oldest_unacked_is_when_the_first_message_not_acknowledged_was_enqueued(store: StorageManager) -> None:
    started(store, messages=2)
    with store.begin() as tx:
        first, second = (tx.rms_messages.get("k1", n).created_at for n in (1, 2))
        assert tx.rms_messages.oldest_unacked("k1") == min(first, second)
        tx.rms_messages.mark_acked("k1", [(1, 1)])
        assert tx.rms_messages.oldest_unacked("k1") == second
        tx.rms_messages.mark_acked("k1", [(2, 2)])
        assert tx.rms_messages.oldest_unacked("k1") is None
        assert tx.rms_messages.oldest_unacked("no-such-sequence") is None


def test_has_unacked_says_whether_a_sequence_is_done(store: StorageManager) -> None:
    started(store, messages=2)
    with store.begin() as tx:
        assert tx.rms_messages.has_unacked("k1")
        tx.rms_messages.mark_acked("k1", [(1, 1)])
        assert tx.rms_messages.has_unacked("k1")
        tx.rms_messages.mark_acked("k1", [(2, 2)])
        assert not tx.rms_messages.has_unacked("k1")
        assert not tx.rms_messages.has_unacked("no-such-sequence")
