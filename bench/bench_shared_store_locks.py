"""Deadlocks and lock waits of client engines sharing one PostgreSQL store.

Worker processes, or several clients in one process, share a store and claim, acknowledge and
settle each other's sequences: where two of them take rows or locks in different orders,
PostgreSQL finds a deadlock and rolls one back (the victim retries, or its caller gets the error),
and where one holds a lock long, the others queue behind it.  Neither shows in a rate on a loaded
machine; the server's own log shows both.

``--clients`` reliable zeep clients (each its own engine and sequence: ``reliable_client(key=)``)
share one PostgreSQL client store and call a reliable spyne service (16 HTTP threads, under a
transaction manager, its method inserting a row through an ``XADataSource``: the ``xa1`` scenario
of ``bench_compare.py``), each ``--calls`` one-way calls from its own thread.  The throwaway server
logs every lock wait longer than ``--wait-ms`` (``log_lock_waits``, ``deadlock_timeout``) with
the statement that waited (``log_min_error_statement``).  Printed: what was delivered, the
deadlocks (with both sides' statements, as PostgreSQL reports them), the lock waits, and the waits
by the statement that waited (its first words) in each database, with the longest waits (those
that ended: "acquired ... after N ms").

Run::

    .venv/bin/python bench/bench_shared_store_locks.py [--clients 16] [--calls 150]
        [--interval 1.0] [--wait-ms 200] [--rounds 1] [--log-statements] [--keep-log PATH]

``--log-statements`` also logs every statement of the client store (to read a deadlock's
transactions in the kept log: slower).  ``--rounds`` repeats the run, each on a fresh server.
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for where in (ROOT, ROOT / "bench"):
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))

log = logging.getLogger("bench_shared_store_locks")

#: a server log line's prefix (``log_line_prefix``): time, process, database, virtual transaction
_PREFIX = "%m [%p] %d %v "
_LINE = re.compile(r"^(\S+ \S+) \S+ \[(\d+)\] (\S*) (\S*) (\w+):\s+(.*)$")
_ACQUIRED = re.compile(r"acquired \w+ on .* after ([\d.]+) ms")


def run_once(clients: int, calls: int, interval: float, wait_ms: int,
             log_statements: bool) -> tuple[dict[str, Any], str]:
    """One run on a fresh server: its figures, and the server's log."""
    import psycopg2
    import zeep

    import bench_server_path as service_path
    from interceptors.spyne_server.service import reliable_service
    from interceptors.zeep_client.client import reliable_client
    from txmanager import TransactionManager
    from txmanager.postgres import XADataSource
    from wsrm_plugin.engine import RMPolicy
    from wsrm_plugin.engine.transport import HttpServer
    from wsrm_plugin.store import open_store
    from wsrm_plugin.tools.pgserver import ThrowawayPostgres

    policy = RMPolicy(soap_version="1.1", base_retransmission_interval=interval)
    tmp = Path(tempfile.mkdtemp(prefix="bench-locks-"))
    pg = ThrowawayPostgres(settings={
        "max_connections": "400", "log_lock_waits": "on", "deadlock_timeout": f"{wait_ms}ms",
        "log_min_error_statement": "log", "log_line_prefix": _PREFIX}).start()
    rcs: list[Any] = []
    try:
        dsn, client_dsn = pg.create_database("srv"), pg.create_database("cli")
        tm = TransactionManager(node="bench-locks-server", log=tmp / "tm.log")
        service_path.DATA_SOURCE = XADataSource(dsn, tm)
        open_store(f"postgresql:{dsn}").close()
        conn = psycopg2.connect(dsn)
        with conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE received (item text NOT NULL, note text)")
        conn.close()
        if log_statements:
            conn = psycopg2.connect(client_dsn)
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("ALTER DATABASE cli SET log_statement = 'all'")
            conn.close()
        service = reliable_service(service_path._application(), f"postgresql:{dsn}", policy, tm=tm)
        server = HttpServer(service.wsgi_app, threads=16).start()
        service.engine.endpoint_address = server.url
        service.start()
        service_path.RECORDED.clear()
        rcs = [reliable_client(zeep.Client(server.url + "?wsdl"), f"postgresql:{client_dsn}", policy,
                               key=f"bench{i}") for i in range(clients)]
        errors: list[str] = []

        def call(i: int) -> None:
            try:
                for n in range(calls):
                    rcs[i].service.record(f"item-{i:02d}-{n:06d}", "x" * 64)
            except Exception as exc:  # noqa: BLE001 -- reported: a caller's error is a finding
                errors.append(repr(exc))

        started = time.monotonic()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = clients * calls
        deadline = time.monotonic() + 300
        while len(set(service_path.RECORDED)) < total and time.monotonic() < deadline:
            time.sleep(0.01)
        elapsed = time.monotonic() - started
        delivered = len(set(service_path.RECORDED))
        for rc in rcs:
            rc.stop(timeout=5)
        rcs = []
        server.stop(5)
        service.stop(timeout=5)
        service_path.DATA_SOURCE.close()
        tm.close()
        text = Path(pg.log_path).read_text(errors="replace")
    finally:
        for rc in rcs:
            rc.stop(timeout=5)
        pg.close()
    return {"messages": total, "delivered": delivered, "seconds": elapsed, "errors": errors}, text


def _kind(message: str, context: str, statement: str) -> str:
    """What waited: the lock (its mode and kind), where (the CONTEXT: the relation whose tuple it
    updated or locked), and the statement's first words (a prepared statement's ``EXECUTE`` shows
    as such: its text is in the session that prepared it)."""
    lock = re.search(r"(?:for|acquired) (\w+ on (?:transaction|advisory lock|relation|tuple|\w+))", message)
    where = re.sub(r" \(\d+,\d+\)", "", context.split(" of ")[0])
    text = re.sub(r"^(BEGIN; ?)?(SET LOCAL [^;]*; )*", "", statement.strip())
    first = "EXECUTE (prepared)" if text.startswith("EXECUTE ") else " ".join(text.split()[:6])[:60]
    return " | ".join(x for x in (lock.group(1) if lock else "?", where, first) if x)


def read_log(text: str) -> dict[str, Any]:
    """Deadlocks (their reports), lock waits, and the waits by database and what waited."""
    lines = text.splitlines()
    deadlocks: list[str] = []
    waits: collections.Counter[tuple[str, str]] = collections.Counter()
    ended: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for i, line in enumerate(lines):
        m = _LINE.match(line)
        if m is None:
            continue
        _, _, db, _, level, message = m.groups()
        context = statement = ""
        for later in lines[i + 1:i + 6]:  # its DETAIL, CONTEXT, then its STATEMENT
            s = _LINE.match(later)
            if s is None:
                continue
            if s.group(5) == "CONTEXT":
                context = s.group(6)
            elif s.group(5) == "STATEMENT":
                statement = s.group(6)
                break
            elif s.group(5) not in ("DETAIL", "HINT"):
                break
        if level == "ERROR" and message.startswith("deadlock detected"):
            deadlocks.append("\n".join(x[:300] for x in lines[i:i + 8]))
        elif level == "LOG" and "still waiting for" in message:
            waits[(db, _kind(message, context, statement))] += 1
        elif level == "LOG" and (got := _ACQUIRED.search(message)) is not None:
            ended[(db, _kind(message, context, statement))].append(float(got.group(1)))
    return {"deadlocks": deadlocks, "waits": waits, "ended": ended}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--calls", type=int, default=150, help="one-way calls a client")
    p.add_argument("--interval", type=float, default=1.0, help="base retransmission interval (s)")
    p.add_argument("--wait-ms", type=int, default=200, help="log lock waits longer than this (deadlock_timeout)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--log-statements", action="store_true", help="log every statement of the client store")
    p.add_argument("--keep-log", default="", help="write the (last) server log here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    print(f"{args.clients} client engines on one PostgreSQL store, {args.calls} one-way calls each, "
          f"retransmission interval {args.interval} s; lock waits over {args.wait_ms} ms", flush=True)
    for round_no in range(1, args.rounds + 1):
        with open("/proc/loadavg", encoding="ascii") as f:
            load = f.read().split()[0]
        figures, text = run_once(args.clients, args.calls, args.interval, args.wait_ms, args.log_statements)
        if args.keep_log:
            Path(args.keep_log).write_text(text)
        found = read_log(text)
        waits, ended = found["waits"], found["ended"]
        print(f"round {round_no} (load {load} at the start): delivered {figures['delivered']} of "
              f"{figures['messages']} in {figures['seconds']:.1f} s, callers' errors {len(figures['errors'])} "
              f"{figures['errors'][:3]}; deadlocks {len(found['deadlocks'])}, lock waits over {args.wait_ms} ms "
              f"{sum(waits.values())}", flush=True)
        for report in found["deadlocks"]:
            print("  " + report.replace("\n", "\n    "))
        for (db, kind), n in waits.most_common():
            took = ended.get((db, kind), [])
            print(f"  {n:5d} waits  {db:4s} {kind}" + (
                f"  (ended {len(took)}: median {statistics.median(took):.0f} ms, longest {max(took):.0f} ms)"
                if took else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
