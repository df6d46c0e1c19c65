"""The invoker buffer's statements: what was delivered (``invoker_sequence``: ranges, plus
the in-order prefix so a poller finds the next deliverable message in SQL), what waits
to be (``invoker_message``, with each message's delivery history), and the poison store
(``poison_message``).

The delivered ranges stay in a row of their own, not in the sequence's ``rmd_sequence`` row
beside the received ones, though a receipt that delivers on its commit writes both
(``statements._RECEIVE_IN_ORDER_CHECKED``): one UPDATE of one row would cost PostgreSQL 233 k
instructions a message there against the two rows' 286 k (``bench/count_receipt_sql.py``,
16 sequences; the outbox's two INSERTs 153 k).  But a delivery by the invoker's worker holds
its invoker row from its claim to the end of its (two-phase) commit, the application's run
included; in one row with the received ranges, every receipt of that sequence meanwhile (one
out of order too, which only buffers) and every acknowledgement sent for it (``ack_sent``)
would wait for it.  A poison message retried after its sequence was released has an
invoker row and no destination row.  And a version that kept the old table beside the new columns would let a
process still running the old one (a rolling upgrade) deliver from ranges the new one no
longer reads.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from .. import api
from ..api import (
    RANK_INVOKER,
    BufferedMessage,
    InvokerSequence,
    UnknownMessageError,
    _now,
)
from .rows import _BUF_COLS, _POISON_COLS, _buf, _cols, _poison, _waiting
from .statements import _prefix, _take, _take_params
from .large_payloads import COPY_PAYLOAD_AT, cols_leaving_large_payloads, with_large_payloads
from .transaction import SqlTransaction, _in_list

#: How many buffered messages of a sequence a batch of deliveries reads at once.
_READ_AHEAD = 50
#: the columns a put writes, and their binary form for COPY (``SqlTransaction.copy_in``)
_PUT_COLS = ("sequence_id", "number", "message_id", "action", "soap_version", "payload", "reply_to", "received_at")
_PUT_TYPES = ("text", "int8", "text", "text", "text", "bytea", "text", "float8")


def _read_cols(tx: SqlTransaction, alias: str = "") -> str:
    """The columns of buffered messages to read, a payload of ``COPY_PAYLOAD_AT`` bytes or more
    left out (NULL) where the dialect reads those with COPY (``_Invoker._with_payloads``)."""
    return cols_leaving_large_payloads(_BUF_COLS, alias) if tx.d.copy_binary else _cols(_BUF_COLS, alias)


class _Invoker(api.InvokerBufferManager):
    _tx: SqlTransaction

    def _with_payloads(self, msgs: list[BufferedMessage]) -> list[BufferedMessage]:
        """``msgs`` with the large payloads :func:`_read_cols` left out read, by one COPY."""
        return with_large_payloads(self._tx, msgs, "invoker_message", "sequence_id, number",
                                   lambda m: (m.sequence_id, m.number))

    def _lock_sequence(self, sequence_id: str) -> tuple[api.AckRanges, int] | None:
        """Lock the sequence's invoker row; its delivered ranges and in-order prefix."""
        tx = self._tx
        tx.lock(RANK_INVOKER, sequence_id)
        held = tx.held_invoker.get(sequence_id)
        if held is not None:
            return held
        row = tx.one("SELECT delivered, delivered_upto FROM invoker_sequence WHERE sequence_id = ?"
                     + tx.d.for_update, (sequence_id,))
        if row is None:
            return None
        held = tx.held_invoker[sequence_id] = (api.parse_ranges(row[0]), int(row[1]))
        return held

    def put(self, sequence_id: str, number: int, payload: bytes, *, action: str,
            soap_version: str, message_id: str | None = None, reply_to: str | None = None,
            now: float | None = None) -> bool:
        """Buffer a message without locking the sequence's invoker row.

        A delivery holds that row from its claim to the end of its (two-phase)
        commit; a receive that waited for it would serialize reception behind
        delivery, one sequence at a time.  So the delivered ranges are read
        without a lock, and read again after the insert: in READ COMMITTED the
        second read sees any delivery of this number that committed
        meanwhile (an insert that met the row such a delivery was deleting
        waited for it), and the insert is undone.  No read before the insert:
        the destination puts only numbers its received ranges did not have, so
        a delivered one is the rare case, and undoing its insert is cheap.
        """
        api.check_number(number)
        tx = self._tx
        tx.lock(RANK_INVOKER, sequence_id)
        tx.capture_key("invoker_message", sequence_id, number)
        row = (sequence_id, number, message_id, action, soap_version, bytes(payload), reply_to, _now(now))
        if tx.d.copy_binary and tx.undo is None and len(payload) >= COPY_PAYLOAD_AT:
            # as its bytes (see SqlTransaction.copy_in).  COPY has no ON CONFLICT: a row of that
            # number already there (which the destination's lock on the sequence rules out) fails
            # the transaction, and the peer sends the message again
            tx.copy_in("invoker_message", _PUT_COLS, _PUT_TYPES, row)
            n = 1
        elif not tx.d.for_update:  # SQLite: the delivered ranges read in the insert's own statement
            return self._put_reading_delivered(sequence_id, number, row)
        else:
            n = tx.write(
                f"INSERT INTO invoker_message ({_cols(_PUT_COLS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (sequence_id, number) DO NOTHING", row)
        if n == 0:
            return False
        if number in self._delivered(sequence_id, create=True):
            tx.write("DELETE FROM invoker_message WHERE sequence_id = ? AND number = ?",
                     (sequence_id, number))
            return False
        return True

    def _put_reading_delivered(self, sequence_id: str, number: int, row: tuple[Any, ...]) -> bool:
        """:meth:`put` where the transaction holds the whole file (SQLite): nobody delivers
        meanwhile, so the delivered ranges are read in the insert's RETURNING (a statement
        where the read after the insert made two); a sequence without its invoker row yet gets
        it as before."""
        tx = self._tx
        rows = tx.write_all(
            f"INSERT INTO invoker_message ({_cols(_PUT_COLS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (sequence_id, number) DO NOTHING RETURNING "
            "(SELECT 1 FROM invoker_sequence WHERE sequence_id = ?), "
            "(SELECT delivered FROM invoker_sequence WHERE sequence_id = ?)", (*row, sequence_id, sequence_id))
        if not rows:
            return False
        if rows[0][0] is None:
            delivered = self._delivered(sequence_id, create=True)
        else:
            delivered = self._read_delivered[sequence_id] = api.parse_ranges(rows[0][1])
        if number in delivered:
            tx.write("DELETE FROM invoker_message WHERE sequence_id = ? AND number = ?", (sequence_id, number))
            return False
        return True

    def held(self, sequence_id: str, received: api.AckRanges) -> int:
        # what a put of this transaction just read will do: deliveries only lower the count, and
        # a limit check may be a few deliveries behind (a receive is one round trip shorter)
        delivered = self._read_delivered.get(sequence_id)
        if delivered is None:
            delivered = self._delivered(sequence_id, create=False)
        return received.difference(delivered).count

    @functools.cached_property
    def _read_delivered(self) -> dict[str, api.AckRanges]:
        """The delivered ranges this transaction last read, by sequence (see :meth:`held`)."""
        return {}

    def _delivered(self, sequence_id: str, create: bool) -> api.AckRanges:
        """The sequence's delivered ranges as last committed, without a row lock (see :meth:`put`)."""
        tx = self._tx
        sql = "SELECT delivered FROM invoker_sequence WHERE sequence_id = ?"
        row = tx.one(sql, (sequence_id,))
        if row is None and create:
            tx.capture_key("invoker_sequence", sequence_id)
            tx.write("INSERT INTO invoker_sequence (sequence_id) VALUES (?) "
                     "ON CONFLICT (sequence_id) DO NOTHING", (sequence_id,))
            row = tx.one(sql, (sequence_id,))
        delivered = api.parse_ranges(row[0] if row else None)
        self._read_delivered[sequence_id] = delivered
        return delivered

    def _next_row(self, sequence_id: str, in_order: bool, upto: int,
                  now: float | None = None) -> BufferedMessage | None:
        tx = self._tx
        if in_order:
            return _waiting(self._next_in_order(sequence_id, upto), now)
        if now is None:
            row = tx.one(f"SELECT {_read_cols(tx)} FROM invoker_message WHERE sequence_id = ? "
                         "ORDER BY number LIMIT 1", (sequence_id,))
        else:
            row = tx.one(f"SELECT {_read_cols(tx)} FROM invoker_message WHERE sequence_id = ? "
                         "AND (next_attempt_at IS NULL OR next_attempt_at <= ?) ORDER BY number LIMIT 1",
                         (sequence_id, now))
        return self._with_payloads([_buf(row)])[0] if row else None

    def _next_in_order(self, sequence_id: str, upto: int) -> BufferedMessage | None:
        tx = self._tx
        ahead = tx.read_ahead.get(sequence_id)
        if ahead is None:  # the sequence's first message in this transaction: that one only
            tx.read_ahead[sequence_id] = {}
            row = tx.one(f"SELECT {_read_cols(tx)} FROM invoker_message "
                         "WHERE sequence_id = ? AND number = ?", (sequence_id, upto + 1))
            return self._with_payloads([_buf(row)])[0] if row else None
        if upto + 1 not in ahead:  # a second one: a batch, read the next ones at once
            rows = tx.all(f"SELECT {_read_cols(tx)} FROM invoker_message WHERE sequence_id = ? "
                          "AND number BETWEEN ? AND ?", (sequence_id, upto + 1, upto + _READ_AHEAD))
            ahead = tx.read_ahead[sequence_id] = {
                msg.number: msg for msg in self._with_payloads([_buf(r) for r in rows])}
        return ahead.get(upto + 1)

    def next_deliverable(self, sequence_id: str, *, in_order: bool = True,
                         now: float | None = None) -> BufferedMessage | None:
        state = self._lock_sequence(sequence_id)
        if state is None:
            return None
        return self._next_row(sequence_id, in_order, state[1], now)

    def claim_next(self, *, in_order: bool = True, now: float | None = None) -> BufferedMessage | None:
        tx = self._tx
        tx.lock(RANK_INVOKER, "claim")
        now = _now(now)
        due = "(b.next_attempt_at IS NULL OR b.next_attempt_at <= ?)"
        if in_order:
            # The message itself comes with its sequence's row: one round trip per claim, not two.
            # PostgreSQL looks each sequence's next message up by key (LATERAL ... LIMIT 1, which
            # it cannot flatten into a join): as a join, its planner (the statistics of these busy
            # tables are always stale) hashed every buffered message, payloads and all, per claim.
            if tx.d.lateral:
                source = (f"FROM invoker_sequence s CROSS JOIN LATERAL (SELECT {_cols(_BUF_COLS)} "
                          "FROM invoker_message WHERE sequence_id = s.sequence_id "
                          "AND number = s.delivered_upto + 1 LIMIT 1) b")
            else:
                source = ("FROM invoker_sequence s JOIN invoker_message b ON b.sequence_id = s.sequence_id "
                          "AND b.number = s.delivered_upto + 1")
            row = tx.one(
                f"SELECT s.sequence_id, s.delivered_upto, s.delivered, {_read_cols(tx, 'b')} {source} "
                f"WHERE {due} ORDER BY b.received_at, s.sequence_id LIMIT 1" + tx.d.lock_of("s"), (now,))
            if row is None:
                return None
            tx.lock(RANK_INVOKER, row[0])
            upto = int(row[1])
            tx.held_invoker[row[0]] = (api.parse_ranges(row[2]), upto)
            msg = self._with_payloads([_buf(row[3:])])[0]
            if msg.number != upto + 1:
                # A delivery of the sequence committed between this statement's snapshot and its
                # lock: PostgreSQL locked the row's new version and re-checked the statement's
                # conditions against it, but not the LATERAL subquery's, so the message came
                # from the old snapshot and was just delivered.  The row is ours now: read again.
                return self._next_row(row[0], True, upto, now)
            tx.read_ahead.setdefault(row[0], {})  # as _next_in_order after a sequence's first message
            return msg
        else:
            row = tx.one(
                "SELECT s.sequence_id, s.delivered_upto, s.delivered FROM invoker_sequence s WHERE EXISTS "
                f"(SELECT 1 FROM invoker_message b WHERE b.sequence_id = s.sequence_id AND {due}) "
                "ORDER BY s.sequence_id LIMIT 1" + tx.d.lock_of("s"), (now,))
        if row is None:
            return None
        tx.lock(RANK_INVOKER, row[0])
        tx.held_invoker[row[0]] = (api.parse_ranges(row[2]), int(row[1]))
        return self._next_row(row[0], in_order, int(row[1]), now)

    def mark_delivered(self, sequence_id: str, number: int) -> None:
        state = self._lock_sequence(sequence_id)
        tx = self._tx
        where = "sequence_id = ? AND number = ?"
        tx.capture_key("invoker_message", sequence_id, number)
        def missing() -> UnknownMessageError:  # built only when raised: this is every delivery's path
            return UnknownMessageError(f"message {number} of sequence {sequence_id!r} is not in the invoker buffer")

        if state is None:
            raise missing()
        delivered = state[0].add(number)
        upto = delivered.next_expected - 1
        tx.capture_key("invoker_sequence", sequence_id)
        update = "UPDATE invoker_sequence SET delivered = ?, delivered_upto = ? WHERE sequence_id = ?"
        values = (api.format_ranges(delivered), upto, sequence_id)
        if tx.d.writable_cte:  # the removal and the sequence's row in one round trip
            if tx.write(f"WITH gone AS (DELETE FROM invoker_message WHERE {where} RETURNING 1) "
                        + update + " AND EXISTS (SELECT 1 FROM gone)", (sequence_id, number, *values)) == 0:
                raise missing()
        else:
            if tx.write(f"DELETE FROM invoker_message WHERE {where}", (sequence_id, number)) == 0:
                raise missing()
            tx.write(update, values)
        tx.read_ahead.get(sequence_id, {}).pop(number, None)
        tx.held_invoker[sequence_id] = (delivered, upto)

    def mark_next_delivered(self, sequence_id: str, number: int) -> None:
        """Two writes, no read: the buffered row removed, and the delivered ranges moved from
        exactly 1..number-1 to 1..number (a delivery on receipt that ran its method outside
        the store's transactions; the put that buffered the message made the sequence's row)."""
        if not self._tx.d.for_update:  # one writer at a time (SQLite): no row to lock and compare
            tx = self._tx
            tx.lock(RANK_INVOKER, sequence_id)
            tx.capture_key("invoker_message", sequence_id, number)
            tx.capture_key("invoker_sequence", sequence_id)
            if tx.write("DELETE FROM invoker_message WHERE sequence_id = ? AND number = ?",
                        (sequence_id, number)) == 0:
                raise UnknownMessageError(
                    f"message {number} of sequence {sequence_id!r} is not in the invoker buffer")
            if tx.write("UPDATE invoker_sequence SET delivered = ?, delivered_upto = ? WHERE sequence_id = ? "
                        "AND delivered_upto = ? AND delivered = ?",
                        (_prefix(number), number, sequence_id, number - 1, _prefix(number - 1))) == 0:
                raise UnknownMessageError(
                    f"message {number} of sequence {sequence_id!r} is no longer the next to deliver")
            tx.read_ahead.get(sequence_id, {}).pop(number, None)
            tx.held_invoker[sequence_id] = (api.parse_ranges(_prefix(number)), number)
            return
        held = self._lock_sequence(sequence_id)  # PostgreSQL: locked, then compared
        if held is None or held[1] != number - 1 or held[0].count != number - 1:
            raise UnknownMessageError(f"message {number} of sequence {sequence_id!r} is not the next to deliver")
        self.mark_delivered(sequence_id, number)

    def take_next(self, sequence_id: str, number: int) -> bool:
        """One statement, no read first: the delivered ranges change only if they are exactly
        1..number-1 and ``number`` is not buffered.  A delivery of the sequence in progress
        elsewhere holds the row: the statement waits for it, then looks again (READ COMMITTED
        rechecks an updated row), so the delivery of the message before this one is seen.  On
        PostgreSQL the row stays held either way (see :func:`.statements._take`)."""
        api.check_number(number)
        tx = self._tx
        tx.lock(RANK_INVOKER, sequence_id)
        tx.capture_key("invoker_sequence", sequence_id)
        before, after = _prefix(number - 1), _prefix(number)
        if number == 1:  # the sequence's first delivery: its row may not exist yet
            taken = tx.write(
                "INSERT INTO invoker_sequence (sequence_id, delivered, delivered_upto) SELECT ?, ?, 1 WHERE "
                "NOT EXISTS (SELECT 1 FROM invoker_message WHERE sequence_id = ? AND number = 1) "
                "ON CONFLICT (sequence_id) DO UPDATE SET delivered = excluded.delivered, delivered_upto = 1 "
                "WHERE invoker_sequence.delivered_upto = 0 AND invoker_sequence.delivered = ''",
                (sequence_id, after, sequence_id))
        elif tx.d.for_update:  # waits for a delivery of the message before this one (see _take)
            rows = tx.write_all(_take(), _take_params(sequence_id, number))
            taken = bool(rows and rows[0][0])
        else:  # one writer at a time (SQLite): nothing to wait for
            taken = tx.write(
                "UPDATE invoker_sequence SET delivered = ?, delivered_upto = ? WHERE sequence_id = ? "
                "AND delivered_upto = ? AND delivered = ? AND NOT EXISTS "
                "(SELECT 1 FROM invoker_message WHERE sequence_id = ? AND number = ?)",
                (after, number, sequence_id, number - 1, before, sequence_id, number))
        return tx.note_take(sequence_id, number, bool(taken))

    def state(self, sequence_id: str) -> InvokerSequence:
        row = self._tx.one("SELECT delivered FROM invoker_sequence WHERE sequence_id = ?",
                           (sequence_id,))
        return InvokerSequence(sequence_id=sequence_id,
                               delivered=api.parse_ranges(row[0] if row else None),
                               buffered=self.count(sequence_id))

    def count(self, sequence_id: str | None = None) -> int:
        if sequence_id is None:
            row = self._tx.one("SELECT COUNT(*) FROM invoker_message")
        else:
            row = self._tx.one("SELECT COUNT(*) FROM invoker_message WHERE sequence_id = ?",
                               (sequence_id,))
        return int(row[0])

    def held_bytes(self) -> dict[str, int]:
        rows = self._tx.all("SELECT sequence_id, SUM(LENGTH(payload)) FROM invoker_message GROUP BY sequence_id")
        return {row[0]: int(row[1]) for row in rows if row[1]}

    def discard(self, sequence_id: str) -> int:
        self._lock_sequence(sequence_id)
        tx = self._tx
        tx.capture("invoker_message", "sequence_id = ?", (sequence_id,))
        n = tx.write("DELETE FROM invoker_message WHERE sequence_id = ?", (sequence_id,))
        tx.capture_key("invoker_sequence", sequence_id)
        tx.write("DELETE FROM invoker_sequence WHERE sequence_id = ?", (sequence_id,))
        tx.held_invoker.pop(sequence_id, None)
        tx.read_ahead.pop(sequence_id, None)
        return n

    # -- failed deliveries and the poison store -------------------------------------------------

    def get(self, sequence_id: str, number: int) -> BufferedMessage | None:
        self._lock_sequence(sequence_id)
        row = self._tx.one(f"SELECT {_read_cols(self._tx)} FROM invoker_message WHERE sequence_id = ? "
                           "AND number = ?", (sequence_id, number))
        return self._with_payloads([_buf(row)])[0] if row else None

    def record_failure(self, sequence_id: str, number: int, *, attempts: int, cycle: int,
                       next_attempt_at: float | None, error: str) -> BufferedMessage:
        msg = self._require(sequence_id, number)
        tx = self._tx
        tx.capture_key("invoker_message", sequence_id, number)
        tx.write("UPDATE invoker_message SET attempts = ?, retry_cycle = ?, next_attempt_at = ?, "
                 "last_error = ? WHERE sequence_id = ? AND number = ?",
                 (attempts, cycle, next_attempt_at, error, sequence_id, number))
        tx.read_ahead.get(sequence_id, {}).pop(number, None)
        return replace(msg, attempts=attempts, cycle=cycle, next_attempt_at=next_attempt_at, last_error=error)

    def poison(self, sequence_id: str, number: int, *, hold: bool, error: str | None = None,
               now: float | None = None) -> api.PoisonMessage:
        msg = self._require(sequence_id, number)
        tx = self._tx
        poisoned = api.poison_of(msg, hold=hold, error=error, now=_now(now))
        self._insert_poison(poisoned)
        tx.capture_key("invoker_message", sequence_id, number)
        tx.write("DELETE FROM invoker_message WHERE sequence_id = ? AND number = ?", (sequence_id, number))
        tx.read_ahead.get(sequence_id, {}).pop(number, None)
        if not hold:
            self._set_delivered(sequence_id, tx.held_invoker[sequence_id][0].add(number))
        return poisoned

    def _insert_poison(self, p: api.PoisonMessage) -> None:
        tx = self._tx
        tx.capture_key("poison_message", p.sequence_id, p.number)
        tx.write(f"INSERT INTO poison_message ({_cols(_POISON_COLS)}) VALUES ({_in_list(_POISON_COLS)})",
                 (p.sequence_id, p.number, p.message_id, p.action, p.soap_version, p.payload, p.reply_to,
                  p.received_at, p.total_attempts, p.cycles, p.last_error, p.poisoned_at, p.held))

    def _set_delivered(self, sequence_id: str, delivered: api.AckRanges) -> None:
        tx = self._tx
        upto = delivered.next_expected - 1
        tx.capture_key("invoker_sequence", sequence_id)
        tx.write("UPDATE invoker_sequence SET delivered = ?, delivered_upto = ? WHERE sequence_id = ?",
                 (api.format_ranges(delivered), upto, sequence_id))
        tx.held_invoker[sequence_id] = (delivered, upto)
        tx.read_ahead.pop(sequence_id, None)

    def list_poison(self, sequence_id: str | None = None) -> list[api.PoisonMessage]:
        sql = f"SELECT {_cols(_POISON_COLS)} FROM poison_message"
        if sequence_id is None:
            rows = self._tx.all(sql + " ORDER BY poisoned_at, sequence_id, number")
        else:
            rows = self._tx.all(sql + " WHERE sequence_id = ? ORDER BY poisoned_at, number", (sequence_id,))
        return [_poison(r) for r in rows]

    def get_poison(self, sequence_id: str, number: int) -> api.PoisonMessage | None:
        row = self._tx.one(f"SELECT {_cols(_POISON_COLS)} FROM poison_message WHERE sequence_id = ? "
                           "AND number = ?", (sequence_id, number))
        return _poison(row) if row else None

    def _take_poison(self, sequence_id: str, number: int) -> api.PoisonMessage:
        """Lock the sequence's buffer, then delete and return its poison message ``number``."""
        self._lock_sequence(sequence_id)
        tx = self._tx
        poisoned = self.get_poison(sequence_id, number)
        if poisoned is None:
            raise UnknownMessageError(f"no poison message {number} of sequence {sequence_id!r}")
        tx.capture_key("poison_message", sequence_id, number)
        tx.write("DELETE FROM poison_message WHERE sequence_id = ? AND number = ?", (sequence_id, number))
        return poisoned

    def retry_poison(self, sequence_id: str, number: int, *, now: float | None = None) -> BufferedMessage:
        poisoned = self._take_poison(sequence_id, number)
        tx = self._tx
        held = tx.held_invoker.get(sequence_id)
        if held is None:  # the sequence was released meanwhile: a delivery record of its own
            tx.capture_key("invoker_sequence", sequence_id)
            tx.write("INSERT INTO invoker_sequence (sequence_id) VALUES (?) "
                     "ON CONFLICT (sequence_id) DO NOTHING", (sequence_id,))
            self._lock_sequence(sequence_id)
        msg = api.buffered_of(poisoned)
        tx.capture_key("invoker_message", sequence_id, number)
        tx.write(f"INSERT INTO invoker_message ({_cols(_BUF_COLS)}) VALUES ({_in_list(_BUF_COLS)})",
                 (msg.sequence_id, msg.number, msg.message_id, msg.action, msg.soap_version, msg.payload,
                  msg.reply_to, msg.received_at, 0, 0, None, None))
        self._set_delivered(sequence_id, api.delivered_for_retry(None if held is None else held[0], number))
        return msg

    def discard_poison(self, sequence_id: str, number: int) -> api.PoisonMessage:
        poisoned = self._take_poison(sequence_id, number)
        held = self._tx.held_invoker.get(sequence_id)
        if held is not None and number not in held[0]:
            self._set_delivered(sequence_id, held[0].add(number))
        return poisoned

    def count_poison(self, sequence_id: str | None = None) -> int:
        if sequence_id is None:
            row = self._tx.one("SELECT COUNT(*) FROM poison_message")
        else:
            row = self._tx.one("SELECT COUNT(*) FROM poison_message WHERE sequence_id = ?", (sequence_id,))
        return int(row[0])

    def count_retrying(self, sequence_id: str | None = None) -> int:
        sql = "SELECT COUNT(*) FROM invoker_message WHERE (attempts > 0 OR retry_cycle > 0)"
        if sequence_id is None:
            row = self._tx.one(sql)
        else:
            row = self._tx.one(sql + " AND sequence_id = ?", (sequence_id,))
        return int(row[0])
