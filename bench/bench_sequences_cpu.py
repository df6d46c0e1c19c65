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

``--store plain`` runs the baseline instead: plain zeep clients, one a calling thread, calling the
plain spyne service (bench_compare's ``plainN``), the same counts without the layer.
``--store sqlite`` puts both sides on SQLite stores (bench_compare's ``sqlite`` scenario) and
adds each side's store transactions, commits and WAL syncs per message (``--store memory``: its
transactions, by the function that began them); ``--statements N`` every
statement SQLite ran per message, by side, and the N run most often (not under callgrind: the
trace callback runs for each); ``--held`` the service's CPU while it holds its store's file (its
threads' own CPU clocks, which a loaded machine moves far less than the file's wall time), and
what of it, and of the CPU outside the file, went to the receipt, the delivery and spyne's steps.

``--python-calls N`` counts the Python calls (built-ins included) each side makes per message
(a profile function in every thread: slow, so a few hundred calls are enough) and lists each
side's N most called functions, then the N modules and the N functions that made the most calls
(a built-in's call counts for the function that called it).  Every run reports (under ``--python-calls`` the profile
function makes frame objects the collector tracks: its collections count more) the objects the garbage collector found
unreachable per message, its collections and the CPU time they took (``gc.callbacks``; the
collecting thread's CPU clock).
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
    parser.add_argument("--store", choices=("memory", "sqlite", "plain"), default="memory",
                        help="both sides' store (sqlite: a file each, in a temporary directory; plain: "
                        "no layer, bench_compare's plainN: a zeep client a thread calling the plain spyne "
                        "service, the baseline of the same counts)")
    parser.add_argument("--statements", type=int, default=0, metavar="N",
                        help="SQLite: also list each side's N statements run most often (a trace "
                        "callback on every connection: leave it out under callgrind)")
    parser.add_argument("--held", action="store_true",
                        help="SQLite: the service's CPU while it holds its store's file, and the part of "
                        "it spent in each of spyne's steps and the chain's delivery (thread CPU clocks)")
    parser.add_argument("--python-calls", type=int, default=None, metavar="N",
                        help="count each side's Python calls per message (built-ins included) and list "
                        "its N most called functions (a profile function in every thread: slow)")
    args = parser.parse_args(argv)
    counted = _PythonCalls(args.python_calls) if args.python_calls is not None else None
    garbage = _Garbage()

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
    begun = _MemoryTransactions() if args.store == "memory" else None
    scenario = f"{args.store}~{args.policy}"
    if args.store == "plain":
        service, first = _Plain(bc._application(), args.server_threads), None
        clients = [zeep.Client(service.url + "?wsdl") for _ in range(args.sequences)]
        stores: dict[str, Any] = {}
        held = None
    else:
        service = reliable_service(bc._application(), urls["service"], bc._policy(1.0, scenario), name="service")
        service.serve(threads=args.server_threads)
        service.start()
        keys = [f"bench{n}" for n in range(args.sequences)]
        first = reliable_client(zeep.Client(service.url + "?wsdl"), urls["client"], bc._policy(1.0, scenario),
                                key=keys[0], name="client", active_keys=keys)
        stores = {"service": service.engine.store, "client": first.engine.store}
        held = _HeldCpu(service) if args.held and args.store == "sqlite" else None
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
            garbage0 = garbage.snapshot()
            switches0 = _thread_switches()
            if held is not None:
                held.reset()
            if counted is not None:
                counted.reset()
            if statements is not None:
                statements.reset()
            if begun is not None:
                begun.reset()
            run(args.calls, f"r{r}")
            seconds = time.perf_counter() - t0
            cpu1, usage1, switches1 = _thread_cpu(), resource.getrusage(resource.RUSAGE_SELF), _thread_switches()
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
            _report_switches(switches0, switches1, (usage1.ru_nvcsw - usage0.ru_nvcsw,
                                                    usage1.ru_nivcsw - usage0.ru_nivcsw), n)
            garbage.report(garbage0, n)
            if begun is not None:
                begun.report(n)
            if held is not None:
                held.report(n)
            if counted is not None:
                counted.report(n)
            if statements is not None:
                statements.report(n)
        _callgrind("-d")
    finally:
        if first is not None:
            first.stop(timeout=5)
        service.stop(timeout=5)
        tmp.cleanup()
        if counted is not None:
            counted.stop()
        garbage.stop()
    return 0


class _Plain:
    """bench_compare's plain service: spyne's ``WsgiApplication`` served by the project's waitress
    server, no layer (plain zeep clients call it, one a calling thread: ``plainN``)."""

    def __init__(self, application: Any, threads: int) -> None:
        from spyne.server.wsgi import WsgiApplication

        from interceptors.wsdl import drop_undefined_header_messages
        from wsrm_plugin.engine.transport import HttpServer

        wsgi = WsgiApplication(application)
        wsgi.doc.wsdl11.event_manager.add_listener(
            "wsdl_document_built", lambda document: drop_undefined_header_messages(document.root_elt))
        self.server = HttpServer(wsgi, threads=threads).start()
        self.url = self.server.url

    def stop(self, timeout: float) -> None:
        self.server.stop()


def _thread_switches() -> dict[tuple[int, str], tuple[int, int]]:
    """Each living thread's context switches so far (``/proc``: voluntary, involuntary), by its
    native id and name."""
    seen: dict[tuple[int, str], tuple[int, int]] = {}
    for thread in threading.enumerate():
        try:
            status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
        except (OSError, TypeError):
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        seen[(thread.native_id or 0, thread.name)] = (int(fields["voluntary_ctxt_switches"]),
                                                     int(fields["nonvoluntary_ctxt_switches"]))
    return seen


def _report_switches(was: dict[tuple[int, str], tuple[int, int]], now: dict[tuple[int, str], tuple[int, int]],
                     total: tuple[int, int], messages: int) -> None:
    """Switches a message by kind of thread (its name without digits), each side's sum, and the
    threads that ended in the round (the calling threads: the process's total less the rest)."""
    import re

    kinds: dict[str, list[int]] = {}
    for key, (voluntary, involuntary) in now.items():
        v0, i0 = was.get(key, (0, 0))
        kind = kinds.setdefault(re.sub(r"\d+", "N", key[1]), [0, 0])
        kind[0] += voluntary - v0
        kind[1] += involuntary - i0
    counted = [sum(k[0] for k in kinds.values()), sum(k[1] for k in kinds.values())]
    kinds["(ended: callers)"] = [total[0] - counted[0], total[1] - counted[1]]
    for side in ("service", "client"):
        mine = {name: k for name, k in kinds.items()
                if _side(name) == side and (k[0] or k[1])}
        print(f"  {side} switches per msg: {sum(k[0] + k[1] for k in mine.values()) / messages:.2f}  " + "  ".join(
            f"{name}={k[0] / messages:.2f}+{k[1] / messages:.2f}" for name, k in sorted(mine.items())), flush=True)


def _side(name: str) -> str:
    return "service" if name.startswith(_SERVICE_THREADS) else "client"


class _PythonCalls:
    """Python calls (``call`` and ``c_call`` profile events) by side and by function.

    Each thread's first event finds its side from its name and installs a counter of its own
    (no lock, no lost increments); the counts are summed when reported."""

    def __init__(self, top: int) -> None:
        import collections

        self.top = top
        self.counters: list[tuple[str, collections.Counter[Any]]] = []
        #: the same calls by the function that made them (its code object), and so by its module
        self.callers: list[tuple[str, collections.Counter[Any]]] = []

        def first(frame: Any, event: str, arg: Any) -> None:
            counter: collections.Counter[Any] = collections.Counter()
            callers: collections.Counter[Any] = collections.Counter()
            side = _side(threading.current_thread().name)
            self.counters.append((side, counter))
            self.callers.append((side, callers))

            def count(frame: Any, event: str, arg: Any) -> None:
                if event == "call":
                    counter[frame.f_code] += 1
                    back = frame.f_back
                    callers[back.f_code if back is not None else None] += 1
                elif event == "c_call":
                    counter[arg] += 1
                    callers[frame.f_code] += 1
            sys.setprofile(count)
            count(frame, event, arg)
        threading.setprofile(first)
        sys.setprofile(first)

    def reset(self) -> None:
        for _, counter in [*self.counters, *self.callers]:
            counter.clear()

    def report(self, messages: int) -> None:
        profile = sys.getprofile()
        sys.setprofile(None)  # the report's own calls are not the reporting thread's (the client's)
        try:
            self._report(messages)
        finally:
            sys.setprofile(profile)

    def _report(self, messages: int) -> None:
        import collections

        by_side: dict[str, collections.Counter[str]] = {}
        for side, counter in list(self.counters):
            total = by_side.setdefault(side, collections.Counter())
            for what, count in dict(counter).items():  # a copy in one step: the threads go on counting
                total[_function_name(what)] += count
        by_caller: dict[str, collections.Counter[str]] = {}
        by_module: dict[str, collections.Counter[str]] = {}
        for side, counter in list(self.callers):
            callers, modules = by_caller.setdefault(side, collections.Counter()), by_module.setdefault(
                side, collections.Counter())
            for code, count in dict(counter).items():
                callers[_function_name(code) if code is not None else "(no caller)"] += count
                modules[_module_name(code)] += count
        for side, total in sorted(by_side.items()):
            print(f"  {side} Python calls per msg: {sum(total.values()) / messages:.0f}", flush=True)
            for name, count in total.most_common(self.top):
                print(f"    {count / messages:7.2f}  {name}", flush=True)
            print(f"  {side} Python calls per msg, by the module that made them:", flush=True)
            for name, count in by_module[side].most_common(self.top):
                print(f"    {count / messages:7.2f}  {name}", flush=True)
            print(f"  {side} Python calls per msg, by the function that made them:", flush=True)
            for name, count in by_caller[side].most_common(self.top):
                print(f"    {count / messages:7.2f}  {name}", flush=True)

    def stop(self) -> None:
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.setprofile(None)


def _module_name(code: Any) -> str:
    """The file of a code object, from its package on (``wsrm_plugin/engine/inbound.py``,
    ``spyne/context.py``; ``(no caller)`` for a thread's first frame)."""
    if code is None:
        return "(no caller)"
    path = code.co_filename
    for root in ("/site-packages/", "/python3.11/", "/wt/"):
        if root in path:
            path = path.rsplit(root, 1)[1]
            return path.split("/", 1)[1] if root == "/wt/" else path
    return path


def _function_name(what: Any) -> str:
    """A counted code object's or built-in's name, with where it comes from."""
    code = getattr(what, "co_qualname", None)
    if code is not None:
        return f"{what.co_qualname} ({'/'.join(what.co_filename.rsplit('/', 2)[-2:])}:{what.co_firstlineno})"
    owner = getattr(what, "__self__", None)
    prefix = type(owner).__name__ + "." if owner is not None and not isinstance(owner, type(sys)) else ""
    return f"{prefix}{getattr(what, '__qualname__', what)} (built-in)"


class _Garbage:
    """The garbage collector's collections and the unreachable objects it found (``gc.callbacks``)."""

    def __init__(self) -> None:
        import gc

        self.collections = [0, 0, 0]
        self.collected = 0
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0
        gc.callbacks.append(self._seen)

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds[info["generation"]] += time.thread_time() - self._started
            self.collections[info["generation"]] += 1
            self.collected += info["collected"]

    def snapshot(self) -> tuple[int, list[int], list[float]]:
        return self.collected, list(self.collections), list(self.seconds)

    def report(self, was: tuple[int, list[int], list[float]], messages: int) -> None:
        collected, collections, seconds = was
        counts = [now - before for now, before in zip(self.collections, collections, strict=True)]
        cpu = [(now - before) * 1e6 / messages for now, before in zip(self.seconds, seconds, strict=True)]
        print(f"  garbage per msg: {(self.collected - collected) / messages:.1f} objects found unreachable; "
              f"collections (gen 0/1/2) {counts[0]}/{counts[1]}/{counts[2]} in {messages} msgs, their CPU "
              f"{sum(cpu):.0f} us a msg ({cpu[0]:.0f}/{cpu[1]:.0f}/{cpu[2]:.0f})", flush=True)

    def stop(self) -> None:
        import gc

        gc.callbacks.remove(self._seen)


class _MemoryTransactions:
    """A memory store's transactions (``MemoryStore.begin``) by side and by the function that
    began them: what a SQLite store counts as turns on its file."""

    def __init__(self) -> None:
        import collections

        from wsrm_plugin.store.memory import MemoryStore

        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        begin = MemoryStore.begin

        def counted(store: Any, *a: Any, **k: Any) -> Any:  # a measuring tool's patch
            caller = sys._getframe(1).f_code
            self.counts[(_side(threading.current_thread().name), caller.co_qualname)] += 1
            return begin(store, *a, **k)
        MemoryStore.begin = counted  # type: ignore[method-assign]

    def reset(self) -> None:
        self.counts.clear()

    def report(self, messages: int) -> None:
        for side in ("service", "client"):
            mine = sorted(((count, caller) for (s, caller), count in dict(self.counts).items() if s == side),
                          reverse=True)
            print(f"  {side} store transactions per msg: {sum(c for c, _ in mine) / messages:.2f}  " + "  ".join(
                f"{caller}={count / messages:.2f}" for count, caller in mine[:8]), flush=True)


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


class _HeldCpu:
    """The service's CPU (each thread's own clock) while it holds its SQLite store's file, and
    what of it, and of the service's CPU outside the file, went to each step of a delivery:
    the chain's delivery as a whole (``ChainMiddleware.deliver``: the rest of the in chain,
    spyne, the out chain) and spyne's four steps in it (its contexts: the envelope taken
    apart and the method found; the request read into objects, validated; the method;
    the answer written).  Steps nest: each is counted with what it calls.  A thread's CPU
    clock counts what that thread ran, not the time it waited for the interpreter, so a
    loaded machine moves it far less than the file's wall time (``file held us``)."""

    def __init__(self, service: Any) -> None:
        import collections

        self._lock = threading.Lock()
        self._local = threading.local()
        self.held = 0.0
        self.inside: collections.Counter[str] = collections.Counter()
        self.outside: collections.Counter[str] = collections.Counter()
        #: the receives that deliver inside, several waiting for the file at once done together
        self._together = service.engine.destination._together
        self._batches = self._batched()
        gate = service.engine.store._gate
        acquire, release = gate.acquire, gate.release

        def acquired(*a: Any, **k: Any) -> Any:
            result = acquire(*a, **k)
            self._local.since = time.thread_time()
            return result

        def released(*a: Any, **k: Any) -> Any:
            since = getattr(self._local, "since", None)
            if since is not None:
                self._local.since = None
                spent = time.thread_time() - since
                with self._lock:
                    self.held += spent
            return release(*a, **k)
        gate.acquire, gate.release = acquired, released  # a measuring tool's patch
        server = service.chain_app.application
        destination = service.engine.destination
        for owner, name, label in ((destination, "_record", "receipt"),
                                   (destination._direct, "_deliver", "invoker delivery"),
                                   (service.engine.store, "_finish", "commit"),
                                   (service.chain_app, "deliver", "chain delivery"),
                                   (service.chain_app, "read_ahead", "read ahead"),
                                   (server, "generate_contexts", "spyne contexts"),
                                   (server, "get_in_object", "spyne request read"),
                                   (server, "get_out_object", "spyne method"),
                                   (server, "get_out_string", "spyne answer")):
            if hasattr(owner, name):  # (a tree without the step: counted as 0)
                setattr(owner, name, self._timed(getattr(owner, name), label))

    def _timed(self, call: Any, label: str) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            started = time.thread_time()
            try:
                return call(*a, **k)
            finally:
                spent = time.thread_time() - started
                holding = getattr(self._local, "since", None) is not None
                with self._lock:
                    (self.inside if holding else self.outside)[label] += spent
        return timed

    def _batched(self) -> tuple[int, int]:
        together = self._together
        return (together.batches, together.items) if together is not None else (0, 0)

    def reset(self) -> None:
        self._batches = self._batched()
        with self._lock:
            self.held = 0.0
            self.inside.clear()
            self.outside.clear()

    def report(self, messages: int) -> None:
        with self._lock:
            held, inside, outside = self.held, dict(self.inside), dict(self.outside)
        labels = ("receipt", "invoker delivery", "commit", "chain delivery", "read ahead", "spyne contexts",
                  "spyne request read", "spyne method", "spyne answer")
        print(f"  service CPU us per msg holding the file: {1e6 * held / messages:.0f}; of it "
              + ", ".join(f"{label} {1e6 * inside.get(label, 0.0) / messages:.0f}" for label in labels)
              + "; outside the file: "
              + ", ".join(f"{label} {1e6 * outside.get(label, 0.0) / messages:.0f}" for label in labels),
              flush=True)
        batches, items = (now - was for now, was in zip(self._batched(), self._batches, strict=True))
        print(f"  receives delivered together: {items / messages:.2f} a msg in {batches / messages:.2f} batches "
              f"({items / max(batches, 1):.2f} a batch)", flush=True)


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
