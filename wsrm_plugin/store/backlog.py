"""The memory store's index of its committed source messages: what a backlog asks, without a scan.

A source that cannot reach its peer queues messages; when the peer returns,
every send batch asks for each sequence's first due messages, and every
acknowledgement for the unacknowledged messages in its ranges.  Answered by
walking the sequence's rows, both cost as much as the backlog is long (a send
batch took 22 ms at 100,000 queued against 0.2 ms at 1,000), so draining N
messages cost N squared.  This index answers both from what they touch:

* :class:`SortedNumbers` keeps a sequence's unacknowledged numbers in order
  (new numbers are appended: a sequence numbers its messages upwards), so an
  acknowledgement range finds the ones it names by bisection;
* a heap of ``(next_send_at, number)`` per sequence yields its first due
  messages; a message's entry goes stale when the row changes (a send
  attempt moves its time, an acknowledgement takes it out) and is dropped when
  it reaches the top, or all at once when stale entries outnumber live ones;
* the acknowledged numbers not yet purged, and the sequence each message id
  belongs to (the reply's request, looked up by its id).

The store keeps it up to date as it applies committed rows (under its
mutex); a transaction adds its own staged rows on top.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from typing import Any

__all__ = ["SortedNumbers", "SequenceMessages", "MessageIndex", "in_flight"]

#: A sequence's due heap is rebuilt from its rows when it holds more than twice its unacknowledged
#: messages plus this many entries (the stale ones of rows that moved on).
HEAP_SLACK = 64


class SortedNumbers:
    """A set of ints kept in ascending order: appended at the end in the common case (a number
    above every one held), removed anywhere.

    A removal marks the number gone; the marked numbers leave the list when they reach its
    front (the usual case: acknowledgements take a sequence's lowest numbers), and the list is
    compacted when more than half of it is spent, so each operation costs what it touches.
    """

    __slots__ = ("_items", "_start", "_gone", "_count")

    def __init__(self) -> None:
        self._items: list[int] = []
        self._start = 0
        self._gone: set[int] = set()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, number: int) -> bool:
        if number in self._gone:
            return False
        i = bisect.bisect_left(self._items, number, self._start)
        return i < len(self._items) and self._items[i] == number

    def add(self, number: int) -> None:
        items = self._items
        if number in self._gone:  # still in the list, only marked
            self._gone.discard(number)
            self._count += 1
            return
        if self._start == len(items) or number > items[-1]:
            items.append(number)
        else:
            i = bisect.bisect_left(items, number, self._start)
            if i < len(items) and items[i] == number:
                return
            items.insert(i, number)
        self._count += 1

    def remove(self, number: int) -> None:
        if number not in self:
            return
        self._gone.add(number)
        self._count -= 1
        items, gone = self._items, self._gone
        while self._start < len(items) and items[self._start] in gone:
            gone.discard(items[self._start])
            self._start += 1
        if self._start > 64 and self._start * 2 > len(items):
            del items[:self._start]
            self._start = 0

    def between(self, lo: int, hi: int) -> Iterator[int]:
        """The numbers held from ``lo`` to ``hi``, ascending."""
        items, gone = self._items, self._gone
        i = bisect.bisect_left(items, lo, self._start)
        end = len(items)
        while i < end and items[i] <= hi:
            if items[i] not in gone:
                yield items[i]
            i += 1

    def __iter__(self) -> Iterator[int]:
        gone = self._gone
        return (n for n in self._items[self._start:] if n not in gone)


def in_flight(row: Any) -> bool:
    """Is ``row`` (a message, or None when absent) sent and not yet acknowledged?"""
    return row is not None and not row.acked and row.send_count > 0


class SequenceMessages:
    """One sequence's committed messages, indexed (see the module docstring)."""

    __slots__ = ("unacked", "acked", "due", "in_flight")

    def __init__(self) -> None:
        self.unacked = SortedNumbers()
        self.acked: set[int] = set()
        #: How many unacknowledged messages were sent (a window's count, kept: not walked)
        self.in_flight = 0
        #: (next_send_at, number) of unacknowledged messages; stale entries allowed
        self.due: list[tuple[float, int]] = []

    def __bool__(self) -> bool:
        return bool(len(self.unacked) or self.acked)


class MessageIndex:
    """Every sequence's :class:`SequenceMessages`, and message ids; kept by the store as it
    applies committed ``rms_message`` rows (``rows`` is that table: (key, number) -> row)."""

    def __init__(self, rows: dict[tuple[str, int], Any]) -> None:
        self._rows = rows
        self._sequences: dict[str, SequenceMessages] = {}
        self._by_message_id: dict[str, tuple[str, int]] = {}
        #: rows these queries looked at (for tests that check a batch's cost does not grow with
        #: the backlog)
        self.rows_visited = 0

    # -- kept up to date (the store's mutex held) ---------------------------------------------

    def changed(self, key: tuple[str, int], old: Any, new: Any) -> None:
        """Row ``key`` went from ``old`` to ``new`` (None: absent)."""
        sequence, number = key
        if old is not None and new is None:
            self._by_message_id.pop(old.message_id, None)
        elif new is not None and (old is None or old.message_id != new.message_id):
            if old is not None:
                self._by_message_id.pop(old.message_id, None)
            self._by_message_id[new.message_id] = key
        messages = self._sequences.get(sequence)
        if messages is None:
            if new is None:
                return
            messages = self._sequences[sequence] = SequenceMessages()
        messages.in_flight += in_flight(new) - in_flight(old)
        was_unacked = old is not None and not old.acked
        if old is not None and old.acked:
            messages.acked.discard(number)
        if new is None or new.acked:
            if was_unacked:
                messages.unacked.remove(number)
            if new is not None:
                messages.acked.add(number)
            if not messages:
                del self._sequences[sequence]
            return
        if not was_unacked:
            messages.unacked.add(number)
        if old is None or was_unacked is False or old.next_send_at != new.next_send_at:
            heapq.heappush(messages.due, (new.next_send_at, number))
            if len(messages.due) > 2 * len(messages.unacked) + HEAP_SLACK:
                self._rebuild(sequence, messages)

    def _rebuild(self, sequence: str, messages: SequenceMessages) -> None:
        rows = self._rows
        messages.due = [(rows[(sequence, n)].next_send_at, n) for n in messages.unacked]
        heapq.heapify(messages.due)

    # -- queries (the store's mutex held) ------------------------------------------------------

    def unacked_count(self, sequence: str | None) -> int:
        if sequence is None:
            return sum(len(m.unacked) for m in self._sequences.values())
        messages = self._sequences.get(sequence)
        return len(messages.unacked) if messages is not None else 0

    def in_flight(self, sequence: str) -> int:
        messages = self._sequences.get(sequence)
        return messages.in_flight if messages is not None else 0

    def unacked_in(self, sequence: str, ranges: list[tuple[int, int]]) -> tuple[list[Any], int]:
        """The unacknowledged rows ``ranges`` (ascending, disjoint) name, ascending, and how many
        unacknowledged rows the sequence has: what an acknowledgement reads, in one look."""
        messages = self._sequences.get(sequence)
        if messages is None:
            return [], 0
        rows, unacked = self._rows, messages.unacked
        found = [rows[(sequence, n)] for lo, hi in ranges for n in unacked.between(lo, hi)]
        self.rows_visited += len(found)
        return found, len(unacked)

    def acked(self, sequence: str | None) -> dict[str, list[Any]]:
        """Acknowledged rows not yet purged, by sequence (of one, or all)."""
        rows = self._rows
        keys = [sequence] if sequence is not None else list(self._sequences)
        out: dict[str, list[Any]] = {}
        for key in keys:
            messages = self._sequences.get(key)
            if messages is not None and messages.acked:
                out[key] = [rows[(key, n)] for n in messages.acked]
                self.rows_visited += len(out[key])
        return out

    def may_be_due(self, sequence: str, now: float) -> bool:
        """Has ``sequence`` a heap entry due at ``now`` (perhaps a stale one)?"""
        messages = self._sequences.get(sequence)
        return messages is not None and bool(messages.due) and messages.due[0][0] <= now

    def first_due(self, sequence: str, now: float, count: int) -> list[Any]:
        """Up to ``count`` unacknowledged rows of ``sequence`` due at ``now``, by (next_send_at,
        number): popped off the heap (stale entries dropped), then pushed back."""
        messages = self._sequences.get(sequence)
        if messages is None or count <= 0:
            return []
        heap, rows = messages.due, self._rows
        taken: list[tuple[float, int]] = []
        seen: set[int] = set()
        found: list[Any] = []
        while heap and heap[0][0] <= now and len(found) < count:
            at, number = heapq.heappop(heap)
            self.rows_visited += 1
            row = rows.get((sequence, number))
            if row is None or row.acked or row.next_send_at != at or number in seen:
                continue  # stale: the row moved on since this entry
            seen.add(number)
            taken.append((at, number))
            found.append(row)
        for entry in taken:
            heapq.heappush(heap, entry)
        return found

    def current(self, rows: list[Any]) -> list[Any]:
        """``rows`` as committed now (an absent one left out), in their order."""
        table = self._rows
        found = (table.get((m.sequence_key, m.number)) for m in rows)
        return [m for m in found if m is not None]

    def sequences(self) -> list[str]:
        return list(self._sequences)

    def by_message_id(self, message_id: str) -> Any:
        key = self._by_message_id.get(message_id)
        return self._rows.get(key) if key is not None else None
