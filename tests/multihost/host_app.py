"""One host of the multi-host deployment, as ``docs/deploy.md`` runs it: ``python -m tests.multihost.host_app``.

Built in each host process: a node name claimed in the store's database
(:class:`txmanager.nodes.PostgresNodes`, its decisions in ``txm_decision``),
the orders data source, the reliable spyne service on the shared PostgreSQL
store with its public address (the load balancer's), background recovery,
the takeover watcher; the service's ``/healthz/ready`` for the load
balancer (503 once the host lost its node, as ``/healthz/live``).  Configuration from the environment:

``STORE_DSN``, ``ORDERS_DSN``, ``PUBLIC_URL``, ``LISTEN`` (``host:port``),
``MARK_DIR`` (required); ``PREFIX`` (default ``orders``), ``TAKEOVER_WITHIN``
(seconds, default the policy's); ``HOLD_ITEM``: the delivery of that item
stops once its orders branch is prepared (the mark not written), writes
``held-<pid>`` into ``MARK_DIR``, and goes on when ``MARK_DIR/release``
appears (only the first delivery of it, on any host).  Each process writes ``started-<pid>`` (its node) there.
``OUTAGE_FILE``: while that file exists, this host's deliveries fail as a database outage fails (a
refused connection), so its delivery pauses.  ``UNREACHABLE_PEER``: an address this host sends one
message to at start (nobody answers there, so the peer is judged unreachable).

Test-only endpoints, served on the host's own address: ``/probe-commit``
runs one XA transaction across both databases and ``/probe-decision``
writes one decision to the node's log; each answers ``committed`` or
``refused: <why>`` (a host that lost its node must refuse both).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from interceptors.spyne_server.service import reliable_service
from txmanager.nodes import PostgresNodes
from txmanager.postgres import XADataSource
from txmanager.xid import Xid
from wsrm_plugin.engine import RMPolicy
from wsrm_plugin.engine.transport import HttpServer
from tests.spyne_server import service

log = logging.getLogger("tests.multihost.host_app")

MARK_DIR = Path(os.environ["MARK_DIR"])
HOLD_ITEM = os.environ.get("HOLD_ITEM")
_holding = threading.local()


def _mark(name: str, content: dict[str, Any]) -> None:
    tmp = MARK_DIR / f".{name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(content))
    tmp.rename(MARK_DIR / name)


def _checkpoint(point: str, index: int) -> None:
    """Hold the delivery of HOLD_ITEM with its orders branch prepared, until the test releases it."""
    if point == "prepared" and getattr(_holding, "item", None):
        _holding.item = None
        try:  # only the first host to deliver it holds it: the one that redelivers it must not
            os.close(os.open(MARK_DIR / "hold-taken", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        _mark(f"held-{os.getpid()}", {"node": nodes.node, "pid": os.getpid()})
        while not (MARK_DIR / "release").exists():
            time.sleep(0.05)
        _mark(f"released-{os.getpid()}", {"node": nodes.node})


OUTAGE_FILE = os.environ.get("OUTAGE_FILE")


def _insert(item: str) -> None:
    if OUTAGE_FILE and os.path.exists(OUTAGE_FILE):
        raise ConnectionRefusedError(f"the orders database refused the connection ({OUTAGE_FILE} exists)")
    _holding.item = item if item == HOLD_ITEM else None
    _plain_insert(item)


POLICY = RMPolicy(base_retransmission_interval=0.3, exponential_backoff=False,
                  poll_interval=float(os.environ.get("POLL_INTERVAL", "0.05")),
                  http_timeout=5.0, soap_version="1.1",
                  host_takeover_within=float(os.environ.get("TAKEOVER_WITHIN", RMPolicy().host_takeover_within)))

nodes = PostgresNodes(os.environ["STORE_DSN"], os.environ.get("PREFIX", "orders"),
                      takeover_within=POLICY.host_takeover_within)
tm = nodes.claim(checkpoint=_checkpoint if HOLD_ITEM else None)
ds = XADataSource(os.environ["ORDERS_DSN"], tm)
probe_ds = XADataSource(os.environ["STORE_DSN"], tm, commit_marks=True)
service.configure(ds=ds, node=tm.node)
_plain_insert = service._insert
service._insert = _insert  # type: ignore[assignment]
app = reliable_service(service.application(), "postgresql:" + os.environ["STORE_DSN"], POLICY, tm=tm,
                       recovery_interval=1.0, endpoint_address=os.environ["PUBLIC_URL"])


def _probe_commit() -> str:
    try:
        with tm.transaction():
            with ds.connection() as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO orders (item, node) VALUES (%s, %s)", (f"probe-{os.getpid()}", tm.node))
            with probe_ds.connection() as conn, conn.cursor() as cur:
                cur.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 -- the answer the test reads
        return f"refused: {exc!r} caused by {exc.__cause__!r}"
    return "committed"


def _probe_decision() -> str:
    gxid = Xid.new_global(tm.node)
    try:
        tm.log.log_commit_decision(gxid, [(gxid.branch(b"0"), "probe")])
    except Exception as exc:  # noqa: BLE001
        return f"refused: {exc!r}"
    return "committed"


def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
    path = environ.get("PATH_INFO", "/")
    if path in ("/probe-commit", "/probe-decision"):
        body = _probe_commit() if path == "/probe-commit" else _probe_decision()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [body.encode()]
    return app(environ, start_response)  # /healthz/live and /healthz/ready included


def main() -> None:
    host, port = os.environ["LISTEN"].rsplit(":", 1)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    report = app.start().lifecycle_report
    nodes.start_watcher(tm)
    server = HttpServer(wsgi, host, int(port), threads=8).start()
    if os.environ.get("UNREACHABLE_PEER"):
        from tests.spyne_server.conftest import Envelopes, action

        envelope = Envelopes(server.url)("record", f"to-nowhere-{os.getpid()}")
        app.engine.send(os.environ["UNREACHABLE_PEER"], envelope, action=action("record"))
    recovery = report.recovery if report is not None else None
    _mark(f"started-{os.getpid()}", {"node": tm.node, "pid": os.getpid(), "epoch": nodes.claim_.epoch,
                                      "rolled_back": len(recovery.rolled_back) if recovery else 0,
                                      "committed": len(recovery.committed) if recovery else 0})
    print(f"READY {tm.node} {server.url}", flush=True)
    try:
        stop.wait()
    finally:
        server.stop(5)
        app.stop(timeout=5)
        nodes.close()
        probe_ds.close()
        ds.close()
        tm.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    main()
