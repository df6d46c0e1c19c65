"""A wsrm data source whose task attempts fail or die on purpose (imported by Spark's workers).

The ``fault`` option is ``<kind>:<partition>:<attempt number>:<after rows>``:
``fail`` raises, ``kill`` SIGKILLs the Python worker, ``prepfail`` raises
after PREPARING (what a speculative attempt that lost the race looks like);
``hang-commit`` makes the driver's commit hang before deciding (to be killed);
``straggle`` makes the attempt stop after ``<after rows>`` (some written and
enqueued, nothing prepared) and wait there, up to ``straggleTimeout`` seconds
(default 120), for Spark to kill it: a straggler for speculative execution
(only the named attempt straggles, so a speculative copy runs at full speed).
Each attempt, its host, its end and the hits are appended to the ``marker``
file; the driver's commit notes the attempts Spark accepted there too.
Everything else is the real writer.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

from wsrm_plugin.spark.datasource import WsrmDataSource, WsrmWriter
from wsrm_plugin.spark.job import SinkOptions


class FaultInjected(RuntimeError):
    pass


class FaultyWriter(WsrmWriter):
    def write(self, iterator: Iterator[Any]):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        kind, partition, attempt, after = (self.options.extra["fault"] + ":-1:-1:-1").split(":")[:4]
        hit = ctx.partitionId() == int(partition) and ctx.attemptNumber() == int(attempt)
        marker = self.options.extra.get("marker")
        attempt_name = f"p{ctx.partitionId()} a{ctx.attemptNumber()}"
        if marker:  # the test checks that the attempts and the fault really happened
            # SPARK_LOCAL_IP: the executor's host, inherited from its worker
            _note(marker, f"write {attempt_name} on {os.environ.get('SPARK_LOCAL_IP', '?')} "
                          f"task {ctx.taskAttemptId()}")
            if hit:
                _note(marker, f"{kind} task {ctx.taskAttemptId()}")
        if not hit:
            message = super().write(iterator)
        elif kind == "prepfail":
            super().write(iterator)   # prepared; then the attempt fails anyway (a lost race)
            raise FaultInjected("injected failure after the prepare")
        elif kind == "straggle":
            timeout = float(self.options.extra.get("straggleTimeout", "120"))
            message = super().write(_straggling(iterator, int(after), marker, attempt_name, timeout))
        else:
            message = super().write(_faulty(iterator, kind, int(after)))
        if marker:
            _note(marker, f"prepared {attempt_name}")
        return message

    def commit(self, messages):
        marker = self.options.extra.get("marker")
        if marker:
            for m in messages:
                if m is not None:
                    _note(marker, f"accepted p{m.result.partition} a{m.result.attempt} "
                                  f"task {m.result.task_attempt_id}")
        if self.options.extra["fault"].startswith("hang-commit"):
            # every accepted attempt is prepared; the driver is about to decide: hang here
            with open(self.options.extra["marker"], "a") as f:
                f.write(f"hang-commit {self.options.job} {len(messages)}\n")
            time.sleep(600)
        return super().commit(messages)


def _faulty(rows: Iterator[Any], kind: str, after: int) -> Iterator[Any]:
    for n, row in enumerate(rows):
        if n == after:
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise FaultInjected(f"injected failure after {after} rows")
        yield row


def _straggling(rows: Iterator[Any], after: int, marker: str | None, attempt_name: str,
                timeout: float) -> Iterator[Any]:
    """Yield ``after`` rows, then wait (killable: Spark destroys this Python worker when another
    attempt of the partition succeeds) before yielding the rest."""
    for n, row in enumerate(rows):
        if n == after:
            if marker:
                _note(marker, f"straggle {attempt_name} waits after {after} rows")
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                time.sleep(0.1)
            if marker:  # still alive: Spark did not kill this attempt
                _note(marker, f"straggle {attempt_name} woke after {timeout:.0f}s")
        yield row


def _note(marker: str, line: str) -> None:
    with open(marker, "a") as f:
        f.write(line + "\n")


class FaultyDataSource(WsrmDataSource):
    @classmethod
    def name(cls) -> str:
        return "wsrm-faulty"

    def writer(self, schema: Any, overwrite: bool) -> FaultyWriter:
        return FaultyWriter(SinkOptions.from_options(self.options))
