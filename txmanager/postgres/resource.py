"""One PostgreSQL session as an XA resource (:class:`PostgresXAResource`), and the sharing
of one session by every user of the same database inside one global transaction.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import psycopg2
import psycopg2.extensions as ext

from .. import marks as _marks
from ..lazy_begin import _PENDING, _SQL, LazyBeginConnection, raise_commit_refused
from ..lease import Fence
from ..log import LogEntry, mark_record, parse_mark_record
from ..xa import (
    TMENDRSCAN,
    TMFAIL,
    TMJOIN,
    TMNOFLAGS,
    TMRESUME,
    TMSTARTRSCAN,
    TMSUCCESS,
    TMSUSPEND,
    SYNC_RAN,
    XA_OK,
    XA_RBCOMMFAIL,
    XA_RBROLLBACK,
    XA_RDONLY,
    XAER_DUPID,
    XAER_INVAL,
    XAER_NOTA,
    XAER_OUTSIDE,
    XAER_PROTO,
    XAER_RMERR,
    XAER_RMFAIL,
    XAException,
    XAResource,
)
from ..xid import Xid
from .branch import (
    _MAX_ENDED,
    _SESSION_GONE,
    _begin_branch,
    _Branch,
    _commit_branch,
    _Ended,
    _prepare_branch,
    _rollback_branch,
    _rollback_code,
    _State,
)
from .server import Connection, ConnectionFactory, _describe, check_prepared_transactions, default_resource_name

log = logging.getLogger(__name__)

# psycopg2's states of an idle session, as module globals: read on every branch's start and end
_READY = ext.STATUS_READY
_IDLE = ext.TRANSACTION_STATUS_IDLE
_INERROR = ext.TRANSACTION_STATUS_INERROR
#: SQLSTATE of "prepared statement does not exist" (:meth:`PostgresXAResource._forget_prepared_marks`)
_UNDEFINED_PREPARED = "26000"
# the branch states the one-phase path reads (a class attribute read costs several times a global's)
_B_ACTIVE = _State.ACTIVE
_B_IDLE = _State.IDLE


class _Namer(Protocol):
    """A transaction that names its one branch when asked (txmanager.transaction.Transaction)."""

    def _name_sole(self) -> Xid: ...


def _named(namer: Callable[[], Xid] | _Namer) -> Xid:
    """The branch xid ``namer`` gives (see PostgresXAResource.start_unnamed)."""
    name_sole = getattr(namer, "_name_sole", None)
    return name_sole() if name_sole is not None else namer()  # type: ignore[operator]


class PostgresXAResource:
    """One PostgreSQL session as an XA resource: at most one branch at a time.

    ``source`` is a libpq DSN or a callable returning a new psycopg2
    connection (then ``resource_name`` is required: it must name the database
    the same way after a restart, for the recovery log).  The session is
    opened on first use; :attr:`connection` is the connection the branch's SQL
    runs on, between ``start`` and ``end``.

    Phase 2 of the resource's own branch runs on that session; phase 2 of any
    other xid (prepared by another connection or process, or before a crash)
    and ``recover`` run on a second, autocommit connection opened on demand.
    So an instance made just for recovery, after a restart, works.

    With ``read_only_check=True``, ``prepare`` answers XA_RDONLY when the
    branch wrote nothing: PostgreSQL assigns a transaction id only on the
    first write (or row lock), and ``pg_current_xact_id_if_assigned()`` tells
    without side effects.  The branch is then committed at once and needs no
    phase 2 (saving PREPARE and COMMIT PREPARED, two WAL flushes).  The check
    costs a round trip on every prepare, measured here at 10-20% of a short
    two-database transaction whose branches all write, so it is off by
    default: always XA_OK, as pgjdbc does.  Caveat of the optimization (as
    with every XA driver): transaction-level advisory locks of a read-only
    branch are released at prepare.
    """

    # Slots for the session and branch fields the one-phase path reads on every
    # transaction (the C one-phase path, see txmanager.postgres.accelerated, reads them at their
    # slot); the rest in the instance dict.
    __slots__ = ("_session", "_spare", "_branch", "_namer", "_pool_return", "_shared_as", "__dict__", "__weakref__")

    def __init__(
        self,
        source: str | ConnectionFactory,
        resource_name: str | None = None,
        *,
        read_only_check: bool = False,
        marks: _marks.MarkQueue | None = None,
        database: str | None = None,
        prepare_marks: bool = False,
    ) -> None:
        if isinstance(source, str):
            dsn = source
            self._connect: ConnectionFactory = lambda: psycopg2.connect(
                dsn, connection_factory=LazyBeginConnection)
            self.resource_name = resource_name or default_resource_name(dsn)
            database = database or default_resource_name(dsn)
        elif callable(source):
            if not resource_name:
                raise TypeError(
                    "resource_name is required with a connection factory: give the database a "
                    "name that stays the same after a restart (e.g. default_resource_name(dsn))"
                )
            self._connect = source
            self.resource_name = resource_name
        else:
            raise TypeError(f"source must be a DSN string or a connection factory, not {type(source).__name__}")
        self.read_only_check = read_only_check
        #: the database, named as :func:`default_resource_name` does: where this resource's
        #: commit marks are (the recovery log names it so)
        self.database = database or self.resource_name
        self._marks = marks
        #: prepare the mark's statements on each session this resource opens
        #: (:data:`txmanager.marks.PREPARE`), so that a marked commit sends ``EXECUTE``: not behind a
        #: pooler that does not keep a session's prepared statements (in transaction mode)
        self.prepare_marks = prepare_marks
        #: the session they are prepared on (None: none, they go as text)
        self._marks_prepared_on: Connection | None = None
        #: the global xid of the last mark this resource committed and the key that mark's row
        #: has (see forget_mark)
        self._last_mark: tuple[Xid, str] | None = None
        self._session: Connection | None = None
        self._control: Connection | None = None
        self._branch: _Branch | None = None
        self._ended: OrderedDict[Xid, _Ended] = OrderedDict()
        self._scan_open = False
        self._lock = threading.RLock()
        #: the database identity under which this session's branch is shared, when it is a
        #: transaction's first resource (see session_for_database); set by XADataSource
        self._shared_as: str | None = None
        #: XADataSource's synchronization that takes this session back to its pool
        self._pool_return: Any = None
        #: gives the branch its xid when something needs it (see start_unnamed)
        self._namer: Callable[[], Xid] | _Namer | None = None
        #: a finished unnamed branch's object, for the next one (see end_and_commit_one_phase)
        self._spare: _Branch | None = None

    def __repr__(self) -> str:
        b = self._branch
        branch = f" {b.xid if b.xid is not None else '(unnamed)'} {b.state}" if b else ""
        return f"<PostgresXAResource {self.resource_name}{branch}>"

    # -- connections -------------------------------------------------------------

    @property
    def connection(self) -> Connection:
        """The session the branch's SQL runs on (opened on first use, autocommit off)."""
        with self._lock:
            if self._session is None or self._session.closed:
                conn = self._connect()
                try:
                    check_prepared_transactions(conn, self.resource_name)
                except BaseException:
                    with contextlib.suppress(psycopg2.Error):
                        conn.close()
                    raise
                conn.autocommit = False
                if self.prepare_marks and self._marks is not None:
                    self._prepare_marks(conn)
                self._session = conn
            return self._session

    def _prepare_marks(self, conn: Connection) -> None:
        """:data:`txmanager.marks.PREPARE` on a new session, outside any transaction (one round trip
        a session, against a parse and a plan a marked commit).  Where it fails (the table is not
        there yet...), the marks go as text on that session, as without ``prepare_marks``."""
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(_marks.PREPARE)
            self._marks_prepared_on = conn
        except psycopg2.Error as exc:
            log.info("%s: the commit mark's statements were not prepared (sent as text): %s",
                     self.resource_name, _describe(exc))
        finally:
            conn.autocommit = False

    @property
    def in_branch(self) -> bool:
        """True while the session carries a branch that is not finished."""
        return self._branch is not None

    def _open_session(self) -> Connection:
        try:
            return self.connection
        except psycopg2.Error as exc:
            raise XAException(XAER_RMFAIL, f"{self.resource_name}: cannot connect: {_describe(exc)}") from exc

    def _drop_session(self) -> None:
        """Close the session; PostgreSQL rolls back its open transaction, a prepared one stays."""
        conn, self._session = self._session, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg2.Error):
                conn.close()

    def _control_cursor_run(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement on the autocommit control connection.

        A control connection opened before a server restart is dead; that is
        the normal case for recovery, so one failure on an old connection is
        retried on a new one before the resource reports XAER_RMFAIL.
        """
        for attempt in (0, 1):
            fresh = self._control is None or bool(self._control.closed)
            if fresh:
                try:
                    conn = self._connect()
                    conn.autocommit = True
                except psycopg2.Error as exc:
                    raise XAException(
                        XAER_RMFAIL, f"{self.resource_name}: cannot connect: {_describe(exc)}"
                    ) from exc
                self._control = conn
            conn = self._control
            assert conn is not None
            try:
                with conn.cursor() as cur:
                    cur.execute(statement, params)
                    return cur.fetchall() if cur.description else []
            except psycopg2.Error as exc:
                if not self._is_session_lost(conn, exc):
                    raise
                self._control = None
                with contextlib.suppress(psycopg2.Error):
                    conn.close()
                if fresh or attempt:
                    raise XAException(
                        XAER_RMFAIL, f"{self.resource_name}: connection lost: {_describe(exc)}"
                    ) from exc
        raise AssertionError("unreachable")

    @staticmethod
    def _is_session_lost(conn: Connection, exc: BaseException) -> bool:
        if conn.closed or isinstance(exc, psycopg2.InterfaceError):
            return True
        code = getattr(exc, "pgcode", None)
        if code is None:
            return isinstance(exc, psycopg2.OperationalError)
        return code.startswith("08") or code in _SESSION_GONE

    # -- branch bookkeeping --------------------------------------------------------

    def _current(self, xid: Xid) -> _Branch:
        b = self._branch
        if b is None or (b.xid is not xid and b.xid != xid):
            where = f"it carries {b.xid}" if b else "it carries no branch"
            raise XAException(XAER_NOTA, f"{xid} is not a branch of this session ({where})")
        return b

    def _give_up(self, b: _Branch, code: int, *, maybe_prepared: bool = False) -> None:
        """Forget the session's branch: it is rolled back (or, when ``maybe_prepared``, in doubt)."""
        self._branch = None
        self._ended[b.xid] = _Ended(code, maybe_prepared)
        while len(self._ended) > _MAX_ENDED:
            self._ended.popitem(last=False)

    def _roll_back_session(self, b: _Branch, code: int) -> None:
        """Roll the session's unprepared transaction back; a dead session rolled it back already."""
        conn = self._session
        if conn is not None and not conn.closed:
            try:
                _rollback_branch(conn)
            except psycopg2.Error as exc:
                log.info("%s: rollback of %s failed (%s); closing the session instead",
                         self.resource_name, b.xid, _describe(exc))
                self._drop_session()
        self._give_up(b, code)

    def _refuse(self, b: _Branch, code: int, why: str, cause: BaseException | None = None) -> XAException:
        """Roll the branch back and build the XA_RB* exception that says so."""
        self._roll_back_session(b, code)
        exc = XAException(code, f"{self.resource_name}: {b.xid} rolled back: {why}")
        exc.__cause__ = cause
        return exc

    def _check_usable(self, b: _Branch) -> Connection:
        """The session of an ended, unprepared branch, or the XA_RB* it deserves."""
        conn = self._session
        if conn is None or conn.closed:
            self._drop_session()
            self._give_up(b, XA_RBCOMMFAIL)
            raise XAException(XA_RBCOMMFAIL, f"{self.resource_name}: the session of {b.xid} is gone; "
                                             "PostgreSQL rolled the branch back")
        if conn.get_transaction_status() == ext.TRANSACTION_STATUS_INERROR:
            raise self._refuse(b, XA_RBROLLBACK, "a statement of the branch failed")
        return conn

    # -- XAResource: association ---------------------------------------------------------

    def start(self, xid: Xid, flags: int = TMNOFLAGS) -> None:
        if flags == TMNOFLAGS:  # the usual case; acquire/release cost half a ``with`` (callgrind)
            lock = self._lock
            lock.acquire()
            try:
                self._begin(xid, None)
            finally:
                lock.release()
            return
        with self._lock:
            if self._namer is not None:
                self._name_branch()
            if flags in (TMJOIN, TMRESUME):
                b = self._current(xid)
                wanted = _State.IDLE if flags == TMJOIN else _State.SUSPENDED
                if flags == TMJOIN and b.state is _State.ROLLBACK_ONLY:
                    raise XAException(XA_RBROLLBACK, f"{xid} is marked rollback-only and cannot be joined")
                if b.state is not wanted:
                    verb = "join" if flags == TMJOIN else "resume"
                    raise XAException(XAER_PROTO, f"cannot {verb} {xid}: it is {b.state}")
                b.state = _State.ACTIVE
            else:
                raise XAException(XAER_INVAL, f"start flags {flags:#x}: use TMNOFLAGS, TMJOIN or TMRESUME")

    def start_unnamed(self, namer: Callable[[], Xid] | _Namer) -> None:
        """``start(namer(), TMNOFLAGS)``, with the xid asked for only when something needs it.

        ``namer`` is a callable, or a transaction of this package, which names its branch
        with ``_name_sole()`` (given as itself, no bound method is made per transaction).

        A transaction manager's one-phase path starts its only resource so: a
        branch that commits in one phase on a :class:`LazyBeginConnection`
        never needs its xid (the gid is for PREPARE), so none is made.  Any
        other call on the branch (it then names it) asks ``namer`` first.

        The usual case (an idle session of this module's connection class) takes no lock: a
        lock pair was a tenth of the manager's own cost of a one-phase transaction, and it
        orders nothing here.  The session carries no branch, so the only callers are the
        transaction starting one (which serializes its own calls) and recovery, which
        touches other xids on the control connection; a branch that recovery names
        meanwhile (``_name_branch``, under the lock) only sends :meth:`end_and_commit_one_phase`
        back to ``end`` and ``commit``, which take the lock.
        """
        conn = self._session
        if (self._branch is None and conn is not None and type(conn) is LazyBeginConnection
                and not conn.closed):
            if conn._lagging and not conn._tpc_only:
                # the usual case, a session whose last branch committed in one phase and which
                # ran nothing since (that clears ``_lagging``): idle, as _SessionReturn takes it
                # too, without asking psycopg2; what begin_unnamed does then, without its call
                conn._lagging = False
                conn._mode = _PENDING
                begun = True
            elif conn.status == _READY and conn.get_transaction_status() == _IDLE:
                try:
                    begun = conn.begin_unnamed()  # what _begin does, inline
                except psycopg2.Error:
                    begun = False  # _begin says what it means
            else:
                begun = False  # _begin says what is wrong
            if begun:
                b = self._spare
                if b is None:
                    b = _Branch(None, _State.ACTIVE)  # type: ignore[arg-type]
                else:  # the last one-phase branch's object (see end_and_commit_one_phase)
                    self._spare = None
                    b.state = _B_ACTIVE
                self._namer = namer
                self._branch = b
                return
        with self._lock:
            self._begin(None, namer)

    def _name_branch(self) -> None:
        """Give the branch started by :meth:`start_unnamed` its xid, before a call that
        names it (or a message that shows it)."""
        namer, self._namer = self._namer, None
        b = self._branch
        if namer is None or b is None or b.xid is not None:
            return
        b.xid = xid = _named(namer)
        conn = self._session
        if isinstance(conn, LazyBeginConnection) and conn.in_branch and conn._xid is None:
            conn._xid = xid  # what its PREPARE will need

    def _begin(self, xid: Xid | None, namer: Callable[[], Xid] | _Namer | None) -> None:
        if self._branch is not None:
            if self._namer is not None:
                self._name_branch()
            if xid is None:
                assert namer is not None
                xid = _named(namer)
            if self._branch.xid == xid:
                raise XAException(XAER_DUPID, f"{xid} is already started on this session")
            raise XAException(
                XAER_PROTO,
                f"this session still carries {self._branch.xid} ({self._branch.state}); a PostgreSQL "
                "session runs one transaction at a time: finish that branch or use another resource",
            )
        conn = self._session
        if conn is None or conn.closed:
            conn = self._open_session()
        if conn.status != ext.STATUS_READY or conn.get_transaction_status() != ext.TRANSACTION_STATUS_IDLE:
            raise XAException(
                XAER_OUTSIDE,
                f"{self.resource_name}: the session has a local transaction open (SQL ran outside "
                "start/end); commit or roll it back before starting a branch",
            )
        try:
            if type(conn) is LazyBeginConnection:  # what _begin_branch does, one call fewer
                if xid is None and not conn.begin_unnamed():
                    assert namer is not None
                    xid = _named(namer)  # psycopg2's tpc_begin runs this branch: it takes the xid now
                if xid is not None:
                    conn.begin_branch(xid)
            else:
                if xid is None:
                    assert namer is not None
                    xid = _named(namer)
                _begin_branch(conn, xid)
        except psycopg2.Error as exc:
            lost = self._is_session_lost(conn, exc)
            self._drop_session()
            shown = xid if xid is not None else _named(namer) if namer is not None else None
            raise XAException(XAER_RMFAIL if lost else XAER_RMERR,
                              f"{self.resource_name}: cannot start {shown}: {_describe(exc)}") from exc
        if xid is not None and self._ended:
            self._ended.pop(xid, None)
        self._branch = _Branch(xid, _State.ACTIVE)  # type: ignore[arg-type]  # None: unnamed
        self._namer = namer if xid is None else None

    def end(self, xid: Xid, flags: int = TMSUCCESS) -> None:
        lock = self._lock
        lock.acquire()  # the usual case first, under acquire/release (half a ``with``'s cost)
        try:
            if self._namer is not None:
                self._name_branch()
            b = self._branch
            if flags == TMSUCCESS and b is not None and b.xid is xid and b.state is _State.ACTIVE:
                conn = self._session
                if conn is not None and not conn.closed:
                    if conn.get_transaction_status() == ext.TRANSACTION_STATUS_INERROR:
                        b.state = _State.ROLLBACK_ONLY
                        raise XAException(XA_RBROLLBACK, f"{xid}: a statement of the branch failed; "
                                                         "it can only be rolled back")
                    b.state = _State.IDLE
                    return
        finally:
            lock.release()
        with self._lock:
            b = self._branch
            if b is None or b.xid is not xid:  # the TM passes the very xid it started
                b = self._current(xid)
            if flags not in (TMSUCCESS, TMFAIL, TMSUSPEND):
                raise XAException(XAER_INVAL, f"end flags {flags:#x}: use TMSUCCESS, TMFAIL or TMSUSPEND")
            allowed = (_State.ACTIVE,) if flags == TMSUSPEND else (_State.ACTIVE, _State.SUSPENDED)
            if b.state not in allowed:
                raise XAException(XAER_PROTO, f"cannot end {xid}: it is {b.state}")
            if flags == TMSUSPEND:
                b.state = _State.SUSPENDED
            elif flags == TMFAIL:
                b.state = _State.ROLLBACK_ONLY
            else:
                b.state = _State.IDLE
                conn = self._session
                if conn is None or conn.closed:
                    self._check_usable(b)  # raises XA_RBCOMMFAIL
                if conn is not None and conn.get_transaction_status() == ext.TRANSACTION_STATUS_INERROR:
                    b.state = _State.ROLLBACK_ONLY
                    raise XAException(XA_RBROLLBACK, f"{xid}: a statement of the branch failed; "
                                                     "it can only be rolled back")

    # -- XAResource: completion -------------------------------------------------------------

    def prepare(self, xid: Xid) -> int:
        with self._lock:
            if self._namer is not None:
                self._name_branch()
            b = self._current(xid)
            if b.state is _State.ROLLBACK_ONLY:
                raise self._refuse(b, XA_RBROLLBACK, "it was marked rollback-only")
            if b.state is not _State.IDLE:
                raise XAException(XAER_PROTO, f"cannot prepare {xid}: it is {b.state} "
                                              "(end it with TMSUCCESS first)")
            conn = self._check_usable(b)
            if isinstance(conn, LazyBeginConnection) and conn.sent_nothing:
                conn.rollback_branch()  # no statement ran: nothing to send, nothing to prepare
                self._branch = None
                return XA_RDONLY
            if self.read_only_check and self._wrote_nothing(b, conn):
                self._commit_read_only(b, conn)
                return XA_RDONLY
            try:
                _prepare_branch(conn)
            except psycopg2.Error as exc:
                if self._is_session_lost(conn, exc):
                    self._drop_session()
                    self._give_up(b, XAER_RMFAIL, maybe_prepared=True)
                    raise XAException(
                        XAER_RMFAIL,
                        f"{self.resource_name}: connection lost during PREPARE of {xid}: it may be "
                        f"prepared; roll it back (or let recovery do it): {_describe(exc)}",
                    ) from exc
                raise self._refuse(b, _rollback_code(exc.pgcode), _describe(exc), exc) from exc
            b.state = _State.PREPARED
            return XA_OK

    def _wrote_nothing(self, b: _Branch, conn: Connection) -> bool:
        query = ("SELECT pg_current_xact_id_if_assigned() IS NULL" if conn.server_version >= 130000
                 else "SELECT txid_current_if_assigned() IS NULL")
        try:
            with conn.cursor() as cur:
                cur.execute(query)
                return bool(cur.fetchone()[0])
        except psycopg2.Error as exc:
            raise self._statement_failed(b, conn, exc, "PREPARE") from exc

    def _statement_failed(self, b: _Branch, conn: Connection, exc: psycopg2.Error, before: str) -> XAException:
        """A statement of the branch's own, before its PREPARE or COMMIT, failed: the branch
        is rolled back (by the server, or with its lost session); the XA_RB* to raise."""
        if self._is_session_lost(conn, exc):
            self._drop_session()
            self._give_up(b, XA_RBCOMMFAIL)
            return XAException(XA_RBCOMMFAIL, f"{self.resource_name}: connection lost before "
                                              f"{before} of {b.xid}: {_describe(exc)}")
        return self._refuse(b, _rollback_code(exc.pgcode), _describe(exc), exc)

    def _commit_read_only(self, b: _Branch, conn: Connection) -> None:
        try:
            _commit_branch(conn)
        except psycopg2.Error as exc:
            if not self._is_session_lost(conn, exc):
                raise self._refuse(b, _rollback_code(exc.pgcode), _describe(exc), exc) from exc
            self._drop_session()  # it wrote nothing: losing it loses nothing
        self._branch = None

    def commit(self, xid: Xid, one_phase: bool = False) -> None:
        lock = self._lock
        lock.acquire()  # the usual case first, under acquire/release (half a ``with``'s cost)
        try:
            if self._namer is not None:
                self._name_branch()
            b = self._branch
            if b is not None and (b.xid is xid or b.xid == xid):
                if one_phase:
                    self._commit_one_phase(b)
                else:
                    self._commit_prepared_here(b)
                return
        finally:
            lock.release()
        with self._lock:
            ended = self._ended.get(xid)
            if one_phase:
                if ended is not None:
                    raise XAException(ended.code if ended.code != XAER_RMFAIL else XA_RBCOMMFAIL,
                                      f"{xid} was already rolled back by {self.resource_name}")
                raise XAException(XAER_NOTA, f"{xid} is not a branch of this session; one-phase "
                                             "commit needs the session that did the work")
            self._finish_prepared(xid, commit=True)
            self._ended.pop(xid, None)

    def end_and_commit_one_phase(self, xid: Xid | None, sync: Any = None) -> bool | str:
        """``end(xid, TMSUCCESS)`` and ``commit(xid, one_phase=True)`` in one call, for a
        transaction manager whose only branch this is (nothing of its own to do between them);
        ``xid`` None for a branch started by :meth:`start_unnamed` and never named since.

        False, having done nothing, unless the branch is active on a session that can commit
        it: the manager then calls ``end`` and ``commit``, which say what is wrong.  Raises
        what ``commit`` raises once the COMMIT was sent.

        ``sync``, the manager's synchronization for the branch: when it is this session's own
        return to its data source's pool (``_pool_return``) and the COMMIT left the session
        idle the usual way, that return is done here (what its ``after_completion`` does then,
        without its call and its checks) and the answer is :data:`~txmanager.xa.SYNC_RAN`:
        the manager has nothing left to run.  The return reads nothing of the transaction, so
        it may run before the manager marks it committed.

        No lock, as in :meth:`start_unnamed`: the branch is the calling transaction's, which
        completes it once; a failure is sorted out under the lock.
        """
        b = self._branch
        if b is None or b.xid is not xid or b.state is not _B_ACTIVE:
            return False
        conn = self._session
        # INERROR (a statement failed) or above it UNKNOWN: libpq's answer without a good
        # connection (closed, or found broken), so one call asks both
        if conn is None or conn.get_transaction_status() >= _INERROR:
            return False
        b.state = _B_IDLE
        try:
            if type(conn) is LazyBeginConnection and conn._mode is _SQL:
                # the usual case: what commit_branch does then, without its call
                cur = conn._own_cursor
                if cur is None:  # (never closed but with its session, open here: no need to ask)
                    conn._own_cursor = cur = ext.cursor(conn)
                # bytes: psycopg2 encodes no str; what rides on the COMMIT (LazyBeginConnection.ride,
                # ride_to_commit) goes in front of it
                if conn._riding:
                    conn._commit_riding(cur)
                else:
                    cur.execute(b"COMMIT")
                    if cur.statusmessage != "COMMIT":
                        raise_commit_refused(cur)
                conn._mode = conn._xid = None
                conn._lagging = True  # psycopg2's autocommit flag stays on (see LazyBeginConnection)
                self._branch = self._namer = None
                if xid is None:  # nobody was given it: the next unnamed branch reuses it
                    self._spare = b
                if sync is not None and sync is self._pool_return:
                    # what _SessionReturn.after_completion does for a session idle after its
                    # one-phase COMMIT (``_lagging``, no branch, open: all known here)
                    ds = sync._ds
                    idle = ds._idle
                    if len(idle) < ds.pool_size:
                        idle.append(self)
                        if not ds._closed:
                            return SYNC_RAN  # close(), not yet begun, will find it in this list
                        try:
                            idle.remove(self)
                        except ValueError:
                            return SYNC_RAN  # close() took it from the list and closes it
                    self.close()
                    return SYNC_RAN
                return True
            elif type(conn) is LazyBeginConnection:
                conn.commit_branch()
            else:
                _commit_branch(conn)
        except psycopg2.Error as exc:
            self._one_phase_commit_failed(b, conn, exc)
        self._branch = self._namer = None
        if xid is None:  # nobody was given it: the next unnamed branch reuses it
            self._spare = b
        return True

    def _one_phase_commit_failed(self, b: _Branch, conn: Connection, exc: psycopg2.Error) -> None:
        """Raise what the failed one-phase COMMIT of :meth:`end_and_commit_one_phase` means (in
        an ``except`` of it; the C one-phase path calls it too, see :mod:`txmanager.postgres.accelerated`)."""
        with self._lock:
            self._commit_failed(b, conn, exc)

    def _commit_one_phase(self, b: _Branch) -> None:
        if b.state is _State.ROLLBACK_ONLY:
            raise self._refuse(b, XA_RBROLLBACK, "it was marked rollback-only")
        if b.state is not _State.IDLE:
            hint = "commit it with one_phase=False" if b.state is _State.PREPARED else "end it first"
            raise XAException(XAER_PROTO, f"cannot commit {b.xid} in one phase: it is {b.state}; {hint}")
        conn = self._session
        if conn is None or conn.closed or conn.get_transaction_status() == ext.TRANSACTION_STATUS_INERROR:
            conn = self._check_usable(b)  # raises the XA_RB* the branch deserves
        try:
            if type(conn) is LazyBeginConnection:  # what _commit_branch does, one call fewer
                conn.commit_branch()
            else:
                _commit_branch(conn)
        except psycopg2.Error as exc:
            self._commit_failed(b, conn, exc)
        self._branch = None

    def _commit_failed(self, b: _Branch, conn: Connection, exc: psycopg2.Error) -> None:
        """Raise what a failed one-phase COMMIT of ``b`` means (in an ``except`` of it)."""
        if self._namer is not None:
            self._name_branch()
        if self._is_session_lost(conn, exc):
            self._drop_session()
            self._give_up(b, XAER_RMFAIL)
            raise XAException(XAER_RMFAIL, f"{self.resource_name}: connection lost during COMMIT of "
                                           f"{b.xid}: its outcome is unknown: {_describe(exc)}") from exc
        raise self._refuse(b, _rollback_code(exc.pgcode), _describe(exc), exc) from exc

    # -- commit marks (see txmanager.marks) -----------------------------------------------

    @property
    def holds_commit_marks(self) -> bool:
        """True when this resource's branch may carry a transaction's commit decision."""
        return self._marks is not None

    def commit_marked(self, xid: Xid, gxid: Xid, node: str,
                      branches: list[tuple[Xid, str]], *, fence: Fence | None = None) -> None:
        """Commit the session's ended branch in one phase, with the mark that decides ``gxid``.

        The mark names ``branches`` (the transaction's other branches, all
        prepared).  Raises XA_RB* when the branch rolled back (nothing was
        decided).  When the answer to COMMIT is lost, the table says: once the
        session's backend is gone, the mark is there or not; XAER_RMFAIL only
        when the database cannot tell (then the mark decides, and recovery
        reads it).

        ``fence`` (a node claimed in this database, :mod:`txmanager.lease`):
        the mark is written only while the claim's epoch is current, else the
        branch rolls back (XA_RBOTHER, SQLSTATE WX001)."""
        with self._lock:
            if self._namer is not None:
                self._name_branch()
            if fence is not None and fence.node != node:
                raise XAException(XAER_PROTO, f"the fence of node {fence.node} cannot decide for node {node}")
            if self._marks is None:
                raise XAException(XAER_PROTO, f"{self.resource_name} keeps no commit marks")
            b = self._current(xid)
            if b.state is _State.ROLLBACK_ONLY:
                raise self._refuse(b, XA_RBROLLBACK, "it was marked rollback-only")
            if b.state is not _State.IDLE:
                raise XAException(XAER_PROTO, f"cannot commit {xid} with a mark: it is {b.state}")
            conn = self._check_usable(b)
            forgotten = self._marks.take()
            record = mark_record(gxid, branches, time.time())
            mark_key = _marks.key(gxid, node)
            row: tuple[Any, ...] = ((mark_key, node, record) if fence is None
                                    else (mark_key, node, fence.epoch, record))
            statement, params = _marks.mark_insert(forgotten, row, fenced=fence is not None,
                                                   prepared=self._marks_prepared_on is conn)
            backend = conn.info.backend_pid
            try:
                # the mark and the COMMIT in one round trip where the session allows it
                if not (isinstance(conn, LazyBeginConnection) and conn.commit_branch_after(statement, params)):
                    self._insert_mark(b, conn, statement, params, forgotten)
                    _commit_branch(conn)
            except psycopg2.Error as exc:
                self._marks.put_back(forgotten)
                self._forget_prepared_marks(exc)
                if not self._is_session_lost(conn, exc):
                    raise self._refuse(b, _rollback_code(exc.pgcode), _describe(exc), exc) from exc
                self._drop_session()
                committed = self._mark_committed(gxid, mark_key, backend)
                if committed is None:
                    self._give_up(b, XAER_RMFAIL)
                    raise XAException(XAER_RMFAIL, f"{self.resource_name}: connection lost during COMMIT "
                                                   f"of {xid} and its commit mark, and the database cannot "
                                                   f"tell yet: the mark decides; recovery reads it: "
                                                   f"{_describe(exc)}") from exc
                if not committed:
                    self._give_up(b, XA_RBCOMMFAIL)
                    raise XAException(XA_RBCOMMFAIL, f"{self.resource_name}: connection lost during COMMIT "
                                                     f"of {xid}; it did not commit (no mark): "
                                                     f"{_describe(exc)}") from exc
                log.info("%s: the answer to COMMIT of %s was lost; its mark is there: committed",
                         self.resource_name, xid)
            self._branch = None
            self._last_mark = (gxid, mark_key)

    def _insert_mark(self, b: _Branch, conn: Connection, statement: str, params: tuple[Any, ...],
                     forgotten: list[str]) -> None:
        """The mark's INSERT on its own (before COMMIT): a failure rolls the branch back (XA_RB*)."""
        try:
            with conn.cursor() as cur:
                cur.execute(statement, params)
        except psycopg2.Error as exc:
            self._marks.put_back(forgotten)  # type: ignore[union-attr]  # checked by the caller
            self._forget_prepared_marks(exc)
            raise self._statement_failed(b, conn, exc, "COMMIT") from exc

    def _forget_prepared_marks(self, exc: psycopg2.Error) -> None:
        """A marked commit failed with ``exc``: where the session no longer had the mark's
        prepared statements (SQLSTATE 26000: a pooler's ``DISCARD ALL``, a ``DEALLOCATE``), that
        transaction rolled back, and the session's next marks go as text."""
        if exc.pgcode == _UNDEFINED_PREPARED:
            self._marks_prepared_on = None

    def _mark_committed(self, gxid: Xid, mark_key: str, backend: int, wait: float = 5.0) -> bool | None:
        """After a lost answer to COMMIT: did the mark of ``gxid`` commit?  None: cannot tell.

        Only once the session's backend is gone is the answer final: a backend
        whose client vanished still finishes a COMMIT it had begun, so a look
        at the table before that could miss a mark that commits a moment later.
        """
        deadline = time.monotonic() + wait
        try:
            while self._control_cursor_run("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)):
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
            rows = self._control_cursor_run(f"SELECT 1 FROM {_marks.TABLE} WHERE gtrid = %s",
                                            (mark_key,))
        except (XAException, psycopg2.Error) as exc:
            log.info("%s: cannot tell whether the mark of %s committed: %s", self.resource_name, gxid,
                     exc)
            return None
        return bool(rows)

    def forget_mark(self, gxid: Xid) -> None:
        """Every branch the mark of ``gxid`` named is committed: delete it with the next one.

        The mark this resource committed last goes by the key its row was written with (the
        transaction's next call after its commit_marked): the key is not made again (its
        node read from the gtrid, then its unique part: 10 Python calls of the client's
        two-phase transaction), and it is the row's own key whatever node named it."""
        if self._marks is not None:
            last = self._last_mark
            if last is not None and last[0] is gxid:
                self._last_mark = None
                self._marks.add_key(last[1])
            else:
                self._marks.add(gxid)

    def commit_marks(self, node: str) -> dict[Xid, LogEntry]:
        """The commit marks of ``node`` in this database, as log entries (none without the table).

        Raises :class:`XAException` when the database cannot be asked or a mark
        cannot be read: recovery then presumes nothing about the node's
        unlogged branches."""
        with self._lock:
            try:
                # asked first, so that a database without marks logs no error at every pass
                if self._control_cursor_run("SELECT to_regclass(%s)", (_marks.TABLE,))[0][0] is None:
                    return {}
                rows = self._control_cursor_run(
                    f"SELECT gtrid, record FROM {_marks.TABLE} WHERE node = %s", (node,))
            except psycopg2.Error as exc:
                if exc.pgcode == "42P01":  # undefined_table: dropped in between
                    return {}
                raise XAException(XAER_RMERR, f"{self.resource_name}: cannot read commit marks: "
                                              f"{_describe(exc)}") from exc
            entries: dict[Xid, LogEntry] = {}
            for gtrid, text in rows:
                try:
                    entry = parse_mark_record(gtrid, text, node)
                except (ValueError, KeyError, TypeError) as exc:
                    raise XAException(XAER_RMERR, f"{self.resource_name}: unreadable commit mark "
                                                  f"{text[:120]!r}: {exc}") from exc
                entries[entry.gxid] = entry
            return entries

    def delete_marks(self, gxids: list[Xid]) -> None:
        """Delete the marks of finished transactions now (recovery), keyed either way."""
        self._delete_marks([k for g in gxids for k in _marks.keys(g)])

    def delete_waiting_marks(self, queue: _marks.MarkQueue) -> None:
        """Delete the marks waiting in ``queue`` now (a data source or store closing); what
        cannot be deleted is left for recovery to delete."""
        while gids := queue.take():
            try:
                self._delete_marks(gids)
            except XAException as exc:
                log.info("%s: %d commit mark(s) left for recovery to delete: %s", self.resource_name,
                         len(gids), exc)
                return

    def _delete_marks(self, gids: list[str]) -> None:
        if not gids:
            return
        with self._lock:
            try:
                self._control_cursor_run(f"DELETE FROM {_marks.TABLE} WHERE gtrid = ANY(%s)", (gids,))
            except psycopg2.Error as exc:
                if exc.pgcode == "42P01":
                    return
                raise XAException(XAER_RMERR, f"{self.resource_name}: cannot delete commit marks: "
                                              f"{_describe(exc)}") from exc

    def _commit_prepared_here(self, b: _Branch) -> None:
        if b.state is not _State.PREPARED:
            raise XAException(XAER_PROTO, f"cannot commit {b.xid} in two phases: it is {b.state} "
                                          "(prepare it first, or pass one_phase=True)")
        self._finish_on_session(b, commit=True)

    def _finish_on_session(self, b: _Branch, commit: bool) -> None:
        """COMMIT/ROLLBACK PREPARED on the session that prepared; on another connection if it failed."""
        conn = self._session
        try:
            if conn is None or conn.closed:
                raise psycopg2.InterfaceError("session closed")
            _commit_branch(conn) if commit else _rollback_branch(conn)
            self._branch = None
            return
        except psycopg2.Error as exc:
            log.info("%s: %s PREPARED of %s failed on its session (%s); retrying on another connection",
                     self.resource_name, "COMMIT" if commit else "ROLLBACK", b.xid, _describe(exc))
        self._drop_session()
        self._branch = None
        try:
            self._finish_prepared(b.xid, commit)
        except XAException as exc:
            if exc.code != XAER_NOTA:
                self._ended[b.xid] = _Ended(XAER_RMFAIL, maybe_prepared=True)
                raise
            # It was prepared here and only this session's own statement could have finished it.
            log.info("%s: %s was finished by the statement whose answer was lost", self.resource_name, b.xid)

    def _finish_prepared(self, xid: Xid, commit: bool) -> None:
        verb = "COMMIT PREPARED" if commit else "ROLLBACK PREPARED"
        try:
            self._control_cursor_run(f"{verb} %s", (xid.to_pg_gid(),))
        except psycopg2.Error as exc:
            if exc.pgcode == "42704":
                raise XAException(XAER_NOTA, f"{self.resource_name}: no prepared transaction {xid} "
                                             "in this database") from exc
            if exc.pgcode == "0A000":  # prepared in another database of the server
                raise XAException(XAER_NOTA, f"{self.resource_name}: {xid}: {_describe(exc)}") from exc
            raise XAException(XAER_RMERR, f"{self.resource_name}: {verb} {xid} failed: {_describe(exc)}") from exc

    def rollback(self, xid: Xid) -> None:
        """Roll back the branch, prepared or not.

        A branch still associated (not ended) is rolled back too, so a
        transaction manager can abort it on timeout; the call waits for a
        statement running on the session (see :meth:`set_transaction_timeout`).
        """
        with self._lock:
            if self._namer is not None:
                self._name_branch()
            b = self._branch
            if b is not None and b.xid == xid:
                if b.state is _State.PREPARED:
                    self._finish_on_session(b, commit=False)
                else:
                    self._roll_back_session(b, XA_RBROLLBACK)
                    self._ended.pop(xid, None)
                return
            ended = self._ended.pop(xid, None)
            if ended is not None:
                if ended.maybe_prepared:
                    with contextlib.suppress(XAException):
                        self._finish_prepared(xid, commit=False)
                return
            self._finish_prepared(xid, commit=False)

    def forget(self, xid: Xid) -> None:
        raise XAException(XAER_NOTA, "PostgreSQL never completes a branch heuristically: nothing to forget")

    # -- XAResource: recovery ----------------------------------------------------------------

    def recover(self, flags: int = TMSTARTRSCAN | TMENDRSCAN) -> list[Xid]:
        """The XA-form xids prepared in this database, of every format (the TM keeps its own).

        All are returned by the TMSTARTRSCAN call; a TMNOFLAGS call in the same
        scan returns nothing more.  Plain-string gids (someone's ``PREPARE
        TRANSACTION 'foo'``) are not XA branches and are left out.
        """
        with self._lock:
            if flags & ~(TMSTARTRSCAN | TMENDRSCAN):
                raise XAException(XAER_INVAL, f"recover flags {flags:#x}: use TMSTARTRSCAN, TMENDRSCAN, TMNOFLAGS")
            if not flags & TMSTARTRSCAN:
                if not self._scan_open:
                    raise XAException(XAER_PROTO, "no recovery scan is open: start one with TMSTARTRSCAN")
                self._scan_open = not flags & TMENDRSCAN
                return []
            try:
                rows = self._control_cursor_run(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() ORDER BY prepared"
                )
            except psycopg2.Error as exc:
                raise XAException(XAER_RMERR, f"{self.resource_name}: recover failed: {_describe(exc)}") from exc
            self._scan_open = not flags & TMENDRSCAN
            xids = [xid for (gid,) in rows if (xid := Xid.from_pg_gid(gid)) is not None]
            log.debug("%s: recover found %d XA branches (%d prepared transactions)",
                      self.resource_name, len(xids), len(rows))
            return xids

    def prepared_age(self, xid: Xid) -> float | None:
        """Seconds since ``xid`` was prepared, by the server's clock; None when it is not prepared here.

        The recovery manager leaves younger branches alone: they may belong to
        a transaction still committing.  Both ends of the interval are read
        from the server, so a skewed client clock cannot shorten it.
        """
        with self._lock:
            try:
                rows = self._control_cursor_run(
                    "SELECT extract(epoch FROM now() - prepared)::float8 FROM pg_prepared_xacts "
                    "WHERE gid = %s AND database = current_database()", (xid.to_pg_gid(),)
                )
            except psycopg2.Error as exc:
                raise XAException(XAER_RMERR, f"{self.resource_name}: {_describe(exc)}") from exc
            return float(rows[0][0]) if rows else None

    # -- XAResource: identity and timeouts ---------------------------------------------------------

    def is_same_rm(self, other: XAResource) -> bool:
        """True only for this very resource.

        Two sessions of the same database are still two resource managers for
        XA's purpose: a PostgreSQL transaction is bound to one session, so a
        branch cannot be joined from another connection (TMJOIN there would
        have nothing to join).  The transaction manager then starts a separate
        branch for each connection, and both commit atomically anyway.
        """
        return other is self

    def get_transaction_timeout(self) -> int:
        return 0

    #: the transaction manager need not call set_transaction_timeout (it always answers False)
    takes_transaction_timeout = False

    def set_transaction_timeout(self, seconds: int) -> bool:
        """Not supported: returns False, and the transaction manager enforces its deadline.

        Bounding the branch on the server (``SET LOCAL statement_timeout``)
        would cost a round trip per branch, a quarter of a short one-phase
        transaction.  To keep a branch from waiting forever on a lock, put the
        bound in the DSN instead: ``options='-c lock_timeout=2000'`` or
        ``-c statement_timeout=...``.
        """
        return False

    def close(self) -> None:
        """Close both connections.  An unprepared branch rolls back; a prepared one stays for recovery."""
        with self._lock:
            if self._namer is not None:
                self._name_branch()
            if self._branch is not None:
                # a prepared branch is expected here after Transaction.prepare_and_detach:
                # another process decides it; anything else is work being thrown away
                level = logging.INFO if self._branch.state is _State.PREPARED else logging.WARNING
                log.log(level, "%s: closing with branch %s %s", self.resource_name,
                        self._branch.xid, self._branch.state)
                self._branch = None
            self._drop_session()
            conn, self._control = self._control, None
            if conn is not None and not conn.closed:
                conn.close()

# Sessions shared inside one global transaction, by database identity.  Two users of the same
# database (the application's XADataSource and the WS-RM store) then run their work in ONE branch:
# the transaction manager commits a transaction with one branch in one phase (no PREPARE, no log
# write), and one PostgreSQL transaction is exactly as atomic across a crash as two prepared ones
# under a logged decision.  Kept on the transaction object itself, so it ends with it.
_SESSIONS_ATTR = "_postgres_sessions_by_database"


def session_for_database(tx: Any, identity: str | None) -> "PostgresXAResource | None":
    """The resource whose session carries ``tx``'s branch in database ``identity``, if one does."""
    if identity is None:
        return None
    # The transaction's first resource, offered first: an XADataSource's on the one-phase path
    # is told by the transaction itself, with no dict of its own (see _ConnectionScope.__enter__ in .datasource).
    resource = getattr(tx, "_sole", None)
    if resource is None:
        branches = getattr(tx, "_branches", None)
        resource = branches[0].resource if branches else None
    if getattr(resource, "_shared_as", None) != identity:
        sessions = getattr(tx, _SESSIONS_ATTR, None)
        if not sessions:
            return None
        resource = sessions.get(identity)
    if resource is None or resource._branch is None:  # in_branch, without the property's call
        return None
    conn = resource._session
    return resource if conn is not None and not conn.closed else None


def offer_session(tx: Any, identity: str | None, resource: "PostgresXAResource") -> None:
    """Let other users of database ``identity`` join ``resource``'s branch of ``tx``."""
    if identity is None:
        return
    sessions = getattr(tx, _SESSIONS_ATTR, None)
    if sessions is None:
        sessions = {}
        try:
            setattr(tx, _SESSIONS_ATTR, sessions)
        except AttributeError:  # a transaction object that takes no attributes: nothing shared
            return
    sessions.setdefault(identity, resource)
