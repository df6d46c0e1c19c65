"""The driver's half: decide the job, and clean up the attempts Spark did not accept.

:func:`commit_job` takes the results Spark accepted (one per partition:
``DataSourceWriter.commit(messages)`` or what ``collect`` returned), logs the
commit decision for exactly their branches in the driver's recovery log
(fsynced), commits them, and then rolls back every other prepared branch of
the job (attempts that failed or lost a speculative race after preparing).
:func:`abort_job` rolls back everything of the job.  :func:`recover_job` is
the same decision replayed from the log after a crash: branches the log says
to commit are committed, every other branch of the job is rolled back
(presumed abort, also for a job whose driver died before deciding).

Phase 2 runs on fresh connections: branches prepared by executors (that may
be gone) are finished by gid, which PostgreSQL allows from any session.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from txmanager import LogLockedError, RecoveryLog, TransactionManager
from txmanager.postgres import PostgresXAResource, default_resource_name
from txmanager.transaction import PreparedBranch
from txmanager.xa import XAER_NOTA, XAException
from txmanager.xid import Xid

from ..store import open_store
from ..store.postgres import PostgresStore
from .job import PartitionResult, SinkOptions, job_matches, new_job_xid

__all__ = ["JobOutcome", "start_job", "commit_job", "abort_job", "recover_job", "job_resources"]

log = logging.getLogger(__name__)


@dataclass
class JobOutcome:
    """What the driver did for a job."""

    job: str
    partitions: int = 0
    rows: int = 0
    messages: int = 0
    committed: list[Xid] = field(default_factory=list)
    rolled_back: list[Xid] = field(default_factory=list)
    left_to_recovery: list[Xid] = field(default_factory=list)

    def summary(self) -> str:
        return (f"job {self.job}: {self.partitions} partitions, {self.rows} rows, {self.messages} "
                f"messages; {len(self.committed)} branches committed, {len(self.rolled_back)} of "
                f"other attempts rolled back, {len(self.left_to_recovery)} left to recovery")


def start_job(options: SinkOptions) -> SinkOptions:
    """The options with a fresh job id (one global transaction per run)."""
    from dataclasses import replace

    gxid = new_job_xid(options.node, options.job_name)
    log.info("spark job %s started (recover it with: wsrm spark-recover --log %s --store ... "
             "--job %s)", gxid.to_text(), options.log, gxid.to_text())
    return replace(options, job=gxid.to_text())


def job_resources(store: str, database: str | None) -> list[PostgresXAResource]:
    """XA resources (named as the executors name them) for the job's two databases."""
    with open_store(store) as opened:
        if not isinstance(opened, PostgresStore):
            raise ValueError(f"a Spark job's message store is PostgreSQL (postgresql://...), not {store!r}")
        resources = [PostgresXAResource(opened.dsn, resource_name=opened.resource_name)]
    if database:
        resources.append(PostgresXAResource(database, resource_name=default_resource_name(database)))
    return resources


@contextlib.contextmanager
def _driver_tm(log_path: str, node: str, resources: Sequence[PostgresXAResource],
               wait: float = 60.0) -> Iterator[TransactionManager]:
    """The driver's manager on its recovery log; waits while another job's commit holds the log."""
    deadline = time.monotonic() + wait
    while True:
        try:
            recovery_log = RecoveryLog(log_path)
            break
        except LogLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    tm = TransactionManager(node=node, log=recovery_log)
    try:
        for resource in resources:
            tm.register_resource(resource)
        yield tm
    finally:
        tm.close()
        recovery_log.close()
        for resource in resources:
            resource.close()


def commit_job(options: SinkOptions, results: Sequence[PartitionResult]) -> JobOutcome:
    """Commit exactly the branches of ``results`` (the accepted attempts); roll back the rest."""
    gxid = options.job_xid
    outcome = JobOutcome(options.job or "", partitions=len(results),
                         rows=sum(r.rows for r in results), messages=sum(r.messages for r in results))
    seen = [r.partition for r in results]
    if len(set(seen)) != len(seen):
        raise ValueError(f"two results for one partition ({sorted(seen)}): commit exactly one "
                         "accepted attempt per partition")
    branches = [b for r in results for b in r.prepared()]
    for b in branches:
        if b.xid.global_xid() != gxid:
            raise ValueError(f"branch {b.xid} is not part of job {options.job}")
    resources = job_resources(options.store, options.database)
    with _driver_tm(options.log, options.node, resources) as tm:
        left = tm.commit_prepared(gxid, branches)
        outcome.left_to_recovery = [b.xid for b in left]
        outcome.committed = [b.xid for b in branches if b not in left]
        accepted = {b.xid for b in branches}
        outcome.rolled_back = _roll_back_others(resources, gxid, accepted)
    if outcome.committed and outcome.messages:
        _analyze(options.store)
    log.info("%s", outcome.summary())
    return outcome


def _analyze(store: str) -> None:
    """The job was a bulk load of the store: give the sender's queries statistics that say so."""
    try:
        with open_store(store) as opened:
            opened.analyze()
    except Exception:  # noqa: BLE001 -- the job is committed; only the senders' first rounds are slower
        log.warning("could not refresh the statistics of %s after the job's commit", store, exc_info=True)


def abort_job(options: SinkOptions, results: Sequence[PartitionResult] = ()) -> JobOutcome:
    """Roll back every prepared branch of the job (those reported and any other found)."""
    gxid = options.job_xid
    outcome = JobOutcome(options.job or "", partitions=len(results))
    resources = job_resources(options.store, options.database)
    try:
        outcome.rolled_back = _roll_back_others(resources, gxid, set())
    finally:
        for resource in resources:
            resource.close()
    log.info("job %s aborted: %d prepared branch(es) rolled back", options.job,
             len(outcome.rolled_back))
    return outcome


def _roll_back_others(resources: Sequence[PostgresXAResource], gxid: Xid, keep: set[Xid]) -> list[Xid]:
    done: list[Xid] = []
    for resource in _distinct(resources):
        for xid in resource.recover():
            if xid.global_xid() != gxid or xid in keep:
                continue
            try:
                resource.rollback(xid)
            except XAException as e:
                if e.code != XAER_NOTA:
                    log.warning("rollback of %s on %s failed (%s); recovery will retry",
                                xid, resource.resource_name, e)
                    continue
            done.append(xid)
            log.info("rolled back %s on %s: an attempt Spark did not accept", xid,
                     resource.resource_name)
    return done


def _distinct(resources: Sequence[PostgresXAResource]) -> list[PostgresXAResource]:
    """One resource per database: the message store may live in the rows' database."""
    out: list[PostgresXAResource] = []
    seen: set[str] = set()
    for resource in resources:
        conn = resource.connection
        where = f"{conn.info.host}:{conn.info.port}/{conn.info.dbname}"
        if where not in seen:
            seen.add(where)
            out.append(resource)
    return out


def recover_job(*, log_path: str, store: str, database: str | None, job: str,
                node: str = "spark") -> JobOutcome:
    """Finish job ``job`` (its id, or its name for every run of it) after a crash.

    Branches named by a commit decision in the log are committed; every other
    prepared branch of the job is rolled back.  Run it only when the job is
    no longer running (a live job's executors may still be preparing).
    """
    outcome = JobOutcome(job)
    resources = job_resources(store, database)
    with _driver_tm(log_path, node, resources) as tm:
        pending = tm.log.pending()
        decided: dict[Xid, PreparedBranch] = {}
        for entry in pending.values():
            if entry.committing and any(job_matches(x, job) for x, _ in entry.branches):
                for bxid, name in entry.branches:
                    decided[bxid] = PreparedBranch(bxid, name)
        by_name = {r.resource_name: r for r in resources}
        for resource in _distinct(resources):
            for xid in resource.recover():
                if not job_matches(xid, job):
                    continue
                branch = decided.get(xid)
                target = by_name.get(branch.resource_name, resource) if branch else resource
                try:
                    if branch is not None:
                        target.commit(xid, one_phase=False)
                        outcome.committed.append(xid)
                    else:
                        target.rollback(xid)
                        outcome.rolled_back.append(xid)
                except XAException as e:
                    if e.code != XAER_NOTA:
                        outcome.left_to_recovery.append(xid)
                        log.warning("%s of %s failed: %s", "commit" if branch else "rollback", xid, e)
        if not outcome.left_to_recovery:
            for gxid, entry in pending.items():
                if entry.committing and any(job_matches(x, job) for x, _ in entry.branches):
                    tm.log.log_done(gxid)
    log.info("recovery of %s", outcome.summary())
    return outcome
