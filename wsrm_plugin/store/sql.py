"""The SQL logic both SQL stores share (SQLite and PostgreSQL).

Every statement is written once, with ``?`` placeholders and the row locks
spelled through a :class:`Dialect`; what differs between the two databases is
confined there: placeholder style, column types (blob, bigint, boolean,
double), ``FOR UPDATE`` / ``SKIP LOCKED`` (SQLite has neither: the SQLite store
serializes whole transactions instead, see :mod:`.sqlite`).  Upserts use
``INSERT ... ON CONFLICT DO NOTHING``, which both understand.

The tables follow seed 004's database design (one set of tables per manager,
touched in the lock order RMD, invoker buffer, RMS):

``rms_sequence`` / ``rms_message``
    source sequences and their retransmission queue;
``rmd_sequence``
    destination sequences, received numbers kept as compact ranges text;
``invoker_sequence`` / ``invoker_message``
    what was delivered (ranges, plus the in-order prefix so a poller finds the
    next deliverable message in SQL) and what waits to be, with each waiting
    message's delivery history (failed attempts, retry cycle, next attempt);
``poison_message``
    messages given up after their last retry cycle, kept until an operator
    retries or discards them (schema version 3);
``schema_version``
    one row per applied migration; a store is migrated when it is opened.

For the SQLite store's XA support a transaction can also *capture undo*:
before any write, the before-image of every row it touches (or "did not
exist") is kept, keyed by table and primary key; see :class:`SqlTransaction`.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from . import api
from .api import (
    RANK_INVOKER, RANK_RMD, RANK_RMS, BufferedMessage, DuplicateSequenceError, InvokerSequence,
    RmdSequence, RmsMessage, RmsSequence, SchemaVersionError, UnknownMessageError,
    UnknownSequenceError, _now,
)

if TYPE_CHECKING:
    from .prepared import PreparedStatements

__all__ = ["Dialect", "SQLITE", "POSTGRES", "SqlTransaction", "migrate", "LATEST_VERSION",
           "encode_undo", "decode_undo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dialect:
    """What differs between the SQL databases, and nothing else."""

    name: str
    placeholder: str
    blob: str
    bigint: str
    double: str
    boolean: str
    #: appended to a SELECT that locks its rows
    for_update: str
    #: appended to a polling SELECT: lock the rows of ``{alias}``, skip those others hold
    skip_locked: str
    #: the SQLite store keeps prepared XA branches in its own table
    xa_table: bool
    #: LATERAL joins (a top-N per sequence without ranking every due message)
    lateral: bool = False
    #: data-modifying statements in WITH (two dependent writes in one round trip)
    writable_cte: bool = False

    def sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def lock_of(self, alias: str) -> str:
        return self.skip_locked.format(alias=alias)


SQLITE = Dialect(name="sqlite", placeholder="?", blob="BLOB", bigint="INTEGER", double="REAL",
                 boolean="INTEGER", for_update="", skip_locked="", xa_table=True)
POSTGRES = Dialect(name="postgresql", placeholder="%s", blob="BYTEA", bigint="BIGINT",
                   double="DOUBLE PRECISION", boolean="BOOLEAN", for_update=" FOR UPDATE",
                   skip_locked=" FOR UPDATE OF {alias} SKIP LOCKED", xa_table=False, lateral=True,
                   writable_cte=True)


# --------------------------------------------------------------------------
# Schema and migrations
# --------------------------------------------------------------------------

def _migration_1(d: Dialect) -> list[str]:
    B, I, D, BL = d.boolean, d.bigint, d.double, d.blob  # noqa: E741 -- the DDL's column-type shorthands
    out = [
        f"""CREATE TABLE rms_sequence (
            seq_key TEXT PRIMARY KEY,
            sequence_id TEXT UNIQUE,
            target TEXT NOT NULL,
            acks_to TEXT NOT NULL,
            rm_version TEXT NOT NULL,
            wsa_version TEXT NOT NULL,
            offered_id TEXT,
            started {B} NOT NULL DEFAULT FALSE,
            last_message {B} NOT NULL DEFAULT FALSE,
            last_number {I},
            close_sent {B} NOT NULL DEFAULT FALSE,
            closed {B} NOT NULL DEFAULT FALSE,
            terminate_sent {B} NOT NULL DEFAULT FALSE,
            faulted {B} NOT NULL DEFAULT FALSE,
            fault_reason TEXT,
            highest_number {I} NOT NULL DEFAULT 0,
            control_attempts INTEGER NOT NULL DEFAULT 0,
            next_control_at {D},
            expires {D},
            created_at {D} NOT NULL,
            last_activity {D} NOT NULL,
            purged_retransmissions {I} NOT NULL DEFAULT 0
        )""",
        f"""CREATE TABLE rms_message (
            seq_key TEXT NOT NULL,
            number {I} NOT NULL,
            message_id TEXT NOT NULL,
            action TEXT NOT NULL,
            soap_version TEXT NOT NULL,
            payload {BL} NOT NULL,
            last {B} NOT NULL DEFAULT FALSE,
            reply_callback TEXT,
            reply_context {BL},
            reply_pending {B} NOT NULL DEFAULT FALSE,
            send_count INTEGER NOT NULL DEFAULT 0,
            next_send_at {D} NOT NULL,
            last_sent_at {D},
            acked {B} NOT NULL DEFAULT FALSE,
            created_at {D} NOT NULL,
            PRIMARY KEY (seq_key, number)
        )""",
        "CREATE INDEX rms_message_due ON rms_message (next_send_at) WHERE NOT acked",
        "CREATE INDEX rms_message_msgid ON rms_message (message_id)",
        f"""CREATE TABLE rmd_sequence (
            sequence_id TEXT PRIMARY KEY,
            acks_to TEXT NOT NULL,
            rm_version TEXT NOT NULL,
            wsa_version TEXT NOT NULL,
            principal TEXT,
            offered_id TEXT,
            received TEXT NOT NULL DEFAULT '',
            last_number {I},
            closed {B} NOT NULL DEFAULT FALSE,
            terminated {B} NOT NULL DEFAULT FALSE,
            ack_due_at {D},
            expires {D},
            created_at {D} NOT NULL,
            last_activity {D} NOT NULL
        )""",
        "CREATE INDEX rmd_sequence_ack ON rmd_sequence (ack_due_at) WHERE ack_due_at IS NOT NULL",
        f"""CREATE TABLE invoker_sequence (
            sequence_id TEXT PRIMARY KEY,
            delivered TEXT NOT NULL DEFAULT '',
            delivered_upto {I} NOT NULL DEFAULT 0
        )""",
        f"""CREATE TABLE invoker_message (
            sequence_id TEXT NOT NULL,
            number {I} NOT NULL,
            message_id TEXT,
            action TEXT NOT NULL,
            soap_version TEXT NOT NULL,
            payload {BL} NOT NULL,
            reply_to TEXT,
            received_at {D} NOT NULL,
            PRIMARY KEY (sequence_id, number)
        )""",
    ]
    if d.xa_table:
        out.append(f"""CREATE TABLE xa_prepared (
            xid TEXT PRIMARY KEY,
            undo {BL} NOT NULL,
            prepared_at {D} NOT NULL
        )""")
    return out


def _migration_2(d: Dialect) -> list[str]:
    """Indexes that keep the sender's statements independent of the backlog's size.

    A Spark job enqueues tens of thousands of messages at once.  Without
    these, each claim ranked every due message, and each acknowledgement
    counted and purged a sequence by reading all of its rows.
    """
    return [
        "CREATE INDEX rms_message_unacked ON rms_message (seq_key, next_send_at, number) WHERE NOT acked",
        "CREATE INDEX rms_message_acked ON rms_message (seq_key) WHERE acked",
    ]


def _migration_3(d: Dialect) -> list[str]:
    """Durable delivery retries and the poison store.

    A failed delivery rolls back, so its attempt count, retry cycle and next
    attempt time are written by a transaction of their own into the
    message's row: a restart goes on where it was instead of starting the
    budget again.  A message given up after its last cycle moves to
    ``poison_message``, never deleted by the engine.
    """
    BIG, D, BL, B = d.bigint, d.double, d.blob, d.boolean
    return [
        "ALTER TABLE invoker_message ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE invoker_message ADD COLUMN retry_cycle INTEGER NOT NULL DEFAULT 0",
        f"ALTER TABLE invoker_message ADD COLUMN next_attempt_at {D}",
        "ALTER TABLE invoker_message ADD COLUMN last_error TEXT",
        "CREATE INDEX invoker_message_retrying ON invoker_message (sequence_id) "
        "WHERE attempts > 0 OR retry_cycle > 0",
        f"""CREATE TABLE poison_message (
            sequence_id TEXT NOT NULL,
            number {BIG} NOT NULL,
            message_id TEXT,
            action TEXT NOT NULL,
            soap_version TEXT NOT NULL,
            payload {BL} NOT NULL,
            reply_to TEXT,
            received_at {D} NOT NULL,
            total_attempts INTEGER NOT NULL DEFAULT 0,
            cycles INTEGER NOT NULL DEFAULT 0,
            last_error TEXT,
            poisoned_at {D} NOT NULL,
            held {B} NOT NULL DEFAULT TRUE,
            PRIMARY KEY (sequence_id, number)
        )""",
    ]


#: (version, statements for a dialect).  Append new versions; never edit old ones.
MIGRATIONS = [(1, _migration_1), (2, _migration_2), (3, _migration_3)]
LATEST_VERSION = MIGRATIONS[-1][0]


def current_version(cur: Any, d: Dialect) -> int:
    cur.execute(d.sql("SELECT MAX(version) FROM schema_version"))
    row = cur.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _has_schema_version(cur: Any, d: Dialect) -> bool:
    if d.name == "postgresql":
        cur.execute("SELECT to_regclass('schema_version') IS NOT NULL")
    else:
        cur.execute("SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'")
    return bool(cur.fetchone()[0])


def migrate(conn: Any, d: Dialect, where: str, *, create: bool = True) -> int:
    """Bring the schema up to :data:`LATEST_VERSION` inside the caller's transaction.

    Idempotent: on an up-to-date store it only reads ``schema_version``.  The
    caller serializes concurrent openers (SQLite: the store's file lock;
    PostgreSQL: an advisory lock) and commits.  Returns the version found.
    ``create=False`` raises :class:`~.api.StoreNotFoundError` where there is no
    store yet (the caller rolls back).
    """
    cur = conn.cursor()
    if not create:
        try:
            current_version(cur, d)
        except Exception:  # noqa: BLE001 -- no such table: no store here
            raise api.StoreNotFoundError(f"there is no message store in {where} (no schema_version "
                                         "table): check the store URL") from None
    if not _has_schema_version(cur, d):
        # only then: PostgreSQL checks the privilege to create in the schema before it looks
        # whether the table is there, and a store's role may rightly lack it once the schema is made
        cur.execute(f"CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, "
                    f"applied_at {d.double} NOT NULL)")
    found = current_version(cur, d)
    if found > LATEST_VERSION:
        raise SchemaVersionError(
            f"{where} has schema version {found}, newer than this code's {LATEST_VERSION}: "
            "upgrade wsrm-plugin (or open a store written by this version)")
    for version, statements in MIGRATIONS:
        if version <= found:
            continue
        log.info("migrating %s to schema version %d", where, version)
        for statement in statements(d):
            cur.execute(statement)
        cur.execute(d.sql("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)"),
                    (version, time.time()))
    cur.close()
    return found


# --------------------------------------------------------------------------
# Row <-> record
# --------------------------------------------------------------------------

_RMS_COLS = ("seq_key", "target", "acks_to", "rm_version", "wsa_version", "offered_id",
             "sequence_id", "started", "last_message", "last_number", "close_sent", "closed",
             "terminate_sent", "faulted", "fault_reason", "highest_number", "control_attempts",
             "next_control_at", "expires", "created_at", "last_activity",
             "purged_retransmissions")
_MSG_COLS = ("seq_key", "number", "message_id", "action", "soap_version", "payload", "last",
             "reply_callback", "reply_context", "reply_pending", "send_count", "next_send_at",
             "last_sent_at", "acked", "created_at")
_RMD_COLS = ("sequence_id", "acks_to", "rm_version", "wsa_version", "principal", "offered_id",
             "received", "last_number", "closed", "terminated", "ack_due_at", "expires",
             "created_at", "last_activity")
#: the columns an enqueue writes (the key first)
_ENQUEUE_COLS = ("seq_key", "number", "message_id", "action", "soap_version", "payload", "last",
                 "reply_callback", "reply_context", "reply_pending", "next_send_at", "created_at")
_BUF_COLS = ("sequence_id", "number", "message_id", "action", "soap_version", "payload",
             "reply_to", "received_at", "attempts", "retry_cycle", "next_attempt_at", "last_error")
_POISON_COLS = ("sequence_id", "number", "message_id", "action", "soap_version", "payload",
                "reply_to", "received_at", "total_attempts", "cycles", "last_error", "poisoned_at",
                "held")

#: Primary keys, for undo capture.
PRIMARY_KEYS = {
    "rms_sequence": ("seq_key",),
    "rms_message": ("seq_key", "number"),
    "rmd_sequence": ("sequence_id",),
    "invoker_sequence": ("sequence_id",),
    "invoker_message": ("sequence_id", "number"),
    "poison_message": ("sequence_id", "number"),
}

_RMS_BOOLS = {"started", "last_message", "close_sent", "closed", "terminate_sent", "faulted"}


@functools.cache
def _cols(cols: tuple[str, ...], alias: str = "") -> str:
    """The column list of a statement; kept, since the statements are built at every call
    (the joins were 60 generator steps per reliable message)."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + c for c in cols)


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


# --------------------------------------------------------------------------
# Undo records (SQLite XA)
# --------------------------------------------------------------------------

UndoLog = dict[tuple[str, tuple[Any, ...]], "dict[str, Any] | None"]


def _enc(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
    return value


def _dec(value: Any) -> Any:
    if isinstance(value, dict):
        return base64.b64decode(value["$b"])
    return value


def encode_undo(undo: UndoLog) -> bytes:
    """Before-images as JSON (bytes base64-encoded): readable by an operator, no pickle."""
    items = [[table, [_enc(k) for k in pk], None if image is None
              else {c: _enc(v) for c, v in image.items()}]
             for (table, pk), image in undo.items()]
    return json.dumps(items, separators=(",", ":")).encode("utf-8")


def decode_undo(data: bytes) -> UndoLog:
    out: UndoLog = {}
    for table, pk, image in json.loads(bytes(data).decode("utf-8")):
        if table not in PRIMARY_KEYS:
            raise api.StoreError(f"corrupt undo record: unknown table {table!r}")
        out[(table, tuple(_dec(k) for k in pk))] = (
            None if image is None else {c: _dec(v) for c, v in image.items()})
    return out


# --------------------------------------------------------------------------
# The transaction and its managers
# --------------------------------------------------------------------------

class SqlTransaction(api.StoreTransaction):
    """A store transaction on one DB-API connection.

    ``finish(tx, commit)`` is the owning store's callback that ends the
    database transaction and gives the connection back.  When ``capture_undo``
    is set, :attr:`undo` collects the before-image of every row the
    transaction writes, the first time it writes it (the SQLite store's XA
    prepare keeps them durably).
    """

    # made on first use (see _OnFirstUse, set on the class below its managers)
    rms: _Rms
    rms_messages: _RmsMessages
    rmd: _Rmd
    invoker: _Invoker

    def __init__(self, store: Any, conn: Any, dialect: Dialect, *, capture_undo: bool = False) -> None:
        super().__init__()
        self._store = store
        self.conn = conn
        self.d = dialect
        self.undo: UndoLog | None = {} if capture_undo else None
        self._global: Any = None
        #: Set by a store whose connection is in autocommit mode for this transaction (the
        #: PostgreSQL store's local transactions): the transaction is opened by a BEGIN sent in
        #: the same round trip as its first statement that writes or locks rows; plain reads
        #: before that run on their own, which under READ COMMITTED (a new snapshot for every
        #: statement, in a transaction or not) reads exactly the same.  A poll that finds
        #: nothing then costs one round trip instead of three (BEGIN, SELECT, COMMIT), and every
        #: other transaction one less.  The store ends it (:attr:`begun`) with COMMIT/ROLLBACK.
        self.lazy_begin = False
        #: sent right after the lazy BEGIN (settings of this transaction only)
        self.begin_with = ""
        self.begun = False
        self._wrote = False
        self._savepoints = 0
        #: the store's prepared statements (PostgreSQL), or None: every statement sent as text
        self._statements: PreparedStatements | None = getattr(store, "statements", None)
        #: invoker rows this transaction holds locked, as it last wrote or read them: sequence id
        #: -> (delivered ranges, in-order prefix).  Nobody else can change a row while it is held,
        #: so a batch of deliveries reads each once.  Cleared when a savepoint rolls back.
        self.held_invoker: dict[str, tuple[api.AckRanges, int]] = {}
        #: RMD rows this transaction holds locked, as it last read or wrote them (a receive reads
        #: its sequence's row once, not again for each change).  Cleared when a savepoint rolls back.
        self.held_rmd: dict[str, RmdSequence] = {}
        #: Buffered messages read ahead for a batch of in-order deliveries: sequence id -> number
        #: -> message, for sequences whose invoker row this transaction holds.  Only a delivery
        #: removes a buffered message, so what was read stays true.  Cleared with held_invoker.
        self.read_ahead: dict[str, dict[int, BufferedMessage]] = {}
        #: The same for RMS rows (an enqueue reads its sequence once per batch of sends).
        self.held_rms: dict[str, RmsSequence] = {}
        #: Numbers enqueue handed out and not yet written to their rms_sequence row: key ->
        #: (highest number, the last one).  See :meth:`flush`.
        self._numbered: dict[str, tuple[int, bool]] = {}
        # rms, rms_messages, rmd and invoker: made on first use (see _OnFirstUse)

    # -- statements -----------------------------------------------------------------

    def execute(self, sql: str, params: Sequence[Any] = (), *,
                then: tuple[str, Sequence[Any]] | None = None) -> Any:
        """Run ``sql``; ``then``: a second statement sent in the same round trip, whose results
        the cursor holds (PostgreSQL runs it after ``sql``, with a snapshot of its own)."""
        self._check_open()
        if self._numbered and ("rms_sequence" in sql or (then is not None and "rms_sequence" in then[0])):
            self.flush()  # the statement reads or writes what enqueue has only remembered so far
        begin = ""
        if self.lazy_begin and not self.begun and (_opens_transaction(sql) or then is not None):
            begin = "BEGIN; " + self.begin_with
            self.begun = True
        statements = self._statements
        cur = None
        try:  # a session lost while preparing fails here too, and is translated like any other
            text = begin + self._text(sql, params)
            if then is not None:
                text += "; " + self._text(*then)
                params = (*params, *then[1])
            cur = self.conn.cursor()
            cur.execute(text, tuple(params))
        except Exception as exc:
            if cur is not None:
                cur.close()
            if statements is not None:
                statements.failed(self.conn, exc)
            translated = self._store._translate(exc)
            self._doom(translated or exc)
            if translated is not None:
                raise translated from exc
            raise
        return cur

    def _text(self, sql: str, params: Sequence[Any]) -> str:
        """What is sent for ``sql``: ``EXECUTE`` of its prepared statement, or the statement."""
        statements = self._statements
        text = None if statements is None else statements.text(self.conn, sql, params)
        return self.d.sql(sql) if text is None else text

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        cur = self.execute(sql, params)
        row = cur.fetchone()
        cur.close()
        return row

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        cur = self.execute(sql, params)
        rows = cur.fetchall()
        cur.close()
        return rows

    def write(self, sql: str, params: Sequence[Any] = ()) -> int:
        self._wrote = True
        cur = self.execute(sql, params)
        count = cur.rowcount
        cur.close()
        return count

    def write_all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """A write with RETURNING: every changed row's values, without a second round trip."""
        self._wrote = True
        return self.all(sql, params)

    def receive_and_take(self, sequence_id: str, number: int, *, last: bool = False,
                         now: float | None = None) -> bool:
        """On PostgreSQL, one statement: the received ranges written and the message taken,
        where the two steps took a round trip each.  The sequence's RMD row is held (the
        receive read it FOR UPDATE), so its new image is known without reading it back; the
        take is :meth:`_Invoker.take_next`'s own statement (and its waiting for a delivery in
        progress with it)."""
        if not self.d.for_update or number < 2:  # SQLite; a first message's row may not exist
            return super().receive_and_take(sequence_id, number, last=last, now=now)
        seq, changes = self.rmd._receipt(sequence_id, number, last=last, now=now)
        self.lock(RANK_INVOKER, sequence_id)
        self.capture_key("rmd_sequence", sequence_id)
        self.capture_key("invoker_sequence", sequence_id)
        sets, values = _rmd_assignments(changes)
        self._wrote = True
        row = self.one(
            f"WITH r AS (UPDATE rmd_sequence SET {sets} WHERE sequence_id = ? RETURNING 1), "
            f"t AS ({_TAKE_LOCKED.format(for_update=self.d.for_update)} RETURNING 1) "
            "SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM t)",
            (*values, sequence_id, *_take_params(sequence_id, number)))
        if not row[0]:
            raise UnknownSequenceError("RMD", sequence_id)
        self.held_rmd[sequence_id] = replace(seq, **changes)
        return self.note_take(sequence_id, number, bool(row[1]))

    def receive_in_order(self, sequence_id: str, number: int, *,
                         now: float | None = None) -> tuple[RmdSequence, bool] | None:
        """On PostgreSQL, the sequence's row locked, the receipt written and the message taken,
        in one round trip, if the sequence has received exactly 1..number-1 and is open.

        The common receive of a steady stream; the receives of its sequence
        behind it wait for its commit, so the round trip saved (the lock,
        which :meth:`receive_and_take` needs a read for) shortens the wait of
        every message after it.  The lock is a statement of its own, ahead of
        the write in the same query string: the write then runs after the
        wait, on a snapshot that sees the commit waited for (one statement
        that waits for a row and then writes it makes PostgreSQL re-check
        what it waited for, which costs it more than the round trip).

        None when the guess was wrong (a gap, a duplicate, the last message,
        a closed or unknown sequence): nothing written, the row locked and
        read (the caller's read of it costs no round trip), and the caller
        records the message the general way.
        Otherwise the sequence as it was before this message (for the
        caller's checks, which roll the transaction back if they refuse it),
        and whether the message was taken."""
        if not self.d.for_update or number < 2 or sequence_id in self.held_rmd:
            return None
        api.check_number(number)
        self.lock(RANK_RMD, sequence_id)
        self.lock(RANK_INVOKER, sequence_id)
        self.capture_key("rmd_sequence", sequence_id)
        self.capture_key("invoker_sequence", sequence_id)
        before = _prefix(number - 1)
        cur = self.execute(
            "SELECT 1 FROM rmd_sequence WHERE sequence_id = ? FOR UPDATE", (sequence_id,),
            then=(_RECEIVE_IN_ORDER, (_prefix(number), _now(now), sequence_id, before,
                                      *_take_params(sequence_id, number), sequence_id)))
        row = cur.fetchone()
        cur.close()
        if row is None:
            return None
        seq = self.held_rmd[sequence_id] = _rmd(row[:-1])
        if row[-1] < 0:  # guessed wrong: the row as it is, held for the caller's read
            return None
        self._wrote = True
        return replace(seq, received=api.parse_ranges(before)), self.note_take(sequence_id, number, bool(row[-1]))

    def note_take(self, sequence_id: str, number: int, taken: bool) -> bool:
        """After a take: the invoker row as this transaction now holds it (or forgets it)."""
        if taken:
            self.held_invoker[sequence_id] = (api.parse_ranges(_prefix(number)), number)
        else:
            self.held_invoker.pop(sequence_id, None)
        return taken

    def lock(self, rank: int, key: Any) -> None:
        """Lock-order bookkeeping; the row lock itself is the statement's FOR UPDATE."""
        self._check_open()
        if self._check_lock_order(rank, key):
            self._note_lock(rank, key)

    @property
    def has_changes(self) -> bool:
        return self._wrote

    supports_savepoints = True

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """SQL SAVEPOINT (SQLite and PostgreSQL alike); the undo capture is rewound with it."""
        self._check_open()
        self._savepoints += 1
        name = f"wsrm_sp{self._savepoints}"
        undo = dict(self.undo) if self.undo is not None else None
        numbered = dict(self._numbered)
        self.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            if not self._closed and self.failed is None:
                self.execute(f"ROLLBACK TO SAVEPOINT {name}")
                self.execute(f"RELEASE SAVEPOINT {name}")
                self.undo = undo
                self._numbered = numbered  # a flush inside the savepoint is undone too
                self._forget_held()  # its writes are undone, and the locks it took released
            raise
        self.execute(f"RELEASE SAVEPOINT {name}")

    def _forget_held(self) -> None:
        """Drop every copy of a held row (and every message read ahead): they may be stale now."""
        self.held_invoker.clear()
        self.held_rmd.clear()
        self.held_rms.clear()
        self.read_ahead.clear()

    def hand_out(self, key: str, number: int, last: bool) -> None:
        """Remember that enqueue handed out ``number`` on sequence ``key`` (written by :meth:`flush`)."""
        _, was_last = self._numbered.get(key, (0, False))
        self._numbered[key] = (number, last or was_last)

    def make_durable(self) -> None:
        if not self.begin_with:
            return
        self.begin_with = ""
        if self.begun:
            self.execute("SET LOCAL synchronous_commit TO ON")

    def flush(self) -> None:
        """Write the sequence rows' highest numbers that enqueue only remembered.

        Writing the row on every enqueue, in a transaction that enqueues
        thousands of messages (a Spark partition), leaves one row version per
        message behind, all alive until the commit: each later lookup of the
        row walks them, and the partition's enqueues take quadratic time.  The
        stores flush before they commit or prepare, and a statement that
        reads the sequence table flushes first.
        """
        if not self._numbered:  # the common case: nothing enqueued (no new dict for it)
            return
        pending, self._numbered = self._numbered, {}
        for key, (number, last) in pending.items():
            if last:
                self.write("UPDATE rms_sequence SET highest_number = ?, last_message = TRUE, "
                           "last_number = ? WHERE seq_key = ?", (number, number, key))
            else:
                self.write("UPDATE rms_sequence SET highest_number = ? WHERE seq_key = ?", (number, key))

    # -- undo capture -------------------------------------------------------------------

    def capture(self, table: str, where: str, params: Sequence[Any]) -> None:
        """Keep the before-image of the rows ``where`` selects (first write wins)."""
        if self.undo is None:
            return
        cur = self.execute(f"SELECT * FROM {table} WHERE {where}", params)
        names = [c[0] for c in cur.description]
        pk_idx = [names.index(c) for c in PRIMARY_KEYS[table]]
        for row in cur.fetchall():
            key = (table, tuple(row[i] for i in pk_idx))
            if key not in self.undo:
                self.undo[key] = dict(zip(names, row, strict=True))
        cur.close()

    def capture_key(self, table: str, *pk: Any) -> None:
        """Before inserting or changing one row by key: its image, or "absent".

        Every write of a sequence row comes through here first, so this is
        also where the transaction forgets the copy it holds of that row.
        """
        if table == "rms_sequence":
            self.held_rms.pop(pk[0], None)
        elif table == "rmd_sequence":
            self.held_rmd.pop(pk[0], None)
        if self.undo is None or (table, pk) in self.undo:
            return
        self.capture(table, " AND ".join(f"{c} = ?" for c in PRIMARY_KEYS[table]), pk)
        self.undo.setdefault((table, pk), None)

    # -- ending -----------------------------------------------------------------------------

    def commit(self) -> None:
        api.refuse_if_global(self)
        self._refuse_commit_if_failed()
        self._check_open()
        self.flush()
        self._store._finish(self, commit=True)

    def rollback(self) -> None:
        if self._closed:
            return
        api.refuse_if_global(self)
        self._store._finish(self, commit=False)

    def mark_closed(self) -> None:
        self._closed = True

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._global is not None:
            if exc_type is not None:  # a branch left normally: the TM ends it, nothing to do here
                api.exit_global(self, exc_type)
            return
        super().__exit__(exc_type, exc, tb)


_M = TypeVar("_M", bound=api._Manager)


class _OnFirstUse(Generic[_M]):
    """A store transaction's manager (``tx.rmd``...), made the first time it is read.

    A receive uses one or two of the four managers, a branch that runs one
    statement none; making all four for every transaction was four Python
    calls (each run cold between two round trips).  A non-data descriptor: the
    manager made goes into the transaction's ``__dict__``, where every later
    read finds it without a call.  Not ``functools.cached_property``: on
    Python 3.11 its first read takes a lock shared by every instance of the
    class, which would serialize the first use of a manager across all the
    threads running transactions.
    """

    __slots__ = ("_cls", "_name")

    def __init__(self, name: str, cls: type[_M]) -> None:
        self._name = name
        self._cls = cls

    @overload
    def __get__(self, tx: None, owner: type | None = None) -> "_OnFirstUse[_M]": ...

    @overload
    def __get__(self, tx: SqlTransaction, owner: type | None = None) -> _M: ...

    def __get__(self, tx: SqlTransaction | None, owner: type | None = None) -> "_M | _OnFirstUse[_M]":
        if tx is None:
            return self
        manager = tx.__dict__[self._name] = self._cls(tx)
        return manager


def _opens_transaction(sql: str) -> bool:
    """Must ``sql`` run inside the transaction?  All but a plain read: writes, row locks, savepoints."""
    return not sql.lstrip()[:6].upper() == "SELECT" or " FOR " in sql


def _in_list(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


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
        n = tx.write(
            "INSERT INTO rms_sequence (seq_key, target, acks_to, rm_version, wsa_version, "
            "offered_id, next_control_at, expires, created_at, last_activity) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (seq_key) DO NOTHING",
            (key, target, acks_to, rm_version, wsa_version, offered_id,
             t if next_control_at is None else next_control_at, expires, t, t))
        if n == 0:
            raise DuplicateSequenceError(f"an RMS sequence with key {key!r} already exists")
        return self.require(key)

    def get(self, key: str) -> RmsSequence | None:
        tx = self._tx
        tx.lock(RANK_RMS, key)
        held = tx.held_rms.get(key)
        if held is not None:  # locked by this transaction since it read it: nobody else changed it
            return held
        row = tx.one(f"SELECT {_cols(_RMS_COLS)} FROM rms_sequence WHERE seq_key = ?"
                     + tx.d.for_update, (key,))
        if row is None:
            return None
        seq = tx.held_rms[key] = _rms(row)
        return seq

    def get_by_sequence_id(self, sequence_id: str) -> RmsSequence | None:
        tx = self._tx
        tx.lock(RANK_RMS, ("sequence_id", sequence_id))
        row = tx.one(f"SELECT {_cols(_RMS_COLS)} FROM rms_sequence WHERE sequence_id = ?"
                     + tx.d.for_update, (sequence_id,))
        if row is None:
            return None
        seq = _rms(row)
        tx.lock(RANK_RMS, seq.key)
        return seq

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
        tx.write(f"UPDATE rms_sequence SET {', '.join(f'{n} = ?' for n in names)} WHERE seq_key = ?",
                 [*(changes[n] for n in names), key])
        return self.require(key)

    def mark_last(self, key: str) -> RmsSequence:
        self.require(key)
        tx = self._tx
        tx.capture_key("rms_sequence", key)
        tx.write("UPDATE rms_sequence SET last_message = TRUE, last_number = highest_number "
                 "WHERE seq_key = ?", (key,))
        return self.require(key)

    def delete(self, key: str) -> None:
        self.require(key)
        tx = self._tx
        tx.capture("rms_message", "seq_key = ?", (key,))
        tx.write("DELETE FROM rms_message WHERE seq_key = ?", (key,))
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

    def enqueue(self, sequence_key: str, payload: bytes, *, action: str, soap_version: str,
                message_id: str, last: bool = False, reply_callback: str | None = None,
                reply_context: bytes | None = None, send_at: float | None = None,
                now: float | None = None) -> RmsMessage:
        tx = self._tx
        t = _now(now)
        values: tuple[Any, ...] = ()
        if isinstance(payload, (bytes, bytearray, memoryview)):
            values = (message_id, action, soap_version, bytes(payload), last, reply_callback,
                      None if reply_context is None else bytes(reply_context), reply_callback is not None,
                      t if send_at is None else send_at, t)
        # PostgreSQL: the number taken and the message inserted in one statement (a round trip
        # less on the application's own transaction); where the store keeps an undo image
        # (SQLite's XA branches), the insert is captured first, so it stays a statement of its own
        together = tx.d.writable_cte and tx.undo is None
        taken = self._take_number(sequence_key, last, values if together else ()) if values else None
        if taken is not None:
            number = taken.next_number - 1
        else:
            seq = self._seq(sequence_key)
            number = api.check_enqueue(seq, payload)
        if taken is None or not together:
            tx.capture_key("rms_message", sequence_key, number)
            tx.write(
                f"INSERT INTO rms_message ({_cols(_ENQUEUE_COLS)}) VALUES ({', '.join('?' * len(_ENQUEUE_COLS))})",
                (sequence_key, number, *values))
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
            reply_pending=reply_callback is not None,
            next_send_at=t if send_at is None else float(send_at), created_at=t)

    def _take_number(self, sequence_key: str, last: bool, message: tuple[Any, ...] = ()) -> RmsSequence | None:
        """The transaction's first enqueue on a sequence: lock its row and take the next number in
        one ``UPDATE ... RETURNING`` (the row as changed), instead of a SELECT ... FOR UPDATE and
        an UPDATE.  None when the sequence is held already (the batch's later enqueues only
        remember their numbers, see :meth:`SqlTransaction.flush`), or takes no message: then
        nothing was changed and the caller's check says precisely why.

        With ``message`` (the values of the rms_message row after its key) the same statement
        inserts the message under the number taken (a data-modifying WITH)."""
        tx = self._tx
        if sequence_key in tx.held_rms or sequence_key in tx._numbered:
            return None
        tx.lock(RANK_RMS, sequence_key)
        tx.capture_key("rms_sequence", sequence_key)
        also = ", last_message = TRUE, last_number = highest_number + 1" if last else ""
        update = (f"UPDATE rms_sequence SET highest_number = highest_number + 1{also} WHERE seq_key = ? "
                  "AND NOT (last_message OR closed OR close_sent OR terminate_sent OR faulted) "
                  f"AND highest_number < ? RETURNING {_cols(_RMS_COLS)}")
        if not message:
            rows = tx.write_all(update, (sequence_key, api.MAX_MESSAGE_NUMBER))
        else:
            rest = _ENQUEUE_COLS[2:]
            rows = tx.write_all(
                f"WITH s AS ({update}), m AS (INSERT INTO rms_message ({_cols(_ENQUEUE_COLS)}) "
                f"SELECT s.seq_key, s.highest_number, {', '.join('?' * len(rest))} FROM s RETURNING number) "
                f"SELECT {_cols(_RMS_COLS, 's')} FROM s", (sequence_key, api.MAX_MESSAGE_NUMBER, *message))
        return _rms(rows[0]) if rows else None

    def _row(self, sequence_key: str, number: int, lock: bool = False) -> RmsMessage | None:
        tx = self._tx
        row = tx.one(f"SELECT {_cols(_MSG_COLS)} FROM rms_message WHERE seq_key = ? AND number = ?"
                     + (tx.d.for_update if lock else ""), (sequence_key, number))
        return _msg(row) if row else None

    def get(self, sequence_key: str, number: int) -> RmsMessage | None:
        self._seq(sequence_key)  # sequence row first, then its messages: one order for all
        return self._row(sequence_key, number, lock=True)

    def _require(self, sequence_key: str, number: int) -> RmsMessage:
        msg = self.get(sequence_key, number)
        if msg is None:
            raise UnknownMessageError(
                f"no message {number} of RMS sequence {sequence_key!r} in the store")
        return msg

    def find_by_message_id(self, message_id: str) -> RmsMessage | None:
        row = self._tx.one(f"SELECT {_cols(_MSG_COLS)} FROM rms_message WHERE message_id = ? "
                           "ORDER BY created_at LIMIT 1", (message_id,))
        return _msg(row) if row else None

    def mark_acked(self, sequence_key: str, ranges: Iterable[tuple[int, int]],
                   now: float | None = None) -> list[int]:
        seq = self._seq(sequence_key)
        merged = api.AckRanges.from_ranges(ranges)
        tx = self._tx

        def unsent(lo: int, hi: int) -> list[int]:
            return [r[0] for r in tx.all(
                "SELECT number FROM rms_message WHERE seq_key = ? AND number BETWEEN ? AND ? "
                "AND send_count = 0 ORDER BY number LIMIT 20", (sequence_key, lo, hi))]

        api.check_ack(seq, merged, unsent)
        newly: list[int] = []
        for lo, hi in merged.ranges:
            where = "seq_key = ? AND number BETWEEN ? AND ? AND NOT acked"
            params = (sequence_key, lo, hi)
            tx.capture("rms_message", where, params)
            # the numbers it changed come back with the update: no SELECT before it
            newly.extend(sorted(r[0] for r in tx.write_all(
                f"UPDATE rms_message SET acked = TRUE WHERE {where} RETURNING number", params)))
        tx.capture_key("rms_sequence", sequence_key)
        tx.write("UPDATE rms_sequence SET last_activity = ? WHERE seq_key = ?",
                 (_now(now), sequence_key))
        return newly

    def due_messages(self, now: float | None = None, limit: int = 100, *,
                     per_sequence: int | None = None) -> list[RmsMessage]:
        tx = self._tx
        tx.lock(RANK_RMS, "due messages")
        if per_sequence is not None:  # round robin: every sequence's first due message, then the seconds...
            if tx.d.lateral:
                # Each sequence's first ``per_sequence`` due messages, ranked once, in a CTE: as
                # a join, the planner (whose statistics of these busy tables are always stale)
                # ran the per-sequence ranking again for every due message, due x due index
                # entries per claim (6 ms for 50 due messages, while the sequence's row was
                # locked, holding up every enqueue).  Four times the batch are candidates, so
                # that sequences another transaction holds (skipped) leave others to take.
                rows = tx.all(
                    "WITH r AS MATERIALIZED (SELECT s.seq_key, x.number, x.rn FROM rms_sequence s "
                    "CROSS JOIN LATERAL (SELECT number, ROW_NUMBER() OVER (ORDER BY next_send_at, number) "
                    "AS rn FROM rms_message WHERE seq_key = s.seq_key AND NOT acked AND next_send_at <= ? "
                    "ORDER BY next_send_at, number LIMIT ?) x "
                    "WHERE s.sequence_id IS NOT NULL AND NOT s.faulted "
                    "ORDER BY x.rn, s.seq_key LIMIT ?) "
                    f"SELECT {_cols(_MSG_COLS, 'm')} FROM r JOIN rms_message m "
                    "ON m.seq_key = r.seq_key AND m.number = r.number "
                    "JOIN rms_sequence s ON s.seq_key = r.seq_key "
                    "WHERE NOT m.acked AND m.next_send_at <= ? AND s.sequence_id IS NOT NULL AND NOT s.faulted "
                    "ORDER BY r.rn, m.next_send_at, m.seq_key, m.number LIMIT ?"
                    + tx.d.lock_of("s, m"), (_now(now), per_sequence, 4 * limit, _now(now), limit))
                return [_msg(r) for r in rows]
            else:  # ranking every due message
                ranked = ("FROM rms_message m JOIN rms_sequence s ON s.seq_key = m.seq_key "
                          "JOIN (SELECT seq_key, number, ROW_NUMBER() OVER (PARTITION BY seq_key "
                          "ORDER BY next_send_at, number) AS rn FROM rms_message "
                          "WHERE NOT acked AND next_send_at <= ?) r "
                          "ON r.seq_key = m.seq_key AND r.number = m.number WHERE r.rn <= ?")
            rows = tx.all(
                f"SELECT {_cols(_MSG_COLS, 'm')} {ranked} AND NOT m.acked AND m.next_send_at <= ? "
                "AND s.sequence_id IS NOT NULL AND NOT s.faulted "
                "ORDER BY r.rn, m.next_send_at, m.seq_key, m.number LIMIT ?"
                + tx.d.lock_of("s, m"), (_now(now), per_sequence, _now(now), limit))
            return [_msg(r) for r in rows]
        rows = tx.all(
            f"SELECT {_cols(_MSG_COLS, 'm')} FROM rms_message m "
            "JOIN rms_sequence s ON s.seq_key = m.seq_key "
            "WHERE NOT m.acked AND m.next_send_at <= ? AND s.sequence_id IS NOT NULL "
            "AND NOT s.faulted ORDER BY m.next_send_at, m.seq_key, m.number LIMIT ?"
            + tx.d.lock_of("s, m"), (_now(now), limit))
        return [_msg(r) for r in rows]

    def record_send_attempt(self, sequence_key: str, number: int, *, next_send_at: float,
                            now: float | None = None) -> RmsMessage:
        self._seq(sequence_key)
        tx = self._tx
        tx.capture_key("rms_message", sequence_key, number)
        rows = tx.write_all(
            "UPDATE rms_message SET send_count = send_count + 1, last_sent_at = ?, "
            f"next_send_at = ? WHERE seq_key = ? AND number = ? RETURNING {_cols(_MSG_COLS)}",
            (_now(now), next_send_at, sequence_key, number))
        if not rows:
            raise UnknownMessageError(
                f"no message {number} of RMS sequence {sequence_key!r} in the store")
        return _msg(rows[0])

    def record_send_attempts(self, sequence_key: str, numbers: Iterable[int], *, next_send_at: float,
                             now: float | None = None) -> int:
        self._seq(sequence_key)
        return self._update_each(sequence_key, numbers, "send_count = send_count + 1, last_sent_at = ?, "
                                 "next_send_at = ?", (_now(now), next_send_at))

    def make_due(self, sequence_key: str, numbers: Iterable[int], at: float | None = None) -> int:
        self._seq(sequence_key)
        return self._update_each(sequence_key, numbers, "next_send_at = ?", (_now(at),), " AND NOT acked")

    def _update_each(self, sequence_key: str, numbers: Iterable[int], assignments: str,
                     values: tuple[Any, ...], condition: str = "") -> int:
        """UPDATE the named messages of a sequence, 500 numbers a statement; how many changed."""
        tx = self._tx
        wanted = sorted(set(numbers))
        changed = 0
        for i in range(0, len(wanted), 500):
            chunk = wanted[i:i + 500]
            where = f"seq_key = ? AND number IN ({_in_list(chunk)}){condition}"
            params = (sequence_key, *chunk)
            tx.capture("rms_message", where, params)
            changed += tx.write(f"UPDATE rms_message SET {assignments} WHERE {where}", (*values, *params))
        return changed

    def reply_received(self, sequence_key: str, number: int) -> RmsMessage:
        self._require(sequence_key, number)
        tx = self._tx
        tx.capture_key("rms_message", sequence_key, number)
        tx.write("UPDATE rms_message SET reply_pending = FALSE WHERE seq_key = ? AND number = ?",
                 (sequence_key, number))
        found = self._row(sequence_key, number)
        assert found is not None
        return found

    def count_unacked(self, sequence_key: str | None = None) -> int:
        if sequence_key is None:
            row = self._tx.one("SELECT COUNT(*) FROM rms_message WHERE NOT acked")
        else:
            row = self._tx.one("SELECT COUNT(*) FROM rms_message WHERE seq_key = ? AND NOT acked",
                               (sequence_key,))
        return int(row[0])

    def has_unacked(self, sequence_key: str) -> bool:
        return self._tx.one("SELECT 1 FROM rms_message WHERE seq_key = ? AND NOT acked LIMIT 1",
                            (sequence_key,)) is not None

    def purge_acked(self, sequence_key: str | None = None) -> int:
        tx = self._tx
        purgeable = "acked AND NOT reply_pending"
        if sequence_key is None:
            keys = [r[0] for r in tx.all(
                f"SELECT DISTINCT seq_key FROM rms_message WHERE {purgeable} ORDER BY seq_key")]
        else:
            keys = [sequence_key]
        purged = 0
        for key in keys:
            tx.lock(RANK_RMS, key)
            if sequence_key is None and tx.d.skip_locked:
                row = tx.one("SELECT seq_key FROM rms_sequence WHERE seq_key = ?"
                             + tx.d.lock_of("rms_sequence"), (key,))
                if row is None:
                    continue  # another transaction holds it: purge it next time
            else:
                self._seq(key)
            where = f"seq_key = ? AND {purgeable}"
            tx.capture("rms_message", where, (key,))
            counts = tx.write_all(f"DELETE FROM rms_message WHERE {where} RETURNING send_count", (key,))
            count = len(counts)
            if not count:
                continue
            extra = sum(sent - 1 for (sent,) in counts if sent > 1)
            if extra:
                tx.capture_key("rms_sequence", key)
                tx.write("UPDATE rms_sequence SET purged_retransmissions = "
                         "purged_retransmissions + ? WHERE seq_key = ?", (int(extra), key))
            purged += int(count)
        return purged

    def list_for(self, sequence_key: str) -> list[RmsMessage]:
        rows = self._tx.all(f"SELECT {_cols(_MSG_COLS)} FROM rms_message WHERE seq_key = ? "
                            "ORDER BY number", (sequence_key,))
        return [_msg(r) for r in rows]


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
        tx.lock(RANK_RMD, sequence_id)
        held = tx.held_rmd.get(sequence_id)
        if held is not None:  # locked by this transaction since it read it: nobody else changed it
            return held
        row = tx.one(f"SELECT {_cols(_RMD_COLS)} FROM rmd_sequence WHERE sequence_id = ?"
                     + tx.d.for_update, (sequence_id,))
        if row is None:
            return None
        seq = tx.held_rmd[sequence_id] = _rmd(row)
        return seq

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

    def _receipt(self, sequence_id: str, number: int, *, last: bool,
                 now: float | None) -> tuple[RmdSequence, dict[str, Any]]:
        """The held sequence, and what recording ``number`` as received changes in it."""
        api.check_number(number)
        seq = self.require(sequence_id)
        changes: dict[str, Any] = {"received": seq.received.add(number), "last_activity": _now(now)}
        if last:
            changes["last_number"] = number
        return seq, changes

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

    def delete(self, sequence_id: str) -> None:
        self.require(sequence_id)
        tx = self._tx
        tx.capture_key("rmd_sequence", sequence_id)
        tx.write("DELETE FROM rmd_sequence WHERE sequence_id = ?", (sequence_id,))


#: How many buffered messages of a sequence a batch of deliveries reads at once.
_READ_AHEAD = 50


def _rmd_assignments(changes: dict[str, Any]) -> tuple[str, list[Any]]:
    """The SET list of an rmd_sequence UPDATE, and its values (the ranges in their stored form)."""
    names = sorted(changes)
    return (", ".join(f"{n} = ?" for n in names),
            [api.format_ranges(changes[n]) if n == "received" else changes[n] for n in names])


#: take_next on a store that waits for row locks: the row locked first (``cur``), then compared;
#: parameters from :func:`_take_params`
_TAKE_LOCKED = ("WITH cur AS (SELECT delivered_upto, delivered FROM invoker_sequence WHERE sequence_id = ?"
                "{for_update}) UPDATE invoker_sequence SET delivered = ?, delivered_upto = ? FROM cur "
                "WHERE invoker_sequence.sequence_id = ? AND cur.delivered_upto = ? AND cur.delivered = ? "
                "AND NOT EXISTS (SELECT 1 FROM invoker_message WHERE sequence_id = ? AND number = ?)")

#: :meth:`SqlTransaction.receive_in_order`'s write, once its lock is held: the receipt, if the
#: sequence has received exactly 1..number-1 and is open, and then the take; the new row and
#: whether the message was taken, or else the row as it is and -1 (PostgreSQL)
_RECEIVE_IN_ORDER = (
    "WITH r AS (UPDATE rmd_sequence SET received = ?, last_activity = ? WHERE sequence_id = ? AND received = ? "
    f"AND NOT closed AND NOT terminated AND last_number IS NULL RETURNING {_cols(_RMD_COLS)}), "
    f"t AS ({_TAKE_LOCKED.format(for_update=' FOR UPDATE')} AND EXISTS (SELECT 1 FROM r) RETURNING 1) "
    f"SELECT {_cols(_RMD_COLS, 'r')}, (SELECT count(*) FROM t) FROM r UNION ALL "
    f"SELECT {_cols(_RMD_COLS)}, -1 FROM rmd_sequence WHERE sequence_id = ? AND NOT EXISTS (SELECT 1 FROM r)")


def _take_params(sequence_id: str, number: int) -> tuple[Any, ...]:
    return (sequence_id, _prefix(number), number, sequence_id, number - 1, _prefix(number - 1),
            sequence_id, number)


def _prefix(upto: int) -> str:
    """The stored form of the delivered ranges 1..upto (see :func:`api.format_ranges`)."""
    return "" if upto == 0 else "1" if upto == 1 else f"1-{upto}"


class _Invoker(api.InvokerBufferManager):
    _tx: SqlTransaction

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
        n = tx.write(
            "INSERT INTO invoker_message (sequence_id, number, message_id, action, soap_version, "
            "payload, reply_to, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (sequence_id, number) DO NOTHING",
            (sequence_id, number, message_id, action, soap_version, bytes(payload), reply_to,
             _now(now)))
        if n == 0:
            return False
        if number in self._delivered(sequence_id, create=True):
            tx.write("DELETE FROM invoker_message WHERE sequence_id = ? AND number = ?",
                     (sequence_id, number))
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
            row = tx.one(f"SELECT {_cols(_BUF_COLS)} FROM invoker_message WHERE sequence_id = ? "
                         "ORDER BY number LIMIT 1", (sequence_id,))
        else:
            row = tx.one(f"SELECT {_cols(_BUF_COLS)} FROM invoker_message WHERE sequence_id = ? "
                         "AND (next_attempt_at IS NULL OR next_attempt_at <= ?) ORDER BY number LIMIT 1",
                         (sequence_id, now))
        return _buf(row) if row else None

    def _next_in_order(self, sequence_id: str, upto: int) -> BufferedMessage | None:
        tx = self._tx
        ahead = tx.read_ahead.get(sequence_id)
        if ahead is None:  # the sequence's first message in this transaction: that one only
            tx.read_ahead[sequence_id] = {}
            row = tx.one(f"SELECT {_cols(_BUF_COLS)} FROM invoker_message "
                         "WHERE sequence_id = ? AND number = ?", (sequence_id, upto + 1))
            return _buf(row) if row else None
        if upto + 1 not in ahead:  # a second one: a batch, read the next ones at once
            rows = tx.all(f"SELECT {_cols(_BUF_COLS)} FROM invoker_message WHERE sequence_id = ? "
                          "AND number BETWEEN ? AND ?", (sequence_id, upto + 1, upto + _READ_AHEAD))
            ahead = tx.read_ahead[sequence_id] = {msg.number: msg for msg in map(_buf, rows)}
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
                f"SELECT s.sequence_id, s.delivered_upto, s.delivered, {_cols(_BUF_COLS, 'b')} {source} "
                f"WHERE {due} ORDER BY b.received_at, s.sequence_id LIMIT 1" + tx.d.lock_of("s"), (now,))
            if row is None:
                return None
            tx.lock(RANK_INVOKER, row[0])
            upto = int(row[1])
            tx.held_invoker[row[0]] = (api.parse_ranges(row[2]), upto)
            msg = _buf(row[3:])
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

    def take_next(self, sequence_id: str, number: int) -> bool:
        """One statement, no read first: the row changes only if its delivered ranges are exactly
        1..number-1 and ``number`` is not buffered.  A delivery of the sequence in progress
        elsewhere holds the row: the statement waits for it, then looks again (READ COMMITTED
        rechecks an updated row), so the delivery of the message before this one is seen."""
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
        elif tx.d.for_update:
            # the row locked first, then compared: an UPDATE alone compares the version its
            # snapshot sees and so never waits for a delivery of the message before this one
            taken = tx.write(_TAKE_LOCKED.format(for_update=tx.d.for_update), _take_params(sequence_id, number))
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
        row = self._tx.one(f"SELECT {_cols(_BUF_COLS)} FROM invoker_message WHERE sequence_id = ? "
                           "AND number = ?", (sequence_id, number))
        return _buf(row) if row else None

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


def apply_undo(tx: SqlTransaction, undo: UndoLog) -> None:
    """Put every row back as it was before the branch (SQLite XA rollback)."""
    for (table, pk), image in undo.items():
        cols = PRIMARY_KEYS[table]
        tx.write(f"DELETE FROM {table} WHERE {' AND '.join(f'{c} = ?' for c in cols)}", pk)
        if image is not None:
            names = list(image)
            tx.write(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({_in_list(names)})",
                     [image[n] for n in names])


SqlTransaction.rms = _OnFirstUse("rms", _Rms)  # type: ignore[assignment]
SqlTransaction.rms_messages = _OnFirstUse("rms_messages", _RmsMessages)  # type: ignore[assignment]
SqlTransaction.rmd = _OnFirstUse("rmd", _Rmd)  # type: ignore[assignment]
SqlTransaction.invoker = _OnFirstUse("invoker", _Invoker)  # type: ignore[assignment]
