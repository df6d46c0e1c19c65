"""What differs between the two SQL databases (SQLite and PostgreSQL), and nothing else.

Every statement of the SQL store is written once, with ``?`` placeholders and the row
locks spelled through a :class:`Dialect`: placeholder style, column types, ``FOR UPDATE``
and ``SKIP LOCKED`` (SQLite has neither: its store serializes whole transactions
instead), and the PostgreSQL features some statements use when they are there.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    #: appended to a SELECT that locks its rows against deletes and key changes only (PostgreSQL's
    #: ``FOR KEY SHARE``: an UPDATE of other columns, such as an enqueue's, goes on beside it), and
    #: against every other writer but those (``FOR NO KEY UPDATE``); empty where ``for_update`` is
    key_share: str = ""
    no_key_update: str = ""
    #: LATERAL joins (a top-N per sequence without ranking every due message)
    lateral: bool = False
    #: data-modifying statements in WITH (two dependent writes in one round trip)
    writable_cte: bool = False
    #: an outgoing message's payload lives in a table of its own (``rms_payload``): SQLite
    #: writes a whole row again, overflow pages and all, at every UPDATE of it, so each send
    #: attempt and acknowledgement of a 1 MiB message wrote 1 MiB more to the WAL (and its
    #: checkpoint); PostgreSQL's TOAST already keeps an unchanged large value out of an update
    payload_apart: bool = False
    #: a large payload is written with ``COPY ... FROM STDIN (FORMAT binary)`` (see
    #: :meth:`SqlTransaction.copy_in`) rather than as a literal in the statement's text
    copy_binary: bool = False
    #: a savepoint whose part succeeded is left open, not released: SQLite's COMMIT ends every
    #: savepoint with its transaction, and a ROLLBACK TO a later one leaves the earlier ones as
    #: they were.  Its RELEASE was a statement a part in the store's file, whose hold is a SQLite
    #: service's serial bound (receives delivered together: 0.48 of the 4.57 statements a
    #: message there at 16 sequences).  PostgreSQL releases them: each open one is a
    #: subtransaction, and past 64 a backend's snapshots grow costly.
    savepoints_left_open: bool = False
    #: the value of a new ``rms_sequence.id`` where the column has no default of its own
    #: (SQLite, whose ALTER TABLE cannot add one); empty where it has (PostgreSQL's identity)
    new_rms_id: str = ""

    def sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def lock_of(self, alias: str) -> str:
        return self.skip_locked.format(alias=alias)

    def claim_lock(self, sequences: str, messages: str) -> str:
        """A sender's claim: the messages locked, those others hold skipped; their sequences held
        against close, terminate, fault and delete only where the database tells those apart
        (``FOR KEY SHARE``), so that callers' enqueues on them neither hold the claim up nor wait
        for it."""
        if not self.key_share:
            return self.lock_of(f"{sequences}, {messages}")
        return f"{self.key_share} OF {sequences} SKIP LOCKED{self.lock_of(messages)}"


SQLITE = Dialect(name="sqlite", placeholder="?", blob="BLOB", bigint="INTEGER", double="REAL",
                 boolean="INTEGER", for_update="", skip_locked="", xa_table=True, payload_apart=True,
                 savepoints_left_open=True, new_rms_id="(SELECT COALESCE(MAX(id), 0) + 1 FROM rms_sequence)")
POSTGRES = Dialect(name="postgresql", placeholder="%s", blob="BYTEA", bigint="BIGINT",
                   double="DOUBLE PRECISION", boolean="BOOLEAN", for_update=" FOR UPDATE",
                   skip_locked=" FOR UPDATE OF {alias} SKIP LOCKED", xa_table=False, lateral=True,
                   writable_cte=True, copy_binary=True, key_share=" FOR KEY SHARE",
                   no_key_update=" FOR NO KEY UPDATE")
