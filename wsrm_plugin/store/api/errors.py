"""What the store API raises, and the lock ranks its transactions take in order.

Every store raises the same errors for the same mistakes, so the engine handles a
store's refusal (a duplicate sequence, a lock taken out of order, a store that cannot
write now) one way whichever store it runs on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Lock ranks, in the only order a transaction may take them (seed 004).
RANK_RMD = 0
RANK_INVOKER = 1
RANK_RMS = 2
_RANK_NAMES = {RANK_RMD: "RMD sequence", RANK_INVOKER: "invoker buffer", RANK_RMS: "RMS sequence"}


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------

class StoreError(Exception):
    """Base of every error the store raises."""


class CommitDeclined(Exception):
    """``StoreTransaction.receive_in_order(commits=...)``: the store tried to commit the reply's
    record in its receipt's round trip, and found that something after the receipt would still
    write or refuse.  Nothing of the call was written, the transaction is as before it and usable:
    the caller calls again without ``commits`` (a round trip more), and may stop offering it
    for that sequence.  Not an error: the store's answer to an offer it could not take."""


class DuplicateSequenceError(StoreError):
    """A sequence with that key or identifier already exists."""


class UnknownSequenceError(StoreError, KeyError):
    """No such sequence (the engine answers a peer with the UnknownSequence fault)."""

    def __init__(self, kind: str, ident: str) -> None:
        self.kind = kind
        self.ident = ident
        super().__init__(f"no {kind} sequence {ident!r} in the store")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnknownMessageError(StoreError, KeyError):
    """No such message in the store (never enqueued, or purged)."""

    def __str__(self) -> str:
        return str(self.args[0])


class InvalidAcknowledgementError(StoreError):
    """An acknowledgement names messages this source never sent.

    WS-RM calls this the InvalidAcknowledgement fault; ``numbers`` are the
    offending message numbers (at most the first 20), and nothing was changed.
    """

    def __init__(self, sequence_key: str, numbers: Sequence[int], highest_number: int) -> None:
        self.sequence_key = sequence_key
        self.numbers = tuple(numbers[:20])
        self.highest_number = highest_number
        super().__init__(
            f"acknowledgement for RMS sequence {sequence_key!r} names message numbers "
            f"{list(self.numbers)} that were never sent (highest number handed out: "
            f"{highest_number}); answer the peer with the InvalidAcknowledgement fault")


class MessageNumberRolloverError(StoreError):
    """The sequence has used every message number (WS-RM MessageNumberRollover)."""


class SequenceNotOpenError(StoreError):
    """The source sequence takes no more messages (last message set, closed or faulted)."""


class LockOrderError(StoreError):
    """A transaction asked for locks against the store's lock order (a programming error)."""


class LockTimeoutError(StoreError):
    """A lock could not be had within the store's lock timeout (another transaction holds it).

    The transaction that waited can only roll back (PostgreSQL aborts it; the
    other stores behave the same): roll it back and retry it.
    """


class StoreUnavailableError(StoreError):
    """The store cannot take writes now: its disk is full, its database is down or unreachable.

    Nothing was changed (the transaction rolled back).  Not the caller's
    fault and not the message's: a destination answers "retry later" (HTTP
    503) and an invoker tries the delivery again without counting it as a
    failed attempt of the message.
    """


class InDoubtBranchesError(LockTimeoutError):
    """Prepared XA branches hold the store; recovery must commit or roll them back first."""

    def __init__(self, message: str, xids: Sequence[Any] = ()) -> None:
        self.xids = tuple(xids)
        super().__init__(message)


class TransactionClosedError(StoreError):
    """The store transaction already committed or rolled back."""


class StoreClosedError(StoreError):
    """The storage manager was closed."""


class SchemaVersionError(StoreError):
    """The store's schema is newer than this code understands (or unreadable)."""


class StoreNotFoundError(StoreError):
    """``create=False`` and there is no store there: an operator tool must not invent an
    empty store from a mistyped path and then report it as healthy."""
