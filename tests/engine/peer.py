"""A WS-RM peer in its own process, for tests that need two processes (kill -9, soak, XA).

Server: serve an engine and record every delivery::

    python -m tests.engine.peer --role server --store sqlite:///srv.db --port 0 --log delivered.db

prints ``READY <url>`` once it serves, and stops cleanly on SIGTERM/SIGINT.
Each hand-over to the application is a row in the SQLite ``--log`` file
(duplicates included, so a checker sees them).  With ``--record-dsn`` the
row goes to a PostgreSQL table ``delivered`` instead, in the same XA
transaction as the removal from the invoker buffer (``--tm-log`` is the
transaction manager's recovery log, ``--node`` its name): exactly once even
across kill -9, which a separate SQLite log cannot promise.

Client: send ``--count`` messages (``<prefix><i>`` for i from ``--start``),
optionally ``--close`` the sequence, and wait until the RMS store is empty::

    python -m tests.engine.peer --role client --store sqlite:///cli.db --target URL --count 100 --close

prints one JSON line with the final status and exits 0 when drained, 1 when
``--drain-timeout`` passed first.  ``--count 0`` just finishes what an earlier
(killed) client left in its store.  With ``--record-dsn`` each send is one XA
transaction with an insert into the ``sent`` table.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from typing import Any

from wsrm_plugin.engine import ReliableEngine, RMPolicy

from .support import ACTION, DeliveryLog, item_text, payload

log = logging.getLogger("tests.engine.peer")


def _policy(args: argparse.Namespace) -> RMPolicy:
    return RMPolicy(rm_version=args.rm, base_retransmission_interval=args.base_interval,
                    exponential_backoff=False, max_retries=args.max_retries, poll_interval=0.05,
                    http_timeout=5.0)


def _transaction_manager(args: argparse.Namespace, store: Any) -> tuple[Any, Any]:
    """(tm, XADataSource) when --record-dsn is given, else (None, None)."""
    if not args.record_dsn:
        return None, None
    from txmanager import TransactionManager
    from txmanager.postgres import XADataSource

    tm = TransactionManager(node=args.node, log=args.tm_log, safety_interval=args.safety_interval)
    tm.register_resource(store.xa_resource())
    ds = XADataSource(args.record_dsn, tm)
    with ds.connection() as conn, conn.cursor() as cur:  # local: schema set-up
        cur.execute("CREATE TABLE IF NOT EXISTS delivered (id BIGSERIAL PRIMARY KEY, sequence_id TEXT, "
                    "number BIGINT, message_id TEXT, item TEXT, at DOUBLE PRECISION)")
        cur.execute("CREATE TABLE IF NOT EXISTS sent (id BIGSERIAL PRIMARY KEY, item TEXT)")
    report = tm.recovery.recover_once()
    log.info("recovery at start: %s", report.summary())
    return tm, ds


def run_server(args: argparse.Namespace) -> int:
    from wsrm_plugin.store import open_store

    store = open_store(args.store)
    tm, ds = _transaction_manager(args, store)
    record_log = DeliveryLog(args.log) if args.log else None

    def application(envelope: bytes, context: Any) -> None:
        item = item_text(envelope)
        if ds is not None:
            with ds.connection() as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO delivered (sequence_id, number, message_id, item, at) "
                            "VALUES (%s, %s, %s, %s, %s)",
                            (context.sequence_id, context.message_number, context.message_id, item, time.time()))
        if record_log is not None:
            record_log.record(context.sequence_id, context.message_number, context.message_id, item)

    engine = ReliableEngine(store, _policy(args), tm=tm, application=application, name="peer-server")
    server = engine.serve(args.host, args.port)
    engine.start()
    print(f"READY {server.url}", flush=True)
    _wait_for_signal()
    engine.stop(timeout=5)
    store.close()
    if record_log is not None:
        record_log.close()
    if tm is not None:
        tm.close()
    return 0


def run_client(args: argparse.Namespace) -> int:
    from wsrm_plugin.store import open_store

    store = open_store(args.store)
    tm, ds = _transaction_manager(args, store)
    engine = ReliableEngine(store, _policy(args), tm=tm, name="peer-client").start()
    try:
        for i in range(args.start, args.start + args.count):
            item = f"{args.prefix}{i}"
            if tm is None:
                engine.send(args.target, payload(item), action=ACTION, key=args.key)
                continue
            with tm.transaction():
                with ds.connection() as conn, conn.cursor() as cur:
                    cur.execute("INSERT INTO sent (item) VALUES (%s)", (item,))
                engine.send(args.target, payload(item), action=ACTION, key=args.key)
        if args.close:
            engine.close(args.target, args.key)
        drained = engine.wait_until(lambda s: s.rms_sequences == 0 if args.close else s.unacked == 0,
                                    args.drain_timeout)
        status = engine.status()
        print(json.dumps({"drained": drained, "unacked": status.unacked, "rms_sequences": status.rms_sequences,
                          "messages_sent": status.messages_sent, "retransmissions": status.retransmissions,
                          "faulted_sequences": status.faulted_sequences}), flush=True)
        return 0 if drained else 1
    finally:
        engine.stop(timeout=5)
        store.close()
        if tm is not None:
            tm.close()


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.engine.peer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=("server", "client"), required=True)
    p.add_argument("--store", required=True, help="store URL (memory:, sqlite:///path, postgresql://...)")
    p.add_argument("--rm", default="1.1", choices=("1.0", "1.1"))
    p.add_argument("--base-interval", type=float, default=0.2, help="retransmission interval, seconds")
    p.add_argument("--max-retries", type=int, default=None)
    p.add_argument("--record-dsn", help="PostgreSQL DSN: record in XA transactions (needs --tm-log)")
    p.add_argument("--tm-log", help="the transaction manager's recovery log file")
    p.add_argument("--node", default="peer", help="transaction manager node name (unique per process role)")
    p.add_argument("--safety-interval", type=float, default=5.0)
    p.add_argument("-v", "--verbose", action="count", default=0)
    server = p.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=0)
    server.add_argument("--log", help="SQLite file recording each delivery")
    client = p.add_argument_group("client")
    client.add_argument("--target")
    client.add_argument("--count", type=int, default=0)
    client.add_argument("--start", type=int, default=0)
    client.add_argument("--prefix", default="m")
    client.add_argument("--key", default="")
    client.add_argument("--close", action="store_true")
    client.add_argument("--drain-timeout", type=float, default=60.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), stream=sys.stderr,
                        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s")
    if args.record_dsn and not args.tm_log:
        raise SystemExit("--record-dsn needs --tm-log (the commit decisions must survive a crash)")
    if args.role == "server":
        return run_server(args)
    if not args.target:
        raise SystemExit("--role client needs --target")
    return run_client(args)


if __name__ == "__main__":
    sys.exit(main())
