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


def _counting_sets(worker: Worker) -> list[int]:
    """How often the worker's thread is woken (its event set), counted from now."""
    sets: list[int] = []
    real = worker._wakeup.set

    def counted() -> None:
        sets.append(1)
        real()
    worker._wakeup.set = counted  # type: ignore[method-assign]
    return sets


def test_steps_asked_for_back_to_back_do_not_wake_the_sleeping_thread_each():
    """A caller's calls back to back each ask for a step within the grace and cancel it when the
    caller sends its request itself.  Each such ask used to wake the sleeping thread only for it
    to sleep again (two thread switches on the caller's path); asked again within the time, the
    thread sleeps in slices of it instead, and the next ask wakes nobody."""
    worker, steps = _worker(600.0)
    try:
        worker.wake_in(30.0, "a")
        worker.cancel("a")  # the caller sent it
        worker.wake_in(30.0, "b")  # asked again within 30 s: a stream of calls
        worker.cancel("b")
        worker.wake()  # a step, after which the thread works out its sleep with nothing due
        assert wait_for(lambda: len(steps) == 2 and worker._sleep_until is not None, timeout=30)
        assert worker._sleep_until < time.monotonic() + 60  # a slice of 30 s, not the 600 s poll
        sets = _counting_sets(worker)
        worker.wake_in(30.0, "c")
        assert sets == []  # its time falls after the slice under way ends: nobody woken
        worker.cancel("c")
        assert len(steps) == 2
    finally:
        worker.stop(5)


def test_a_slice_without_an_ask_ends_the_stream():
    worker, steps = _worker(600.0)
    try:
        worker.wake_in(0.2, "a")
        worker.cancel("a")
        worker.wake_in(0.2, "b")
        worker.cancel("b")
        # a slice of 0.2 s passes without an ask: back to sleeping until the poll
        assert wait_for(lambda: worker._sleep_until is not None and worker._sleep_until > time.monotonic() + 60,
                        timeout=30)
        assert len(steps) == 1  # nothing fell due: no step
    finally:
        worker.stop(5)
