"""How long the event loop's callbacks take: the measure of "the bridge never blocks the loop".

asyncio's debug mode logs callbacks slower than ``slow_callback_duration``;
this records every one instead, so a test can print and assert the slowest.
Every callback the loop runs (a task's step, a ``call_soon``, a future's
done-callback) is an ``asyncio.Handle`` whose ``_run`` this wraps while the
watch is on.  Both the wall-clock time and the thread's CPU time are kept:
a callback can take wall time without working when the loop's thread waits
for the GIL another thread holds (an engine thread), which says nothing of
the callback; a callback that blocks (a lock, a socket, an fsync) takes wall
time in its own wait.  On Linux the slowest callback's wall time is split
further with the thread's scheduler statistics (``/proc/thread-self/schedstat``):
time on a CPU, time runnable but waiting for a CPU (a loaded machine), and the
rest, asleep (waiting for the GIL, or blocked).

Those times are reported, not asserted: on a loaded machine a callback's
times grow with whatever else runs (a garbage collection in the callback, a
cache another process emptied), so what tests assert is what ran.  The watch
profiles the loop's thread while a callback runs and keeps every call into
code that has no business on an event loop (:data:`OFF_LOOP`): the engine,
the store, the transaction manager, zeep's serializers, a database driver,
HTTP, an import (a file read), a sleep or an fsync.  A bridge that ran any
of them on the loop would make it wait, however fast the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

#: Modules whose Python code must never run in a loop callback (a name and its submodules) ...
OFF_LOOP = ("wsrm_plugin", "txmanager", "interceptors", "zeep", "lxml", "sqlite3", "psycopg2", "requests",
            "urllib3", "httpx", "httpcore", "http", "socket", "ssl", "importlib", "opentelemetry")
#: ... but for these, which only queue the call or look something up in memory.
ON_LOOP = ("interceptors.zeep_client.aio", "interceptors.aio_bridge", "zeep.proxy")
#: Calls allowed with all they call: look-ups in memory (the operation's name in zeep's parsed WSDL;
#: the transaction each live manager has bound to this thread, which a call must refuse).
LOOKUPS = frozenset({"interceptors.zeep_client.client._Service.__getattr__",
                     "txmanager.manager.current_transactions"})
#: Built-in functions that block (C code: no Python frame of their own).
OFF_LOOP_BUILTINS = frozenset({"time.sleep", "posix.fsync", "posix.fdatasync", "posix.sync", "select.select",
                               "select.poll", "_socket.getaddrinfo"})


def _off_loop(module: str, qualname: str) -> bool:
    name = f"{module}.{qualname}"
    if any(name == allowed or name.startswith(allowed + ".") for allowed in ON_LOOP):
        return False
    return any(module == banned or module.startswith(banned + ".") for banned in OFF_LOOP)


@dataclass
class LoopWatch:
    callbacks: int = 0
    slowest_wall: float = 0.0
    slowest_cpu: float = 0.0
    slowest_what: str = ""
    over_ms_wall: int = 0
    walls: list[float] = field(default_factory=list)
    #: the slowest callback's wall time split: (on a CPU, waiting for a CPU, asleep), seconds
    slowest_split: tuple[float, float, float] | None = None
    #: the longest any one callback slept (waiting for the GIL, or blocked): what blocking shows as
    slowest_asleep: float = 0.0
    #: calls made in a loop callback that belong off the loop (see OFF_LOOP), by name: none expected
    off_loop_calls: Counter[str] = field(default_factory=Counter)

    def report(self) -> str:
        walls = sorted(self.walls)
        p999 = walls[int(len(walls) * 0.999)] if walls else 0.0
        split = ""
        if self.slowest_split is not None:
            on, queued, asleep = (1000 * x for x in self.slowest_split)
            split = f" = {on:.3f} on a CPU + {queued:.3f} waiting for a CPU + {asleep:.3f} asleep (GIL or blocked)"
        return (f"{self.callbacks} loop callbacks; slowest {self.slowest_wall * 1000:.3f} ms wall{split} "
                f"({self.slowest_what}), slowest on-CPU {self.slowest_cpu * 1000:.3f} ms, "
                f"longest asleep in one callback {self.slowest_asleep * 1000:.3f} ms, "
                f"99.9th percentile {p999 * 1000:.3f} ms wall, {self.over_ms_wall} over 1 ms wall; "
                f"{sum(self.off_loop_calls.values())} call(s) that belong off the loop "
                f"{dict(self.off_loop_calls.most_common(10))}")


@contextlib.contextmanager
def watch_loop() -> Iterator[LoopWatch]:
    watch = LoopWatch()
    original = asyncio.Handle._run
    stats = threading.local()

    def schedstat() -> tuple[int, int]:
        """(ns on a CPU, ns runnable and waiting) of this thread, or (0, 0) where unknown."""
        fd = getattr(stats, "fd", None)
        if fd is None:
            try:
                fd = stats.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            except OSError:
                fd = stats.fd = -1
        if fd < 0:
            return 0, 0
        on_cpu, waiting, _ = os.pread(fd, 128, 0).split()
        return int(on_cpu), int(waiting)

    def collecting(phase: str, info: dict[str, Any]) -> None:
        # a garbage collection the loop's allocations set off finalizes whatever it finds (a
        # connection pool the engine dropped, say): not the bridge's doing, and no wait of its
        stats.in_gc = phase == "start"

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        """Notes the outermost call into off-loop code of each call chain of a callback."""
        if getattr(stats, "in_gc", False):
            return
        if not getattr(stats, "in_callback", False) or getattr(stats, "off_loop_depth", 0):
            if getattr(stats, "off_loop_depth", 0) and event in ("call", "return"):
                stats.off_loop_depth += 1 if event == "call" else -1
            return
        if event == "call":
            module = frame.f_globals.get("__name__") or ""
            name = f"{module}.{frame.f_code.co_qualname}"
            if name in LOOKUPS:
                stats.off_loop_depth = 1
            elif _off_loop(module, frame.f_code.co_qualname):
                watch.off_loop_calls[name] += 1
                stats.off_loop_depth = 1  # what it calls in turn is its own business
        elif event == "c_call":
            name = f"{getattr(arg, '__module__', None)}.{getattr(arg, '__qualname__', '?')}"
            if name in OFF_LOOP_BUILTINS:
                watch.off_loop_calls[name] += 1

    def timed(handle: asyncio.Handle) -> None:
        before = schedstat()
        wall, cpu = time.perf_counter(), time.thread_time()
        stats.in_callback, stats.off_loop_depth = True, 0
        try:
            original(handle)
        finally:
            stats.in_callback = False
            cpu = time.thread_time() - cpu
            wall = time.perf_counter() - wall
            after = schedstat()
            watch.callbacks += 1
            watch.walls.append(wall)
            if wall > 0.001:
                watch.over_ms_wall += 1
            split = None
            if after != (0, 0):
                on, queued = (after[0] - before[0]) / 1e9, (after[1] - before[1]) / 1e9
                split = (on, queued, max(0.0, wall - on - queued))
                watch.slowest_asleep = max(watch.slowest_asleep, split[2])
            if wall > watch.slowest_wall:
                watch.slowest_wall = wall
                watch.slowest_what = repr(handle)[:160]
                watch.slowest_split = split
            watch.slowest_cpu = max(watch.slowest_cpu, cpu)

    asyncio.Handle._run = timed  # type: ignore[method-assign]
    previous = sys.getprofile()
    sys.setprofile(profile)  # this thread's, where the loop runs
    gc.callbacks.append(collecting)
    try:
        yield watch
    finally:
        gc.callbacks.remove(collecting)
        sys.setprofile(previous)
        asyncio.Handle._run = original  # type: ignore[method-assign]
