"""The transaction manager: thread-bound transactions, like JTA's ``TransactionManager``.

Each thread has at most one current transaction.  ``begin`` binds one,
``commit``/``rollback`` complete and unbind it, ``suspend``/``resume`` move it
(to another thread, if need be).  Resources that work "in the current
transaction" (the PostgreSQL data source, the message stores) look it up with
:meth:`TransactionManager.get_transaction` and enlist themselves.

::

    tm = TransactionManager(node="shop-1", log="/var/lib/shop/tx.log")
    with tm.transaction():
        ...   # enlist resources, do work; commits here, rolls back on exception
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

from .errors import HeuristicError, IllegalStateError, NotSupportedError
from .log import MemoryLog, RecoveryLog, TransactionLog
from .recovery import RecoveryManager
from .transaction import (
    _ACTIVE, Checkpoint, PreparedBranch, Status, Transaction, _begin_one_phase, _OnePhase, _Settings,
)
from .xa import XAER_NOTA, XAException, XAResource
from .xid import Xid, default_node_name

__all__ = ["TransactionManager"]

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")

_monotonic = time.monotonic


class TransactionManager:
    """Begins, binds and completes transactions; owns the recovery log.

    ``node`` names this manager in every gtrid it creates, so recovery only
    ever touches its own branches: it must be unique among the managers that
    share a resource (and stable across restarts).  ``log`` is a
    :class:`RecoveryLog` or a path to one (created if missing; a missing
    directory, or a log that names another node, raises
    :class:`~txmanager.errors.RecoveryLogError` here, not at the first commit); ``None`` means decisions are kept
    in memory only and a crash between the decision and phase 2 leaves
    branches that recovery will roll back -- accept that explicitly.
    ``checkpoint`` is the crash-test hook documented in :mod:`.transaction`.

    Timeouts are enforced where they matter, without a reaper thread: an
    expired transaction reports MARKED_ROLLBACK, refuses new enlistments,
    and its commit rolls back (:class:`TransactionTimeoutError`); prepare
    stops as soon as the deadline has passed.  A reaper could do no more,
    since it must never call a resource the owning thread is using.

    ``safety_interval`` is the recovery manager's grace period before it
    presumes an unlogged prepared branch of this node aborted; ``retries``
    and ``retry_delay`` shape how long phase 2 insists on an unreachable
    resource before leaving the branch to recovery.
    """

    # Slots for the thread's binding, the settings and the timeout a begin reads on every
    # transaction (the C one-phase path, see txmanager.postgres.accelerated, reads them at their
    # slot); the rest in the instance dict.
    __slots__ = ("_local", "_closed", "_settings", "default_timeout", "__dict__", "__weakref__")

    def __init__(self, node: str | None = None,
                 log: RecoveryLog | TransactionLog | str | os.PathLike[str] | None = None,
                 default_timeout: float = 60.0, checkpoint: Checkpoint | None = None, *,
                 safety_interval: float = 60.0, retries: int = 3,
                 retry_delay: float = 0.05) -> None:
        self.node = node or default_node_name()
        Xid.new_global(self.node)  # validates the node name now, not at the first begin
        self.default_timeout = default_timeout
        self._owns_log = False
        if log is None:
            _log_warning(f"TransactionManager {self.node!r} has no recovery log: commit decisions "
                         "live in memory and are lost in a crash (pass log=<path> for crash safety)")
            self.log: TransactionLog = MemoryLog()
        elif isinstance(log, (str, os.PathLike)):
            self.log = RecoveryLog(log)
            self._owns_log = True
        else:
            self.log = log
        claim = getattr(self.log, "claim_node", None)
        if callable(claim):
            try:
                claim(self.node)
            except BaseException:
                if self._owns_log:
                    self.log.close()
                raise
        self._local = threading.local()
        self._mutex = threading.Lock()
        self._in_flight: dict[bytes, Transaction] = {}
        #: what each of its transactions is given: the log, the hook, the retries, the node
        self._settings = _Settings(self.log, checkpoint, retries, retry_delay, self._ended, self.node,
                                   self._in_flight)
        self._resources: list[XAResource] = []
        self._recovery = RecoveryManager(self.log, self._resources, self.node, safety_interval,
                                         in_flight=self._in_flight_gtrids)
        self._closed = False
        _MANAGERS.add(self)

    def __repr__(self) -> str:
        return f"<TransactionManager node={self.node!r} log={self.log!r}>"

    @property
    def _checkpoint(self) -> Checkpoint | None:
        """The crash-test hook the transactions begun from now on call (see :mod:`.transaction`)."""
        return self._settings.checkpoint

    @_checkpoint.setter
    def _checkpoint(self, hook: Checkpoint | None) -> None:
        self._settings.checkpoint = hook

    # -- the current thread's transaction -------------------------------------------

    def begin(self, timeout: float | None = None, *, xid: Xid | None = None,
              branch_prefix: bytes | str = b"") -> Transaction:
        """Start a transaction and bind it to the calling thread.

        ``timeout`` (seconds; default ``default_timeout``, 0 for none) sets
        the deadline after which it can only roll back.  ``xid`` picks the
        global xid (for a job that names its own gtrid); by default a fresh
        random one of this node.  ``branch_prefix`` goes in front of every
        branch qualifier: processes that share one gtrid (the tasks of a Spark
        job) each pass their own, so their branches never collide.
        """
        return self._begin_in(self._local.__dict__, timeout, xid, branch_prefix)

    def _begin_in(self, bound: dict[str, Transaction | None], timeout: float | None, xid: Xid | None,
                  branch_prefix: bytes | str) -> Transaction:
        """:meth:`begin`, given the calling thread's dict of ``_local`` (``bound``): one read of
        the thread-local object rather than one per access (each cost what three dict operations
        do), which a ``with tm.transaction()`` block keeps for its end."""
        if self._closed:
            raise IllegalStateError("the transaction manager is closed")
        current = bound.get("tx")
        if current is not None and not current._finished:
            raise NotSupportedError(f"thread already has transaction {current.xid}; nested "
                                    "transactions are not supported (suspend() it first)")
        settings = self._settings
        if branch_prefix:
            settings = settings.with_prefix(branch_prefix.encode() if isinstance(branch_prefix, str)
                                            else branch_prefix)
        if timeout is None:
            timeout = self.default_timeout
        if xid is None:
            # The gtrid is made when first asked for (Transaction.xid), and the transaction
            # joins the running set then: one committed in one phase by a resource that needs
            # no xid never formats one.  A fresh gtrid (random bits of this process, a
            # counter) is no other transaction's: no need to ask the log or the running ones.
            tx = _begin_one_phase(settings, timeout)  # promoted when it needs more (see _OnePhase)
            bound["tx"] = tx
            return tx
        gxid = xid
        if gxid.bqual:
            raise ValueError(f"{gxid} has a branch qualifier; begin() needs a global xid")
        if self.log.is_pending(gxid):
            raise IllegalStateError(f"the recovery log still has {gxid} pending; a new "
                                    "transaction cannot reuse its gtrid")
        tx = Transaction._new(gxid, settings, timeout)
        with self._mutex:
            if gxid.gtrid in self._in_flight:
                raise IllegalStateError(f"transaction {gxid} is already running")
            self._in_flight[gxid.gtrid] = tx
        bound["tx"] = tx
        return tx

    def get_transaction(self) -> Transaction | None:
        """The calling thread's transaction, or None (a finished one is unbound)."""
        try:
            tx = self._local.tx  # an attribute read costs less than getattr()'s call
        except AttributeError:  # this thread never began one
            return None
        if tx is not None and tx._finished:
            self._local.tx = tx = None
        return tx

    def get_status(self) -> Status:
        tx = self.get_transaction()
        return tx.status if tx is not None else Status.NO_TRANSACTION

    def commit(self) -> None:
        """Commit the calling thread's transaction and unbind it (see Transaction.commit)."""
        tx = self._require("commit")
        try:
            tx.commit()
        finally:
            self._local.tx = None

    def rollback(self) -> None:
        """Roll back the calling thread's transaction and unbind it."""
        tx = self._require("roll back")
        try:
            tx.rollback()
        finally:
            self._local.tx = None

    def set_rollback_only(self) -> None:
        self._require("mark rollback-only").set_rollback_only()

    def suspend(self) -> Transaction | None:
        """Unbind the current transaction (its resources end with TMSUSPEND) and return it."""
        tx = self.get_transaction()
        if tx is None:
            return None
        self._local.tx = None
        tx._suspend_all()
        return tx

    def resume(self, tx: Transaction) -> None:
        """Bind a suspended transaction to the calling thread (resources get TMRESUME)."""
        current = self.get_transaction()
        if current is not None:
            raise IllegalStateError(f"thread already has transaction {current.xid}; "
                                    "suspend() it before resuming another")
        if tx.finished or tx.status not in (Status.ACTIVE, Status.MARKED_ROLLBACK):
            raise IllegalStateError(f"cannot resume transaction {tx.xid}: it is {tx.status.name}")
        with self._mutex:
            if self._in_flight.get(tx.xid.gtrid) is not tx:
                raise IllegalStateError(f"transaction {tx.xid} does not belong to this manager")
        tx._resume_all()
        self._local.tx = tx

    def transaction(self, timeout: float | None = None) -> "_TransactionScope":
        """``with tm.transaction() as tx:`` -- commit on normal exit, roll back on an
        exception (which is re-raised).  A body that completes the transaction
        itself is left alone.  Also usable as a decorator."""
        scope = _TransactionScope()
        scope._tm = self
        scope._timeout = timeout
        return scope

    def _require(self, what: str) -> Transaction:
        tx = self.get_transaction()
        if tx is None:
            raise IllegalStateError(f"cannot {what}: no transaction on this thread "
                                    "(call begin() first)")
        return tx

    def _ended(self, tx: Transaction) -> None:
        # No mutex: while the gtrid is in the dict no other transaction can take it (begin
        # refuses a running gtrid), so nothing can replace ``tx`` between the look and the pop.
        xid = tx._xid
        if xid is None:
            return  # never named: never in the running set
        gtrid = xid.gtrid
        if self._in_flight.get(gtrid) is tx:
            self._in_flight.pop(gtrid, None)

    def _in_flight_gtrids(self) -> set[bytes]:
        with self._mutex:
            return set(self._in_flight)

    # -- transactions decided here, prepared elsewhere ------------------------------

    def begin_detached(self, xid: Xid | None = None) -> Xid:
        """A global transaction whose branches other processes do and prepare.

        The returned global xid goes to the workers (each ``begin(xid=...,
        branch_prefix=...)`` then :meth:`Transaction.prepare_and_detach`); their
        :class:`PreparedBranch` lists come back, and this manager decides with
        :meth:`commit_prepared` or :meth:`rollback_prepared`.  Until then the
        gtrid counts as running here, so this manager's recovery leaves its
        prepared branches alone however long the workers take.
        """
        if self._closed:
            raise IllegalStateError("the transaction manager is closed")
        gxid = xid if xid is not None else Xid.new_global(self.node)
        if gxid.bqual:
            raise ValueError(f"{gxid} has a branch qualifier; begin_detached() needs a global xid")
        if self.log.is_pending(gxid):
            raise IllegalStateError(f"the recovery log still has {gxid} pending; a new "
                                    "transaction cannot reuse its gtrid")
        with self._mutex:
            if gxid.gtrid in self._in_flight:
                raise IllegalStateError(f"transaction {gxid} is already running")
            self._in_flight[gxid.gtrid] = _Detached(gxid)  # type: ignore[assignment]
        return gxid

    def commit_prepared(self, gxid: Xid, branches: Sequence[PreparedBranch]) -> list[PreparedBranch]:
        """Log the commit decision for exactly ``branches`` (fsynced), then commit them.

        Every branch must be prepared already.  A branch whose resource cannot
        be reached now stays in the log for recovery, which commits it later:
        those are returned (an empty list means everything committed).  Each
        branch's resource must be registered (:meth:`register_resource`) under
        its ``resource_name``.  Other prepared branches of the same gtrid (a
        failed attempt's) are not in the decision: recovery rolls them back.
        """
        gxid = gxid.global_xid()
        for b in branches:
            if b.xid.global_xid() != gxid:
                raise ValueError(f"branch {b.xid} is not a branch of {gxid}")
        if not branches:
            self._release_detached(gxid)
            return []
        resources = {b.resource_name: self._resource_named(b.resource_name) for b in branches}
        self.log.log_commit_decision(gxid, [(b.xid, b.resource_name) for b in branches])
        self._release_detached(gxid)
        left = [b for b in branches
                if not _finish_prepared(resources[b.resource_name], b.xid, True, self._settings.retries,
                                        self._settings.retry_delay)]
        if left:
            log.warning("transaction %s committed, but %d branch(es) could not be reached; the "
                        "recovery manager will commit them", gxid, len(left))
        else:
            self.log.log_done(gxid)
        return left

    def rollback_prepared(self, gxid: Xid, branches: Sequence[PreparedBranch]) -> list[PreparedBranch]:
        """Roll back ``branches`` (nothing is logged: presumed abort).  Returns those that
        could not be reached now; recovery rolls them back later."""
        gxid = gxid.global_xid()
        self._release_detached(gxid)
        return [b for b in branches
                if not _finish_prepared(self._resource_named(b.resource_name), b.xid, False,
                                        self._settings.retries, self._settings.retry_delay)]

    def _release_detached(self, gxid: Xid) -> None:
        with self._mutex:
            if isinstance(self._in_flight.get(gxid.gtrid), _Detached):
                del self._in_flight[gxid.gtrid]

    def _resource_named(self, name: str) -> XAResource:
        with self._mutex:
            for resource in self._resources:
                if getattr(resource, "resource_name", None) == name:
                    return resource
        raise IllegalStateError(f"no resource named {name!r} is registered with transaction "
                                f"manager {self.node!r}: register_resource() it before deciding "
                                "its branches")

    # -- recovery -----------------------------------------------------------------

    def register_resource(self, resource: XAResource) -> None:
        """Tell recovery about a resource (it must work after a restart, with a fresh
        connection).  Register every resource the manager's transactions use.

        A resource registered after recovery has already run (a data source
        created after the reliable client started, whose start-up pass could not
        see it) gets a pass at once: a branch a killed process left prepared in
        it holds its locks, so the first insert of a key that branch wrote
        would otherwise wait until the next background pass, or forever when
        none runs.
        """
        with self._mutex:
            if any(r is resource for r in self._resources):
                return
            self._resources.append(resource)
        if self._recovery.passes and not self._closed:
            try:
                report = self._recovery.recover_once()
            except Exception:  # noqa: BLE001 -- registering must not fail; the next pass retries
                log.exception("recovery pass for newly registered resource %r failed", resource)
            else:
                log.info("recovery pass for newly registered resource %r: %s", resource, report.summary())

    @property
    def recovery(self) -> RecoveryManager:
        return self._recovery

    @property
    def resources(self) -> tuple[XAResource, ...]:
        """The resources registered so far (:meth:`register_resource`), in that order."""
        with self._mutex:
            return tuple(self._resources)

    def close(self) -> None:
        """Stop background recovery and close the log (if this manager opened it).

        Transactions still running are not touched: their prepared branches,
        if any, are found by the next recovery.
        """
        if self._closed:
            return
        self._closed = True
        # A closed manager can finish nothing: a transaction it left bound to some thread is
        # no longer "current" for the components that ask (see current_transactions).
        _MANAGERS.discard(self)
        self._recovery.stop()
        with self._mutex:
            running = len(self._in_flight)
        if running:
            log.warning("closing transaction manager %r with %d transaction(s) still running",
                        self.node, running)
        if self._owns_log:
            self.log.close()

    def __enter__(self) -> "TransactionManager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Detached:
    """Placeholder in the running set for a transaction prepared elsewhere (begin_detached)."""

    __slots__ = ("xid",)
    _finished = False

    def __init__(self, xid: Xid) -> None:
        self.xid = xid


#: Every live manager, so code that was not given one can still tell that the calling thread is
#: inside a transaction it would silently stay out of (see :func:`current_transactions`).
_MANAGERS: weakref.WeakSet[TransactionManager] = weakref.WeakSet()


def current_transactions() -> list[tuple[TransactionManager, Transaction]]:
    """The calling thread's current transactions, across every live manager of the process.

    A component that can join a transaction only through the manager it was
    given (a reliable client built without ``tm=``) asks this before working
    outside one: a transaction it cannot join is a mistake to report, not to ignore.
    """
    found = []
    for manager in list(_MANAGERS):
        tx = manager.get_transaction()
        if tx is not None:
            found.append((manager, tx))
    return found


def _finish_prepared(resource: XAResource, xid: Xid, commit: bool, retries: int,
                     delay: float) -> bool:
    """Phase 2 of one prepared branch; False when it must be left to recovery.

    XAER_NOTA counts as done: after a lost answer the first attempt may have
    finished it, and for a rollback the branch may never have been prepared.
    """
    verb = "commit" if commit else "rollback"
    for attempt in range(retries + 1):
        try:
            if commit:
                resource.commit(xid, one_phase=False)
            else:
                resource.rollback(xid)
            return True
        except XAException as e:
            if e.code == XAER_NOTA or (not commit and e.is_rollback):
                if commit and attempt == 0:
                    log.warning("commit of %s: %s no longer holds it (%s)", xid,
                                getattr(resource, "resource_name", resource), e)
                return True
            if e.is_heuristic:
                raise HeuristicError(f"{verb} of {xid} ended heuristically ({e}); see the "
                                     "recovery log", xid=xid, outcomes=[(xid, e.code)]) from e
            error: Exception = e
        except Exception as e:  # noqa: BLE001 -- a lost connection: try again
            error = e
        if attempt < retries:
            time.sleep(min(delay * 2 ** attempt, 2.0))
    log.warning("%s of %s still failing (%s); leaving it to recovery", verb, xid, error)
    return False


class _TransactionScope:
    """What :meth:`TransactionManager.transaction` returns.

    A plain class rather than a ``@contextmanager`` generator: that machinery
    (a generator, two ``next`` calls, a helper object) was a visible share of
    a one-phase transaction's own cost.  Not a :class:`contextlib.ContextDecorator` either,
    though a decorator too (:meth:`__call__`, as that class does it): a subclass of a class
    without slots carries an instance dict, set up and freed with each block.
    """

    # No __init__ (see TransactionManager.transaction): the class called with no arguments makes
    # one for less than object.__new__ does, and a Python __init__ would cost a frame.
    __slots__ = ("_tm", "_timeout", "_tx", "_bound")
    _tm: TransactionManager
    _timeout: float | None
    _tx: Transaction | None
    _bound: dict[str, Transaction | None]  # the thread's dict of tm._local, set by __enter__

    def __call__(self, func: Callable[_P, _R]) -> Callable[_P, _R]:
        """``@tm.transaction()``: each call of ``func`` runs in a transaction of its own."""
        tm, timeout = self._tm, self._timeout

        @functools.wraps(func)
        def inner(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with tm.transaction(timeout):  # a fresh scope per call
                return func(*args, **kwargs)

        return inner

    def __enter__(self) -> Transaction:
        tm = self._tm
        # the thread's binding, read once for both ends of the block (which run in one thread)
        self._bound = bound = tm._local.__dict__
        current = bound.get("tx")
        if self._timeout is None and not tm._closed and (current is None or current._finished):
            # the usual begin, what _begin_in does then without its call (nor its checks of
            # what this block never asks for: an xid, a prefix, a timeout of its own)
            # (_begin_one_phase, inline: the block's begin is a share of a one-phase transaction)
            tx = _OnePhase()
            tx._xid = None
            tx._cfg = tm._settings
            timeout = tm.default_timeout
            if timeout and timeout > 0:
                tx.timeout = timeout
                tx.deadline = _monotonic() + timeout
            else:
                tx.timeout = tx.deadline = None
            tx._phase = _ACTIVE
            tx._rollback_only = False
            tx._finished = False
            tx._sole = None
            tx._sole_xid = None
            bound["tx"] = tx
        else:  # _begin_in says what is wrong, or begins with the block's timeout
            tx = tm._begin_in(bound, self._timeout, None, b"")
        self._tx = tx
        return tx

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        tx = self._tx
        assert tx is not None
        bound = self._bound
        self._tx = None
        if bound["tx"] is not tx or tx._finished:  # __enter__ set it: it is there
            return  # the body committed, rolled back or suspended it itself
        if exc is None:
            try:
                tx.commit()
            finally:
                bound["tx"] = None
            return
        try:
            self._tm.rollback()
        except Exception as rb_exc:  # noqa: BLE001 -- don't hide the body's error
            log.error("rollback of %s after %r failed: %s", tx.xid, exc, rb_exc)
            exc.add_note(f"and the rollback of {tx.xid} failed: {rb_exc!r}")


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _log_warning(message: str) -> None:
    """Log ``message`` at WARNING once per process (a test suite creates many managers)."""
    with _warned_lock:
        if message in _warned:
            return
        _warned.add(message)
    log.warning(message)

