"""The SQL store's tables, created and migrated in numbered steps when a store is opened.

``schema_version`` has one row per applied migration; a store written by a newer
version of this library is refused rather than misread.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import api
from ..api import (
    SchemaVersionError,
)
from .dialect import Dialect

log = logging.getLogger(__name__)

def _rms_message_table(d: Dialect, name: str, key: str, later: str = "") -> str:
    """``rms_message``'s CREATE TABLE as ``name``, its sequence named by the column ``key`` (its
    definition, the primary key's first column), with columns added ``later`` by migrations
    (their definitions, each followed by a comma)."""
    B, I, D, BL = d.boolean, d.bigint, d.double, d.blob  # noqa: E741 -- the DDL's column-type shorthands
    return f"""CREATE TABLE {name} (
            {key},
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
            {later}
            PRIMARY KEY ({key.split()[0]}, number)
        )"""


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
        _rms_message_table(d, "rms_message", "seq_key TEXT NOT NULL"),
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


def _migration_4(d: Dialect) -> list[str]:
    """What engine processes report about what they depend on (``wsrm status`` shows it): a peer
    a process cannot reach, since when, its last error.  One row per condition and process."""
    D = d.double
    return [
        f"""CREATE TABLE node_condition (
            kind TEXT NOT NULL,
            subject TEXT NOT NULL,
            reporter TEXT NOT NULL,
            state TEXT NOT NULL,
            since {D} NOT NULL,
            last_error TEXT,
            detail TEXT NOT NULL DEFAULT '',
            reported_at {D} NOT NULL,
            PRIMARY KEY (kind, subject, reporter)
        )""",
    ]


def _migration_5(d: Dialect) -> list[str]:
    """SQLite: the payloads of outgoing messages in a table of their own.

    SQLite writes a whole row again at every UPDATE, a large payload's
    overflow pages included: a 1 MiB message's send attempt and its
    acknowledgement each wrote 1 MiB more to the WAL, and as much again at
    the checkpoint (7.4 ms of CPU per message here, 2.4 ms with the payload
    apart).  Rows written before keep their payload in ``rms_message``; new
    ones store an empty one there (see :func:`.rows.msg_cols`).  PostgreSQL
    keeps a large value out of an updated row already (TOAST): nothing to do.
    """
    if not d.payload_apart:
        return []
    return [
        f"""CREATE TABLE rms_payload (
            seq_key TEXT NOT NULL,
            number {d.bigint} NOT NULL,
            payload {d.blob} NOT NULL,
            PRIMARY KEY (seq_key, number)
        )""",
    ]


def _migration_6(d: Dialect) -> list[str]:
    """PostgreSQL: payloads compressed with lz4 rather than pglz (PostgreSQL 14 and later).

    A large payload that compresses well cost its PostgreSQL backend about
    9 ms per MiB to compress with pglz at the enqueue (bench_compare
    --note 1048576, xa1: half of the server's CPU per message); lz4 does it
    in a small fraction of that.  One that does not compress costs the same
    either way (both give up early).  A server without lz4 keeps pglz: the
    store works the same, only slower with such payloads.
    """
    if d.name != "postgresql":
        return []
    alters = " ".join(f"EXECUTE 'ALTER TABLE {table} ALTER COLUMN payload SET COMPRESSION lz4';"
                      for table in ("rms_message", "invoker_message", "poison_message"))
    return [f"DO $$ BEGIN {alters} EXCEPTION WHEN OTHERS THEN "
            "RAISE NOTICE 'payloads stay compressed with pglz: %', SQLERRM; END $$"]


def _migration_7(d: Dialect) -> list[str]:
    """A message's first send leaves every indexed column as it was: ``retry_at``.

    The first send of each message (its claim) moved ``next_send_at``, which two indexes hold,
    so PostgreSQL could not update the row in place (HOT): it wrote a new row version into
    another page and an entry into each of the table's four indexes, about 0.8 kB of WAL per
    message (16 sequences under XA, pg_waldump), and SQLite moved two index entries.  The
    first send now writes when the message is due again into ``retry_at``, which no index
    holds, and leaves ``next_send_at`` be; a later send, a hold or a make-due moves
    ``next_send_at`` and clears ``retry_at`` (see :mod:`.rms`).  PostgreSQL's pages of the
    table keep room for that new version (fillfactor): rows live from enqueue to
    acknowledgement, so the table stays small either way.
    """
    out = [f"ALTER TABLE rms_message ADD COLUMN retry_at {d.double}"]
    if d.name == "postgresql":
        out.append("ALTER TABLE rms_message SET (fillfactor = 70)")  # 50 from version 9
    return out


#: PostgreSQL: percent of a page of ``rms_message`` that inserts fill, the rest kept for the
#: first send's in-place update of the rows (:func:`_migration_7`, :func:`_migration_9`).
RMS_MESSAGE_FILLFACTOR = 50

def _migration_8(d: Dialect) -> list[str]:
    """PostgreSQL: no index of all unacknowledged messages by due time (``rms_message_due``).

    Nothing the engine runs reads it any more: the sender's rounds and a lane's claims take each
    sequence's due messages by ``rms_message_unacked`` (seq_key, next_send_at, number), and so
    does ``due_messages`` without ``per_sequence`` (see :mod:`.rms`).  Every enqueue still wrote
    an entry into it, always into its last page (the entries of 16 sequences' enqueues of
    the same instant go to the same leaf), and every acknowledgement left one dead there: about
    65 B of WAL of 2.6 kB a message under 16 sequences in XA.  SQLite keeps it (its
    ``due_messages`` without ``per_sequence`` scans it).
    """
    if d.name != "postgresql":
        return []
    return ["DROP INDEX IF EXISTS rms_message_due"]


def _migration_9(d: Dialect) -> list[str]:
    """PostgreSQL: pages of ``rms_message`` half filled by inserts, so that every row on a page can
    take its first send's new version there, all in one transaction (fillfactor 70 -> 50).

    A message of a one-way call of 64 bytes is a row of about 1.1 kB (its envelope inline,
    below TOAST's threshold).  At 70 a page took 5 of them and kept room for 2 new versions:
    a claim of many messages in one transaction (a lane's refill takes 16, a round several a
    sequence) found no room for the rest until the page was pruned, which cannot happen
    before that transaction ends, and wrote each of them again on another page, its whole
    row in the WAL and an entry in each of the table's three indexes.  At 50 the rows an
    insert leaves on a page (at most half of it) always have room for one new version each:
    a row of up to TOAST's 2 kB threshold takes at most as much again.  16 sequences in XA
    (bench_compare --clients 16, pg_waldump): 0.26 -> 0.00 such updates a message, WAL
    2.73 -> 2.38 kB a message.  The table holds rows from enqueue to acknowledgement only:
    twice its pages is little.  Pages filled before keep their rows; new inserts follow the
    new setting.
    """
    if d.name != "postgresql":
        return []
    return [f"ALTER TABLE rms_message SET (fillfactor = {RMS_MESSAGE_FILLFACTOR})"]


#: The columns of ``rms_message`` after its key (schema versions 1 to 9, the same from 10 on)
_RMS_MESSAGE_REST = ("number", "message_id", "action", "soap_version", "payload", "last", "reply_callback",
                     "reply_context", "reply_pending", "send_count", "next_send_at", "last_sent_at", "acked",
                     "created_at", "retry_at")


def _migration_10(d: Dialect) -> list[str]:
    """A sequence's messages are keyed by its number (``rms_sequence.id``), not by its text key.

    ``rms_message`` and ``rms_payload`` named their sequence by ``seq_key``, the client's text
    key (the engine's is a JSON array of the target's URL, the conversation's name, a generation
    and the kind: 50 bytes and more), in every row, in the primary key and in each of
    the sender's indexes, and every statement of a message compared it: ``seq BIGINT`` takes its
    place, with the primary key ``(seq, number)`` and ``rms_message_unacked`` as ``(seq,
    next_send_at, number)``.  The statements take the id from the sequence's row the
    transaction holds (:attr:`~.api.RmsSequence.store_id`): no lookup is added.  Messages
    stored before are kept: each row takes its sequence's id (a message of no sequence,
    which the store never leaves, would stop the migration: ``seq`` is NOT NULL).

    PostgreSQL changes the tables in place (a new identity column filled in, the old key
    dropped); SQLite, which cannot change a primary key, copies each table into a new one.
    A store with prepared branches that hold these tables' rows is refused first
    (:func:`_before_10`): their rows are locked (PostgreSQL) or their undo images name the
    old key (SQLite).
    """
    rest = ", ".join(_RMS_MESSAGE_REST)
    if d.name == "postgresql":
        return [  # (no rms_payload: PostgreSQL keeps a large payload out of an updated row itself)
            "ALTER TABLE rms_sequence ADD COLUMN id BIGINT GENERATED BY DEFAULT AS IDENTITY",
            "ALTER TABLE rms_sequence ADD CONSTRAINT rms_sequence_id UNIQUE (id)",
            "ALTER TABLE rms_message ADD COLUMN seq BIGINT",
            "UPDATE rms_message m SET seq = s.id FROM rms_sequence s WHERE s.seq_key = m.seq_key",
            "ALTER TABLE rms_message ALTER COLUMN seq SET NOT NULL",
            "ALTER TABLE rms_message DROP COLUMN seq_key",  # its primary key and indexes with it
            "ALTER TABLE rms_message ADD PRIMARY KEY (seq, number)",
            "CREATE INDEX rms_message_unacked ON rms_message (seq, next_send_at, number) WHERE NOT acked",
            "CREATE INDEX rms_message_acked ON rms_message (seq) WHERE acked",
        ]
    I, D, BL = d.bigint, d.double, d.blob  # noqa: E741 -- the DDL's column-type shorthands
    out = [
        "ALTER TABLE rms_sequence ADD COLUMN id INTEGER",
        "UPDATE rms_sequence SET id = rowid",
        "CREATE UNIQUE INDEX rms_sequence_id ON rms_sequence (id)",
        _rms_message_table(d, "rms_message_10", f"seq {I} NOT NULL", f"retry_at {D},"),
        f"INSERT INTO rms_message_10 (seq, {rest}) SELECT s.id, {', '.join('m.' + c for c in _RMS_MESSAGE_REST)} "
        "FROM rms_message m JOIN rms_sequence s ON s.seq_key = m.seq_key",
        "DROP TABLE rms_message",  # its indexes with it
        "ALTER TABLE rms_message_10 RENAME TO rms_message",
        "CREATE INDEX rms_message_due ON rms_message (next_send_at) WHERE NOT acked",
        "CREATE INDEX rms_message_msgid ON rms_message (message_id)",
        "CREATE INDEX rms_message_unacked ON rms_message (seq, next_send_at, number) WHERE NOT acked",
        "CREATE INDEX rms_message_acked ON rms_message (seq) WHERE acked",
    ]
    if d.payload_apart:
        out += [
            f"CREATE TABLE rms_payload_10 (seq {I} NOT NULL, number {I} NOT NULL, payload {BL} NOT NULL, "
            "PRIMARY KEY (seq, number))",
            "INSERT INTO rms_payload_10 (seq, number, payload) SELECT s.id, p.number, p.payload "
            "FROM rms_payload p JOIN rms_sequence s ON s.seq_key = p.seq_key",
            "DROP TABLE rms_payload",
            "ALTER TABLE rms_payload_10 RENAME TO rms_payload",
        ]
    return out


def _before_10(cur: Any, d: Dialect, where: str, *,
               change: str = "schema version 10 keys the outgoing messages by their sequence's number") -> None:
    """Refuse to change the messages' key under a prepared branch that holds them: a PostgreSQL
    prepared transaction keeps its row locks (the ALTER TABLE would wait for it for ever), and a
    SQLite branch's undo images name the old key.  Recovery with the version that prepared
    them ends them (commits or rolls them back); then open the store again.  ``change``: what
    the version changes, for the message."""
    if d.name == "postgresql":
        cur.execute("SELECT count(DISTINCT l.virtualtransaction) FROM pg_locks l "
                    "WHERE l.pid IS NULL AND l.database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database()) AND l.relation IN (to_regclass('rms_message'), "
                    "to_regclass('rms_sequence'), to_regclass('rms_payload'))")
    else:
        cur.execute("SELECT count(*) FROM xa_prepared")
    prepared = int(cur.fetchone()[0])
    if prepared:
        raise SchemaVersionError(
            f"{where}: {change}, and "
            f"{prepared} prepared transaction(s) hold rows of the store's tables: end them first (run the "
            "transaction manager's recovery with the version that prepared them), then open the store again")


def _migration_11(d: Dialect) -> list[str]:
    """SQLite: every holder of the store's file marks the lock file with its store's token (see
    ``SqliteStore.written_elsewhere``); a version before this one holds it unmarked, so that
    this version's receipts would guess past its holds and its prepares would leave the
    prepared-branch mark set.  No table changes: the version itself keeps an earlier version
    out (it refuses a schema newer than its own), and the migration is refused while another
    process has the file open (``SqliteStore._refuse_open_elsewhere``).  PostgreSQL: nothing
    changes; its number follows SQLite's (one sequence of versions)."""
    return []


def _migration_12(d: Dialect) -> list[str]:
    """SQLite: no index of all unacknowledged messages by due time (``rms_message_due``), as
    PostgreSQL since version 8.

    The sender takes each sequence's due messages by ``rms_message_unacked``, and ``due_messages``
    without ``per_sequence`` now does too (see :mod:`.rms`).  Every enqueue still wrote an entry
    into it, into its last page, and every acknowledgement took one out: 16 sequences at once,
    one more page in the WAL for each commit of enqueues and acknowledgements (about 0.5 of the
    client's 4.2 WAL pages a message in ``tests/store/test_due_index.py``'s mix).  PostgreSQL:
    nothing left to drop."""
    if d.name == "postgresql":
        return []
    return ["DROP INDEX IF EXISTS rms_message_due"]


def _migration_13(d: Dialect) -> list[str]:
    """Only the requests that await a reply are indexed by their message id (``awaits_reply``).

    ``rms_message_msgid`` is read only to correlate a reply with its request (``mark_answered``,
    ``find_by_message_id``), yet every enqueue wrote an entry into it: one-way messages too, at a
    random place of the index (message ids are UUIDs), 103 B of WAL and a page split now and
    then, a leaf page of its own to dirty, and after each checkpoint a full image of that page:
    16 sequences one-way under XA, 1,340 B of WAL an enqueue, 146 B of them this index.
    ``awaits_reply`` is written once, by the enqueue (``reply_pending`` as enqueued), and never
    changed: ``reply_pending``, cleared when the reply comes, could not be the index's
    condition, since the reply's delivery looks the request up after that (its callback), and
    a column of an index's condition that changes keeps PostgreSQL from updating the row in
    place.  Rows written before take it from what they say: waiting for a reply, or holding a
    callback (one answered and without a callback has nothing left to correlate).  A
    prepared branch holding the table's rows is refused first, as for version 10.

    The column's default is TRUE, though every enqueue of this version names it: a process of
    version 12 still running on the upgraded store (a rolling upgrade) enqueues without it, and
    its requests must stay found when their replies come (its one-way messages are indexed for
    nothing meanwhile).  PostgreSQL takes the default after filling the column (so the rows
    already there are not rewritten to FALSE); SQLite cannot change a column's default, so its
    rows are added TRUE and the ones with nothing to correlate rewritten."""
    if d.name == "postgresql":
        column = [f"ALTER TABLE rms_message ADD COLUMN awaits_reply {d.boolean} NOT NULL DEFAULT FALSE",
                  "UPDATE rms_message SET awaits_reply = TRUE WHERE reply_pending OR reply_callback IS NOT NULL",
                  "ALTER TABLE rms_message ALTER COLUMN awaits_reply SET DEFAULT TRUE"]
    else:
        column = [f"ALTER TABLE rms_message ADD COLUMN awaits_reply {d.boolean} NOT NULL DEFAULT TRUE",
                  "UPDATE rms_message SET awaits_reply = FALSE WHERE NOT reply_pending AND reply_callback IS NULL"]
    return [
        *column,
        "DROP INDEX rms_message_msgid",
        "CREATE INDEX rms_message_msgid ON rms_message (message_id) WHERE awaits_reply",
    ]


def _before_13(cur: Any, d: Dialect, where: str) -> None:
    """:func:`_before_10` for version 13 (a PostgreSQL ALTER TABLE waits for every prepared
    branch holding the table's rows; a SQLite branch's undo images lack the new column)."""
    _before_10(cur, d, where, change="schema version 13 adds a column to the outgoing messages")


#: (version, statements for a dialect).  Append new versions; never edit old ones.
MIGRATIONS = [(1, _migration_1), (2, _migration_2), (3, _migration_3), (4, _migration_4), (5, _migration_5),
              (6, _migration_6), (7, _migration_7), (8, _migration_8),
              (9, _migration_9), (10, _migration_10), (11, _migration_11),
              (12, _migration_12), (13, _migration_13)]
#: a check before a version's statements, which raises where the store cannot take them yet
_BEFORE = {10: _before_10, 13: _before_13}
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
        if found and version in _BEFORE:  # (a new store holds nothing yet)
            _BEFORE[version](cur, d, where)
        for statement in statements(d):
            cur.execute(statement)
        cur.execute(d.sql("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)"),
                    (version, time.time()))
    cur.close()
    return found
