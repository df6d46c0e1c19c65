"""A recovery log in the store's database, which every host can read: Narayana's JDBC object store.

The file log (:class:`~txmanager.log.RecoveryLog`) lives on its host's disk:
when the host dies for good, so does what it decided.  This log keeps the
same records in the table ``txm_decision`` of the database that holds the
node's claim (:mod:`.lease`), written through the claim's own session and
fenced in the same transaction (``txm_fence(node, epoch)``), so:

* a host that took the node over reads every decision of it, and with the
  commit marks (:mod:`.marks`, fenced alike) knows the complete set: it
  commits what was decided and rolls back the rest, at once;
* a host that lost its claim can write no decision any more: its session is
  gone, and a new one fails the fence.

Only the live state is kept: a commit decision is a row until "done"
deletes it; heuristic outcomes until forgotten; the databases that keep this
node's commit marks for good.  Concurrent decisions share one transaction
(group commit, as the file log shares one fsync): in the commit path this
log is written only for transactions no commit mark can decide.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .errors import RecoveryLogError
from .lease import Fence, NodeClaim
from .log import (
    LogEntry, RecoveryLog, _check_global, _check_heuristic, _commit_payload, _heuristic_payload, _Ledger,
    _mark_source_payload,
)
from .xid import Xid

__all__ = ["DatabaseLog", "CopiedLog"]

log = logging.getLogger(__name__)

_INSERT = ("INSERT INTO txm_decision (node, gtrid, kind, record) VALUES (%s, %s, %s, %s) "
           "ON CONFLICT (node, gtrid, kind) DO UPDATE SET record = EXCLUDED.record")


class _Op:
    __slots__ = ("statement", "params", "apply", "finished", "error")

    def __init__(self, statement: str, params: tuple[Any, ...], apply: Callable[[], None]) -> None:
        self.statement = statement
        self.params = params
        self.apply = apply
        self.finished = False
        self.error: BaseException | None = None


class DatabaseLog:
    """The decisions of ``claim.node`` in ``txm_decision`` (see the module docstring).

    Reads the node's rows when created: a log made by the host that took a
    node over starts with everything its previous holder decided.
    """

    durable = True

    def __init__(self, claim: NodeClaim) -> None:
        self.claim = claim
        self.node = claim.node
        self._ledger = _Ledger()
        self._ledger.node = claim.node
        self._cond = threading.Condition()
        self._queue: list[_Op] = []
        self._leading = False
        self._closed = False
        self.batches = 0
        rows = claim.session.run(lambda cur: _fetch(cur, "SELECT record FROM txm_decision WHERE node = %s",
                                                    (claim.node,)))
        for (record,) in rows:
            try:
                self._ledger.apply(json.loads(record))
            except (ValueError, KeyError, TypeError) as exc:
                self._ledger.mark_damaged(f"an unreadable row of txm_decision for node {claim.node}: {exc}")
        if self._ledger.damage:
            log.error("the database recovery log of node %s is DAMAGED -- SAFE MODE: %s", self.node,
                      "; ".join(self._ledger.damage))

    def __repr__(self) -> str:
        return f"<DatabaseLog node={self.node!r} epoch={self.claim.epoch}>"

    @property
    def fence(self) -> Fence:
        """What every decision of this node checks (commit marks included)."""
        return self.claim.fence

    def claim_lost(self) -> BaseException | None:
        """Why the session holding this node's claim failed, or None while it holds it.

        A health check asks this: a process that lost its node can decide
        nothing any more, and only a restart (a new claim) cures that."""
        return self.claim.session.lost

    def claim_node(self, node: str) -> None:
        if node != self.node:
            raise RecoveryLogError(f"this recovery log holds the decisions of node {self.node!r}, "
                                   f"not of {node!r}")

    # -- writing ------------------------------------------------------------------------

    def log_commit_decision(self, gxid: Xid, branches: Sequence[tuple[Xid, str]]) -> None:
        _check_global(gxid)
        branches = tuple(branches)
        at = time.time()
        record = _commit_payload(gxid, branches, at).decode("ascii")
        self._submit(_INSERT, (self.node, gxid.to_pg_gid(), "commit", record),
                     lambda: self._ledger.commit(gxid, branches, at))

    def log_done(self, gxid: Xid) -> None:
        entry = self._ledger._entries.get(gxid)
        if entry is None or not entry["committing"]:
            return  # a decision kept as a commit mark: nothing here to delete
        self._submit("DELETE FROM txm_decision WHERE node = %s AND gtrid = %s AND kind = 'commit'",
                     (self.node, gxid.to_pg_gid()), lambda: self._ledger.done(gxid))

    def log_heuristic(self, gxid: Xid, xid: Xid, code: int, resource_name: str | None = None) -> None:
        _check_heuristic(code)
        record = _heuristic_payload(gxid, xid, code, resource_name).decode("ascii")
        self._submit(_INSERT, (self.node, gxid.to_pg_gid(), "heur:" + xid.to_pg_gid(), record),
                     lambda: self._ledger.heuristic(gxid, xid, code, resource_name))

    def forget(self, gxid: Xid) -> None:
        self._submit("DELETE FROM txm_decision WHERE node = %s AND gtrid = %s AND kind LIKE 'heur:%%'",
                     (self.node, gxid.to_pg_gid()), lambda: self._ledger.forget(gxid))

    def log_mark_source(self, database: str) -> None:
        if database in self._ledger.mark_sources:
            return
        record = _mark_source_payload(database).decode("ascii")

        def apply() -> None:
            self._ledger.mark_sources = self._ledger.mark_sources | {database}
        self._submit(_INSERT, (self.node, "", "marks:" + database, record), apply)

    def _submit(self, statement: str, params: tuple[Any, ...], apply: Callable[[], None]) -> None:
        """Write one row change in a fenced transaction shared with the others queued meanwhile."""
        op = _Op(statement, params, apply)
        with self._cond:
            if self._closed:
                raise RecoveryLogError(f"the database recovery log of node {self.node} is closed")
            self._queue.append(op)
            while self._leading and not op.finished:
                self._cond.wait()
            lead = not op.finished
            if lead:
                self._leading = True
                batch, self._queue = self._queue, []
        if lead:
            self._lead(batch)
        if op.error is not None:
            raise RecoveryLogError(f"cannot write the decision of node {self.node} to the database: "
                                   f"{op.error}") from op.error

    def _lead(self, batch: list[_Op]) -> None:
        error: BaseException | None = None
        fence = self.claim.fence
        try:
            with self.claim.session.transaction() as cur:
                cur.execute("SELECT txm_fence(%s, %s)", (fence.node, fence.epoch))
                for op in batch:
                    cur.execute(op.statement, op.params)
            self.batches += 1
        except Exception as exc:  # noqa: BLE001 -- a lost lease session, the fence: every caller hears it
            error = exc
        with self._cond:
            try:
                if error is None:
                    for op in batch:
                        op.apply()
            finally:
                for op in batch:
                    op.error = error
                    op.finished = True
                self._leading = False
                self._cond.notify_all()

    # -- reading ------------------------------------------------------------------------

    def pending(self) -> dict[Xid, LogEntry]:
        with self._cond:
            return self._ledger.pending()

    def is_pending(self, gxid: Xid) -> bool:
        with self._cond:
            return self._ledger.is_pending(gxid)

    def damaged(self) -> list[str]:
        return list(self._ledger.damage)

    def mark_sources(self) -> frozenset[str]:
        return self._ledger.mark_sources

    def close(self) -> None:
        with self._cond:
            self._closed = True


def _fetch(cur: Any, statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    cur.execute(statement, params)
    return cur.fetchall()


class CopiedLog:
    """A :class:`DatabaseLog` with a copy of every record in a local file log, for the operator.

    The database is the log: what takeover and recovery read, and what the
    fence guards.  The file (a :class:`~txmanager.log.RecoveryLog`, readable by
    ``wsrm recover --log``) gets each record after the database took it; a
    failure there is logged, never raised, since the decision is already
    durable where it counts.  Chosen with ``PostgresNodes.claim(log_copy=path)``.
    """

    durable = True

    def __init__(self, database: DatabaseLog, copy: RecoveryLog) -> None:
        self.database = database
        self.copy = copy
        copy.claim_node(database.node)

    @property
    def fence(self) -> Fence:
        return self.database.fence

    def claim_lost(self) -> BaseException | None:
        return self.database.claim_lost()

    def claim_node(self, node: str) -> None:
        self.database.claim_node(node)

    def _copy(self, what: str, write: Callable[[], None]) -> None:
        try:
            write()
        except Exception as exc:  # noqa: BLE001 -- the database has it: the copy is best effort
            log.warning("recovery log copy %s: could not write %s: %s", self.copy.path, what, exc)

    def log_commit_decision(self, gxid: Xid, branches: Sequence[tuple[Xid, str]]) -> None:
        branches = tuple(branches)
        self.database.log_commit_decision(gxid, branches)
        self._copy("a decision", lambda: self.copy.log_commit_decision(gxid, branches))

    def log_done(self, gxid: Xid) -> None:
        self.database.log_done(gxid)
        self._copy("done", lambda: self.copy.log_done(gxid))

    def log_heuristic(self, gxid: Xid, xid: Xid, code: int, resource_name: str | None = None) -> None:
        self.database.log_heuristic(gxid, xid, code, resource_name)
        self._copy("a heuristic outcome", lambda: self.copy.log_heuristic(gxid, xid, code, resource_name))

    def forget(self, gxid: Xid) -> None:
        self.database.forget(gxid)
        self._copy("forget", lambda: self.copy.forget(gxid))

    def log_mark_source(self, database: str) -> None:
        self.database.log_mark_source(database)
        self._copy("a keeper of commit marks", lambda: self.copy.log_mark_source(database))

    def pending(self) -> dict[Xid, LogEntry]:
        return self.database.pending()

    def is_pending(self, gxid: Xid) -> bool:
        return self.database.is_pending(gxid)

    def damaged(self) -> list[str]:
        return self.database.damaged()

    def mark_sources(self) -> frozenset[str]:
        return self.database.mark_sources()

    def close(self) -> None:
        self.database.close()
        self.copy.close()
