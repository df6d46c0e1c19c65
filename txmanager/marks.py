"""Commit marks: a commit decision kept in a participant's own database, not in the log.

Narayana's *commit markable resource* (CMR), for PostgreSQL.  A transaction
with several branches normally prepares every one, writes and fsyncs its
decision in the recovery log, then commits each prepared branch.  When one
branch is in a database that holds a commit-mark table, the transaction
manager instead:

1. prepares every other branch;
2. in that branch's own transaction, inserts a row naming the global
   transaction and the prepared branches, and commits it in ONE phase;
3. commits the other branches (``COMMIT PREPARED``).

Step 2 is the decision: the row commits if and only if the marked branch's
work does, so "the row exists" is exactly "the transaction committed".  Per
transaction that saves one ``PREPARE TRANSACTION``, its ``COMMIT PREPARED``
and the log's fsync, about a third of the commit protocol's cost.

Recovery reads the marks like log decisions: a prepared branch named by a
mark is committed; one named by neither a mark nor the log is presumed
aborted, as before, but only once EVERY database that may hold this node's
marks has answered.  Which databases those are, the recovery log says: it
records a database once, durably, before the first mark is written there
(:meth:`~txmanager.log.RecoveryLog.log_mark_source`), so a recovery that was
not told about it holds the branches instead of guessing.

A mark is deleted once every branch it names is committed: by the next
marked commit on the same database (in the same statement as its own
insert, no round trip of its own), when the data source closes, or by
recovery.  A mark left over is harmless: recovery finds nothing prepared
under it and deletes it.

A mark's row is keyed by what the transaction's id does not say elsewhere in the row: for
an xid this manager made (``node|<unique hex>``, :meth:`~txmanager.xid.Xid.new_global`) the
unique hex alone (30 characters; the ``node`` column holds the rest), for any other its whole
PostgreSQL gid (about 72 characters for ours).  The key is the table's primary key, so it is
written twice per mark (the row and its index entry): about 80 bytes of WAL fewer per
marked commit.  A mark keyed by the whole gid (every mark written before) reads the same.

The PostgreSQL WS-RM store keeps marks by default (``commit_marks=0`` turns
it off); an :class:`~txmanager.postgres.XADataSource` does with
``commit_marks=True``.  Either creates the table when it opens.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Any

from .xid import FORMAT_ID, Xid

__all__ = ["TABLE", "CREATE_TABLE", "PREPARE", "PREPARED_INSERT", "PREPARED_SWAP", "SWAP_KEYS", "MarkQueue",
           "insert_statement", "mark_insert", "key", "keys", "gxid_of"]

#: The table, in the database of the marked branch (the ``public`` schema unless the
#: session's ``search_path`` says otherwise).
TABLE = "txm_commit_mark"

#: ``gtrid``: the global xid's key (:func:`key`: its unique part, or its PostgreSQL gid); ``node``:
#: the transaction manager's node; ``record``: the decision (:func:`~txmanager.log.mark_record`:
#: the branches it names and when; marks written before it kept the recovery log's whole record,
#: which recovery still reads).
CREATE_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (gtrid text PRIMARY KEY, node text NOT NULL, "
    "record text NOT NULL)"
)

#: Deleted with one insert, at most: a backlog is worked off over several commits.
_MAX_DELETED = 500

#: what follows ``node|`` in a gtrid :meth:`Xid.new_global` made: a key with no ``_``, which
#: every PostgreSQL gid has
_UNIQUE = re.compile(rb"[0-9a-f]+")


def key(gxid: Xid, node: str | None = None) -> str:
    """The ``gtrid`` column of ``gxid``'s mark, written by ``node`` (``gxid``'s own by default).

    The part of the gtrid after ``node|`` when the manager made it so; else the gid."""
    if gxid.format_id == FORMAT_ID and not gxid.bqual:
        owner = node if node is not None else gxid.node
        if owner is not None:
            prefix = owner.encode() + b"|"
            gtrid = gxid.gtrid
            if gtrid.startswith(prefix) and _UNIQUE.fullmatch(gtrid, len(prefix)):
                return gtrid[len(prefix):].decode("ascii")
    return gxid.to_pg_gid()


def keys(gxid: Xid) -> list[str]:
    """Every key a mark of ``gxid`` may have: :func:`key`'s, and the gid (earlier marks)."""
    compact, gid = key(gxid), gxid.to_pg_gid()
    return [gid] if compact == gid else [compact, gid]


def gxid_of(gtrid: str, node: str) -> Xid:
    """The global xid a mark's ``gtrid`` column names, for a mark of ``node`` (ValueError when
    it names none)."""
    if "_" in gtrid:
        return Xid.from_text(gtrid)
    if not _UNIQUE.fullmatch(gtrid.encode("ascii")):
        raise ValueError(f"{gtrid!r} is neither a gid nor the unique part of a gtrid")
    return Xid(FORMAT_ID, node.encode() + b"|" + gtrid.encode("ascii"))


#: :func:`mark_insert`'s unfenced statements prepared on a session (:data:`PREPARE`): sent as
#: text, PostgreSQL parsed, analysed and planned each mark again (pg_stat_statements under 16
#: sequences in XA across two databases: 1.00 plans a call, the INSERT that also deletes
#: forgotten marks one text per count of them).  Named after the table, so that what a session
#: sends still names it.
PREPARED_INSERT = f"{TABLE}_insert"
PREPARED_SWAP = f"{TABLE}_swap"
#: the forgotten marks the prepared swap deletes, at most (fewer: the last one repeated).  Keys
#: as parameters of their own, not an array: PostgreSQL costs ``= ANY($1)`` at ten elements and a
#: custom plan at the array's length (one or two here), so it planned that statement at every
#: ``EXECUTE`` (0.99 plans a call), where the generic plan of ``IN ($1, ..., $4)`` costs what
#: its custom ones do, and is kept
SWAP_KEYS = 4
#: prepares them on a session (outside a transaction; the table must exist)
PREPARE = (
    f"PREPARE {PREPARED_INSERT} (text, text, text) AS "
    f"INSERT INTO {TABLE} (gtrid, node, record) VALUES ($1, $2, $3); "
    f"PREPARE {PREPARED_SWAP} ({', '.join(['text'] * (SWAP_KEYS + 3))}) AS "
    f"WITH gone AS (DELETE FROM {TABLE} WHERE gtrid IN ({', '.join(f'${i + 1}' for i in range(SWAP_KEYS))})) "
    f"INSERT INTO {TABLE} (gtrid, node, record) "
    f"VALUES (${SWAP_KEYS + 1}, ${SWAP_KEYS + 2}, ${SWAP_KEYS + 3})"
)


def insert_statement(forgotten: list[str], *, fenced: bool = False) -> str:
    """The mark's INSERT, deleting ``forgotten`` marks in the same statement.

    ``fenced``: the node is a claim in this database (:mod:`.lease`); the
    node column is ``txm_fence(node, epoch)``, which holds the claim's fence
    lock shared and fails once another host took the node over, so the mark
    (and with it the branch's work) commits only while this process still
    holds it.
    Parameters: (forgotten,) gtrid, node, [epoch,] record."""
    node = "txm_fence(%s, %s)" if fenced else "%s"
    values = f"INSERT INTO {TABLE} (gtrid, node, record) VALUES (%s, {node}, %s)"
    if not forgotten:
        return values
    return f"WITH gone AS (DELETE FROM {TABLE} WHERE gtrid = ANY(%s)) {values}"


def mark_insert(forgotten: list[str], row: tuple[Any, ...], *, fenced: bool = False,
                prepared: bool = False) -> tuple[str, tuple[Any, ...]]:
    """The statement that inserts a mark (``row``: gtrid, node, [epoch,] record) and deletes
    ``forgotten`` marks, and its parameters: :func:`insert_statement`'s, or, where the session
    has the statements :data:`PREPARE`\\ d (``prepared``), ``EXECUTE`` of one of them (unfenced,
    at most :data:`SWAP_KEYS` forgotten: a backlog goes as text)."""
    if prepared and not fenced and len(forgotten) <= SWAP_KEYS:
        if not forgotten:
            return f"EXECUTE {PREPARED_INSERT} (%s, %s, %s)", row
        padded = [*forgotten, *[forgotten[-1]] * (SWAP_KEYS - len(forgotten))]
        return f"EXECUTE {PREPARED_SWAP} ({', '.join(['%s'] * (SWAP_KEYS + 3))})", (*padded, *row)
    return insert_statement(forgotten, fenced=fenced), ((forgotten, *row) if forgotten else row)


class MarkQueue:
    """The marks of one database whose transactions are over, waiting to be deleted.

    Shared by the sessions of a data source: whichever commits the next mark
    deletes them.  Taken marks that a failed commit did not delete are put
    back; deleting one twice is harmless."""

    def __init__(self) -> None:
        self._gids: list[str] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._gids)

    def add(self, gxid: Xid) -> None:
        self.add_key(key(gxid))

    def add_key(self, gid: str) -> None:
        """:meth:`add` of the mark whose row has the key ``gid`` (:func:`key`)."""
        with self._lock:
            self._gids.append(gid)

    def take(self) -> list[str]:
        if not self._gids:
            return []
        with self._lock:
            taken, self._gids = self._gids[:_MAX_DELETED], self._gids[_MAX_DELETED:]
            return taken

    def put_back(self, gids: Iterable[str]) -> None:
        with self._lock:
            self._gids[:0] = list(gids)
