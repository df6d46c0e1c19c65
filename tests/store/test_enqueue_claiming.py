"""A caller's request claimed by the step that enqueues it (``enqueue_claiming``), on the stores
that do both at once: memory and PostgreSQL (SQLite answers None: its caller enqueues, then
claims).  The claim follows :meth:`claim_first_send`'s rule: the request's sequence transmitting
to the caller's target, the message before it acknowledged or purged."""

from __future__ import annotations

import pytest

from wsrm_plugin.store import StorageManager

from .conftest import KINDS
from .test_managers import new_rmd, new_rms, started

pytestmark = pytest.mark.parametrize("store_url", [KINDS[0], KINDS[2]], indirect=True)

TARGET = "http://server/svc"  # new_rms's


def _enqueue_claiming(store: StorageManager, number: int, target: str = TARGET, key: str = "k1"):
    with store.begin() as tx:
        return tx.rms_messages.enqueue_claiming(
            key, b"<req>%d</req>" % number, action="urn:op", soap_version="1.1",
            message_id=f"urn:{key}-{number}", target=target, next_send_at=50.0, rmd_sequence_id="replies-1",
            awaits_reply=True, now=10.0)


def test_the_next_request_in_line_is_claimed_by_its_enqueue(store: StorageManager) -> None:
    started(store, messages=0)
    with store.begin() as tx:
        new_rmd(tx, "replies-1")
        tx.rmd.record_received("replies-1", 1)
    msg, claimed, seq, rmd = _enqueue_claiming(store, 1)
    assert claimed and (msg.number, msg.send_count, msg.payload) == (1, 0, b"<req>1</req>")  # as enqueued
    assert seq.next_number == 2  # as the enqueue left it
    assert rmd.sequence_id == "replies-1" and [tuple(r) for r in rmd.received.ranges] == [(1, 1)]
    with store.begin() as tx:
        sent = tx.rms_messages.get("k1", 1)
        assert (sent.send_count, sent.last_sent_at, sent.reply_pending) == (1, 10.0, True)


def test_a_request_behind_one_still_out_is_enqueued_unclaimed(store: StorageManager) -> None:
    started(store, messages=1)  # message 1 sent, unacknowledged
    msg, claimed, seq, rmd = _enqueue_claiming(store, 2)
    assert (msg.number, claimed, rmd) == (2, False, None)
    with store.begin() as tx:
        assert tx.rms_messages.get("k1", 2).send_count == 0
        tx.rms_messages.acknowledge("k1", [(1, 1)])  # 1 purged: 2 is the caller's to claim now
        assert tx.rms_messages.claim_first_send("k1", 2, next_send_at=50.0) is not None
    msg, claimed, _, _ = _enqueue_claiming(store, 3)
    assert (msg.number, claimed) == (3, False)  # 2 is out
    with store.begin() as tx:
        tx.rms_messages.acknowledge("k1", [(2, 2)])
    msg, claimed, _, _ = _enqueue_claiming(store, 4)
    assert (msg.number, claimed) == (4, False)  # 3, unsent, is still before it


def test_a_request_to_another_target_or_on_a_sequence_not_started_is_enqueued_unclaimed(
        store: StorageManager) -> None:
    started(store, messages=0)
    with store.begin() as tx:
        new_rms(tx, "k2")  # created, not started: no sequence identifier yet
    for key, target in (("k1", "http://elsewhere/svc"), ("k2", TARGET)):
        msg, claimed, _, _ = _enqueue_claiming(store, 1, target, key)
        assert (msg.number, claimed) == (1, False)
        with store.begin() as tx:
            assert tx.rms_messages.get(key, 1).send_count == 0

