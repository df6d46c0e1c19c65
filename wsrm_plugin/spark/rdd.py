"""The same transactional sink for RDD code (``mapPartitions`` instead of ``foreachPartition``).

::

    sink = TransactionalSink(target=..., operation="place", store="postgresql://...",
                             log="/var/lib/app/spark-tm.log", database=..., table="orders")
    outcome = sink.run(rdd)      # rows are Rows or dicts

``foreachPartition`` returns nothing to the driver, but the driver must learn
which branches to commit; so each partition returns its one
:class:`~.job.PartitionResult` through ``mapPartitions`` and ``collect``,
which (like the data source's commit) yields exactly one result per
partition, from the attempt Spark accepted.  ``run`` commits those and
rolls back everything else of the job; on failure it aborts the job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from .coordinator import JobOutcome, abort_job, commit_job, start_job
from .job import PartitionResult, SinkOptions
from .partition import write_partition

__all__ = ["TransactionalSink"]

log = logging.getLogger(__name__)


class TransactionalSink:
    """A transactional reliable sink for RDDs; keyword options as :class:`~.job.SinkOptions`."""

    def __init__(self, options: SinkOptions | None = None, **kwargs: Any) -> None:
        self.base = options if options is not None else SinkOptions.from_options(kwargs)

    def partition_writer(self, options: SinkOptions) -> Callable[[Iterator[Any]], Iterator[PartitionResult]]:
        """The function for ``rdd.mapPartitions`` (for one started job)."""

        def write(rows: Iterator[Any]) -> Iterator[PartitionResult]:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            if ctx is None:
                raise RuntimeError("the partition writer must run inside a Spark task")
            yield write_partition(options, rows, partition=ctx.partitionId(),
                                  attempt=ctx.attemptNumber(), task_attempt_id=ctx.taskAttemptId())

        return write

    def run(self, rdd: Any) -> JobOutcome:
        """Write every partition of ``rdd`` and commit the job; abort it if Spark fails it."""
        options = start_job(self.base)
        try:
            results = rdd.mapPartitions(self.partition_writer(options)).collect()
        except BaseException:
            abort_job(options)
            raise
        return commit_job(options, results)
