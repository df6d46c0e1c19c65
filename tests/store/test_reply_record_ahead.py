"""A receipt runs the store call that follows it in its own round trip (PostgreSQL): a client's
record of a reply marks its request; a service's receipt of a request applies the acknowledgement
that rode on it.

``receive_in_order(..., answering=...)``: the reply's sequence locked, the reply received and
taken, then the request marked answered and the acknowledgement riding on the reply applied
(``mark_answered_acknowledging``), each only if the reply was taken; that call then answers from
what the round trip wrote, without a statement.  The reply's record on the caller's path is one
round trip and its COMMIT, where it was two and the COMMIT.  ``acknowledging`` likewise runs
``acknowledge_sequence`` when the message is received (taken or not): the service's receipt of a
request is one round trip less.  The other stores ignore both (the caller makes the call as
before): the outcomes are the same everywhere.
"""

from __future__ import annotations

from typing import Any

import pytest

from wsrm_plugin.statemachine.ackranges import AckRanges
from wsrm_plugin.store import StorageManager
from wsrm_plugin.store.api import CommitDeclined, InvalidAcknowledgementError, StoreError

from .test_managers import awaiting_requests, started
from .test_statements import statements
from .test_take_next import PG_ONLY, _delivered, _receive, _received, _rmd

#: the reply (message 1 of the client's reply sequence "s" came already) answers request urn:r1,
#: and the acknowledgement on it names request 1 of "seq-1"
ANSWERING = ("urn:r1", "seq-1", ((1, 1),), True)


def _requests(store: StorageManager) -> None:
    """Three requests of "seq-1" (an offering sequence), sent, each waiting for its reply; the
    reply sequence "s" has received (and delivered) its first message."""
    with store.begin() as tx:
        awaiting_requests(tx)
    _rmd(store, "s")
    assert _receive(store, 1)


def _states(store: StorageManager) -> list[tuple[int, bool, bool]]:
    with store.begin() as tx:
        return [(m.number, m.reply_pending, m.acked) for m in tx.rms_messages.list_for("k1")]


def test_a_replys_receipt_marks_its_request_in_its_own_round_trip(store: StorageManager) -> None:
    """One round trip on PostgreSQL for both (was two); the same outcome on every store."""
    _requests(store)
    now = _received(store, "s").last_activity + 10.0  # later than a second after the one stored
    with store.begin() as tx:
        seen = statements(tx) if hasattr(tx, "execute") else []
        guessed = tx.receive_in_order("s", 2, now=now, answering=ANSWERING)
        answered, applied = tx.rms_messages.mark_answered_acknowledging(
            "urn:r1", "seq-1", [(1, 1)], keep_offered_awaiting=True)
        assert answered == ("k1", 1, False)
        seq, newly, pending = applied
        assert (seq.key, newly, pending) == ("k1", [1], True)
        assert tx.rms.get("k1").sequence_id == "seq-1"  # held: no statement
        if store.url.startswith("postgresql"):
            assert len(seen) == 1, seen
            before, taken = guessed
            assert taken and before.received == AckRanges.of([1])
            assert tx.rmd.require("s").received == AckRanges.from_ranges([(1, 2)])  # held: no statement
            assert len(seen) == 1, seen
    assert _states(store) == [(2, True, False), (3, True, False)]  # 1 answered and acknowledged: purged
    if store.url.startswith("postgresql"):
        assert _received(store, "s").received == AckRanges.from_ranges([(1, 2)])
        assert _received(store, "s").last_activity == now
        assert _delivered(store, "s") == AckRanges.from_ranges([(1, 2)])


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_a_wrong_guess_marks_nothing(store: StorageManager) -> None:
    """After a gap the receipt records nothing and the request stays waiting: the caller's mark,
    made the general way, runs its own statements."""
    _requests(store)
    with store.begin() as tx:
        assert tx.receive_in_order("s", 3, answering=ANSWERING) is None
        assert tx.ran_ahead == {}
        assert tx.rmd.require("s").received == AckRanges.of([1])
        seen = statements(tx)
        answered, applied = tx.rms_messages.mark_answered_acknowledging(
            "urn:r1", "seq-1", [(1, 1)], keep_offered_awaiting=True)
        assert len(seen) == 1 and answered == ("k1", 1, False) and applied is not None
    assert _states(store) == [(2, True, False), (3, True, False)]


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_a_reply_received_and_not_taken_marks_nothing(store: StorageManager) -> None:
    """Behind a buffered message the reply is received, not taken (its caller buffers it, and
    its delivery marks the request later): the mark did not run."""
    _requests(store)
    with store.begin() as tx:  # 2 received and buffered
        tx.rmd.get("s")
        tx.rmd.record_received("s", 2)
        assert tx.invoker.put("s", 2, b"<m/>", action="urn:a", soap_version="urn:s")
    with store.begin() as tx:
        guessed = tx.receive_in_order("s", 3, answering=("urn:r1", "seq-1", ((1, 1),), True))
        assert guessed is not None and guessed[1] is False
        assert tx.ran_ahead == {}
    assert _states(store) == [(1, True, False), (2, True, False), (3, True, False)]
    assert _received(store, "s").received == AckRanges.from_ranges([(1, 3)])


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_a_mark_run_ahead_and_never_taken_is_never_committed(store: StorageManager) -> None:
    """Its caller made no mark after all: the commit refuses, and nothing of the transaction is
    written (a mark no one accounted for would leave a request answered without its reply)."""
    _requests(store)
    with pytest.raises(StoreError, match="never taken"), store.begin() as tx:
        assert tx.receive_in_order("s", 2, answering=ANSWERING) is not None
    assert _states(store) == [(1, True, False), (2, True, False), (3, True, False)]
    assert _received(store, "s").received == AckRanges.of([1])


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_a_receipt_refused_after_its_mark_leaves_nothing(store: StorageManager) -> None:
    """The caller checks the reply after the round trip wrote it and the mark, and rolls back."""
    _requests(store)
    with pytest.raises(RuntimeError), store.begin() as tx:
        assert tx.receive_in_order("s", 2, answering=ANSWERING) is not None
        raise RuntimeError("refused after all")
    assert _states(store) == [(1, True, False), (2, True, False), (3, True, False)]
    assert _received(store, "s").received == AckRanges.of([1])
    assert _delivered(store, "s") == AckRanges.of([1])


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_a_mark_ahead_inside_a_savepoint_rolled_back_is_forgotten(store: StorageManager) -> None:
    """A savepoint rolled back undoes the receipt and the mark: the transaction forgets the mark's
    row (the commit goes through), and a mark made after it runs its own statements."""
    _requests(store)
    with store.begin() as tx:
        with pytest.raises(RuntimeError), tx.savepoint():
            assert tx.receive_in_order("s", 2, answering=ANSWERING) is not None
            raise RuntimeError("this part refused")
        assert tx.ran_ahead == {}
        answered, _ = tx.rms_messages.mark_answered_acknowledging(
            "urn:r1", "seq-1", [(1, 1)], keep_offered_awaiting=True)
        assert answered == ("k1", 1, False)
    assert _states(store) == [(2, True, False), (3, True, False)]
    assert _received(store, "s").received == AckRanges.of([1])


# -- the acknowledgement riding on a received message, applied in the receipt's round trip ---------

#: the acknowledgement on the request (message 2 of "s") names messages 1 and 2 of "seq-1"
ACKNOWLEDGING = ("seq-1", ((1, 2),), False)


def _sent(store: StorageManager, messages: int = 3) -> None:
    """``messages`` messages of "seq-1" (a service's replies, say), sent; "s" has received its first."""
    started(store, messages=messages)
    _rmd(store, "s")
    assert _receive(store, 1)


def test_a_receipt_applies_the_acknowledgement_riding_on_it_in_its_own_round_trip(store: StorageManager) -> None:
    """One round trip on PostgreSQL for the receipt and the acknowledgement (was two); the same
    outcome on every store."""
    _sent(store)
    with store.begin() as tx:
        seen = statements(tx) if hasattr(tx, "execute") else []
        guessed = tx.receive_in_order("s", 2, now=300.0, acknowledging=ACKNOWLEDGING)
        seq, done = tx.rms_messages.acknowledge_sequence("seq-1", [(1, 2)], keep_offered_awaiting=False)
        assert seq.key == "k1" and done == ([1, 2], True)
        if store.url.startswith("postgresql"):
            assert guessed is not None and guessed[1]
            assert len(seen) == 1, seen
    with store.begin() as tx:
        assert [m.number for m in tx.rms_messages.list_for("k1")] == [3]


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_a_receipt_that_does_not_take_its_message_still_applies_the_acknowledgement(store: StorageManager) -> None:
    """Behind a buffered message (received, not taken: buffered by its caller) the acknowledgement
    is applied all the same, as the caller applies it after any receipt."""
    _sent(store)
    with store.begin() as tx:
        tx.rmd.get("s")
        tx.rmd.record_received("s", 2)
        assert tx.invoker.put("s", 2, b"<m/>", action="urn:a", soap_version="urn:s")
    with store.begin() as tx:
        seen = statements(tx)
        assert tx.receive_in_order("s", 3, acknowledging=ACKNOWLEDGING)[1] is False
        assert tx.rms_messages.acknowledge_sequence("seq-1", [(1, 2)])[1] == ([1, 2], True)
        assert len(seen) == 1, seen


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_a_wrong_guess_applies_no_acknowledgement(store: StorageManager) -> None:
    _sent(store)
    with store.begin() as tx:
        assert tx.receive_in_order("s", 3, acknowledging=ACKNOWLEDGING) is None
        assert tx.ran_ahead == {}
        seen = statements(tx)
        assert tx.rms_messages.acknowledge_sequence("seq-1", [(1, 2)])[1] == ([1, 2], True)
        assert len(seen) == 1, seen  # its own round trip


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_a_wrong_acknowledgement_run_ahead_is_refused_and_writes_nothing(store: StorageManager) -> None:
    """It names a message never sent: refused as when it runs alone, nothing of it written, and
    the receipt commits."""
    _sent(store)
    with store.begin() as tx:
        tx.rms_messages.enqueue("k1", b"<m/>", action="urn:op", soap_version="1.1", message_id="urn:unsent")
    with store.begin() as tx:
        assert tx.receive_in_order("s", 2, acknowledging=("seq-1", ((1, 4),), False)) is not None
        with pytest.raises(InvalidAcknowledgementError):
            tx.rms_messages.acknowledge_sequence("seq-1", [(1, 4)])
    with store.begin() as tx:
        assert [(m.number, m.acked) for m in tx.rms_messages.list_for("k1")] == \
            [(1, False), (2, False), (3, False), (4, False)]
    assert _received(store, "s").received == AckRanges.from_ranges([(1, 2)])


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_an_acknowledgement_run_ahead_and_never_taken_is_never_committed(store: StorageManager) -> None:
    _sent(store)
    with pytest.raises(StoreError, match="never taken"), store.begin() as tx:
        assert tx.receive_in_order("s", 2, acknowledging=ACKNOWLEDGING) is not None
    with store.begin() as tx:
        assert [m.number for m in tx.rms_messages.list_for("k1")] == [1, 2, 3]
    assert _received(store, "s").received == AckRanges.of([1])


#: what the caller of the reply's record would check of the reply sequence "s" after its receipt
#: (its RM version, the principal sending, the AcksTo addresses that ask for no acknowledgement)
EXPECTED = ("urn:rm", None, ("http://a",))


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
def test_a_replys_record_commits_in_its_own_round_trip(store: StorageManager) -> None:
    """``commits``: the receipt, the mark and the acknowledgement, and the commit, are one round
    trip (a COMMIT of its own after it before: two); the transaction has nothing left to send,
    and it returned before its flush (a reader waits for the disk: ``wait_for_disk``)."""
    _requests(store)
    with store.begin() as tx:
        seen = statements(tx)
        before, taken = tx.receive_in_order("s", 2, now=300.0, answering=ANSWERING, commits=EXPECTED)
        answered, applied = tx.rms_messages.mark_answered_acknowledging(
            "urn:r1", "seq-1", [(1, 1)], keep_offered_awaiting=True)
        assert taken and before.received == AckRanges.of([1])
        assert answered == ("k1", 1, False) and applied is not None and applied[1:] == ([1], True)
        assert len(seen) == 1 and tx.committed_alone and not tx.begun, seen
        assert store.late_commits.owed()  # its commit returned before its flush
        tx.wait_for_disk_later()
    tx.wait_for_disk()
    assert not store.late_commits.owed()
    assert _states(store) == [(2, True, False), (3, True, False)]
    assert _received(store, "s").received == AckRanges.from_ranges([(1, 2)])
    assert _delivered(store, "s") == AckRanges.from_ranges([(1, 2)])


@pytest.mark.parametrize("store_url", PG_ONLY, indirect=True)
@pytest.mark.parametrize("expected, why", [
    (("urn:rm-other", None, ("http://a",)), "the caller would refuse the sequence: another RM version"),
    (("urn:rm", None, ("http://anonymous",)), "the caller would request an acknowledgement after it"),
    (("urn:rm", None, ("http://a",)), "the acknowledgement riding on the reply names a number never sent"),
])
def test_a_replys_record_that_cannot_commit_alone_goes_as_without_it(store: StorageManager, expected: Any,
                                                                     why: str) -> None:
    """When anything after the receipt would still have to write or refuse, the round trip
    writes nothing (its last statement fails on purpose, rolling back its query string's
    transaction) and says so (``CommitDeclined``); the record goes again without ``commits``: a
    round trip more, the same outcome, and the transaction open for the caller's writes and
    COMMIT."""
    _requests(store)
    ranges = ((1, 1),) if "never sent" not in why else ((1, 4),)
    with store.begin() as tx:
        seen = statements(tx)
        with pytest.raises(CommitDeclined):
            tx.receive_in_order("s", 2, now=300.0, answering=("urn:r1", "seq-1", ranges, True), commits=expected)
        assert len(seen) == 1 and not tx.begun and not tx.committed_alone, seen  # nothing of it happened
        guessed = tx.receive_in_order("s", 2, now=300.0, answering=("urn:r1", "seq-1", ranges, True))
        assert len(seen) == 2 and tx.begun and not tx.committed_alone, seen
        assert guessed is not None and guessed[1]
        answered, applied = tx.rms_messages.mark_answered_acknowledging(
            "urn:r1", "seq-1", list(ranges), keep_offered_awaiting=True)
        assert answered == ("k1", 1, False)
        if "never sent" in why:
            assert applied is None  # not written: the caller acknowledges the request the general way
            tx.rms_messages.acknowledge("k1", [(1, 1)], keep_awaiting=True)
    assert _states(store) == [(2, True, False), (3, True, False)]
    assert _received(store, "s").received == AckRanges.from_ranges([(1, 2)])
