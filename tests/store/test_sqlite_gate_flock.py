"""The SQLite store's file gate takes and gives back its flock without letting the interpreter go.

Both calls never block (``LOCK_NB``, ``LOCK_UN``); ``fcntl.flock`` lets the interpreter go around
them anyway, and in a process whose other threads compute, the thread taking the store's file
then waits to run again, up to the switch interval, while the file waits for it.
"""

from __future__ import annotations

import fcntl
import os
import sys
import threading
from pathlib import Path

from wsrm_plugin.store import sqlite as sqlite_store


def test_no_other_thread_runs_during_the_gates_flock_calls(tmp_path: Path) -> None:
    """With a switch interval nobody reaches, another thread that wants the interpreter gets it
    only when this one lets it go: 40,000 of the gate's flock calls must not let it."""
    fd = os.open(tmp_path / "store.db.lock", os.O_RDWR | os.O_CREAT, 0o600)
    ran: list[int] = []
    hold, done = threading.Lock(), threading.Event()
    interval = sys.getswitchinterval()

    def other() -> None:
        with hold:  # released by the main thread, which keeps the interpreter: this one waits for it
            ran.append(1)
        done.wait()

    hold.acquire()
    thread = threading.Thread(target=other)
    thread.start()  # runs until it waits for ``hold``
    try:
        sys.setswitchinterval(1000.0)
        hold.release()  # the other thread wants the interpreter from now on
        for _ in range(20000):
            sqlite_store._flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            sqlite_store._flock(fd, fcntl.LOCK_UN)
        seen = list(ran)
    finally:
        sys.setswitchinterval(interval)
        done.set()
    thread.join(30)
    os.close(fd)
    assert ran == [1]  # it did run, once this thread let the interpreter go
    assert seen == []
