"""Rows to records and back: the column lists of each table and the functions that turn a
fetched row into the store API's frozen records.

Kept in one place so that a column added by a migration is added to its SELECTs and its
record together.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from .. import api
from .dialect import Dialect
from ..api import (
    BufferedMessage,
    RmdSequence,
    RmsMessage,
    RmsSequence,
)

_RMS_COLS = ("seq_key", "target", "acks_to", "rm_version", "wsa_version", "offered_id",
             "sequence_id", "started", "last_message", "last_number", "close_sent", "closed",
             "terminate_sent", "faulted", "fault_reason", "highest_number", "control_attempts",
             "next_control_at", "expires", "created_at", "last_activity",
             "purged_retransmissions", "id")
#: ``seq`` is the sequence's ``rms_sequence.id`` (schema version 10): a statement that reads
#: messages of one sequence gives :func:`_msg` the sequence's key; one that reads several
#: sequences' reads their key in its place (``key`` of :func:`msg_cols`)
_MSG_COLS = ("seq", "number", "message_id", "action", "soap_version", "payload", "last",
             "reply_callback", "reply_context", "reply_pending", "send_count", "next_send_at",
             "last_sent_at", "acked", "created_at", "retry_at")
_RMD_COLS = ("sequence_id", "acks_to", "rm_version", "wsa_version", "principal", "offered_id",
             "received", "last_number", "closed", "terminated", "ack_due_at", "expires",
             "created_at", "last_activity")
#: the columns an enqueue writes (the sequence's id first); ``awaits_reply`` is ``reply_pending``
#: as enqueued, never changed after (schema version 13: the message id's index holds only those)
_ENQUEUE_COLS = ("seq", "number", "message_id", "action", "soap_version", "payload", "last",
                 "reply_callback", "reply_context", "reply_pending", "awaits_reply", "next_send_at",
                 "created_at", "send_count", "last_sent_at")
_BUF_COLS = ("sequence_id", "number", "message_id", "action", "soap_version", "payload",
             "reply_to", "received_at", "attempts", "retry_cycle", "next_attempt_at", "last_error")
_POISON_COLS = ("sequence_id", "number", "message_id", "action", "soap_version", "payload",
                "reply_to", "received_at", "total_attempts", "cycles", "last_error", "poisoned_at",
                "held")

#: Primary keys, for undo capture.
PRIMARY_KEYS = {
    "rms_sequence": ("seq_key",),
    "rms_message": ("seq", "number"),
    "rms_payload": ("seq", "number"),
    "rmd_sequence": ("sequence_id",),
    "invoker_sequence": ("sequence_id",),
    "invoker_message": ("sequence_id", "number"),
    "poison_message": ("sequence_id", "number"),
    "node_condition": ("kind", "subject", "reporter"),
}

_RMS_BOOLS = {"started", "last_message", "close_sent", "closed", "terminate_sent", "faulted"}


@functools.cache
def _cols(cols: tuple[str, ...], alias: str = "") -> str:
    """The column list of a statement; kept, since the statements are built at every call
    (the joins were 60 generator steps per reliable message)."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + c for c in cols)


@functools.cache
def msg_cols(d: Dialect, alias: str = "", key: str = "") -> str:
    """The columns of ``rms_message`` rows (:data:`_MSG_COLS`), the payload read from
    ``rms_payload`` where the dialect keeps it apart (``alias`` names the message table, or
    nothing in a statement on ``rms_message`` alone).  Rows written before that table was
    made have theirs inline, and no row in it.  ``key``: what is read in place of ``seq``
    (the sequence's key, from a join: ``s.seq_key``)."""
    if not d.payload_apart:
        return with_key(_cols(_MSG_COLS, alias), key)
    m = alias or "rms_message"
    payload = (f"COALESCE((SELECT p.payload FROM rms_payload p WHERE p.seq = {m}.seq "
               f"AND p.number = {m}.number), {m}.payload)")
    return with_key(", ".join(payload if c == "payload" else f"{m}.{c}" for c in _MSG_COLS), key)


def with_key(cols: str, key: str) -> str:
    """``cols`` (a list of :data:`_MSG_COLS`, ``seq`` first) with ``key`` read in place of ``seq``."""
    if not key:
        return cols
    _, rest = cols.split(", ", 1)
    return f"{key}, {rest}"


def _blob(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _rms(row: Sequence[Any]) -> RmsSequence:
    v = dict(zip(_RMS_COLS, row, strict=True))
    for b in _RMS_BOOLS:
        v[b] = bool(v[b])
    v["key"] = v.pop("seq_key")
    v["store_id"] = v.pop("id")
    v["next_number"] = v.pop("highest_number") + 1
    return RmsSequence(**v)


def _msg(row: Sequence[Any], key: str | None = None) -> RmsMessage:
    """The message of ``row``, of sequence ``key``; without ``key``, the row read its sequence's key in
    place of ``seq`` (see :data:`_MSG_COLS`)."""
    v = dict(zip(_MSG_COLS, row, strict=True))
    seq = v.pop("seq")
    if key is None:
        if not isinstance(seq, str):
            raise TypeError(f"an rms_message row read without its sequence's key: {seq!r}")
        key = seq
    v["sequence_key"] = key
    retry_at = v.pop("retry_at")
    if retry_at is not None:  # sent once: due again then (next_send_at is left as it was)
        v["next_send_at"] = retry_at
    v["payload"] = _blob(v["payload"])
    v["reply_context"] = _blob(v["reply_context"])
    for b in ("last", "reply_pending", "acked"):
        v[b] = bool(v[b])
    return RmsMessage(**v)


def _rmd(row: Sequence[Any]) -> RmdSequence:
    v = dict(zip(_RMD_COLS, row, strict=True))
    v["received"] = api.parse_ranges(v["received"])
    v["closed"] = bool(v["closed"])
    v["terminated"] = bool(v["terminated"])
    return RmdSequence(**v)


def _buf(row: Sequence[Any]) -> BufferedMessage:
    v = dict(zip(_BUF_COLS, row, strict=True))
    v["payload"] = _blob(v["payload"])
    v["cycle"] = v.pop("retry_cycle")
    return BufferedMessage(**v)


def _poison(row: Sequence[Any]) -> api.PoisonMessage:
    v = dict(zip(_POISON_COLS, row, strict=True))
    v["payload"] = _blob(v["payload"])
    v["held"] = bool(v["held"])
    return api.PoisonMessage(**v)


def _waiting(msg: BufferedMessage | None, now: float | None) -> BufferedMessage | None:
    """``msg`` unless it waits for a retry later than ``now`` (no ``now``: never)."""
    if msg is None or now is None or msg.next_attempt_at is None or msg.next_attempt_at <= now:
        return msg
    return None
