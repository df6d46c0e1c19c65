"""Replies recorded after their call was answered: one thread, in the order they came.

A sequential request-reply caller that reads its reply from the HTTP response waited for the
reply's record (a store transaction) before it had its answer.  On a store whose record costs
a network round trip (PostgreSQL) the call is answered first, and the record is made by this
thread while the caller goes on (``Destination.answer_before_record``): its round trip runs
beside the caller's next transaction instead of before its answer.

One thread, first in first out: the records of one sequence keep their order.  What needs a
reply recorded waits for the records handed over before it, and only those
(:meth:`LaterRecords.wait`): the caller's next claim on the sequence, which finds the request
before it acknowledged only once that request's reply is recorded.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

__all__ = ["LaterRecords"]

log = logging.getLogger(__name__)


class LaterRecords:
    """Jobs run one after the other in a daemon thread started when first needed (each catches
    its own errors: one that raises is logged)."""

    def __init__(self, name: str = "wsrm-reply-records") -> None:
        self._name = name
        self._jobs: deque[Callable[[], None]] = deque()
        self._changed = threading.Condition(threading.Lock())
        self._submitted = 0
        self._done = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` after the jobs submitted before it."""
        with self._changed:
            if self._closed:
                raise RuntimeError("the later records are closed")
            self._jobs.append(job)
            self._submitted += 1
            self._changed.notify_all()
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Jobs waiting or running."""
        with self._changed:
            return self._submitted - self._done

    def wait(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` seconds) until the jobs submitted so far are done; True once
        they are.  Never from a job (it would wait for itself)."""
        with self._changed:
            through = self._submitted
            if self._done >= through:
                return True
            return self._changed.wait_for(lambda: self._done >= through, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Take no more jobs, run those left and end the thread; True once all are done."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            return self._changed.wait_for(lambda: self._done >= self._submitted, timeout)

    def _work(self) -> None:
        changed = self._changed
        while True:
            with changed:
                while not self._jobs:
                    if self._closed:
                        return
                    changed.wait()
                job = self._jobs.popleft()
            try:
                job()
            except BaseException:  # noqa: BLE001 -- a job's own failure must not end the thread
                log.exception("a reply's record after its call was answered failed")
            finally:
                with changed:
                    self._done += 1
                    changed.notify_all()
