"""How many of an engine's sequences are busy: had a one-way call lately.

What the automatic ``RMPolicy.one_way_caller_sends`` decides by.  A one-way caller that sends its
own message returns once the peer answered it: with many sequences busy at once that paces the
callers by the service, so that the two sides work at once instead of the callers storing a
round's messages while the service idles (16 sequences on memory stores, quiet machine: 1.26 of
plain calls from 16 threads, against 0.92 with the sender sending every message).  A caller
alone has nothing to make way for, and loses the sender's pipelining of its sequence over
several connections (one caller: 1.19 of plain calls against 1.34).  The number of sequences
that had a call within :data:`WINDOW` tells the two apart.

Cheap on the caller's path: a call notes its sequence (a dict write under a lock); the count is
taken again when a sequence is new to it and at most every quarter of the window otherwise, not
at every call, and forgets the sequences that went quiet.
"""

from __future__ import annotations

import threading
import time

__all__ = ["BUSY_AT", "WINDOW", "BusySequences"]

#: Seconds since a sequence's last one-way call for it to count as busy.  A caller sending its own
#: messages calls again within milliseconds (a store and an HTTP exchange on loopback); a caller
#: that calls once a second or less has nothing to be paced for.
WINDOW = 1.0
#: Busy sequences from which the automatic setting lets one-way callers send their own messages.
#: One caller keeps the sender's pipelining; at 16 the callers are paced.  Between them, measured
#: (2026-12-01, memory stores, ``bench_compare.py --clients N --calls 1600 --rounds 3 --no-strace
#: --scenarios plainN,memory~one_way_caller_sends=true,memory~one_way_caller_sends=false``, the
#: two interleaved in each round, load 13-32): at 2 sequences the callers' own sends won 1 round
#: of 3 (rates 1.68 against 1.97 of plain 2 threads) and cost the client more CPU in all three
#: (1.05-1.17 against 0.87-1.14 ms a message); at 4 they won all 3 (0.87 against 0.44 of plain 4
#: threads); at 8, 2 of 3 (1.35 against 0.89), at less CPU (CPU ratio 1.29 against 1.19).  A run at
#: load 25-36 split the other way at 4 and 8 (the machine oversubscribed three times over, the
#: callers' pacing by the service's answers lost); the quiet figure at 16 is 0.99 against 0.80.
#: So 4 stays.
BUSY_AT = 4


class BusySequences:
    """The sequences of one engine that had a one-way call within :data:`WINDOW` seconds."""

    def __init__(self, window: float = WINDOW) -> None:
        self._window = window
        self._seen: dict[str, float] = {}
        self._count = 0
        self._next_count = 0.0
        self._lock = threading.Lock()

    def note(self, key: str) -> int:
        """A one-way call on sequence ``key`` now: how many sequences are busy (counted lately)."""
        now = time.monotonic()
        with self._lock:
            new = key not in self._seen
            self._seen[key] = now
            if new or now >= self._next_count:
                cutoff = now - self._window
                self._seen = {k: at for k, at in self._seen.items() if at >= cutoff}
                self._count = len(self._seen)
                self._next_count = now + self._window / 4
            return self._count
