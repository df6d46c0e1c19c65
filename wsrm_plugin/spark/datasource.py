"""``df.write.format("wsrm")``: the sink as a PySpark Python Data Source (PySpark 4, needs pyarrow).

::

    from wsrm_plugin.spark import register
    register(spark)
    (df.write.format("wsrm").mode("append")
       .option("target", "http://orders:8080/").option("operation", "place")
       .option("store", "postgresql://rm@db/rmstore").option("log", "/var/lib/app/spark-tm.log")
       .option("database", "dbname=shop host=db").option("table", "orders")
       .save())

The writer object is made once on the driver (that is when the job id is
drawn) and shipped to every task: ``write`` runs in the executors, one call
per task attempt (:func:`~.partition.write_partition`), and returns the
attempt's prepared branches as the commit message; ``commit`` gets exactly
one message per partition, from the attempts Spark accepted, and
``abort`` is called when the job fails.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage

from .coordinator import JobOutcome, abort_job, commit_job, start_job
from .job import PartitionResult, SinkOptions
from .partition import write_partition

__all__ = ["WsrmDataSource", "WsrmWriter", "WsrmCommitMessage", "register"]

log = logging.getLogger(__name__)


@dataclass
class WsrmCommitMessage(WriterCommitMessage):
    """One accepted task attempt's result (its prepared branches), on its way to the driver."""

    result: PartitionResult


class WsrmWriter(DataSourceWriter):
    """Transactional, reliable writes: rows to ``table`` and SOAP requests to ``target``, atomically."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = start_job(options)
        self.outcome: JobOutcome | None = None

    def write(self, iterator: Iterator[Any]) -> WsrmCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("WsrmWriter.write must run inside a Spark task")
        result = write_partition(self.options, iterator, partition=ctx.partitionId(),
                                 attempt=ctx.attemptNumber(), task_attempt_id=ctx.taskAttemptId())
        return WsrmCommitMessage(result)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.outcome = commit_job(self.options, _results(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.outcome = abort_job(self.options, _results(messages))


def _results(messages: list[WriterCommitMessage | None]) -> list[PartitionResult]:
    """The partitions' results; None is a task that failed before answering."""
    results = []
    for message in messages:
        if message is None:
            continue
        if not isinstance(message, WsrmCommitMessage):
            raise TypeError(f"not a commit message of this sink: {message!r}")
        results.append(message.result)
    return results


class WsrmDataSource(DataSource):
    """The ``wsrm`` format; see the module docstring for its options."""

    @classmethod
    def name(cls) -> str:
        return "wsrm"

    def writer(self, schema: Any, overwrite: bool) -> WsrmWriter:
        if overwrite:
            raise ValueError("the wsrm sink sends messages: it can only append (use mode('append'))")
        return WsrmWriter(SinkOptions.from_options(self.options))


def register(spark: Any, source: type[DataSource] = WsrmDataSource) -> None:
    """Make ``format("wsrm")`` known to ``spark`` (a SparkSession)."""
    spark.dataSource.register(source)
