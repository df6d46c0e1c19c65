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
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from txmanager.nodes import PostgresNodes

from ..store import NodeCondition, StorageManager

__all__ = ["NodeReports", "reporter_name"]

log = logging.getLogger(__name__)

#: The kinds of condition an engine reports (each is withdrawn with its reporter).
KINDS = (NodeCondition.DELIVERY_PAUSED, NodeCondition.UNREACHABLE_PEER)


def reporter_name(name: str, tm: Any = None) -> str:
    """``name@host``, and ``/node`` when ``tm``'s node is one of several hosts' (claimed by a
    :class:`~txmanager.nodes.PostgresNodes`)."""
    base = f"{name}@{socket.gethostname()}"
    return f"{base}/{tm.node}" if PostgresNodes.of(tm) is not None else base


def _host_and_node(reporter: str) -> tuple[str, str] | None:
    """``(host, node)`` of ``name@host/node``; None for a reporter without a node."""
    head, slash, node = reporter.rpartition("/")
    _, at, host = head.rpartition("@")
    return (host, node) if slash and at else None


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
