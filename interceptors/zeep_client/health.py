"""Is this client keeping up?  :meth:`ReliableClient.health() <interceptors.zeep_client.client.ReliableClient.health>`.

What a process manager or the application's own ``/health`` asks of a
reliable client, read from its store (without the store's locks) and its
engine: how many calls are not yet acknowledged by the service and how long
the oldest has waited (a service down or unreachable makes that age grow),
faulted sequences (their calls wait for ``resend_faulted``), replies
awaited by futures in this process, and whether the engine runs.

``status`` is ``fail`` when the store cannot be read or the engine is not
running (nothing is sent), ``warn`` when a sequence is faulted, when the
service (or another peer of the engine) is unreachable, or when the oldest
unacknowledged call is older than ``max_age`` seconds or there are more than
``max_unacknowledged`` calls (when given), else ``pass``: the statuses of
:mod:`wsrm_plugin.health`, whose JSON shape ``to_json`` has.

An unreachable peer (the sender's circuit breaker open: its calls wait in
the store, one probe at a time goes to it, all go at once when it answers)
makes the client degraded, not failed: the client still takes calls and
keeps every one, which is what a reliable client is for, and restarting or
unrouting it would not bring the service back (Spring Boot keeps such a
dependency out of its readiness group for the same reason).
``max_unreachable_peers=N`` fails beyond N (0: any), for an application
that would rather stop taking work while its service is away.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from wsrm_plugin.engine.source import SequenceKey
from wsrm_plugin.health import Check, HealthReport, peers_check

__all__ = ["ClientHealth", "client_health"]


@dataclass(frozen=True)
class ClientHealth:
    """A reliable client's state for a health check (see the module docstring)."""

    #: Calls stored and not yet acknowledged by the service.
    unacknowledged: int
    #: Seconds since the oldest of them was stored; None when there is none.
    oldest_unacknowledged_age: float | None
    #: Faulted sequences of this client: identifier -> why it was given up.
    faulted: dict[str, str] = field(default_factory=dict)
    #: In-out calls whose futures wait for their reply in this process.
    pending_replies: int = 0
    #: The engine's workers run (between start and stop).
    running: bool = False
    #: Why the store could not be read, when it could not (the counts are then 0).
    store_error: str | None = None
    #: The peers the engine's sender judged unreachable (its circuit breaker open), by address.
    unreachable_peers: tuple[str, ...] = ()
    report: HealthReport = field(default_factory=lambda: HealthReport(()))

    @property
    def status(self) -> str:
        return self.report.status

    def to_json(self) -> dict[str, Any]:
        return self.report.to_json()


def client_health(rc: Any, *, max_unacknowledged: int | None = None, max_age: float | None = None,
                  max_unreachable_peers: int | None = None) -> ClientHealth:
    """The health of reliable client ``rc`` (thresholds as in the module docstring)."""
    running = bool(rc.engine.started)
    checks = [Check("engine", "pass" if running else "fail",
                    "workers running" if running else "the client is not started (nothing is sent)")]
    unacked, oldest, error = 0, None, None
    faulted: dict[str, str] = {}
    try:
        unacked, oldest, faulted = _read(rc)
    except Exception as exc:  # noqa: BLE001 -- the check's answer
        error = f"{type(exc).__name__}: {exc}"
    now = time.time()
    age = None if oldest is None else max(0.0, now - oldest)
    if error is not None:
        checks.append(Check("store", "fail", f"the store cannot be read: {error}"))
    else:
        checks.append(Check("store", "pass", f"{type(rc.engine.store).__name__} answered"))
        late = (max_age is not None and age is not None and age > max_age) or (
            max_unacknowledged is not None and unacked > max_unacknowledged)
        what = f"{unacked} call(s) not acknowledged"
        if age is not None:
            what += f", the oldest stored {age:.1f} s ago"
        checks.append(Check("acknowledgements", "warn" if late else "pass", what,
                            {"unacknowledged": unacked, "oldest_unacknowledged_age": age}))
        checks.append(Check("sequences", "warn" if faulted else "pass",
                            f"{len(faulted)} faulted sequence(s): resend_faulted() once the cause is fixed"
                            if faulted else "no faulted sequence", {"faulted": faulted} if faulted else {}))
    unreachable = rc.engine.retransmission.reachability.unreachable()  # in memory: no store needed
    checks.append(peers_check(unreachable, max_unreachable_peers))
    return ClientHealth(unacknowledged=unacked, oldest_unacknowledged_age=age, faulted=faulted,
                        pending_replies=rc.pending_futures(), running=running, store_error=error,
                        unreachable_peers=tuple(p.address for p in unreachable), report=HealthReport(tuple(checks)))


def _read(rc: Any) -> tuple[int, float | None, dict[str, str]]:
    unacked = 0
    oldest: float | None = None
    faulted: dict[str, str] = {}
    with rc.engine.store.begin(durable=False) as tx:
        for seq in tx.rms.list_all():
            parsed = SequenceKey.decode(seq.key)
            if parsed is None or parsed.key != rc.key:
                continue
            count = tx.rms_messages.count_unacked(seq.key)
            if count:
                unacked += count
                first = tx.rms_messages.oldest_unacked(seq.key)
                if first is not None and (oldest is None or first < oldest):
                    oldest = first
            if seq.faulted:
                faulted[seq.sequence_id or f"(creating: {seq.key})"] = seq.fault_reason or "faulted"
    return unacked, oldest, faulted
