"""Node names for several hosts on one PostgreSQL database, and the takeover of a dead host's.

:class:`PostgresNodes` is :class:`~txmanager.slots.NodeSlots` across hosts:
the names ``<prefix>-0``, ``<prefix>-1``... are claims in the database
(:mod:`.lease`), and each name's decisions are in the database too
(:class:`~txmanager.dblog.DatabaseLog`, and the commit marks), so any host
can finish any other's transactions::

    nodes = PostgresNodes(store_dsn, "orders", takeover_within=10)
    tm = nodes.claim()                 # the lowest free name; a TransactionManager on it
    ...                                # data sources, the reliable service (tm=tm)
    nodes.start_watcher(tm)            # take over the names of dead hosts

A host's claim lives as long as its lease session: when the host dies the
server ends the session (at once for a killed process, within the keepalive
bound for a lost host or network) and the name is free.  Every live host's
watcher looks for free names every ``watch_interval``; the first to get one
*seizes* it (ends the dead holder's stray sessions, raises the epoch: the
fence), runs one recovery pass with its own resources -- commit what the
node decided, roll back its other prepared branches, no safety interval
needed since nothing of the node can be running any more -- and lets it
go.  A host that starts later claims the lowest free name again.  What else
the dead host left in the database under its node's name (an engine's
reports of a paused delivery, of unreachable peers) is cleared by the
takeover's listeners (:meth:`PostgresNodes.add_takeover_listener`): a reliable
engine on a claimed node's transaction manager registers one by itself.

A host whose lease session fails has lost its name (another host may hold
it a moment later): its decisions fail the fence from then on, ``on_lost``
is called (the default logs CRITICAL), and :attr:`PostgresNodes.healthy`
turns False for the health check.  Restart such a host: it claims a name anew.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from .dblog import CopiedLog, DatabaseLog
from .lease import (
    LOCK_CLASS, LeaseLostError, LeaseSession, NodeClaim, Timing, seize, session_tag, try_lock,
)
from .log import RecoveryLog
from .manager import TransactionManager
from .postgres.server import default_resource_name
from .recovery import RecoveryManager, RecoveryReport
from .xa import XAResource

__all__ = ["PostgresNodes", "NoFreeNodeError"]

log = logging.getLogger(__name__)


class NoFreeNodeError(RuntimeError):
    """Every node name stayed held by a live host for the whole wait."""


#: Which PostgresNodes claimed the node of a transaction manager (see :meth:`PostgresNodes.of`).
_CLAIMED_BY: weakref.WeakKeyDictionary[TransactionManager, PostgresNodes] = weakref.WeakKeyDictionary()


class PostgresNodes:
    """The node names ``<prefix>-<n>`` claimed in the database of ``dsn`` (see the module docstring).

    ``dsn`` is the store's database (its ``txm_*`` tables are created on
    first use).  ``takeover_within`` bounds the time from a host's death to
    its transactions being resolved by another (seconds; see
    :class:`~txmanager.lease.Timing` for what it is made of); RMPolicy's
    ``host_takeover_within`` is the knob a service passes here.  ``size``
    caps the number of names.  ``tag_sessions`` sets ``PGAPPNAME`` for the
    process (unless already set) to the node's tag, so that every session it
    opens afterwards can be ended by the host that takes the node over: a
    host cut off from the database otherwise keeps its row locks until the
    server's own keepalive (hours by default) drops those sessions.
    """

    def __init__(self, dsn: str, prefix: str, *, takeover_within: float = 10.0, size: int | None = None,
                 tag_sessions: bool = True, on_lost: Callable[[BaseException], None] | None = None) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.]+", prefix):
            raise ValueError(f"node prefix {prefix!r}: use letters, digits, '_' and '.' only")
        if size is not None and size < 1:
            raise ValueError(f"size must be >= 1 or None, not {size!r}")
        self.dsn = dsn
        self.prefix = prefix
        self.size = size
        self.timing = Timing(takeover_within)
        self.database = default_resource_name(dsn)
        self.tag_sessions = tag_sessions
        self.on_lost = on_lost
        self.session: LeaseSession | None = None
        self.claim_: NodeClaim | None = None
        self.lost: BaseException | None = None
        #: reports of the takeovers this host ran, by node (the latest of each)
        self.takeovers: dict[str, RecoveryReport] = {}
        self._pattern = re.compile(re.escape(prefix) + r"-(\d+)")
        self._tm: TransactionManager | None = None
        self._watching = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._listeners: list[Callable[[str], object]] = []
        self._listeners_lock = threading.Lock()

    @classmethod
    def of(cls, tm: Any) -> PostgresNodes | None:
        """The :class:`PostgresNodes` whose :meth:`claim` made ``tm``, if one did: what a part
        built on ``tm`` (a reliable engine) needs to know its node is one of several hosts'."""
        try:
            return _CLAIMED_BY.get(tm)
        except TypeError:  # not weakly referable: not a transaction manager claim() made
            return None

    def add_takeover_listener(self, listener: Callable[[str], object]) -> None:
        """Call ``listener(node)`` after this host took over ``node`` from a host that died
        holding it (before its takeover releases it again): the moment to clear what the dead
        host left under that name besides its transactions.  Called in the watcher's thread;
        what it raises is logged and does not stop the takeover."""
        with self._listeners_lock:
            self._listeners.append(listener)

    def remove_takeover_listener(self, listener: Callable[[str], object]) -> None:
        with self._listeners_lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _taken_over(self, node: str) -> None:
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(node)
            except Exception:  # noqa: BLE001 -- one listener's failure must not stop the takeover
                log.exception("a takeover listener failed for node %s", node)

    @property
    def node(self) -> str | None:
        return self.claim_.node if self.claim_ is not None else None

    @property
    def healthy(self) -> bool:
        """True while this host holds its claim (a health check reports False as "restart me")."""
        return (self.claim_ is not None and self.lost is None and self.session is not None
                and self.session.lost is None)

    # -- claiming a name ---------------------------------------------------------------------

    def claim(self, timeout: float = 60.0, *, log_copy: str | os.PathLike[str] | None = None,
              **tm_options: Any) -> TransactionManager:
        """A transaction manager on the lowest free name, its decisions in the database.

        Waits up to ``timeout`` seconds when ``size`` names are all held.
        ``tm_options`` go to :class:`~txmanager.TransactionManager`
        (``safety_interval`` defaults to 0: a held name has one live holder,
        so its prepared branches that do not run here are a dead holder's).
        The heartbeat starts here; :meth:`start_watcher` adds the takeover.
        The decisions are in the database (``txm_decision``); ``log_copy``
        also keeps a copy of them in that file log, for the operator's tools
        (one per node name: ``{node}`` in the path is replaced by it).
        """
        if self.claim_ is not None:
            raise RuntimeError(f"this host already holds node {self.claim_.node}")
        session = LeaseSession(self.dsn, self.timing, tag=f"txm:{self.prefix} (claiming)")
        try:
            claim = self._claim_name(session, timeout)
            session.run(lambda cur: cur.execute("SELECT set_config('application_name', %s, false)",
                                                (session_tag(claim.node),)))
            in_database = DatabaseLog(claim)
            dlog: DatabaseLog | CopiedLog = in_database
            if log_copy is not None:
                dlog = CopiedLog(in_database, RecoveryLog(str(log_copy).replace("{node}", claim.node)))
            tm_options.setdefault("safety_interval", 0.0)
            tm = TransactionManager(node=claim.node, log=dlog, **tm_options)
        except BaseException:
            session.close()
            raise
        self.session, self.claim_, self._tm = session, claim, tm
        _CLAIMED_BY[tm] = self
        if self.tag_sessions:
            if os.environ.setdefault("PGAPPNAME", session_tag(claim.node)) != session_tag(claim.node):
                log.warning("PGAPPNAME is set (%r): the sessions of this process are not tagged with node "
                            "%s, so a host taking it over cannot end them early", os.environ["PGAPPNAME"],
                            claim.node)
        log.info("process %d holds node %s (epoch %d) in %s; its decisions are in txm_decision",
                 os.getpid(), claim.node, claim.epoch, self.database)
        self._start_thread()
        return tm

    def _claim_name(self, session: LeaseSession, timeout: float) -> NodeClaim:
        started = time.monotonic()
        while True:
            known = self.existing(session)
            for index in known:
                node_id = try_lock(session, self.node_name(index), create=False)
                if node_id is not None:
                    return seize(session, self.node_name(index), node_id, self.database)
            fresh = [i for i in range(len(known) + 1) if i not in known]
            if self.size is None or fresh[0] < self.size:
                node_id = try_lock(session, self.node_name(fresh[0]), create=True)
                if node_id is not None:
                    return seize(session, self.node_name(fresh[0]), node_id, self.database)
            if time.monotonic() - started >= timeout:
                raise NoFreeNodeError(f"all {len(known)} node names {self.prefix}-* in {self.database} stayed "
                                      f"held by live hosts for {timeout}s: run at most {self.size} hosts, "
                                      "or raise the size")
            time.sleep(0.2)

    def node_name(self, index: int) -> str:
        return f"{self.prefix}-{index}"

    def existing(self, session: LeaseSession | None = None) -> list[int]:
        """The indexes of the names ever claimed, in order."""
        session = session or self._session()

        def go(cur: Any) -> list[int]:
            cur.execute("SELECT name FROM txm_node WHERE name LIKE %s", (self.prefix + "-%",))
            return sorted(int(m.group(1)) for (name,) in cur.fetchall() if (m := self._pattern.fullmatch(name)))
        return session.run(go)

    def _session(self) -> LeaseSession:
        if self.session is None:
            raise RuntimeError("claim() a node first")
        return self.session

    # -- taking over ------------------------------------------------------------------------

    def take_over_free(self, resources: Iterable[XAResource]) -> dict[str, RecoveryReport]:
        """Seize every free name of this prefix in turn, recover it with ``resources``, let it go.

        Returns the reports by node.  A name a starting host claims meanwhile
        is skipped (its new holder recovers it)."""
        session = self._session()
        resources = list(resources)
        reports: dict[str, RecoveryReport] = {}
        for index in self.existing(session):
            node = self.node_name(index)
            if node == self.node:
                continue
            node_id = try_lock(session, node, create=False)
            if node_id is None:
                continue
            try:
                report = self._recover(session, node, node_id, resources)
            finally:
                _unlock(session, node_id)
            reports[node] = report
        return reports

    def _recover(self, session: LeaseSession, node: str, node_id: int,
                 resources: list[XAResource]) -> RecoveryReport:
        """One recovery pass for a free name whose lock ``session`` holds now.

        The name is seized (stray sessions ended, epoch raised) only when
        someone held it since it was last recovered (``holder`` set): a name
        that stays free costs this watcher reads, not a write at every tick.
        A fenced holder's late work (a branch it prepared after it lost the
        name) is still found by these passes."""
        def read(cur: Any) -> tuple[str | None, int]:
            cur.execute("SELECT holder, epoch FROM txm_node WHERE id = %s", (node_id,))
            row = cur.fetchone()
            return (row[0], int(row[1])) if row else (None, 0)
        previous, epoch = session.run(read)
        if previous is not None:
            claim = seize(session, node, node_id, self.database, holder=f"(taken over by {self.node})")
        else:
            claim = NodeClaim(session, node, node_id, epoch, self.database)
        started = time.monotonic()
        dlog = DatabaseLog(claim)
        try:
            report = RecoveryManager(dlog, resources, node, safety_interval=0.0).recover_once()
        finally:
            dlog.close()
            if previous is not None:  # a host died holding it: what else it left is stale too
                self._taken_over(node)
        if report.acted or report.errors or report.held or previous is not None:
            log.warning("node %s (held by %s until it died) taken over by %s: %s in %.3fs", node, previous,
                        self.node, report.summary(), time.monotonic() - started)
        if previous is not None and not (report.errors or report.held or report.unfinished or report.waiting):
            def settled(cur: Any) -> None:
                cur.execute("UPDATE txm_node SET holder = NULL WHERE id = %s AND epoch = %s", (node_id, claim.epoch))
            session.run(settled)
        self.takeovers[node] = report
        return report

    # -- the heartbeat and watcher thread --------------------------------------------------------

    def start_watcher(self, tm: TransactionManager | None = None) -> None:
        """Take over free names every ``watch_interval`` with ``tm``'s resources (default: the claimed one's)."""
        if tm is not None:
            self._tm = tm
        self._watching = True
        self._start_thread()

    def stop_watcher(self) -> None:
        self._watching = False

    def _start_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"txm-lease-{self.node}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        session = self._session()
        while not self._stop.wait(self.timing.watch_interval):
            if not session.alive():
                self._lose(session.lost or LeaseLostError("lease session gone"))
                return
            if self._watching and self._tm is not None:
                try:
                    self.take_over_free(list(self._tm._resources))
                except LeaseLostError as exc:
                    self._lose(exc)
                    return
                except Exception:  # noqa: BLE001 -- a failed takeover is retried at the next tick
                    log.exception("taking over free nodes failed; retrying in %.1fs", self.timing.watch_interval)

    def _lose(self, exc: BaseException) -> None:
        self.lost = exc
        log.critical("node %s: the lease session failed (%s): another host may take this node over; this "
                     "process can commit no more XA transactions for it -- restart it", self.node, exc)
        if self.on_lost is not None:
            try:
                self.on_lost(exc)
            except Exception:  # noqa: BLE001
                log.exception("on_lost callback failed")

    def close(self) -> None:
        """Stop the thread and end the lease session: the name is free for others at once."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)
        if self.session is not None:
            self.session.close()


def _unlock(session: LeaseSession, node_id: int) -> None:
    """Let a name go after its takeover (a lost session released it already)."""
    def go(cur: Any) -> None:
        cur.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, node_id))
    try:
        session.run(go)
    except LeaseLostError:
        pass
