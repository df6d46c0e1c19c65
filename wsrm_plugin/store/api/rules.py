"""Rules every store applies the same way before it writes: keys, enqueues and
acknowledgements are checked here once, so a store cannot accept what another refuses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ...statemachine.ackranges import AckRanges
from ...statemachine.common import MAX_MESSAGE_NUMBER
from .errors import InvalidAcknowledgementError, MessageNumberRolloverError, SequenceNotOpenError
from .records import RmsSequence
from .states import rms_life


def check_key(value: str, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, not {value!r}")


def check_enqueue(seq: RmsSequence, payload: bytes) -> int:
    """The number the next message of ``seq`` gets, or why it gets none."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"payload must be the SOAP envelope as bytes, not {type(payload).__name__}")
    if not rms_life(seq).accepts_messages:
        if seq.faulted:
            why = "is faulted" + (f" ({seq.fault_reason})" if seq.fault_reason else "")
        elif seq.last_message:
            why = f"already has its last message (number {seq.last_number})"
        elif seq.closed or seq.close_sent:
            why = "is closed"
        else:
            why = "is terminated"
        raise SequenceNotOpenError(
            f"RMS sequence {seq.key!r} {why}: it takes no more messages; start a new sequence")
    if seq.next_number > MAX_MESSAGE_NUMBER:
        raise MessageNumberRolloverError(
            f"RMS sequence {seq.key!r} has used every message number up to "
            f"{MAX_MESSAGE_NUMBER}; terminate it and start a new sequence")
    return seq.next_number


def check_ack(seq: RmsSequence, ranges: AckRanges,
              unsent_between: Callable[[int, int], Iterable[int]]) -> None:
    """Raise InvalidAcknowledgement when ``ranges`` name a number never sent.

    "Never sent" is either above the highest number handed out, or a stored
    message not transmitted yet (``unsent_between(lo, hi)`` lists those).  A
    number below ``next_number`` that is no longer stored was purged, which
    only happens after it was acknowledged, so a repeated ack of it is fine.
    """
    highest = seq.highest_number
    bad: list[int] = []
    for lo, hi in ranges.ranges:
        if hi > highest:
            first = max(lo, highest + 1)
            bad.extend(range(first, min(hi, first + 19) + 1))
    if not bad:
        for lo, hi in ranges.ranges:
            bad.extend(unsent_between(lo, hi))
    if bad:
        raise InvalidAcknowledgementError(seq.key, sorted(set(bad)), highest)
