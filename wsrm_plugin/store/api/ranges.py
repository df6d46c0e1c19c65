"""Ranges of message numbers: the state machines' :class:`AckRanges`, stored as text
(``"1-5,7"``), with the parse and the format every store uses, so the stored form is
the same in memory, SQLite and PostgreSQL.
"""

from __future__ import annotations

import functools
import re

from ...statemachine.ackranges import AckRanges
from ...statemachine.common import MAX_MESSAGE_NUMBER
from .errors import StoreError

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


def check_number(number: int, what: str = "message number") -> int:
    """Reject anything that is not a WS-RM message number (1 .. 2**63-1)."""
    if isinstance(number, bool) or not isinstance(number, int):
        raise TypeError(f"{what} must be an int, not {type(number).__name__}")
    if not 1 <= number <= MAX_MESSAGE_NUMBER:
        raise ValueError(f"{what} {number} is outside 1..{MAX_MESSAGE_NUMBER}")
    return number


def format_ranges(ranges: AckRanges) -> str:
    """Compact text form, ``"1-5,7,9-12"`` ("" when empty): how the SQL stores keep ranges."""
    return str(ranges) if ranges else ""


def parse_ranges(text: str | None) -> AckRanges:
    """The ranges a SQL store wrote as text (see :func:`format_ranges`).

    Cached: a busy sequence's row is read several times per message with the
    same text ("1-41234"), and the value is immutable."""
    if not text:
        return _NO_RANGES
    return _parse_ranges(text)


_NO_RANGES = AckRanges()


@functools.lru_cache(maxsize=1024)
def _parse_ranges(text: str) -> AckRanges:
    out = []
    for part in text.split(","):
        m = _RANGE_RE.match(part)
        if not m:
            raise StoreError(f"corrupt range list in the store: {text!r}")
        lo = int(m.group(1))
        out.append((lo, int(m.group(2)) if m.group(2) else lo))
    try:
        return AckRanges.from_ranges(out)
    except ValueError as exc:
        raise StoreError(f"corrupt range list in the store: {text!r}: {exc}") from None
