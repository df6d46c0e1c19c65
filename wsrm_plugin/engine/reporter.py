"""Who reports a condition into the store, and who clears what a dead host reported.

An engine process reports what it sees of its dependencies into the store's
``node_condition`` table (a paused delivery, :mod:`.outage`; unreachable
peers, :mod:`.retransmission`), so that ``wsrm status`` and the metrics, in
other processes, see it.  It withdraws its reports when the condition ends
and when it stops; a process that dies cannot, and its successor on the same
host withdraws them at its start (the reports carry the engine's name and the
host's).

With several hosts on one PostgreSQL store (:class:`txmanager.nodes.PostgresNodes`)
a host that dies usually never comes back under its name (a scale-in, a lost
VM): nobody would withdraw its reports, and every ``wsrm status`` would show
its paused delivery for ever.  The death of a host is proven, without a
clock, when a living host takes its node over; so the reporter names the node
too (``orders@web1/orders-2``: simulated hosts may share a host name), and the
engine registers with the takeover to remove every report made under a node
taken over (:class:`NodeReports`).  A host that claims a dead host's name
before anyone took it over (no other host was alive) clears the reports made
under it from other host names at its start: it holds the name, so their
makers are gone.

Several processes of one host on one store (gunicorn workers) must not share
a reporter name either, or one worker's start withdraws a living sibling's
paused delivery.  Under a transaction manager each has a node of its own
(:class:`txmanager.slots.NodeSlots`), named in the reporter, and the next
holder of a slot withdraws what its dead holder left.  Without one the
reporter names the process (``orders@web1#4711``), and a start withdraws the
reports of this host's processes that no longer run: the kernel says which.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from txmanager.nodes import PostgresNodes

from ..store import NodeCondition, StorageManager

__all__ = ["NodeReports", "reporter_name"]

log = logging.getLogger(__name__)

#: The kinds of condition an engine reports (each is withdrawn with its reporter).
KINDS = (NodeCondition.DELIVERY_PAUSED, NodeCondition.UNREACHABLE_PEER)


def reporter_name(name: str, tm: Any = None) -> str:
    """``name@host/node`` under a transaction manager (its node is this process's alone among
    those sharing the store), ``name@host#pid`` without one."""
    base = f"{name}@{socket.gethostname()}"
    node = getattr(tm, "node", None)
    return f"{base}/{node}" if node else f"{base}#{os.getpid()}"


def _host_and_node(reporter: str) -> tuple[str, str] | None:
    """``(host, node)`` of ``name@host/node``; None for a reporter without a node."""
    head, slash, node = reporter.rpartition("/")
    _, at, host = head.rpartition("@")
    return (host, node) if slash and at else None


def _host_and_pid(reporter: str) -> tuple[str, int] | None:
    """``(host, pid)`` of ``name@host#pid``; None for any other reporter."""
    head, hash_, pid = reporter.rpartition("#")
    _, at, host = head.rpartition("@")
    return (host, int(pid)) if hash_ and at and pid.isdigit() else None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


class NodeReports:
    """Removes the reports of a node that a living host took over (see the module docstring).

    :meth:`attach` registers with the :class:`~txmanager.nodes.PostgresNodes`
    that claimed ``tm``'s node (nothing to do for one host); the listener runs
    in that host's takeover watcher, right after it seized the dead node.
    """

    def __init__(self, store: StorageManager, tm: Any = None) -> None:
        self.store = store
        self.nodes = PostgresNodes.of(tm)
        self.node: str | None = tm.node if self.nodes is not None else None
        #: Reports removed, by node taken over (for tests and operators).
        self.cleared: dict[str, int] = {}

    def attach(self) -> None:
        """At the engine's start: listen to the takeovers, and clear what earlier holders of this
        node on other hosts left (those on this host are its predecessors', withdrawn by name, or
        a sibling engine's of this process)."""
        if self.nodes is None or self.node is None:
            try:
                self.forget_dead_processes()
            except Exception as exc:  # noqa: BLE001 -- the store is down: the next start clears them
                log.debug("reports of this host's dead processes not withdrawn: %s", exc)
            return
        self.nodes.add_takeover_listener(self.forget)
        try:
            self.forget(self.node, except_host=socket.gethostname())
        except Exception as exc:  # noqa: BLE001 -- the store is down: the next takeover or start clears them
            log.debug("reports of earlier holders of node %s not withdrawn: %s", self.node, exc)

    def detach(self) -> None:
        if self.nodes is not None:
            self.nodes.remove_takeover_listener(self.forget)

    def forget(self, node: str, *, except_host: str | None = None) -> int:
        """Remove every condition reported from ``node`` (whatever the engine or host name, but
        ``except_host``); how many."""
        removed = 0
        with self.store.begin() as tx:
            for kind in KINDS:
                for condition in tx.conditions.list_all(kind):
                    where = _host_and_node(condition.reporter)
                    if where is not None and where[1] == node and where[0] != except_host:
                        removed += tx.conditions.remove(kind, subject=condition.subject,
                                                        reporter=condition.reporter)
        self.cleared[node] = self.cleared.get(node, 0) + removed
        if removed:
            log.info("node %s was taken over (its host died): %d condition(s) it reported to the store "
                     "(a paused delivery, unreachable peers) are withdrawn", node, removed)
        return removed

    def forget_dead_processes(self) -> int:
        """Remove the conditions reported by processes of this host that no longer run
        (reporters ``name@host#pid``, engines without a transaction manager); how many."""
        host, removed = socket.gethostname(), 0
        with self.store.begin() as tx:
            for kind in KINDS:
                for condition in tx.conditions.list_all(kind):
                    who = _host_and_pid(condition.reporter)
                    if who is not None and who[0] == host and who[1] != os.getpid() and not _running(who[1]):
                        removed += tx.conditions.remove(kind, subject=condition.subject,
                                                        reporter=condition.reporter)
        if removed:
            log.info("%d condition(s) reported by processes of this host that no longer run are withdrawn",
                     removed)
        return removed
