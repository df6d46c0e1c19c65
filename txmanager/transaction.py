"""One global transaction: its branches, synchronizations and the commit protocol.

Two-phase commit with *presumed abort*, as in Narayana/Atomikos:

1. ``before_completion`` of every :class:`Synchronization` (an exception there
   marks the transaction rollback-only);
2. ``end(TMSUCCESS)`` on every enlisted resource;
3. one branch -> ``commit(xid, one_phase=True)``, nothing logged;
4. several -> ``prepare`` each; a "no" vote, an error, or the deadline passing
   rolls every branch back (:class:`RollbackError`).  Read-only votes drop out
   of phase 2; if all were read-only nothing is logged at all;
5. the commit decision (global xid, every prepared branch and its resource
   name) is written to the recovery log and fsynced BEFORE any phase-2 call;
6. ``commit`` each prepared branch.  Transient failures (``XAER_RMFAIL``, a
   lost connection) are retried a few times, then the branch is left to the
   recovery manager: the decision is logged, so it will be finished, and the
   caller is NOT told the transaction rolled back -- it did not;
7. a "done" record once every branch answered; ``after_completion(status)``.

Commit marks (:mod:`txmanager.marks`): when a branch's resource keeps them
(``holds_commit_marks``), the last such branch is not prepared; after the
others voted yes it commits in one phase with a row that names them, which
is the decision (steps 5 and 7 write nothing to the log).  ``before_log`` and
``logged`` are then the instants just before and after that commit.

Heuristic outcomes (a resource deciding on its own) raise the distinct
:mod:`~txmanager.errors` exceptions and stay in the log until forgotten.

Crash-test hook: the manager's ``checkpoint(point, index)`` callable is called
at exactly these points of a commit (an exception it raises propagates at once
with no clean-up at all, as if the process had died there):

==========================  ==================================================
``before_commit_one_phase``  one branch, about to commit it in one phase (0)
``before_prepare``           several branches, none prepared yet (0)
``prepared``                 after each successful prepare (index = branch no.)
``before_log``               every branch voted yes, decision not written (0)
``logged``                   decision written and fsynced (0)
``committed``                after each successful phase-2 commit (branch no.)
``before_done``              every branch answered, "done" not written (0)
==========================  ==================================================

Branch numbers are the order of enlistment, 0..n-1 (joined resources share
their branch's number).
"""

from __future__ import annotations

import _thread
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .errors import (
    HeuristicCommitError, HeuristicError, HeuristicHazardError, HeuristicMixedError,
    HeuristicRollbackError, IllegalStateError, RollbackError, TransactionError,
    TransactionTimeoutError,
)
from .xa import (
    TMFAIL, TMJOIN, TMNOFLAGS, TMRESUME, TMSUCCESS, TMSUSPEND, XA_HEURCOM, XA_HEURHAZ,
    XA_HEURMIX, XA_HEURRB, XA_OK, XA_RDONLY, XA_RETRY, XAER_NOTA, XAER_RMFAIL,
    SYNC_RAN, XAException, XAResource, error_name,
)
from .phase_two import PhaseTwo
from .xid import Xid

if TYPE_CHECKING:
    from .log import TransactionLog

__all__ = ["AfterCompletion", "Status", "Synchronization", "Transaction", "CHECKPOINTS", "Checkpoint", "PreparedBranch"]

log = logging.getLogger(__name__)

Checkpoint = Callable[[str, int], None]
CHECKPOINTS = ("before_commit_one_phase", "before_prepare", "prepared", "before_log", "logged",
               "committed", "before_done")

#: Codes after which the same commit may succeed later: retry, then leave to recovery.
#: (XAER_RMERR is not one: on commit it means the RM gave the branch up.)
_TRANSIENT = frozenset((XAER_RMFAIL, XA_RETRY))


_new_object = object.__new__
_monotonic = time.monotonic
#: makes a transaction's xids when first asked for (two threads asking at once get one)
_naming = _thread.allocate_lock()
#: a transaction's branches and enlistments until it has more than one resource: none
_NONE: tuple[()] = ()


def _bqual(index: int) -> bytes:
    return str(index).encode()


#: The branch qualifiers "0".."15" as bytes, made once rather than per branch.
_BQUALS = tuple(_bqual(i) for i in range(16))


class Status(IntEnum):
    """Transaction status, with JTA's names and values (``javax.transaction.Status``)."""

    ACTIVE = 0
    MARKED_ROLLBACK = 1
    PREPARED = 2
    COMMITTED = 3
    ROLLEDBACK = 4
    UNKNOWN = 5
    NO_TRANSACTION = 6
    PREPARING = 7
    COMMITTING = 8
    ROLLING_BACK = 9


# Module-level aliases for the hot paths: on Python 3.11 reading an Enum member
# (Status.ACTIVE) costs seven times reading a global.
_ACTIVE = Status.ACTIVE
_PREPARING = Status.PREPARING
_PREPARED = Status.PREPARED
_COMMITTING = Status.COMMITTING
_COMMITTED = Status.COMMITTED


@runtime_checkable
class Synchronization(Protocol):
    """Callbacks around completion (JTA ``Synchronization``).

    ``before_completion`` runs before prepare, only when the transaction is
    about to try to commit; it may still do transactional work (flush a cache)
    and may raise to force a rollback.  ``after_completion`` runs once the
    outcome is known, with the final :class:`Status`; its exceptions are
    logged and swallowed, since the outcome can no longer change.
    """

    def before_completion(self) -> None: ...

    def after_completion(self, status: Status) -> None: ...


@dataclass(frozen=True)
class PreparedBranch:
    """A branch prepared by :meth:`Transaction.prepare_and_detach`, for whoever decides it.

    Plain data (the xid's text form and the resource's name), so it can
    travel from the process that did the work to the one that commits it (a
    Spark executor's result to the driver): phase 2 of a prepared branch can
    run on any connection to its resource manager.
    """

    xid: Xid
    resource_name: str

    def to_text(self) -> tuple[str, str]:
        return (self.xid.to_text(), self.resource_name)

    @classmethod
    def from_text(cls, data: tuple[str, str] | list[str]) -> "PreparedBranch":
        xid_text, name = data
        return cls(Xid.from_text(xid_text), name)


class AfterCompletion:
    """A :class:`Synchronization` with nothing to do before completion (a pool that takes its
    connection back afterwards): the transaction does not call its ``before_completion``.

    A transaction whose synchronizations are all of this kind skips the
    before-completion pass altogether, a share of a short transaction's own cost.
    A subclass defines ``after_completion(status)``, the part of the
    :class:`Synchronization` protocol it has work for."""

    __slots__ = ()

    #: no ``before_completion`` to run (see :class:`SoleSynchronization`)
    runs_before = False

    def before_completion(self) -> None:
        pass


class SoleSynchronization:
    """A :class:`Synchronization` with work before completion, handed to the one-phase path's
    enlistment (``_enlist_first``) with its transaction's first resource: the WS-RM store's
    branch, whose buffered statements go out (and the rule for commits that returned before
    their flush is kept) before its COMMIT.  The one-phase commit runs its ``before_completion``
    itself, then the fused COMMIT, with no promotion to the general path (which a
    synchronization registered on its own causes: about 100 Python calls a transaction more).
    Should the transaction be promoted after all (a second resource, a synchronization of
    another kind), the general path runs it as any other synchronization; a promotion from
    inside its ``before_completion`` runs it again there, so it must bear a second call (one
    that finds nothing left to do)."""

    __slots__ = ()

    runs_before = True

    def before_completion(self) -> None:
        pass

    def after_completion(self, status: "Status") -> None:
        pass


class _Branch:
    """One transaction branch: an xid and the resource that prepares and commits it."""

    __slots__ = ("index", "xid", "resource", "vote", "rolled_back")

    def __init__(self, index: int, xid: Xid, resource: XAResource) -> None:
        self.index = index
        self.xid = xid
        self.resource = resource
        self.vote: int | None = None
        self.rolled_back = False  # the resource already rolled it back (XA_RB* answer)

    @property
    def name(self) -> str:
        return getattr(self.resource, "resource_name", type(self.resource).__name__)


class _Enlistment:
    """One resource's association with a branch (several may share a branch by TMJOIN)."""

    __slots__ = ("resource", "branch", "state")

    def __init__(self, resource: XAResource, branch: _Branch) -> None:
        self.resource = resource
        self.branch = branch
        self.state = "active"  # active | suspended | ended | failed


class _Settings:
    """What the transactions of one manager share, referenced by each as one field (setting
    seven fields per transaction was a visible share of its begin).  The manager keeps one
    (its crash-test hook may be changed on it between transactions); a begin with a branch
    prefix gets a copy with that prefix."""

    __slots__ = ("log", "checkpoint", "retries", "retry_delay", "on_end", "node", "registry",
                 "branch_prefix")

    def __init__(self, log: "TransactionLog", checkpoint: Checkpoint | None, retries: int,
                 retry_delay: float, on_end: Callable[["Transaction"], None] | None,
                 node: str | None, registry: dict[bytes, "Transaction"] | None,
                 branch_prefix: bytes = b"") -> None:
        self.log = log
        self.checkpoint = checkpoint
        self.retries = retries
        self.retry_delay = retry_delay
        self.on_end = on_end
        #: the node that names the gtrid made when first asked for (see Transaction.xid)
        self.node = node
        #: the manager's running transactions, by gtrid (None: a transaction of its own)
        self.registry = registry
        # Several processes working under one gtrid (a Spark job's tasks) need
        # branch qualifiers that cannot collide: each names its own prefix.
        self.branch_prefix = branch_prefix

    def with_prefix(self, branch_prefix: bytes) -> "_Settings":
        return _Settings(self.log, self.checkpoint, self.retries, self.retry_delay, self.on_end,
                         self.node, self.registry, branch_prefix)


class Transaction:
    """A global transaction.  Created by :meth:`TransactionManager.begin`.

    The methods may be called from any thread, but like a JTA transaction it
    is meant to be used by one thread at a time (the manager's thread binding,
    ``suspend``/``resume`` move it between threads).  ``set_rollback_only`` and
    ``status`` are safe from any thread at any time.
    """

    # Slots, not an instance dict: making a transaction with a 21-key dict cost more client CPU
    # than the rest of its begin (callgrind).  ``__dict__`` stays for attributes others attach.
    # ``_fused`` is set with ``_sole`` (never read without it): the sole resource ends and
    # commits in one call, ``end_and_commit_one_phase`` (see PostgresXAResource).
    _fused: bool
    __slots__ = ("_xid", "_cfg", "_clock", "timeout", "deadline", "_lock", "_phase", "_rollback_only",
                 "_timed_out", "_cause", "_completing", "_finished", "_branches", "_enlisted",
                 "_syncs", "_before", "_sole", "_fused", "_sole_xid", "__dict__", "__weakref__")

    #: the workers that run phase 2 once the caller has returned at the decision (see
    #: :meth:`commit_at_decision`), or :data:`_HANDED_OVER` once they have it; a class
    #: attribute (none), so that a transaction that never asks carries no instance dict
    _later: Any = None

    def __init__(self, xid: Xid, *, log: "TransactionLog", timeout: float | None = None,
                 checkpoint: Checkpoint | None = None, retries: int = 3,
                 retry_delay: float = 0.05, on_end: Callable[["Transaction"], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, branch_prefix: bytes = b"") -> None:
        if xid.bqual:
            raise ValueError(f"{xid} is a branch xid; a transaction needs a global xid")
        self._setup(xid, _Settings(log, checkpoint, retries, retry_delay, on_end, None, None,
                                   branch_prefix), timeout, clock)

    @classmethod
    def _new(cls, xid: Xid | None, settings: "_Settings", timeout: float | None) -> "Transaction":
        """What ``Transaction(xid, log=..., ...)`` makes, for the manager's ``begin``: a class
        called with keywords builds a dict of them and matches them by name, which cost as
        much as the rest of the transaction's set-up (callgrind); positional arguments do not.

        With ``xid`` None the global xid is made the first time something asks for it (see
        :attr:`xid`), and the transaction is then put in ``settings.registry`` (the manager's
        running transactions, by gtrid) under it."""
        tx = _new_object(cls)
        tx._setup(xid, settings, timeout, _monotonic)
        return tx

    def _setup(self, xid: Xid | None, settings: "_Settings", timeout: float | None,
               clock: Callable[[], float]) -> None:
        self._xid = xid
        self._cfg = settings  # what the manager's transactions share: one field, not seven
        self._clock = clock
        if timeout and timeout > 0:
            self.timeout: float | None = timeout
            self.deadline: float | None = clock() + timeout
        else:
            self.timeout = self.deadline = None
        self._lock = _thread.RLock()  # threading.RLock() is a Python-level factory of this
        self._phase = _ACTIVE
        self._rollback_only = False
        self._timed_out = False
        self._cause: BaseException | None = None
        self._completing = False
        self._finished = False
        # no list until a second resource (see _promote): the one-phase path has none
        self._branches: list[_Branch] = _NONE  # type: ignore[assignment]
        self._enlisted: list[_Enlistment] = _NONE  # type: ignore[assignment]
        # no list until a second synchronization: the one-phase path's only one, the pool's
        # return of its session, goes in a tuple of one (see _enlist_first and _add_sync)
        self._syncs: list[Synchronization] | tuple[Synchronization, ...] = _NONE
        #: a synchronization that is no AfterCompletion was registered: run before_completion
        self._before = False
        #: the one resource of a transaction that has only one (see _enlist), its branch xid in
        #: ``_sole_xid`` (None until something needs it); None once a second one enlisted (or
        #: before the first)
        self._sole: XAResource | None = None
        self._sole_xid: Xid | None = None

    def __repr__(self) -> str:
        return f"<Transaction {self.xid} {self.status.name}>"

    @property
    def xid(self) -> Xid:
        """The global xid.  One the manager made is made when first asked for: a transaction
        committed in one phase by a resource that needs no xid for it never formats one."""
        xid = self._xid
        if xid is None:
            with _naming:  # held for no call out: the naming never waits on anything else
                xid = self._xid
                if xid is None:
                    self._xid = xid = Xid.new_global(self._cfg.node)
                    registry = self._cfg.registry
                    if registry is not None and not self._finished:
                        registry[xid.gtrid] = self  # running: recovery must leave its branches be
        return xid

    # -- state -------------------------------------------------------------------

    @property
    def status(self) -> Status:
        phase = self._phase
        if phase == Status.ACTIVE and (self._rollback_only or self.is_expired()):
            return Status.MARKED_ROLLBACK
        return phase

    def is_expired(self) -> bool:
        """True once the deadline has passed (the transaction can then only roll back)."""
        return self.deadline is not None and self._clock() > self.deadline

    @property
    def finished(self) -> bool:
        """True once commit or rollback has run to its end (whatever the outcome)."""
        return self._finished

    @property
    def rollback_cause(self) -> BaseException | None:
        """Why the transaction was marked rollback-only, when something said why."""
        return self._cause

    @property
    def branches(self) -> tuple[tuple[Xid, XAResource], ...]:
        """(branch xid, resource) of every branch, in enlistment order."""
        if self._sole is not None:
            return ((self._name_sole(), self._sole),)
        return tuple((b.xid, b.resource) for b in self._branches)

    @property
    def branch_count(self) -> int:
        """How many branches the transaction has so far.  Unlike :attr:`branches`, it does not
        name a sole resource's branch: named, that branch's one-phase commit can no longer take
        its fused path (``end_and_commit_one_phase`` of a branch started unnamed), and what rides
        on its COMMIT goes in a round trip of its own."""
        return 1 if self._sole is not None else len(self._branches)

    def commit_at_decision(self, workers: Any) -> PhaseTwo:
        """Ask :meth:`commit` to return once its decision is durable, and ``workers`` (a
        :class:`~txmanager.phase_two.PhaseTwoWorkers`) to commit the prepared branches after.

        Only a decision carried by a commit mark is returned at (the branch that holds it has
        committed in one phase, with the mark): the other branches are then prepared and
        decided, and recovery commits them should the process die before its workers do.
        Any other commit (one phase, a decision in the recovery log) runs to its end as
        without.  The crash-test hook's ``committed`` and ``before_done`` points are then
        called in the worker's thread.  Heuristic outcomes of a phase 2 run after the caller
        returned are logged, not raised.  Returns a :class:`~txmanager.phase_two.PhaseTwo`,
        done once the transaction is over whichever way it ends (its branches' rows visible
        to other sessions once it is done after a commit); the same one when asked again."""
        done = self.__dict__.get("_done")
        if done is None:
            self.register_synchronization(done := PhaseTwo())
            self._done = done
            self._later = workers
        return done

    def set_rollback_only(self) -> None:
        """Make rollback the only possible outcome."""
        if self._phase not in (Status.ACTIVE, Status.PREPARING):
            raise IllegalStateError(f"transaction {self.xid} is {self._phase.name}; "
                                    "too late to mark it rollback-only")
        self._rollback_only = True

    def _mark_rollback(self, cause: BaseException | None) -> None:
        self._rollback_only = True
        if cause is not None and self._cause is None:
            self._cause = cause

    def _check_active(self, what: str) -> None:
        """Raise unless new work may join the transaction now.

        The hot paths (``enlist_resource``, ``register_synchronization``)
        first test the same conditions inline and call this only when one
        holds: a Python call per enlistment is a measurable share of a short
        transaction.
        """
        if self._phase != Status.ACTIVE:
            raise IllegalStateError(f"cannot {what}: transaction {self.xid} is {self._phase.name}")
        if self.is_expired():
            self._timed_out = True
            self._rollback_only = True
        if self._timed_out:
            raise TransactionTimeoutError(
                f"cannot {what}: transaction {self.xid} timed out after {self.timeout}s "
                "and can only roll back", xid=self.xid)
        if self._rollback_only:
            raise RollbackError(f"cannot {what}: transaction {self.xid} is marked rollback-only",
                                xid=self.xid, cause=self._cause)

    # -- resources ------------------------------------------------------------------

    def enlist_resource(self, resource: XAResource) -> bool:
        """Make ``resource``'s work part of this transaction.

        A resource seen for the first time gets a new branch, or joins
        (``TMJOIN``) the branch of an enlisted resource of the same resource
        manager (``is_same_rm``).  A suspended resource is resumed
        (``TMRESUME``), a delisted one re-joins its branch.  Returns False
        when the resource is already active in this transaction.
        """
        lock = self._lock
        lock.acquire()  # not ``with``: its two special-method calls cost twice this (callgrind)
        try:
            return self._enlist(resource)
        finally:
            lock.release()

    def enlist_with_synchronization(self, resource: XAResource, sync: Synchronization) -> bool:
        """:meth:`enlist_resource`, then (unless that raised) :meth:`register_synchronization`,
        under one acquisition of the transaction's lock: what a pool's data source does at
        the first use of each of its connections in a transaction."""
        lock = self._lock
        lock.acquire()
        try:
            enlisted = self._enlist(resource)
            self._add_sync(sync)
            return enlisted
        finally:
            lock.release()

    def _enlist_first(self, resource: XAResource, sync: Synchronization) -> bool:
        """:meth:`enlist_with_synchronization` for a pool's session that starts unnamed and
        takes no transaction timeout (a :class:`~txmanager.postgres.PostgresXAResource`), and
        its synchronization (an :class:`AfterCompletion`, or a :class:`SoleSynchronization`
        whose ``before_completion`` the one-phase commit runs), made by a pool that saw
        nothing enlisted yet: the one-phase path's enlistment (:meth:`_enlist_sole`) without
        the general one's look for the resource among others.  False, having done nothing,
        when something is enlisted after all (another thread came first): the pool then takes
        the general path.  Raises as :meth:`enlist_resource` does when it is too late."""
        lock = self._lock
        lock.acquire()
        try:
            if self._sole is not None or self._enlisted:
                return False
            deadline = self.deadline
            if (self._phase is not _ACTIVE or self._rollback_only or self._timed_out
                    or (deadline is not None and self._clock() > deadline)):
                self._check_active("enlist a resource")
            try:
                resource.start_unnamed(self._name_sole)  # type: ignore[attr-defined]
            except XAException as e:
                self._start_failed(resource, self._name_sole(), e)
            self._sole = resource
            self._fused = True  # it has end_and_commit_one_phase too
            if self._syncs is _NONE:
                self._syncs = (sync,)  # an AfterCompletion or a SoleSynchronization, as the caller says
                if sync.runs_before:  # type: ignore[attr-defined]
                    self._before = True
            else:
                self._add_sync(sync)
            return True
        finally:
            lock.release()

    def _enlist(self, resource: XAResource) -> bool:
        """enlist_resource, its lock held."""
        deadline = self.deadline
        if (self._phase is not _ACTIVE or self._rollback_only or self._timed_out
                or (deadline is not None and self._clock() > deadline)):
            self._check_active("enlist a resource")
        sole = self._sole
        if sole is not None:
            if sole is resource:
                return False  # already active in the transaction
            self._promote()  # a second resource: the full two-phase bookkeeping from here on
        elif not self._enlisted:
            return self._enlist_sole(resource, deadline)
        enl = self._enlistment(resource) if self._enlisted else None
        if enl is not None:
            if enl.state == "active":
                return False
            if enl.state == "failed":
                raise RollbackError(f"{enl.branch.name} was delisted with TMFAIL; "
                                    "the transaction can only roll back", xid=self.xid)
            flag = TMRESUME if enl.state == "suspended" else TMJOIN
            self._start(resource, enl.branch.xid, flag)
            enl.state = "active"
            return True
        for branch in self._branches:
            if branch.resource is not resource and _same_rm(branch.resource, resource):
                try:
                    self._start(resource, branch.xid, TMJOIN)
                except TransactionError as e:
                    log.debug("join of %s to %s refused (%s); starting a new branch",
                              resource, branch.xid, e)
                    continue
                self._enlisted.append(_Enlistment(resource, branch))
                return True
        index = len(self._branches)
        bqual = _BQUALS[index] if index < 16 else _bqual(index)
        if self._cfg.branch_prefix:
            bqual = self._cfg.branch_prefix + bqual
        branch = _Branch(index, self.xid.branch(bqual), resource)
        if deadline is not None and getattr(resource, "takes_transaction_timeout", True):
            # pass the time left on to the resource (one that says it takes none is not asked)
            try:
                resource.set_transaction_timeout(max(1, math.ceil(deadline - self._clock())))
            except (XAException, AttributeError) as e:
                log.debug("%s does not take a transaction timeout: %s", _name(resource), e)
        try:
            resource.start(branch.xid, TMNOFLAGS)
        except XAException as e:
            self._start_failed(resource, branch.xid, e)
        self._branches.append(branch)
        self._enlisted.append(_Enlistment(resource, branch))
        return True

    def _enlist_sole(self, resource: XAResource, deadline: float | None) -> bool:
        """The transaction's first resource: its branch starts, and nothing else is made.

        A transaction that never enlists a second resource commits in one
        phase, and its only branch needs none of the objects that track
        several (a branch and an enlistment object each, found again at
        completion by walking their lists): the resource and its xid are kept
        as they are, and :meth:`_promote` makes those objects the moment
        anything needs them (a second resource, a delist, a suspend, a
        rollback, a commit that cannot take the one-phase path).  This is
        the one-phase path of Narayana's and Atomikos' managers, where one
        resource is never prepared and nothing is logged.
        """
        if deadline is not None and getattr(resource, "takes_transaction_timeout", True):
            try:
                resource.set_transaction_timeout(max(1, math.ceil(deadline - self._clock())))
            except (XAException, AttributeError) as e:
                log.debug("%s does not take a transaction timeout: %s", _name(resource), e)
        # A resource that can start its branch before it has a name (see start_unnamed in
        # PostgresXAResource) asks for one only when something needs it: one phase never does.
        start_unnamed = getattr(resource, "start_unnamed", None)
        try:
            if start_unnamed is not None:
                start_unnamed(self._name_sole)
            else:
                resource.start(self._name_sole(), TMNOFLAGS)
        except XAException as e:
            self._start_failed(resource, self._name_sole(), e)
        self._sole = resource
        self._fused = hasattr(resource, "end_and_commit_one_phase")
        return True

    def _name_sole(self) -> Xid:
        """The sole resource's branch xid, made the first time it is needed."""
        xid = self._sole_xid
        if xid is None:
            gxid = self.xid
            with _naming:
                xid = self._sole_xid
                if xid is None:
                    prefix = self._cfg.branch_prefix
                    self._sole_xid = xid = gxid.branch(prefix + b"0" if prefix else b"0")
        return xid

    def _promote(self, state: str = "active") -> _Branch | None:
        """The sole resource's branch and enlistment as objects, as every other branch has:
        from here on the transaction runs the general path (see :meth:`_enlist_sole`)."""
        resource = self._sole
        if resource is None:
            return None
        branch = _Branch(0, self._name_sole(), resource)
        enl = _Enlistment(resource, branch)
        enl.state = state
        self._branches = [branch]  # the sole resource was the only one: nothing else is in
        self._enlisted = [enl]
        self._sole = None
        return branch

    def delist_resource(self, resource: XAResource, flag: int = TMSUCCESS) -> bool:
        """End ``resource``'s association: TMSUCCESS (work done), TMSUSPEND, or TMFAIL
        (the work failed: the transaction is marked rollback-only).

        Returns False when the resource answered that its branch is already
        rolled back (the transaction is then marked rollback-only).
        """
        if flag not in (TMSUCCESS, TMFAIL, TMSUSPEND):
            raise ValueError(f"delist flag must be TMSUCCESS, TMFAIL or TMSUSPEND, not {flag:#x}")
        with self._lock:
            if self._phase != Status.ACTIVE:
                raise IllegalStateError(
                    f"cannot delist: transaction {self.xid} is {self._phase.name}")
            self._promote()
            enl = self._enlistment(resource)
            if enl is None:
                raise IllegalStateError(f"{resource!r} is not enlisted in transaction {self.xid}")
            if enl.state != "active" and not (enl.state == "suspended" and flag != TMSUSPEND):
                raise IllegalStateError(f"{resource!r} is {enl.state} in transaction {self.xid}, "
                                        "not active")
            return self._end(enl, flag)

    def register_synchronization(self, sync: Synchronization) -> None:
        """Call ``sync`` around completion (may also be called from ``before_completion``)."""
        lock = self._lock
        lock.acquire()  # not ``with``: see enlist_resource
        try:
            deadline = self.deadline
            if (self._phase is not _ACTIVE or self._rollback_only or self._timed_out
                    or (deadline is not None and self._clock() > deadline)):
                self._check_active("register a synchronization")
            self._add_sync(sync)
        finally:
            lock.release()

    def _add_sync(self, sync: Synchronization) -> None:
        """Register ``sync`` after those already registered (the transaction's lock held)."""
        syncs = self._syncs
        if type(syncs) is tuple:  # none yet, or the one-phase path's one (see _setup)
            self._syncs = syncs = list(syncs)
        syncs.append(sync)  # type: ignore[union-attr]
        if not isinstance(sync, AfterCompletion):
            self._before = True

    def _enlistment(self, resource: XAResource) -> _Enlistment | None:
        for enl in self._enlisted:
            if enl.resource is resource:
                return enl
        return None

    def _start(self, resource: XAResource, xid: Xid, flag: int) -> None:
        try:
            resource.start(xid, flag)
        except XAException as e:
            self._start_failed(resource, xid, e)

    def _start_failed(self, resource: XAResource, xid: Xid, e: XAException) -> None:
        """Raise what a refused ``start`` means for the transaction."""
        if e.is_rollback:
            self._mark_rollback(e)
            raise RollbackError(f"{_name(resource)} rolled back branch {xid} at start",
                                xid=self.xid, cause=e) from e
        raise TransactionError(f"{_name(resource)} refused to start branch {xid}: {e}") from e

    def _end(self, enl: _Enlistment, flag: int) -> bool:
        try:
            enl.resource.end(enl.branch.xid, flag)
        except XAException as e:
            return self._end_failed(enl, e)
        if flag == TMSUSPEND:
            enl.state = "suspended"
        elif flag == TMFAIL:
            enl.state = "failed"
            self._mark_rollback(None)
        else:
            enl.state = "ended"
        return True

    def _end_failed(self, enl: _Enlistment, e: XAException) -> bool:
        """What a refused ``end`` means: False when the branch is rolled back, else raise."""
        enl.state = "failed"
        self._mark_rollback(e)
        if e.is_rollback:
            return False
        raise TransactionError(f"{_name(enl.resource)} failed to end branch "
                               f"{enl.branch.xid}: {e}") from e

    def _end_all(self) -> None:
        """End every open association before completion; failures force a rollback."""
        for enl in self._enlisted:
            state = enl.state
            if state == "active" and not self._rollback_only:  # the usual case, without _end's call
                try:
                    enl.resource.end(enl.branch.xid, TMSUCCESS)
                except XAException as e:
                    try:
                        self._end_failed(enl, e)
                    except TransactionError as te:
                        log.warning("%s", te)
                else:
                    enl.state = "ended"
                continue
            if state in ("active", "suspended"):
                try:
                    self._end(enl, TMFAIL if self._rollback_only else TMSUCCESS)
                except TransactionError as e:
                    log.warning("%s", e)

    def _suspend_all(self) -> list[XAResource]:
        """End active associations with TMSUSPEND (for the manager's ``suspend``)."""
        with self._lock:
            self._promote()
            suspended = []
            for enl in self._enlisted:
                if enl.state == "active":
                    self._end(enl, TMSUSPEND)
                    suspended.append(enl.resource)
            return suspended

    def _resume_all(self) -> None:
        """Resume associations suspended by ``_suspend_all`` (TMRESUME)."""
        with self._lock:
            self._promote()
            for enl in self._enlisted:
                if enl.state == "suspended":
                    self._start(enl.resource, enl.branch.xid, TMRESUME)
                    enl.state = "active"

    # -- completion ------------------------------------------------------------------

    def commit(self) -> None:
        """Commit, or raise :class:`RollbackError` saying why it rolled back.

        Returns normally when the commit decision was made, even if a resource
        could not be reached for phase 2 (the recovery manager finishes it).
        """
        lock = self._lock
        lock.acquire()  # what _enter_completion does, inline (and not ``with``: see enlist_resource)
        try:
            if self._completing or self._phase is not _ACTIVE:
                state = "completing" if self._completing else self._phase.name
                raise IllegalStateError(f"cannot commit transaction {self.xid}: it is {state}")
            self._completing = True
            if not self._before:  # no before_completion to run while ACTIVE: PREPARING now, one lock
                self._phase = _PREPARING
        finally:
            lock.release()
        try:
            sole = self._sole
            if (sole is not None and not self._before and self._cfg.checkpoint is None
                    and not self._rollback_only):
                deadline = self.deadline
                if deadline is None or self._clock() <= deadline:
                    # _commit_sole's first step, inline: the usual end of a one-phase transaction
                    if self._fused:
                        self._phase = _COMMITTING
                        try:
                            done = sole.end_and_commit_one_phase(  # type: ignore[attr-defined]
                                self._sole_xid)  # None: the branch was never named
                        except Exception as e:  # noqa: BLE001 -- sorted out as the general path does
                            self._one_phase_failed(self._promote("ended"), e)  # type: ignore[arg-type]
                            done = True
                        if done:  # what _finish(_COMMITTED) does, without its call
                            self._phase = _COMMITTED
                            self._finished = True
                            for sync in self._syncs:
                                try:
                                    sync.after_completion(_COMMITTED)
                                except Exception:  # noqa: BLE001 -- the outcome is final
                                    log.exception("after_completion of %r failed", sync)
                            return
                        self._phase = _PREPARING  # not in a state to: end and commit apart say why
                    if self._commit_sole(sole, try_fused=False):
                        return
            self._commit()  # what the one-phase path leaves undone, the general path does
        finally:
            # a manager's transaction never named was never in its running set: nothing to end
            # (one whose phase 2 was handed over ends when that is done: see _phase_two_later)
            if (self._xid is not None or self._cfg.registry is None) and self._later is not _HANDED_OVER:
                self._leave_completion()

    def prepare_and_detach(self) -> list[PreparedBranch]:
        """Phase 1 only: prepare every branch and hand the decision to someone else.

        For work done in one process and decided in another (a Spark task
        prepares, the driver commits the attempts Spark accepted): runs
        ``before_completion``, ends and prepares every branch, and returns the
        branches that voted yes (read-only ones are already finished).  Nothing
        is logged here -- the decider logs its decision
        (:meth:`TransactionManager.commit_prepared`); until then the branches
        stay prepared and are presumed aborted by recovery.  A "no" vote, an
        error or a timeout rolls every branch back and raises
        :class:`RollbackError`, as commit would.  Afterwards the transaction is
        finished with status PREPARED (``after_completion(Status.PREPARED)``:
        the local connections may be released, the outcome is not known here).
        """
        self._enter_completion("prepare")
        try:
            self._promote()
            if not self._rollback_only and not self.is_expired() and self._before:
                self._before_completion()
            if self.is_expired():
                self._timed_out = True
                self._rollback_only = True
            self._end_all()
            with self._lock:
                self._phase = Status.PREPARING
            if self._rollback_only:
                self._phase = Status.ROLLING_BACK
                self._finish_rollback(self._branches, self._cause)
            for branch in self._branches:
                if self._rollback_only or self.is_expired():
                    break
                try:
                    vote = branch.resource.prepare(branch.xid)
                except XAException as e:
                    branch.rolled_back = e.is_rollback
                    self._abort(f"{branch.name} voted no on {branch.xid}", e)
                except Exception as e:  # noqa: BLE001 -- a lost connection, a bug in the resource
                    self._abort(f"prepare of {branch.xid} on {branch.name} failed", e)
                if vote not in (XA_OK, XA_RDONLY):
                    self._abort(f"{branch.name} answered prepare of {branch.xid} with "
                                f"{error_name(vote)}", None)
                branch.vote = vote
                self._cp("prepared", branch.index)
            if self.is_expired():
                self._timed_out = True
            if self._timed_out or self._rollback_only:
                self._abort("rollback-only during prepare", self._cause)
            prepared = [PreparedBranch(b.xid, b.name) for b in self._branches if b.vote == XA_OK]
            self._finish(Status.PREPARED)
            return prepared
        finally:
            self._leave_completion()

    def rollback(self) -> None:
        """Roll back every branch.  Raises only for a heuristic outcome."""
        self._enter_completion("roll back")
        try:
            self._promote()
            self._end_all()
            self._phase = Status.ROLLING_BACK
            self._finish_rollback(self._branches, None, explicit=True)
        finally:
            self._leave_completion()

    def _enter_completion(self, what: str) -> None:
        with self._lock:
            if self._completing or self._phase is not _ACTIVE:
                state = "completing" if self._completing else self._phase.name
                raise IllegalStateError(f"cannot {what} transaction {self.xid}: it is {state}")
            self._completing = True

    def _leave_completion(self) -> None:
        if self._cfg.on_end is not None:
            try:
                self._cfg.on_end(self)
            except Exception:  # noqa: BLE001 -- bookkeeping must not hide the outcome
                log.exception("transaction end callback failed")

    def _commit(self) -> None:
        deadline, clock = self.deadline, self._clock
        if (not self._rollback_only and self._before
                and not (deadline is not None and clock() > deadline)):
            self._before_completion()
        if deadline is not None and clock() > deadline:
            self._timed_out = True
            self._rollback_only = True
        sole = self._sole
        if sole is not None:
            if not self._rollback_only and self._cfg.checkpoint is None and self._commit_sole(sole):
                return
            self._promote()  # the general path (a crash-test hook wants to see each point)
        self._end_all()
        if self._phase is _ACTIVE:
            with self._lock:
                self._phase = _PREPARING
        if self._rollback_only:
            self._phase = Status.ROLLING_BACK
            self._finish_rollback(self._branches, self._cause)
        branches = self._branches
        if not branches:
            self._finish(_COMMITTED)
        elif len(branches) == 1:
            self._commit_one_phase(branches[0])
        else:
            self._commit_two_phase(branches)

    def _before_completion(self) -> None:
        i = 0
        while i < len(self._syncs):  # a sync may register more syncs
            if isinstance(self._syncs[i], AfterCompletion):
                i += 1
                continue
            try:
                self._syncs[i].before_completion()
            except Exception as e:
                log.warning("before_completion of %r failed; rolling back %s: %s",
                            self._syncs[i], self.xid, e)
                self._mark_rollback(e)
                return
            i += 1

    def _commit_sole(self, resource: XAResource, try_fused: bool = True) -> bool:
        """Commit the transaction's only resource in one phase, without the objects of the
        general path; False (promoted, nothing done yet but what the general path does
        alike) when its branch could not be ended: then the general path goes on.
        ``try_fused`` False: the resource's ``end_and_commit_one_phase`` was tried already."""
        fused = getattr(resource, "end_and_commit_one_phase", None) if try_fused else None
        if fused is not None:  # end and commit in one call (see PostgresXAResource)
            phase = self._phase
            self._phase = _COMMITTING
            try:
                done = fused(self._sole_xid)  # None: the branch was never named
            except Exception as e:  # noqa: BLE001 -- sorted out as the general path does
                branch = self._promote("ended")
                assert branch is not None
                self._one_phase_failed(branch, e)
                done = True
            if done:
                self._finish(_COMMITTED)
                return True
            self._phase = phase  # not in a state to: end and commit apart say why
        xid = self._name_sole()
        try:
            resource.end(xid, TMSUCCESS)
        except XAException as e:
            self._promote()
            enl = self._enlisted[0]
            try:
                self._end_failed(enl, e)
            except TransactionError as te:
                log.warning("%s", te)
            return False
        if self._phase is _ACTIVE:
            with self._lock:
                self._phase = _PREPARING
        self._phase = _COMMITTING
        try:
            resource.commit(xid, one_phase=True)
        except Exception as e:  # noqa: BLE001 -- sorted out as the general path does
            branch = self._promote("ended")
            assert branch is not None
            self._one_phase_failed(branch, e)
        self._finish(_COMMITTED)
        return True

    def _commit_one_phase(self, branch: _Branch) -> None:
        if self._cfg.checkpoint is not None:
            self._cfg.checkpoint("before_commit_one_phase", 0)
        self._phase = _COMMITTING
        try:
            branch.resource.commit(branch.xid, one_phase=True)
        except Exception as e:  # noqa: BLE001 -- sorted out below
            self._one_phase_failed(branch, e)
        self._finish(_COMMITTED)

    def _one_phase_failed(self, branch: _Branch, e: Exception) -> None:
        """What a failed one-phase commit means: raises, except for a heuristic commit (done)."""
        if isinstance(e, XAException):
            if e.is_rollback or e.code == XAER_NOTA:
                branch.rolled_back = True
                self._phase = Status.ROLLING_BACK
                self._finish_rollback([], e)
            if e.code == XA_HEURCOM:
                self._forget(branch)
            else:
                code = e.code if e.is_heuristic else XA_HEURHAZ
                self._record_heuristic(branch, code)
                self._raise_heuristic(True, [(branch.xid, code)], agreeing=0, cause=e)
            return
        # a lost connection: outcome unknown
        self._record_heuristic(branch, XA_HEURHAZ)
        self._raise_heuristic(True, [(branch.xid, XA_HEURHAZ)], agreeing=0, cause=e)

    def _commit_two_phase(self, branches: list[_Branch]) -> None:
        """Prepare, decide durably, commit: the decision is the log's record or, where one
        branch can carry it, that branch's one-phase commit with a commit mark."""
        cp = self._cfg.checkpoint  # tested inline: a hook point per branch and phase
        if cp is not None:
            cp("before_prepare", 0)
        # a log that cannot note where marks are (a TransactionLog of the caller's own) keeps
        # every decision itself
        # a node claimed in a database (txmanager.lease) writes marks only there, fenced
        fence = getattr(self._cfg.log, "fence", None)
        holder = _mark_holder(branches, fence) if hasattr(self._cfg.log, "log_mark_source") else None
        if holder is not None:  # it commits last, in one phase, with the decision
            branches = [b for b in branches if b is not holder]
        prepared = self._prepare(branches)
        if not prepared:  # all read-only: nothing to log, nothing to commit
            if holder is not None:
                self._commit_one_phase(holder)
                return
            self._finish(_COMMITTED)
            return
        if cp is not None:
            cp("before_log", 0)
        if self._rollback_only:
            self._abort("marked rollback-only during prepare", self._cause)
        if holder is not None:
            self._commit_marked(holder, prepared, fence)
        else:
            try:
                self._cfg.log.log_commit_decision(self.xid, [(b.xid, b.name) for b in prepared])
            except Exception as e:  # noqa: BLE001 -- no durable decision means no commit
                self._abort("the commit decision could not be logged", e)
        if cp is not None:
            cp("logged", 0)
        self._phase = _COMMITTING
        later = self._later
        if later is not None and holder is not None:
            # decided by the mark: the caller goes on, the workers make the rest visible
            self._later = _HANDED_OVER  # before the worker can end it
            later.submit(lambda: self._phase_two_later(holder, prepared))
            return
        heuristics, left, agreeing = self._commit_decided(prepared)
        if cp is not None:
            cp("before_done", 0)
        self._forget_decision(holder, left, heuristics)
        if heuristics:
            self._raise_heuristic(True, heuristics, agreeing)
        self._finish(_COMMITTED)

    def _phase_two_later(self, holder: _Branch, prepared: list[_Branch]) -> None:
        """Phase 2 of a transaction whose caller returned at its decision (a worker's job):
        what :meth:`_commit_two_phase` does after the decision, then what :meth:`commit`
        does at its end.  A heuristic outcome is logged (and in the recovery log)."""
        try:
            heuristics, left, agreeing = self._commit_decided(prepared)
            self._cp("before_done", 0)
            self._forget_decision(holder, left, heuristics)
            if heuristics:
                self._raise_heuristic(True, heuristics, agreeing)
            self._finish(_COMMITTED)
        except HeuristicError as e:
            log.error("transaction %s, committed after its caller returned at the decision: %s", self.xid, e)
        except Exception:  # noqa: BLE001 -- decided: recovery finishes what is left
            log.exception("phase 2 of %s after its caller returned failed; recovery finishes it by "
                          "its commit mark", self.xid)
            if not self._finished:
                self._finish(_COMMITTED)
        finally:
            if self._xid is not None or self._cfg.registry is None:
                self._leave_completion()

    def _prepare(self, branches: list[_Branch]) -> list[_Branch]:
        """Phase 1: every branch votes; the ones that must be committed (voted XA_OK).  A no, a
        failure, a timeout or rollback-only rolls everything back (raises)."""
        cp = self._cfg.checkpoint
        for branch in branches:
            if self._rollback_only or self.is_expired():
                break
            try:
                vote = branch.resource.prepare(branch.xid)
            except XAException as e:
                branch.rolled_back = e.is_rollback
                self._abort(f"{branch.name} voted no on {branch.xid}", e)
            except Exception as e:  # noqa: BLE001 -- a lost connection, a bug in the resource
                self._abort(f"prepare of {branch.xid} on {branch.name} failed", e)
            if vote not in (XA_OK, XA_RDONLY):
                self._abort(f"{branch.name} answered prepare of {branch.xid} with "
                            f"{error_name(vote)}", None)
            branch.vote = vote
            if cp is not None:
                cp("prepared", branch.index)
        if self.is_expired():
            self._timed_out = True
        if self._timed_out or self._rollback_only:
            self._abort("rollback-only during prepare", self._cause)
        self._phase = _PREPARED
        return [b for b in branches if b.vote == XA_OK]

    def _commit_decided(self, prepared: list[_Branch]) -> tuple[list[tuple[Xid, int]], list[_Branch], int]:
        """Phase 2, once decided: the heuristic outcomes, the branches left to recovery (not
        reached) and how many branches agree with the decision."""
        cp = self._cfg.checkpoint
        heuristics: list[tuple[Xid, int]] = []
        left: list[_Branch] = []
        agreeing = 0
        for branch in prepared:
            outcome = self._commit_prepared(branch)
            if outcome is None:
                agreeing += 1
                if cp is not None:
                    cp("committed", branch.index)
            elif isinstance(outcome, str):  # "left"
                left.append(branch)
                agreeing += 1  # decided; recovery will commit it
            else:
                heuristics.append((branch.xid, outcome))
        return heuristics, left, agreeing

    def _forget_decision(self, holder: _Branch | None, left: list[_Branch],
                         heuristics: list[tuple[Xid, int]]) -> None:
        """The decision is no longer needed once every branch committed: drop its mark or log
        it done.  Kept while a branch is left to recovery (or a heuristic is to be seen)."""
        if left:
            log.warning("transaction %s committed, but %s could not be reached; the recovery "
                        "manager will commit %s", self.xid, ", ".join(b.name for b in left),
                        ", ".join(str(b.xid) for b in left))
        elif holder is not None:
            if not heuristics:  # a heuristic keeps the mark until recovery has seen it
                holder.resource.forget_mark(self.xid)  # type: ignore[attr-defined]
        else:
            try:
                self._cfg.log.log_done(self.xid)
            except Exception as e:  # noqa: BLE001 -- harmless: recovery re-commits, hears NOTA
                log.warning("could not log 'done' for %s (recovery will tidy up): %s",
                            self.xid, e)

    def _commit_marked(self, holder: _Branch, prepared: list[_Branch], fence: Any = None) -> None:
        """The decision as a commit mark: ``holder`` commits in one phase with a row naming
        ``prepared`` (see :mod:`txmanager.marks`).  Returns once it committed; else raises."""
        resource = holder.resource
        try:
            # once per database for the life of the log: recovery must know to read its marks
            self._cfg.log.log_mark_source(resource.database)  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 -- a mark recovery would not read decides nothing
            self._abort(f"the recovery log could not note {holder.name} as a keeper of commit marks", e)
        self._phase = _COMMITTING
        gxid = self._xid or self.xid  # named by now (its branches are): the property's call spared
        try:
            marked = [(b.xid, b.name) for b in prepared]
            if fence is None:
                resource.commit_marked(holder.xid, gxid, gxid.node or "", marked)  # type: ignore[attr-defined]
            else:
                resource.commit_marked(holder.xid, gxid, gxid.node or "", marked,  # type: ignore[attr-defined]
                                       fence=fence)
            return
        except XAException as e:
            if e.code != XAER_RMFAIL:  # rolled back, or never committed: nothing decided
                holder.rolled_back = e.is_rollback
                self._abort(f"{holder.name} did not commit {holder.xid} with its commit mark", e)
            cause: BaseException = e
        except Exception as e:  # noqa: BLE001 -- an unexpected failure: the mark may be in
            cause = e
        # The answer to COMMIT was lost: the mark, committed or not, decides.  The other
        # branches stay prepared; recovery reads the mark and finishes them all alike.
        log.error("transaction %s: the outcome of its commit mark on %s is unknown (%s); its "
                  "prepared branches are left to recovery, which reads the mark", self.xid,
                  holder.name, cause)
        self._finish(Status.UNKNOWN)
        raise HeuristicHazardError(
            f"transaction {self.xid}: the answer to the commit of {holder.name} with its commit "
            "mark was lost; recovery commits or rolls back every branch by that mark",
            xid=self.xid, outcomes=[(holder.xid, XA_HEURHAZ)]) from cause

    def _commit_prepared(self, branch: _Branch) -> int | str | None:
        """Phase 2 for one branch: None when committed, "left" for recovery, or a
        heuristic code (already written to the log)."""
        failed_before = False
        for attempt in range(self._cfg.retries + 1):
            try:
                branch.resource.commit(branch.xid, one_phase=False)
                return None
            except XAException as e:
                if e.code == XA_HEURCOM:
                    self._forget(branch)
                    return None
                if e.code == XAER_NOTA and failed_before:
                    return None  # committed by the attempt whose answer was lost
                if e.code in _TRANSIENT:
                    error: Exception = e
                else:
                    code = (e.code if e.is_heuristic else XA_HEURRB if e.is_rollback
                            else XA_HEURHAZ)
                    log.error("commit of %s on %s answered %s: heuristic %s", branch.xid,
                              branch.name, error_name(e.code), error_name(code))
                    self._record_heuristic(branch, code)
                    return code
            except Exception as e:  # noqa: BLE001 -- a lost connection: try again
                error = e
            failed_before = True
            if attempt < self._cfg.retries:
                log.info("commit of %s on %s failed (%s); retrying", branch.xid, branch.name,
                         error)
                time.sleep(min(self._cfg.retry_delay * 2 ** attempt, 2.0))
        log.warning("commit of %s on %s still failing (%s); leaving it to recovery",
                    branch.xid, branch.name, error)
        return "left"

    def _abort(self, why: str, cause: BaseException | None) -> None:
        """Roll back after a failed prepare phase, then raise (never returns)."""
        if cause is None and self._timed_out:
            why = f"timed out after {self.timeout}s"
        log.info("rolling back %s: %s%s", self.xid, why, f" ({cause})" if cause else "")
        self._mark_rollback(cause)
        self._phase = Status.ROLLING_BACK
        self._finish_rollback(self._branches, cause, why=why)

    def _finish_rollback(self, branches: list[_Branch], cause: BaseException | None, *,
                         why: str | None = None, explicit: bool = False) -> None:
        """Roll back ``branches``, run after_completion, and raise -- unless ``explicit``
        (an application's rollback()) and nothing heuristic happened."""
        heuristics: list[tuple[Xid, int]] = []
        agreeing = 0
        for branch in branches:
            if branch.vote == XA_RDONLY:
                continue  # no work, nothing to roll back, no outcome to count
            if branch.rolled_back:  # the resource rolled it back itself (voted no)
                agreeing += 1
                continue
            code = self._rollback_branch(branch)
            if code is None:
                agreeing += 1
            else:
                heuristics.append((branch.xid, code))
        if heuristics:
            self._raise_heuristic(False, heuristics, agreeing, cause=cause)
        self._finish(Status.ROLLEDBACK)
        if explicit:
            return
        if self._timed_out:
            raise TransactionTimeoutError(
                f"transaction {self.xid} timed out after {self.timeout}s and was rolled back",
                xid=self.xid, cause=cause)
        reason = why or (f"{cause}" if cause else "it was marked rollback-only")
        raise RollbackError(f"transaction {self.xid} rolled back: {reason}",
                            xid=self.xid, cause=cause) from cause

    def _rollback_branch(self, branch: _Branch) -> int | None:
        """Roll back one branch: None when done (or left to presumed abort), else a
        heuristic code, already logged."""
        for attempt in range(self._cfg.retries + 1):
            try:
                branch.resource.rollback(branch.xid)
                return None
            except XAException as e:
                if e.code == XAER_NOTA or e.is_rollback:
                    return None
                if e.code == XA_HEURRB:
                    self._forget(branch)
                    return None
                if e.is_heuristic:
                    self._record_heuristic(branch, e.code)
                    return e.code
                error: Exception = e
            except Exception as e:  # noqa: BLE001 -- a lost connection: try again
                error = e
            if attempt < self._cfg.retries:
                time.sleep(min(self._cfg.retry_delay * 2 ** attempt, 2.0))
        log.warning("rollback of %s on %s failed (%s); if it was prepared, recovery will roll "
                    "it back (presumed abort)", branch.xid, branch.name, error)
        return None

    def _record_heuristic(self, branch: _Branch, code: int) -> None:
        try:
            self._cfg.log.log_heuristic(self.xid, branch.xid, code, branch.name)
        except Exception as e:  # noqa: BLE001 -- still raise the heuristic to the caller
            log.error("could not log heuristic %s of %s: %s", error_name(code), branch.xid, e)

    def _forget(self, branch: _Branch) -> None:
        """A heuristic that matches the decision: nothing to report, let the RM forget it."""
        try:
            branch.resource.forget(branch.xid)
        except Exception as e:  # noqa: BLE001 -- the RM keeps a harmless record
            log.info("forget of %s on %s failed: %s", branch.xid, branch.name, e)

    def _raise_heuristic(self, commit: bool, heuristics: list[tuple[Xid, int]], agreeing: int,
                         cause: BaseException | None = None) -> None:
        codes = {code for _, code in heuristics}
        contrary = XA_HEURRB if commit else XA_HEURCOM
        if XA_HEURMIX in codes or (contrary in codes and agreeing > 0):
            cls: type[HeuristicError] = HeuristicMixedError
            status = Status.UNKNOWN
        elif codes == {contrary}:
            cls = HeuristicRollbackError if commit else HeuristicCommitError
            status = Status.ROLLEDBACK if commit else Status.COMMITTED
        else:
            cls, status = HeuristicHazardError, Status.UNKNOWN
        decision = "commit" if commit else "rollback"
        self._finish(status)
        raise cls(f"transaction {self.xid} was to {decision}, but resources decided otherwise; "
                  "see the recovery log, then forget() the heuristic", xid=self.xid,
                  outcomes=heuristics) from cause

    def _finish(self, status: Status) -> None:
        self._phase = status
        self._finished = True
        for sync in self._syncs:
            try:
                sync.after_completion(status)
            except Exception:  # noqa: BLE001 -- the outcome is final
                log.exception("after_completion of %r failed", sync)

    def _cp(self, point: str, index: int) -> None:
        if self._cfg.checkpoint is not None:
            self._cfg.checkpoint(point, index)


#: :attr:`Transaction._later` once the workers have its phase 2: the caller's commit returns
#: without ending the transaction (its workers end it)
_HANDED_OVER = object()

#: serializes promotions of one-phase transactions (see _OnePhase._become_full); held for no call out
_promoting = _thread.allocate_lock()


class _OnePhase(Transaction):
    """A transaction on its one-phase path: what the manager begins, until something needs more.

    Most transactions of a service touch one database through one pooled session and commit
    it in one phase.  This class runs exactly that, with a third of the state of the general
    path: it begins with nine fields set (no lock, no lists, no branch xid), takes the data
    source's first session (:meth:`_enlist_first`) and commits it in one call
    (``end_and_commit_one_phase``), then gives it back to its pool, all without a lock: like
    a JTA transaction it is used by one thread at a time, the one its manager bound it to
    (the data source finds it through that binding).  Two threads calling it at the same
    instant (one handed the object without a resume) is outside that contract, as it is for
    a JTA transaction; a promotion itself is serialized (``_promoting``).

    Anything else promotes it first (:meth:`_become_full`: the other fields as the general
    path starts them, a lock, and ``__class__`` set to :class:`Transaction`, whose methods
    then run unchanged): a second resource or any other enlistment, a synchronization
    registered (with work before completion or not), a delist, a suspend or a resume (so
    another thread, which can only get it by a resume or from this one, finds it promoted),
    a rollback, a prepare, a branch xid asked for, a crash-test hook, a commit that cannot
    take the one-phase path (rollback-only, expired, the session not in a state to).  Every
    method of :class:`Transaction` not named in :data:`_LEAN_SAFE` promotes before it runs
    (see below the class), so a new method cannot forget to.  ``status``,
    ``set_rollback_only``, ``xid`` and ``finished`` read or write only what this class keeps
    and stay safe from any thread at any time; so does ``_name_sole``, which a session calls
    from inside the lean path's own calls (to start on psycopg2's ``tpc_begin``, or when its
    COMMIT failed) and which must not change the class under them.
    """

    __slots__ = ()  # the layout of Transaction: __class__ may change between the two
    # made by _OnePhase() and its fields set by the begin (see _begin_one_phase): the class called
    # with no arguments costs less than object.__new__ (which packs an argument tuple)
    __init__ = object.__init__

    def _fused_failed(self, e: Exception) -> None:
        """After the sole resource's fused end-and-commit raised ``e`` (in an ``except`` of it;
        the C one-phase path calls it too): sorted out as the general path does; returns after a
        heuristic commit (done), anything else raised."""
        self._become_full()
        self._one_phase_failed(self._promote("ended"), e)  # type: ignore[arg-type]
        self._finish(_COMMITTED)

    def _become_full(self) -> None:
        """The fields this class leaves unset, as the general path has them at this point,
        and the class set to :class:`Transaction` (once; idempotent)."""
        if type(self) is not _OnePhase:
            return  # promoted already (a method of this class bound before the promotion)
        with _promoting:
            if type(self) is not _OnePhase:
                return  # another thread came first
            self._clock = _monotonic
            self._lock = _thread.RLock()
            self._timed_out = False
            self._cause = None
            self._completing = self._phase is not _ACTIVE  # a commit began (see commit)
            self._branches = self._enlisted = _NONE  # type: ignore[assignment]
            # the lean object keeps its one synchronization (with its sole resource) as itself
            sync = None if self._sole is None else self._syncs
            self._syncs = _NONE if sync is None else (sync,)  # type: ignore[assignment]
            self._before = sync is not None and sync.runs_before  # type: ignore[union-attr]
            self._fused = True  # a sole resource came by _enlist_first: it has the fused call
            self.__class__ = Transaction  # type: ignore[assignment]

    def is_expired(self) -> bool:
        deadline = self.deadline
        return deadline is not None and _monotonic() > deadline

    @property
    def rollback_cause(self) -> BaseException | None:
        return None  # a cause is only ever noted by the general path

    @property
    def branch_count(self) -> int:
        """:attr:`Transaction.branch_count` without a promotion: a delivery asks it (is the
        decision carried by a commit mark?) of the transaction its store's branch joined."""
        return 0 if self._sole is None else 1

    def _enlist_first(self, resource: XAResource, sync: Synchronization) -> bool:
        """:meth:`Transaction._enlist_first` without the lock, nor the fields the general path
        keeps (see the class)."""
        if self._sole is not None:
            return False
        deadline = self.deadline
        if (self._phase is not _ACTIVE or self._rollback_only
                or (deadline is not None and _monotonic() > deadline)):
            self._become_full()
            return Transaction._enlist_first(self, resource, sync)  # which says what is wrong
        try:
            resource.start_unnamed(self)  # type: ignore[attr-defined]  # it names the branch by _name_sole
        except XAException as e:
            self._start_refused(resource, e)
        self._sole = resource
        if type(self) is _OnePhase:
            self._syncs = sync  # type: ignore[assignment]  # the one, as itself (see _become_full)
        else:
            self._sole_sync_promoted(sync)
        return True

    # The PostgreSQL data source runs _enlist_first inline for its pooled sessions (see
    # _ConnectionScope.__enter__): the two steps below are what it calls off that path.

    def _start_refused(self, resource: XAResource, e: XAException) -> None:
        """Raise what the refused start of the first resource means (promoted first)."""
        self._become_full()
        self._start_failed(resource, self._name_sole(), e)

    def _sole_sync_promoted(self, sync: Synchronization) -> None:
        """The first resource's synchronization, for a transaction promoted while it started
        (by another thread): what Transaction._enlist_first does."""
        self._fused = True
        if self._syncs is _NONE:
            self._syncs = (sync,)
            if sync.runs_before:  # type: ignore[attr-defined]
                self._before = True
        else:
            self._add_sync(sync)

    def commit(self) -> None:
        """:meth:`Transaction.commit` of a transaction whose one resource came by
        :meth:`_enlist_first`: one call ends and commits it, then its synchronization; any
        other case (and any failure) promotes and goes on as the general path does."""
        sole = self._sole
        deadline = self.deadline
        if (sole is None or self._phase is not _ACTIVE or self._rollback_only
                or self._cfg.checkpoint is not None
                or (deadline is not None and _monotonic() > deadline)):
            self._become_full()
            return Transaction.commit(self)  # which says what is wrong, or commits
        # the one synchronization, as itself (see _enlist_first)
        sync = self._syncs
        if sync.runs_before:  # type: ignore[union-attr]  # a SoleSynchronization: its work first
            try:
                sync.before_completion()  # type: ignore[union-attr]
            except Exception as e:  # noqa: BLE001 -- as the general path's before-completion pass
                _become_full(self)  # (not self._become_full: it may have promoted this object)
                log.warning("before_completion of %r failed; rolling back %s: %s", sync, self.xid, e)
                self._mark_rollback(e)
                self._before = False  # ran (and failed): the general path rolls back, says why
                return Transaction.commit(self)
            if (type(self) is not _OnePhase or self._rollback_only
                    or (self.deadline is not None and _monotonic() > self.deadline)):
                _become_full(self)  # promoted, doomed or expired meanwhile: the general path
                return Transaction.commit(self)
        self._phase = _COMMITTING
        try:
            try:
                # None, unless the session named its branch (psycopg2's tpc_begin takes the xid);
                # the resource runs the synchronization when it is the session's own return to
                # its pool (SYNC_RAN), a frame fewer
                done = sole.end_and_commit_one_phase(self._sole_xid, sync)  # type: ignore[attr-defined]
            except Exception as e:  # noqa: BLE001 -- sorted out as the general path does
                self._fused_failed(e)
                return
            if done:  # what _finish(_COMMITTED) does
                self._phase = _COMMITTED
                self._finished = True
                if done is SYNC_RAN:
                    return
                try:
                    sync.after_completion(_COMMITTED)  # type: ignore[union-attr]
                except Exception:  # noqa: BLE001 -- the outcome is final
                    log.exception("after_completion of %r failed", sync)
                return
            # the session is not in a state to: end and commit apart say why (general path)
            self._become_full()
            self._phase = _PREPARING
            if not self._commit_sole(sole, try_fused=False):
                self._commit()
        finally:
            # a manager's transaction never named was never in its running set: nothing to end
            # (a lean one is always a manager's: begun by _begin_one_phase or its block)
            if self._xid is not None:
                self._leave_completion()


def _begin_one_phase(settings: _Settings, timeout: float | None) -> Transaction:
    """A manager's new transaction with no xid of its own yet: what ``Transaction._new(None,
    settings, timeout)`` makes, as a :class:`_OnePhase` (the nine fields it keeps)."""
    tx = _OnePhase()
    tx._xid = None
    tx._cfg = settings
    if timeout and timeout > 0:
        tx.timeout = timeout
        tx.deadline = _monotonic() + timeout
    else:
        tx.timeout = tx.deadline = None
    tx._phase = _ACTIVE
    tx._rollback_only = False
    tx._finished = False
    tx._sole = None
    tx._sole_xid = None  # a session may name its branch inside the lean path (see _name_sole)
    return tx


#: What a :class:`_OnePhase` runs as :class:`Transaction` defines it: these read or write only
#: the fields it keeps.  Every other method (and property) of Transaction promotes it first.
_LEAN_SAFE = frozenset(("_new", "_setup", "xid", "status", "finished", "set_rollback_only",
                        "_leave_completion", "_name_sole"))


_become_full = _OnePhase._become_full


def _promoting_first(name: str, member: Any) -> Any:
    if isinstance(member, property):
        getter = member.fget
        assert getter is not None

        def get(self: _OnePhase) -> Any:
            _become_full(self)
            return getter(self)

        return property(get, doc=member.__doc__)

    def method(self: _OnePhase, *args: Any, **kwargs: Any) -> Any:
        _become_full(self)  # not self._become_full: a method bound before a promotion may run after it
        return member(self, *args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"_OnePhase.{name}"
    method.__doc__ = member.__doc__
    return method


for _member_name, _member in list(Transaction.__dict__.items()):
    if (_member_name not in _LEAN_SAFE and _member_name not in _OnePhase.__dict__
            and (callable(_member) or isinstance(_member, property))
            and not isinstance(_member, (type, classmethod, staticmethod))
            and not _member_name.startswith("__")):  # __repr__ reads xid and status
        setattr(_OnePhase, _member_name, _promoting_first(_member_name, _member))
del _member_name, _member


def _name(resource: object) -> str:
    return getattr(resource, "resource_name", None) or type(resource).__name__


def _mark_holder(branches: list[_Branch], fence: Any = None) -> _Branch | None:
    """The branch that will carry the commit decision as a mark: the last one enlisted
    whose resource keeps commit marks, or None (then the log carries it).  With a
    ``fence`` (a node claimed in a database) only a resource of that database: a mark
    elsewhere could not be fenced."""
    for branch in reversed(branches):
        if getattr(branch.resource, "holds_commit_marks", False) and (
                fence is None or getattr(branch.resource, "database", None) == fence.database):
            return branch
    return None


def _same_rm(a: XAResource, b: XAResource) -> bool:
    try:
        return bool(a.is_same_rm(b))
    except Exception:  # noqa: BLE001 -- a resource that cannot tell is not the same
        return False
