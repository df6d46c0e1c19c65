"""``wsrm status``: what a message store holds, as a table, as Prometheus text, or served.

::

    wsrm status --store sqlite:///var/lib/orders/rm.db
    wsrm status --store postgresql://rm@db/orders --prometheus
    wsrm status --store sqlite:///rm.db --serve-metrics 9464     # GET /metrics until Ctrl-C

The table and its counters are :mod:`wsrm_plugin.status`'s report (see there
for what each says and when to alert on it); the Prometheus text and the
metrics server are :mod:`wsrm_plugin.metrics`'.  This module only assembles the
command, so that the report and the metrics, which build on it, do not import
each other.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO

from .metrics import exposition, serve_forever
from .status import format_report, report
from .store import open_store

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True,
                   help="the store URL: sqlite:///path.db, postgresql://..., memory: (empty, for tests)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--prometheus", action="store_true",
                      help="print the Prometheus text exposition format instead of the table")
    what.add_argument("--serve-metrics", type=int, metavar="PORT",
                      help="serve the metrics at http://HOST:PORT/metrics until interrupted")
    p.add_argument("--host", default="127.0.0.1", help="address for --serve-metrics (default 127.0.0.1)")


def run(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    try:
        store = open_store(args.store, create=False)
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"wsrm status: cannot open {args.store!r}: {exc}\n")
        return 2
    except Exception as exc:  # a store error (unreachable database, newer schema...)
        sys.stderr.write(f"wsrm status: cannot open {args.store!r}: {type(exc).__name__}: {exc}\n")
        return 2
    try:
        if args.serve_metrics is not None:
            serve_forever(store, args.host, args.serve_metrics, out=out)
            return 0
        r = report(store)
        if args.prometheus:
            out.write(exposition(r))
        else:
            out.write(format_report(r))
        return 0
    finally:
        store.close()
