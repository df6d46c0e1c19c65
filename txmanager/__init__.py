"""A small XA transaction manager with a durable recovery log (see README).

The pieces, each in its own module: :mod:`.xid` and :mod:`.xa` (the X/Open
contract), :mod:`.transaction` (one transaction and the commit protocol),
:mod:`.manager` (thread-bound transactions), :mod:`.log` (the recovery log),
:mod:`.recovery` (finishing in-doubt branches), :mod:`.phase_two` (a commit that
returns at its decision, phase 2 by worker threads), :mod:`.memory` (an in-memory
XA resource), :mod:`.errors`.  Node names for several processes of one host:
:mod:`.slots`; for several hosts on one PostgreSQL database: :mod:`.nodes`
(claims in :mod:`.lease`, decisions in :mod:`.dblog`).
"""

from .errors import (
    HeuristicCommitError, HeuristicError, HeuristicHazardError, HeuristicMixedError,
    HeuristicRollbackError, IllegalStateError, LogLockedError, NotSupportedError,
    PreparedTransactionsDisabledError, RecoveryLogError, RollbackError, TransactionError, TransactionTimeoutError,
)
from .log import LogEntry, MemoryLog, RecoveryLog
from .manager import TransactionManager
from .memory import MemoryResource, MemoryStore
from .recovery import InDoubt, RecoveryManager, RecoveryReport
from .transaction import CHECKPOINTS, PreparedBranch, Status, Synchronization, Transaction
from .xa import XAException, XAResource
from .xid import FORMAT_ID, Xid

__all__ = [
    "FORMAT_ID", "XAException", "XAResource", "Xid",
    "TransactionManager", "Transaction", "PreparedBranch", "Status", "Synchronization", "CHECKPOINTS",
    "RecoveryLog", "MemoryLog", "LogEntry", "RecoveryManager", "RecoveryReport", "InDoubt",
    "MemoryResource", "MemoryStore",
    "TransactionError", "RollbackError", "TransactionTimeoutError", "HeuristicError",
    "HeuristicMixedError", "HeuristicRollbackError", "HeuristicCommitError",
    "HeuristicHazardError", "IllegalStateError", "NotSupportedError", "RecoveryLogError",
    "LogLockedError", "PreparedTransactionsDisabledError",
]
