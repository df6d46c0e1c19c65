"""Sets of message numbers kept as merged ranges: the RMD's received set, the RMS's acked set.

A SequenceAcknowledgement is a list of ranges, and a sequence that works well
has one range (1..n) however many messages went through, so ranges are also the
compact way to store the bookkeeping: the size grows with the number of gaps,
not with the number of messages.  The value is immutable so that the state
machines stay pure: ``add`` returns a new value, the caller stores it.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Iterable

from .common import MAX_MESSAGE_NUMBER

__all__ = ["AckRanges"]


def _check_number(number: int) -> int:
    if isinstance(number, bool) or not isinstance(number, int):
        raise TypeError(f"a message number is an int, got {number!r}")
    if not 1 <= number <= MAX_MESSAGE_NUMBER:
        raise ValueError(f"message number {number} is outside 1..{MAX_MESSAGE_NUMBER}")
    return number


@dataclass(frozen=True)
class AckRanges:
    """Message numbers as sorted, disjoint, non-adjacent inclusive ranges.

    The constructor takes the canonical form only (what a store wrote); build
    from a peer's ranges or from loose numbers with :meth:`from_ranges` /
    :meth:`of`, which merge overlapping and adjacent ranges.
    """

    ranges: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        previous_upper = -1
        for pair in self.ranges:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise TypeError(f"each range is a (lower, upper) tuple, got {pair!r}")
            lower, upper = _check_number(pair[0]), _check_number(pair[1])
            if lower > upper:
                raise ValueError(f"range {lower}-{upper} has its lower bound above its upper bound")
            if lower <= previous_upper + 1:
                raise ValueError(
                    f"ranges {self.ranges} are not sorted, disjoint and merged;"
                    " use AckRanges.from_ranges() to normalise them"
                )
            previous_upper = upper

    @classmethod
    def _canonical(cls, ranges: tuple[tuple[int, int], ...]) -> AckRanges:
        """Ranges this class computed from checked ones: canonical by construction, so not
        checked again (the bookkeeping of every message makes several of these)."""
        value = object.__new__(cls)
        object.__setattr__(value, "ranges", ranges)
        return value

    @classmethod
    def from_ranges(cls, pairs: Iterable[tuple[int, int]]) -> AckRanges:
        """Normalise ranges as a peer may send them (any order, overlapping, adjacent)."""
        checked = []
        for lower, upper in pairs:
            # plain ints in order are every well-behaved peer's ranges: checked inline (this
            # runs for each range of every acknowledgement); anything else gets the precise error
            if not (type(lower) is int and type(upper) is int and 1 <= lower <= upper <= MAX_MESSAGE_NUMBER):
                _check_number(lower), _check_number(upper)
                if lower > upper:
                    raise ValueError(f"range {lower}-{upper} has its lower bound above its upper bound")
            checked.append((lower, upper))
        merged: list[tuple[int, int]] = []
        for lower, upper in sorted(checked):
            if merged and lower <= merged[-1][1] + 1:
                if upper > merged[-1][1]:
                    merged[-1] = (merged[-1][0], upper)
            else:
                merged.append((lower, upper))
        return cls._canonical(tuple(merged))

    @classmethod
    def of(cls, numbers: Iterable[int]) -> AckRanges:
        """The ranges holding exactly ``numbers``."""
        return cls.from_ranges((n, n) for n in numbers)

    def __contains__(self, number: object) -> bool:
        if not isinstance(number, int):
            return False
        i = bisect_right(self.ranges, (number, MAX_MESSAGE_NUMBER + 1)) - 1
        return i >= 0 and self.ranges[i][0] <= number <= self.ranges[i][1]

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def add(self, number: int) -> AckRanges:
        """These numbers plus ``number`` (the same value when it is already in: a duplicate)."""
        held = self.ranges
        if held and type(number) is int and number - 1 == held[-1][1] and number <= MAX_MESSAGE_NUMBER:
            # the next number after the highest (a message received in order, each taken in order):
            # the last range grows, nothing to look for
            return AckRanges._canonical((*held[:-1], (held[-1][0], number)))
        _check_number(number)
        if number in self:
            return self
        ranges = list(self.ranges)
        i = bisect_right(ranges, (number, MAX_MESSAGE_NUMBER + 1))  # first range starting after
        joins_left = i > 0 and ranges[i - 1][1] == number - 1
        joins_right = i < len(ranges) and ranges[i][0] == number + 1
        if joins_left and joins_right:
            ranges[i - 1 : i + 1] = [(ranges[i - 1][0], ranges[i][1])]
        elif joins_left:
            ranges[i - 1] = (ranges[i - 1][0], number)
        elif joins_right:
            ranges[i] = (number, ranges[i][1])
        else:
            ranges.insert(i, (number, number))
        return AckRanges._canonical(tuple(ranges))

    def union(self, other: AckRanges) -> AckRanges:
        return AckRanges.from_ranges(self.ranges + other.ranges)

    def difference(self, other: AckRanges) -> AckRanges:
        """Numbers here and not in ``other`` (e.g. the numbers an ack newly acknowledges)."""
        result: list[tuple[int, int]] = []
        theirs = other.ranges
        j = 0
        for lower, upper in self.ranges:
            while j < len(theirs) and theirs[j][1] < lower:
                j += 1
            k = j
            start = lower
            while k < len(theirs) and theirs[k][0] <= upper:
                if theirs[k][0] > start:
                    result.append((start, theirs[k][0] - 1))
                start = max(start, theirs[k][1] + 1)
                k += 1
            if start <= upper:
                result.append((start, upper))
        return AckRanges._canonical(tuple(result))

    @property
    def count(self) -> int:
        """How many numbers (not ranges) are held."""
        return sum(upper - lower + 1 for lower, upper in self.ranges)

    @property
    def highest(self) -> int:
        """The largest number held, 0 when empty."""
        return self.ranges[-1][1] if self.ranges else 0

    @property
    def next_expected(self) -> int:
        """The smallest number not held: the next one in-order delivery waits for."""
        return self.ranges[0][1] + 1 if self.ranges and self.ranges[0][0] == 1 else 1

    def is_complete_up_to(self, last: int) -> bool:
        """True when every number 1..last is held (always true for ``last`` 0)."""
        if last < 0:
            raise ValueError(f"last message number {last} is negative")
        return last == 0 or self.next_expected > last

    def missing_up_to(self, last: int) -> AckRanges:
        """The gaps below ``last`` (what a 1.1 Nack would list)."""
        if last <= 0:
            return AckRanges()
        return AckRanges(((1, last),)).difference(self)

    def __str__(self) -> str:
        if not self.ranges:
            return "none"
        return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges)
