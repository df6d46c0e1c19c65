"""The executor's half: one task attempt writes its partition under its own XA branches and prepares.

:func:`write_partition` runs inside a Spark task.  It joins the job's global
transaction with a branch prefix naming the partition and the task attempt,
inserts the rows (optional), enqueues one SOAP request per row into the
shared PostgreSQL message store on the attempt's own RMS sequence, closes
that sequence (the sender terminates it once everything is acknowledged),
and PREPARES.  Nothing is committed here: the driver commits the attempts
Spark accepted.  Once prepared the work survives this process, so the
executor may die at once; an attempt that fails before preparing leaves
nothing behind (its sessions close, PostgreSQL rolls them back).

Connections, the WSDL client and the engine are kept per Python worker
process (Spark reuses workers), keyed by the options that shape them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from txmanager import MemoryLog, TransactionManager
from txmanager.postgres import XADataSource

from ..engine import ReliableEngine, RMPolicy
from ..store import open_store
from ..wire.namespaces import RM_VERSIONS, RMVersion
from .job import PartitionResult, SinkOptions, branch_prefix, sequence_key

__all__ = ["write_partition", "EnvelopeBuilder"]

log = logging.getLogger(__name__)


class EnvelopeBuilder:
    """SOAP requests for one WSDL operation, built by zeep from the service's own WSDL."""

    def __init__(self, wsdl: str, operation: str, *, action: str | None = None,
                 fields: tuple[str, ...] | None = None) -> None:
        import zeep
        from lxml import etree

        self._tostring = etree.tostring
        self.client = zeep.Client(wsdl)
        self.operation = operation
        self.fields = fields
        try:
            binding_op = self.client.service._binding.get(operation)
        except (ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"the WSDL at {wsdl} has no operation {operation!r}") from exc
        self.action = action or _action_of(binding_op, operation)

    def __call__(self, row: Mapping[str, Any]) -> bytes:
        args = {name: row[name] for name in self.fields} if self.fields else dict(row)
        envelope = self.client.create_message(self.client.service, self.operation, **args)
        return self._tostring(envelope, xml_declaration=True, encoding="utf-8")


def _action_of(binding_op: Any, operation: str) -> str:
    """The WSDL's soapAction when it is a URI, else ``<target namespace>/<operation>``."""
    soapaction = getattr(binding_op, "soapaction", None) or ""
    if ":" in soapaction:
        return soapaction
    body = getattr(getattr(binding_op, "input", None), "body", None)
    qname = getattr(body, "qname", None)
    namespace = getattr(qname, "namespace", None)
    if not namespace:
        raise ValueError(f"cannot tell the wsa:Action of {operation!r}: pass the action option")
    return f"{namespace}/{operation}"


def _rm_version(name: str) -> RMVersion:
    """The sink option's "1.0"/"1.1" as the version the policy declares."""
    for version in RM_VERSIONS:
        if version.name == name:
            return version
    raise ValueError(f"rm_version must be one of {[v.name for v in RM_VERSIONS]}, not {name!r}")


class _Executor:
    """What one worker process keeps between tasks for one set of options."""

    def __init__(self, options: SinkOptions) -> None:
        self.tm = TransactionManager(node=options.node, log=MemoryLog(), default_timeout=0)
        self.store = open_store(options.store)
        self.engine = ReliableEngine(self.store, RMPolicy(rm_version=_rm_version(options.rm_version)), tm=self.tm,
                                     name="spark-task")
        self.ds = (XADataSource(options.database, self.tm, register_for_recovery=False)
                   if options.database else None)
        self.envelopes = EnvelopeBuilder(options.wsdl_url, options.operation, action=options.action,
                                         fields=options.fields)


_executors: dict[tuple[Any, ...], _Executor] = {}
_executors_lock = threading.Lock()


def _executor(options: SinkOptions) -> _Executor:
    key = (options.store, options.database, options.wsdl_url, options.operation, options.action,
           options.fields, options.node, options.rm_version)
    with _executors_lock:
        ex = _executors.get(key)
        if ex is None:
            ex = _executors[key] = _Executor(options)
        return ex


def write_partition(options: SinkOptions, rows: Iterable[Any], *, partition: int, attempt: int,
                    task_attempt_id: int) -> PartitionResult:
    """Write and enqueue ``rows`` as one branch set of the job, prepare, and report it.

    ``rows`` are pyspark ``Row`` objects, dicts or anything with ``asDict()``.
    Raises (and leaves nothing prepared) when anything fails before the prepare.
    """
    gxid = options.job_xid
    ex = _executor(options)
    key = sequence_key(gxid, partition, task_attempt_id)
    started = time.monotonic()
    tx = ex.tm.begin(xid=gxid, branch_prefix=branch_prefix(partition, task_attempt_id))
    count = 0
    try:
        for batch in _batches(rows, options.batch_size):
            if ex.ds is not None:
                _insert(ex.ds, options, batch)
            for row in batch:
                ex.engine.send(options.target, ex.envelopes(row), action=ex.envelopes.action, key=key)
            count += len(batch)
            log.debug("partition %d attempt %d: %d rows so far", partition, attempt, count)
        if count:
            ex.engine.close(options.target, key)  # the sender ends the sequence once all is acked
        branches = tx.prepare_and_detach()
    except BaseException:
        if not tx.finished:
            try:
                tx.rollback()
            except Exception:  # noqa: BLE001 -- the original error matters more
                log.exception("rollback of partition %d attempt %d failed", partition, attempt)
        if ex.tm.get_transaction() is tx:
            ex.tm.suspend()
        raise
    log.info("partition %d (attempt %d, task %d): %d rows written and enqueued, %d branch(es) "
             "prepared in %.1fs", partition, attempt, task_attempt_id, count, len(branches),
             time.monotonic() - started)
    return PartitionResult(partition, attempt, task_attempt_id, count, count,
                           tuple(b.to_text() for b in branches))


def _batches(rows: Iterable[Any], size: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(_as_dict(row))
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _as_dict(row: Any) -> dict[str, Any]:
    if isinstance(row, Mapping):
        return dict(row)
    as_dict = getattr(row, "asDict", None)
    if as_dict is not None:
        return as_dict()
    raise TypeError(f"a row must be a pyspark Row or a mapping, not {type(row).__name__}")


def _insert(ds: XADataSource, options: SinkOptions, batch: list[dict[str, Any]]) -> None:
    from psycopg2 import sql
    from psycopg2.extras import execute_values

    columns = options.columns or tuple(batch[0])
    table = sql.Identifier(*options.table.split(".")) if options.table else None
    statement = sql.SQL("INSERT INTO {} ({}) VALUES %s").format(
        table, sql.SQL(", ").join(sql.Identifier(c) for c in columns))
    with ds.connection() as conn, conn.cursor() as cur:
        execute_values(cur, statement, [tuple(row[c] for c in columns) for row in batch],
                       page_size=len(batch))
