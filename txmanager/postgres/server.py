"""What the resource asks of a PostgreSQL server, and how it names one: that prepared
transactions are enabled, the commit-mark table, a resource's name from its DSN, and the
database identity that tells two DSNs of the same database apart from two databases.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TypeAlias

import psycopg2
import psycopg2.extensions as ext

from .. import marks as _marks
from ..errors import PreparedTransactionsDisabledError

log = logging.getLogger(__name__)

#: Databases (by resource name) whose ``max_prepared_transactions`` was seen > 0.
_prepared_ok: set[str] = set()
_prepared_ok_lock = threading.Lock()


def check_prepared_transactions(conn: Connection, resource_name: str) -> None:
    """Refuse a database on which PREPARE TRANSACTION cannot work.

    PostgreSQL ships with ``max_prepared_transactions = 0``; a transaction
    manager on such a server accepts work and then fails every two-phase
    commit.  Checked once per database and process, on ``conn`` (left as it
    was found: the SHOW runs in autocommit mode)."""
    if resource_name in _prepared_ok:
        return
    was = conn.autocommit
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW max_prepared_transactions")
            row = cur.fetchone()
    finally:
        conn.autocommit = was
    value = int(row[0]) if row else 0
    if value <= 0:
        raise PreparedTransactionsDisabledError(
            f"PostgreSQL database {resource_name} has max_prepared_transactions = {value}: "
            "two-phase commit is disabled there; set max_prepared_transactions (at least the "
            "number of concurrent transactions, e.g. = max_connections) in postgresql.conf and "
            "restart PostgreSQL")
    with _prepared_ok_lock:
        _prepared_ok.add(resource_name)

Connection: TypeAlias = ext.connection  # Any while psycopg2 ships no hints
ConnectionFactory = Callable[[], Connection]


def create_mark_table(conn: Connection) -> None:
    """Create the commit-mark table (:mod:`.marks`) if it is missing, and commit.

    Under an advisory lock: two processes creating it at once would otherwise
    collide on the catalog's unique index.  A table that is there is not
    created again: a role without the privilege to create in the schema uses
    the table its owner made."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MARK_TABLE_LOCK,))
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (_marks.TABLE,))
        if not cur.fetchone()[0]:
            cur.execute(_marks.CREATE_TABLE)
    conn.commit()


#: The advisory lock key that serialises the creation of the commit-mark table.
_MARK_TABLE_LOCK = 0x74786D6D61726B  # "txmmark"


def default_resource_name(dsn: str) -> str:
    """A stable name for a database, the same after a restart: ``pg:dbname@host:port``.

    The password and other options are left out on purpose: the name lands in
    the recovery log and in operators' output.
    """
    p = ext.parse_dsn(dsn)
    dbname = p.get("dbname") or p.get("user") or "?"
    return f"pg:{dbname}@{p.get('host', 'localhost')}:{p.get('port', 5432)}"


#: What names a database for "is it the same one?": the cluster (its system identifier, written
#: by initdb), the server's run (its start time: a promoted copy of the cluster shares the
#: identifier but not the start) and the database.  The same from any DSN, host alias or socket.
_IDENTITY_SQL = ("SELECT system_identifier::text || '/' || "
                 "extract(epoch FROM pg_postmaster_start_time())::text || '/' || current_database() "
                 "FROM pg_control_system()")


def database_identity(conn: Connection) -> str | None:
    """Which database ``conn`` talks to, the same for every session of it; None when unknown.

    Called on a fresh session (it ends the transaction the query opens).  A
    server that will not say (``pg_control_system()`` revoked) gives None:
    then nothing is shared unless the user names the database explicitly
    (``database_identity=`` of :class:`XADataSource` and the PostgreSQL store).
    """
    try:
        with conn.cursor() as cur:
            cur.execute(_IDENTITY_SQL)
            row = cur.fetchone()
        conn.rollback()
        return str(row[0]) if row else None
    except psycopg2.Error as exc:
        log.info("cannot tell which database this session talks to (%s): its branches are not "
                 "shared", _describe(exc))
        with contextlib.suppress(psycopg2.Error):
            conn.rollback()
        return None


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    code = getattr(exc, "pgcode", None)
    return f"{text} (SQLSTATE {code})" if code else text
