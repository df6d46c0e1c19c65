"""Commits that return before PostgreSQL flushes their WAL, and the rule for whoever reads them.

A client's record of a reply that answers its caller
(:meth:`~.api.StoreTransaction.wait_for_disk_later`) commits with ``synchronous_commit`` off:
the caller has its reply from the network, so waiting for that commit's WAL flush only delays
it.  What a crash of the PostgreSQL server (or of the machine) may then forget is the record
alone, on the client alone: the restarted client sends the request again, the service answers
with the reply it kept, and the client records and drops it (a consumed call has no callback to
run twice).  That holds only while nothing that read the record has left the process before
the record reached the disk -- an acknowledgement of the reply above all, after which the
service would drop the reply the client may still have to ask for again.

So every store transaction of this process that could have read such a commit ends only once
the WAL is flushed past it: its own durable commit does that when it has a transaction id (an
enqueue's), otherwise the store flushes (one round trip, only then).  SQLite's group commit
keeps the same rule with its own counters (``SqliteStore._finish``).  The rule holds in this
process: another process reading the same store in the moment before the flush (about
``wal_writer_delay``, 200 ms by default) is not held to it; a client's reply sequence is read by
its own process.
"""

from __future__ import annotations

import threading

__all__ = ["LateCommits"]


class LateCommits:
    """Numbers the commits that returned before their flush, and how far a flush covered them.

    Numbered before their COMMIT is sent (a reader whose statements ran meanwhile may have
    read one that committed and has not returned yet: it flushes for it), and counted as
    covered by a flush only once every commit numbered up to it had returned when the flush
    began (:meth:`covered_now`)."""

    __slots__ = ("_lock", "_issued", "_under_way", "_flushed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._issued = 0
        #: numbers whose COMMIT was sent and has not returned
        self._under_way: set[int] = set()
        self._flushed = 0

    def owed(self) -> int:
        """The highest number a transaction ending now may have read, if a flush is owed for it;
        0 when every such commit is known flushed (the common case: one comparison, no lock)."""
        issued = self._issued
        return issued if issued > self._flushed else 0

    def start(self) -> int:
        """A commit that will not wait for its flush is about to be sent: its number."""
        with self._lock:
            self._issued += 1
            self._under_way.add(self._issued)
            return self._issued

    def returned(self, number: int) -> None:
        with self._lock:
            self._under_way.discard(number)

    def covered_now(self) -> int:
        """Up to which number a flush (or a durable commit) beginning now covers every commit:
        those below the first still under way."""
        with self._lock:
            return min(self._under_way) - 1 if self._under_way else self._issued

    def flushed(self, upto: int) -> None:
        """A flush that began when :meth:`covered_now` said ``upto`` has ended."""
        with self._lock:
            if upto > self._flushed:
                self._flushed = upto

    def is_flushed(self, number: int) -> bool:
        return number <= self._flushed
