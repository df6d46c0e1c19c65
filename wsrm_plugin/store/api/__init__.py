"""The WS-RM storage API: where every sequence's state lives between events.

Seed 004 (WSO2 Mercury, section 3.4.3) keeps the state of the reliable
messaging engine in a store, not in objects: each event (a message from the
application, an acknowledgement from the peer, a tick of a worker) is a short
*transaction* that reads the state, applies the state machine and writes the
state back.  Because the store is transactional, and because it can take part
in an XA transaction, a user's "update my database AND enqueue this message"
commits atomically.

The shape follows Mercury (and CXF's ``RMStore``):

* :class:`StorageManager` opens :class:`StoreTransaction` objects;
* a transaction gives four managers: :attr:`StoreTransaction.rms` (source
  sequences), :attr:`StoreTransaction.rms_messages` (the retransmission queue),
  :attr:`StoreTransaction.rmd` (destination sequences) and
  :attr:`StoreTransaction.invoker` (the buffer between the destination and the
  application);
* records are frozen dataclasses: a manager hands out copies and takes changes
  through its methods, so nothing changes behind the transaction's back.

Lock order
----------
Two transactions that lock the same things in different orders deadlock.
Seed 004's rule, kept here: **RMD sequence, then invoker buffer, then RMS**.
A transaction may skip a level, never go back up: every manager method that
locks says so, and a transaction that asks for a lock of a lower rank after
a higher one (e.g. an RMD sequence after an RMS sequence) gets
:class:`LockOrderError` at once, in every store, instead of a deadlock some day
in production.  Methods that only list or count (``needing_work``,
``count_unacked``, ``status``...) take no lock and see committed data plus the
transaction's own changes.

Pollers (``due_messages``, ``claim_next``) skip rows another transaction holds
(SQL ``FOR UPDATE SKIP LOCKED``), so several workers can share one store.

Time is wall-clock seconds (``time.time()``), because it is stored and must
mean the same after a restart; every method that stamps a time takes an
optional ``now`` so tests and workers can pass their own clock.

The package's modules: :mod:`.protocols` (the storage manager, its transactions
and their four managers, as abstract classes), :mod:`.records` (what they hand
out), :mod:`.errors` (what they raise, and the lock ranks), :mod:`.ranges`
(message numbers as stored text) and :mod:`.rules` (checks every store applies
before it writes).
"""

from __future__ import annotations

from .errors import (
    RANK_INVOKER,
    RANK_RMD,
    RANK_RMS,
    CommitDeclined,
    DuplicateSequenceError,
    InDoubtBranchesError,
    InvalidAcknowledgementError,
    LockOrderError,
    LockTimeoutError,
    MessageNumberRolloverError,
    SchemaVersionError,
    SequenceNotOpenError,
    StoreClosedError,
    StoreError,
    StoreNotFoundError,
    StoreUnavailableError,
    TransactionClosedError,
    UnknownMessageError,
    UnknownSequenceError,
)
from .protocols import (
    ConditionManager,
    InvokerBufferManager,
    ManagerOnFirstUse,
    RmdSequenceManager,
    RmsMessageManager,
    RmsSequenceManager,
    StorageManager,
    StoreTransaction,
    _Manager,
    _status_of,
    exit_global,
    refuse_if_global,
)
from .ranges import MAX_MESSAGE_NUMBER, AckRanges, check_number, format_ranges, parse_ranges
from .records import (
    BufferedMessage,
    InvokerSequence,
    NodeCondition,
    PoisonMessage,
    RmdSequence,
    RmdSequenceStatus,
    RmsMessage,
    RmsSequence,
    RmsSequenceStatus,
    StoreStatus,
    _now,
    buffered_of,
    delivered_for_retry,
    poison_of,
)
from .rules import check_ack, check_enqueue, check_key
from .states import rmd_state_name, rms_state_name

__all__ = [
    # errors
    "StoreError", "DuplicateSequenceError", "UnknownSequenceError",
    "UnknownMessageError", "InvalidAcknowledgementError", "MessageNumberRolloverError",
    "SequenceNotOpenError", "LockOrderError", "LockTimeoutError", "InDoubtBranchesError",
    "TransactionClosedError", "SchemaVersionError", "StoreClosedError", "StoreNotFoundError", "CommitDeclined",
    # records
    "RmsSequence", "RmsMessage", "RmdSequence", "BufferedMessage", "InvokerSequence", "PoisonMessage",
    "NodeCondition",
    "RmsSequenceStatus", "RmdSequenceStatus", "StoreStatus",
    # ranges
    "AckRanges", "MAX_MESSAGE_NUMBER", "check_number", "format_ranges", "parse_ranges",
    # API
    "RANK_RMD", "RANK_INVOKER", "RANK_RMS",
    "RmsSequenceManager", "RmsMessageManager", "RmdSequenceManager", "InvokerBufferManager", "ConditionManager",
    "StoreTransaction", "StorageManager", "StoreUnavailableError",
    # shared by the stores (not part of the public API)
    "ManagerOnFirstUse", "_Manager", "_now", "_status_of", "buffered_of", "check_ack", "check_enqueue", "check_key",
    "delivered_for_retry", "exit_global", "poison_of", "refuse_if_global", "rmd_state_name", "rms_state_name",
]
