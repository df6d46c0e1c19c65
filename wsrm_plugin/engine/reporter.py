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
taken over (:class:`NodeReports`).
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


def _node_of(reporter: str) -> str | None:
    head, slash, node = reporter.rpartition("/")
    return node if slash and "@" in head else None


class NodeReports:
    """Removes the reports of a node that a living host took over (see the module docstring).

    :meth:`attach` registers with the :class:`~txmanager.nodes.PostgresNodes`
    that claimed ``tm``'s node (nothing to do for one host); the listener runs
    in that host's takeover watcher, right after it seized the dead node.
    """

    def __init__(self, store: StorageManager, tm: Any = None) -> None:
        self.store = store
        self.nodes = PostgresNodes.of(tm)
        #: Reports removed, by node taken over (for tests and operators).
        self.cleared: dict[str, int] = {}

    def attach(self) -> None:
        if self.nodes is not None:
            self.nodes.add_takeover_listener(self.forget)

    def detach(self) -> None:
        if self.nodes is not None:
            self.nodes.remove_takeover_listener(self.forget)

    def forget(self, node: str) -> int:
        """Remove every condition reported from ``node`` (whatever the engine or host name); how many."""
        removed = 0
        with self.store.begin() as tx:
            for kind in KINDS:
                for condition in tx.conditions.list_all(kind):
                    if _node_of(condition.reporter) == node:
                        removed += tx.conditions.remove(kind, subject=condition.subject,
                                                        reporter=condition.reporter)
        self.cleared[node] = self.cleared.get(node, 0) + removed
        if removed:
            log.info("node %s was taken over (its host died): %d condition(s) it reported to the store "
                     "(a paused delivery, unreachable peers) are withdrawn", node, removed)
        return removed
