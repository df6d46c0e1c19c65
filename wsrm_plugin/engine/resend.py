"""Sending a faulted sequence's messages again, on a new sequence, once the cause is fixed.

A faulted source sequence keeps its unacknowledged messages in the store
(:meth:`Source.report_and_release` without an ``on_sequence_fault`` hook),
and no retry will ever take them: the peer refused the sequence, or the retry
budget ran out.  When the operator has fixed the cause (the server is back,
WS-RM is switched on), :func:`resend_faulted` moves them, in one store
transaction, to a new sequence for the same target and key, and deletes the
faulted one: they keep their order, payload, wsa:MessageID and reply
callback, so a reply still finds its caller's callback.  The running
engine's sender then opens the new sequence and sends them.

A message the destination received but whose acknowledgement was lost is
sent again too, on a sequence the destination has never seen: it cannot
recognise the duplicate.  Resending is an operator's decision for that
reason (at least once for those messages, never lost).

Used by :meth:`ReliableEngine.resend_faulted` and ``wsrm resend``.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from ..store import StorageManager, StoreTransaction
from ..wire import RM10
from .logs import for_sequence
from .source import SendReceipt, SequenceKey

__all__ = ["ResendResult", "resend_faulted", "faulted_sequences", "find_faulted"]

log = logging.getLogger(__name__)

_LAST_MESSAGE_ACTION = RM10.action("LastMessage")


@dataclass(frozen=True)
class ResendResult:
    """What a resend did: the faulted sequence it emptied and where its messages went."""

    faulted_key: str
    faulted_id: str | None
    reason: str | None
    new_key: str | None
    receipts: tuple[SendReceipt, ...]


def faulted_sequences(store: StorageManager) -> list[tuple[str, str | None, str | None]]:
    """(store key, sequence id, fault reason) of every faulted source sequence in ``store``."""
    with store.begin() as tx:
        return [(s.key, s.sequence_id, s.fault_reason) for s in tx.rms.list_all() if s.faulted]


def find_faulted(tx: StoreTransaction, sequence: str) -> str:
    """The store key of the faulted source sequence named ``sequence`` (its id, or its store key)."""
    candidates = [s for s in tx.rms.list_all() if sequence in (s.key, s.sequence_id)]
    if not candidates:
        raise LookupError(f"no source sequence {sequence!r} in the store (see `wsrm status`)")
    seq = candidates[0]
    if not seq.faulted:
        raise ValueError(f"sequence {sequence!r} is not faulted: its messages are still being sent")
    return seq.key


def resend_faulted(store: StorageManager, sequence: str) -> ResendResult:
    """Move the unacknowledged messages of faulted sequence ``sequence`` to a new sequence.

    ``sequence`` is the sequence's identifier or its store key (``wsrm status``
    shows the key of a sequence the peer never opened).  Raises LookupError
    for an unknown sequence, ValueError for one that is not faulted or that
    this node cannot re-open (a reply sequence accepted from a peer's Offer).
    """
    with store.begin() as tx:
        key = find_faulted(tx, sequence)
        old = tx.rms.require(key)
        parsed = SequenceKey.decode(key)
        if parsed is None:
            raise ValueError(f"sequence {sequence!r} carries replies on a sequence the peer offered; only the "
                             "peer can open a new one (its requests will be answered again when it retransmits)")
        messages = [m for m in tx.rms_messages.list_for(key)
                    if not m.acked and m.action != _LAST_MESSAGE_ACTION]
        generation = max((p.generation for p in (SequenceKey.decode(s.key) for s in tx.rms.list_all())
                          if p is not None and (p.target, p.key, p.offered) == (parsed.target, parsed.key,
                                                                                parsed.offered)),
                         default=parsed.generation)
        new_key = None
        receipts: list[SendReceipt] = []
        if messages:
            new_key = SequenceKey(parsed.target, parsed.key, generation + 1, parsed.offered).encode()
            tx.rms.create(new_key, target=old.target, acks_to=old.acks_to, rm_version=old.rm_version,
                          wsa_version=old.wsa_version,
                          offered_id=f"urn:uuid:{uuid.uuid4()}" if parsed.offered else None)
            for m in messages:
                moved = tx.rms_messages.enqueue(new_key, m.payload, action=m.action, soap_version=m.soap_version,
                                                message_id=m.message_id, reply_callback=m.reply_callback,
                                                reply_context=m.reply_context)
                receipts.append(SendReceipt(new_key, moved.number, m.message_id))
        tx.rms.delete(key)
    for_sequence(log, old.sequence_id, key=key).warning(
        "faulted sequence (%s) resent: %d message(s) moved to a new sequence %s",
        old.fault_reason, len(receipts), new_key)
    return ResendResult(key, old.sequence_id, old.fault_reason, new_key, tuple(receipts))
