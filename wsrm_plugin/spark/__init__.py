"""Partition-level transactional sends from Spark (issue 5).

A Spark job that writes rows to PostgreSQL AND sends one SOAP message per
row must neither lose nor duplicate either, although Spark retries failed
tasks, runs speculative copies and may lose executors or the driver.  The
shape (Flink's two-phase-commit sinks are the nearest relative):

* the job is one XA global transaction; each task attempt works under its own
  branches (qualifier = partition + Spark's taskAttemptId), inserts its rows,
  enqueues its messages into the shared PostgreSQL message store on its own
  RMS sequence, and PREPARES (:mod:`.partition`);
* the driver commits exactly the attempts Spark accepted, after logging the
  decision durably, and rolls back the others (:mod:`.coordinator`);
  ``wsrm spark-recover`` finishes a job whose driver died;
* a long-running sender (``wsrm send``, :mod:`.sender`) delivers the
  committed messages with WS-RM: the executors may be gone by then.

Entry points: ``df.write.format("wsrm")`` after :func:`register` (needs
pyspark and pyarrow: the ``spark`` extra), :class:`TransactionalSink` for
RDD / ``mapPartitions`` code, :class:`Sender`.
"""

from __future__ import annotations

from typing import Any

from .coordinator import JobOutcome, abort_job, commit_job, recover_job, start_job
from .job import PartitionResult, SinkOptions
from .partition import write_partition
from .rdd import TransactionalSink
from .sender import Sender, run_sender

__all__ = [
    "register", "SinkOptions", "PartitionResult", "JobOutcome", "TransactionalSink", "Sender",
    "run_sender", "write_partition", "start_job", "commit_job", "abort_job", "recover_job",
]


def register(spark: Any) -> None:
    """Register the ``wsrm`` Python data source with a SparkSession (imports pyspark)."""
    from .datasource import register as _register

    _register(spark)
