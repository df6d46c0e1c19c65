"""Statements that span two managers' tables, shared by the transaction's one-statement
receive (PostgreSQL) and the invoker buffer's take: the receipt of a message and its
hand-over to the invoker in one round trip.
"""

from __future__ import annotations

import functools
from typing import Any

from .. import api
from ..api.records import ACTIVITY_GRAIN
from .rows import _RMD_COLS, _cols


def _rmd_assignments(changes: dict[str, Any]) -> tuple[str, list[Any]]:
    """The SET list of an rmd_sequence UPDATE, and its values (the ranges in their stored form)."""
    names = sorted(changes)
    return (", ".join(f"{n} = ?" for n in names),
            [api.format_ranges(changes[n]) if n == "received" else changes[n] for n in names])


#: take_next on a store that waits for row locks (PostgreSQL), one UPDATE and no lock ahead of it:
#: its WHERE holds for the row as the statement's snapshot saw it whenever the row as it is now
#: could be taken (delivered below ``number``: a delivery in progress only raises it), so the
#: UPDATE waits for a delivery of the sequence holding the row, or committed after the snapshot,
#: and then looks at the row as it is now (READ COMMITTED rechecks an updated row); it writes
#: the new ranges only where the row now has exactly 1..number-1 delivered (else the row as it
#: was) and returns whether it did (``taken``).
#: A ``SELECT ... FOR UPDATE`` ahead of the UPDATE did the waiting before: a row lock written to
#: the WAL (a Heap/LOCK record) on every take.  Its values (``number``, the ranges delivered
#: before and after it, the sequence: :func:`_take_params`) are named again rather than sent
#: again (11 arguments -> 4, see :mod:`.placeholders`), from parameter ``first`` on (a statement
#: that has ``first - 1`` parameters in front of it); ``number`` is typed ``bigint`` (PostgreSQL
#: infers ``integer`` for a parameter in ``? - 1``: it is compared as ``delivered_upto + 1``).
@functools.lru_cache(maxsize=8)
def _take(first: int = 1) -> str:
    number, before, after, sequence = (f"?{first + i}" for i in range(4))
    return ("UPDATE invoker_sequence SET "
            f"delivered = CASE WHEN delivered_upto + 1 = {number} AND delivered = {before} THEN {after} "
            "ELSE delivered END, "
            f"delivered_upto = CASE WHEN delivered_upto + 1 = {number} AND delivered = {before} THEN {number} "
            "ELSE delivered_upto END "
            f"WHERE sequence_id = {sequence} AND delivered_upto < {number} AND NOT EXISTS "
            f"(SELECT 1 FROM invoker_message WHERE sequence_id = {sequence} AND number = {number}) "
            f"RETURNING delivered_upto = {number} AS taken")


#: The SET list of a receipt in order (its parameters from :func:`_receipt_params`): the new
#: received ranges, and ``last_activity`` only when older than :data:`ACTIVITY_GRAIN` (``now``,
#: named twice as ``?2``: see :mod:`.placeholders`)
_RECEIPT_SET = (f"received = ?, last_activity = CASE WHEN last_activity + {ACTIVITY_GRAIN!r} < ? THEN ?2 "
                "ELSE last_activity END")


def _receipt_params(sequence_id: str, number: int, now: float, before: str) -> tuple[Any, ...]:
    """The parameters of a receipt in order of ``number`` at ``now`` (:data:`_RECEIPT_SET`, then
    the sequence and the received ranges it guesses, ``before``: 1..number-1)."""
    return (_prefix(number), now, sequence_id, before)


#: :func:`_take` right after a receipt in order of ``number`` in the same statement (CTE ``r``:
#: the received ranges were exactly 1..number-1), and only if that receipt wrote: without the look
#: into the buffer, as a receipt that found exactly 1..number-1 received means ``number`` was
#: never received, so never buffered (a message is buffered only in its receipt's transaction).
#: Its waiting for a delivery of the message before it stays.  Its values are the receipt's
#: (:data:`_RECEIPT_SET`'s, then ``sequence_id = ?3 AND received = ?4``: ``?1`` the new ranges
#: 1..number, ``?4`` 1..number-1, delivered as received) and ``number`` (``?5``), named again
#: rather than sent again (9 arguments -> 1, see :mod:`.placeholders`); ``delivered_upto + 1 =
#: ?5`` types ``number`` as a ``bigint`` where ``?5 - 1`` would make it an ``integer``.
#: Parameters from :func:`_receipt_and_take_params`.
_TAKE_AFTER_RECEIPT = (
    "UPDATE invoker_sequence SET "
    "delivered = CASE WHEN delivered_upto + 1 = ?5 AND delivered = ?4 THEN ?1 ELSE delivered END, "
    "delivered_upto = CASE WHEN delivered_upto + 1 = ?5 AND delivered = ?4 THEN ?5 ELSE delivered_upto END "
    "WHERE sequence_id = ?3 AND delivered_upto < ?5 AND EXISTS (SELECT 1 FROM r) "
    "RETURNING delivered_upto = ?5 AS taken")


def _receipt_and_take_params(sequence_id: str, number: int, now: float, before: str) -> tuple[Any, ...]:
    """The parameters of a receipt and take in one statement (:data:`_RECEIVE_IN_ORDER`,
    :data:`_RECEIVE_IN_ORDER_NOTED`, :data:`_RECEIVE_IN_ORDER_CHECKED`): the receipt's
    (:func:`_receipt_params`), then ``number``."""
    return (_prefix(number), now, sequence_id, before, number)


#: :meth:`SqlTransaction.receive_in_order` (PostgreSQL): the receipt, if the sequence has
#: received exactly 1..number-1 and is open, and then the take; the new row and whether the
#: message was taken, or no row.  The receipt's UPDATE takes the row's lock, before the take
#: locks the invoker's row.  The row as it is, for a guess found wrong, is read by a statement
#: of its own after it (:meth:`SqlTransaction.receive_in_order`): as a CTE here, beside a UNION
#: ALL, its plan cost every receive about 15% more of its backend's CPU (set up and torn down
#: at each execution), for the few that guess wrong.
_RECEIVE_IN_ORDER = (
    f"WITH r AS (UPDATE rmd_sequence SET {_RECEIPT_SET} WHERE sequence_id = ? AND received = ? "
    f"AND NOT closed AND NOT terminated AND last_number IS NULL RETURNING {_cols(_RMD_COLS)}), "
    f"t AS ({_TAKE_AFTER_RECEIPT}) "
    f"SELECT {_cols(_RMD_COLS, 'r')}, (SELECT count(*) FROM t WHERE taken) FROM r")


#: :data:`_RECEIVE_IN_ORDER` when another store call's statements follow it in its round trip
#: (``receive_in_order``'s ``answering`` and ``acknowledging``): the same writes, and their
#: outcome in the transaction-local setting ``wsrm.received`` ("1": received and taken, "0":
#: received, not taken, "-1": not received), for the statements after it to read, the last
#: of which reads the row (one statement's result comes back)
_RECEIVE_IN_ORDER_NOTED = (
    f"WITH r AS (UPDATE rmd_sequence SET {_RECEIPT_SET} WHERE sequence_id = ? AND received = ? "
    "AND NOT closed AND NOT terminated AND last_number IS NULL RETURNING 1), "
    f"t AS ({_TAKE_AFTER_RECEIPT}) "
    "SELECT set_config('wsrm.received', CASE WHEN EXISTS (SELECT 1 FROM r) "
    "THEN (SELECT count(*) FROM t WHERE taken)::text ELSE '-1' END, TRUE)")

#: conditions of a statement that ran after :data:`_RECEIVE_IN_ORDER_NOTED` in its round trip: the
#: message was received and taken; it was received
_RECEIVED_AND_TAKEN = " AND current_setting('wsrm.received') = '1'"
_RECEIVED = " AND current_setting('wsrm.received') <> '-1'"

#: The SQLSTATE by which a reply's record that would commit in its own round trip declines to
#: (``SqlTransaction._receive_ahead``'s ``commits``): division by zero, raised on purpose by
#: :func:`_committed_if_expected`'s column; its query string's transaction rolls back whole.
_DECLINED = "22012"


def _committed_if_expected(commits: tuple[str, str | None, tuple[str, ...]]) -> tuple[str, tuple[Any, ...]]:
    """The outcome column of a reply's record that commits in its own round trip (read where
    ``current_setting('wsrm.received')`` is, in the last statement of ``answering_statements``:
    ``g``, ``bad``, ``q`` and the RMD row ``rd`` in scope), and its parameters: "1" when the
    reply was received and taken, its request marked answered, the acknowledgement riding on it
    applied (``g``: it applies; ``bad``: nothing it names unsent), the request's sequence has no
    last message (so no Close nor Terminate becomes due), and the reply's sequence passes the
    checks the caller makes after the receipt (``commits``: its RM version, the principal
    sending or None, the AcksTo addresses that ask for no acknowledgement); otherwise a
    division by zero (:data:`_DECLINED`), which rolls back everything the round trip wrote."""
    version, principal, anonymous = commits
    who = "rd.principal IS NULL" if principal is None else "(rd.principal IS NULL OR rd.principal = ?)"
    acks_to = f"rd.acks_to IN ({', '.join('?' for _ in anonymous)})" if anonymous else "FALSE"
    expected = ("current_setting('wsrm.received') = '1' AND current_setting('wsrm.answered') = '1' "
                "AND EXISTS (SELECT 1 FROM g) AND NOT EXISTS (SELECT 1 FROM bad) AND NOT q.last_message "
                f"AND rd.rm_version = ? AND {who} AND {acks_to}")
    return (f"(1 / CASE WHEN {expected} THEN 1 ELSE 0 END)::text",
            (version, *(() if principal is None else (principal,)), *anonymous))


#: The text of the error by which a receipt riding on its transaction's commit says its guess was
#: wrong (``SqlTransaction.receive_at_commit``): a cast of it to an integer fails (SQLSTATE
#: 22P02, this text in the message), and the query string's transaction with it.
RECEIPT_DECLINED = "wsrm: the receipt riding on the commit guessed wrong"

#: The receipt of a one-way message riding on its transaction's COMMIT
#: (``SqlTransaction.receive_at_commit`` without ``acknowledging``): the receipt of
#: :data:`_RECEIVE_IN_ORDER`, then the take as a plain UPDATE of the invoker's row from exactly
#: 1..number-1 delivered, whose one row casts :data:`RECEIPT_DECLINED` to an integer (it fails
#: on purpose, and the query string's transaction with it, the application's work too) unless
#: the message was received and taken: no statement of its own reads the outcome, and nothing of
#: it is read back (the caller guessed the row).  Parameters from :func:`_receipt_and_take_params`.
#:
#: Not :func:`_take`: a take that may decline needs neither its waiting (its ``delivered_upto <``
#: and the CASEs that write the row as it was) nor its look into the buffer.  The guess is that
#: this process committed the delivery of ``number - 1`` (``Destination._foreseen``), so the row
#: is there to take in the statement's snapshot; where it is not, the COMMIT fails and the
#: message goes the general way, as for any wrong guess.  And a receipt that found exactly
#: 1..number-1 received means ``number`` was never received, so never buffered (a message is
#: buffered only in its receipt's transaction).  Alternated with the old statement on one
#: PostgreSQL server (16 sequences, BEGIN, the application's INSERT, the receipt, COMMIT; load
#: 10-13, 20 blocks of 1,000 each): the backend's CPU 210 -> 160 us a message (median; an
#: outbox's INSERTs 110), 16 parameters -> 10.
#:
#: Each value goes once (``?N`` names parameter N again: :mod:`.placeholders`), and the
#: activity's threshold and the prefix delivered before are worked out from ``now`` and
#: ``number`` in the statement: 10 arguments -> 5.  PostgreSQL reads each argument of an
#: ``EXECUTE`` from its literal (about 4-5 k instructions); under callgrind (PostgreSQL 15
#: single-user, BEGIN, an INSERT, this statement, COMMIT, 16 sequences) 310.2 k -> 292.5 k
#: instructions a message with 7 arguments.
_RECEIVE_IN_ORDER_CHECKED = (
    f"WITH r AS (UPDATE rmd_sequence SET {_RECEIPT_SET} WHERE sequence_id = ? AND received = ? "
    "AND NOT closed AND NOT terminated AND last_number IS NULL RETURNING 1), "
    "t AS (UPDATE invoker_sequence SET delivered = ?1, delivered_upto = ?5 WHERE sequence_id = ?3 "
    "AND delivered_upto + 1 = ?5 AND delivered = ?4 AND EXISTS (SELECT 1 FROM r) RETURNING 1) "
    f"SELECT CAST(CASE WHEN EXISTS (SELECT 1 FROM t) THEN '1' ELSE '{RECEIPT_DECLINED}' END AS integer)")


def _receipt_checked(key: str, reply_number: int | None) -> tuple[str, tuple[Any, ...]]:
    """The column of a receipt riding on its commit (``SqlTransaction.receive_at_commit``), in
    the last statement of ``acknowledging_statements`` (``g``, ``bad`` and the acknowledged
    sequence ``q`` in scope), and its parameters: 1
    when the message was received and taken, the acknowledgement applies (``g``) and names
    nothing unsent (``bad``), and ``q`` is ``key``'s sequence, open to enqueues, its highest number
    ``reply_number - 1`` when given (the reply's enqueue took its number from the row as this
    process last saw it); otherwise :data:`RECEIPT_DECLINED` cast to an integer, which fails.
    ``key``: the sequence the reply is enqueued on."""
    number = "" if reply_number is None else " AND q.highest_number = ?"
    expected = ("current_setting('wsrm.received') = '1' AND EXISTS (SELECT 1 FROM g) "
                "AND NOT EXISTS (SELECT 1 FROM bad) AND q.seq_key = ? AND NOT (q.last_message OR q.closed "
                f"OR q.close_sent OR q.terminate_sent OR q.faulted){number}")
    return (f", CAST(CASE WHEN {expected} THEN '1' ELSE '{RECEIPT_DECLINED}' END AS integer)",
            (key,) if reply_number is None else (key, reply_number - 1))


def ahead_key(kind: str, *arguments: Any) -> tuple[Any, ...]:
    """The key of a store call's statements run ahead by a receipt, in its round trip
    (``SqlTransaction.ran_ahead``): the call's name and its arguments (ranges merged)."""
    return (kind, *arguments)


def _take_params(sequence_id: str, number: int) -> tuple[Any, ...]:
    """The parameters of :func:`_take`."""
    return (number, _prefix(number - 1), _prefix(number), sequence_id)


def _prefix(upto: int) -> str:
    """The stored form of the delivered ranges 1..upto (see :func:`api.format_ranges`)."""
    return "" if upto == 0 else "1" if upto == 1 else f"1-{upto}"
