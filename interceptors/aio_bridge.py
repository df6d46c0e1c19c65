"""Threads an event loop hands blocking work to, without ever waiting for them itself.

Everything reliable blocks somewhere: a store's write waits for an fsync or a
row lock, a transaction for its two phases, a spyne method for whatever it
does.  An asyncio program gets that work done in a :class:`Lane` of threads
started beforehand: submitting is a put in an unbounded queue, and the
answer comes back through ``loop.call_soon_threadsafe``, so nothing on the
loop waits (not even for a thread to start, as ``run_in_executor`` may).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Lane"]

log = logging.getLogger(__name__)

_STOP = object()


class Lane:
    """``threads`` daemon threads running submitted functions; one thread runs them in order.

    The caller's context variables go along (an OpenTelemetry span current
    in the task is the parent of what the function does).
    """

    def __init__(self, name: str, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError(f"a lane needs at least one thread, not {threads!r}")
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}" if threads > 1 else name, daemon=True)
                         for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` in the lane; the returned future (of the running loop) gets its outcome."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.put((contextvars.copy_context(), fn, args, loop, future))
        return future

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            context, fn, args, loop, future = item
            try:
                result, error = context.run(fn, *args), None
            except BaseException as exc:  # noqa: BLE001 -- handed to the awaiting task
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop is closed: nobody awaits the answer any more
                log.debug("work submitted to a lane finished after its event loop closed")

    def close(self, timeout: float = 10.0) -> None:
        """Finish what was submitted, then end the threads."""
        for _ in self._threads:
            self._queue.put(_STOP)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout)

    @property
    def alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
