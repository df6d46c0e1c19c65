"""The interpreter's switch interval while a service serves from a SQLite store.

A SQLite store's transaction owns the whole file (:mod:`wsrm_plugin.store.sqlite`), and
delivering on receipt it owns it through the application too: the file's holder is the
service's one serial path.  Inside that hold the holder lets go of the interpreter many times:
Python's ``sqlite3`` releases the GIL around every statement, and the application's own
database driver around its commit (psycopg2: the round trip and the WAL flush).  While it has
let go, the service's other threads (HTTP threads parsing the next requests, the sender) take
the interpreter and compute; when the holder's call returns, CPython makes it wait for the
interpreter until the running thread drops it, which a computing thread does only when the
*switch interval* runs out (``sys.setswitchinterval``, 5 ms by default).  Those waits are
inside the file's hold, so they bound the rate of every sequence at once.

So a service that serves (``serve()``, the built-in HTTP server) from a SQLite store shortens
the interval to :data:`AUTOMATIC_SWITCH_INTERVAL` while it serves.  It is process-global state,
which a library should not touch lightly, hence:

* only where it was measured to help (a SQLite store; memory and PostgreSQL stores were not
  helped: 0.93 against 0.96 and 0.88 against 0.84 of their baselines) and only from ``serve()``,
  where the process is a service serving this engine's store, not a client inside somebody's
  application;
* never over a value the application chose: if the interval is not Python's default when the
  first engine serves, it is left as it is;
* logged once at INFO when changed, and put back when the last engine that changed it stops
  (unless someone changed it again meanwhile);
* ``RMPolicy.interpreter_switch_interval`` decides: False leaves the interpreter alone, seconds
  set that interval while serving from any store (the application's explicit choice).
"""

from __future__ import annotations

import logging
import sys
import threading

__all__ = ["AUTOMATIC_SWITCH_INTERVAL", "PYTHON_SWITCH_INTERVAL", "Claim", "claim"]

log = logging.getLogger(__name__)

#: CPython's default ``sys.getswitchinterval()``.
PYTHON_SWITCH_INTERVAL = 0.005
#: The interval a service serving from a SQLite store runs with unless told
#: (``RMPolicy.interpreter_switch_interval`` None).  bench_compare --clients 16 --calls 3200,
#: SQLite stores, interleaved rounds in one run: 1 ms 0.79 of plain 16 threads against 0.74 at
#: Python's 5 ms (quiet, load 0.1; rounds 0.69/0.79/0.79 against 0.65/0.74/0.76), the service's
#: file held 1.56 ms a message against 1.68.  On a machine loaded 4-17 by other work (2 cores) it
#: was a coin toss: 12 interleaved pairs of rounds in three runs, 1 ms against 5 ms 0.52-1.40,
#: median 0.95 (the forced hand-overs wait for the scheduler there).
AUTOMATIC_SWITCH_INTERVAL = 0.001

_lock = threading.Lock()
#: Engines serving with the interval this module set (their :class:`Claim` not released).
_claims = 0
#: The interval before this module first set it, and the one it set (None: it set none).
_before: float | None = None
_set: float | None = None


def _same(a: float, b: float) -> bool:
    return abs(a - b) < 1e-9  # CPython keeps it in microseconds


class Claim:
    """One serving engine's hold on the interval it set; :meth:`release` when it stops."""

    def __init__(self) -> None:
        self._released = False

    def release(self) -> None:
        """The last engine's release puts back the interval from before, if it is still ours."""
        global _claims, _before, _set
        with _lock:
            if self._released:
                return
            self._released = True
            _claims -= 1
            if _claims or _set is None or _before is None:
                return
            if _same(sys.getswitchinterval(), _set):
                sys.setswitchinterval(_before)
            _before = _set = None


def claim(asked: float | bool | None, file_store: bool) -> Claim | None:
    """Set the switch interval for a service starting to serve; None where it is left alone.

    ``asked`` is ``RMPolicy.interpreter_switch_interval``: None sets
    :data:`AUTOMATIC_SWITCH_INTERVAL` where ``file_store`` (the store is one file held by one
    transaction at a time) and the interval is Python's default or one this module set; False
    sets nothing; seconds set those, whatever the store."""
    global _claims, _before, _set
    if asked is False or (asked is None and not file_store):
        return None
    interval = AUTOMATIC_SWITCH_INTERVAL if asked is None else float(asked)
    with _lock:
        current = sys.getswitchinterval()
        ours = _set is not None and _same(current, _set)
        if asked is None and not ours and not _same(current, PYTHON_SWITCH_INTERVAL):
            return None  # the application chose its own: kept
        if not _same(current, interval):
            sys.setswitchinterval(interval)
            log.info("serving from a %s: the interpreter's switch interval %g -> %g s, so that the "
                     "thread holding the store gets the interpreter back sooner "
                     "(RMPolicy.interpreter_switch_interval=False leaves it)",
                     "SQLite store" if file_store else "store", current, interval)
        if not ours:
            _before = current
        _set = interval
        _claims += 1
        return Claim()
