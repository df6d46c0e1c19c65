"""What a reliable zeep client's caller is told when a call cannot be kept.

The faulted-sequence errors are the engine's (:class:`SequenceFaulted`,
:class:`SequenceRefused`, re-exported here); the others belong to the client.
"""

from __future__ import annotations

from wsrm_plugin.engine.source import SequenceFaulted, SequenceRefused

__all__ = ["ReplyNotDelivered", "TransactionNotJoined", "NotAcknowledged", "UnsentMessages",
           "SequenceFaulted", "SequenceRefused"]


class ReplyNotDelivered(Exception):
    """Set on a call's future when its enqueueing transaction rolled back (nothing was sent)."""


class TransactionNotJoined(RuntimeError):
    """A call was made inside a transaction the reliable client cannot join.

    Enqueueing it outside would send the message even when the transaction
    rolls back: the atomicity the caller relies on would be lost silently.
    """


class NotAcknowledged(TimeoutError):
    """:meth:`ReliableClient.flush` ended with messages not acknowledged.

    ``left`` maps each sequence (its id, or its store key while it is being
    created) to its unacknowledged message count; ``faulted`` maps the faulted
    ones to their reason (those will not be acknowledged without a resend).
    """

    def __init__(self, message: str, left: dict[str, int], faulted: dict[str, str]) -> None:
        super().__init__(message)
        self.left = left
        self.faulted = faulted


class UnsentMessages(RuntimeError):
    """``stop()`` on a volatile (memory) store that still holds unacknowledged messages."""

    def __init__(self, message: str, left: dict[str, int]) -> None:
        super().__init__(message)
        self.left = left
