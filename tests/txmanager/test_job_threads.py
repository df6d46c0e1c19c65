"""The queue of jobs that the second phases after the decision (``PhaseTwoWorkers``) and the
engine's replies recorded after their answer (``LaterRecords``) both run on: its bound, its
order, its two waits, its end, and what a failing job leaves.  Real threads; each test waits for
the state it asserts, never for a time."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from tests.engine.support import wait_for
from txmanager.job_threads import JobThreads
from txmanager.phase_two import PhaseTwoWorkers
from wsrm_plugin.engine.later_records import LaterRecords


class _Gates:
    """Jobs that each wait for their own gate; what started and what ended, in order."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.started: list[tuple[str, str]] = []
        self.ended: list[str] = []
        self._lock = threading.Lock()

    def job(self, label: str) -> Callable[[], None]:
        gate = self.gates.setdefault(label, threading.Event())

        def run() -> None:
            with self._lock:
                self.started.append((label, threading.current_thread().name))
            assert gate.wait(60)
            with self._lock:
                self.ended.append(label)
        return run

    def labels_started(self) -> list[str]:
        with self._lock:
            return [label for label, _ in self.started]

    def has_ended(self, label: str) -> bool:
        with self._lock:
            return label in self.ended

    def release_all(self) -> None:
        for gate in self.gates.values():
            gate.set()


@pytest.fixture
def gates() -> Iterator[_Gates]:
    made = _Gates()
    yield made
    made.release_all()


def _waiting_on(condition: threading.Condition) -> int:
    """Threads blocked in ``condition.wait`` now (the test's only window into the order of a
    wait's snapshot and a submit that follows it)."""
    return len(condition._waiters)  # type: ignore[attr-defined]


def test_at_most_the_bound_run_at_once_and_the_threads_are_named(gates) -> None:
    jobs = JobThreads(2, "pool")
    for label in "abc":
        jobs.submit(gates.job(label))
    assert wait_for(lambda: gates.labels_started() == ["a", "b"])
    assert jobs.pending == 3  # c waits for a thread
    gates.gates["a"].set()
    assert wait_for(lambda: gates.labels_started() == ["a", "b", "c"])  # on a's thread
    gates.release_all()
    assert jobs.close(60)
    assert sorted({name for _, name in gates.started}) == ["pool-1", "pool-2"]
    one = JobThreads(1, "alone")
    one.submit(gates.job("d"))
    gates.release_all()
    assert one.close(60) and gates.started[-1] == ("d", "alone")


def test_wait_is_for_the_jobs_submitted_so_far_not_those_after(gates) -> None:
    """Two threads: the first job still runs while a later one is done, and the wait is for the
    first.  A wait that counted jobs done would have returned once the later one ended."""
    jobs = JobThreads(2, "pool")
    jobs.submit(gates.job("first"))
    assert wait_for(lambda: gates.labels_started() == ["first"])
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(jobs.wait(120)))
    waiter.start()
    assert wait_for(lambda: _waiting_on(jobs._finished) == 1)  # it took its snapshot: first only
    jobs.submit(gates.job("later"))
    gates.gates["later"].set()
    assert wait_for(lambda: gates.has_ended("later"))
    assert not jobs.wait(0) and waited == []  # "first" still runs
    jobs.submit(gates.job("held"))  # submitted after the wait began: not waited for
    assert wait_for(lambda: "held" in gates.labels_started())
    gates.gates["first"].set()
    waiter.join(120)
    assert waited == [True] and not gates.has_ended("held")
    assert not jobs.drain(0)  # drain waits for every job, "held" too
    gates.gates["held"].set()
    assert jobs.drain(60) and jobs.pending == 0
    jobs.close(60)


def test_close_runs_what_is_left_and_takes_no_more(gates) -> None:
    jobs = JobThreads(1, "closing")
    jobs.submit(gates.job("a"))
    jobs.submit(gates.job("b"))
    closed: list[bool] = []
    closer = threading.Thread(target=lambda: closed.append(jobs.close(120)))
    closer.start()
    assert wait_for(lambda: _waiting_on(jobs._finished) == 1)
    with pytest.raises(RuntimeError, match="closing is closed"):
        jobs.submit(gates.job("c"))
    gates.release_all()
    closer.join(120)
    assert closed == [True] and gates.ended == ["a", "b"]


@pytest.mark.parametrize("kind", [PhaseTwoWorkers, LaterRecords])
def test_a_job_that_raises_is_logged_by_its_user_and_the_thread_goes_on(kind, caplog) -> None:
    caplog.set_level(logging.ERROR)
    jobs = kind()
    ran: list[str] = []
    jobs.submit(lambda: 1 / 0)
    jobs.submit(lambda: ran.append("after"))
    assert jobs.close(60) and ran == ["after"]
    failed = [r for r in caplog.records if r.exc_info and r.exc_info[0] is ZeroDivisionError]
    assert [(r.name, r.getMessage()) for r in failed] == [(kind.logger.name, kind.failure)]
    assert kind.logger.name == kind.__module__


def test_the_records_thread_carries_its_engines_name() -> None:
    names: list[str] = []
    records = LaterRecords("billing")
    records.submit(lambda: names.append(threading.current_thread().name))
    assert records.close(60) and names == ["billing-reply-records"]
