"""The RM destination's statements: destination sequences (``rmd_sequence``), with the
received numbers kept as compact ranges text.
"""

from __future__ import annotations

from typing import Any

from .. import api
from ..api import (
    RANK_RMD,
    DuplicateSequenceError,
    RmdSequence,
    UnknownSequenceError,
    _now,
)
from .rows import _RMD_COLS, _cols, _rmd
from .statements import _prefix, _rmd_assignments
from .transaction import SqlTransaction

_SELECT_RMD = f"SELECT {_cols(_RMD_COLS)} FROM rmd_sequence WHERE sequence_id = ?"


#: ``StorageManager.foresee_in_order``'s read: the sequence's row if it received exactly
#: 1..n-1 (``received`` is that prefix's text) and is open, its messages delivered exactly
#: 1..n-1 and none buffered.
_FORESEE = (f"SELECT {_cols(_RMD_COLS)} FROM rmd_sequence WHERE sequence_id = ? AND received = ? "
            "AND NOT closed AND NOT terminated AND last_number IS NULL "
            "AND EXISTS (SELECT 1 FROM invoker_sequence WHERE sequence_id = ? AND delivered_upto = ? "
            "AND delivered = ?) AND NOT EXISTS (SELECT 1 FROM invoker_message WHERE sequence_id = ?)")


def foresee_in_order(conn: Any, sequence_id: str, number: int) -> RmdSequence | None:
    """``StorageManager.foresee_in_order`` on ``conn``, a connection outside any transaction
    (SQLite in WAL mode: the statement reads the last committed state, whoever holds the file)."""
    if number < 2:  # a sequence's first message: its invoker row may not exist yet
        return None
    before = _prefix(number - 1)
    row = conn.execute(_FORESEE, (sequence_id, before, sequence_id, number - 1, before, sequence_id)).fetchone()
    return None if row is None else _rmd(row)


class _Rmd(api.RmdSequenceManager):
    _tx: SqlTransaction

    def create(self, sequence_id: str, *, acks_to: str, rm_version: str, wsa_version: str,
               principal: str | None = None, offered_id: str | None = None,
               expires: float | None = None, now: float | None = None) -> RmdSequence:
        api.check_key(sequence_id, "sequence id")
        tx = self._tx
        tx.lock(RANK_RMD, sequence_id)
        t = _now(now)
        tx.capture_key("rmd_sequence", sequence_id)
        n = tx.write(
            "INSERT INTO rmd_sequence (sequence_id, acks_to, rm_version, wsa_version, principal, "
            "offered_id, expires, created_at, last_activity) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (sequence_id) DO NOTHING",
            (sequence_id, acks_to, rm_version, wsa_version, principal, offered_id, expires, t, t))
        if n == 0:
            raise DuplicateSequenceError(f"an RMD sequence {sequence_id!r} already exists")
        return self.require(sequence_id)

    def get(self, sequence_id: str) -> RmdSequence | None:
        tx = self._tx
        return tx.locked_sequence(RANK_RMD, tx.held_rmd, sequence_id, _SELECT_RMD, _rmd)

    def read(self, sequence_id: str) -> RmdSequence | None:
        tx = self._tx
        if not tx.lazy_begin or tx.begun:  # SQLite (its file is the lock), or a transaction under way
            return self.get(sequence_id)
        row = tx.one(_SELECT_RMD, (sequence_id,))
        return _rmd(row) if row is not None else None

    def _set(self, sequence_id: str, changes: dict[str, Any]) -> RmdSequence:
        tx = self._tx
        tx.capture_key("rmd_sequence", sequence_id)
        sets, values = _rmd_assignments(changes)
        rows = tx.write_all(f"UPDATE rmd_sequence SET {sets} "
                            f"WHERE sequence_id = ? RETURNING {_cols(_RMD_COLS)}", [*values, sequence_id])
        if not rows:
            raise UnknownSequenceError("RMD", sequence_id)
        seq = tx.held_rmd[sequence_id] = _rmd(rows[0])
        return seq

    def record_received(self, sequence_id: str, number: int, *, last: bool = False,
                        now: float | None = None) -> bool:
        seq, changes = self._receipt(sequence_id, number, last=last, now=now)
        self._set(sequence_id, changes)
        return changes["received"] is not seq.received

    def update(self, sequence_id: str, **changes: Any) -> RmdSequence:
        RmdSequence.check_changes(changes)
        seq = self.require(sequence_id)
        return self._set(sequence_id, changes) if changes else seq

    def request_ack(self, sequence_id: str, due_at: float | None = None) -> RmdSequence:
        seq = self.require(sequence_id)
        due = _now(due_at)
        if seq.ack_due_at is not None and seq.ack_due_at <= due:
            return seq
        return self._set(sequence_id, {"ack_due_at": due})

    def ack_sent(self, sequence_id: str) -> RmdSequence:
        self.require(sequence_id)
        return self._set(sequence_id, {"ack_due_at": None})

    def needing_ack(self, now: float | None = None, limit: int = 100) -> list[RmdSequence]:
        rows = self._tx.all(
            f"SELECT {_cols(_RMD_COLS)} FROM rmd_sequence WHERE ack_due_at IS NOT NULL "
            "AND ack_due_at <= ? ORDER BY ack_due_at, sequence_id LIMIT ?", (_now(now), limit))
        return [_rmd(r) for r in rows]

    def list_all(self) -> list[RmdSequence]:
        rows = self._tx.all(f"SELECT {_cols(_RMD_COLS)} FROM rmd_sequence "
                            "ORDER BY created_at, sequence_id")
        return [_rmd(r) for r in rows]

    def open_ids(self, principal: str | None = None) -> list[str]:
        if principal is None:
            rows = self._tx.all("SELECT sequence_id FROM rmd_sequence WHERE NOT terminated")
        else:
            rows = self._tx.all("SELECT sequence_id FROM rmd_sequence WHERE NOT terminated AND principal = ?",
                                (principal,))
        return [r[0] for r in rows]

    def delete(self, sequence_id: str) -> None:
        self.require(sequence_id)
        tx = self._tx
        tx.capture_key("rmd_sequence", sequence_id)
        tx.write("DELETE FROM rmd_sequence WHERE sequence_id = ?", (sequence_id,))
