"""What a message costs at 16 sequences at once, per side, in one process: CPU and thread switches.

``bench_compare.py --clients 16`` measures whole processes against plain calls, and its rates
need a quiet machine.  This one runs a reliable zeep client (``--sequences`` clients on one
engine, a calling thread each, as there) and the reliable spyne service (``record``, no
database) on memory stores over loopback HTTP in one process, and reports per message:

* the CPU time of the service's threads (waitress, the invoker, the service's workers, from
  each thread's ``/proc`` counters) and of the client (the rest of the process: callers, the
  sender and its lanes, the client's workers);
* the process's context switches (voluntary: a thread waited; involuntary: preempted);
* the HTTP exchanges (POSTs) the client made.

Those hold on a loaded machine far better than a rate does.  Under
``valgrind --tool=callgrind`` the process's instruction count, taken at two ``--calls``, gives
instructions per message by their difference (start-up cancels out, roughly); with
``BENCH_CALLGRIND_ROUNDS=1`` the counters are zeroed after the warm-up and dumped after the last
round, so one run's dump (``callgrind.out.<pid>.1``) holds the measured messages alone::

    .venv/bin/python bench/bench_sequences_cpu.py [--calls 3200] [--sequences 16] [--rounds 3]
        [--store memory|sqlite] [--statements 20]

``--store sqlite`` puts both sides on SQLite stores (bench_compare's ``sqlite`` scenario) and
adds each side's store transactions, commits and WAL syncs per message; ``--statements N`` every
statement SQLite ran per message, by side, and the N run most often (not under callgrind: the
trace callback runs for each).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

_TICK = os.sysconf("SC_CLK_TCK")
#: a thread is the service's when its name says so (waitress's, the service engine's workers)
_SERVICE_THREADS = ("waitress", "service-", "wsrm-http")


def _thread_cpu() -> dict[str, float]:
    """CPU seconds so far of the service's threads (living ones: waitress's and the service
    engine's, which live as long as it) and of the client: the rest of the process, its calling
    threads (which end with each round) included."""
    service = 0.0
    for thread in threading.enumerate():
        if not thread.name.startswith(_SERVICE_THREADS):
            continue
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, TypeError):
            continue
        service += (int(fields[11]) + int(fields[12])) / _TICK
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"service": service, "client": usage.ru_utime + usage.ru_stime - service}


class _Deliveries:
    """The service's rows: a count, and a wait for it (woken once, when the count is reached)."""

    def __init__(self) -> None:
        self.count = 0
        self.target = 0
        self.cond = threading.Condition()

    def record(self, item: str, note: str) -> None:
        with self.cond:
            self.count += 1
            if self.count == self.target:
                self.cond.notify_all()

    def wait_for(self, n: int, timeout: float) -> None:
        with self.cond:
            self.target = n
            if not self.cond.wait_for(lambda: self.count >= n, timeout):
                raise SystemExit(f"only {self.count} of {n} delivered within {timeout} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3200)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--server-threads", type=int, default=4, help="the service's HTTP threads")
    parser.add_argument("--policy", default="", help="RMPolicy knobs of both sides, bench_compare's "
                        "variant syntax: send_concurrency=4+deliver_on_receive=true")
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory",
                        help="both sides' store (sqlite: a file each, in a temporary directory)")
    parser.add_argument("--statements", type=int, default=0, metavar="N",
                        help="SQLite: also list each side's N statements run most often (a trace "
                        "callback on every connection: leave it out under callgrind)")
    args = parser.parse_args(argv)

    import logging

    import zeep

    import bench_compare as bc
    from interceptors.spyne_server.service import reliable_service
    from interceptors.zeep_client.client import reliable_client
    from wsrm_plugin.engine import http_client

    posts = [0]
    original = http_client.HttpConnection.post

    def post(self: Any, *a: Any, **k: Any) -> Any:  # counted (a measuring tool's patch)
        posts[0] += 1
        return original(self, *a, **k)
    http_client.HttpConnection.post = post  # type: ignore[method-assign]

    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "Task queue depth is N": counted
    if os.environ.get("BENCH_CALLGRIND_ROUNDS") == "1":
        from wsrm_plugin.engine import invoker

        # under valgrind every call is slow, and a slow application is delivered by the invoker's
        # threads instead of on receipt (QUICK_APPLICATION): count the path a real run takes
        invoker.QUICK_APPLICATION = 1e9  # type: ignore[misc]
    from wsrm_plugin.engine.retransmission import RetransmissionWorker

    #: the sender's rounds of lanes: (start, lanes submitted, end) and each lane's busy seconds
    rounds: list[tuple[float, float]] = []
    lane_busy = [0.0]
    run_lanes, send_lane = RetransmissionWorker._run_lanes, RetransmissionWorker._send_lane

    def timed_run_lanes(self: Any, *a: Any, **k: Any) -> Any:
        started = time.perf_counter()
        try:
            return run_lanes(self, *a, **k)
        finally:
            rounds.append((started, time.perf_counter()))

    def timed_send_lane(self: Any, *a: Any, **k: Any) -> Any:
        started = time.perf_counter()
        try:
            return send_lane(self, *a, **k)
        finally:
            lane_busy[0] += time.perf_counter() - started
    RetransmissionWorker._run_lanes = timed_run_lanes  # type: ignore[method-assign]
    RetransmissionWorker._send_lane = timed_send_lane  # type: ignore[method-assign]
    rows = _Deliveries()
    bc.ROWS = rows  # type: ignore[assignment]
    tmp = tempfile.TemporaryDirectory(prefix="bench-seq-")
    urls = {side: "memory:" if args.store == "memory" else f"sqlite:///{tmp.name}/{side}.db"
            for side in ("service", "client")}
    statements = _SqliteStatements(args.statements) if args.store == "sqlite" else None
    scenario = f"{args.store}~{args.policy}"
    service = reliable_service(bc._application(), urls["service"], bc._policy(1.0, scenario), name="service")
    service.serve(threads=args.server_threads)
    service.start()
    keys = [f"bench{n}" for n in range(args.sequences)]
    first = reliable_client(zeep.Client(service.url + "?wsdl"), urls["client"], bc._policy(1.0, scenario), key=keys[0],
                            name="client", active_keys=keys)
    stores = {"service": service.engine.store, "client": first.engine.store}
    clients = [first, *(first.with_key(key) for key in keys[1:])]
    sent = 0

    def run(calls: int, tag: str) -> None:
        nonlocal sent

        def calls_of(n: int) -> None:
            for i in range(n, calls, args.sequences):
                clients[n].service.record(f"{tag}-{i}", "x" * 64)
        bc._in_threads(calls_of, args.sequences)
        sent += calls
        rows.wait_for(sent, args.timeout)

    try:
        run(args.sequences * 4, "warm")  # every sequence open, zeep warm
        _callgrind("-z")  # under callgrind: count the measured rounds only (see _callgrind)
        for r in range(args.rounds):
            cpu0, usage0, posts0, t0 = _thread_cpu(), resource.getrusage(resource.RUSAGE_SELF), posts[0], \
                time.perf_counter()
            rounds0, busy0 = len(rounds), lane_busy[0]
            files0 = {side: _file_counts(store) for side, store in stores.items()}
            if statements is not None:
                statements.reset()
            run(args.calls, f"r{r}")
            seconds = time.perf_counter() - t0
            cpu1, usage1 = _thread_cpu(), resource.getrusage(resource.RUSAGE_SELF)
            n = args.calls
            per = {side: 1e6 * (cpu1[side] - cpu0[side]) / n for side in cpu1}
            print(f"round {r + 1}: {n / seconds:7.1f} msg/s  per msg: cpu us(client)={per['client']:.0f} "
                  f"cpu us(service)={per['service']:.0f} "
                  f"switches voluntary={(usage1.ru_nvcsw - usage0.ru_nvcsw) / n:.2f} "
                  f"involuntary={(usage1.ru_nivcsw - usage0.ru_nivcsw) / n:.2f} "
                  f"POSTs={(posts[0] - posts0) / n:.2f}  (load {os.getloadavg()[0]:.1f})", flush=True)
            mine = rounds[rounds0:]
            in_rounds = sum(end - start for start, end in mine)
            print(f"  sender: {len(mine)} rounds of lanes, {n / max(len(mine), 1):.1f} msg each; in rounds "
                  f"{in_rounds / seconds:.2f} of the time; lanes busy {(lane_busy[0] - busy0) / max(in_rounds, 1e-9):.1f} "
                  f"lanes on average while in a round", flush=True)
            for side, store in stores.items():
                now, was = _file_counts(store), files0[side]
                if now:
                    print(f"  {side} store per msg: " + "  ".join(
                        f"{name}={(now[name] - was[name]) / n:.2f}" for name in now), flush=True)
            if statements is not None:
                statements.report(n)
        _callgrind("-d")
    finally:
        first.stop(timeout=5)
        service.stop(timeout=5)
        tmp.cleanup()
    return 0


def _file_counts(store: Any) -> dict[str, int]:
    """A SQLite store's turns on its file (its store transactions), commits that changed rows,
    WAL syncs, and the microseconds its transactions held the file and waited for it (summed
    over the waiters), so far; empty for another store."""
    gate, sync = getattr(store, "_gate", None), getattr(store, "_sync", None)
    if gate is None or sync is None:
        return {}
    return {"transactions": gate.turns, "commits": sync.commits, "fsyncs": sync.syncs,
            "file held us": int(gate.held * 1e6), "file waited us": int(gate.waited * 1e6)}


_LITERALS = None


def _shape(sql: str) -> str:
    """A statement as traced (its values written in) with each literal a ``?`` again."""
    global _LITERALS
    if _LITERALS is None:
        import re
        _LITERALS = re.compile(r"'(?:[^']|'')*'|X'[0-9A-Fa-f]*'|(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?")
    return " ".join(_LITERALS.sub("?", sql).split())


class _SqliteStatements:
    """Every statement SQLite runs on each side's connections (BEGIN, COMMIT and the in-doubt
    check included), counted by ``sqlite3``'s trace callback, by side and by text."""

    def __init__(self, top: int) -> None:
        import collections
        import sqlite3

        from wsrm_plugin.store import sqlite as sqlite_store

        self.top = top
        self.seen: dict[str, collections.Counter[str]] = {}
        connect = sqlite_store.SqliteStore._connect
        seen = self.seen

        def traced_connect(store: Any) -> sqlite3.Connection:
            conn = connect(store)
            counter = seen.setdefault(os.path.basename(store.path).removesuffix(".db"), collections.Counter())
            conn.set_trace_callback(lambda sql: counter.update((_shape(sql),)))
            return conn
        sqlite_store.SqliteStore._connect = traced_connect  # type: ignore[method-assign]

    def reset(self) -> None:
        for counter in self.seen.values():
            counter.clear()

    def report(self, messages: int) -> None:
        for side, counter in sorted(self.seen.items()):
            print(f"  {side} SQLite statements per msg: {sum(counter.values()) / messages:.2f}", flush=True)
            for sql, count in counter.most_common(self.top):
                print(f"    {count / messages:6.2f}  {sql[:150]}", flush=True)


def _callgrind(option: str) -> None:
    """Under ``valgrind --tool=callgrind`` with ``BENCH_CALLGRIND_ROUNDS=1``: zero the counters
    (``-z``) after the warm-up and dump them (``-d``) after the last round, so the dump holds
    the measured rounds' instructions alone (start-up and shut-down, whose counts vary by
    hundreds of millions between runs, left out): divide its total by the messages."""
    if os.environ.get("BENCH_CALLGRIND_ROUNDS") == "1":
        import subprocess

        import spyne.const

        # spyne's gc.collect() once a second (MIN_GC_INTERVAL) ran every ~15 messages under
        # valgrind against ~700 in a real run (~5% of the count, moving with the run's length)
        spyne.const.MIN_GC_INTERVAL = float("inf")
        subprocess.run(["callgrind_control", option, str(os.getpid())], check=True, capture_output=True)


if __name__ == "__main__":
    raise SystemExit(main())
