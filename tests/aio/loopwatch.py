"""How long the event loop's callbacks take: the measure of "the bridge never blocks the loop".

asyncio's debug mode logs callbacks slower than ``slow_callback_duration``;
this records every one instead, so a test can print and assert the slowest.
Every callback the loop runs (a task's step, a ``call_soon``, a future's
done-callback) is an ``asyncio.Handle`` whose ``_run`` this wraps while the
watch is on.  Both the wall-clock time and the thread's CPU time are kept:
a callback can take wall time without working when the loop's thread waits
for the GIL another thread holds (an engine thread), which says nothing of
the callback; a callback that blocks (a lock, a socket, an fsync) takes wall
time in its own wait.
"""

from __future__ import annotations

import asyncio
import contextlib
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

    def report(self) -> str:
        walls = sorted(self.walls)
        p999 = walls[int(len(walls) * 0.999)] if walls else 0.0
        return (f"{self.callbacks} loop callbacks; slowest {self.slowest_wall * 1000:.3f} ms wall "
                f"({self.slowest_what}), slowest on-CPU {self.slowest_cpu * 1000:.3f} ms, "
                f"99.9th percentile {p999 * 1000:.3f} ms wall, {self.over_ms_wall} over 1 ms wall")


@contextlib.contextmanager
def watch_loop() -> Iterator[LoopWatch]:
    watch = LoopWatch()
    original = asyncio.Handle._run

    def timed(handle: asyncio.Handle) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            original(handle)
        finally:
            cpu = time.thread_time() - cpu
            wall = time.perf_counter() - wall
            watch.callbacks += 1
            watch.walls.append(wall)
            if wall > 0.001:
                watch.over_ms_wall += 1
            if wall > watch.slowest_wall:
                watch.slowest_wall = wall
                watch.slowest_what = repr(handle)[:160]
            watch.slowest_cpu = max(watch.slowest_cpu, cpu)

    asyncio.Handle._run = timed  # type: ignore[method-assign]
    try:
        yield watch
    finally:
        asyncio.Handle._run = original  # type: ignore[method-assign]
