"""A wsrm data source whose task attempts fail or die on purpose (imported by Spark's workers).

The ``fault`` option is ``<kind>:<partition>:<attempt number>:<after rows>``:
``fail`` raises, ``kill`` SIGKILLs the Python worker, ``prepfail`` raises
after PREPARING (what a speculative attempt that lost the race looks like);
``hang-commit`` makes the driver's commit hang before deciding (to be killed).
Each hit is appended to the ``marker`` file.
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
        if marker:  # the test checks that the attempts and the fault really happened
            with open(marker, "a") as f:
                f.write(f"write p{ctx.partitionId()} a{ctx.attemptNumber()}\n")
                if hit:
                    f.write(f"{kind} task {ctx.taskAttemptId()}\n")
        if not hit:
            return super().write(iterator)
        if kind == "prepfail":
            super().write(iterator)   # prepared; then the attempt fails anyway (a lost race)
            raise FaultInjected("injected failure after the prepare")
        return super().write(_faulty(iterator, kind, int(after)))

    def commit(self, messages):
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


class FaultyDataSource(WsrmDataSource):
    @classmethod
    def name(cls) -> str:
        return "wsrm-faulty"

    def writer(self, schema: Any, overwrite: bool) -> FaultyWriter:
        return FaultyWriter(SinkOptions.from_options(self.options))
