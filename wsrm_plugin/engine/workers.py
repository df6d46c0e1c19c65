"""The thread every engine worker runs in: do a step, sleep until woken or the poll interval ends.

Work is normally signalled (``wake()`` after a commit that created some), so
a worker reacts at once; the poll interval only bounds how late it notices
work nobody signalled (a retransmission falling due, another process writing
to a shared store).  A step that raises is logged and retried after the
interval: a worker never dies of one bad message or one store hiccup.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["Worker"]

log = logging.getLogger(__name__)


class Worker:
    """Runs ``step`` in a daemon thread; ``step`` returns True when it did something
    (then it runs again at once) and False when idle (then the worker waits)."""

    def __init__(self, name: str, step: Callable[[], bool], interval: float | None) -> None:
        self.name = name
        self._step = step
        self.interval = interval
        self._wakeup = threading.Event()
        #: Work was signalled (:meth:`wake`) since the step began; without it, a wake-up only
        #: has the thread look again at how long to sleep (:meth:`wake_in`).
        self._work = False
        #: Steps due at a time (``time.monotonic()``), by their owners' tokens (:meth:`wake_in`).
        self._due: dict[object, float] = {}
        #: When the thread's current sleep ends (None: not asleep, or until woken).
        self._sleep_until: float | None = None
        #: When :meth:`wake_in` was last called; while it is called again within the time it
        #: asks for (a stream of callers' requests), the thread sleeps in slices of that time
        #: (``_slice``) instead of being woken for each (see :meth:`wake_in`).
        self._asked_at = float("-inf")
        self._slice: float | None = None
        #: When the thread last worked out how long to sleep (a slice that passed without a
        #: :meth:`wake_in` since ends the stream).
        self._looked_at = float("-inf")
        self._due_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0
        #: When (``time.monotonic()``) the step under way started; None between steps.  A step
        #: that never ends (a deadlock, a hung peer without a timeout) is what liveness looks for.
        self.busy_since: float | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        """Waiting, and not woken yet: a wake now would start a step."""
        return self.busy_since is None and not self._wakeup.is_set()

    def wake(self) -> None:
        self._work = True
        self._wakeup.set()

    def wake_in(self, seconds: float, token: object) -> None:
        """Run a step within ``seconds``, not at once, unless :meth:`cancel` of ``token`` comes
        first: for work that falls due then (a request kept for its caller's thread, which the
        sender sends if the caller did not).

        A sleeping thread is woken only to sleep less, and each such wake-up is two thread
        switches on the caller's path (the thread runs, takes the interpreter, goes back to
        sleep) for a request its caller nearly always sends and cancels before its time comes.
        Asked again within ``seconds`` of the last time (a caller's calls back to back, or
        several callers), the thread sleeps in slices of ``seconds`` until a slice passes
        without a call here: each call then falls within a slice already under way and wakes
        nobody (one wake-up a slice instead of one a call).  A slice only shortens a sleep, so a
        step still comes by its time."""
        now = time.monotonic()
        at = now + seconds
        with self._due_lock:
            self._due[token] = at
            if now - self._asked_at < seconds and (self._slice is None or seconds < self._slice):
                self._slice = seconds
            self._asked_at = now
            asleep_past = self._sleep_until is None or self._sleep_until > at
        if self.busy_since is None and asleep_past:
            self._wakeup.set()  # only to sleep less: no step unless the time comes

    def cancel(self, token: object) -> None:
        """The step :meth:`wake_in` asked for under ``token`` is no longer needed."""
        with self._due_lock:
            self._due.pop(token, None)

    def _sleep(self) -> None:
        """Wait until woken with work, the poll interval ends, or a step falls due (:meth:`wake_in`)."""
        poll_at = None if self.interval is None else time.monotonic() + self.interval
        while not self._stopping.is_set():
            now = time.monotonic()
            with self._due_lock:
                fired = [token for token, at in self._due.items() if at <= now]
                for token in fired:
                    del self._due[token]
                if fired:
                    return
                until = min((at for at in (poll_at, *self._due.values()) if at is not None), default=None)
                if self._slice is not None and self._asked_at < self._looked_at:
                    self._slice = None  # a slice passed without a caller: the stream ended
                if self._slice is not None and (until is None or until > now + self._slice):
                    until = now + self._slice
                self._looked_at = now
                self._sleep_until = until
            if poll_at is not None and now >= poll_at:
                return
            woken = self._wakeup.wait(None if until is None else until - now)
            with self._due_lock:
                self._sleep_until = None
            if self._work:
                return
            if woken:
                self._wakeup.clear()  # by wake_in or stop: look again at how long to sleep

    def stop(self, timeout: float = 10.0) -> bool:
        """Ask the thread to finish its step and end; False if it is still running after ``timeout``."""
        thread = self._thread
        if thread is None:
            return True
        self._stopping.set()
        self._wakeup.set()
        thread.join(timeout)
        if thread.is_alive():
            log.warning("worker %s did not stop within %.1fs", self.name, timeout)
            return False
        self._thread = None
        return True

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._work = False
            self._wakeup.clear()
            self.busy_since = time.monotonic()
            try:
                busy = self._step()
            except Exception:  # noqa: BLE001 -- log, wait, try again: the state is in the store
                self.errors += 1
                log.exception("worker %s: step failed; retrying in %.2fs", self.name, self.interval or 0.0)
                busy = False
            self.busy_since = None
            if not busy and not self._stopping.is_set():
                self._sleep()  # interval None: until woken (a pool's extra thread)
