"""The future of a reliable in-out call: a caller that waits for it may send its request itself.

A reliable call is stored first and sent by the engine's sender thread, so
its caller's ``result()`` waited for two hand-overs: its request to the
sender's thread, the reply back.  When the caller waits, the first
``result()`` (or ``exception()``) asks the engine to send the request from
the caller's own thread instead (:meth:`ReliableEngine.send_for_caller`,
allowed by :mod:`wsrm_plugin.statemachine.lane` only while no round and no
other caller sends on the sequence); the reply then comes back in that
thread's HTTP response and resolves the future there.  Otherwise nothing
changes: the sender, which the enqueue's commit woke as always, sends it.

A caller that waits with a ``timeout`` shorter than the longest send (the
engine transport's timeout, twice: a stale kept-alive connection is tried
once more) waits as before, so ``result(timeout)`` never overruns.  Code
that never calls ``result()`` (``asyncio.wrap_future``,
``concurrent.futures.wait``) is served by the sender, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["CallFuture"]


class CallFuture(Future):
    """A :class:`concurrent.futures.Future` whose first waiter may send the call's request."""

    def __init__(self) -> None:
        super().__init__()
        self._send: Callable[[], object] | None = None
        self._leave: Callable[[], object] | None = None
        self._longest_send: float | None = None

    def send_when_waited(self, send: Callable[[], object], leave: Callable[[], object],
                         longest: float | None) -> None:
        """``send()`` sends the request from the waiting thread (or declines, leaving it to the
        sender); ``leave()`` leaves it to the sender at once; ``longest`` bounds how long a send
        can take (None: unknown, then only a wait without a timeout sends)."""
        self._send = send
        self._leave = leave
        self._longest_send = longest

    def _send_first(self, timeout: float | None) -> float | None:
        """Send the request from this thread when that is allowed; the timeout left afterwards."""
        send, self._send = self._send, None
        if send is None or self.done():
            return timeout
        longest = self._longest_send
        if timeout is not None and (longest is None or timeout < longest):
            if self._leave is not None:
                self._leave()  # the sender sends it now, not when the caller's grace ends
            return timeout
        started = time.monotonic()
        send()
        return None if timeout is None else max(timeout - (time.monotonic() - started), 0.0)

    def result(self, timeout: float | None = None) -> Any:
        return super().result(self._send_first(timeout))

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return super().exception(self._send_first(timeout))
