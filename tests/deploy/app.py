"""The test service as a deployment runs it: one module a WSGI server imports in each process.

``gunicorn -w 3 tests.deploy.app:app`` (or ``python -m tests.deploy.app`` for
waitress with threads) builds, in each process: a transaction manager on a
node slot claimed in ``SLOT_DIR`` (:class:`txmanager.slots.NodeSlots`), the
orders data source, the reliable spyne service on the shared PostgreSQL
store, its background recovery, and the orphan-slot sweeper.  It mirrors
``docs/deploy.md``; configuration comes from the environment:

``WSRM_STORE``, ``ORDERS_DSN``, ``SLOT_DIR`` (required), ``SLOT_PREFIX``
(default ``orders``), ``DELAY`` (seconds each delivery sleeps), and for the
fault test ``HOLD_ITEM`` / ``MARK_DIR``: the process delivering that item
stops for good once its commit decision is logged (both branches prepared),
after writing ``held-<pid>`` with its node name into ``MARK_DIR``.  Each
process writes ``started-<pid>`` (its node and start-up recovery) there too.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from interceptors.spyne_server.service import reliable_service
from txmanager.postgres import XADataSource
from txmanager.slots import NodeSlots
from wsrm_plugin.engine import RMPolicy
from tests.spyne_server import service

log = logging.getLogger("tests.deploy.app")

_holding = threading.local()
MARK_DIR = Path(os.environ["MARK_DIR"]) if os.environ.get("MARK_DIR") else None


def _mark(name: str, content: dict[str, Any]) -> None:
    if MARK_DIR is not None:
        tmp = MARK_DIR / f".{name}.tmp"
        tmp.write_text(json.dumps(content))
        tmp.rename(MARK_DIR / name)


def _checkpoint(point: str, index: int) -> None:
    """The crash-test hook: hold the transaction of HOLD_ITEM once its decision is logged."""
    if point == "logged" and getattr(_holding, "item", None):
        _mark(f"held-{os.getpid()}", {"node": tm.node, "item": _holding.item, "pid": os.getpid()})
        while True:  # until the test kills this process
            time.sleep(3600)


class _HoldingService:
    """Remembers, in the delivering thread, that the item to hold is being delivered."""

    def __init__(self, hold: str | None) -> None:
        self.hold = hold
        self._insert = service._insert

    def __call__(self, item: str) -> None:
        _holding.item = item if item == self.hold else None
        self._insert(item)


POLICY = RMPolicy(base_retransmission_interval=0.2, exponential_backoff=False, poll_interval=0.05,
                  http_timeout=5.0, soap_version="1.1")

slots = NodeSlots(os.environ["SLOT_DIR"], os.environ.get("SLOT_PREFIX", "orders"))
tm = slots.claim(checkpoint=_checkpoint)
ds = XADataSource(os.environ["ORDERS_DSN"], tm)
service.configure(ds=ds, node=tm.node, delay=float(os.environ.get("DELAY", "0")))
service._insert = _HoldingService(os.environ.get("HOLD_ITEM"))  # type: ignore[assignment]
app = reliable_service(service.application(), os.environ["WSRM_STORE"], POLICY, tm=tm, recovery_interval=1.0)
app.start()  # start-up recovery first: a slot's previous holder may have died mid-commit
slots.start_sweeper(tm, interval=1.0)
_report = app.lifecycle_report.recovery if app.lifecycle_report is not None else None
_mark(f"started-{os.getpid()}", {"node": tm.node, "pid": os.getpid(),
                                  "committed": len(_report.committed) if _report else 0,
                                  "rolled_back": len(_report.rolled_back) if _report else 0})


def shutdown() -> None:
    """Stop the service cleanly (gunicorn's ``worker_exit`` hook, waitress's exit)."""
    slots.stop_sweeper()
    app.stop(timeout=5)
    ds.close()
    tm.close()


def main() -> None:
    """Serve with waitress (8 threads) on ``--port`` until SIGTERM/SIGINT."""
    import signal

    from wsrm_plugin.engine.transport import HttpServer

    port = int(sys.argv[sys.argv.index("--port") + 1])
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = HttpServer(app, "127.0.0.1", port, threads=8).start()
    print(f"READY {server.url}", flush=True)
    try:
        stop.wait()
    finally:
        server.stop(5)
        shutdown()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    main()
