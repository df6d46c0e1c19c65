"""Work a receiving thread does once its HTTP response is written, instead of waking another thread.

A one-way message the service buffers (the memory store's default: ``deliver_on_receive``
answers only) was handed to an invoker thread: the receive woke one, which took the interpreter,
delivered the message and went back to sleep.  At 16 sequences that was about 4.5 thread
switches a message on the service (its invoker threads), a quarter of all it made
(``bench/bench_sequences_cpu.py`` reports them by thread).  The thread that received the
message has nothing else to do once its response is on its way: it delivers the buffer there
(:meth:`InvokerWorker.steps_after_response`), so the acknowledgement still goes out before the
application runs, and no other thread wakes.

The WSGI front ends (:class:`~.transport.RMEndpoint`, the spyne chain's middleware) answer a
request through :func:`answering`: a :func:`collecting` scope around it, and what was deferred
handed to :func:`then`, whose
iterable runs it in ``close()``: PEP 3333's call once the server has written the body (waitress
writes it from the same thread first).  Outside such a scope (a direct ``handle()`` call, a
worker) :func:`defer` says no, and the caller wakes a thread as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

__all__ = ["CLOSES_BEFORE_SENDING", "answering", "collecting", "defer", "run", "then"]

log = logging.getLogger(__name__)

_local = threading.local()

Work = Callable[[], None]


#: A WSGI environ key: true when the server calls the body's ``close()`` before it sends the body
#: (the asyncio front ends: their lane thread hands the answer to the event loop afterwards).
#: Nothing is deferred then, or the acknowledgement would wait for the delivery.
CLOSES_BEFORE_SENDING = "wsrm.closes_before_sending"


@contextlib.contextmanager
def collecting(environ: Mapping[str, Any]) -> Iterator[list[Work]]:
    """While the calling thread answers the request of ``environ``: what :func:`defer` is given
    lands in the yielded list, for :func:`then` (or :func:`run`, should the answer fail)."""
    previous = getattr(_local, "work", None)
    work: list[Work] = []
    _local.work = None if environ.get(CLOSES_BEFORE_SENDING) else work
    try:
        yield work
    finally:
        _local.work = previous


def defer(work: Work) -> bool:
    """Run ``work`` in this thread once its response is written; False when this thread answers
    no request that promises to (then the caller does what it did without)."""
    pending: list[Work] | None = getattr(_local, "work", None)
    if pending is None:
        return False
    pending.append(work)
    return True


def run(work: list[Work]) -> None:
    """Each piece of ``work``, once; one that raises is logged, and the others still run."""
    while work:
        piece = work.pop(0)
        try:
            piece()
        except Exception:  # noqa: BLE001 -- the response went out; nothing to answer with
            log.exception("work deferred until after a response failed")


class _ThenRun:
    """A WSGI response body whose ``close()`` runs the deferred work."""

    def __init__(self, chunks: list[bytes], work: list[Work]) -> None:
        self._chunks = chunks
        self._work = work

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._chunks)

    def __len__(self) -> int:  # a server sets Content-Length from a one-chunk body's length
        return len(self._chunks)

    def close(self) -> None:
        run(self._work)


def then(chunks: list[bytes], work: list[Work]) -> Iterable[bytes]:
    """``chunks`` as a WSGI body that runs ``work`` once written (``chunks`` itself when there is
    none)."""
    return _ThenRun(chunks, work) if work else chunks


def answering(environ: Mapping[str, Any], respond: Callable[[], list[bytes]]) -> Iterable[bytes]:
    """``respond()``'s body, answering the request of ``environ``, that runs what the answer
    deferred once written; should ``respond`` raise, the deferred work runs at once."""
    # collecting()'s work without its context manager (every request a service answers comes here)
    previous = getattr(_local, "work", None)
    later: list[Work] = []
    _local.work = None if environ.get(CLOSES_BEFORE_SENDING) else later
    try:
        body = respond()
    except BaseException:
        _local.work = previous
        run(later)
        raise
    _local.work = previous
    return then(body, later)
