"""Work handed to a few threads that the caller does not wait for, and the waits for it.

Two parts of the project hand work over this way: the second phases run after their caller
returned at the decision (:mod:`.phase_two`: several threads, whose concurrent ``COMMIT
PREPARED`` statements share PostgreSQL's WAL flushes) and, in the reliable-messaging engine, the
replies recorded after their call was answered (``wsrm_plugin.engine.later_records``: one
thread, so the records keep their order).  Both need the same queue: threads started when first
needed, at most a bound; a job that raises logged, not ending its thread; an end that runs what
is left; and two waits: until nothing waits or runs (an engine's stop), or until the jobs handed
over so far are done, whatever comes after them (a caller that must see what those wrote).  It
lives here because the engine builds on the transaction manager, never the other way round.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

__all__ = ["JobThreads"]

log = logging.getLogger(__name__)

Job = Callable[[], None]


class JobThreads:
    """The threads that run the jobs handed to them (:meth:`submit`), first in first out, at most
    ``threads`` at once, started when first needed: daemon threads, so a process may exit with
    jobs left (each user says what becomes of those).  One thread is named ``name``; several are
    ``name-1``, ``name-2``...  A job catches its own errors: one that raises is logged (by
    :attr:`logger`, with :attr:`failure`), and its thread goes on."""

    #: Where a job that raised is logged (a user's own module's logger), and what it says.
    logger = log
    failure = "a job handed to a thread failed"

    def __init__(self, threads: int = 1, name: str = "job-threads") -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self._limit = threads
        self._name = name
        lock = threading.Lock()
        #: idle threads wait on this for a job (or the end)...
        self._work = threading.Condition(lock)
        #: ...and callers of the waits on this, for jobs done: neither wakes the other
        self._finished = threading.Condition(lock)
        #: by the ordinal of their submission
        self._jobs: deque[tuple[int, Job]] = deque()
        self._running: set[int] = set()
        self._submitted = 0
        self._threads = 0
        self._idle = 0
        self._closed = False

    def submit(self, job: Job) -> None:
        """Run ``job`` in one of the threads, after those submitted before it have started."""
        with self._work:
            if self._closed:
                raise RuntimeError(f"{self._name} is closed")
            self._jobs.append((self._submitted, job))
            self._submitted += 1
            if self._idle:
                self._work.notify()
                return
            if self._threads >= self._limit:
                return
            self._threads += 1
            name = self._name if self._limit == 1 else f"{self._name}-{self._threads}"
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    @property
    def pending(self) -> int:
        """Jobs waiting or running."""
        with self._work:
            return len(self._jobs) + len(self._running)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` seconds) until the jobs submitted so far are done, not those
        submitted meanwhile; True once they are.  Never from a job (it would wait for itself)."""
        with self._finished:
            through = self._submitted
            return self._finished.wait_for(lambda: self._first_open() >= through, timeout)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` seconds) until no job waits or runs; True if none does."""
        with self._finished:
            return self._finished.wait_for(lambda: not self._jobs and not self._running, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Take no more jobs, run those left and let the threads end; True once all are done."""
        with self._work:
            self._closed = True
            self._work.notify_all()
        return self.drain(timeout)

    def _first_open(self) -> int:
        """The ordinal of the first job not done yet (the next one's when all are): the jobs
        start in order, so a running one is before every waiting one."""
        if self._running:
            return min(self._running)
        return self._jobs[0][0] if self._jobs else self._submitted

    def _serve(self) -> None:
        work = self._work
        while True:
            with work:
                while not self._jobs:
                    if self._closed:
                        self._threads -= 1
                        return
                    self._idle += 1
                    work.wait()
                    self._idle -= 1
                ordinal, job = self._jobs.popleft()
                self._running.add(ordinal)
            try:
                job()
            except BaseException:  # noqa: BLE001 -- a job's own failure must not end the thread
                self.logger.exception(self.failure)
            finally:
                with work:
                    self._running.discard(ordinal)
                    self._finished.notify_all()
