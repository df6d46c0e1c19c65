"""The application's side: :class:`XADataSource` hands out psycopg2 connections already
enlisted in the thread's current transaction (the JTA ``DataSource`` of Atomikos or
Narayana), from a small pool of resources.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from threading import get_ident
from typing import Any, Protocol

import psycopg2
import psycopg2.extensions as ext

from .. import marks as _marks
from ..lazy_begin import _PENDING, LazyBeginConnection
from ..manager import TransactionManager, _TransactionScope
from ..transaction import _ACTIVE, AfterCompletion, Transaction, _begin_one_phase, _OnePhase, _monotonic
from ..xa import (
    XAException,
    XAResource,
)
from .resource import _B_ACTIVE, PostgresXAResource, offer_session, session_for_database
from .server import (
    Connection,
    _describe,
    check_prepared_transactions,
    create_mark_table,
    database_identity,
    default_resource_name,
)

log = logging.getLogger(__name__)

_READY = ext.STATUS_READY
_IDLE = ext.TRANSACTION_STATUS_IDLE

class _Transaction(Protocol):
    """What :class:`XADataSource` needs of the transaction manager's transaction."""

    def enlist_resource(self, resource: XAResource) -> bool: ...

    def register_synchronization(self, sync: Any) -> None: ...


class _TransactionManager(Protocol):
    def get_transaction(self) -> _Transaction | None: ...

    def register_resource(self, resource: XAResource) -> None: ...


class _ReturnToPool(AfterCompletion):
    """Gives a transaction's connection back to the pool once the transaction is over.

    Not at the end of the ``with`` block: the branch stays open on the
    connection until the transaction manager commits or rolls it back.
    """

    __slots__ = ("_ds", "_key")

    def __init__(self, ds: "XADataSource", key: tuple[int, int]) -> None:
        self._ds = ds
        self._key = key  # whose transaction it is: its entry in XADataSource._enlisted

    def after_completion(self, status: Any) -> None:
        self._ds._transaction_over(self._key)


class _SessionReturn(AfterCompletion):
    """A pooled session's own synchronization, made once with it, that takes it back to its
    pool; and, while the session is a transaction's first resource, that transaction's entry
    for it: ``_owner`` is the thread it was handed to (see _ConnectionScope.__enter__), and the
    transaction holds the session (its sole resource, or its first branch once promoted), so
    nothing per transaction goes in ``XADataSource._enlisted``."""

    __slots__ = ("_ds", "_resource", "_owner")

    def __init__(self, ds: "XADataSource", resource: PostgresXAResource) -> None:
        self._ds = ds
        self._resource = resource
        #: the thread the session was last handed to as a transaction's first resource (only
        #: read with the transaction that holds it: see XADataSource._first_session)
        self._owner: int | None = None

    def after_completion(self, status: Any) -> None:
        """Back to the idle list when the session can run another branch (else closed): the
        one place a pooled session goes back, after its transaction or from
        :meth:`XADataSource._release`.

        No lock (a lock pair was a visible share of a one-phase transaction): an append is
        atomic, and one that races :meth:`XADataSource.close` is taken back here (``remove``
        and close()'s ``pop`` each take a session once).  Two releases at once may leave one
        session more than ``pool_size`` idle, until the next acquire."""
        ds = self._ds
        resource = self._resource
        conn = resource._session
        # ``_lagging``: the last branch committed in one phase and nothing ran on the session
        # since (that clears it), so it is idle without asking psycopg2 (the usual case)
        if (resource._branch is None and conn is not None and not conn.closed
                and ((type(conn) is LazyBeginConnection and conn._lagging)
                     or (conn.status == _READY and conn.get_transaction_status() == _IDLE))):
            idle = ds._idle
            if len(idle) < ds.pool_size:
                idle.append(resource)
                if not ds._closed:
                    return  # close(), not yet begun, will find it in this list
                try:
                    idle.remove(resource)
                except ValueError:
                    return  # close() took it from the list and closes it
        resource.close()


class _ConnectionScope:
    """What ``XADataSource.connection()`` returns.

    A plain class rather than a ``@contextmanager`` generator: the generator
    machinery was a visible part of a one-phase transaction's own cost.
    """

    # No __init__: the class called with no arguments makes one for less than object.__new__
    # does (its call packs an argument tuple), and a Python __init__ would cost a frame.
    __slots__ = ("_ds", "_local")
    _ds: "XADataSource"
    _local: contextlib.AbstractContextManager[Connection] | None

    def __enter__(self) -> Connection:
        ds = self._ds
        if ds._closed:
            raise RuntimeError(f"{ds!r} is closed")
        tm = ds.tm
        if type(tm) is TransactionManager:  # what get_transaction reads, without its call
            try:
                tx = tm._local.tx
            except AttributeError:  # this thread never began one
                tx = None
            if tx is not None and tx._finished:
                tx = tm.get_transaction()  # which unbinds it
        else:
            tx = tm.get_transaction()
        if tx is None:
            self._local = ds._local_connection()
            return self._local.__enter__()
        kind = type(tx)
        if not ((kind is _OnePhase and tx._sole is None)
                or (kind is Transaction and tx._sole is None and not tx._enlisted)):
            return ds._enlisted_connection(tx)
        # The usual case, the transaction's first resource: a pooled session joins it on the
        # one-phase path (Transaction._enlist_first), without the general enlistment's look for
        # it among others.  Nothing else is in the transaction yet, so there is no branch of
        # this database to share; the transaction itself holds the session (this thread's
        # next ``with`` finds it there: _first_session), and so do other users of the same
        # database (session_for_database).
        owner = get_ident()
        try:
            # what _acquire does first, inline; a session closed meanwhile is opened again by
            # start_unnamed (its _begin), which checks it anyway
            resource = ds._idle.pop()
        except IndexError:
            resource = ds._acquire()
        sync = resource._pool_return
        try:
            deadline = tx.deadline
            if (kind is _OnePhase and tx._phase is _ACTIVE and not tx._rollback_only
                    and (deadline is None or _monotonic() <= deadline)):
                # _OnePhase._enlist_first, inline (its frame and its checks were a twentieth of
                # a one-phase transaction's own client instructions); anything it would refuse
                # goes to it, which says what is wrong
                conn = resource._session
                b = resource._spare
                if (b is not None and type(conn) is LazyBeginConnection and conn._lagging
                        and not conn._tpc_only and resource._branch is None and not conn.closed):
                    # start_unnamed's usual case, inline (its call was 600 client instructions
                    # of a one-phase transaction): a session idle since its last branch's
                    # one-phase COMMIT starts the next with that branch's object (as
                    # _TransactionConnectionScope.__enter__ does too, inline: keep both in step)
                    resource._spare = None
                    b.state = _B_ACTIVE
                    conn._lagging = False
                    conn._mode = _PENDING
                    resource._namer = tx  # it names the branch by tx._name_sole
                    resource._branch = b
                else:
                    try:
                        resource.start_unnamed(tx)  # which says what is wrong, or starts
                    except XAException as e:
                        tx._start_refused(resource, e)
                tx._sole = resource
                if type(tx) is _OnePhase:
                    tx._syncs = sync  # the one, as itself (see _OnePhase._become_full)
                else:
                    tx._sole_sync_promoted(sync)
            elif not tx._enlist_first(resource, sync):
                # another thread's resource came first (a transaction shared by threads)
                ds._release(resource)
                return ds._enlisted_connection(tx)
        except BaseException:
            ds._release(resource)
            raise
        sync._owner = owner
        resource._shared_as = ds.identity if ds.share_sessions else None
        # started, so its session is open: start_unnamed took it open or _begin opened it, and
        # nothing ran on it since
        return resource._session

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool | None:  # no *args: a tuple each
        if self._local is not None:
            local, self._local = self._local, None
            return local.__exit__(exc_type, exc, tb)
        return None


@contextlib.contextmanager
def _nested(outer: contextlib.AbstractContextManager[Any],
            inner: contextlib.AbstractContextManager[Connection]) -> Iterator[Connection]:
    """``with outer: with inner as conn:`` as one block (XADataSource.transaction with a manager
    of another class)."""
    with outer, inner as conn:
        yield conn


class _TransactionConnectionScope:
    """What ``XADataSource.transaction()`` returns: ``with tm.transaction():`` and ``with
    ds.connection() as conn:`` as one block.

    It runs those two blocks' own ``__enter__`` (and the transaction's ``__exit__``) as plain
    calls, on this object's fields of the same names, except in the usual case (a session idle
    since its last one-phase COMMIT), which its ``__enter__`` runs itself as theirs would then:
    the one piece to keep in step with them.  One ``with`` rather than two, and one factory
    call: a block whose ``__enter__`` and ``__exit__`` are Python costs about 1,900 client
    instructions for the protocol alone (CPython 3.11, callgrind; the plain calls about 800).
    """

    # No __init__ (see _ConnectionScope); the fields of both scopes, which their methods read.
    __slots__ = ("_tm", "_timeout", "_tx", "_bound", "_ds", "_local")
    _tm: TransactionManager
    _timeout: float | None
    _tx: Transaction | None
    _bound: dict[str, Transaction | None]
    _ds: "XADataSource"
    _local: None  # never a local connection: the block's transaction is there

    def __enter__(self) -> Connection:
        tm = self._tm
        ds = self._ds
        idle = ds._idle
        # the thread's binding, read once for both ends of the block (see _TransactionScope)
        self._bound = bound = tm._local.__dict__
        current = bound.get("tx")
        if (idle and self._timeout is None and not tm._closed and not ds._closed
                and (current is None or current._finished)):
            # The usual block: a lean transaction begun here and a session idle since its
            # last one-phase COMMIT, started as _ConnectionScope.__enter__ starts it then, without
            # the look for the transaction it has in hand nor that one's checks: begun a moment
            # ago, it is ACTIVE, and its deadline is checked again by its commit (no clock read
            # here).  3,300 client instructions fewer, of the 24,700 the block added above plain
            # psycopg2 (count_txmanager.py --paths tmds).
            try:
                resource = idle.pop()
            except IndexError:  # another thread took the last one meanwhile
                resource = None
            if resource is not None:
                conn = resource._session
                b = resource._spare
                if (b is not None and type(conn) is LazyBeginConnection and conn._lagging
                        and not conn._tpc_only and resource._branch is None and not conn.closed):
                    # (the start below is _ConnectionScope.__enter__'s, inline: a helper's
                    # call for both was 1,100 client instructions here)
                    self._tx = tx = _begin_one_phase(tm._settings, tm.default_timeout)
                    bound["tx"] = tx
                    resource._spare = None
                    b.state = _B_ACTIVE
                    conn._lagging = False
                    conn._mode = _PENDING
                    resource._namer = tx  # it names the branch by tx._name_sole
                    resource._branch = b
                    tx._sole = resource
                    sync = resource._pool_return
                    tx._syncs = sync  # the one, as itself (see _OnePhase._become_full)
                    sync._owner = get_ident()
                    resource._shared_as = ds.identity if ds.share_sessions else None
                    return conn
                ds._release(resource)  # back where it was (or closed): the general way takes it
        _TransactionScope.__enter__(self)  # type: ignore[arg-type]  # begins and binds, or raises
        try:
            return _ConnectionScope.__enter__(self)  # type: ignore[arg-type]  # in that transaction
        except BaseException as exc:  # the block never ran: its transaction rolls back, unbound
            _TransactionScope.__exit__(self, type(exc), exc, exc.__traceback__)  # type: ignore[arg-type]
            raise

    # the transaction's end; the connection's is nothing in a transaction (it returns to its
    # pool when the transaction completes)
    __exit__ = _TransactionScope.__exit__


#: what ``XADataSource.transaction()`` makes: the class above, or its C twin when the one-phase
#: path runs in C (see :mod:`.accelerated`)
_scope_class: Any = _TransactionConnectionScope


class XADataSource:
    """Connections to one database, enlisted in the caller's current transaction.

    ``with ds.connection() as conn:`` inside ``tm.transaction()`` gives a
    psycopg2 connection whose work is a branch of that transaction; in the
    same thread and transaction every ``with`` gets the same connection, so
    all that work is one branch.  The connection returns to a pool (at most
    ``pool_size`` idle sessions, 16 by default: as many as a PostgreSQL
    service's HTTP threads run transactions at once, so that a busy service
    does not start and end a PostgreSQL backend per transaction; the pool
    opens none ahead of need) when the transaction completes.

    Outside any transaction the connection is a plain local one, with
    psycopg2's ``with conn:`` rule: committed when the block ends normally,
    rolled back when it raises.  (Raising there instead would make schema
    set-up and reads needlessly awkward; the rule is the one psycopg2 users
    already know.)

    Unless ``register_for_recovery=False``, the data source registers
    :meth:`xa_resource_for_recovery` with the manager, as Atomikos' data
    source beans do: whatever the manager's transactions leave in doubt here,
    its recovery finds.

    One database, one branch: when another user of the same database (the
    PostgreSQL WS-RM store) already runs a branch of the transaction, the
    connection handed out is that branch's session, and the other way round;
    a transaction touching only that database then commits in one phase.
    "The same database" is what :func:`database_identity` reads from the
    server; where it cannot, ``database_identity="name"`` given alike to the
    data source and the store says so.  ``share_sessions=False`` keeps a
    branch of its own (two-phase commit with the others).

    ``commit_marks=True`` lets this database carry the commit decision of a
    transaction with other branches (see :mod:`.marks`): its branch commits in
    one phase with a row that says so, after the others are prepared and
    instead of a log write.  The table is created on the first connection.
    """

    # Slots for the pool and the settings the one-phase path reads on every transaction (the C
    # one-phase path, see .accelerated, reads them at their slot); the rest in the instance dict.
    __slots__ = ("_idle", "_closed", "identity", "share_sessions", "pool_size", "tm", "__dict__", "__weakref__")

    def __init__(
        self,
        dsn: str,
        tm: _TransactionManager,
        *,
        resource_name: str | None = None,
        pool_size: int = 16,
        read_only_check: bool = False,
        register_for_recovery: bool = True,
        database_identity: str | None = None,
        share_sessions: bool = True,
        commit_marks: bool = False,
    ) -> None:
        if pool_size < 0:
            raise ValueError("pool_size must be >= 0")
        self.dsn = dsn
        self.database = default_resource_name(dsn)
        self._marks = _marks.MarkQueue() if commit_marks else None
        self._mark_table_ready = False
        self.share_sessions = share_sessions
        self._identity_given = database_identity is not None
        #: the database this source's sessions talk to (refreshed by every new session)
        self.identity: str | None = database_identity
        self.tm = tm
        self.resource_name = resource_name or default_resource_name(dsn)
        self.pool_size = pool_size
        self.read_only_check = read_only_check
        self._idle: list[PostgresXAResource] = []
        self._enlisted: dict[tuple[int, int], tuple[Any, PostgresXAResource]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._recovery_resource: PostgresXAResource | None = None
        self._check_at_start()
        if register_for_recovery:
            self._recovery_resource = self.xa_resource_for_recovery()
            tm.register_resource(self._recovery_resource)

    def __repr__(self) -> str:
        return f"<XADataSource {self.resource_name} idle={len(self._idle)} enlisted={len(self._enlisted)}>"

    def connection(self) -> contextlib.AbstractContextManager[Connection]:
        """``with ds.connection() as conn``: the connection of the thread's transaction
        branch here, or a local one outside a transaction (see the class docstring)."""
        scope = _ConnectionScope()
        scope._ds = self
        scope._local = None
        return scope

    def transaction(self, timeout: float | None = None) -> contextlib.AbstractContextManager[Connection]:
        """``with ds.transaction() as conn:``: ``with ds.tm.transaction(timeout):`` and ``with
        ds.connection() as conn:`` in one block, for the common transaction that starts in
        this database.  The same transaction (the thread's, as ``ds.tm.get_transaction()``
        shows; other resources enlist in it as in the nested blocks), committed when the block
        ends, rolled back when it raises; a thread that has one already gets
        ``NotSupportedError``, as from ``tm.transaction()``.  One block costs less than two
        (see _TransactionConnectionScope).  Not a decorator: the body needs the connection."""
        tm = self.tm
        if type(tm) is not TransactionManager:  # another manager: its own blocks, nested
            return _nested(tm.transaction(timeout), self.connection())  # type: ignore[attr-defined]
        scope = _scope_class()
        scope._tm = tm
        scope._timeout = timeout
        scope._ds = self
        scope._local = None
        return scope

    def _connect(self) -> Connection:
        conn = psycopg2.connect(self.dsn, connection_factory=LazyBeginConnection)
        if self._marks is not None and not self._mark_table_ready:
            try:
                create_mark_table(conn)
            except BaseException:
                with contextlib.suppress(psycopg2.Error):
                    conn.close()
                raise
            self._mark_table_ready = True
        if self.share_sessions and not self._identity_given:
            self.identity = database_identity(conn)
        return conn

    def _enlisted_connection(self, tx: _Transaction) -> Connection:
        """The connection of ``tx``'s branch in this database, enlisting one the first time.

        The bookkeeping is single dict operations, atomic under the GIL, so the
        hot path takes no lock of its own: one key is only ever used by one
        thread (its ident is part of it).
        """
        key = (get_ident(), id(tx))
        entry = self._enlisted.get(key)
        if entry is not None:
            resource = entry[1]
        elif (first := self._first_session(tx, key[0])) is not None:
            resource = first
        else:
            shared = session_for_database(tx, self.identity) if self.share_sessions else None
            if shared is not None:  # another user's branch in this database: work in it
                # Nothing to note: its session is not ours to pool, and the next ``with`` finds
                # it the same way.  No synchronization either: one registered would move a
                # transaction on its one-phase path (the WS-RM store's branch, taken first by a
                # delivery) to the general one, about 100 Python calls a message more.
                conn = shared._session
                assert conn is not None  # (session_for_database answers only an open one)
                return conn
            resource = self._acquire()
            if self.share_sessions and self.identity is None and not self._identity_given:
                resource.connection  # noqa: B018 -- the first session tells the identity
                shared = session_for_database(tx, self.identity)
                if shared is not None:
                    self._release(resource)
                    return shared._session  # (open: see above)
            self._enlisted[key] = (tx, resource)
            try:
                if isinstance(tx, Transaction):  # both under one acquisition of its lock
                    enlisted = tx.enlist_with_synchronization(resource, _ReturnToPool(self, key))
                else:
                    tx.register_synchronization(_ReturnToPool(self, key))
                    enlisted = tx.enlist_resource(resource)
                if not enlisted:
                    raise RuntimeError(f"the transaction refused to enlist {self.resource_name}")
            except BaseException:
                self._transaction_over(key)
                raise
            resource._shared_as = None
            if self.share_sessions:
                offer_session(tx, self.identity, resource)
        conn = resource._session
        if conn is None or conn.closed:
            conn = resource.connection
        return conn

    def _first_session(self, tx: _Transaction, owner: int) -> PostgresXAResource | None:
        """The session this data source handed to thread ``owner`` as ``tx``'s first resource
        (see _ConnectionScope.__enter__), which has no entry in ``_enlisted``: the
        transaction's sole resource, or its first branch once a second resource promoted it."""
        resource = getattr(tx, "_sole", None)
        if resource is None:
            branches = getattr(tx, "_branches", None)
            resource = branches[0].resource if branches else None
        sync = getattr(resource, "_pool_return", None)
        if (type(sync) is _SessionReturn and sync._ds is self and sync._owner == owner
                and resource._branch is not None):  # type: ignore[union-attr]
            return resource
        return None

    @contextlib.contextmanager
    def _local_connection(self) -> Iterator[Connection]:
        resource = self._acquire()
        try:
            conn = resource.connection
            try:
                yield conn
            except BaseException:
                if not conn.closed:
                    with contextlib.suppress(psycopg2.Error):
                        conn.rollback()
                raise
            conn.commit()
        finally:
            self._release(resource)

    def _check_at_start(self) -> None:
        """Fail now, with one clear exception, if the database cannot prepare.

        A database that cannot be reached now is checked when it first
        connects instead (a server may start before its database)."""
        try:
            conn = psycopg2.connect(self.dsn)
        except psycopg2.Error as e:
            log.warning("%s: cannot connect to check max_prepared_transactions now (%s); "
                        "checking at the first connection", self.resource_name, _describe(e))
            return
        try:
            check_prepared_transactions(conn, self.resource_name)
        finally:
            conn.close()

    def xa_resource_for_recovery(self) -> PostgresXAResource:
        """A resource for the recovery manager: same name, its own connections, opened on demand."""
        return PostgresXAResource(self.dsn, resource_name=self.resource_name,
                                  read_only_check=self.read_only_check, database=self.database)

    def close(self) -> None:
        """Close the idle connections; those still in a transaction close when it completes.

        Commit marks of finished transactions still waiting to be deleted are
        deleted now (left over, recovery would delete them)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        while idle:
            try:
                resource = idle.pop()  # a release racing this takes back what it appended
            except IndexError:
                break
            resource.close()
        if self._marks is not None and len(self._marks):
            cleaner = self._recovery_resource or self.xa_resource_for_recovery()
            cleaner.delete_waiting_marks(self._marks)
            if cleaner is not self._recovery_resource:
                cleaner.close()
        if self._recovery_resource is not None:
            self._recovery_resource.close()  # reopens on demand if recovery still runs

    def __enter__(self) -> "XADataSource":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- pool ------------------------------------------------------------------------------

    def _acquire(self) -> PostgresXAResource:
        idle = self._idle
        while idle:
            try:
                resource = idle.pop()  # atomic: two threads never get the same one
            except IndexError:
                break
            conn = resource._session
            if conn is not None and not conn.closed:
                return resource
            resource.close()
        resource = PostgresXAResource(self._connect, resource_name=self.resource_name,
                                      read_only_check=self.read_only_check, marks=self._marks,
                                      database=self.database)
        # made once per pooled session, not once per transaction (see _ConnectionScope.__enter__)
        resource._pool_return = _SessionReturn(self, resource)
        return resource

    def _release(self, resource: PostgresXAResource) -> None:
        """Back to the idle list when it can run another branch (else closed): what the
        session's own return does (see _SessionReturn.after_completion)."""
        resource._pool_return.after_completion(None)

    def _transaction_over(self, key: tuple[int, int]) -> None:
        entry = self._enlisted.pop(key, None)
        if entry is not None:
            self._release(entry[1])
