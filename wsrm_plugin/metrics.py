"""Prometheus metrics of a message store: the text exposition format and a WSGI app serving it.

Mount :func:`metrics_app` next to the service (it answers ``GET /metrics``
and nothing else), or run ``wsrm status --store URL --serve-metrics PORT``::

    from werkzeug.middleware.dispatcher import DispatcherMiddleware   # or any path router
    app = DispatcherMiddleware(service.wsgi_app, {"/metrics": metrics_app(service.engine.store)})

Every scrape reads the store (without its locks), so the numbers are the
store's, shared by every process using it, not one process's counters.
They are gauges: a sequence that ends takes its counts with it.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import IO, Any

from .status import StoreReport, report
from .store import StorageManager, open_store

__all__ = ["exposition", "metrics_app", "serve_forever", "CONTENT_TYPE", "GAUGES"]

log = logging.getLogger(__name__)

#: The content type of the Prometheus text format, version 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: (name, help, value of a StoreReport) of every store-wide gauge; :mod:`wsrm_plugin.otel.metrics`
#: exposes the same ones as OpenTelemetry instruments.
GAUGES = (
    ("wsrm_unacknowledged_messages", "Messages sent and not yet acknowledged by the peer",
     lambda r: r.unacknowledged),
    ("wsrm_retransmissions", "Retransmissions of the source sequences still in the store (an ended sequence "
     "takes its count with it; ReliableEngine.status() counts a process's retransmissions for good)",
     lambda r: r.retransmissions),
    ("wsrm_faulted_sequences", "Source sequences given up (their messages reported to the application)",
     lambda r: r.faulted_sequences),
    ("wsrm_in_doubt_transactions", "XA branches prepared in the store and not yet decided",
     lambda r: r.in_doubt_transactions),
    ("wsrm_buffered_messages", "Received messages waiting for delivery to the application",
     lambda r: r.buffered),
    ("wsrm_retrying_messages", "Buffered messages whose delivery failed, waiting for their next attempt",
     lambda r: r.waiting_for_retry),
    ("wsrm_poison_messages", "Messages given up after every retry cycle, kept for an operator (wsrm poison)",
     lambda r: r.poison),
    ("wsrm_unreachable_peers", "Peers an engine process using the store cannot reach (their messages wait)",
     lambda r: len({c.subject for c in r.unreachable_peers})),
    ("wsrm_delivery_paused", "Engine processes whose delivery is paused because what their service depends on "
     "is down (messages are received and kept meanwhile)", lambda r: len(r.paused_delivery)),
    ("wsrm_delivery_waiting_messages", "Messages waiting for delivery while it is paused",
     lambda r: r.buffered if r.paused_delivery else 0),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(r: StoreReport) -> str:
    """``r`` in the Prometheus text exposition format (0.0.4)."""
    lines: list[str] = []
    for name, help_text, value in GAUGES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value(r)}"]
    lines += ["# HELP wsrm_sequences Sequences in the store by side and state",
              "# TYPE wsrm_sequences gauge"]
    counts: dict[tuple[str, str], int] = {}
    for s in r.sequences:
        counts[(s.side, s.state)] = counts.get((s.side, s.state), 0) + 1
    for (side, state), n in sorted(counts.items()):
        lines.append(f'wsrm_sequences{{side="{_label(side)}",state="{_label(state)}"}} {n}')
    lines += ["# HELP wsrm_sequence_unacknowledged_messages Unacknowledged messages of each source sequence",
              "# TYPE wsrm_sequence_unacknowledged_messages gauge"]
    for s in r.sequences:
        if s.unacked is not None:
            lines.append(f'wsrm_sequence_unacknowledged_messages{{sequence="{_label(s.sequence_id)}"}} '
                         f"{s.unacked}")
    if r.paused_delivery:
        lines += ["# HELP wsrm_delivery_paused_since_seconds When an engine process's delivery paused (Unix time), "
                  "what its service depends on being down; with its last error",
                  "# TYPE wsrm_delivery_paused_since_seconds gauge"]
        for c in r.paused_delivery:
            lines.append(f'wsrm_delivery_paused_since_seconds{{service="{_label(c.subject)}",'
                         f'reporter="{_label(c.reporter)}",state="{_label(c.state)}",'
                         f'error="{_label(c.last_error or "")}"}} {c.since:.3f}')
    if r.faults:
        lines += ["# HELP wsrm_faulted_sequence Faulted source sequences, with the reason they were given up",
                  "# TYPE wsrm_faulted_sequence gauge"]
        for sequence, reason in r.faults:
            lines.append(f'wsrm_faulted_sequence{{sequence="{_label(sequence)}",reason="{_label(reason)}"}} 1')
    if r.unreachable_peers:
        lines += ["# HELP wsrm_unreachable_peer_since_seconds When a peer became unreachable for a process "
                  "(Unix time), with its last error",
                  "# TYPE wsrm_unreachable_peer_since_seconds gauge"]
        for c in r.unreachable_peers:
            lines.append(f'wsrm_unreachable_peer_since_seconds{{peer="{_label(c.subject)}",'
                         f'reporter="{_label(c.reporter)}",error="{_label(c.last_error or "")}"}} {c.since:.3f}')
    return "\n".join(lines) + "\n"


def metrics_app(store: StorageManager | str) -> Callable[..., Iterable[bytes]]:
    """A WSGI app answering ``GET /metrics`` (or ``/`` when mounted under a prefix) with the exposition."""
    opened = open_store(store) if isinstance(store, str) else store

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"only /metrics is served here\n"]
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"),
                                                       ("Content-Type", "text/plain; charset=utf-8")])
            return [b"use GET\n"]
        try:
            body = exposition(report(opened)).encode("utf-8")
        except Exception:
            log.exception("reading the store for /metrics failed")
            start_response("503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"the store could not be read; see the server log\n"]
        start_response("200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))])
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

    return app


def serve_forever(store: StorageManager, host: str, port: int, *, out: IO[str] | None = None,
                  stop: threading.Event | None = None) -> None:
    """Serve :func:`metrics_app` on ``host:port`` until SIGINT/SIGTERM (or ``stop`` is set)."""
    from .engine.transport import HttpServer

    out = out or sys.stdout
    stop = stop or threading.Event()
    server = HttpServer(metrics_app(store), host, port, threads=2).start()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        out.write(f"serving metrics at {server.url.rstrip('/')}/metrics\n")
        out.flush()
        stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.stop(5)
