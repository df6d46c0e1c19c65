"""The SQLite store: the embedded default for durable use.

Concurrency
-----------
SQLite has one writer at a time and no row locks, so this store does not
pretend otherwise: a store transaction owns the whole file from its first
statement to its end.  Ownership is an exclusive ``flock`` on a sidecar file
(``<db>.lock``) -- which also works between processes and is released by the
kernel when a process dies -- behind a per-process ``threading.Lock`` so
threads of one process queue cheaply.  Inside, ``BEGIN IMMEDIATE`` and WAL.

Group commit: a commit writes its WAL frames (``synchronous=NORMAL``: no
fsync inside SQLite), gives the file to the next transaction, and returns
only once the WAL file is fsynced (:class:`_GroupSync`; ``fdatasync`` where there is one).  Transactions that
commit while one fsync runs share the next: one fsync for every commit
waiting at that instant (concurrent receives, acknowledged only after their
commit returned).  A commit that changed no row needs no fsync (a
schema-only change becomes durable with the next commit that changes a row,
or the next checkpoint, which SQLite syncs).  The lock order rule and
its :class:`~.api.LockOrderError` still apply, so code written against this
store runs unchanged on the row-locking PostgreSQL store.

The cost: a long transaction holds up every other one (an XA transaction that
runs a slow service holds the store for as long).  When many workers or
processes must write concurrently, use the PostgreSQL store.

XA: durable prepare with an undo record
---------------------------------------
SQLite has no ``PREPARE TRANSACTION``.  A branch here runs as an ordinary
store transaction that also *captures undo*: before its first write to a
row, the row's before-image (or "absent") is kept.  ``prepare`` writes those
images, keyed by the xid, into the ``xa_prepared`` table and COMMITS: the
branch's changes and the means to undo them become durable together, in one
SQLite commit.  Phase 2 then needs no work of the branch itself:

* commit = delete the undo record;
* rollback = put the before-images back, delete the undo record;

each in one short transaction, from any process (a recovery manager after a
restart, a Spark driver committing an executor's branch).

Between prepare and phase 2 the branch's changes are in the tables but not
decided, so nobody else may see or build on them: while ``xa_prepared`` has a
row, ordinary transactions wait (polling, up to ``lock_timeout``) and then
raise :class:`~.api.InDoubtBranchesError` naming the xids.  The row, not the
file lock, is what holds the store, so the rule survives ``kill -9``: after a
crash the kernel drops the file lock, the undo record stays, and the store
refuses work until recovery commits or rolls back the branch
(:meth:`SqliteXAResource.recover` lists it).  Readers of ``status()`` are
not blocked: they read the committed file without the lock.

Looking for that row costs every transaction a statement while it holds the
file, so the lock file carries a mark (its first byte, mapped into each
process's memory: reading it is no system call): ``n`` when a transaction
holding the file last looked and found none.  ``prepare`` sets it to anything
else, and syncs it, before its commit, while it holds the file; so a
transaction that finds ``n`` knows no branch was prepared since, by any process,
and does not look.  Any other value (a lock file from before the mark, a
prepare, even one that rolled back) makes the next transaction look, and one
that finds none sets ``n`` again.

Consequence: one prepared branch at a time blocks the store, so several
processes that each prepare a branch on the same SQLite store and wait for a
common decision (Spark partitions) would wait on each other; use PostgreSQL
there.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os
import sqlite3
import struct
import threading
import time
from typing import Any

from txmanager.xa import (
    TMENDRSCAN, TMSTARTRSCAN, XA_OK, XA_RBOTHER, XA_RDONLY, XAER_DUPID, XAER_NOTA, XAER_RMERR,
    XAER_RMFAIL, XAException,
)
from txmanager.xid import Xid

from . import api
from .api import InDoubtBranchesError, LockTimeoutError, StoreClosedError, StoreUnavailableError
from .branches import BranchResource
from .sql import (
    LATEST_VERSION, SQLITE, SqlTransaction, apply_undo, decode_undo, encode_undo, foresee_in_order, migrate,
)

__all__ = ["SqliteStore", "SqliteXAResource"]

#: Reading connections kept (:meth:`SqliteStore.foresee_in_order`): one per HTTP thread that
#: may read at once (``APART_HTTP_THREADS``).
_READERS = 16

log = logging.getLogger(__name__)


def _unavailable(exc: BaseException) -> bool:
    """SQLite (or the OS under it) says the disk is full or failing: not the statement's fault."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    text = str(exc).lower()
    return "disk is full" in text or "disk i/o error" in text or "readonly database" in text \
        or "unable to open database" in text


class _FileGate:
    """Exclusive ownership of one store file: a thread lock, then an flock.

    One gate per file and process (see :func:`_gate_for`): the thread lock
    makes threads of this process wait efficiently; the flock, on a file
    descriptor of this process's own, excludes other processes.
    """

    def __init__(self, lock_path: str) -> None:
        self.lock_path = lock_path
        self._thread_lock = threading.Lock()
        self._fd: int | None = None
        self.holder: str | None = None
        #: Turns taken, and seconds spent waiting for them and holding the file, in this process
        #: (what a benchmark reads: how long a writer waits for the file, and how long one holds it).
        self.turns = 0
        self.waited = 0.0
        self.held = 0.0
        self._since = 0.0
        #: The lock file's first byte, mapped (see the module's docstring: "Looking for that row").
        self._mark: mmap.mmap | None = None

    def acquire(self, deadline: float, what: str) -> None:
        asked = time.monotonic()
        remaining = max(deadline - asked, 0.0)
        if not self._thread_lock.acquire(timeout=remaining):
            raise LockTimeoutError(
                f"{what}: another transaction of this process ({self.holder}) has held the store "
                "for longer than lock_timeout; end it first (two store objects on one file in one "
                "transaction deadlock: share one SqliteStore per file)")
        try:
            if self._fd is None:
                self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            delay = 0.001
            while True:
                try:
                    _flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        raise
                if time.monotonic() >= deadline:
                    raise LockTimeoutError(
                        f"{what}: another process holds the store file {self.lock_path} for longer "
                        "than lock_timeout; retry later or raise lock_timeout")
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            if self._mark is None:
                self._map_mark()
            self.holder = threading.current_thread().name
            self._since = now = time.monotonic()
            self.turns += 1
            self.waited += now - asked
        except BaseException:
            self._thread_lock.release()
            raise

    def _map_mark(self) -> None:
        """Map the lock file's first bytes (the file held: a lock file from before the mark is
        shorter, and grows with zero bytes: the first, zero, means "look"; a holder's token of
        zeros is no store's)."""
        assert self._fd is not None
        if os.fstat(self._fd).st_size < _MARK_SIZE:
            os.ftruncate(self._fd, _MARK_SIZE)
        self._mark = mmap.mmap(self._fd, _MARK_SIZE)

    def hold_as(self, token: bytes) -> bool:
        """The file held by a store whose token is ``token`` (see :meth:`SqliteStore.written_elsewhere`):
        marked so in the lock file; whether another store (of any process) held it last."""
        assert self._mark is not None
        if self._mark[_HOLDER] == token:
            return False
        self._mark[_HOLDER] = token
        return True

    def last_holder(self) -> bytes | None:
        """The token of the store that held the file last, read without holding it (None before
        this process first held it)."""
        mark = self._mark
        return None if mark is None else mark[_HOLDER]

    def prepared_may_exist(self) -> bool:
        """May the file hold a prepared branch (no transaction looked since the last prepare)?
        Only while holding the file."""
        assert self._mark is not None
        return self._mark[0] != _NONE_PREPARED

    def none_prepared(self) -> None:
        """A transaction holding the file looked and found no prepared branch."""
        assert self._mark is not None
        self._mark[0] = _NONE_PREPARED

    def preparing(self) -> None:
        """A branch is about to be prepared (its commit not done yet): every transaction looks
        until one finds none.  On disk before the prepare's commit, so a machine that loses
        power after it comes back with the mark set."""
        assert self._mark is not None
        self._mark[0] = 0
        self._mark.flush()

    @property
    def in_use(self) -> bool:
        """A thread of this process holds the file now."""
        return self._thread_lock.locked()

    def release(self) -> None:
        self.holder = None
        self.held += time.monotonic() - self._since
        try:
            if self._fd is not None:
                _flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()


def _flock_keeping_the_interpreter() -> Any:
    """``flock(fd, operation)`` for the gate's two calls, which never block (``LOCK_NB``,
    ``LOCK_UN``), called without letting the interpreter go (ctypes' ``PyDLL``).

    ``fcntl.flock`` releases the GIL around the call, as for any call that might block.  In a
    process whose threads compute (16 callers building envelopes) a thread that releases it is
    likely to wait for it again, up to the switch interval, and the file waits with it: the
    gate's flock is taken and released at every store transaction, while the holder holds the
    file (or is about to).  Kept, the call costs its system call alone.  ``fcntl.flock`` where
    libc has no ``flock`` to call so."""
    try:
        call = ctypes.PyDLL(None, use_errno=True).flock
    except (OSError, AttributeError):
        return fcntl.flock
    call.argtypes = (ctypes.c_int, ctypes.c_int)
    call.restype = ctypes.c_int

    def flock(fd: int, operation: int) -> None:
        while call(fd, operation) != 0:
            code = ctypes.get_errno()
            if code != errno.EINTR:  # a signal: again, as fcntl.flock does (PEP 475)
                raise OSError(code, os.strerror(code))
    return flock


_flock = _flock_keeping_the_interpreter()

#: The lock file's mark when a transaction holding the file looked and found no prepared branch.
_NONE_PREPARED = ord("n")
#: The lock file's bytes mapped: the mark above, then the token of the store that last held the file.
_HOLDER = slice(8, 16)
_MARK_SIZE = 16

_gates: dict[tuple[int, str], _FileGate] = {}
class _GroupSync:
    """fsyncs of one WAL file shared by every commit that waits at that instant.

    Commits are numbered in commit order (under the file gate); a committer
    waits until a sync that started after its commit has finished.  One
    waiter at a time runs the fsync, for everyone committed before it began.
    """

    def __init__(self, wal_path: str) -> None:
        self.wal_path = wal_path
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  #: its lock guards the counts below
        #: The waiters a running fsync covers (committed before it began), and the later ones:
        #: an fsync's end wakes the first all and one of the second, to run the next fsync that
        #: covers them all (each woken before found its commit too late and slept again: a
        #: thread switch, and a wait for the interpreter, each).
        self._covered = threading.Condition(lock)
        self._later = threading.Condition(lock)
        self._committed = 0
        self._needed = 0
        self._synced = 0
        self._syncing = False
        self._target = 0  #: the last commit the running fsync covers
        self.syncs = 0      #: fsyncs run
        self.commits = 0    #: commits that needed one

    @property
    def needed(self) -> int:
        """The number of the last commit noted that must reach the disk before anything it
        wrote is relied on outside (every one but ``durable=False``'s; caller holds the file)."""
        return self._needed

    def note_commit(self, durable: bool = True) -> int:
        """Number the commit just done (call while still holding the file)."""
        with self._cond:
            self._committed += 1
            self.commits += 1
            if durable:
                self._needed = self._committed
            return self._committed

    def wait_durable(self, seq: int) -> None:
        with self._cond:
            while self._synced < seq:
                if self._syncing:
                    (self._covered if seq <= self._target else self._later).wait()
                    continue
                self._syncing = True
                target = self._target = self._committed
                self._cond.release()
                done = False
                try:
                    self._fsync()
                    done = True
                finally:
                    self._cond.acquire()
                    self._syncing = False
                    if done:
                        self._synced = max(self._synced, target)
                        self._covered.notify_all()
                        # every later one committed before it waited: the next fsync, run by one
                        # of them, covers them all
                        self._covered, self._later = self._later, self._covered
                        self._covered.notify()
                    else:  # each tries again (and fails alone, or one runs it)
                        self._covered.notify_all()
                        self._later.notify_all()

    def _fsync(self) -> None:
        try:
            fd = os.open(self.wal_path, os.O_RDONLY)
        except FileNotFoundError:
            return  # no WAL: everything was checkpointed into the database file, which SQLite synced
        try:
            _sync_data(fd)
            self.syncs += 1
        finally:
            os.close(fd)


def _sync_data(fd: int) -> None:
    """The WAL's data on disk: ``fdatasync`` where there is one (Linux), as SQLite syncs its own
    files.  A WAL is written over from its start after each checkpoint, in place, so the size
    stays and ``fsync`` only added the inode's new modification time: a journal commit of the
    file system per sync, which roughly doubled its time here (ext4, median 0.83-1.65 ms against
    0.39-0.40 ms, loaded machine).  The size, when a write grew the file, is synced either way."""
    getattr(os, "fdatasync", os.fsync)(fd)


_gates_lock = threading.Lock()

#: Seconds a migration waits for another process that only peeks at the file to close it
#: (:meth:`SqliteStore._refuse_open_elsewhere`).
_PEEK_GRACE = 0.5
#: The byte of a WAL database's ``-shm`` file that every connection of the unix VFS keeps
#: read-locked (POSIX ``fcntl`` lock) while it has the database open: its "dead man switch",
#: ``UNIX_SHM_DMS`` in SQLite's os_unix.c (120 + 8 lock bytes).
_SHM_DMS = 128


def _open_in_other_process(path: str) -> int | None:
    """The id of a process other than this one that has the WAL database ``path`` open (its
    read lock on the ``-shm`` file's dead-man-switch byte), or None.  ``F_GETLK`` names a lock
    that would conflict: POSIX locks are the process's, so this process's own never do."""
    try:
        fd = os.open(path + "-shm", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # no connection has the database open in WAL mode
    try:
        probe = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, _SHM_DMS, 1, 0)
        kind, _, _, _, pid = struct.unpack("@hhqqi4x", fcntl.fcntl(fd, fcntl.F_GETLK, probe))
    finally:
        os.close(fd)
    return None if kind == fcntl.F_UNLCK else pid


def _gate_for(path: str) -> _FileGate:
    # keyed by pid too: a forked child must not share its parent's flock
    key = (os.getpid(), path)
    with _gates_lock:
        gate = _gates.get(key)
        if gate is None:
            gate = _gates[key] = _FileGate(path + ".lock")
        return gate


class SqliteStore(api.StorageManager):
    """A durable store in one SQLite file (``open_store("sqlite:///path/to/file.db")``)."""

    concurrent_sequences = False  # one transaction at a time owns the file
    defers_transactions = True  # begin_deferred: the file is taken at the first statement

    def in_use(self) -> bool:
        return self._gate.in_use

    def __init__(self, path: str | os.PathLike[str], *, lock_timeout: float = 30.0,
                 pool_size: int = 4, create: bool = True, secure_delete: bool = False) -> None:
        """``secure_delete``: overwrite with zeros the pages a deleted message leaves free
        (``?secure_delete=1``; SQLite's ``secure_delete=ON``, the default of Debian's build).
        By default (``FAST``) only what shares a page with live rows is zeroed: zeroing a
        delivered 1 MiB payload's free pages wrote 1 MiB more to the WAL per message (1.3 ms of
        CPU here), and the pages are overwritten when reused anyway."""
        self.path = os.path.abspath(os.fspath(path))
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise api.StoreError(f"cannot open store {self.path}: directory {parent} does not exist")
        if not create and not os.path.isfile(self.path):
            raise api.StoreNotFoundError(f"there is no SQLite store at {self.path}: check the path")
        self.url = "sqlite:///" + self.path
        self.lock_timeout = lock_timeout
        self.pool_size = pool_size
        self.secure_delete = secure_delete
        self._gate = _gate_for(os.path.realpath(self.path))
        self._sync = _GroupSync(os.path.realpath(self.path) + "-wal")
        self._idle: list[sqlite3.Connection] = []
        #: Connections that only read, outside any transaction (:meth:`foresee_in_order`).
        self._readers: list[sqlite3.Connection] = []
        #: This store's token in the lock file while it holds the file, and how often it found
        #: another's there (:meth:`written_elsewhere`).
        self._token = os.urandom(8)
        self._held_elsewhere = 0
        self._pool_lock = threading.Lock()
        self._closed = False
        self._create = create
        self.schema_version_found = self._migrate()
        self._resource = SqliteXAResource(self)

    # -- connections ------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=self.lock_timeout)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # the WAL's fsync is ours: see _GroupSync
        conn.execute(f"PRAGMA secure_delete={'ON' if self.secure_delete else 'FAST'}")
        # A statement's journal (the pages it changes, as they were, to undo it alone when it
        # fails inside a transaction) in memory, not in a file of its own once past 64 KiB: the
        # client's acknowledgements and purges touch more pages than that, and each page then
        # cost two more writes to a file deleted at the transaction's end (16 sequences: 4.4 of
        # the client's 15.8 writes a message).  Nothing reads it after a crash: durability is
        # the WAL's alone.
        conn.execute("PRAGMA temp_store=MEMORY")
        return conn

    def _take(self) -> sqlite3.Connection:
        with self._pool_lock:
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _give(self, conn: sqlite3.Connection) -> None:
        with self._pool_lock:
            if not self._closed and len(self._idle) < self.pool_size and not conn.in_transaction:
                self._idle.append(conn)
                return
        conn.close()

    def _migrate(self) -> int:
        """Migrate under the file lock, but only when needed: opening an up-to-date
        store must not wait for (or be refused by) another process's transaction."""
        try:
            found = int(self._peek("SELECT MAX(version) FROM schema_version")[0][0] or 0)
        except sqlite3.OperationalError:  # no schema_version table yet: a new file
            found = 0
        if found == LATEST_VERSION:
            return found
        self._gate.acquire(time.monotonic() + self.lock_timeout, f"opening {self.path}")
        self._gate.hold_as(self._token)
        self._held_elsewhere += 1
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._refuse_open_elsewhere(conn)
                found = migrate(conn, SQLITE, self.path, create=self._create)
                conn.execute("COMMIT")
                seq = self._sync.note_commit()
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        finally:
            conn.close()
            self._gate.release()
        self._sync.wait_durable(seq)
        return found

    def _refuse_open_elsewhere(self, conn: sqlite3.Connection) -> None:
        """Before a store of an earlier schema version is migrated (holding the file): refuse
        while another process has the file open.  That process opened it before, so it runs a
        version of this code that knows the schema as it was, and would go on using it after
        the migration: since version 11 a version that does not mark the lock file with its
        holds, so that this version's guesses and prepared-branch mark would not see them
        (:meth:`written_elsewhere`).  Once migrated, an earlier version refuses to open the
        store (its schema is newer than that code's).  Only a process that has the file open
        now is seen (a process of an earlier version that opens it later is refused by the
        version); one that only peeks at it (another opener reading the version, ``status``)
        is waited for a moment."""
        try:
            found = int(conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0)
        except sqlite3.OperationalError:  # a new file: nobody uses it yet
            return
        if not 0 < found < LATEST_VERSION:
            return
        deadline = time.monotonic() + _PEEK_GRACE
        while (pid := _open_in_other_process(self.path)) is not None:
            if time.monotonic() >= deadline:
                raise api.SchemaVersionError(
                    f"store {self.path} has schema version {found} and process {pid} has it open: a "
                    f"version of wsrm-plugin before this one's {LATEST_VERSION}, which would go on with the old "
                    "schema (and, before 11, hold the file unmarked, unseen by this version). Stop every "
                    "process that uses the store, then open it with this version first")
            time.sleep(0.01)

    # -- transactions --------------------------------------------------------------------

    def begin(self, *, xa: Any = None, durable: bool = True) -> SqlTransaction:
        if xa is not None:
            bound = self._resource.bind_current(xa)
            if bound is not None:
                return bound
            log.debug("begin(xa=...): no current transaction, using a local store transaction")
        tx = self._open(capture_undo=False)
        tx.waits_for_disk = durable
        return tx

    def begin_deferred(self) -> SqlTransaction:
        """A transaction that takes the file at its first statement, not before.

        For a delivery whose application runs first and touches the store only
        at its end, if at all (marking the message delivered, a reply or a
        message it enqueues): the file, which every other transaction of every
        sequence waits for, is not held while the application runs.  What it
        reads and writes is one ordinary transaction from its first statement
        to its commit; nothing before that first statement is part of it."""
        if self._closed:
            raise StoreClosedError(f"{self.url} is closed")
        return SqlTransaction(self, None, SQLITE)

    def _attach(self, tx: SqlTransaction, *, allow_in_doubt: bool = False) -> None:
        """``tx`` takes the file and begins: at once (:meth:`_open`), or at a deferred
        transaction's first statement (``SqlTransaction.execute``)."""
        conn = self._acquire(allow_in_doubt=allow_in_doubt)
        tx.conn = conn
        tx._changes_at_begin = conn.total_changes  # type: ignore[attr-defined]
        # every commit numbered so far is visible to this transaction (it holds the file)
        tx._sees_upto = self._sync.needed  # type: ignore[attr-defined]

    def _open(self, *, capture_undo: bool, allow_in_doubt: bool = False) -> SqlTransaction:
        """A transaction owning the file; waits while prepared branches hold the store."""
        if self._closed:
            raise StoreClosedError(f"{self.url} is closed")
        tx = SqlTransaction(self, None, SQLITE, capture_undo=capture_undo)
        self._attach(tx, allow_in_doubt=allow_in_doubt)
        return tx

    def _acquire(self, *, allow_in_doubt: bool) -> sqlite3.Connection:
        """The file taken and a connection in BEGIN IMMEDIATE on it; waits while prepared
        branches hold the store."""
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.002
        while True:
            self._gate.acquire(deadline, f"store {self.path}")
            if self._gate.hold_as(self._token):
                self._held_elsewhere += 1
            conn: sqlite3.Connection | None = None
            try:
                conn = self._take()
                conn.execute("BEGIN IMMEDIATE")
                if allow_in_doubt or not self._gate.prepared_may_exist():
                    return conn
                in_doubt = [r[0] for r in conn.execute(
                    "SELECT xid FROM xa_prepared ORDER BY prepared_at LIMIT 10")]
                if not in_doubt:
                    self._gate.none_prepared()
                    return conn
                conn.execute("ROLLBACK")
            except BaseException as exc:
                if conn is not None:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    self._give(conn)
                self._gate.release()
                if _unavailable(exc):
                    raise StoreUnavailableError(f"store {self.path} cannot take writes now: {exc}") from exc
                raise
            self._give(conn)
            self._gate.release()
            if time.monotonic() >= deadline:
                raise InDoubtBranchesError(
                    f"store {self.path} holds prepared XA branches {in_doubt} that no one has "
                    "committed or rolled back: run recovery (the transaction manager's "
                    "RecoveryManager, or store.xa_resource().commit/rollback(xid)) first",
                    [Xid.from_text(x) for x in in_doubt])
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _finish(self, tx: SqlTransaction, commit: bool) -> None:
        """Commit (durably: returns once the WAL is fsynced) or roll back, and give the file back.

        A transaction begun with ``durable=False`` returns from its commit without waiting for
        the fsync: its commit is in the WAL (a killed process loses nothing the kernel has), and
        the WAL reaches the disk in commit order, so the next durable commit's fsync covers it
        and a power loss forgets at most the last such commits, never one before a durable one.
        One that waits for the disk later (:meth:`~.api.StoreTransaction.wait_for_disk_later`)
        is numbered as durable, so its readers wait for it, but returns at once."""
        conn = tx.conn
        tx.mark_closed()
        if conn is None:  # deferred, and no statement came: it never had the file, nor read anything
            return
        seq = 0
        try:
            if commit:
                changed = tx._wrote or conn.total_changes != getattr(tx, "_changes_at_begin", -1)
                try:
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    if _unavailable(exc):
                        raise StoreUnavailableError(f"store {self.path} cannot take writes now: {exc}") from exc
                    raise
                if changed:
                    seq = self._sync.note_commit(tx.waits_for_disk)
            elif conn.in_transaction:
                conn.execute("ROLLBACK")
        finally:
            self._give(conn)
            self._gate.release()
        tx._commit_seq = seq
        # outside the file: the next transaction runs (and commits) while this one syncs
        if tx.returns_before_disk:
            return  # its caller waits later (wait_for_disk, or a durable commit after it): for all it read too
        if seq and tx.waits_for_disk:
            self._sync.wait_durable(seq)
        else:
            # What this transaction read may leave the process once it returns (a message sent, an
            # acknowledgement, a reply handed out): never a commit a power loss could still take
            # back (its committer is waiting for that fsync, or shares it), but the bookkeeping
            # committed with durable=False, which may be forgotten.  Free when nothing waits.
            self._sync.wait_durable(getattr(tx, "_sees_upto", 0))

    def _wait_for_disk(self, tx: SqlTransaction) -> None:
        """``tx.wait_for_disk()``: its commit, numbered by :meth:`_finish`, and every commit it
        could read are on disk."""
        self._sync.wait_durable(max(getattr(tx, "_commit_seq", 0), getattr(tx, "_sees_upto", 0)))

    @staticmethod
    def _translate(exc: BaseException) -> Exception | None:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            return LockTimeoutError(f"SQLite reports the store busy: {exc}")
        if _unavailable(exc):
            return StoreUnavailableError(f"the SQLite store cannot take writes now: {exc}")
        return None

    # -- reading without the lock (status, recover) ---------------------------------------

    def _peek(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        conn = self._connect()
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def foresee_in_order(self, sequence_id: str, number: int) -> api.RmdSequence | None:
        """One statement on a connection of its own, outside any transaction: WAL lets it read
        the last committed state while another transaction holds the file (nothing waited for)."""
        if self._closed:
            raise StoreClosedError(f"{self.url} is closed")
        with self._pool_lock:
            conn = self._readers.pop() if self._readers else None
        if conn is None:
            conn = self._connect()
        try:
            return foresee_in_order(conn, sequence_id, number)
        finally:
            with self._pool_lock:
                if self._closed or len(self._readers) >= _READERS:
                    conn.close()
                else:
                    self._readers.append(conn)

    def written_elsewhere(self) -> int:
        """How often another store (another process's, or another object on the file here) may have
        held the file since this one first did: the times this store took it from another's hold,
        and one more while another's hold is the last.  Each hold marks the lock file with its
        store's token (a mapped write, no system call), read here without holding the file.
        A store of a version before the token holds the file unmarked, unseen."""
        return self._held_elsewhere + (self._gate.last_holder() != self._token)

    def status(self) -> api.StoreStatus:
        """Counters read from the committed file, without waiting for any transaction."""
        conn = self._connect()
        reader = _Reader()
        try:
            conn.execute("BEGIN")
            prepared = conn.execute("SELECT COUNT(*) FROM xa_prepared").fetchone()[0]
            status = api._status_of(SqlTransaction(reader, conn, SQLITE), prepared=int(prepared))
            conn.execute("ROLLBACK")
        finally:
            conn.close()
        return status

    def schema_version(self) -> int:
        return int(self._peek("SELECT MAX(version) FROM schema_version")[0][0])

    # -- XA --------------------------------------------------------------------------------------

    def xa_resource(self) -> "SqliteXAResource":
        return self._resource

    def close(self) -> None:
        with self._pool_lock:
            self._closed = True
            idle, self._idle = self._idle + self._readers, []
            self._readers = []
        for conn in idle:
            conn.close()


class _Reader:
    """Owner of a read-only status transaction: nothing to release."""

    _translate = staticmethod(SqliteStore._translate)

    def _finish(self, tx: SqlTransaction, commit: bool) -> None:
        tx.mark_closed()


class SqliteXAResource(BranchResource):
    """The SQLite store as a durable XA resource manager (see the module docstring)."""

    _store: SqliteStore

    def _open_branch_tx(self, xid: Xid) -> SqlTransaction:
        try:
            tx = self._store._open(capture_undo=True)
        except LockTimeoutError as exc:
            raise XAException(XAER_RMERR, f"{self.resource_name}: cannot start {xid}: {exc}") from exc
        if tx.one("SELECT 1 FROM xa_prepared WHERE xid = ?", (xid.to_text(),)):
            self._store._finish(tx, commit=False)
            raise XAException(XAER_DUPID, f"{xid} is already prepared in {self.resource_name}")
        return tx

    def _store_finish(self, tx: Any, commit: bool) -> None:
        self._store._finish(tx, commit)

    def prepare(self, xid: Xid) -> int:
        branch = self._get(xid)
        self._refuse_failed(branch)
        tx: SqlTransaction = branch.tx
        self._pop(xid)
        if not tx.undo:
            self._store._finish(tx, commit=False)
            return XA_RDONLY
        try:
            tx.flush()
            self._store._gate.preparing()  # the others look for it from now on (see the module)
            tx.write("INSERT INTO xa_prepared (xid, undo, prepared_at) VALUES (?, ?, ?)",
                     (xid.to_text(), encode_undo(tx.undo), time.time()))
            self._store._finish(tx, commit=True)  # changes + undo durable in one SQLite commit
        except Exception as exc:
            if not tx.closed:
                self._store._finish(tx, commit=False)
            raise XAException(XA_RBOTHER, f"{self.resource_name}: prepare of {xid} failed: {exc}") from exc
        return XA_OK

    def commit(self, xid: Xid, one_phase: bool = False) -> None:
        with self._lock:
            branch = self._branches.get(xid)
        if branch is not None:
            if not one_phase:
                raise self._protocol_error(xid, "is not prepared: prepare it or commit one-phase")
            self._refuse_failed(branch)
            self._pop(xid)
            try:
                branch.tx.flush()
            except Exception as exc:
                self._store._finish(branch.tx, commit=False)
                raise XAException(XA_RBOTHER, f"{self.resource_name}: commit of {xid} failed: {exc}") from exc
            try:
                self._store._finish(branch.tx, commit=True)
            except sqlite3.Error as exc:
                raise XAException(XA_RBOTHER, f"{self.resource_name}: commit of {xid} failed: {exc}") from exc
            return
        if one_phase:
            if self._is_prepared(xid):
                raise self._protocol_error(xid, "is prepared: commit it in two phases")
            raise XAException(XAER_NOTA, f"{self.resource_name} has no branch {xid}")
        self._resolve(xid, commit=True)

    def rollback(self, xid: Xid) -> None:
        with self._lock:
            branch = self._branches.get(xid)
        if branch is not None:
            self._abort(branch)
            return
        self._resolve(xid, commit=False)

    def _resolve(self, xid: Xid, *, commit: bool) -> None:
        """Phase 2 of a prepared branch: drop its undo record, or apply it first."""
        try:
            tx = self._store._open(capture_undo=False, allow_in_doubt=True)
        except LockTimeoutError as exc:
            raise XAException(XAER_RMFAIL, f"{self.resource_name}: store busy: {exc}") from exc
        try:
            row = tx.one("SELECT undo FROM xa_prepared WHERE xid = ?", (xid.to_text(),))
            if row is None:
                raise XAException(XAER_NOTA, f"{self.resource_name} has no prepared branch {xid}")
            if not commit:
                apply_undo(tx, decode_undo(row[0]))
            tx.write("DELETE FROM xa_prepared WHERE xid = ?", (xid.to_text(),))
        except BaseException:
            self._store._finish(tx, commit=False)
            raise
        try:
            self._store._finish(tx, commit=True)
        except sqlite3.Error as exc:
            raise XAException(XAER_RMFAIL, f"{self.resource_name}: phase 2 of {xid} failed: {exc}") from exc
        log.debug("%s: %s %s", self.resource_name, "committed" if commit else "rolled back", xid)

    def _is_prepared(self, xid: Xid) -> bool:
        return bool(self._store._peek("SELECT 1 FROM xa_prepared WHERE xid = ?", (xid.to_text(),)))

    def recover(self, flags: int = TMSTARTRSCAN | TMENDRSCAN) -> list[Xid]:
        """Every branch prepared in this file and not finished, by any process."""
        out = []
        for (text,) in self._store._peek("SELECT xid FROM xa_prepared ORDER BY prepared_at"):
            xid = Xid.from_pg_gid(text)
            if xid is None:
                log.warning("%s: unreadable xid %r in xa_prepared", self.resource_name, text)
                continue
            out.append(xid)
        return out

    def prepared_age(self, xid: Xid) -> float | None:
        """Seconds since the branch was prepared (the recovery manager's safety interval)."""
        rows = self._store._peek("SELECT prepared_at FROM xa_prepared WHERE xid = ?", (xid.to_text(),))
        return max(time.time() - rows[0][0], 0.0) if rows else None
