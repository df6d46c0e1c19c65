"""Server CPU per message of a reliable spyne service, by stage, in one process (no database).

``bench_compare.py`` measures whole processes over HTTP, where waitress, the
client and PostgreSQL share the machine and the figures are noisy.  This
isolates what the WS-RM server path adds: a reliable zeep client (memory
store) sends ``--calls`` one-way messages to a ``reliable_service`` (memory
store) over loopback HTTP with the service's workers stopped, and the CPU
time of the server's own thread is measured (``time.thread_time``) around

* ``receive``: the WSGI call of each application message (parse, chain,
  engine, store, the acknowledgement answered on the back-channel), and
* ``deliver``: each invoker step (claim, the rest of the chain, spyne, the
  method, the out chain, commit), run afterwards in this thread;

against ``plain``: spyne's own ``WsgiApplication`` called with the same
request body (what a plain call costs the same method).  With the workers
stopped nothing is delivered on receipt (``RMPolicy.deliver_on_receive``,
the default under a transaction manager, which does both stages in one
transaction): the two stages are measured apart, as the buffered path runs.  The method does
nothing (a list append), so the figures are the framework's alone.

With ``--store sqlite`` the service's store is a SQLite file (no transaction manager; its
method does nothing, so ``--on-receipt`` holds the file only for the store's own work and spyne).
With ``--store xa1`` both stores are PostgreSQL (a throwaway server) and the
service runs under a transaction manager, its method inserting a row through
an ``XADataSource`` on the store's own database (one branch, one phase: the
``xa1`` scenario of ``bench_compare.py``); the statements PostgreSQL ran per
message in each stage are counted (``pg_stat_statements``), with the time spent
executing them, the costliest listed.

``--on-receipt`` runs the service's engine instead, as a real service does: each message is
delivered in its receive (under XA in one database, its receipt riding on the delivery's COMMIT
once the sequence's previous one was delivered so: ``Destination._one_way_at_commit``), and
``receive`` is the whole server path of a message; ``on receipt`` and ``at commit`` are the
shares of the messages that went those ways.  One client's sequence, its messages sent one on
another's heels: under load they overtake each other (measured at load 11-14, before the
declines were forgiven: 0.03-0.89 of 1,000 at the commit).

Run::

    PYTHONPATH=. .venv/bin/python bench/bench_server_path.py [--calls 2000] [--rounds 3]
        [--store memory|sqlite|xa1] [--on-receipt] [--profile out.pstats]   # yappi CPU profile of the measured server calls

It prints the median microseconds per message of each stage; ``--python-calls N`` also counts
each stage's Python calls a message (all rounds together; its times are then no use) and lists
its N most called functions.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TNS = "urn:wsrm-bench"
RECORDED: list[str] = []


#: The XADataSource the method inserts through (``--store xa1``), else None.
DATA_SOURCE: Any = None


def _application() -> Any:
    from spyne import Application, ServiceBase, Unicode, rpc
    from spyne.protocol.soap import Soap11

    class BenchService(ServiceBase):
        @rpc(Unicode, Unicode, _is_async=True)
        def record(ctx, item, note):  # noqa: N805 -- spyne's signature
            if DATA_SOURCE is not None:
                with DATA_SOURCE.connection() as conn, conn.cursor() as cur:
                    cur.execute("INSERT INTO received (item, note) VALUES (%s, %s)", (item, note))
            RECORDED.append(item)

    return Application([BenchService], tns=TNS, name="BenchService",
                       in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())


class _Calls:
    """Python calls (built-ins included) of each stage, counted with ``cProfile`` around each
    measured call in the thread that makes it (a profile of its own per thread, merged at the
    end): a count, which the machine's load does not move.  ``--python-calls N``."""

    def __init__(self) -> None:
        import pstats

        self.stats: dict[str, pstats.Stats | None] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def counting(self, stage: str) -> Iterator[None]:
        import cProfile
        import pstats

        profile = cProfile.Profile(time.thread_time)  # (its times: the thread's CPU, not the GIL's waits)
        profile.enable()
        try:
            yield
        finally:
            profile.disable()
            with self._lock:
                self.calls[stage] = self.calls.get(stage, 0) + 1
                was = self.stats.get(stage)
                if was is None:
                    self.stats[stage] = pstats.Stats(profile)
                else:
                    was.add(profile)

    def report(self, top: int) -> None:
        for stage, stats in self.stats.items():
            assert stats is not None
            if os.environ.get("BENCH_CALLS_DUMP"):  # the stage's profile, to read with pstats
                stats.dump_stats(f"{os.environ['BENCH_CALLS_DUMP']}-{stage}.pstats")
            n = self.calls[stage]
            table = stats.stats  # type: ignore[attr-defined]
            print(f"  {stage}: {sum(entry[1] for entry in table.values()) / n:.0f} Python calls a message", flush=True)
            for (path, line, name), entry in sorted(table.items(), key=lambda kv: -kv[1][1])[:top]:
                where = f"{'/'.join(path.rsplit('/', 2)[-2:])}:{line}" if path != "~" else "built-in"
                print(f"    {entry[1] / n:7.2f}  {name} ({where})", flush=True)


COUNTED: _Calls | None = None


class _Timed:
    """WSGI middleware: CPU time of this thread inside the wrapped app, per POSTed application message."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.samples: list[float] = []
        self.bodies: list[tuple[dict[str, Any], bytes]] = []
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        environ["wsgi.input"] = io.BytesIO(body)
        counting = COUNTED.counting("receive") if COUNTED is not None and b"Sequence" in body and b"record" in body \
            else contextlib.nullcontext()
        started = time.thread_time()
        with counting:
            answer = self.app(environ, start_response)
            try:
                result = list(answer)
            finally:
                close = getattr(answer, "close", None)
                if close is not None:  # (PEP 3333: what the service does once its response is written runs here)
                    close()
        spent = time.thread_time() - started
        if b"Sequence" in body and b"record" in body:  # an application message, not CreateSequence
            with self._lock:
                self.samples.append(spent)
                if len(self.bodies) < 1:
                    self.bodies.append(({k: v for k, v in environ.items() if isinstance(v, str)}, body))
        return result


class _Statements:
    """What PostgreSQL ran in one database between two looks (``pg_stat_statements``), its own
    queries left out."""

    def __init__(self, dsn: str) -> None:
        import psycopg2

        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        with self.conn.cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.last = self._calls()

    def _calls(self) -> dict[str, tuple[int, float]]:
        with self.conn.cursor() as cur:
            cur.execute("SELECT query, sum(calls), sum(total_exec_time) FROM pg_stat_statements WHERE dbid = "
                        "(SELECT oid FROM pg_database WHERE datname = current_database()) GROUP BY query")
            return {q: (int(n), float(ms)) for q, n, ms in cur.fetchall() if "pg_stat_statements" not in q}

    def since(self) -> dict[str, tuple[int, float]]:
        """(calls, milliseconds executing) of each statement since the last look."""
        now = self._calls()
        zero = (0, 0.0)
        spent = {q: (n - self.last.get(q, zero)[0], ms - self.last.get(q, zero)[1])
                 for q, (n, ms) in now.items() if n > self.last.get(q, zero)[0]}
        self.last = self._calls()
        return spent


class _Postgres:
    """A throwaway PostgreSQL server with ``pg_stat_statements``, a database per round."""

    def __init__(self) -> None:
        from wsrm_plugin.tools.pgserver import ThrowawayPostgres

        self.server = ThrowawayPostgres(settings={"shared_preload_libraries": "pg_stat_statements",
                                                  "pg_stat_statements.track": "all"}).start()
        self.rounds = 0

    def database(self) -> str:
        import psycopg2

        self.rounds += 1
        dsn = self.server.create_database(f"bench_{self.rounds}")
        conn = psycopg2.connect(dsn)
        with conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE received (item text NOT NULL, note text)")
        conn.close()
        return dsn


def one_round(calls: int, profile: Any, pg: _Postgres | None = None, on_receipt: bool = False,
              sqlite: bool = False) -> dict[str, Any]:
    import zeep
    from spyne.server.wsgi import WsgiApplication

    from interceptors.spyne_server.service import reliable_service
    from interceptors.zeep_client.client import reliable_client
    from wsrm_plugin.engine import RMPolicy
    from wsrm_plugin.engine.transport import HttpServer

    global DATA_SOURCE
    policy = RMPolicy(soap_version="1.1", base_retransmission_interval=5.0)
    tm = statements = None
    store = client_store = "memory:"
    closers: list[Any] = []
    if pg is not None:
        import tempfile

        from txmanager import TransactionManager
        from txmanager.postgres import XADataSource
        from wsrm_plugin.store import open_store

        dsn, client_dsn = pg.database(), pg.database()
        tm = TransactionManager(node="bench-server", log=Path(tempfile.mkdtemp()) / "tm.log")
        DATA_SOURCE = XADataSource(dsn, tm)
        closers += [DATA_SOURCE.close, tm.close]
        store, client_store = f"postgresql:{dsn}", f"postgresql:{client_dsn}"
        open_store(store).close()  # the schema, outside the measurement
        statements = _Statements(dsn)
    elif sqlite:  # the service's store a SQLite file (the client's stays in memory: not measured)
        import tempfile

        from wsrm_plugin.store import open_store

        store = f"sqlite:///{tempfile.mkdtemp()}/server.db"
        open_store(store).close()  # the schema, outside the measurement
    service = reliable_service(_application(), store, policy, tm=tm)
    timed = _Timed(service.wsgi_app)
    server = HttpServer(timed, threads=4).start()
    service.engine.endpoint_address = server.url
    if on_receipt:  # the engine running: each message delivered in its receive (at its commit under XA)
        service.start()
    RECORDED.clear()
    if profile is not None:
        profile.start(builtins=False)
    rc = reliable_client(zeep.Client(server.url + "?wsdl"), client_store, policy, key="bench")
    spent: dict[str, dict[str, tuple[int, float]]] = {}
    try:
        if statements is not None:
            statements.since()
        for i in range(calls):
            rc.service.record(f"item-{i:06d}", "x" * 64)
        deadline = time.monotonic() + 120
        while len(timed.samples) < calls and time.monotonic() < deadline:
            time.sleep(0.01)
        if len(timed.samples) < calls:
            raise RuntimeError(f"only {len(timed.samples)} of {calls} messages arrived")
        if statements is not None:
            time.sleep(0.5)  # the last acknowledgements
            spent["receive"] = statements.since()
        deliver: list[float] = []
        invoker = service.engine.invoker
        while len(deliver) < calls and not on_receipt:
            started = time.thread_time()
            with COUNTED.counting("deliver") if COUNTED is not None else contextlib.nullcontext():
                stepped = invoker.step()
            if not stepped:
                raise RuntimeError(f"the invoker stopped after {len(deliver)} of {calls} deliveries")
            deliver.append(time.thread_time() - started)
        if statements is not None:
            spent["deliver"] = statements.since()
        if on_receipt:  # a few go through the buffer (the invoker's thread), a declined guess runs twice
            deadline = time.monotonic() + 60
            while len(set(RECORDED)) < calls and time.monotonic() < deadline:
                time.sleep(0.01)
        if sorted(set(RECORDED) if on_receipt else RECORDED) != [f"item-{i:06d}" for i in range(calls)]:
            raise RuntimeError("the method did not run exactly once per message")
        environ, body = timed.bodies[0]
        plain_app = WsgiApplication(_application())
        plain: list[float] = []
        for _ in range(calls):
            env = dict(environ, **{"wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr})
            started = time.thread_time()
            with COUNTED.counting("plain") if COUNTED is not None else contextlib.nullcontext():
                list(plain_app(env, lambda *a, **k: None))
            plain.append(time.thread_time() - started)
    finally:
        if profile is not None:
            profile.stop()
        rc.stop(timeout=5)
        server.stop(5)
        service.stop(timeout=5)
        for close in closers:
            close()
        DATA_SOURCE = None
    micro = lambda xs: 1e6 * statistics.mean(xs[len(xs) // 10:])  # noqa: E731 -- skip warm-up
    result: dict[str, Any] = {"receive": micro(timed.samples), "deliver": micro(deliver) if deliver else 0.0,
                              "plain": micro(plain)}
    if on_receipt:
        destination = service.engine.destination
        result["on receipt"] = destination.delivered_on_receipt / calls
        result["at commit"] = getattr(destination, "receipts_at_commit", 0) / calls
        result["declined"] = getattr(destination, "receipts_declined_at_commit", 0) / calls
    if spent:
        result["statements"] = spent
    return result


def _print_statements(spent: dict[str, dict[str, tuple[int, float]]], calls: int, top: int = 8) -> None:
    for stage, queries in spent.items():
        total = sum(n for n, _ in queries.values())
        busy = sum(ms for _, ms in queries.values())
        print(f"  {stage}: {total / calls:.2f} statements, {1000 * busy / calls:.0f} us executing them, per message")
        for query, (n, ms) in sorted(queries.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"    {n / calls:5.2f} {1000 * ms / calls:6.0f} us  {' '.join(query.split())[:100]}")


def _figures(result: dict[str, float]) -> str:
    """Microseconds a message by stage; the shares (``on receipt``, ``at commit``) as fractions."""
    return "  ".join(f"{k} {v:.2f}" if k in ("on receipt", "at commit", "declined") else f"{k} {v:7.1f} us"
                     for k, v in result.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", default="", help="write a yappi CPU profile (pstats) here")
    parser.add_argument("--store", choices=("memory", "sqlite", "xa1"), default="memory")
    parser.add_argument("--on-receipt", action="store_true",
                        help="run the engine: each message delivered in its receive (under XA, its receipt at "
                             "the delivery's commit), the whole server path in the receive's figure")
    parser.add_argument("--python-calls", type=int, default=None, metavar="N",
                        help="count each stage's Python calls a message (cProfile around each measured call; "
                        "its times are then no use) and list its N most called functions")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    global COUNTED
    if args.python_calls is not None:
        COUNTED = _Calls()
    profile = None
    if args.profile:
        import yappi

        yappi.set_clock_type("cpu")
        profile = yappi
    rounds = []
    pg = _Postgres() if args.store == "xa1" else None
    try:
        for n in range(args.rounds):
            result = one_round(args.calls, profile, pg, args.on_receipt, args.store == "sqlite")
            spent = result.pop("statements", None)
            rounds.append(result)
            print(f"round {n + 1}: " + _figures(result)
                  + f"  (receive+deliver)/plain {(result['receive'] + result['deliver']) / result['plain']:.2f}",
                  flush=True)
            if spent:
                _print_statements(spent, args.calls)
    finally:
        if pg is not None:
            pg.server.close()
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print("median:  " + _figures(med)
          + f"  (receive+deliver)/plain {(med['receive'] + med['deliver']) / med['plain']:.2f}")
    if profile is not None:
        profile.get_func_stats().save(args.profile, type="pstat")
    if COUNTED is not None:
        COUNTED.report(args.python_calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
