"""Server-side prepared statements for the PostgreSQL store's recurring queries, per session.

psycopg2 sends every statement as text, so PostgreSQL parses and plans it each
time.  A reliable message costs the store about a dozen statements on each
side, and planning is a large part of PostgreSQL's CPU for them (the sender's
claim query alone takes about 0.2 ms to plan, more than to run).  A statement
the store sends a second time on a session is therefore ``PREPARE``\\ d there and
then sent as ``EXECUTE name (params)``: parsed once per session, planned once
PostgreSQL settles on a generic plan.

Safety, because a failed statement aborts the transaction it runs in:

* a statement PostgreSQL cannot prepare (a parameter whose type it cannot
  infer) is found out inside a savepoint, or outside any transaction, and is
  then sent as text for ever after;
* prepared statements are not transactional: a rollback keeps them, so the
  cache stays true;
* a session that loses them anyway (``DISCARD ALL`` from a pooler) fails one
  transaction (:class:`~.api.StoreUnavailableError`: retry it) and the store
  forgets that session's statements, so the retry prepares them again.

An ``EXECUTE``'s arguments are literals in its text, each coerced to its parameter's type
as the ``EXECUTE`` is analysed.  A ``float`` written as psycopg2 writes it (``1764620000.25``)
is a ``numeric`` constant there, and an ``int`` an ``integer``: for a ``double precision`` or a
``bigint`` parameter, PostgreSQL then makes a cast of it and folds that cast into a constant
at every ``EXECUTE``, with an executor state of its own (about 8 k instructions an argument,
under callgrind).  Such arguments go as quoted text instead (``'1764620000.25'``), which the
type's input function reads while the ``EXECUTE`` is analysed, to the same value (``repr``
of a ``float`` reads back exactly).  Each statement's parameter types are read once, from
``pg_prepared_statements``, in its ``PREPARE``'s round trip.

A ``bytea`` argument (a message's payload) that is ASCII with no NUL goes as its text too,
each backslash doubled: ``bytea``'s input reads it in its escape format, to the same bytes.
psycopg2 writes bytes in hex (``'\\x3c73...'``), twice the payload's length for PostgreSQL's
lexer and a hex decoding: a one-way message's enqueue (a 726 byte envelope) cost PostgreSQL
83 k instructions more that way (under callgrind, 579.3 k against 496.3 k a message).  A
payload with other bytes goes in hex, as before (its text would be converted between the
client's and the server's encodings).

Turn it off (``?prepare=0`` in the store URL, or ``prepare_statements=False``)
behind a pooler in transaction mode (PgBouncer before 1.21), where a session's
statements do not follow the client.
"""

from __future__ import annotations

import logging
import re
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import psycopg2
from psycopg2 import extensions as ext

from .sql import placeholders

__all__ = ["PreparedStatements", "UNDEFINED_PREPARED"]

log = logging.getLogger(__name__)

#: What PREPARE takes (a SAVEPOINT, BEGIN or SET is sent as text: PostgreSQL refuses to prepare it)
_PREPARABLE = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|VALUES)\b", re.IGNORECASE)
#: Settings a statement is sent after, in its query string (``SET LOCAL name TO value; ``): the
#: statement after them is prepared, and they are sent in front of its every ``EXECUTE``
_SETTINGS = re.compile(r"(?:SET LOCAL \w+ TO \w+; )+")
#: SQLSTATE of "prepared statement does not exist"
UNDEFINED_PREPARED = "26000"


def _refused(exc: psycopg2.Error) -> bool:
    """Did PostgreSQL refuse the PREPARE itself (rather than the session failing)?  Class 42
    (syntax or access rule: a parameter type it cannot infer is 42P18) and 0A (not supported)."""
    code = exc.pgcode or ""
    return code[:2] in ("42", "0A")


#: The parameter types whose ``EXECUTE`` argument goes as quoted text (see the module), and
#: whether a ``float`` does too, beside an ``int`` (a ``bigint`` reads no fraction; a ``bool``
#: is no ``int`` here); None: ``bytea``, whose ASCII bytes go as their text
_AS_TEXT: dict[str, bool | None] = {"double precision": True, "bigint": False, "bytea": None}


def _float_text(value: float) -> str:
    """A ``float`` that is no finite number as float8's input spells it."""
    return "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"


class _Session:
    __slots__ = ("names", "executes", "types", "seen", "counter")

    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # statement text (? placeholders) -> prepared name
        #: statement text -> (its parameters' count, the ``EXECUTE`` that runs it, and the
        #: arguments that go as text (position, and whether a ``float`` does)): written once
        self.executes: dict[str, tuple[int, str, tuple[tuple[int, bool | None], ...]]] = {}
        #: prepared name -> its parameters' types, as ``pg_prepared_statements`` names them
        self.types: dict[str, list[str]] = {}
        self.seen: set[str] = set()  # sent once on this session
        self.counter = 0


class PreparedStatements:
    """Which statements each session has prepared, and the text that runs one."""

    def __init__(self, *, per_session: int = 200) -> None:
        self._per_session = per_session
        self._sessions: weakref.WeakKeyDictionary[Any, _Session] = weakref.WeakKeyDictionary()
        #: statements PostgreSQL refused to prepare: always sent as text
        self._unpreparable: set[str] = set()
        self._lock = threading.Lock()
        self.prepared = 0

    def sent(self, conn: Any, sql: str, params: Sequence[Any]) -> tuple[str, Sequence[Any]] | None:
        """``EXECUTE ...`` for ``sql`` (``?`` placeholders) on ``conn``, preparing it if due, and
        its arguments (``params``, those of a ``double precision`` or ``bigint`` parameter as
        text: see the module); None: send ``sql`` with ``params``."""
        session = self._sessions.get(conn)
        if session is None:
            with self._lock:
                session = self._sessions.setdefault(conn, _Session())
        known = session.executes.get(sql)
        if known is None or known[0] != len(params):
            known = self._execute(conn, session, sql, params)
            if known is None:
                return None
        as_text = known[2]
        if not as_text:
            return known[1], params
        values = list(params)
        for position, floats in as_text:
            value = values[position]
            kind = type(value)
            if kind is int:
                values[position] = str(value)
            elif kind is float and floats:
                values[position] = repr(value) if value - value == 0 else _float_text(value)
            elif floats is None and (kind is bytes or kind is bytearray) and value.isascii() and b"\0" not in value:
                text = value.decode("ascii")
                values[position] = text.replace("\\", "\\\\") if "\\" in text else text
        return known[1], values

    def _execute(self, conn: Any, session: _Session, sql: str, params: Sequence[Any]
                 ) -> tuple[int, str, tuple[tuple[int, bool | None], ...]] | None:
        """:meth:`sent`'s ``EXECUTE`` for ``sql`` not yet known on ``session``, preparing ``sql``
        if due; None: send ``sql``."""
        settings = _SETTINGS.match(sql)
        prefix = settings.group(0) if settings else ""
        name = session.names.get(sql)
        if name is None:
            if sql not in session.seen:
                if len(session.seen) < 4 * self._per_session:
                    session.seen.add(sql)
                return None
            body = sql[len(prefix):]
            if (sql in self._unpreparable or len(session.names) >= self._per_session
                    or ";" in body or placeholders.count(sql) != len(params) or not _PREPARABLE.match(body)):
                return None
            name = self._prepare(conn, session, sql, body)
            if name is None:
                return None
        execute = f"{prefix}EXECUTE {name} ({', '.join('%s' for _ in params)})" if params else f"{prefix}EXECUTE {name}"
        types = session.types.get(name, ())
        as_text = tuple((position, _AS_TEXT[kind]) for position, kind in enumerate(types) if kind in _AS_TEXT)
        known = session.executes[sql] = (len(params), execute, as_text)
        return known

    def _prepare(self, conn: Any, session: _Session, sql: str, body: str) -> str | None:
        """``PREPARE`` ``body`` (``sql`` without the settings in front of it) on ``conn``, known
        there as ``sql`` from now on: a statement sent after settings is prepared apart from the
        same statement sent without them (its plans are made at an ``EXECUTE``, so under the
        settings sent before it, and never serve it without them)."""
        status = conn.info.transaction_status
        in_transaction = status == ext.TRANSACTION_STATUS_INTRANS
        # a branch whose BEGIN waits for its first statement (txmanager.lazy_begin): the session
        # is outside any transaction, and a cursor of psycopg2's own runs the PREPARE there; so
        # it does in a transaction: writes riding on the branch's next round trip
        # (LazyBeginConnection.ride) wait for the statement's own, not for its PREPARE
        begin_waits = getattr(conn, "sent_nothing", False)
        if not (in_transaction or (status == ext.TRANSACTION_STATUS_IDLE and (conn.autocommit or begin_waits))):
            return None  # in an aborted transaction, or where psycopg2 would open one for us
        session.counter += 1
        name = f"wsrm_{session.counter}"
        statement = f"PREPARE {name} AS {placeholders.dollars(body)}"
        # its parameters' types, read in the same round trip (see the module)
        types = f"SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = '{name}'"
        cur = ext.cursor(conn) if begin_waits or in_transaction else conn.cursor()
        try:
            if in_transaction:  # a failure must not abort the caller's transaction
                # the savepoint first, on its own: in one query string with the PREPARE, a
                # syntax error in the PREPARE would keep it from ever being set
                cur.execute("SAVEPOINT wsrm_prepare")
                cur.execute(f"{statement}; RELEASE SAVEPOINT wsrm_prepare; {types}")
            else:
                cur.execute(f"{statement}; {types}")
            row = cur.fetchone()
        except psycopg2.Error as exc:
            if not _refused(exc):
                raise  # the session failed, not the statement: the caller's error to report
            if in_transaction:
                try:
                    cur.execute("ROLLBACK TO SAVEPOINT wsrm_prepare; RELEASE SAVEPOINT wsrm_prepare")
                except Exception:  # noqa: BLE001 -- the session itself failed: the caller's statement will say so
                    return None
            with self._lock:
                self._unpreparable.add(sql)
            log.debug("not prepared (sent as text from now on): %s: %s", exc, sql)
            return None
        finally:
            cur.close()
        session.names[sql] = name
        session.types[name] = list(row[0]) if row and row[0] is not None else []
        self.prepared += 1
        return name

    def failed(self, conn: Any, exc: BaseException) -> None:
        """A statement on ``conn`` failed with ``exc``: when the session lost its prepared
        statements (SQLSTATE 26000), forget them, so they are prepared again as needed."""
        if getattr(exc, "pgcode", None) == UNDEFINED_PREPARED:
            with self._lock:
                self._sessions.pop(conn, None)
