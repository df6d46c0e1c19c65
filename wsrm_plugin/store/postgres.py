"""The PostgreSQL store: row locks, SKIP LOCKED pollers, real prepared transactions.

Every store transaction runs on a session of its own.  Locks are PostgreSQL's
row locks (``SELECT ... FOR UPDATE``), taken in the store's lock order, so
workers in many threads and processes share one database; pollers
(``due_messages``, ``claim_next``, ``purge_acked``) skip rows another
transaction holds.  ``lock_timeout`` is set on each session, so a wait ends
in :class:`~.api.LockTimeoutError` instead of hanging (a deadlock, which the
lock order rules out among store transactions, surfaces the same way).  A
source sequence's row has three kinds of holder: a caller's enqueue (its UPDATE
of the number, FOR NO KEY UPDATE, until the caller's transaction ends), the
sender's claim and the acknowledgements of a sequence open to enqueues (FOR
KEY SHARE: none of these waits for another), and whatever changes its state
(FOR UPDATE: waits for all of them, and they for it).

Local transactions are plain BEGIN/COMMIT.  Under XA the session is a
:class:`txmanager.postgres.PostgresXAResource` branch: ``PREPARE TRANSACTION``
keeps the store's changes and row locks durable in the server, ``COMMIT
PREPARED`` finishes them, from this process or any other (an executor may die
right after it prepared).  Unlike the SQLite store, prepared branches only
block the rows they touched.

One database, one branch: when the application's
:class:`txmanager.postgres.XADataSource` works in the same database (the
store's tables beside the application's), a global transaction's store work
runs on the application's session, in its branch, or the application's on
the store's, whichever came first.  A transaction with no other resource then
commits in one phase: no PREPARE, no log record, and the same atomicity, since
it is one PostgreSQL transaction.  The shared session has the application's
settings: the store's ``lock_timeout`` does not apply to it.

Two databases, one prepare: with a branch elsewhere (the application's own
database), the store's branch is by default the one that carries the commit
decision (``commit_marks``, :mod:`txmanager.marks`): the other branch is
prepared, then the store's commits in one phase with a row naming it, then the
other is committed; no PREPARE of the store's branch and no log write.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions as ext

from txmanager.marks import TABLE as MARK_TABLE, MarkQueue
from txmanager.postgres import (
    LazyBeginConnection, PostgresXAResource, create_mark_table, database_identity, default_resource_name,
    offer_session, session_for_database,
)
from txmanager.transaction import SoleSynchronization, Status

from . import api
from .api import LockTimeoutError, StoreClosedError, StoreUnavailableError
from .late_commits import LateCommits
from .sql import POSTGRES, SqlTransaction, migrate
from .sql.statements import RECEIPT_DECLINED
from .prepared import UNDEFINED_PREPARED, PreparedStatements

__all__ = ["PostgresStore"]

log = logging.getLogger(__name__)

#: pg_advisory_xact_lock key serializing schema migrations ("WSRM" as int32).
_MIGRATION_LOCK = 0x5753524D

#: seconds of the windows over which a store's pool remembers the most sessions out at once
#: (:meth:`PostgresStore._keeps_idle`)
_PEAK_WINDOW = 60.0

_LOCK_ERRORS = {
    "55P03": "a lock was not granted within lock_timeout",
    "40P01": "PostgreSQL detected a deadlock",
    "40001": "a serialization failure",
}


#: SQLSTATE classes and codes that say the server cannot work now, whatever the statement:
#: 08 connection exception, 53 insufficient resources (53100 disk full), 57P01-57P03 shutdown
#: or cannot connect now, 58 system error (I/O).
_UNAVAILABLE_CLASSES = {"08", "53", "58"}
_UNAVAILABLE_CODES = {"57P01", "57P02", "57P03"}

#: The least a transaction can do that makes its durable commit flush the WAL: PostgreSQL
#: flushes at a commit only when the transaction wrote WAL (a transaction id alone is not
#: enough).  A transactional logical-decoding message writes a record and touches no table
#: (no lock, no privilege beyond the default; a logical decoding consumer sees "wsrm-flush").
_WRITES_WAL = "SELECT pg_logical_emit_message(TRUE, 'wsrm-flush', '')"


class PostgresStore(api.StorageManager):
    """A store in a PostgreSQL database (``open_store("postgresql://...")``)."""

    def __init__(self, dsn: str, *, lock_timeout: float = 30.0, pool_size: int = 16,
                 database_identity: str | None = None, share_sessions: bool = True,
                 create: bool = True, prepare_statements: bool = True,
                 commit_marks: bool = True) -> None:
        self.dsn = dsn
        #: the database as the recovery log names a keeper of commit marks
        self.database = default_resource_name(dsn)
        #: marks of finished transactions, deleted with the next one (None: keeps no marks)
        self._marks = MarkQueue() if commit_marks else None
        #: the recurring statements prepared on each session (None: all sent as text)
        self.statements = PreparedStatements() if prepare_statements else None
        self.share_sessions = share_sessions
        self._identity_given = database_identity is not None
        #: the database the store's sessions talk to (refreshed by every new session), see
        #: :func:`txmanager.postgres.database_identity`
        self.identity: str | None = database_identity
        self.lock_timeout = lock_timeout
        self.pool_size = pool_size
        self.resource_name = "wsrm-store:" + default_resource_name(dsn)
        self.url = "postgresql:" + default_resource_name(dsn).removeprefix("pg:")
        params = ext.parse_dsn(dsn)
        options = params.get("options", "")
        self._connect_options = f"{options} -c lock_timeout={max(int(lock_timeout * 1000), 1)}".strip()
        self._idle: list[PostgresXAResource] = []
        #: sessions handed out now, and the most handed out at once in this window and the last
        #: (:data:`_PEAK_WINDOW`): a session given back is kept idle while the pool holds fewer
        #: than that peak (see :meth:`_release`)
        self._out = 0
        self._peak = self._peak_before = 0
        self._peak_until = 0.0
        self._enlisted: dict[Any, SqlTransaction] = {}  # by global transaction (the object itself)
        self._lock = threading.Lock()
        self._closed = False
        self._recovery: PostgresXAResource | None = None
        #: commits that returned before their WAL flush, and the flushes their readers owe
        self._late = LateCommits()
        self._create = create
        self.schema_version_found = self._migrate()

    def _connect(self) -> Any:
        conn = psycopg2.connect(self.dsn, options=self._connect_options,
                                connection_factory=LazyBeginConnection)
        if self.share_sessions and not self._identity_given:
            self.identity = database_identity(conn)
        return conn

    def _migrate(self) -> int:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            found = migrate(conn, POSTGRES, self.url, create=self._create)
            conn.commit()
            if self._marks is not None:
                if not self._create:  # an operator's look at the store creates nothing; it commits no XA work
                    self._marks = None
                else:
                    try:
                        create_mark_table(conn)
                    except psycopg2.errors.InsufficientPrivilege as exc:
                        conn.rollback()
                        log.warning("%s: cannot create the commit-mark table %s (%s): the store's "
                                    "branches are prepared like any other; have its owner create it "
                                    "(txmanager.marks.CREATE_TABLE), or open with commit_marks=0",
                                    self.url, MARK_TABLE, " ".join(str(exc).split()))
                        self._marks = None
            return found
        finally:
            conn.close()

    def analyze(self) -> None:
        conn = self._connect()
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("ANALYZE rms_sequence, rms_message")
        finally:
            conn.close()

    def schema_version(self) -> int:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT MAX(version) FROM schema_version")
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    @property
    def late_commits(self) -> LateCommits:
        """This store's commits that return before their WAL flush, and the flushes owed for
        whoever may have read them (:mod:`.late_commits`).  A transaction that sends such a
        commit itself, not through the store's COMMIT (``SqlTransaction._receive_ahead``:
        a reply's record committed in its receipt's round trip), numbers it here."""
        return self._late

    # -- sessions (one PostgresXAResource each, pooled) -----------------------------------------

    def _acquire(self) -> PostgresXAResource:
        if self._closed:
            raise StoreClosedError(f"{self.url} is closed")
        with self._lock:
            self._out += 1
            if self._out > self._peak:
                self._peak = self._out
            while self._idle:
                resource = self._idle.pop()
                if resource._session is not None and not resource._session.closed:
                    return resource
                resource.close()
        # the commit mark's statements prepared on each session as the store's own are (not
        # behind a pooler in transaction mode: prepare_statements=0)
        return PostgresXAResource(self._connect, resource_name=self.resource_name, marks=self._marks,
                                  database=self.database, prepare_marks=self.statements is not None)

    def _release(self, resource: PostgresXAResource) -> None:
        conn = resource._session
        reusable = (
            not resource.in_branch and conn is not None and not conn.closed
            and conn.status == ext.STATUS_READY
            and conn.get_transaction_status() == ext.TRANSACTION_STATUS_IDLE  # no info object made
        )
        if reusable and conn is not None and conn.autocommit:
            conn.autocommit = False  # as a branch's session expects it (no round trip: a flag of psycopg2's)
        with self._lock:
            self._out -= 1
            if reusable and not self._closed and self._keeps_idle():
                self._idle.append(resource)
                return
        resource.close()

    def _keeps_idle(self) -> bool:
        """Is a session given back kept idle (under the lock)?  While fewer than ``pool_size`` are
        idle, as always; beyond that, while the sessions out and idle are fewer than the most
        out at once lately (this window of :data:`_PEAK_WINDOW` seconds or the last).  A pool
        that kept only ``pool_size`` idle closed, under a load needing a few more at once (16
        XA callers' branches and the sender's transactions), a session given back while
        another thread opened a new one: the client's store opened and closed 23 sessions in
        3,200 messages at 16 sequences, each a backend started and its statements prepared
        again.  The pool now holds at most what the load held at once; once such a load is gone
        for two windows, a session beyond ``pool_size`` idle is closed when given back."""
        idle = len(self._idle)
        if idle < self.pool_size:
            return True
        if not self.pool_size:  # no pool asked for: every session closed when given back
            return False
        now = time.monotonic()
        if now >= self._peak_until:  # a new window: the last one's peak is remembered
            self._peak_before, self._peak = self._peak, self._out
            self._peak_until = now + _PEAK_WINDOW
        return idle + self._out < max(self._peak, self._peak_before)

    # -- transactions ----------------------------------------------------------------------------

    def begin(self, *, xa: Any = None, durable: bool = True) -> SqlTransaction:
        if xa is not None:
            get = getattr(xa, "get_transaction", None)
            if get is None:
                raise TypeError(f"xa= expects a txmanager.TransactionManager, not {type(xa).__name__}")
            gtx = get()
            if gtx is not None:
                return self._branch_tx(gtx)
            log.debug("begin(xa=...): no current transaction, using a local store transaction")
        resource = self._acquire()
        try:
            conn = resource.connection
            # BEGIN goes out with the transaction's first statement that writes or locks, and
            # reads before it run on their own (see SqlTransaction.lazy_begin)
            conn.autocommit = True
            tx = SqlTransaction(self, conn, POSTGRES)
            tx.lazy_begin = True
            if not durable:  # sent with the BEGIN: no round trip of its own
                tx.begin_with = "SET LOCAL synchronous_commit TO OFF; "
        except BaseException as exc:
            self._release(resource)
            translated = self._translate(exc) if isinstance(exc, psycopg2.Error) else None
            if translated is not None:
                raise translated from exc
            raise
        tx._resource = resource  # type: ignore[attr-defined]
        return tx

    def _branch_tx(self, gtx: Any) -> SqlTransaction:
        """The store's branch of ``gtx``: one session per global transaction, like a JTA DataSource."""
        # keyed by the transaction itself, not its xid: a one-phase transaction never asked for
        # its xid never makes one (nor enters, then leaves, its manager's running set)
        key = gtx
        tx = self._enlisted.get(key)  # one dict read, atomic: no lock (close() swaps the dict whole)
        if tx is not None and not tx.closed:
            return tx
        shared = session_for_database(gtx, self.identity) if self.share_sessions else None
        if shared is not None:  # the application's branch in this database: work in it
            tx = SqlTransaction(self, shared._session, POSTGRES)
            tx._resource = None  # type: ignore[attr-defined]  # not ours to pool
            tx._global = gtx
            with self._lock:
                self._enlisted[key] = tx
            try:
                gtx.register_synchronization(_BranchOver(self, key))
            except BaseException:
                self._branch_over(key)
                raise
            return tx
        resource = self._acquire()
        try:
            conn = resource.connection
        except BaseException:
            self._release(resource)  # (not reusable: closed, and no longer counted out)
            raise
        tx = SqlTransaction(self, conn, POSTGRES)
        tx._resource = resource  # type: ignore[attr-defined]
        tx._global = gtx
        with self._lock:
            self._enlisted[key] = tx
        over = _BranchOver(self, key)
        try:
            # The transaction's first resource takes the one-phase path's enlistment (a
            # delivery's usual case): the synchronization is a SoleSynchronization, whose work
            # before completion the one-phase commit runs.  Registered apart, it would move the
            # transaction to the general path (about 100 Python calls a message more).
            first = getattr(gtx, "_enlist_first", None)
            if first is not None and first(resource, over):
                # the transaction's first resource: session_for_database finds it as such
                resource._shared_as = self.identity if self.share_sessions else None
                return tx
            gtx.register_synchronization(over)  # something is enlisted already
            if not gtx.enlist_resource(resource):
                raise api.StoreError(f"the transaction {gtx.xid} refused to enlist {self.resource_name}")
        except BaseException:
            self._branch_over(key)
            raise
        resource._shared_as = None
        if self.share_sessions:
            offer_session(gtx, self.identity, resource)
        return tx

    def _branch_over(self, key: Any) -> None:
        with self._lock:
            tx = self._enlisted.pop(key, None)
        if tx is not None:
            tx.mark_closed()
            if tx._resource is not None:  # type: ignore[attr-defined]
                self._release(tx._resource)  # type: ignore[attr-defined]

    def _finish(self, tx: SqlTransaction, commit: bool) -> None:
        """COMMIT or ROLLBACK, and the session back to the pool.

        A commit that waits for the disk later (``wait_for_disk_later``) goes out with
        ``synchronous_commit`` off and returns before its WAL flush; any transaction that ends
        while such a commit may be unflushed ends only once the WAL is flushed past what it
        could have read (:mod:`.late_commits`): by its own durable commit, or a flush."""
        conn = tx.conn
        tx.mark_closed()
        late = self._late
        owed = late.owed()  # before the COMMIT: what this transaction's statements could read
        number = covered = 0
        try:
            if tx.lazy_begin:  # psycopg2 does not know of the BEGIN it sent: end it by SQL
                if tx.begun and not conn.closed:
                    text = "COMMIT" if commit else "ROLLBACK"
                    if commit and tx.returns_before_disk and tx.waits_for_disk:
                        number = late.start()
                        text = "SET LOCAL synchronous_commit TO OFF; COMMIT"
                    elif owed and commit and tx.waits_for_disk and tx.took_number:
                        covered = late.covered_now()  # its commit has a transaction id: it flushes
                    try:
                        with conn.cursor() as cur:
                            try:
                                cur.execute(text)
                                answer = cur.statusmessage
                            except psycopg2.errors.InFailedSqlTransaction:
                                if not number:
                                    raise
                                cur.execute("ROLLBACK")  # the SET refused: as the COMMIT would have
                                answer = cur.statusmessage
                    finally:
                        if number:
                            late.returned(number)
                    if commit and answer != "COMMIT":
                        # PostgreSQL ends an aborted transaction's COMMIT with a ROLLBACK, and no
                        # error: a statement failed that nobody saw fail (the store notes every
                        # failure it sees).  Saying "committed" here would let an acknowledgement
                        # go out for a message that is not in the store.
                        raise api.StoreError(
                            f"{self.url}: COMMIT rolled the transaction back (PostgreSQL answered "
                            f"{answer!r}): one of its statements failed unnoticed; nothing of it was "
                            "written: retry it")
            elif commit:
                conn.commit()
            elif not conn.closed:
                conn.rollback()
            if number:
                tx._commit_seq = number  # for wait_for_disk
            elif covered:
                late.flushed(covered)
            elif owed and tx.lazy_begin and not conn.closed and not getattr(tx, "_commit_seq", 0):
                # (every local transaction here is lazy; one with a number committed alone before
                # its flush, as the one numbered above: see SqlTransaction._receive_ahead)
                self._flush_wal(conn)
        except psycopg2.Error as exc:
            translated = self._translate(exc)
            if not conn.closed:
                try:
                    if tx.lazy_begin:
                        if conn.info.transaction_status != ext.TRANSACTION_STATUS_IDLE:
                            with conn.cursor() as cur:
                                cur.execute("ROLLBACK")
                    else:
                        conn.rollback()
                except psycopg2.Error:
                    pass
            if translated is not None:
                raise translated from exc
            raise
        finally:
            self._release(tx._resource)  # type: ignore[attr-defined]

    def _flush_wal(self, conn: Any) -> None:
        """Return once the WAL is flushed past every commit that returned before now: a
        transaction of its own that writes WAL, committed durably, flushes it (in autocommit
        mode, one round trip)."""
        covered = self._late.covered_now()
        with conn.cursor() as cur:
            cur.execute(f"BEGIN; SET LOCAL synchronous_commit TO ON; {_WRITES_WAL}; COMMIT")
        self._late.flushed(covered)

    def _wait_for_disk(self, tx: SqlTransaction) -> None:
        """``tx.wait_for_disk()`` after a commit that returned before its flush."""
        number = getattr(tx, "_commit_seq", 0)
        if number and not self._late.is_flushed(number):
            self._flush_now()

    def _flush_now(self) -> None:
        """:meth:`_flush_wal` on a session of the pool."""
        resource = self._acquire()
        try:
            conn = resource.connection
            conn.autocommit = True
            try:
                self._flush_wal(conn)
            except psycopg2.Error as exc:
                translated = self._translate(exc)
                if translated is not None:
                    raise translated from exc
                raise
        finally:
            self._release(resource)

    def declined_at_commit(self, exc: BaseException) -> bool:
        seen: set[int] = set()
        while exc is not None and id(exc) not in seen:  # the transaction manager wraps the branch's error
            seen.add(id(exc))
            if getattr(exc, "pgcode", None) == "22P02" and RECEIPT_DECLINED in (getattr(exc, "pgerror", None) or ""):
                return True
            exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        return False

    def _translate(self, exc: BaseException) -> Exception | None:
        code = getattr(exc, "pgcode", None) or ""
        if code[:2] in _UNAVAILABLE_CLASSES or code in _UNAVAILABLE_CODES or \
                (isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)) and not code):
            # no code: the connection itself failed (server down, restarted, network)
            return StoreUnavailableError(f"{self.url} cannot take writes now ({' '.join(str(exc).split())}); "
                                         "the transaction is rolled back, retry it later")
        if code == UNDEFINED_PREPARED:
            return StoreUnavailableError(
                f"{self.url}: the session lost its prepared statements ({' '.join(str(exc).split())}; "
                "a pooler's DISCARD ALL?); the transaction is rolled back, retry it (they are prepared "
                "again); behind a pooler in transaction mode open the store with prepare_statements=0")
        why = _LOCK_ERRORS.get(code)
        if why is None:
            return None
        return LockTimeoutError(
            f"{self.url}: {why} ({' '.join(str(exc).split())}); the transaction is rolled back, "
            "retry it")

    # -- XA and the rest ----------------------------------------------------------------------------

    def xa_resource(self) -> PostgresXAResource:
        """A resource for the recovery manager: it finds this database's prepared branches."""
        with self._lock:
            if self._recovery is None:
                self._recovery = PostgresXAResource(self.dsn, resource_name=self.resource_name,
                                                    database=self.database)
            return self._recovery

    def close(self) -> None:
        """Close every session; a branch left prepared stays in the server for recovery."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            enlisted, self._enlisted = list(self._enlisted.values()), {}
            recovery, self._recovery = self._recovery, None
        for tx in enlisted:
            tx.mark_closed()
            if tx._resource is not None:  # type: ignore[attr-defined]
                idle.append(tx._resource)  # type: ignore[attr-defined]
        for resource in idle:
            resource.close()
        if self._marks is not None and len(self._marks):
            recovery = recovery or PostgresXAResource(self.dsn, resource_name=self.resource_name,
                                                      database=self.database)
            recovery.delete_waiting_marks(self._marks)
        if recovery is not None:
            recovery.close()


class _BranchOver(SoleSynchronization):
    """Synchronization giving the branch's session back once the global transaction is over.

    Also the branch's part of the rule for commits that returned before their flush
    (:mod:`.late_commits`): a branch that may have read one ends once the WAL is flushed past
    it; its commit does that (prepared, or committed in one phase, with a transaction id)."""

    __slots__ = ("_store", "_key", "_covered")

    def __init__(self, store: PostgresStore, key: Any) -> None:
        self._store = store
        self._key = key
        self._covered = 0

    def before_completion(self) -> None:
        """The branch's last statements, before it is prepared (or committed in one phase)."""
        tx = self._store._enlisted.get(self._key)  # one dict read, atomic: no lock
        if tx is not None and not tx.closed:
            if tx.ran_ahead:  # as SqlTransaction.commit: never committed unaccounted
                raise api.StoreError(f"store calls run ahead were never taken ({list(tx.ran_ahead)})")
            enqueued = tx.took_number or tx._numbered  # an enqueue wrote (or writes now, riding on the COMMIT)
            tx.flush()
            late = self._store._late
            if late.owed():
                self._covered = late.covered_now()
                if not enqueued:  # its commit must flush
                    tx.one(_WRITES_WAL)

    def after_completion(self, status: Any) -> None:
        store = self._store
        store._branch_over(self._key)
        if status == Status.COMMITTED:
            if self._covered:
                store._late.flushed(self._covered)
        elif store._late.owed():
            store._flush_now()
