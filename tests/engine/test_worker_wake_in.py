"""A worker asked to step within some time steps then, not at once, and not at all once cancelled.

What the reliable client's request kept for its caller's thread needs: the sender wakes when the
caller's grace ends unless the caller took the request (``Worker.wake_in`` / ``cancel``).  The
assertions are lower bounds on monotonic time (a step cannot come before its time), and each
test waits for the step it expects."""

from __future__ import annotations

import threading
import time

from wsrm_plugin.engine.workers import Worker

from .support import wait_for


def _worker(interval: float | None) -> tuple[Worker, list[float]]:
    steps: list[float] = []
    lock = threading.Lock()

    def step() -> bool:
        with lock:
            steps.append(time.monotonic())
        return False

    worker = Worker("wake-in-test", step, interval)
    worker.start()
    assert wait_for(lambda: len(steps) == 1 and worker.busy_since is None, timeout=30)  # the first step
    return worker, steps


def test_a_step_asked_for_within_a_time_comes_then_and_not_before():
    worker, steps = _worker(None)
    try:
        asked = time.monotonic()
        worker.wake_in(0.3, "a")
        assert wait_for(lambda: len(steps) == 2, timeout=30)
        assert steps[1] - asked >= 0.3
    finally:
        worker.stop(5)


def test_a_cancelled_step_does_not_come_and_the_next_one_does():
    worker, steps = _worker(None)
    try:
        asked = time.monotonic()
        worker.wake_in(0.2, "a")
        worker.wake_in(0.5, "b")
        worker.cancel("a")
        assert wait_for(lambda: len(steps) == 2, timeout=30)
        assert steps[1] - asked >= 0.5  # "a" was cancelled: nothing stepped at 0.2
    finally:
        worker.stop(5)


def test_work_signalled_meanwhile_still_steps_at_once():
    worker, steps = _worker(None)
    try:
        worker.wake_in(30.0, "later")
        asked = time.monotonic()
        worker.wake()
        assert wait_for(lambda: len(steps) == 2, timeout=30)
        assert steps[1] - asked < 30.0
    finally:
        worker.stop(5)


def test_the_poll_interval_still_bounds_the_sleep():
    worker, steps = _worker(0.2)
    try:
        worker.wake_in(60.0, "later")
        assert wait_for(lambda: len(steps) >= 3, timeout=30)  # polls keep coming meanwhile
    finally:
        worker.stop(5)
