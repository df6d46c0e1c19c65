"""``wsrm status``: what a message store holds, for an operator.

::

    wsrm status --store sqlite:///var/lib/orders/rm.db
    wsrm status --store postgresql://rm@db/orders --prometheus
    wsrm status --store sqlite:///rm.db --serve-metrics 9464     # GET /metrics until Ctrl-C

The table lists every sequence in the store: its side (``source``: messages
this node sends; ``destination``: messages it receives), identifier, state,
unacknowledged messages, retransmissions and last activity.  The counters
below it are the ones to alert on: unacknowledged messages (a peer not
answering), retransmissions (a lossy network), faulted sequences (given up,
each listed with its reason; the application was told through its calls'
futures and callbacks and the ``on_sequence_fault`` hook, and ``wsrm resend``
sends their messages again) and in-doubt transactions (XA branches
prepared in the store and not yet decided: they block it until recovery runs,
see ``wsrm recover``), messages waiting for a retry (their delivery failed:
the application or its database is in trouble) and poison messages (every
retry cycle failed: they wait for an operator, see ``wsrm poison``).  Last
come the peers a running engine cannot reach: since when, its last error, how
many probes went and how many messages it holds for the peer (reported by
each engine process into the store, so the command sees them from outside).

The status is read without taking the store's locks, so it is safe against
a running engine, even one stuck behind in-doubt branches.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from .store import NodeCondition, StorageManager, StoreStatus

__all__ = ["SequenceRow", "StoreReport", "report", "format_report"]


@dataclass(frozen=True)
class SequenceRow:
    side: str  # "source" | "destination"
    sequence_id: str  # the peer-visible identifier ("(creating)" for a source not yet answered)
    state: str
    unacked: int | None  # source only: messages not yet acknowledged
    retransmissions: int | None  # source only
    messages: str  # source: highest number sent; destination: ranges received
    last_activity: float  # wall-clock seconds, 0 when never


@dataclass(frozen=True)
class StoreReport:
    """A store's sequences and counters, as ``wsrm status`` shows them."""

    store: str
    sequences: tuple[SequenceRow, ...]
    unacknowledged: int
    retransmissions: int
    faulted_sequences: int
    in_doubt_transactions: int
    buffered: int
    by_state: dict[str, int]
    #: (sequence, reason) of each faulted source sequence: why it was given up
    faults: tuple[tuple[str, str], ...] = ()
    #: Buffered messages whose delivery failed and that wait for their next attempt.
    waiting_for_retry: int = 0
    #: Messages in the poison store (``wsrm poison list``).
    poison: int = 0
    #: Peers engine processes report they cannot reach (one per peer and process).
    unreachable_peers: tuple[NodeCondition, ...] = ()
    #: Engine processes whose delivery is paused: what their application depends on is down.
    paused_delivery: tuple[NodeCondition, ...] = ()

    @classmethod
    def of(cls, url: str, status: StoreStatus) -> StoreReport:
        rows = [SequenceRow("source", s.sequence_id or f"(creating: {s.key})", s.state, s.unacked,
                            s.retransmissions, str(s.next_number - 1), s.last_activity) for s in status.rms]
        rows += [SequenceRow("destination", s.sequence_id, s.state, None, None, s.received or "-",
                             s.last_activity) for s in status.rmd]
        return cls(store=url, sequences=tuple(rows), unacknowledged=status.unacked,
                   retransmissions=status.retransmissions, faulted_sequences=status.faulted,
                   in_doubt_transactions=status.prepared_branches, buffered=status.buffered,
                   by_state=status.by_state(), waiting_for_retry=status.retrying, poison=status.poisoned,
                   faults=tuple((s.sequence_id or f"(creating: {s.key})", s.fault_reason or "faulted")
                                for s in status.rms if s.state == "faulted"),
                   unreachable_peers=tuple(c for c in status.conditions
                                           if c.kind == NodeCondition.UNREACHABLE_PEER),
                   paused_delivery=tuple(c for c in status.conditions
                                         if c.kind == NodeCondition.DELIVERY_PAUSED))


def report(store: StorageManager) -> StoreReport:
    """Read ``store``'s status (without waiting for its locks)."""
    return StoreReport.of(_safe_url(store.url), store.status())


def _safe_url(url: str) -> str:
    """The store URL without a password, for printing."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def _when(ts: float) -> str:
    if not ts:
        return "-"
    return datetime.datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds")


def format_report(r: StoreReport) -> str:
    header = ("side", "id", "state", "unacked", "retransmissions", "messages", "last activity")
    rows = [(s.side, s.sequence_id, s.state, "-" if s.unacked is None else str(s.unacked),
             "-" if s.retransmissions is None else str(s.retransmissions), s.messages,
             _when(s.last_activity)) for s in r.sequences]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    out = [f"store {r.store}", ""]
    if rows:
        out += [line(header), line(tuple("-" * w for w in widths)), *map(line, rows)]
    else:
        out.append("no sequences")
    out += [
        "",
        f"unacknowledged messages   {r.unacknowledged}",
        f"retransmissions           {r.retransmissions}",
        f"faulted sequences         {r.faulted_sequences}",
        f"in-doubt transactions     {r.in_doubt_transactions}"
        + ("   (run `wsrm recover`)" if r.in_doubt_transactions else ""),
        f"messages awaiting delivery {r.buffered}",
        f"waiting for a retry       {r.waiting_for_retry}",
        f"poison messages           {r.poison}" + ("   (run `wsrm poison list`)" if r.poison else ""),
        f"unreachable peers         {len({c.subject for c in r.unreachable_peers})}",
        "delivery                  " + (f"PAUSED ({len(r.paused_delivery)} process(es))" if r.paused_delivery
                                        else "running"),
    ]
    if r.faults:
        out += ["", ("faulted sequences (their unacknowledged messages are kept; once the cause is fixed, "
                     "`wsrm resend --store URL --sequence ID` sends them again on a new sequence):")]
        out += [f"  {sequence}: {reason}" for sequence, reason in r.faults]
    for c in r.paused_delivery:
        out += ["", f"DELIVERY PAUSED: {c.subject} since {_when(c.since)} ({c.state}): what the service depends "
                    "on is down; messages are received, acknowledged and kept, none counted against its attempts",
                f"  {c.detail}; last error: {c.last_error or '-'} (reported by {c.reporter} at {_when(c.reported_at)})"]
    if r.unreachable_peers:
        out += ["", ("unreachable peers (their messages wait unsent; one probe at a time goes to each, and "
                     "its first answer sends them):")]
        for c in r.unreachable_peers:
            out.append(f"  {c.subject}: since {_when(c.since)}, {c.state}; {c.detail}; last error: "
                       f"{c.last_error or '-'} (reported by {c.reporter} at {_when(c.reported_at)})")
    return "\n".join(out) + "\n"
