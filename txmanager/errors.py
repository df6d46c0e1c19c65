"""What can go wrong with a transaction, as exceptions an application can act on.

The names follow JTA (``RollbackException``, ``HeuristicMixedException``, ...)
so that a reader who knows Narayana or Atomikos knows what each one promises:

* :class:`RollbackError` -- the transaction did NOT commit; every branch was
  (or will be, by presumed abort) rolled back.  Safe to retry the whole unit
  of work.
* :class:`HeuristicError` and subclasses -- a resource manager decided a
  branch on its own, against or without the coordinator's decision.  The
  outcome is no longer atomic (or not known to be); an operator must look.
  The recovery log keeps a record until someone calls ``forget``.
* :class:`IllegalStateError` -- the call makes no sense in the transaction's
  current state (a programming error: commit without begin, enlist after
  prepare ...).  Nothing was changed.
"""

from __future__ import annotations

from collections.abc import Iterable

from .xa import error_name
from .xid import Xid

__all__ = [
    "TransactionError",
    "RollbackError",
    "TransactionTimeoutError",
    "HeuristicError",
    "HeuristicMixedError",
    "HeuristicRollbackError",
    "HeuristicCommitError",
    "HeuristicHazardError",
    "IllegalStateError",
    "NotSupportedError",
    "RecoveryLogError",
    "LogLockedError",
    "PreparedTransactionsDisabledError",
]


class TransactionError(Exception):
    """Base of every error raised by the transaction manager."""


class RollbackError(TransactionError):
    """The transaction was rolled back instead of committed.

    ``cause`` is the exception that forced the rollback (a resource's "no"
    vote, a failed ``before_completion``, ...) or None when the transaction was
    simply marked rollback-only.
    """

    def __init__(self, message: str, *, xid: Xid | None = None,
                 cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.xid = xid
        self.cause = cause


class TransactionTimeoutError(RollbackError):
    """The transaction outlived its timeout, so it was rolled back."""


class HeuristicError(TransactionError):
    """A resource manager completed a branch on its own (an X/Open heuristic).

    ``xid`` is the global transaction; ``outcomes`` lists ``(branch xid,
    XA_HEUR* code)`` for every branch that reported a heuristic.  The record
    stays in the recovery log until ``RecoveryManager.forget`` is called.
    """

    def __init__(self, message: str, *, xid: Xid | None = None,
                 outcomes: Iterable[tuple[Xid, int]] = ()) -> None:
        self.xid = xid
        self.outcomes: tuple[tuple[Xid, int], ...] = tuple(outcomes)
        detail = ", ".join(f"{b}={error_name(c)}" for b, c in self.outcomes)
        super().__init__(f"{message} [{detail}]" if detail else message)


class HeuristicMixedError(HeuristicError):
    """Some branches committed and some rolled back: the outcome is not atomic."""


class HeuristicRollbackError(HeuristicError):
    """The decision was commit, but every branch that answered was rolled back."""


class HeuristicCommitError(HeuristicError):
    """The decision was rollback, but every branch that answered was committed."""


class HeuristicHazardError(HeuristicError):
    """The outcome of at least one branch is unknown (it may have been lost)."""


class IllegalStateError(TransactionError):
    """The call is not valid in the transaction's (or thread's) current state."""


class NotSupportedError(TransactionError):
    """The request needs a feature this manager does not offer (nested transactions)."""


class RecoveryLogError(TransactionError):
    """The recovery log cannot be opened, read or written."""


class LogLockedError(RecoveryLogError):
    """Another process (or another open in this one) holds the recovery log."""


class PreparedTransactionsDisabledError(TransactionError):
    """A database cannot take part in two-phase commit: PostgreSQL's
    ``max_prepared_transactions`` is 0 (its default), so PREPARE TRANSACTION
    fails.  Raised when the data source or resource is created or first
    connects -- before any work is accepted -- rather than at the first
    commit, after messages were acknowledged."""
