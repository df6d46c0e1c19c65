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
             "purged_retransmissions")
_MSG_COLS = ("seq_key", "number", "message_id", "action", "soap_version", "payload", "last",
             "reply_callback", "reply_context", "reply_pending", "send_count", "next_send_at",
             "last_sent_at", "acked", "created_at", "retry_at")
_RMD_COLS = ("sequence_id", "acks_to", "rm_version", "wsa_version", "principal", "offered_id",
             "received", "last_number", "closed", "terminated", "ack_due_at", "expires",
             "created_at", "last_activity")
#: the columns an enqueue writes (the key first)
_ENQUEUE_COLS = ("seq_key", "number", "message_id", "action", "soap_version", "payload", "last",
                 "reply_callback", "reply_context", "reply_pending", "next_send_at", "created_at",
                 "send_count", "last_sent_at")
_BUF_COLS = ("sequence_id", "number", "message_id", "action", "soap_version", "payload",
             "reply_to", "received_at", "attempts", "retry_cycle", "next_attempt_at", "last_error")
_POISON_COLS = ("sequence_id", "number", "message_id", "action", "soap_version", "payload",
                "reply_to", "received_at", "total_attempts", "cycles", "last_error", "poisoned_at",
                "held")

#: Primary keys, for undo capture.
PRIMARY_KEYS = {
    "rms_sequence": ("seq_key",),
    "rms_message": ("seq_key", "number"),
    "rms_payload": ("seq_key", "number"),
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
def msg_cols(d: Dialect, alias: str = "") -> str:
    """The columns of ``rms_message`` rows (:data:`_MSG_COLS`), the payload read from
    ``rms_payload`` where the dialect keeps it apart (``alias`` names the message table, or
    nothing in a statement on ``rms_message`` alone).  Rows written before that table was
    made have theirs inline, and no row in it."""
    if not d.payload_apart:
        return _cols(_MSG_COLS, alias)
    m = alias or "rms_message"
    payload = (f"COALESCE((SELECT p.payload FROM rms_payload p WHERE p.seq_key = {m}.seq_key "
               f"AND p.number = {m}.number), {m}.payload)")
    return ", ".join(payload if c == "payload" else f"{m}.{c}" for c in _MSG_COLS)


def _blob(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _rms(row: Sequence[Any]) -> RmsSequence:
    v = dict(zip(_RMS_COLS, row, strict=True))
    for b in _RMS_BOOLS:
        v[b] = bool(v[b])
    v["key"] = v.pop("seq_key")
    v["next_number"] = v.pop("highest_number") + 1
    return RmsSequence(**v)


def _msg(row: Sequence[Any]) -> RmsMessage:
    v = dict(zip(_MSG_COLS, row, strict=True))
    v["sequence_key"] = v.pop("seq_key")
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
