"""Throughput of one-way calls from zeep to spyne: plain HTTP vs WS-RM over each store, same run.

Scenarios (each from a fresh server process, fresh stores and databases):

* ``plain``  - a zeep client calling the plain spyne application served by
  waitress (no WS-RM); every call is one synchronous HTTP exchange;
* ``memory`` - ``reliable_client`` -> ``reliable_service``, both on ``memory:`` stores;
* ``sqlite`` - the same on SQLite files;
* ``xa``     - the same on PostgreSQL stores (a throwaway server), the client
  enqueuing each call inside its own ``TransactionManager`` transaction and the
  server's invoker delivering each message inside one (both with a recovery log).

The server runs in its own process (as in a deployment: the client's and
the server's Python code do not share one GIL).  Each scenario runs once
without loss and once through a :class:`~wsrm_plugin.tools.proxy.LossyProxy` (in a
third process) that loses ``--loss`` of the HTTP exchanges, half of them as
lost requests and half as lost responses (the server acted, the sender does
not know: retransmissions then arrive as duplicates).

Only messages verified delivered exactly once at the server count: the
service records every item it runs, and after the run the server reports the
items seen once, more than once and never.  A reliable scenario with a
duplicate or a missing item is reported as FAILED.  The clock runs from the
first call to the moment the server's method ran for the last new item
(time.monotonic is system-wide, so the two processes share it); setting up
clients, WSDLs and sequences' stores is outside it, the CreateSequence of
the first call inside.  The plain scenario through the lossy proxy counts the
calls that got through (it loses the others: that is what WS-RM is for).

Ratios are against plain without loss measured in the same round; the aims
(issue 4) are memory >= 0.9, SQLite >= 0.6, XA >= 0.4.

Run::

    .venv/bin/python bench/bench_zeep_spyne.py [--calls 2000] [--rounds 3] [--loss 0.1]
        [--scenarios plain,memory,sqlite,xa] [--no-lossy] [--profile DIR]

``--profile DIR`` writes profiles of both processes, all threads, CPU time, for
every reliable scenario (``DIR/<scenario>-r<round>-<client|server>.pstats``,
read with ``pstats``); it needs ``yappi`` (``pip install yappi``), since
cProfile only sees the thread that started it and the work here is in the
engine's worker and HTTP threads.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TNS = "urn:wsrm-bench"
AIMS = {"memory": 0.9, "sqlite": 0.6, "xa": 0.4}
RELIABLE = ("memory", "sqlite", "xa")


class _Profiler:
    """yappi over every thread (CPU clock), saved in pstats format."""

    def __init__(self, path: str) -> None:
        import yappi

        self.yappi = yappi
        self.path = path
        yappi.set_clock_type("cpu")

    def enable(self) -> None:
        self.yappi.start(builtins=False)

    def disable(self) -> None:
        self.yappi.stop()
        self.yappi.get_func_stats().save(self.path, type="pstat")
        self.yappi.clear_stats()


# -- the server process ---------------------------------------------------------------------------

class _Recorder:
    """What the service ran: how often each item, and when the last new one arrived."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.last_new = 0.0

    def add(self, item: str) -> None:
        with self.lock:
            self.counts[item] += 1
            if self.counts[item] == 1:
                self.last_new = time.monotonic()

    def snapshot(self) -> tuple[int, float]:
        with self.lock:
            return len(self.counts), self.last_new

    def verdict(self, expected: list[str]) -> dict[str, int]:
        with self.lock:
            counts = dict(self.counts)
        wanted = set(expected)
        return {"once": sum(1 for i in expected if counts.get(i) == 1),
                "duplicated": sum(1 for i in expected if counts.get(i, 0) > 1),
                "missing": sum(1 for i in expected if i not in counts),
                "unexpected": sum(1 for i in counts if i not in wanted)}


RECORDER = _Recorder()


def _application() -> Any:
    from spyne import Application, ServiceBase, Unicode, rpc
    from spyne.protocol.soap import Soap11

    class BenchService(ServiceBase):
        @rpc(Unicode, Unicode, _is_async=True)
        def record(ctx, item, note):  # noqa: N805 -- spyne's signature
            RECORDER.add(item)

    return Application([BenchService], tns=TNS, name="BenchService",
                       in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())


def _policy(args: dict[str, Any]) -> Any:
    from wsrm_plugin.engine import RMPolicy

    return RMPolicy(soap_version="1.1", base_retransmission_interval=args["retransmission_interval"])


def server_main(conn: Any, scenario: str, options: dict[str, Any]) -> None:
    """Serve the scenario's spyne application; answer ("count",) / ("verdict", items) / ("stop",)."""
    logging.basicConfig(level=logging.ERROR)
    from wsrm_plugin.engine.transport import HttpServer

    profiler = _Profiler(options["profile"]) if options.get("profile") else None
    tmp = Path(tempfile.mkdtemp(prefix="bench-server-"))
    closers: list[Any] = []
    if scenario == "plain":
        from spyne.server.wsgi import WsgiApplication

        from interceptors.wsdl import drop_undefined_header_messages

        wsgi = WsgiApplication(_application())
        # spyne's one-way WSDL references undefined header messages and zeep refuses it
        wsgi.doc.wsdl11.event_manager.add_listener(
            "wsdl_document_built", lambda document: drop_undefined_header_messages(document.root_elt))
        server = HttpServer(wsgi, threads=4).start()
        closers.append(server.stop)
        url = server.url
    else:
        from interceptors.spyne_server.service import reliable_service

        tm = None
        if scenario == "memory":
            store = "memory:"
        elif scenario == "sqlite":
            store = f"sqlite:///{tmp}/server.db"
        else:
            from txmanager import TransactionManager

            store = f"postgresql:{options['server_dsn']}"
            tm = TransactionManager(node="bench-server", log=tmp / "tm.log")
        service = reliable_service(_application(), store, _policy(options), tm=tm)
        service.serve()
        service.start()
        closers.append(lambda: service.stop(timeout=5))
        if tm is not None:
            closers.append(tm.close)
        url = service.url
    conn.send(url)
    try:
        while True:
            command = conn.recv()
            if command[0] == "count":
                conn.send(RECORDER.snapshot())
            elif command[0] == "verdict":
                conn.send(RECORDER.verdict(command[1]))
            elif command[0] == "profile":
                if profiler is not None:
                    profiler.enable()
                conn.send(True)
            elif command[0] == "stop":
                break
    finally:
        if profiler is not None:
            profiler.disable()
        for close in closers:
            close()
        conn.send("stopped")


def proxy_main(conn: Any, target: str, loss: float, seed: int) -> None:
    """A LossyProxy losing ``loss`` of the exchanges: half the requests, half the responses."""
    logging.basicConfig(level=logging.ERROR)
    from wsrm_plugin.tools.proxy import LossyProxy

    proxy = LossyProxy(target, drop=loss / 2, drop_response=loss / 2, seed=seed).start()
    conn.send(proxy.url)
    conn.recv()
    stats = proxy.stats
    proxy.stop(flush=False, timeout=5)
    conn.send(str(stats))


# -- the client side (this process) ----------------------------------------------------------------

@dataclass
class Result:
    scenario: str
    lossy: bool
    calls: int
    once: int
    duplicated: int
    missing: int
    unexpected: int
    seconds: float
    errors: int = 0
    proxy: str = ""

    @property
    def rate(self) -> float:
        return self.once / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        if self.scenario == "plain":
            return self.duplicated == 0 and self.unexpected == 0
        return self.once == self.calls and not (self.duplicated or self.missing or self.unexpected)

    @property
    def name(self) -> str:
        return self.scenario + (" +loss" if self.lossy else "")


class _Process:
    def __init__(self, target: Any, *args: Any) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(child, *args), daemon=True)
        self.process.start()

    def ask(self, *command: Any, timeout: float = 120.0) -> Any:
        if command:
            self.conn.send(command)
        if not self.conn.poll(timeout):
            raise TimeoutError(f"no answer to {command!r} within {timeout}s")
        return self.conn.recv()

    def stop(self) -> Any:
        try:
            answer = self.ask("stop", timeout=30)
        finally:
            self.process.join(10)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(5)
        return answer


def _wait_delivered(server: _Process, calls: int, timeout: float) -> tuple[int, float]:
    deadline = time.monotonic() + timeout
    while True:
        count, last_new = server.ask("count")
        if count >= calls or time.monotonic() > deadline:
            return count, last_new
        time.sleep(0.01)


def run_scenario(scenario: str, lossy: bool, args: argparse.Namespace, pg: Any,
                 round_no: int) -> Result:
    import zeep

    options: dict[str, Any] = {"retransmission_interval": args.retransmission_interval}
    tag = f"{scenario}{'-loss' if lossy else ''}"
    client_profile = None
    if args.profile and scenario != "plain":
        os.makedirs(args.profile, exist_ok=True)
        options["profile"] = os.path.join(args.profile, f"{tag}-r{round_no}-server.pstats")
        client_profile = os.path.join(args.profile, f"{tag}-r{round_no}-client.pstats")
    client_dsn = None
    if scenario == "xa":
        client_dsn = pg.create_database(f"bench_client_{uuid.uuid4().hex[:8]}")
        options["server_dsn"] = pg.create_database(f"bench_server_{uuid.uuid4().hex[:8]}")
    server = _Process(server_main, scenario, options)
    proxy = None
    rc = tm = None
    tmp = Path(tempfile.mkdtemp(prefix="bench-client-"))
    try:
        url = server.ask()
        address = url
        if lossy:
            proxy = _Process(proxy_main, url, args.loss, args.seed + round_no)
            address = proxy.ask()
        zc = zeep.Client(address + "?wsdl")
        run = uuid.uuid4().hex[:8]
        items = [f"{run}-{i:06d}" for i in range(args.calls)]
        note = "x" * args.note
        errors = 0
        profiler = _Profiler(client_profile) if client_profile else None
        if scenario == "plain":
            t0 = time.monotonic()
            for item in items:
                try:
                    zc.service.record(item, note)
                except Exception:  # noqa: BLE001 -- a lost exchange: the plain client just loses it
                    errors += 1
            client_done = time.monotonic()
            count, last_new = _wait_delivered(server, args.calls, timeout=5)
            elapsed = max(last_new, client_done) - t0 if lossy else last_new - t0
        else:
            from interceptors.zeep_client.client import reliable_client

            if scenario == "memory":
                store = "memory:"
            elif scenario == "sqlite":
                store = f"sqlite:///{tmp}/client.db"
            else:
                from txmanager import TransactionManager

                store = f"postgresql:{client_dsn}"
                tm = TransactionManager(node="bench-client", log=tmp / "tm.log")
            rc = reliable_client(zc, store, _policy(options), tm=tm, key="bench")
            if profiler is not None:
                server.ask("profile")
                profiler.enable()
            t0 = time.monotonic()
            if tm is None:
                for item in items:
                    rc.service.record(item, note)
            else:
                for item in items:
                    with tm.transaction():
                        rc.service.record(item, note)
            count, last_new = _wait_delivered(server, args.calls, timeout=args.timeout)
            elapsed = last_new - t0
            if profiler is not None:
                profiler.disable()
        verdict = server.ask("verdict", items)
        return Result(scenario, lossy, args.calls, verdict["once"], verdict["duplicated"], verdict["missing"],
                      verdict["unexpected"], elapsed, errors)
    finally:
        if rc is not None:
            rc.stop(timeout=5)
        if tm is not None:
            tm.close()
        stats = proxy.stop() if proxy is not None else ""
        server.stop()
        if stats and args.verbose:
            print(f"    proxy: {stats}", flush=True)


def _format(result: Result, plain: float | None) -> str:
    ratio = f"{result.rate / plain:5.2f}" if plain else "  -  "
    aim = AIMS.get(result.scenario)
    flag = ""
    if not result.ok:
        flag = "  FAILED"
    elif aim is not None and not result.lossy and plain:
        flag = "  ok" if result.rate / plain >= aim else f"  below aim {aim}"
    detail = (f"once={result.once} dup={result.duplicated} missing={result.missing}"
              + (f" errors={result.errors}" if result.errors else ""))
    return (f"  {result.name:14s} {result.rate:8.1f} msg/s  ratio {ratio}  "
            f"({result.seconds:6.2f} s; {detail}){flag}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--loss", type=float, default=0.10)
    parser.add_argument("--no-lossy", action="store_true", help="skip the runs through the lossy proxy")
    parser.add_argument("--scenarios", default="plain,memory,sqlite,xa")
    parser.add_argument("--note", type=int, default=64, help="characters of filler per call")
    parser.add_argument("--retransmission-interval", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--profile", default=None, help="directory for yappi profiles (pstats) of reliable runs")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(scenarios) - {"plain", *RELIABLE}
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}")
    logging.basicConfig(level=logging.ERROR)

    pg = None
    if "xa" in scenarios:
        from wsrm_plugin.tools.pgserver import ThrowawayPostgres

        pg = ThrowawayPostgres(max_connections=200).start()
    print(f"zeep -> spyne, {args.calls} one-way calls per scenario; loss {args.loss:.0%} "
          f"(half requests, half responses); retransmission interval {args.retransmission_interval}s",
          flush=True)
    ratios: dict[str, list[float]] = {}
    failures = 0
    try:
        for round_no in range(1, args.rounds + 1):
            print(f"round {round_no}", flush=True)
            plain = None
            for lossy in (False, True) if not args.no_lossy else (False,):
                for scenario in scenarios:
                    result = run_scenario(scenario, lossy, args, pg, round_no)
                    if scenario == "plain" and not lossy:
                        plain = result.rate
                    print(_format(result, plain), flush=True)
                    failures += not result.ok
                    if plain and result.scenario != "plain":
                        ratios.setdefault(result.name, []).append(result.rate / plain)
        if args.rounds > 1:
            print("median ratio to plain over the rounds:")
            for name, values in ratios.items():
                print(f"  {name:14s} {statistics.median(values):5.2f}  "
                      f"({', '.join(f'{v:.2f}' for v in values)})")
    finally:
        if pg is not None:
            pg.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
