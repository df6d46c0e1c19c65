"""The RM source's statements: source sequences (``rms_sequence``) and their retransmission
queue (``rms_message``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .. import api
from ..api import (
    RANK_RMS,
    DuplicateSequenceError,
    RmdSequence,
    RmsMessage,
    RmsSequence,
    UnknownMessageError,
    UnknownSequenceError,
    _now,
)
from ..api.states import rms_life
from .rmd import _SELECT_RMD
from .statements import ACTIVITY_GRAIN, ahead_key
from .rows import _ENQUEUE_COLS, _MSG_COLS, _RMD_COLS, _RMS_COLS, _cols, _msg, _rmd, _rms, msg_cols, with_key
from .large_payloads import COPY_PAYLOAD_AT, cols_leaving_large_payloads, with_large_payloads
from . import placeholders
from .transaction import SqlTransaction, _in_list

_SELECT_RMS = f"SELECT {_cols(_RMS_COLS)} FROM rms_sequence WHERE seq_key = ?"
#: the binary form of each of the enqueue's columns (:data:`_ENQUEUE_COLS`), for COPY
_ENQUEUE_TYPES = ("int8", "int8", "text", "text", "text", "bytea", "bool", "text", "bytea", "bool", "bool",
                  "float8", "float8", "int4", "float8")


def _read_cols(tx: SqlTransaction, alias: str = "", key: str = "") -> str:
    """The columns of ``rms_message`` rows to read (:func:`.rows.msg_cols`, ``key`` read in place
    of ``seq`` when given), a payload of :data:`.large_payloads.COPY_PAYLOAD_AT` bytes or more
    left out (NULL) where the dialect reads those with COPY (:meth:`_RmsMessages._with_payloads`)."""
    if tx.d.copy_binary:
        return with_key(cols_leaving_large_payloads(_MSG_COLS, alias), key)
    return msg_cols(tx.d, alias, key)


#: SQLite (``Dialect.payload_apart``): a payload of this many bytes or more is kept in
#: ``rms_payload``, out of its message's row, which SQLite writes again whole, overflow pages and
#: all, at every send attempt and acknowledgement.  A smaller one stays in the row: it fits in the
#: row's page, which such an update writes anyway, and a row of its own cost every message an
#: INSERT at its enqueue, a DELETE at its acknowledgement and a page of the WAL at each (about a
#: tenth of a reliable message's statements on either side).  Readers take either
#: (:func:`.rows.msg_cols`).
PAYLOAD_APART_AT = 2048


#: A message is due when both its ``next_send_at`` (indexed) and its ``retry_at`` have come
#: (two parameters: now, now).  ``retry_at`` is when a message sent once is due again: its first
#: send writes only that, so that the UPDATE leaves every indexed column as it was (in place,
#: HOT, on PostgreSQL; no index entry moved on SQLite), and keeps ``next_send_at`` at or below
#: it, so the index's range holds every due message.  Any later send, a hold or a make-due moves
#: ``next_send_at`` and clears ``retry_at``; a message sent once and waiting for its
#: acknowledgement is passed over in the index by the due scans, as many as are in flight.
_DUE = "next_send_at <= ? AND (retry_at IS NULL OR retry_at <= ?)"
_DUE_M = "m.next_send_at <= ? AND (m.retry_at IS NULL OR m.retry_at <= ?)"
#: :data:`_DUE` with its parameter named once (:func:`.placeholders.named`)
_DUE_NOW = "next_send_at <= ?now AND (retry_at IS NULL OR retry_at <= ?now)"
#: The assignments of a first send (three parameters: the due time, three times).
_FIRST_SEND = "retry_at = ?, next_send_at = CASE WHEN next_send_at > ? THEN ? ELSE next_send_at END"
#: :data:`_FIRST_SEND` with its parameter named once
_FIRST_SEND_AT = ("retry_at = ?next_send_at, "
                  "next_send_at = CASE WHEN next_send_at > ?next_send_at THEN ?next_send_at ELSE next_send_at END")
#: The assignments of any send: a first one as :data:`_FIRST_SEND`, a later one moves
#: ``next_send_at`` (three parameters: the due time, three times).  The CAST lets PostgreSQL
#: prepare it: a parameter that is a CASE's only value is otherwise taken for text.
_SEND = ("retry_at = CASE WHEN send_count = 0 THEN CAST(? AS DOUBLE PRECISION) END, "
         "next_send_at = CASE WHEN send_count > 0 OR next_send_at > ? THEN ? ELSE next_send_at END")


#: PostgreSQL: in front of the lanes' claim (:meth:`_RmsMessages.claim_first_sends_of`), so that
#: each session plans the prepared statement once, not at every claim.  Left to choose, PostgreSQL
#: planned it at 0.35-0.53 of the claims (about 0.37 ms of the server's CPU each: its five first
#: custom plans on each session, then a custom one whenever the generic one's estimate looked
#: dearer), and the generic plan it did take was not safe at a backlog before the statement went
#: by the primary key (see ``_first_sends_claim``).  The setting lasts to the transaction's end:
#: the refill's claim commits alone (``next_write_commits``), and the statements that may follow
#: it elsewhere go by key.  A statement sent as text (its first time on a session) is planned
#: as before.
_GENERIC_PLAN = "SET LOCAL plan_cache_mode TO force_generic_plan; SET LOCAL enable_bitmapscan TO off; "

#: PostgreSQL: the class of the transaction-scoped advisory lock of one sequence's writers
#: beside enqueues (:data:`_WRITERS_BESIDE`), "WRMS" as an int32 (the two-key form: its own
#: space, apart from the single-key locks of migrations and the transaction manager's nodes)
_BESIDE_LOCK_CLASS = 0x57524D53
#: PostgreSQL: what a transaction that writes a sequence's messages while it holds the row only
#: ``FOR KEY SHARE`` (beside callers' enqueues) takes first, in the select list of the row's
#: read (evaluated for the row that passes the read's condition, before its lock).  ``FOR KEY
#: SHARE`` does not keep two such writers apart, and their writes are not all in one order: an
#: acknowledgement deletes its messages and then, in a second pass, marks those it may not purge
#: (``lk`` went to the other one), a settle makes due in number order.  Two of them on one
#: sequence crossed and deadlocked (engines sharing a store acknowledge and settle each other's
#: sequences: 16 client engines, up to 5 deadlocks a run).  The lock keeps them one at a time per
#: sequence, and waits for neither a caller's enqueue nor a claim, which do not take it (two
#: sequences whose ids are equal modulo 2**31 - 1 share a lock: they only wait for each other).
_WRITERS_BESIDE = f"pg_advisory_xact_lock({_BESIDE_LOCK_CLASS}, CAST(mod(id, 2147483647) AS integer))"


#: PostgreSQL: in front of statements whose transaction ends right after them, so that each
#: session plans them once: the sender's acknowledgement when it is its transaction alone
#: (:meth:`_RmsMessages.acknowledge_sequence` with ``alone``: its query string is the
#: transaction), and an enqueue riding to its branch's COMMIT
#: (:meth:`_RmsMessages.enqueue_claiming_at_commit`).  Left to choose, PostgreSQL made custom
#: plans of them at 0.20-0.33 and 0.10-0.13 of the calls (16 sequences under XA across two
#: databases, ``BENCH_PG_STATEMENTS``).  Their generic plans go by keys whatever the statistics
#: say: the enqueue by the sequence's key and the previous message's, the acknowledgement by
#: the sequence's id in the primary key and ``rms_message_acked`` (its rows touched at a
#: backlog: ``test_acks_beside_enqueues``).  Bitmap scans stay allowed: the acknowledgement's
#: purge of ``acked OR`` its range is one (a BitmapOr of the two indexes).
_PLANNED_ONCE = "SET LOCAL plan_cache_mode TO force_generic_plan; "


def _generic_plan(tx: SqlTransaction) -> str:
    """:data:`_GENERIC_PLAN` where the store prepares its statements (PostgreSQL), else nothing."""
    return _GENERIC_PLAN if tx.d.name == "postgresql" else ""


def _ordered_scan(tx: SqlTransaction) -> str:
    """PostgreSQL: what makes the due scans read the index in its order and stop at their limit.

    Their ``retry_at`` test is read from the row, and with the statistics of a busy queue
    (always stale: 2 rows expected where a backlog has thousands) PostgreSQL then planned a
    bitmap scan of every due message and a sort (4,000 rows read for a batch of 50).  Off
    for the rest of the transaction (the sender's claim: its other statements go by key).  The
    statement is still prepared (planning it took 0.4-1.1 ms of the server's CPU, more than
    running it): the setting goes in front of its every ``EXECUTE`` in one query string, and
    PostgreSQL plans a prepared statement at an ``EXECUTE`` (its custom plans, its generic one,
    a plan made again after an invalidation), so every plan of it is made with the setting off
    (see ``prepared.PreparedStatements``: it is prepared apart from any statement sent without
    the setting)."""
    return "SET LOCAL enable_bitmapscan TO off; " if tx.d.name == "postgresql" else ""


def _numbers_in(numbers: Sequence[int]) -> str:
    """The condition that picks the messages of the sorted ``numbers`` of one sequence (with the
    sequence's own ``seq = ?`` in front; parameters: the first, the last, then each number).

    The range goes in front of the list so that PostgreSQL reads the primary key from the first to
    the last: with a busy queue's stale statistics (a few rows a sequence expected) it planned
    ``number IN`` a send batch's 50 numbers as a filter on every message of the sequence, and a
    batch's send attempts, recorded, read the whole backlog (8,000 tuples at 4,000 queued, 405 at
    200: ``tests/store/test_backlog.py``).  A range is always a condition of the index scan, in a
    custom plan or a generic one; the rows it reads are the span of the numbers, which a send
    batch takes in order from the front of its sequence (its retransmissions, behind, are sent
    and unacknowledged messages, as many as the sequence has in flight)."""
    return f"number BETWEEN ? AND ? AND number IN ({_in_list(numbers)})"


#: A sequence no enqueue may add to (:meth:`_RmsMessages._take_number`): its last message
#: known, closing or closed, or faulted.  An acknowledgement of any other owes no Close or
#: Terminate: it changes nothing of the sequence but its messages.
_CLOSED_TO_ENQUEUES = "last_message OR closed OR close_sent OR terminate_sent OR faulted"
#: Whether the caller may claim the message it enqueues (``c.mine``; one parameter: the
#: caller's target): the sequence is the caller's to send (see rms_life: started and live;
#: claim_first_send) and the message before it is acknowledged or purged.  That message is read
#: by the primary key, its ``acked`` (none: purged): a ``NOT EXISTS (... AND NOT b.acked)``
#: matched the predicate of ``rms_message_unacked`` (seq, next_send_at, number), and its generic
#: plan scanned that index over every unacknowledged message of the sequence (the number its
#: third column, a filter): an enqueue cost as much more as the sequence had queued (17 of an
#: enqueue's 30 buffers at 50 queued; tests/store/test_backlog.py).
_MINE = ("s.target = ?target AND s.started AND s.sequence_id IS NOT NULL AND NOT s.terminate_sent AND NOT s.faulted "
         "AND COALESCE((SELECT b.acked FROM rms_message b WHERE b.seq = s.id "
         "AND b.number = s.highest_number - 1), TRUE)")


def _enqueue_claiming(claims: bool, replies: bool = True, whole: bool = True) -> str:
    """:meth:`_RmsMessages.enqueue_claiming`'s number taken (``s``), claim decided (``c``) and
    message inserted (``m``), as a statement's WITH clauses, its parameters named
    (:func:`.placeholders.named`; their values: :func:`_claiming_params`).  Without ``claims``
    (no target: a message no caller sends itself) the claim is no question: no ``c``, the
    message inserted unclaimed, and the statement reads no other message (every node of a plan
    is set up again at each execution of it: ``c`` and its joins were about a fifth of this
    statement's).  Without ``replies`` (no reply callback nor context, awaiting no reply: a
    one-way message) those columns are written as constants, and the highest number a sequence
    takes is one always: each value a prepared statement receives costs PostgreSQL about 4-5 k
    instructions to read (:mod:`.placeholders`), and a value named twice is sent once.  Without
    ``whole`` (no claim, no one reads the row back) ``s`` returns only what the insert takes."""
    taken = (f"WITH s AS (UPDATE rms_sequence SET highest_number = highest_number + 1 WHERE seq_key = ?key "
             f"AND NOT ({_CLOSED_TO_ENQUEUES}) AND highest_number < {api.MAX_MESSAGE_NUMBER} "
             f"RETURNING {_cols(_RMS_COLS) if whole or claims else 'id, highest_number'}), ")
    inserted = (f"m AS (INSERT INTO rms_message ({_cols(_ENQUEUE_COLS)}, retry_at) "
                "SELECT s.id, s.highest_number, ?message_id, ?action, ?soap_version, ?payload, FALSE, "
                + ("?reply_callback, ?reply_context, ?waits, ?waits, " if replies else "NULL, NULL, FALSE, FALSE, "))
    if not claims:
        return (taken + inserted + "CAST(?due AS DOUBLE PRECISION), CAST(?t AS DOUBLE PRECISION), 0, NULL, NULL "
                "FROM s RETURNING number)")
    return (
        taken + f"c AS (SELECT {_MINE} AS mine FROM s), " + inserted +
        "CASE WHEN c.mine THEN LEAST(CAST(?due AS DOUBLE PRECISION), CAST(?next_send_at AS DOUBLE PRECISION)) "
        "ELSE CAST(?due AS DOUBLE PRECISION) END, CAST(?t AS DOUBLE PRECISION), CASE WHEN c.mine THEN 1 ELSE 0 END, "
        "CASE WHEN c.mine THEN CAST(?t AS DOUBLE PRECISION) END, "
        "CASE WHEN c.mine THEN CAST(?next_send_at AS DOUBLE PRECISION) END FROM s, c RETURNING number)")


_ENQUEUE_CLAIMING, _ENQUEUE_CLAIMING_NAMES = placeholders.named(_enqueue_claiming(True))
#: the session setting in which an enqueue riding to its transaction's commit leaves its outcome
#: (:meth:`_RmsMessages.enqueue_claiming_at_commit`): "<number> <1 if claimed, else 0> <a JSON
#: array: the sequence's row as the enqueue wrote it, the RMD row read beside or null>" (the rows
#: last: a caller that wants only the number does not parse them; nothing after the claim's
#: digit where no caller claims and no RMD row is read: see _enqueue_claiming_at_commit)
_RODE = "wsrm.enqueued"


def _enqueue_claiming_at_commit(claims: bool, reads_rmd: bool, replies: bool = True) -> str:
    """That enqueue: :func:`_enqueue_claiming` and, with ``reads_rmd``, the RMD row whose
    acknowledgement the request carries read beside (as ``enqueue_claiming`` reads it: before
    the commit, which flushes the WAL past what it saw; one parameter more, last), its outcome
    kept, or a division by zero (``statements._DECLINED``) when the sequence took no message
    (nothing inserted).

    A message no caller claims, with no RMD row read, keeps its number only: no one reads the
    sequence's row it wrote back after the commit.  Where the ride goes before the commit
    (something else is sent first), its read there, inside the transaction, reads the row
    (:data:`_ENQUEUED_BEFORE_COMMIT`): a later enqueue on the sequence in the same transaction
    wants it.  ``row_to_json`` of the sequence's row cost PostgreSQL about 42k instructions a
    message (PostgreSQL 15 single-user under callgrind: a category and an output function looked
    up for each of its 23 columns at every call)."""
    read = f", r AS ({_SELECT_RMD})" if reads_rmd else ""
    rows = "" if not claims and not reads_rmd else (
        f" || CAST(json_build_array(row_to_json(s), {'(SELECT row_to_json(r) FROM r)' if reads_rmd else 'NULL'}) "
        "AS text)")
    return (
        _enqueue_claiming(claims, replies, bool(rows)) + f"{read} SELECT 1 / CAST(count(set_config('{_RODE}', "
        f"CAST(m.number AS text) || {'CASE WHEN c.mine THEN ' + repr(' 1 ') + ' ELSE ' if claims else ''}' 0 '"
        f"{' END' if claims else ''}{rows}, FALSE)) AS integer) FROM m{' JOIN c ON TRUE' if claims else ''}"
        f"{' CROSS JOIN s' if rows else ''}")


#: :func:`_enqueue_claiming_at_commit` by (claims, reads_rmd).  Where it claims, with the setting
#: that plans it once a session in front (:data:`_PLANNED_ONCE`), and no sequential scan: every
#: part of it goes by a key, and a session plans it once, with the statistics of then.  Those of
#: a busy queue are always stale (taken when it held a few rows), and with them PostgreSQL
#: planned the claim's look at the message before as a scan of the whole table
#: (tests/store/test_enqueue_backlog.py).  Where it does not claim (a one-way message), with
#: neither: it reads no message, goes by the sequence's key (and the RMD's), and PostgreSQL's
#: own choice keeps its generic plan after the five custom ones of each session (the generic
#: estimate is never dearer: test_enqueue_rides_on_commit.py), where the setting was a
#: statement more a message (xa1: client statements 9.1 -> 7.1 a message with the RELEASE gone,
#: planning 0.05 plans a call over 2,000 messages, the sessions' first five).  The settings end
#: with the transaction, whose COMMIT follows.
#: Each with its parameters' names (:func:`.placeholders.named`), by (claims, reads_rmd,
#: replies, due_now): without ``replies`` a message with no reply callback nor context, awaiting
#: no reply; with ``due_now`` one due as it is enqueued (no ``send_at``: its due time is its
#: creation's, one value).
_ENQUEUES_AT_COMMIT = {
    (claims, reads, replies, now): placeholders.named(
        ((_PLANNED_ONCE + "SET LOCAL enable_seqscan TO off; " if claims else "")
         + _enqueue_claiming_at_commit(claims, reads, replies)).replace("?due", "?t" if now else "?due"))
    for claims in (True, False) for reads in (True, False) for replies in (True, False) for now in (True, False)}
#: its outcome, read after the commit: the setting alone.  It runs in a transaction of its own
#: (after the COMMIT, in the same query string: libpq gives only the last statement's result),
#: which a ``SHOW`` keeps to the least: no table, no snapshot, no plan, no xid, so no commit
#: record (a read of the sequence's row there cost PostgreSQL a table's lock, an index scan and
#: a snapshot a message)
_ENQUEUED_AT_COMMIT = f"SHOW {_RODE}"
#: the outcome of an enqueue that keeps its number only (no caller claims, no RMD row read:
#: see _enqueue_claiming_at_commit) where it goes before the commit (something else is sent
#: first), inside the transaction: with the sequence's row it wrote (locked by it), as the
#: others' outcome has it, for a later enqueue on the sequence in the same transaction
#: (one parameter: the sequence's key)
_ENQUEUED_BEFORE_COMMIT = (f"SELECT current_setting('{_RODE}') || CAST(json_build_array(row_to_json(s), NULL) AS text) "
                           f"FROM (SELECT {_cols(_RMS_COLS)} FROM rms_sequence WHERE seq_key = ?) AS s")


#: What a sequence's row must show for the lanes to claim its messages (as ``rms_life``'s
#: transmitting, with its id known)
_SENDING = "started AND sequence_id IS NOT NULL AND NOT terminate_sent AND NOT faulted"


def _sends(seq: RmsSequence) -> bool:
    """:data:`_SENDING` of a row read."""
    return seq.started and seq.sequence_id is not None and not seq.terminate_sent and not seq.faulted


@functools.lru_cache(maxsize=8)
def _claim_of_statement(d: Any, generic: str, cols: str) -> tuple[str, tuple[str, ...]]:
    """:meth:`_RmsMessages.claim_first_sends_of`'s statement on PostgreSQL (``generic``: the
    settings in front of it; ``cols``: the message columns read), its parameters named.  Its
    rows: the sequence's row as read, whether its first due messages are all never sent
    (NULL: none due), whether the row was locked as read (NULL: not locked; FALSE: the lock
    waited for a change and holds a newer version), then a claimed message's columns, in no
    order (NULL: none claimed).

    ``p``: the sequence's row read unlocked; ``m``: its first due unacknowledged messages, read
    by the primary key on the statement's snapshot (a lock taken later in the statement does
    not change what it reads, so ``m`` need not wait for ``q``); ``d``: whether they are all
    never sent, the claim's condition; ``q``: the row held ``FOR KEY SHARE``, only when it is
    open to enqueues, sending, and ``d`` holds (after a wait, READ COMMITTED tests the row as
    the change it waited for left it); ``u``: the claimed messages' attempts, written only
    under ``q``'s lock (sequence row, then its messages: one order for all), and only to rows
    still unsent and unacknowledged once locked.

    PostgreSQL builds a tuple descriptor for every plan node's output at each execution, a
    catalog look-up per column (callgrind: about 1.2 k instructions a column a node), so the
    statement's columns cost more than its reads: the row goes out once (``q`` returns only
    its version's ``ctid``), and the messages are put in order by the caller, not by a sort
    node of every column.  Before, ``m`` was read once more for ``p``'s test, ``u`` tested ``m``
    again, and the row went out twice, in a sort."""
    return placeholders.named(
        generic
        + f"WITH p AS (SELECT {_cols(_RMS_COLS)}, ctid AS at FROM rms_sequence WHERE seq_key = ?key), "
        f"m AS (SELECT {cols} FROM rms_message WHERE seq = (SELECT id FROM p) AND acked IS FALSE "
        f"AND {_DUE_NOW} AND number > ?after ORDER BY number LIMIT ?limit), "
        "d AS (SELECT bool_and(send_count = 0) AS due FROM m), "
        "q AS (SELECT id, ctid AS at FROM rms_sequence WHERE seq_key = ?key "
        f"AND NOT ({_CLOSED_TO_ENQUEUES}) AND {_SENDING} AND (SELECT due FROM d){d.key_share}), "
        f"u AS (UPDATE rms_message SET send_count = send_count + 1, last_sent_at = ?now, {_FIRST_SEND_AT} "
        "WHERE seq = (SELECT id FROM q) AND number = ANY(ARRAY(SELECT number FROM m)) AND send_count = 0 "
        "AND acked IS FALSE RETURNING number) "
        f"SELECT {_cols(_RMS_COLS, 'p')}, d.due, q.at = p.at, c.* FROM p CROSS JOIN d LEFT JOIN q ON TRUE "
        "LEFT JOIN (SELECT * FROM m WHERE number IN (SELECT number FROM u)) c ON TRUE")


def _claim_of(tx: SqlTransaction) -> tuple[str, tuple[str, ...]]:
    """:func:`_claim_of_statement` for ``tx``'s dialect."""
    return _claim_of_statement(tx.d, _generic_plan(tx), _read_cols(tx))


def _number(msg: RmsMessage) -> int:
    return msg.number


def _claiming_params(sequence_key: str, payload: bytes, action: str, soap_version: str, message_id: str,
                     target: str | None, next_send_at: float, reply_callback: str | None, reply_context: bytes | None,
                     awaits_reply: bool, due: float, t: float) -> dict[str, Any]:
    """The values of :func:`_enqueue_claiming`'s named parameters."""
    return {"key": sequence_key, "target": target, "message_id": message_id, "action": action,
            "soap_version": soap_version, "payload": bytes(payload), "reply_callback": reply_callback,
            "reply_context": None if reply_context is None else bytes(reply_context),
            "waits": reply_callback is not None or awaits_reply, "due": due, "next_send_at": next_send_at, "t": t}


def _in_order(names: Sequence[str], values: Mapping[str, Any], *rest: Any) -> tuple[Any, ...]:
    """The parameters of a statement numbered by :func:`.placeholders.named`: each name's
    value, then ``rest`` for its bare placeholders (which follow every name)."""
    return (*(values[name] for name in names if name), *rest)


#: A request by its message id (one parameter): only a message enqueued awaiting a reply is one,
#: and only those are in the message id's index (schema version 13), whose condition this names
_REQUEST = "message_id = ? AND awaits_reply"


def _closed_to_enqueues(seq: RmsSequence) -> bool:
    """:data:`_CLOSED_TO_ENQUEUES` of a sequence read."""
    return seq.last_message or seq.closed or seq.close_sent or seq.terminate_sent or seq.faulted


def _acknowledging(merged: api.AckRanges, t: float, *, seq: int | None, kept: bool) -> tuple[str, list[Any]]:
    """:meth:`_RmsMessages.acknowledge`'s statement and its parameters, up to its select list's
    last column (the sequence's row as written): of the sequence whose id is ``seq``, or, with
    ``seq`` None, of the one a CTE ``g`` names (``g.id``, ``g.kp`` for ``kept``), none when
    ``g`` is empty.

    The check that every number named was sent (``bad``), the acknowledged messages deleted
    (those that wait for no reply: what ``purge_acked`` would delete next) or marked (those
    that do), the sequence's row written when there is something to write (its
    retransmissions purged, or its ``last_activity`` older than :data:`ACTIVITY_GRAIN`) and
    no one else holds it, and whether one is left unacknowledged; nothing written when the
    check fails."""
    within = "(" + " OR ".join("number BETWEEN ? AND ?" for _ in merged.ranges) + ")"
    bounds = [v for pair in merged.ranges for v in pair]
    k = "?" if seq is not None else "(SELECT id FROM g)"
    keys = [seq] if seq is not None else []
    # kept waiting for their replies: not acknowledged, and still unacknowledged after it
    held = ("reply_pending" if kept else "FALSE") if seq is not None else "(reply_pending AND (SELECT kp FROM g))"
    ok = "NOT EXISTS (SELECT 1 FROM bad)"
    # The ranges' messages still there begin at the first message at or above their lowest
    # number (``w``, found by the primary key, which stops there).  A cumulative acknowledgement
    # names the drained prefix again each time, and its rows are deleted but their index entries
    # stay until a vacuum: with a backlog's statistics PostgreSQL read the ranges by bitmap scans,
    # which visit the heap page of every dead entry and never mark one dead, so each of the four
    # scans below read every page the drain had emptied (10,000 blocks an acknowledgement 20,000
    # messages into a drain, autovacuum off; ``test_backlog.py`` counts them).
    live = f"number >= (SELECT number FROM w) AND {within}"
    after = max(bounds) + 1 if max(bounds) < api.MAX_MESSAGE_NUMBER else 0  # (0: no message's number)
    # The sequence's row is written (its last_activity, its purged retransmissions) only when
    # there is something to write, and only when no one else holds it, as a caller's
    # enqueue does until its transaction ends (``lk``, SKIP LOCKED: an acknowledgement never
    # waits for a caller, see get_by_sequence_id).  Without it, retransmitted messages are
    # only marked acknowledged, their count kept in their rows: the next acknowledgement
    # that holds the row purges them (``acked OR ...``) and counts them then.
    return (
        f"WITH w AS (SELECT number FROM rms_message WHERE seq = {k} AND number >= ? ORDER BY number LIMIT 1), "
        f"bad AS (SELECT number FROM rms_message WHERE seq = {k} AND {live} AND send_count = 0 "
        f"AND NOT {held} ORDER BY number LIMIT 20), "
        f"lk AS (SELECT id FROM rms_sequence WHERE id = {k} AND (last_activity < ? OR EXISTS "
        f"(SELECT 1 FROM rms_message WHERE seq = {k} AND NOT reply_pending AND send_count > 1 "
        f"AND (acked OR {live}))) FOR NO KEY UPDATE SKIP LOCKED), "
        f"d AS (DELETE FROM rms_message WHERE seq = {k} AND NOT reply_pending AND (acked OR {live}) "
        f"AND {ok} AND (send_count <= 1 OR EXISTS (SELECT 1 FROM lk)) RETURNING number, acked, send_count), "
        f"u AS (UPDATE rms_message SET acked = TRUE WHERE seq = {k} AND NOT acked AND {live} AND {ok} "
        f"AND ((reply_pending AND NOT {held}) OR (NOT reply_pending AND send_count > 1 "
        "AND NOT EXISTS (SELECT 1 FROM lk))) RETURNING number), "
        "s AS (UPDATE rms_sequence SET last_activity = ?, purged_retransmissions = purged_retransmissions "
        "+ (SELECT COALESCE(SUM(send_count - 1), 0) FROM d WHERE send_count > 1) "
        f"WHERE id = {k} AND {ok} AND EXISTS (SELECT 1 FROM lk) RETURNING {_cols(_RMS_COLS)}) "
        "SELECT ARRAY(SELECT number FROM bad), "
        "ARRAY(SELECT number FROM d WHERE NOT acked UNION ALL SELECT number FROM u ORDER BY 1), "
        # whether one stays unacknowledged: the next after the ranges, by the primary key (the
        # next queued, at a backlog), else any outside them or waiting (an EXISTS that
        # PostgreSQL, with the statistics of a backlog, planned as a sequential scan from the
        # table's first page: through every row before the sequence's first outside the ranges)
        f"EXISTS (SELECT 1 FROM rms_message WHERE seq = {k} AND number = ? AND NOT acked) "
        f"OR EXISTS (SELECT 1 FROM rms_message WHERE seq = {k} AND NOT acked AND (NOT {within} OR {held})), "
        f"{_cols(_RMS_COLS, 's')}",
        [*keys, min(bounds), *keys, *bounds, *keys, t - ACTIVITY_GRAIN, *keys, *bounds, *keys, *bounds, *keys,
         *bounds, t, *keys, *keys, after, *keys, *bounds])


def _id(seq: RmsSequence) -> int:
    """The number by which ``seq``'s messages name it (``rms_message.seq``)."""
    if seq.store_id is None:
        raise api.StoreError(f"RMS sequence {seq.key!r} was not read from this store (no store_id)")
    return seq.store_id


class _Rms(api.RmsSequenceManager):
    _tx: SqlTransaction

    def create(self, key: str, *, target: str, acks_to: str, rm_version: str,
               wsa_version: str, offered_id: str | None = None, expires: float | None = None,
               next_control_at: float | None = None, now: float | None = None) -> RmsSequence:
        api.check_key(key, "sequence key")
        tx = self._tx
        tx.lock(RANK_RMS, key)
        t = _now(now)
        tx.capture_key("rms_sequence", key)
        new_id = tx.d.new_rms_id  # (PostgreSQL: the column's identity)
        n = tx.write(
            "INSERT INTO rms_sequence (seq_key, target, acks_to, rm_version, wsa_version, "
            f"offered_id, next_control_at, expires, created_at, last_activity{', id' if new_id else ''}) "
            f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?{', ' + new_id if new_id else ''}) ON CONFLICT (seq_key) DO NOTHING",
            (key, target, acks_to, rm_version, wsa_version, offered_id,
             t if next_control_at is None else next_control_at, expires, t, t))
        if n == 0:
            raise DuplicateSequenceError(f"an RMS sequence with key {key!r} already exists")
        return self.require(key)

    def get(self, key: str, *, beside_enqueues: bool = False) -> RmsSequence | None:
        tx = self._tx
        tx.hold_riding_rms(key)  # an enqueue riding to the commit took its number: its read gives the row
        if beside_enqueues and tx.d.key_share and key not in tx.held_rms:
            seq = self._held_beside_enqueues("seq_key", key)
            if seq is not None:
                return seq
        return tx.locked_sequence(RANK_RMS, tx.held_rms, key, _SELECT_RMS, _rms)

    def get_by_sequence_id(self, sequence_id: str, *, beside_enqueues: bool = False) -> RmsSequence | None:
        tx = self._tx
        tx.lock(RANK_RMS, ("sequence_id", sequence_id))
        for held in tx.held_rms.values():  # locked by this transaction already, and as it is now
            if held.sequence_id == sequence_id:  # (a reply's record: its request's sequence)
                return held
        if beside_enqueues and tx.d.key_share:
            found = self._held_beside_enqueues("sequence_id", sequence_id)
            if found is not None:
                return found
        row = tx.one(f"SELECT {_cols(_RMS_COLS)} FROM rms_sequence WHERE sequence_id = ?"
                     + tx.d.for_update, (sequence_id,))
        if row is None:
            return None
        seq = _rms(row)
        tx.lock(RANK_RMS, seq.key)
        tx.held_rms[seq.key] = seq  # locked as get() locks it: its next read needs no round trip
        return seq

    def _held_beside_enqueues(self, column: str, value: str) -> RmsSequence | None:
        """The sequence, FOR KEY SHARE, if it is open to enqueues (``get(beside_enqueues=True)``):
        held against close, terminate, fault and delete (their FOR UPDATE), not against
        enqueues (their UPDATE of the number holds FOR NO KEY UPDATE).  None otherwise, and
        then the row is not locked (the condition is checked before the lock): the caller
        locks it FOR UPDATE, as before."""
        tx = self._tx
        row = tx.one(f"SELECT {_cols(_RMS_COLS)}, {_WRITERS_BESIDE} FROM rms_sequence WHERE {column} = ? "
                     f"AND NOT ({_CLOSED_TO_ENQUEUES}){tx.d.key_share}", (value,))
        if row is None:
            return None
        seq = _rms(row[:-1])
        tx.lock(RANK_RMS, seq.key)
        tx.held_rms[seq.key] = seq
        tx.shared_rms.add(seq.key)
        return seq

    def peek(self, key: str) -> RmsSequence | None:
        tx = self._tx
        seq = tx.held_rms.get(key)
        if seq is not None:
            return seq
        row = tx.one(_SELECT_RMS, (key,))
        return None if row is None else _rms(row)

    def peek_by_sequence_id(self, sequence_id: str) -> RmsSequence | None:
        row = self._tx.one(f"SELECT {_cols(_RMS_COLS)} FROM rms_sequence WHERE sequence_id = ?", (sequence_id,))
        return None if row is None else _rms(row)

    def update(self, key: str, **changes: Any) -> RmsSequence:
        RmsSequence.check_changes(changes)
        seq = self.require(key)
        if not changes:
            return seq
        tx = self._tx
        sid = changes.get("sequence_id")
        if sid is not None and sid != seq.sequence_id:
            row = tx.one("SELECT seq_key FROM rms_sequence WHERE sequence_id = ? AND seq_key <> ?",
                         (sid, key))
            if row:
                raise DuplicateSequenceError(
                    f"sequence id {sid!r} already belongs to RMS sequence {row[0]!r}")
        tx.capture_key("rms_sequence", key)
        names = sorted(changes)
        # the row as written comes back with it: held, with no read after it (which, FOR UPDATE,
        # would wait for acknowledgements holding the row FOR KEY SHARE, see get_by_sequence_id)
        return self._written(key, f"UPDATE rms_sequence SET {', '.join(f'{n} = ?' for n in names)} "
                             f"WHERE seq_key = ? RETURNING {_cols(_RMS_COLS)}", [*(changes[n] for n in names), key])

    def mark_last(self, key: str) -> RmsSequence:
        self.require(key)
        tx = self._tx
        tx.capture_key("rms_sequence", key)
        return self._written(key, "UPDATE rms_sequence SET last_message = TRUE, last_number = highest_number "
                             f"WHERE seq_key = ? RETURNING {_cols(_RMS_COLS)}", (key,))

    def _written(self, key: str, update: str, params: Any) -> RmsSequence:
        """The sequence row an UPDATE ... RETURNING wrote, held for the rest of the transaction."""
        tx = self._tx
        rows = tx.write_all(update, params)
        if not rows:
            raise UnknownSequenceError("RMS", key)
        seq = tx.held_rms[key] = _rms(rows[0])
        return seq

    def delete(self, key: str) -> None:
        seq = _id(self.require(key))
        tx = self._tx
        tx.capture("rms_message", "seq = ?", (seq,))
        tx.write("DELETE FROM rms_message WHERE seq = ?", (seq,))
        if tx.d.payload_apart:
            tx.capture("rms_payload", "seq = ?", (seq,))
            tx.write("DELETE FROM rms_payload WHERE seq = ?", (seq,))
        tx.capture_key("rms_sequence", key)
        tx.write("DELETE FROM rms_sequence WHERE seq_key = ?", (key,))

    def needing_work(self, now: float | None = None, limit: int = 100) -> list[RmsSequence]:
        t = _now(now)
        rows = self._tx.all(
            f"SELECT {_cols(_RMS_COLS)} FROM rms_sequence "
            "WHERE (next_control_at IS NOT NULL AND next_control_at <= ?) "
            "OR (expires IS NOT NULL AND expires <= ?) "
            "ORDER BY COALESCE(next_control_at, expires), seq_key LIMIT ?", (t, t, limit))
        return [_rms(r) for r in rows]

    def list_all(self) -> list[RmsSequence]:
        rows = self._tx.all(f"SELECT {_cols(_RMS_COLS)} FROM rms_sequence ORDER BY created_at, seq_key")
        return [_rms(r) for r in rows]


class _RmsMessages(api.RmsMessageManager):
    _tx: SqlTransaction

    def _seq(self, key: str) -> RmsSequence:
        seq = self._tx.rms.get(key)
        if seq is None:
            raise UnknownSequenceError("RMS", key)
        return seq

    def _seq_id(self, key: str) -> int:
        """The id of sequence ``key`` (``rms_message.seq``), from its row, read and locked if not held."""
        return _id(self._seq(key))

    def _seq_is(self, key: str) -> tuple[str, tuple[Any, ...]]:
        """A condition on ``rms_message`` rows of sequence ``key`` and its parameter, for a read that
        locks nothing: by the id of the row held, else by the key (a subquery)."""
        held = self._tx.held_rms.get(key)
        if held is not None and held.store_id is not None:
            return "seq = ?", (held.store_id,)
        return "seq = (SELECT id FROM rms_sequence WHERE seq_key = ?)", (key,)

    def enqueue(self, sequence_key: str, payload: bytes, *, action: str, soap_version: str,
                message_id: str, last: bool = False, reply_callback: str | None = None,
                reply_context: bytes | None = None, send_at: float | None = None,
                now: float | None = None, awaits_reply: bool = False,
                handed_out: bool = False) -> RmsMessage:
        tx = self._tx
        tx.hold_riding_rms(sequence_key)  # the row held, before this enqueue decides whether it rides
        t = _now(now)
        values: tuple[Any, ...] = ()
        if isinstance(payload, (bytes, bytearray, memoryview)):
            waits = reply_callback is not None or awaits_reply  # (reply_pending, then awaits_reply)
            values = (message_id, action, soap_version, bytes(payload), last, reply_callback,
                      None if reply_context is None else bytes(reply_context),
                      waits, waits, t if send_at is None else send_at, t,
                      1 if handed_out else 0, t if handed_out else None)
        # PostgreSQL: the number taken and the message inserted in one statement (a round trip
        # less on the application's own transaction); where the store keeps an undo image
        # (SQLite's XA branches), the insert is captured first, so it stays a statement of its own.
        # A large payload goes by COPY in its binary form instead (SqlTransaction.copy_in), after
        # the statement that takes the number: a round trip more, and much less of both sides' CPU
        copied = tx.d.copy_binary and tx.undo is None and bool(values) and len(values[3]) >= COPY_PAYLOAD_AT
        together = tx.d.writable_cte and tx.undo is None and not copied
        # A sequence this transaction holds against every writer (a reply's, locked by the
        # request's receipt) gets its number from the row held, and the message and the number
        # go as writes riding on the branch's COMMIT (SqlTransaction.write_later): no round trip
        # of their own; the checks are enqueue's own, made here before anything is sent.
        rides = (bool(values) and not copied and sequence_key in tx.held_rms
                 and sequence_key not in tx.shared_rms and tx.rides_writes)
        taken = self._take_number(sequence_key, last, values if together else ()) \
            if values and not rides else None
        if taken is not None:
            number = taken.next_number - 1
            seq_id = _id(taken)
        else:
            seq = self._seq(sequence_key)
            number = api.check_enqueue(seq, payload)
            seq_id = _id(seq)
        if taken is None or not together:
            tx.capture_key("rms_message", seq_id, number)
            if tx.d.payload_apart and len(values[3]) >= PAYLOAD_APART_AT:
                # the row only names it: its updates then leave the payload be
                tx.capture_key("rms_payload", seq_id, number)
                tx.write("INSERT INTO rms_payload (seq, number, payload) VALUES (?, ?, ?)",
                         (seq_id, number, values[3]))
                values = (*values[:3], b"", *values[4:])
            if copied:
                tx.copy_in("rms_message", _ENQUEUE_COLS, _ENQUEUE_TYPES, (seq_id, number, *values))
            else:
                (tx.write_later if rides else tx.write)(
                    f"INSERT INTO rms_message ({_cols(_ENQUEUE_COLS)}) VALUES ({', '.join('?' * len(_ENQUEUE_COLS))})",
                    (seq_id, number, *values))
        if taken is not None:  # the row is written already
            tx.held_rms[sequence_key] = taken
        else:
            tx.capture_key("rms_sequence", sequence_key)
            tx.hand_out(sequence_key, number, last)
            tx.held_rms[sequence_key] = (replace(seq, next_number=number + 1, last_message=True, last_number=number)
                                         if last else replace(seq, next_number=number + 1))
        return RmsMessage(
            sequence_key=sequence_key, number=number, message_id=message_id, action=action,
            soap_version=soap_version, payload=bytes(payload), last=last,
            reply_callback=reply_callback,
            reply_context=None if reply_context is None else bytes(reply_context),
            reply_pending=reply_callback is not None or awaits_reply,
            next_send_at=t if send_at is None else float(send_at), created_at=t,
            send_count=1 if handed_out else 0, last_sent_at=t if handed_out else None)

    def enqueue_claiming(self, sequence_key: str, payload: bytes, *, action: str, soap_version: str,
                         message_id: str, target: str, next_send_at: float, rmd_sequence_id: str | None = None,
                         reply_callback: str | None = None, reply_context: bytes | None = None,
                         send_at: float | None = None, awaits_reply: bool = False, now: float | None = None,
                         acked: Sequence[tuple[int, int]] | None = None
                         ) -> tuple[RmsMessage, bool, RmsSequence, RmdSequence | None] | None:
        """On PostgreSQL, one statement: :meth:`_take_number`'s with the message inserted, as
        sent once (its attempt recorded as :meth:`claim_first_send` records it) when the
        sequence is started and live, goes to ``target`` and the message before it is
        acknowledged (or purged), and the RMD row read beside it (a plain SELECT: no lock).
        Not with ``acked`` (None: the caller applies them, then claims).

        The statement reads the messages as committed when it began: a message before it
        acknowledged while the statement waited for the sequence's row is seen unacknowledged,
        and the message is then inserted unclaimed (its caller's send claims it after the
        commit, as without this statement), never claimed ahead of one still out."""
        tx = self._tx
        if not tx.d.writable_cte or tx.undo is not None or not isinstance(payload, (bytes, bytearray)) \
                or len(payload) >= COPY_PAYLOAD_AT or sequence_key in tx._numbered or sequence_key in tx.took_number \
                or acked:
            return None
        t = _now(now)
        due = t if send_at is None else float(send_at)
        tx.lock(RANK_RMS, sequence_key)
        tx.capture_key("rms_sequence", sequence_key)
        read = f", r AS ({_SELECT_RMD}) " if rmd_sequence_id is not None else " "
        # in the engine's own transaction (no global one), no sequential scan, as where it rides on
        # the COMMIT (_ENQUEUES_AT_COMMIT): its claim's look at the message before, planned with a
        # busy queue's stale statistics, read the whole table.  The setting lasts to the end of the
        # transaction, whose other statements go by key too; not in a global transaction, whose
        # session may be the application's (its own statements keep its plans).
        rows = tx.write_all(
            ("SET LOCAL enable_seqscan TO off; " if tx._global is None else "") + _ENQUEUE_CLAIMING
            + read + f"SELECT {_cols(_RMS_COLS, 's')}, c.mine" + (", r.*" if rmd_sequence_id is not None else "")
            + " FROM s JOIN c ON TRUE" + (" LEFT JOIN r ON TRUE" if rmd_sequence_id is not None else ""),
            _in_order(_ENQUEUE_CLAIMING_NAMES,
                      _claiming_params(sequence_key, payload, action, soap_version, message_id, target, next_send_at,
                                       reply_callback, reply_context, awaits_reply, due, t),
                      *((rmd_sequence_id,) if rmd_sequence_id is not None else ())))
        if not rows:  # it takes no more messages: enqueue says precisely why
            msg = self.enqueue(sequence_key, payload, action=action, soap_version=soap_version,
                               message_id=message_id, reply_callback=reply_callback, reply_context=reply_context,
                               send_at=send_at, now=now, awaits_reply=awaits_reply)
            return msg, False, self._seq(sequence_key), None
        row = rows[0]
        width = len(_RMS_COLS)
        seq = tx.held_rms[sequence_key] = _rms(row[:width])
        tx.took_number.add(sequence_key)
        rmd = _rmd(row[width + 1:]) if rmd_sequence_id is not None and row[width + 1] is not None else None
        msg = RmsMessage(
            sequence_key=sequence_key, number=seq.next_number - 1, message_id=message_id, action=action,
            soap_version=soap_version, payload=bytes(payload), last=False, reply_callback=reply_callback,
            reply_context=None if reply_context is None else bytes(reply_context),
            reply_pending=reply_callback is not None or awaits_reply, next_send_at=due, created_at=t)
        return msg, bool(row[width]), seq, rmd

    def enqueue_claiming_at_commit(self, sequence_key: str, payload: bytes, *, action: str, soap_version: str,
                                   message_id: str, target: str | None, next_send_at: float,
                                   enqueued: Callable[[RmsMessage, bool, Callable[[], tuple[RmsSequence,
                                                                                         RmdSequence | None]]], None],
                                   otherwise: Callable[[], None], rmd_sequence_id: str | None = None,
                                   reply_callback: str | None = None, reply_context: bytes | None = None,
                                   send_at: float | None = None, awaits_reply: bool = False,
                                   now: float | None = None) -> bool:
        """On a branch of a global transaction whose session sends it by SQL: :meth:`enqueue_claiming`'s
        statement riding to the branch's COMMIT (``SqlTransaction.write_at_commit``), its outcome
        kept in a session setting, the sequence's row as it wrote it included, and read after the
        COMMIT, in the same round trip (the setting alone: :data:`_ENQUEUED_AT_COMMIT`).  The
        sequence's row is locked only from there to the COMMIT's end.  ``enqueued`` is given the
        message, whether it was claimed, and what gives the sequence's row and the RMD row read
        beside (parsed only when asked: a one-way message's sender needs only its number).
        Where the sequence takes no message by then (closed, faulted, gone...) the statement
        divides by zero (``_DECLINED``): its savepoint rolls back, and ``otherwise()`` enqueues."""
        tx = self._tx
        if not tx.d.writable_cte or tx.undo is not None or not isinstance(payload, (bytes, bytearray)) \
                or len(payload) >= COPY_PAYLOAD_AT or sequence_key in tx._numbered or sequence_key in tx.took_number:
            return False
        t = _now(now)
        due = t if send_at is None else float(send_at)
        claiming = _claiming_params(sequence_key, payload, action, soap_version, message_id, target, next_send_at,
                                    reply_callback, reply_context, awaits_reply, due, t)

        def answer(row: Any) -> None:
            number, claimed, read = row[0].split(" ", 2)
            # parsed once, when asked (a list, not functools.cache: its wrapper cost every
            # message 16 k instructions, against 5 k for the split and this closure)
            parsed: list[tuple[RmsSequence, RmdSequence | None]] = []

            def rows() -> tuple[RmsSequence, RmdSequence | None]:
                if not read:  # (read after the commit, a message no caller claims: enqueued() never asks)
                    raise RuntimeError("a one-way message's enqueue riding to the commit reads no rows back")
                if not parsed:
                    written, beside = json.loads(read)
                    parsed.append((_rms(tuple(written[c] for c in _RMS_COLS)),
                                   None if beside is None else _rmd(tuple(beside[c] for c in _RMD_COLS))))
                return parsed[0]

            if sequence_key in tx.riding_rms:
                tx.riding_rms.discard(sequence_key)
                if tx.conn.get_transaction_status():  # libpq's: not idle, so read before the commit
                    # (another statement came: the row stays locked by the enqueue's UPDATE until
                    # the commit, as written, and read with the outcome: _ENQUEUED_BEFORE_COMMIT
                    # where the statement keeps its number only; the next read needs no round trip)
                    tx.held_rms[sequence_key] = rows()[0]
            enqueued(RmsMessage(
                sequence_key=sequence_key, number=int(number), message_id=message_id, action=action,
                soap_version=soap_version, payload=bytes(payload), last=False, reply_callback=reply_callback,
                reply_context=None if reply_context is None else bytes(reply_context),
                reply_pending=reply_callback is not None or awaits_reply, next_send_at=due, created_at=t),
                claimed == "1", rows)

        # planned once a session (_PLANNED_ONCE): every part of it goes by a key; the setting
        # ends with the transaction, whose COMMIT follows it (a decline's rollback to its
        # savepoint undoes it too)
        reads = rmd_sequence_id is not None
        replies = reply_callback is not None or reply_context is not None or awaits_reply
        sql, names = _ENQUEUES_AT_COMMIT[(target is not None, reads, replies, send_at is None)]
        if not tx.write_at_commit(sql, _in_order(names, claiming, *((rmd_sequence_id,) if reads else ())),
                                  _ENQUEUED_AT_COMMIT, (), answer, otherwise,
                                  None if target is not None or reads else (_ENQUEUED_BEFORE_COMMIT, (sequence_key,))):
            return False
        # the row's number is the database's to know until the commit: nothing here holds it
        tx.held_rms.pop(sequence_key, None)
        tx.shared_rms.discard(sequence_key)
        tx.took_number.add(sequence_key)
        tx.riding_rms.add(sequence_key)
        return True

    def _take_number(self, sequence_key: str, last: bool, message: tuple[Any, ...] = ()) -> RmsSequence | None:
        """The transaction's first enqueue on a sequence: lock its row and take the next number in
        one ``UPDATE ... RETURNING`` (the row as changed), instead of a SELECT ... FOR UPDATE and
        an UPDATE (also when the transaction read the row already: a reply enqueued after its
        sequence was looked at).  None when the transaction enqueued on it already (the batch's
        later enqueues only remember their numbers, see :meth:`SqlTransaction.flush`), or it takes
        no message: then nothing was changed and the caller's check says precisely why.

        With ``message`` (the values of the rms_message row after its key) the same statement
        inserts the message under the number taken (a data-modifying WITH)."""
        tx = self._tx
        if sequence_key in tx._numbered or sequence_key in tx.took_number:
            return None
        tx.lock(RANK_RMS, sequence_key)
        tx.capture_key("rms_sequence", sequence_key)
        also = ", last_message = TRUE, last_number = highest_number + 1" if last else ""
        update = (f"UPDATE rms_sequence SET highest_number = highest_number + 1{also} WHERE seq_key = ? "
                  f"AND NOT ({_CLOSED_TO_ENQUEUES}) "
                  f"AND highest_number < ? RETURNING {_cols(_RMS_COLS)}")
        if not message:
            rows = tx.write_all(update, (sequence_key, api.MAX_MESSAGE_NUMBER))
        else:
            rest = _ENQUEUE_COLS[2:]
            rows = tx.write_all(
                f"WITH s AS ({update}), m AS (INSERT INTO rms_message ({_cols(_ENQUEUE_COLS)}) "
                f"SELECT s.id, s.highest_number, {', '.join('?' * len(rest))} FROM s RETURNING number) "
                f"SELECT {_cols(_RMS_COLS, 's')} FROM s", (sequence_key, api.MAX_MESSAGE_NUMBER, *message))
        if not rows:
            return None
        tx.took_number.add(sequence_key)
        return _rms(rows[0])

    def _with_payloads(self, msgs: list[RmsMessage]) -> list[RmsMessage]:
        """``msgs`` with the large payloads :func:`_read_cols` left out read, by one COPY."""
        return with_large_payloads(self._tx, msgs, "rms_message m JOIN rms_sequence s ON s.id = m.seq",
                                   "s.seq_key, m.number", lambda m: (m.sequence_key, m.number))

    def get(self, sequence_key: str, number: int) -> RmsMessage | None:
        seq = self._seq_id(sequence_key)  # sequence row first, then its messages: one order for all
        tx = self._tx
        row = tx.one(f"SELECT {_read_cols(tx)} FROM rms_message WHERE seq = ? AND number = ?" + tx.d.for_update,
                     (seq, number))
        return self._with_payloads([_msg(row, sequence_key)])[0] if row else None

    def _require(self, sequence_key: str, number: int) -> RmsMessage:
        msg = self.get(sequence_key, number)
        if msg is None:
            raise UnknownMessageError(
                f"no message {number} of RMS sequence {sequence_key!r} in the store")
        return msg

    def find_by_message_id(self, message_id: str) -> RmsMessage | None:
        row = self._tx.one(f"SELECT {msg_cols(self._tx.d, 'm', 's.seq_key')} FROM rms_message m "
                           "JOIN rms_sequence s ON s.id = m.seq WHERE m.message_id = ? AND m.awaits_reply "
                           "ORDER BY m.created_at LIMIT 1", (message_id,))
        return _msg(row) if row else None

    def mark_acked(self, sequence_key: str, ranges: Iterable[tuple[int, int]],
                   now: float | None = None) -> list[int]:
        seq = self._seq(sequence_key)
        merged = api.AckRanges.from_ranges(ranges)
        tx = self._tx

        def unsent(lo: int, hi: int) -> list[int]:
            return [r[0] for r in tx.all(
                "SELECT number FROM rms_message WHERE seq = ? AND number BETWEEN ? AND ? "
                "AND send_count = 0 ORDER BY number LIMIT 20", (_id(seq), lo, hi))]

        api.check_ack(seq, merged, unsent)
        newly: list[int] = []
        for lo, hi in merged.ranges:
            where = "seq = ? AND number BETWEEN ? AND ? AND NOT acked"
            params = (_id(seq), lo, hi)
            tx.capture("rms_message", where, params)
            # the numbers it changed come back with the update: no SELECT before it
            newly.extend(sorted(r[0] for r in tx.write_all(
                f"UPDATE rms_message SET acked = TRUE WHERE {where} RETURNING number", params)))
        tx.capture_key("rms_sequence", sequence_key)
        t = _now(now)
        tx.write("UPDATE rms_sequence SET last_activity = ? WHERE seq_key = ?", (t, sequence_key))
        tx.held_rms[sequence_key] = replace(seq, last_activity=t)  # the purge after it reads it again
        return newly

    def acknowledge(self, sequence_key: str, ranges: Iterable[tuple[int, int]],
                    now: float | None = None, *, keep_awaiting: bool = False) -> tuple[list[int], bool]:
        """On PostgreSQL, one statement: the check that every number named was sent, the
        acknowledged messages deleted (those that wait for no reply: what :meth:`purge_acked`
        would delete next) or marked (those that do), the sequence's row written when there is
        something to write (its retransmissions purged, or its ``last_activity`` older than
        :data:`ACTIVITY_GRAIN`) and no one else holds it, and whether one is left
        unacknowledged; nothing written when the check fails.  The sequence's row as it is then
        is held for the rest of the transaction.

        Unlike the three steps, acknowledged messages left from before (a reply's request
        acknowledged before its reply came) are purged even when nothing is newly
        acknowledged: they would only wait for the next acknowledgement otherwise."""
        tx = self._tx
        merged = api.AckRanges.from_ranges(ranges)
        if not merged.ranges or tx.undo is not None:
            return super().acknowledge(sequence_key, merged.ranges, now, keep_awaiting=keep_awaiting)
        if not tx.d.writable_cte or tx.d.payload_apart:
            return self._acknowledge_in_four(sequence_key, merged, now, keep_awaiting=keep_awaiting)
        seq = self._seq(sequence_key)
        api.check_ack(seq, merged, lambda lo, hi: ())  # a number never handed out: refused before any statement
        sql, params = _acknowledging(merged, _now(now), seq=_id(seq), kept=keep_awaiting)
        tx.capture_key("rms_sequence", sequence_key)
        rows = tx.write_all(sql + " FROM (SELECT 1) AS one LEFT JOIN s ON TRUE", params)
        bad, newly, pending = rows[0][:3]
        if bad:
            raise api.InvalidAcknowledgementError(sequence_key, sorted(bad), seq.highest_number)
        # the row as written, or as held before when the statement left it alone
        tx.held_rms[sequence_key] = _rms(rows[0][3:]) if rows[0][3] is not None else seq
        return list(newly), bool(pending)

    def acknowledge_sequence(self, sequence_id: str, ranges: Iterable[tuple[int, int]],
                             now: float | None = None, *, keep_offered_awaiting: bool = False,
                             beside_enqueues: bool = False, alone: bool = False
                             ) -> tuple[RmsSequence, tuple[list[int], bool] | None] | None:
        """On PostgreSQL, one round trip: the sequence's row locked (a statement of its own, as
        ``get_by_sequence_id`` locks it: the acknowledgement after it then runs on a snapshot
        that sees whatever the lock waited for), then :meth:`acknowledge`'s statement, which
        also reads the row and writes only when the sequence is transmitting and no number
        named is above its highest (that one is refused without a statement, as before).

        ``beside_enqueues``: the row held ``FOR KEY SHARE`` when the sequence is open to
        enqueues, and the acknowledgement written only then (its last message not known, it
        owes no Close nor Terminate after it); a sequence closed to enqueues is then locked and
        acknowledged as without it, in a statement after.  ``alone``: the transaction's first
        write goes without BEGIN (``next_write_commits``): PostgreSQL commits it as its query
        string ends, so a transaction of this acknowledgement alone is that one round trip."""
        tx = self._tx
        merged = api.AckRanges.from_ranges(ranges)
        ahead = tx.ran_ahead.pop(ahead_key("acknowledged", sequence_id, merged.ranges, keep_offered_awaiting),
                                 None) if tx.ran_ahead else None
        if ahead is not None:  # ran in the receipt's round trip (receive_in_order's acknowledging)
            tx.lock(RANK_RMS, ("sequence_id", sequence_id))
            return self.acknowledged_from(ahead, merged)
        if not self.acknowledges_in_one(sequence_id, merged):
            return super().acknowledge_sequence(sequence_id, merged.ranges, now,
                                                keep_offered_awaiting=keep_offered_awaiting,
                                                beside_enqueues=beside_enqueues)
        tx.lock(RANK_RMS, ("sequence_id", sequence_id))
        beside = beside_enqueues and bool(tx.d.key_share)
        [(lock, lock_params), then] = self.acknowledging_statements(
            sequence_id, merged, now, keep_offered_awaiting,
            gate=f" AND NOT ({_CLOSED_TO_ENQUEUES})" if beside else "",
            hold=tx.d.key_share if beside else " FOR UPDATE")
        if alone:
            tx.next_write_commits()
            if tx.commits_alone and tx.d.name == "postgresql":  # its query string is the transaction
                lock = _PLANNED_ONCE + lock
        cur = tx.execute(lock, lock_params, then=then)
        row = cur.fetchone()
        cur.close()
        if beside and row[3 + len(_RMS_COLS)] is not None and _closed_to_enqueues(_rms(row[3 + len(_RMS_COLS):])):
            # neither held nor written (the gate): locked against every writer, as without beside_enqueues
            return super().acknowledge_sequence(sequence_id, merged.ranges, now,
                                                keep_offered_awaiting=keep_offered_awaiting)
        return self.acknowledged_from(row, merged)

    def acknowledges_in_one(self, sequence_id: str, merged: api.AckRanges) -> bool:
        """Does :meth:`acknowledge_sequence` run :meth:`acknowledging_statements` (PostgreSQL, the
        sequence's row not held yet, something acknowledged)?"""
        tx = self._tx
        return bool(merged.ranges) and tx.undo is None and tx.d.writable_cte and not tx.d.payload_apart \
            and bool(tx.d.for_update) and not any(h.sequence_id == sequence_id for h in tx.held_rms.values())

    def acknowledging_statements(self, sequence_id: str, merged: api.AckRanges, now: float | None,
                                 keep_offered_awaiting: bool, *, gate: str = "",
                                 more: tuple[str, str, Sequence[Any]] = ("", "", ()),
                                 hold: str = " FOR UPDATE") -> list[tuple[str, Sequence[Any]]]:
        """:meth:`acknowledge_sequence`'s two statements: the sequence's row locked (``hold``),
        then :meth:`acknowledge`'s statement, which also reads the row.  ``gate`` and ``more``
        as :meth:`answering_statements`' (with ``gate`` false, nothing is locked nor written)."""
        sql, params = _acknowledging(merged, _now(now), seq=None, kept=keep_offered_awaiting)
        columns, join, values = more
        # ``g``: the sequence when the acknowledgement applies to it (see rms_life: started and
        # live), and whether it keeps the requests waiting for their replies (it has an Offer)
        return [
            (f"SELECT {_WRITERS_BESIDE if hold and hold == self._tx.d.key_share else 1} FROM rms_sequence "
             f"WHERE sequence_id = ?{gate}{hold}", (sequence_id,)),
            (f"WITH q AS (SELECT {_cols(_RMS_COLS)} FROM rms_sequence WHERE sequence_id = ?), "
             "g AS (SELECT id, offered_id IS NOT NULL AND ? AS kp FROM q WHERE started "
             f"AND NOT terminate_sent AND NOT faulted AND highest_number >= ?{gate}), "
             + sql.removeprefix("WITH ") + f", {_cols(_RMS_COLS, 'q')}{columns} "
             f"FROM (SELECT 1) AS one LEFT JOIN s ON TRUE LEFT JOIN q ON TRUE{join}",
             (sequence_id, keep_offered_awaiting, max(hi for _, hi in merged.ranges), *params, *values))]

    def acknowledged_from(self, row: Sequence[Any], merged: api.AckRanges
                          ) -> tuple[RmsSequence, tuple[list[int], bool] | None] | None:
        """:meth:`acknowledge_sequence`'s outcome from its last statement's row."""
        tx = self._tx
        width = 3 + len(_RMS_COLS)
        if row[width] is None:
            return None
        seq = _rms(row[width:])
        tx.lock(RANK_RMS, seq.key)
        tx.held_rms[seq.key] = seq  # locked: as get_by_sequence_id leaves it
        if not rms_life(seq).transmitting:
            return seq, None
        bad, newly, pending = row[:3]
        if bad or max(hi for _, hi in merged.ranges) > seq.highest_number:  # nothing was written
            if not bad:  # above the highest number handed out: refused as acknowledge refuses it
                api.check_ack(seq, merged, lambda lo, hi: ())
            raise api.InvalidAcknowledgementError(seq.key, sorted(bad), seq.highest_number)
        tx._wrote = True
        tx.capture_key("rms_sequence", seq.key)
        tx.held_rms[seq.key] = _rms(row[3:width]) if row[3] is not None else seq
        return seq, (list(newly), bool(pending))

    def _acknowledge_in_four(self, sequence_key: str, merged: api.AckRanges, now: float | None, *,
                             keep_awaiting: bool) -> tuple[list[int], bool]:
        """:meth:`acknowledge` where one statement cannot write two tables (SQLite): one read
        (the check that every number named was sent, whether one stays unacknowledged, whether
        a request named waits for its reply), the acknowledged messages deleted and their
        payloads after them, the sequence's row written once.  Four statements where the three
        steps ran six or seven, each of them while the store's file is held by this
        transaction (every enqueue waits for it); the same result, as on PostgreSQL."""
        tx = self._tx
        seq = self._seq(sequence_key)
        api.check_ack(seq, merged, lambda lo, hi: ())  # a number never handed out: refused before any statement
        within = "(" + " OR ".join("number BETWEEN ? AND ?" for _ in merged.ranges) + ")"
        bounds = [v for pair in merged.ranges for v in pair]
        kept = "reply_pending" if keep_awaiting else "0"  # kept waiting for their replies
        n = _id(seq)
        bad, pending, to_mark = tx.one(
            "SELECT (SELECT group_concat(number) FROM (SELECT number FROM rms_message WHERE seq = ? "
            f"AND {within} AND send_count = 0 AND NOT {kept} ORDER BY number LIMIT 20)), "
            f"EXISTS (SELECT 1 FROM rms_message WHERE seq = ? AND NOT acked AND (NOT {within} OR {kept})), "
            f"EXISTS (SELECT 1 FROM rms_message WHERE seq = ? AND reply_pending AND NOT acked AND NOT {kept} "
            f"AND {within})", (n, *bounds, n, *bounds, n, *bounds))
        if bad:
            raise api.InvalidAcknowledgementError(sequence_key, sorted(int(n) for n in str(bad).split(",")),
                                                  seq.highest_number)
        # the two kinds of rows found through their own indexes: "acked OR within" in one
        # condition read every row of the sequence, and a backlog made each acknowledgement dearer
        # (apart: whether its payload is in rms_payload, which leaves the row's own empty)
        deleted = tx.write_all(
            "DELETE FROM rms_message WHERE rowid IN (SELECT rowid FROM rms_message WHERE seq = ? "
            f"AND {within} UNION ALL SELECT rowid FROM rms_message WHERE seq = ? AND acked) "
            "AND NOT reply_pending RETURNING number, acked, send_count, length(payload) = 0",
            (n, *bounds, n))
        newly = [number for number, acked, _, _ in deleted if not acked]
        if to_mark:  # requests whose replies are still to come: acknowledged, kept until they come
            newly.extend(r[0] for r in tx.write_all(
                "UPDATE rms_message SET acked = TRUE WHERE seq = ? AND reply_pending AND NOT acked "
                f"AND {within} RETURNING number", (n, *bounds)))
        apart = [number for number, _, _, empty in deleted if empty]
        if apart and tx.d.payload_apart:
            self._delete_payloads(n, apart)
        extra = sum(sent - 1 for _, _, sent, _ in deleted if sent > 1)
        t = _now(now)
        # the sequence's row only when there is something to write, as on PostgreSQL
        # (see ACTIVITY_GRAIN)
        if extra or seq.last_activity is None or seq.last_activity < t - ACTIVITY_GRAIN:
            tx.capture_key("rms_sequence", sequence_key)
            tx.write("UPDATE rms_sequence SET last_activity = ?, purged_retransmissions = "
                     "purged_retransmissions + ? WHERE seq_key = ?", (t, int(extra), sequence_key))
            tx.held_rms[sequence_key] = replace(seq, last_activity=t,
                                                purged_retransmissions=seq.purged_retransmissions + int(extra))
        return sorted(newly), bool(pending)

    def claim_first_sends(self, sequence_key: str, limit: int, *, next_send_at: float,
                          now: float | None = None, after: int = 0) -> list[RmsMessage]:
        """The messages read (by the sequence's unacknowledged ones, in number order, only as
        many as asked for) and their attempts recorded: on PostgreSQL one statement, else two.

        PostgreSQL's statement locks no row before it writes it: its read (``m``) takes no lock,
        and the UPDATE writes only a row that is still unsent and unacknowledged once its lock
        is granted (READ COMMITTED looks at the row again after waiting), so a message another
        transaction sent or acknowledged meanwhile is left out, as the lock of the read left it
        out before.  The rows come back as the read saw them, before the update (the statement's
        snapshot), those the update wrote only.  A read locked FOR UPDATE wrote a row lock into
        the WAL for each message before its update (54 B a message, 16 sequences under XA)."""
        tx = self._tx
        seq = self._seq_id(sequence_key)  # sequence row first, then its messages: one order for all
        if tx.d.writable_cte and tx.undo is None:
            sql, names = placeholders.named(
                _generic_plan(tx) + f"WITH {self._first_sends_claim(tx)} "
                "SELECT * FROM m WHERE number IN (SELECT number FROM u) ORDER BY number")
            rows = tx.write_all(sql, _in_order(names, self._first_sends_params(seq, limit, next_send_at, now, after)))
            msgs = [_msg(r, sequence_key) for r in rows]
            if not msgs:  # a message sent already: nothing written
                return []
            return self._with_payloads(msgs)
        rows = tx.all(f"SELECT {_read_cols(tx)} FROM rms_message WHERE seq = ? AND NOT acked "
                      f"AND {_DUE} AND number > ? ORDER BY number LIMIT ?" + tx.d.for_update,
                      (seq, _now(now), _now(now), after, max(0, limit)))
        msgs = [_msg(r, sequence_key) for r in rows]
        if not msgs or any(m.send_count for m in msgs):
            return []
        self.record_send_attempts(sequence_key, [m.number for m in msgs], next_send_at=next_send_at, now=now)
        return self._with_payloads(msgs)

    @staticmethod
    def _first_sends_claim(tx: SqlTransaction) -> str:
        """The WITH items of :meth:`claim_first_sends`: ``m``, the sequence's first due
        unacknowledged messages, and ``u``, their
        attempts recorded, none when one of them was sent; parameters from
        :meth:`_first_sends_params`, named (:func:`.placeholders.named`: each value sent once).
        Both go by the primary key whatever the statistics say, so that PostgreSQL may keep one
        generic plan of the statement (:data:`_GENERIC_PLAN`).

        ``acked IS FALSE`` (the column is NOT NULL: the same rows as ``NOT acked``) keeps the
        partial indexes out of the planner's choice, as ``NOT acked`` would not: PostgreSQL
        cannot prove their ``WHERE NOT acked`` from it.  Without it, a generic plan made on a
        busy queue's stale statistics read ``m`` through ``rms_message_unacked``, every due
        message of the sequence, and sorted them (20,000 rows for a claim of 16 at a backlog of
        20,000), and took ``u``'s numbers as a filter of the same index's range of the
        sequence.  ``u`` names its rows by ``number = ANY(ARRAY(...))``, an index condition of
        the primary key: as ``IN (SELECT number FROM m)``, the generic plan made on fresh
        statistics read the whole table and hashed it (5.7 ms against 0.46 at 20,000)."""
        return (f"m AS (SELECT {_read_cols(tx)} FROM rms_message WHERE seq = ?seq AND acked IS FALSE "
                f"AND {_DUE_NOW} AND number > ?after ORDER BY number LIMIT ?limit), "
                f"u AS (UPDATE rms_message SET send_count = send_count + 1, last_sent_at = ?now, {_FIRST_SEND_AT} "
                "WHERE seq = ?seq AND number = ANY(ARRAY(SELECT number FROM m)) AND send_count = 0 "
                "AND acked IS FALSE AND NOT EXISTS (SELECT 1 FROM m WHERE send_count > 0) RETURNING number)")

    @staticmethod
    def _first_sends_params(seq: int | None, limit: int, next_send_at: float,
                            now: float | None, after: int = 0) -> dict[str, Any]:
        """The values of :meth:`_first_sends_claim`'s named parameters (``seq`` None where its
        ``seq`` is an expression)."""
        return {"seq": seq, "now": _now(now), "after": after, "limit": max(0, limit), "next_send_at": next_send_at}

    def claim_first_sends_of(self, sequence_key: str, limit: int, *, next_send_at: float,
                             now: float | None = None, after: int = 0) -> tuple[RmsSequence | None, list[RmsMessage]]:
        """On PostgreSQL, one statement: the sequence's row read and held ``FOR KEY SHARE`` if it is
        open to enqueues (``q``, as :meth:`_Rms.get` with ``beside_enqueues`` reads it), and
        :meth:`claim_first_sends`'s claim when it is transmitting.  The row is locked before the
        messages are read (``m`` waits for ``q``): one order for all.  A lock that waited for a
        change of the sequence's state reads the row as that change left it (READ COMMITTED),
        and ``q`` is then empty when it closed it to enqueues; the messages are read as
        committed when the statement began, and the update writes only those still unsent and
        unacknowledged (as :meth:`claim_first_sends`'s).  A sequence closed to enqueues (its
        last message known, closing, ...) is read and claimed the general way.

        ``p``: the row read unlocked, and whether its first due message is one never sent (read
        as ``m`` reads them, on the statement's snapshot).  Otherwise ``q`` takes no lock and the
        sequence is returned as read, not held: nothing would be claimed (none due, or a
        retransmission due first, which the claim leaves to the round), and the lock alone took
        a transaction id and wrote a commit record, the lanes' refills with nothing to claim
        (0.03-0.05 a message with none due; then 0.05-0.08 with a retransmission due first,
        their acknowledgements still to come, XA in one database at 16 callers under load,
        ``BENCH_PG_COMMITS=tables``)."""
        tx = self._tx
        if not tx.d.for_update and tx.undo is None and not tx._numbered and sequence_key not in tx.held_rms:
            return self._claim_first_sends_of_here(sequence_key, limit, next_send_at, now, after)
        if not tx.d.key_share or not tx.d.writable_cte or tx.undo is not None or tx._numbered \
                or sequence_key in tx.held_rms:
            return super().claim_first_sends_of(sequence_key, limit, next_send_at=next_send_at, now=now, after=after)
        tx.lock(RANK_RMS, sequence_key)
        sql, names = _claim_of(tx)
        rows = tx.write_all(sql, _in_order(names, {**self._first_sends_params(None, limit, next_send_at, now, after),
                                                   "key": sequence_key}))
        width = len(_RMS_COLS)
        if not rows:  # no such sequence
            return super().claim_first_sends_of(sequence_key, limit, next_send_at=next_send_at, now=now, after=after)
        first = rows[0]
        read = _rms(first[:width])
        if first[width + 1] is None:  # q empty: nothing locked, nothing written
            if not _closed_to_enqueues(read) and not (first[width] and _sends(read)):
                return read, []  # open, nothing to claim: read, not held (its lock alone was a commit record)
            # closed to enqueues, or changed while the lock waited
            tx.rms.get(sequence_key)  # locked against every writer, as get(beside_enqueues=True) then locks it
            return super().claim_first_sends_of(sequence_key, limit, next_send_at=next_send_at, now=now, after=after)
        if not first[width + 1]:  # the lock holds a version newer than the one read: read it
            read = _rms(tx.one(_SELECT_RMS, (sequence_key,)))
        seq = tx.held_rms[sequence_key] = read
        tx.shared_rms.add(sequence_key)
        msgs = sorted((_msg(r[width + 2:], sequence_key) for r in rows if r[width + 2] is not None),
                      key=_number)
        return seq, self._with_payloads(msgs) if msgs else []

    def _claim_first_sends_of_here(self, sequence_key: str, limit: int, next_send_at: float,
                                   now: float | None, after: int = 0) -> tuple[RmsSequence | None, list[RmsMessage]]:
        """:meth:`claim_first_sends_of` where the transaction holds the whole file (SQLite): the
        sequence's row and its first due messages in one read (the messages joined to the row),
        then their attempts recorded: two statements where reading the row first made three."""
        tx = self._tx
        tx.lock(RANK_RMS, sequence_key)
        t = _now(now)
        rows = tx.all(
            f"SELECT {_cols(_RMS_COLS, 'q')}, m.* FROM rms_sequence q LEFT JOIN (SELECT {_read_cols(tx)} "
            "FROM rms_message WHERE seq = (SELECT id FROM rms_sequence WHERE seq_key = ?) AND NOT acked "
            f"AND {_DUE} AND number > ? ORDER BY number LIMIT ?) m ON TRUE WHERE q.seq_key = ? ORDER BY m.number",
            (sequence_key, t, t, after, max(0, limit), sequence_key))
        if not rows:
            return None, []
        width = len(_RMS_COLS)
        seq = tx.held_rms[sequence_key] = _rms(rows[0][:width])
        if seq.sequence_id is None or not rms_life(seq).transmitting:
            return seq, []
        msgs = [_msg(r[width:], sequence_key) for r in rows if r[width] is not None]
        if not msgs or any(m.send_count for m in msgs):  # a retransmission due: left to the round
            return seq, []
        self.record_send_attempts(sequence_key, [m.number for m in msgs], next_send_at=next_send_at, now=now)
        return seq, self._with_payloads(msgs)

    def claim_first_send(self, sequence_key: str, number: int, *, next_send_at: float,
                         now: float | None = None) -> RmsMessage | None:
        """On PostgreSQL, one statement: the message read, the one before it checked and the
        attempt recorded."""
        tx = self._tx
        if tx.undo is not None:
            return super().claim_first_send(sequence_key, number, next_send_at=next_send_at, now=now)
        if not tx.d.writable_cte:
            return self._claim_first_send_in_two(sequence_key, number, next_send_at, now)
        seq = self._seq_id(sequence_key)
        rows = tx.write_all(self._first_send_claim(tx) + " SELECT * FROM m",
                            self._first_send_params(seq, number, next_send_at, now))
        return self._with_payloads([_msg(rows[0], sequence_key)])[0] if rows else None

    def _claim_first_send_in_two(self, sequence_key: str, number: int, next_send_at: float,
                                 now: float | None) -> RmsMessage | None:
        """:meth:`claim_first_send` where one statement cannot read a row as it was and write it
        (SQLite): the message read if it is the caller's to send (the one before it checked in the
        same read), then its attempt recorded as PostgreSQL's statement records it (no indexed
        column moved).  Two statements and one read of the payload, where reading the message,
        reading the one before it and recording the attempt (which read the row back) made three
        of each."""
        tx = self._tx
        seq = self._seq_id(sequence_key)  # sequence row first, then its messages: one order for all
        row = tx.one(f"SELECT {_read_cols(tx)} FROM rms_message WHERE seq = ? AND number = ? AND NOT acked "
                     "AND send_count = 0 AND NOT EXISTS (SELECT 1 FROM rms_message b WHERE b.seq = ? "
                     "AND b.number = ? AND NOT b.acked)", (seq, number, seq, number - 1))
        if row is None:
            return None
        tx.capture_key("rms_message", seq, number)
        tx.write(f"UPDATE rms_message SET send_count = send_count + 1, last_sent_at = ?, {_FIRST_SEND} "
                 "WHERE seq = ? AND number = ?",
                 (_now(now), next_send_at, next_send_at, next_send_at, seq, number))
        return self._with_payloads([_msg(row, sequence_key)])[0]

    @staticmethod
    def _first_send_claim(tx: SqlTransaction) -> str:
        """The WITH of :meth:`claim_first_send`: ``m``, the message if it is the caller's to send
        (unsent, unacknowledged, the one before it acknowledged), and its attempt recorded."""
        return (f"WITH m AS (SELECT {_read_cols(tx)} FROM rms_message WHERE seq = ? AND number = ? "
                "AND NOT acked AND send_count = 0 AND NOT EXISTS (SELECT 1 FROM rms_message b "
                "WHERE b.seq = ? AND b.number = ? AND NOT b.acked)), "
                f"u AS (UPDATE rms_message SET send_count = send_count + 1, last_sent_at = ?, {_FIRST_SEND} "
                "WHERE seq = ? AND number = ? AND EXISTS (SELECT 1 FROM m))")

    @staticmethod
    def _first_send_params(seq: int, number: int, next_send_at: float,
                           now: float | None) -> tuple[Any, ...]:
        return (seq, number, seq, number - 1, _now(now), next_send_at, next_send_at, next_send_at, seq, number)

    def claim_first_send_reading(self, sequence_key: str, number: int, rmd_sequence_id: str, *,
                                 next_send_at: float, now: float | None = None
                                 ) -> tuple[RmsMessage | None, RmdSequence | None]:
        """On PostgreSQL, one statement: :meth:`claim_first_send`'s, and the RMD row read
        beside it (a plain SELECT: no lock)."""
        tx = self._tx
        if not tx.d.writable_cte or tx.undo is not None:
            return super().claim_first_send_reading(sequence_key, number, rmd_sequence_id,
                                                     next_send_at=next_send_at, now=now)
        seq = self._seq_id(sequence_key)
        rows = tx.write_all(
            self._first_send_claim(tx) + f", r AS ({_SELECT_RMD}) "
            "SELECT m.*, r.* FROM (SELECT 1) AS one LEFT JOIN m ON TRUE LEFT JOIN r ON TRUE",
            (*self._first_send_params(seq, number, next_send_at, now), rmd_sequence_id))
        width = len(_MSG_COLS)
        row = rows[0]
        msg = self._with_payloads([_msg(row[:width], sequence_key)])[0] if row[0] is not None else None
        return msg, _rmd(row[width:]) if row[width] is not None else None

    def due_messages(self, now: float | None = None, limit: int = 100, *,
                     per_sequence: int | None = None, payloads: bool = True) -> list[RmsMessage]:
        tx = self._tx
        tx.lock(RANK_RMS, "due messages")
        if per_sequence is not None:  # round robin: every sequence's first due message, then the seconds...
            # the sequences that may send (a plain read: no transaction begun for it); none, as on
            # a service that only receives: nothing is due, and the scan (on PostgreSQL its
            # transaction's BEGIN, settings and COMMIT too) is not sent at all
            sending = int(tx.one("SELECT count(*) FROM rms_sequence WHERE sequence_id IS NOT NULL AND NOT faulted")[0])
            if not sending:
                return []
            if tx.d.lateral:
                # Each sequence's first ``per_sequence`` due messages, ranked once, in a CTE: as
                # a join, the planner (whose statistics of these busy tables are always stale)
                # ran the per-sequence ranking again for every due message, due x due index
                # entries per claim (6 ms for 50 due messages, while the sequence's row was
                # locked, holding up every enqueue).  Four times the batch are candidates, so
                # that sequences another transaction holds (skipped) leave others to take.  The
                # candidates' rows are then fetched by their ctid (a TID scan): joined by key,
                # the planner read every due message of a backlog to hash it (3,955 rows for a
                # batch of 50 at 4,000 queued).  A row updated meanwhile has another ctid: its
                # recheck under the lock fails and it is left to the next batch.
                # Each sequence is first asked for about twice its share of the batch, as on the
                # other stores (16 sequences: 8 each, not 50: 800 index entries ranked per claim);
                # again for up to ``per_sequence`` only when that leaves the batch short while a
                # sequence gave that many.
                full = min(per_sequence, limit)
                take = min(full, max(4, 2 * -(-limit // sending)))
                while True:
                    rows = tx.all(
                        _ordered_scan(tx)
                        + "WITH r AS MATERIALIZED (SELECT s.seq_key, x.number, x.rn, x.tid FROM rms_sequence s "
                        "CROSS JOIN LATERAL (SELECT number, ctid AS tid, ROW_NUMBER() OVER (ORDER BY next_send_at, "
                        f"number) AS rn FROM rms_message WHERE seq = s.id AND NOT acked AND {_DUE} "
                        "ORDER BY next_send_at, number LIMIT ?) x "
                        "WHERE s.sequence_id IS NOT NULL AND NOT s.faulted "
                        "ORDER BY x.rn, s.seq_key LIMIT ?) "
                        f"SELECT {_read_cols(tx, 'm', 's.seq_key')}, {_cols(_RMS_COLS, 's')}, r.rn "
                        "FROM r JOIN rms_message m ON m.ctid = r.tid "
                        "JOIN rms_sequence s ON s.seq_key = r.seq_key "
                        "WHERE m.ctid = ANY(ARRAY(SELECT tid FROM r)) "
                        f"AND NOT m.acked AND {_DUE_M} AND s.sequence_id IS NOT NULL AND NOT s.faulted "
                        "ORDER BY r.rn, m.next_send_at, s.seq_key, m.number LIMIT ?"
                        + tx.d.claim_lock("s", "m"), (_now(now), _now(now), take, 4 * limit, _now(now), _now(now),
                                                      limit))
                    if len(rows) >= limit or take >= full or all(row[-1] < take for row in rows):
                        msgs = self._with_sequences([row[:-1] for row in rows])
                        return self._with_payloads(msgs) if payloads else msgs
                    take = full
            # SQLite (no LATERAL): each sequence's first due messages by a correlated subquery on
            # the unacked index, one index range per sequence, ranked here.  Ranking every due
            # message in SQL (a window over all of them) made a batch cost as much as the backlog
            # is long: 100,000 queued messages were ranked for every 50 sent.  Only their keys
            # are read to rank them; the rows (payload and sequence) only of those the batch
            # takes: with 16 sequences of 100 queued messages each, reading every candidate's row
            # read 800 payloads for a batch of 50 (6.4 ms a claim, holding the file that every
            # enqueue waits for, against 1.0 ms).
            # Each sequence is first asked for about twice its share of the batch (as the memory
            # store does); again for up to ``per_sequence`` only when that leaves the batch short
            # while a sequence had that many.
            full = min(per_sequence, limit)
            take = min(full, max(4, 2 * -(-limit // sending)))
            while True:
                candidates = self._sqlite_due_candidates(now, take)
                ranked: dict[str, list[tuple[float, int, int]]] = {}
                for rowid, key, number, next_send_at in candidates:
                    ranked.setdefault(key, []).append((next_send_at, number, rowid))
                if len(candidates) >= limit or take >= full or all(len(c) < take for c in ranked.values()):
                    break
                take = full
            chosen = sorted((rank, at, key, number, rowid)
                            for key, keys in ranked.items()
                            for rank, (at, number, rowid) in enumerate(sorted(keys), 1))[:limit]
            return self._sqlite_rows_of([(key, number, rowid) for _, _, key, number, rowid in chosen])
        if tx.d.lateral:
            # PostgreSQL has no index of all due messages (schema version 8): each sequence's
            # first ``limit`` due ones by its own index, the oldest of those fetched by their
            # ctid and locked (as the round robin above does).  A message that another
            # transaction holds is skipped as before; the batch is then filled only from the
            # candidates, so it may come out shorter than the due messages would allow.
            rows = tx.all(
                _ordered_scan(tx)
                + "WITH r AS MATERIALIZED (SELECT x.tid FROM rms_sequence s CROSS JOIN LATERAL "
                f"(SELECT ctid AS tid, next_send_at, number FROM rms_message WHERE seq = s.id "
                f"AND NOT acked AND {_DUE} ORDER BY next_send_at, number LIMIT ?) x "
                "WHERE s.sequence_id IS NOT NULL AND NOT s.faulted "
                "ORDER BY x.next_send_at, s.seq_key, x.number LIMIT ?) "
                f"SELECT {_read_cols(tx, 'm', 's.seq_key')} FROM rms_message m JOIN rms_sequence s ON s.id = m.seq "
                f"WHERE m.ctid = ANY(ARRAY(SELECT tid FROM r)) AND NOT m.acked AND {_DUE_M} "
                "AND s.sequence_id IS NOT NULL AND NOT s.faulted ORDER BY m.next_send_at, s.seq_key, m.number "
                "LIMIT ?" + tx.d.lock_of("s, m"),
                (_now(now), _now(now), limit, 4 * limit, _now(now), _now(now), limit))
            return self._with_payloads([_msg(r) for r in rows]) if payloads else [_msg(r) for r in rows]
        # SQLite has no index of all due messages either (schema version 12): each sequence's
        # first ``limit`` due ones by its own index, the oldest ``limit`` of those read.
        oldest = sorted((at, key, number, rowid)
                        for rowid, key, number, at in self._sqlite_due_candidates(now, limit))[:limit]
        return self._sqlite_rows_of([(key, number, rowid) for _, key, number, rowid in oldest])

    def _sqlite_due_candidates(self, now: float | None, take: int) -> list[Any]:
        """SQLite: the keys (rowid, sequence key, number, next_send_at) of each sending sequence's
        first ``take`` due messages, by a correlated subquery on the sequence's unacked index:
        one index range per sequence, however long the backlog."""
        return self._tx.all(
            "SELECT x.rowid, s.seq_key, x.number, x.next_send_at FROM rms_sequence s "
            "JOIN rms_message x ON x.rowid IN "
            "(SELECT y.rowid FROM rms_message y WHERE y.seq = s.id AND NOT y.acked "
            "AND y.next_send_at <= ? AND (y.retry_at IS NULL OR y.retry_at <= ?) "
            "ORDER BY y.next_send_at, y.number LIMIT ?) "
            "WHERE s.sequence_id IS NOT NULL AND NOT s.faulted",
            (_now(now), _now(now), take))

    def _sqlite_rows_of(self, chosen: list[tuple[str, int, int]]) -> list[RmsMessage]:
        """SQLite: the messages ``chosen`` (sequence key, number, rowid), in that order, with their
        sequences' rows kept as held (:meth:`_with_sequences`)."""
        tx = self._tx
        found: dict[tuple[str, int], RmsMessage] = {}
        rowids = [c[2] for c in chosen]
        for start in range(0, len(rowids), 500):  # below any build's limit of bound values
            part = rowids[start:start + 500]
            rows = tx.all(
                f"SELECT {msg_cols(tx.d, 'm', 's.seq_key')}, {_cols(_RMS_COLS, 's')} FROM rms_message m "
                "JOIN rms_sequence s ON s.id = m.seq "
                f"WHERE m.rowid IN ({', '.join('?' * len(part))})" + tx.d.lock_of("s, m"), tuple(part))
            found.update(((m.sequence_key, m.number), m) for m in self._with_sequences(rows))
        return [found[(key, number)] for key, number, _ in chosen if (key, number) in found]

    def with_payloads(self, msgs: Sequence[RmsMessage]) -> list[RmsMessage]:
        return self._with_payloads(list(msgs))

    def _with_sequences(self, rows: list[Any]) -> list[RmsMessage]:
        """The messages of rows that also hold their sequence's columns; the sequences, which
        the statement locked (or SQLite's whole file), are kept as held by this transaction: the
        sender's round reads each of them next, and that read is then no round trip."""
        width = len(_MSG_COLS)
        held = self._tx.held_rms
        out = []
        for row in rows:
            msg = _msg(row[:width])
            if msg.sequence_key not in held:
                held[msg.sequence_key] = _rms(row[width:])
            out.append(msg)
        return out

    def record_send_attempt(self, sequence_key: str, number: int, *, next_send_at: float,
                            now: float | None = None) -> RmsMessage:
        seq = self._seq_id(sequence_key)
        tx = self._tx
        tx.capture_key("rms_message", seq, number)
        rows = tx.write_all(
            "UPDATE rms_message SET send_count = send_count + 1, last_sent_at = ?, "
            f"next_send_at = ?, retry_at = NULL WHERE seq = ? AND number = ? RETURNING {msg_cols(tx.d)}",
            (_now(now), next_send_at, seq, number))
        if not rows:
            raise UnknownMessageError(
                f"no message {number} of RMS sequence {sequence_key!r} in the store")
        return _msg(rows[0], sequence_key)

    def record_send_attempts(self, sequence_key: str, numbers: Iterable[int], *, next_send_at: float,
                             now: float | None = None) -> int:
        return self._update_each(self._seq_id(sequence_key), numbers,
                                 f"send_count = send_count + 1, last_sent_at = ?, {_SEND}",
                                 (_now(now), next_send_at, next_send_at, next_send_at))

    def record_send_attempts_across(self, numbers: Mapping[str, Iterable[int]], *, next_send_at: float,
                                    now: float | None = None) -> int:
        tx = self._tx
        # the sequences' ids: locked by the round's claim already, no round trip
        wanted = {self._seq_id(key): sorted(set(n)) for key, n in sorted(numbers.items())}
        changed = 0
        chunk: list[tuple[int, list[int]]] = []
        size = 0
        for key, found in [*wanted.items(), (0, [])]:  # a last empty one sends what is gathered
            if chunk and (not found or size + len(found) > 500):
                where = " OR ".join(f"(seq = ? AND {_numbers_in(n)})" for _, n in chunk)
                params = [v for k, n in chunk for v in (k, n[0], n[-1], *n)]
                tx.capture("rms_message", where, params)
                changed += tx.write("UPDATE rms_message SET send_count = send_count + 1, last_sent_at = ?, "
                                    f"{_SEND} WHERE {where}",
                                    (_now(now), next_send_at, next_send_at, next_send_at, *params))
                chunk, size = [], 0
            if found:
                chunk.append((key, found))
                size += len(found) + 1
        return changed

    def make_due(self, sequence_key: str, numbers: Iterable[int], at: float | None = None) -> int:
        return self._update_each(self._seq_id(sequence_key), numbers, "next_send_at = ?, retry_at = NULL",
                                 (_now(at),), " AND NOT acked")

    def _update_each(self, seq: int, numbers: Iterable[int], assignments: str,
                     values: tuple[Any, ...], condition: str = "") -> int:
        """UPDATE the named messages of the sequence whose id is ``seq``, 500 numbers a statement;
        how many changed."""
        tx = self._tx
        wanted = sorted(set(numbers))
        changed = 0
        for i in range(0, len(wanted), 500):
            chunk = wanted[i:i + 500]
            where = f"seq = ? AND {_numbers_in(chunk)}{condition}"
            params = (seq, chunk[0], chunk[-1], *chunk)
            tx.capture("rms_message", where, params)
            changed += tx.write(f"UPDATE rms_message SET {assignments} WHERE {where}", (*values, *params))
        return changed

    def mark_answered(self, message_id: str) -> tuple[str, int, bool] | None:
        """On PostgreSQL, one round trip: the request's sequence row locked (a statement of its
        own, as ``receive_in_order`` does: the update after it then runs on a snapshot that sees
        whatever it waited for), the request marked answered and the sequence's row read, held
        for the rest of the transaction."""
        tx = self._tx
        if not tx.d.for_update or not tx.d.writable_cte or tx.undo is not None:
            return super().mark_answered(message_id)
        request = f"(SELECT seq, number FROM rms_message WHERE {_REQUEST} ORDER BY created_at LIMIT 1)"
        cur = tx.execute(
            f"SELECT 1 FROM rms_sequence WHERE id = (SELECT seq FROM {request} r) FOR UPDATE",
            (message_id,),
            then=(f"WITH m AS (UPDATE rms_message SET reply_pending = FALSE WHERE (seq, number) = {request} "
                  "AND reply_pending RETURNING seq, number, acked) "
                  f"SELECT m.number, m.acked, {_cols(_RMS_COLS, 's')} FROM m "
                  "JOIN rms_sequence s ON s.id = m.seq",
                  (message_id,)))
        row = cur.fetchone()
        cur.close()
        if row is None:
            return None
        seq = _rms(row[2:])
        tx.lock(RANK_RMS, seq.key)
        tx.held_rms[seq.key] = seq
        tx._wrote = True
        return seq.key, int(row[0]), bool(row[1])

    def mark_answered_acknowledging(self, message_id: str, sequence_id: str, ranges: Iterable[tuple[int, int]],
                                    now: float | None = None, *, keep_offered_awaiting: bool = False
                                    ) -> tuple[tuple[str, int, bool] | None,
                                               tuple[RmsSequence, list[int], bool] | None]:
        """On PostgreSQL, one round trip of three statements (:meth:`answering_statements`), or
        none when the receipt of the reply ran them already in its own round trip
        (``receive_in_order``'s ``answering``: the row is then kept in ``tx.ran_ahead``)."""
        tx = self._tx
        merged = api.AckRanges.from_ranges(ranges)
        ahead = tx.ran_ahead.pop(ahead_key("answered", message_id, sequence_id, merged.ranges,
                                           keep_offered_awaiting), None) if tx.ran_ahead else None
        if ahead is not None:
            return self.answered_from(ahead)
        if not tx.d.for_update or not tx.d.writable_cte or tx.undo is not None or not merged.ranges:
            return super().mark_answered_acknowledging(message_id, sequence_id, merged.ranges, now,
                                                       keep_offered_awaiting=keep_offered_awaiting)
        [(lock, lock_params), *then] = self.answering_statements(message_id, sequence_id, merged, now,
                                                                 keep_offered_awaiting)
        cur = tx.execute(lock, lock_params, then=then)
        row = cur.fetchone()
        cur.close()
        return self.answered_from(row)

    def answering_statements(self, message_id: str, sequence_id: str, merged: api.AckRanges,
                             now: float | None, keep_offered_awaiting: bool, *, gate: str = "",
                             more: tuple[str, str, Sequence[Any]] = ("", "", ())) -> list[tuple[str, Sequence[Any]]]:
        """:meth:`mark_answered_acknowledging`'s three statements (PostgreSQL): :meth:`mark_answered`'s
        two (the sequence's row locked, the request marked answered, which a transaction-local
        setting tells the third), then :meth:`acknowledge`'s statement on a snapshot of its own,
        which also reads the request and its sequence and writes only when the acknowledgement
        applies (as ``acknowledge_sequence``'s); when it does not, nothing of it is written and
        the caller goes on as after :meth:`mark_answered` alone.

        ``gate``: a condition (`` AND ...``) without which the first two lock and write nothing
        (the third then writes nothing either); ``more``: columns added to the last one's select
        list, a join after its own and their parameters (a receipt running them in its round
        trip reads its own outcome there: see ``SqlTransaction.receive_in_order``)."""
        request = f"(SELECT seq, number FROM rms_message WHERE {_REQUEST} ORDER BY created_at LIMIT 1)"
        sql, params = _acknowledging(merged, _now(now), seq=None, kept=keep_offered_awaiting)
        named = " OR ".join("r.number BETWEEN ? AND ?" for _ in merged.ranges)
        columns, join, values = more
        return [
            (f"SELECT 1 FROM rms_sequence WHERE id = (SELECT seq FROM {request} r){gate} FOR UPDATE",
             (message_id,)),
            (f"WITH m AS (UPDATE rms_message SET reply_pending = FALSE WHERE (seq, number) = {request} "
             f"AND reply_pending{gate} RETURNING number) "
             "SELECT set_config('wsrm.answered', (SELECT count(*) FROM m)::text, TRUE)", (message_id,)),
            (f"WITH r AS (SELECT seq, number, acked FROM rms_message WHERE {_REQUEST} "
             "ORDER BY created_at LIMIT 1), "
             f"q AS (SELECT {_cols(_RMS_COLS)} FROM rms_sequence WHERE id = (SELECT seq FROM r)), "
             # the acknowledgement applies: to the request just answered, not acknowledged
             # yet, of its sequence, which is transmitting (see rms_life: started and live)
             "g AS (SELECT q.id, q.offered_id IS NOT NULL AND ? AS kp FROM q, r "
             "WHERE current_setting('wsrm.answered') = '1' AND NOT r.acked AND q.sequence_id = ? "
             "AND q.started AND NOT q.terminate_sent AND NOT q.faulted AND q.highest_number >= ? "
             f"AND ({named})), "
             + sql.removeprefix("WITH ") + f", {_cols(_RMS_COLS, 'q')}, r.number, r.acked, "
             f"current_setting('wsrm.answered') = '1', EXISTS (SELECT 1 FROM g){columns} "
             f"FROM (SELECT 1) AS one LEFT JOIN s ON TRUE LEFT JOIN q ON TRUE LEFT JOIN r ON TRUE{join}",
             (message_id, keep_offered_awaiting, sequence_id, max(hi for _, hi in merged.ranges),
              *(v for pair in merged.ranges for v in pair), *params, *values))]

    def answered_from(self, row: Sequence[Any]) -> tuple[tuple[str, int, bool] | None,
                                                         tuple[RmsSequence, list[int], bool] | None]:
        """:meth:`mark_answered_acknowledging`'s outcome from its last statement's row (the
        request's sequence's row held, and locked in the order's bookkeeping)."""
        tx = self._tx
        width = 3 + len(_RMS_COLS)
        number, acked, answered, applies = row[2 * width - 3:2 * width + 1]
        if not answered:
            return None, None
        seq = _rms(row[width:2 * width - 3])
        tx.lock(RANK_RMS, seq.key)
        tx.held_rms[seq.key] = seq
        tx._wrote = True
        bad, newly, pending = row[:3]
        if not applies or bad:  # not written: the caller goes on as after mark_answered
            return (seq.key, int(number), bool(acked)), None
        tx.capture_key("rms_sequence", seq.key)
        tx.held_rms[seq.key] = _rms(row[3:width]) if row[3] is not None else seq
        return (seq.key, int(number), bool(acked)), (seq, list(newly), bool(pending))

    def reply_received(self, sequence_key: str, number: int) -> RmsMessage:
        seq = self._seq_id(sequence_key)  # sequence row first, then its messages: one order for all
        tx = self._tx
        tx.capture_key("rms_message", seq, number)
        rows = tx.write_all(f"UPDATE rms_message SET reply_pending = FALSE WHERE seq = ? AND number = ? "
                            f"RETURNING {msg_cols(tx.d)}", (seq, number))
        if not rows:
            raise UnknownMessageError(f"no message {number} of RMS sequence {sequence_key!r} in the store")
        return _msg(rows[0], sequence_key)

    def count_unacked(self, sequence_key: str | None = None) -> int:
        if sequence_key is None:
            row = self._tx.one("SELECT COUNT(*) FROM rms_message WHERE NOT acked")
        else:
            seq, key = self._seq_is(sequence_key)
            row = self._tx.one(f"SELECT COUNT(*) FROM rms_message WHERE {seq} AND NOT acked", key)
        return int(row[0])

    def count_in_flight(self, sequence_key: str, window: int, now: float | None = None) -> int:
        # Two bounded reads, neither walking the unsent backlog: the first ``window``
        # unacknowledged rows by number (the primary key: ``acked IS FALSE`` keeps the partial
        # unacked index, which would read every unacknowledged row to sort them by number, out of
        # the planners' choice), and the rows sent again, whose ``next_send_at`` moved past
        # ``now`` (that index's range after it; a first send keeps its place there).  Reading
        # every row of the sequence (its payload too) made each round cost as much as the backlog
        # is long: 1,005 -> 12,350 SQLite steps a message from 200 to 4,000 queued
        # (tests/engine/test_backlog_drain.py).  PostgreSQL, with a busy queue's stale
        # statistics, read the sequence in a bitmap scan and sorted it, unless told to read the
        # key in its order (_ordered_scan: 8,000 tuples read at 4,000 queued, 32 with it).
        # A third read, as bounded, finds a message sent once out of number order (a first send
        # keeps its ``next_send_at``, see _FIRST_SEND, so the second read never sees it): the
        # first ``window`` unacknowledged rows by due time (the unacked index, in its order).
        # First sends go in that order, so a message sent once is among them unless the window
        # is full already.  Out of number order they go when lower numbers wait unsent for later:
        # held for an unreachable peer (a restart forgets the hold, the new ones go first), a
        # probe taking a later message; without it the window then counted none of them, and
        # let every new message go (tests/store/test_backlog.py).
        seq, key = self._seq_is(sequence_key)
        limit = max(window, 0)
        row = self._tx.one(
            _ordered_scan(self._tx)
            + "SELECT count(*) FROM (SELECT number FROM (SELECT number, send_count FROM rms_message "
            f"WHERE {seq} AND acked IS FALSE ORDER BY number LIMIT ?) f WHERE send_count > 0 "
            "UNION SELECT number FROM (SELECT number, send_count FROM rms_message "
            f"WHERE {seq} AND NOT acked ORDER BY next_send_at, number LIMIT ?) d WHERE send_count > 0 "
            f"UNION SELECT number FROM rms_message WHERE {seq} AND NOT acked AND next_send_at > ? "
            "AND send_count > 0) u", (*key, limit, *key, limit, *key, _now(now)))
        return int(row[0])

    def oldest_unacked(self, sequence_key: str) -> float | None:
        seq, key = self._seq_is(sequence_key)
        row = self._tx.one(f"SELECT MIN(created_at) FROM rms_message WHERE {seq} AND NOT acked", key)
        return None if row is None or row[0] is None else float(row[0])

    def has_unacked(self, sequence_key: str) -> bool:
        seq, key = self._seq_is(sequence_key)
        # from the highest number down: the messages acknowledged (and purged) last are the
        # lowest, whose rows and index entries stay, dead, until a vacuum; the newest are live
        return self._tx.one(f"SELECT 1 FROM rms_message WHERE {seq} AND NOT acked ORDER BY number DESC LIMIT 1",
                            key) is not None

    def purge_acked(self, sequence_key: str | None = None) -> int:
        tx = self._tx
        purgeable = "acked AND NOT reply_pending"
        if sequence_key is None:
            keys = [r[0] for r in tx.all(
                "SELECT DISTINCT s.seq_key FROM rms_message m JOIN rms_sequence s ON s.id = m.seq "
                f"WHERE {purgeable} ORDER BY s.seq_key")]
        else:
            keys = [sequence_key]
        purged = 0
        for key in keys:
            tx.lock(RANK_RMS, key)
            if sequence_key is None and tx.d.skip_locked:
                row = tx.one("SELECT id FROM rms_sequence WHERE seq_key = ?"
                             + tx.d.lock_of("rms_sequence"), (key,))
                if row is None:
                    continue  # another transaction holds it: purge it next time
                seq = int(row[0])
            else:
                seq = self._seq_id(key)
            where = f"seq = ? AND {purgeable}"
            tx.capture("rms_message", where, (seq,))
            # (apart: whether its payload is in rms_payload, which leaves the row's own empty)
            apart = ", length(payload) = 0" if tx.d.payload_apart else ""
            counts = tx.write_all(f"DELETE FROM rms_message WHERE {where} RETURNING send_count, number{apart}",
                                  (seq,))
            count = len(counts)
            if not count:
                continue
            if tx.d.payload_apart:
                self._delete_payloads(seq, [row[1] for row in counts if row[2]])
            extra = sum(row[0] - 1 for row in counts if row[0] > 1)
            if extra:
                tx.capture_key("rms_sequence", key)
                tx.write("UPDATE rms_sequence SET purged_retransmissions = "
                         "purged_retransmissions + ? WHERE seq_key = ?", (int(extra), key))
            purged += int(count)
        return purged

    def _delete_payloads(self, seq: int, numbers: list[int]) -> None:
        """The payloads of the messages of sequence ``seq`` (its id) just deleted (``Dialect.payload_apart``)."""
        tx = self._tx
        if not numbers:
            return
        numbers = sorted(numbers)
        for i in range(0, len(numbers), 500):
            where = f"seq = ? AND number IN ({_in_list(numbers[i:i + 500])})"
            params = (seq, *numbers[i:i + 500])
            tx.capture("rms_payload", where, params)
            tx.write(f"DELETE FROM rms_payload WHERE {where}", params)

    def tally(self, sequence_key: str) -> tuple[int, int, int]:
        seq, key = self._seq_is(sequence_key)
        row = self._tx.one(
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN acked THEN 0 ELSE 1 END), 0), "
            "COALESCE(SUM(CASE WHEN send_count > 1 THEN send_count - 1 ELSE 0 END), 0) "
            f"FROM rms_message WHERE {seq}", key)
        return int(row[0]), int(row[1]), int(row[2])

    def list_for(self, sequence_key: str) -> list[RmsMessage]:
        seq, key = self._seq_is(sequence_key)
        rows = self._tx.all(f"SELECT {msg_cols(self._tx.d)} FROM rms_message WHERE {seq} ORDER BY number", key)
        return [_msg(r, sequence_key) for r in rows]
