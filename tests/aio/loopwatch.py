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
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


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
                f"99.9th percentile {p999 * 1000:.3f} ms wall, {self.over_ms_wall} over 1 ms wall")


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

    def timed(handle: asyncio.Handle) -> None:
        before = schedstat()
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            original(handle)
        finally:
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
    try:
        yield watch
    finally:
        asyncio.Handle._run = original  # type: ignore[method-assign]
