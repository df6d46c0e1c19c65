"""What a transactional Spark write is: its options, its job id, and what a task sends back.

Everything here is plain, picklable data: Spark ships the options to every
task and the task's :class:`PartitionResult` back to the driver.

A job is ONE global XA transaction.  Its gtrid names the driver's transaction
manager node and the job (``node|spark:<name>:<random>``), so a recovery scan
can pick out exactly this job's branches among everything prepared in the
databases; each task attempt's branches carry the partition AND Spark's
``taskAttemptId`` in their qualifier (``p<partition>.t<taskAttemptId>.<n>``):
two attempts of one partition (a retry, a speculative copy) never share an
xid, which partition + attempt number alone would not guarantee (SPARK-28650).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from txmanager.transaction import PreparedBranch
from txmanager.xid import FORMAT_ID, MAXGTRIDSIZE, Xid

__all__ = ["SinkOptions", "PartitionResult", "new_job_xid", "job_matches", "branch_prefix",
           "sequence_key"]

_NAME_RE = re.compile(r"^[A-Za-z0-9._\-]{1,24}$")
_JOB_MARK = b"|spark:"


def new_job_xid(node: str, name: str = "job") -> Xid:
    """A fresh global xid for one run of job ``name`` (unique per run: random suffix)."""
    if not _NAME_RE.match(name):
        raise ValueError(f"job name {name!r} must be 1-24 chars of [A-Za-z0-9._-] (it goes in the xid)")
    Xid.new_global(node)  # checks the node name as the transaction manager does
    gtrid = f"{node}|spark:{name}:{os.urandom(6).hex()}".encode()
    if len(gtrid) > MAXGTRIDSIZE:
        raise ValueError(f"node {node!r} plus job name {name!r} make a gtrid longer than "
                         f"{MAXGTRIDSIZE} bytes; shorten one of them")
    return Xid(FORMAT_ID, gtrid)


def job_matches(xid: Xid, job: str) -> bool:
    """True when branch ``xid`` belongs to ``job``: a job id (the global xid's text form,
    as logged) matches that run; a job name (``orders``) matches every run of it."""
    if xid.format_id != FORMAT_ID or _JOB_MARK not in xid.gtrid:
        return False
    try:
        wanted = Xid.from_text(job)
    except ValueError:
        run = xid.gtrid.split(_JOB_MARK, 1)[1]
        return run.rsplit(b":", 1)[0] == job.encode()
    return xid.global_xid() == wanted.global_xid()


def branch_prefix(partition: int, task_attempt_id: int) -> str:
    return f"p{partition}.t{task_attempt_id}."


def sequence_key(job: Xid, partition: int, task_attempt_id: int) -> str:
    """The internal key of a task attempt's own RMS sequence: attempts never share one,
    so partitions do not wait for each other on the sequence's lock."""
    return f"spark:{job.gtrid.decode()}:p{partition}:t{task_attempt_id}"


@dataclass(frozen=True)
class SinkOptions:
    """The options of ``df.write.format("wsrm")`` (or of a :class:`~.rdd.TransactionalSink`).

    ``target`` is the service's address and ``operation`` the WSDL operation
    each row becomes (``wsdl`` defaults to ``target + "?wsdl"``); ``fields``
    are the row's fields passed to it as keyword arguments (default: all).
    ``store`` is the shared PostgreSQL message store (``postgresql://...``)
    that the long-running sender (``wsrm send``) reads.  ``database`` +
    ``table`` (optional) also insert every row there, in the same
    transaction.  ``log`` is the driver's recovery log (the commit decision),
    ``node`` the driver's transaction-manager node name, ``job_name`` the name
    put in the job id.
    """

    target: str
    operation: str
    store: str
    log: str
    wsdl: str | None = None
    action: str | None = None
    fields: tuple[str, ...] | None = None
    database: str | None = None
    table: str | None = None
    columns: tuple[str, ...] | None = None
    node: str = "spark"
    job_name: str = "job"
    batch_size: int = 500
    rm_version: str = "1.1"
    #: Set by the driver when the job starts (the global xid's text form).
    job: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "SinkOptions":
        """Parse Spark's string options (case-insensitive names, comma lists)."""
        known = {f.name.replace("_", ""): f.name for f in fields(cls)}
        given: dict[str, Any] = {}
        extra: dict[str, str] = {}
        for key, value in options.items():
            name = known.get(str(key).lower().replace("-", "").replace("_", ""))
            if name is None or name in ("extra", "job"):
                extra[str(key)] = str(value)
            else:
                given[name] = value
        missing = [n for n in ("target", "operation", "store", "log") if not given.get(n)]
        if missing:
            raise ValueError(f"the wsrm data source needs option(s) {', '.join(missing)}: "
                             'e.g. .option("target", "http://host:8080/").option("operation", '
                             '"place").option("store", "postgresql://...").option("log", '
                             '"/var/lib/app/spark-tm.log")')
        for name in ("fields", "columns"):
            if isinstance(given.get(name), str):
                given[name] = tuple(p.strip() for p in given[name].split(",") if p.strip())
        if "batch_size" in given:
            try:
                given["batch_size"] = int(given["batch_size"])
            except ValueError:
                raise ValueError(f"batchSize must be a number, not {given['batch_size']!r}") from None
            if given["batch_size"] < 1:
                raise ValueError("batchSize must be at least 1")
        if bool(given.get("database")) != bool(given.get("table")):
            raise ValueError("options database and table go together: both, or neither")
        if not str(given["store"]).startswith(("postgresql:", "postgres:")):
            raise ValueError(f"store {given['store']!r} must be a PostgreSQL store URL "
                             "(postgresql://...): executors on several hosts share it, and their "
                             "branches must survive the executor")
        if not _NAME_RE.match(str(given.get("job_name", "job"))):
            raise ValueError(f"jobName {given['job_name']!r} must be 1-24 chars of [A-Za-z0-9._-]")
        return cls(**given, extra=extra)

    @property
    def wsdl_url(self) -> str:
        return self.wsdl or self.target.rstrip("?") + "?wsdl"

    @property
    def job_xid(self) -> Xid:
        if not self.job:
            raise ValueError("the job has not been started (no job id): use the data source or "
                             "TransactionalSink, which start it on the driver")
        return Xid.from_text(self.job)


@dataclass(frozen=True)
class PartitionResult:
    """What one successful task attempt tells the driver: its prepared branches.

    Branches travel as text (xid, resource name) so the message stays plain
    data whatever the serializer.
    """

    partition: int
    attempt: int
    task_attempt_id: int
    rows: int
    messages: int
    branches: tuple[tuple[str, str], ...]

    def prepared(self) -> list[PreparedBranch]:
        return [PreparedBranch.from_text(b) for b in self.branches]

    def prepared_xids(self) -> list[Xid]:
        return [b.xid for b in self.prepared()]
