"""How fast a backlog drains when the peer returns: N queued one-way messages, each store.

A source whose peer is down queues what its application sends; when the peer
comes back, the sender drains the backlog.  If a send batch or an
acknowledgement cost more as the backlog grows, draining N messages costs N
squared: the rate at 100,000 queued falls far below the rate at 1,000.  The
aim (issue 33): the large backlog drains within 20% of the small one's rate.

For each store (``memory``, ``sqlite``, ``postgresql``: the same kind on both
sides, no transaction manager) and each backlog size, the client engine's
store is filled while the service is down (in transactions of 5,000, outside
the measurement), the service process starts, then the client's engine; the
rate is the messages delivered to the service's application over the time
from the client's start to the last delivery (the first delivery's time is
printed too).  Sizes and stores are interleaved within each round; the
figures are medians of the rounds.

Run::

    .venv/bin/python bench/bench_backlog.py [--small 1000] [--large 100000] [--rounds 3]
        [--stores memory,sqlite,postgresql] [--bracket] [--count]

The client's CPU per message is printed beside each rate (this process's, the
client engine's only), and the service's (its process's, from /proc), PostgreSQL's (its server's
processes, both stores' databases: the server is the benchmark's own), with the client's by
tenth of the drain (flat when a message costs the same whatever is still queued), the time
its garbage collector took, and its sender's counts a message (sends, retransmissions).

``--count`` also counts, in the client, what each message cost it, which a loaded machine does
not blur: a SQLite store's statements a message by kind (the first word and the table) and
SQLite's virtual machine steps a message by kind (its progress handler, every 100 steps: a proxy
for the rows a statement touched), the memory store's rows visited in its index and copied from its
tables, a PostgreSQL store's tuples of the message table read and blocks touched a message, in all
and by statement (``pg_stat_statements``, loaded then); ``--python-calls N`` the client's Python calls a message
(built-ins included, ``sys.setprofile``: it slows the client down, so rates are then not
comparable) and its N most called functions.  A cost that grows with the backlog shows as a
larger figure at the large backlog than at the small one.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ENVELOPE = (b'<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/"><s:Header/><s:Body>'
            b'<order xmlns="urn:bench">%d</order></s:Body></s:Envelope>')
ACTION = "urn:bench:order"
FILL = 5000


def _policy() -> Any:
    from wsrm_plugin.engine import RMPolicy

    return RMPolicy(soap_version="1.1")


def server_role(args: argparse.Namespace) -> int:
    """The service: counts deliveries, prints each thousandth's time, and the last one's."""
    from wsrm_plugin.engine import ReliableEngine

    lock = threading.Lock()
    seen = {"count": 0, "first": 0.0}

    def application(envelope: bytes, context: Any) -> None:
        with lock:
            seen["count"] += 1
            now = time.time()
            if seen["count"] == 1:
                seen["first"] = now
                print(f"FIRST {now}", flush=True)
            if seen["count"] == args.expect:
                print(f"LAST {now}", flush=True)
            elif seen["count"] % max(1000, args.expect // 10) == 0:
                print(f"AT {seen['count']}", flush=True)

    calls = _ServerCalls() if args.server_python_calls else None  # before the threads start
    engine = ReliableEngine(args.store_url, _policy(), application=application, name="backlog-server")
    engine.serve("127.0.0.1", args.port)
    engine.start()
    if calls is not None:
        calls.clear()  # the start's calls not counted
    collections = _Collections().__enter__()
    print("READY", flush=True)
    sys.stdin.readline()
    collections.__exit__()
    import gc

    # the service's garbage collector over the drain, a message (to stderr: the coordinator reads
    # stdout only up to the last delivery)
    n = max(args.expect, 1)
    print(f"SERVER garbage collector {1e6 * collections.seconds / n:.1f} us a message, passes by generation "
          f"{collections.passes}, {len(gc.get_objects())} objects tracked at the end", file=sys.stderr, flush=True)
    if calls is not None:
        calls.report(args.expect, args.server_python_calls)
    engine.stop(timeout=5)
    return 0


class _ServerCalls:
    """``--server-python-calls N``: the service's Python calls (every thread, from its start to
    the last delivery), by function and by caller and function, a message, printed to stderr at the
    end (built-ins included; ``sys.setprofile`` slows the service, so its rates are then not
    comparable)."""

    def __init__(self) -> None:
        import collections

        self.counters: list[collections.Counter[Any]] = []

        def first(frame: Any, event: str, arg: Any) -> None:
            counter: collections.Counter[Any] = collections.Counter()
            self.counters.append(counter)

            def count(frame: Any, event: str, arg: Any) -> None:
                if event == "call":
                    counter[(frame.f_back.f_code if frame.f_back is not None else None, frame.f_code)] += 1
                elif event == "c_call":
                    owner = getattr(arg, "__self__", None)
                    counter[(frame.f_code, (type(owner).__name__ + "." if owner is not None
                                            and not isinstance(owner, type(sys)) else "")
                             + getattr(arg, "__qualname__", "?"))] += 1
            sys.setprofile(count)
            count(frame, event, arg)
        threading.setprofile(first)
        sys.setprofile(first)

    def clear(self) -> None:
        for counter in list(self.counters):
            counter.clear()

    def report(self, messages: int, top: int) -> None:
        import collections

        threading.setprofile(None)  # type: ignore[arg-type]
        by_callee: collections.Counter[str] = collections.Counter()
        by_pair: collections.Counter[str] = collections.Counter()
        for counter in list(self.counters):
            for (caller, callee), n in dict(counter).items():
                by_callee[_function_name(callee)] += n
                by_pair[f"{_function_name(callee)} <- {_function_name(caller)}"] += n
        n = max(messages, 1)
        print(f"SERVER python calls a message: {sum(by_callee.values()) / n:.1f}", file=sys.stderr)
        for name, count in by_callee.most_common(top):
            print(f"SERVER call {count / n:9.2f}  {name}", file=sys.stderr)
        for name, count in by_pair.most_common(top):
            print(f"SERVER pair {count / n:9.2f}  {name}", file=sys.stderr)
        sys.stderr.flush()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Collections:
    """The cyclic garbage collector's passes and their time while it is installed (a pass of
    the oldest generation walks every live object: its cost grows with what the process keeps)."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = 0.0
        self._since = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._since = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._since
            self.passes[info["generation"]] += 1

    def __enter__(self) -> "_Collections":
        import gc

        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        import gc

        gc.callbacks.remove(self)


def _sender_counts(client: Any, queued: int) -> dict[str, float]:
    """The client's sender, per message: what it sent (retransmissions, fast ones and loss
    probes apart), its rounds' refill claims; and the sequence's flow at the end (pipelined or
    in order, the numbers it keeps as outstanding)."""
    sender = client.retransmission
    out = {f"sender {name.replace('_', ' ')}": getattr(sender, name, 0) / queued
           for name in ("messages_sent", "retransmissions", "fast_retransmits", "loss_probes", "refill_claims")}
    flows = getattr(sender, "_flows", {})
    out["flow outstanding at end"] = float(sum(len(f.outstanding) for f in flows.values()))
    out["flow pipelined at end"] = float(sum(not f.ordered for f in flows.values()))
    return out


def _process_cpu(pid: int) -> float:
    """Another process's CPU so far (user + system, all its threads; /proc), in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cluster_cpu(pg: Any) -> float:
    """A PostgreSQL server's CPU so far (seconds): its postmaster's and every process it forked,
    running (their own) or ended (the postmaster's counts of the children it reaped).  The
    benchmark's server serves this benchmark only: both stores' databases, its background work."""
    if pg is None:
        return 0.0
    with open(pg.data_dir / "postmaster.pid", encoding="ascii") as f:
        postmaster = int(f.readline())
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:  # ended meanwhile: counted by the postmaster once reaped
            continue
        if int(entry) == postmaster:
            total += sum(int(v) for v in fields[11:15])  # its own, and its reaped children's
        elif int(fields[1]) == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _sys_cpu() -> float:
    """This process's CPU in the kernel (its system calls: a SQLite page read from the OS's
    cache is one)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


class _Counts:
    """``--count``: a SQLite store's statements and virtual machine steps by kind, the memory
    store's rows visited in its index and copied from its tables, a PostgreSQL store's tuples
    read of the message table and blocks touched by statement (:class:`_PgCounts`), and
    (``--python-calls``) the Python calls of the client's threads (a measuring tool only: the
    store's connections are traced from outside)."""

    STEPS = 100  # the progress handler's period, in virtual machine steps

    def __init__(self, python_calls: int | None) -> None:
        import collections

        self.statements: collections.Counter[str] = collections.Counter()
        self.steps: collections.Counter[str] = collections.Counter()
        self.calls: list[collections.Counter[Any]] = []
        self.python_calls = python_calls
        self._current = threading.local()
        self._memory: Any = None  # the memory store counted: its index, and the rows copied
        self.copied = 0
        self._visited = 0
        self._pg: _PgCounts | None = None

    @staticmethod
    def kind(sql: str) -> str:
        words = sql.split(None, 4)
        kind = words[0].upper() if words else "?"
        if kind in ("INSERT", "UPDATE", "DELETE") and len(words) > 2:
            return kind + " " + (words[1] if kind == "UPDATE" else words[2])
        if kind in ("SELECT", "WITH"):
            source = sql.upper().partition(" FROM ")[2].split(None, 1)
            return kind + " " + (source[0].lower() if source else "-")
        return kind

    def trace(self, conn: Any) -> None:
        current = self._current

        def traced(sql: str) -> None:
            current.kind = kind = self.kind(sql)
            self.statements[kind] += 1

        def step() -> int:
            self.steps[getattr(current, "kind", "?")] += 1
            return 0
        conn.set_trace_callback(traced)
        conn.set_progress_handler(step, self.STEPS)

    def install(self, store: Any, url: str) -> None:
        """Trace a SQLite store's pooled connections and those it opens from now on; count a
        memory store's rows visited and copied (as ``tests/store/test_backlog.py`` does), or a
        PostgreSQL store's tuples and blocks."""
        if url.startswith("postgresql:"):
            self._pg = _PgCounts(url.partition(":")[2])
            return
        if hasattr(getattr(store, "_messages", None), "rows_visited"):
            self._memory = store

            def counted(fn: Any) -> Any:
                def wrapper(*args: Any) -> Any:
                    rows = fn(*args)
                    self.copied += len(rows)
                    return rows
                return wrapper
            store._snapshot, store._snapshot_group = counted(store._snapshot), counted(store._snapshot_group)
            return
        connect = getattr(store, "_connect", None)
        if connect is None:
            return

        def counted_connect() -> Any:
            conn = connect()
            self.trace(conn)
            return conn
        store._connect = counted_connect
        for conn in list(getattr(store, "_idle", [])):
            self.trace(conn)

    def start(self) -> None:
        """From now on (the fill done): count anew, and the Python calls of threads started now."""
        import collections

        self.statements.clear()
        self.steps.clear()
        self.copied = 0
        if self._memory is not None:
            self._visited = self._memory._messages.rows_visited
        if self._pg is not None:
            self._pg.start()
        if self.python_calls is None:
            return

        def first(frame: Any, event: str, arg: Any) -> None:
            counter: collections.Counter[Any] = collections.Counter()
            self.calls.append(counter)

            def count(frame: Any, event: str, arg: Any) -> None:
                if event == "call":
                    counter[frame.f_code] += 1
                elif event == "c_call":  # by name: a bound built-in would keep its object alive
                    owner = getattr(arg, "__self__", None)
                    counter[(type(owner).__name__ + "." if owner is not None and not isinstance(owner, type(sys))
                             else "") + getattr(arg, "__qualname__", "?")] += 1
            sys.setprofile(count)
            count(frame, event, arg)
        threading.setprofile(first)

    def stop(self) -> None:
        threading.setprofile(None)  # type: ignore[arg-type]
        if self._pg is not None:
            self._pg.stop()

    def report(self, queued: int) -> dict[str, float]:
        """Per message: the statements, steps and Python calls, in all and by kind."""
        import collections

        out = {"statements": sum(self.statements.values()) / queued,
               "steps": self.STEPS * sum(self.steps.values()) / queued}
        out.update({f"stmt {k}": v / queued for k, v in self.statements.items()})
        out.update({f"steps {k}": self.STEPS * v / queued for k, v in self.steps.items()})
        if self._memory is not None:
            out["memory index rows visited"] = (self._memory._messages.rows_visited - self._visited) / queued
            out["memory rows copied"] = self.copied / queued
        if self._pg is not None:
            out.update(self._pg.report(queued))
        if self.python_calls is not None:
            total: collections.Counter[str] = collections.Counter()
            for counter in list(self.calls):
                for what, n in dict(counter).items():
                    total[_function_name(what)] += n
            out["python calls"] = sum(total.values()) / queued
            out.update({f"call {name}": n / queued for name, n in total.most_common(self.python_calls)})
        return out


class _PgCounts:
    """A PostgreSQL client store's cost a message, from the server's own counters: the tuples of
    the message table and its indexes read (``pg_stat_get_tuples_*``, as the store's backlog
    test counts them), and each statement's calls and blocks touched (``pg_stat_statements``,
    loaded by ``--count``; the blocks of shared buffers hit or read: what a statement walked).
    The tuple counters reach the server when a session is idle, within a second: :meth:`stop`
    waits that long."""

    TOP = 10  # the statements listed, those that touched most blocks

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._tuples = 0

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        import psycopg2

        conn = psycopg2.connect(self.dsn)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def _tuples_read(self) -> int:
        return int(self._query(
            "SELECT pg_stat_clear_snapshot(), sum(pg_stat_get_tuples_returned(c.oid) + "
            "pg_stat_get_tuples_fetched(c.oid)) FROM pg_class c WHERE c.oid = 'rms_message'::regclass "
            "OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'rms_message'::regclass)")[0][1] or 0)

    def start(self) -> None:
        self._query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        time.sleep(1.2)  # the fill's counters reported
        self._query("SELECT pg_stat_statements_reset()")
        self._tuples = self._tuples_read()

    def stop(self) -> None:
        time.sleep(1.2)
        self._tuples = self._tuples_read() - self._tuples

    def report(self, queued: int) -> dict[str, float]:
        rows = self._query(
            "SELECT query, calls, rows, shared_blks_hit + shared_blks_read FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND toplevel "
            "AND query NOT LIKE '%pg_stat%'")
        out = {"pg message tuples read": self._tuples / queued,
               "pg statements": sum(r[1] for r in rows) / queued, "pg blocks": sum(r[3] for r in rows) / queued}
        by: dict[str, list[float]] = {}
        for query, calls, got, blocks in rows:  # a statement prepared on several sessions: one
            name = " ".join(re.sub(r"^PREPARE \w+ AS |; RELEASE SAVEPOINT wsrm_prepare", "", query).split())[:70]
            total = by.setdefault(name, [0.0, 0.0, 0.0])
            total[0] += calls
            total[1] += got
            total[2] += blocks
        for name, (calls, got, blocks) in sorted(by.items(), key=lambda kv: -kv[1][2])[:self.TOP]:
            out[f"pg blocks {name}"] = blocks / queued
            out[f"pg calls {name}"] = calls / queued
        return out


def _function_name(what: Any) -> str:
    code = getattr(what, "co_qualname", None)
    if code is not None:
        return f"{code} ({'/'.join(what.co_filename.rsplit('/', 2)[-2:])}:{what.co_firstlineno})"
    return f"{what} (built-in)"


def _store_urls(kind: str, tmp: Path, pg: Any, tag: str) -> tuple[str, str]:
    if kind == "memory":
        return "memory:", "memory:"
    if kind == "sqlite":
        return f"sqlite:///{tmp}/client-{tag}.db", f"sqlite:///{tmp}/server-{tag}.db"
    return ("postgresql:" + pg.create_database(f"cli_{tag}"), "postgresql:" + pg.create_database(f"srv_{tag}"))


def drain(kind: str, queued: int, tmp: Path, pg: Any, tag: str,
          counts: _Counts | None = None, keep_trees: bool = False, server_calls: int = 0) -> dict[str, float]:
    """Fill a client store with ``queued`` messages for a service that is down, start the service
    and the client; the drain's figures."""
    from wsrm_plugin.engine import ReliableEngine
    from wsrm_plugin.engine.envelopes import prepare_outgoing

    client_url, server_url = _store_urls(kind, tmp, pg, tag)
    port = _free_port()
    target = f"http://127.0.0.1:{port}/"
    client = ReliableEngine(client_url, _policy(), name="backlog-client")
    policy = client.policy
    if counts is not None:
        counts.install(client.store, client_url)
    for start in range(0, queued, FILL):  # outside the measurement: the application's backlog
        with client.store.begin() as tx:
            for i in range(start, min(queued, start + FILL)):
                outgoing = prepare_outgoing(ENVELOPE % i, to=target, action=ACTION, message_id=None, reply_to=None,
                                            relates_to=None, wsa=policy.addressing,
                                            max_size=policy.max_message_size)
                client.source._enqueue_outgoing(tx, (target, "backlog", False), outgoing)
    # The trees of the envelopes just enqueued wait in this process for their first send
    # (engine.parsed.TREES, the last 1,024): a backlog of 1,000 was sent from them, one of 100,000
    # parsed all but its last 1,024 from their stored bytes (read_trusted: 0.95 parses a message
    # more, about 100 us of the client's CPU).  A backlog that outlived a restart, or the cache,
    # is read from the store: both sizes are measured so (``--keep-trees``: as filled).
    from wsrm_plugin.engine.parsed import TREES

    if not keep_trees:
        TREES.__init__()  # type: ignore[misc]  # emptied: a measuring tool only
    hits = TREES.hits
    server = subprocess.Popen(
        [sys.executable, __file__, "--role", "server", "--store-url", server_url, "--port", str(port),
         "--expect", str(queued)] + (["--server-python-calls", str(server_calls)] if server_calls else []),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert server.stdout is not None and server.stdin is not None
    try:
        if server.stdout.readline().strip() != "READY":
            raise RuntimeError("the service did not start")
        if counts is not None:
            counts.start()
        import gc

        live = len(gc.get_objects())
        collections = _Collections().__enter__()
        cpu0, sys0, server0, t0 = _cpu(), _sys_cpu(), _process_cpu(server.pid), time.time()
        pg0 = _cluster_cpu(pg) if kind == "postgresql" else 0.0
        client.start()
        first = last = 0.0
        tenths: list[tuple[int, float]] = [(0, cpu0)]  # (delivered, client CPU then)
        for line in server.stdout:
            word, _, value = line.strip().partition(" ")
            if word == "FIRST":
                first = float(value)
            elif word == "AT":
                tenths.append((int(value), _cpu()))
            elif word == "LAST":
                last = float(value)
                break
        cpu, sys_cpu, server_cpu = _cpu() - cpu0, _sys_cpu() - sys0, _process_cpu(server.pid) - server0
        pg_cpu = _cluster_cpu(pg) - pg0 if kind == "postgresql" else 0.0
        tenths.append((queued, cpu0 + cpu))
        if len(tenths) > 2:  # the client's CPU a message through the drain: does it fall as the backlog does?
            print(f"    {queued} queued: the client's CPU us a message, by tenth of the drain: " + " ".join(
                f"{1e6 * (c1 - c0) / max(n1 - n0, 1):.0f}" for (n0, c0), (n1, c1) in itertools.pairwise(tenths)),
                flush=True)
        collections.__exit__()
        if counts is not None:
            counts.stop()
        if not last:
            raise RuntimeError("the service ended before the last delivery")
        return {"rate": queued / (last - t0), "first_after": first - t0, "seconds": last - t0,
                "client_cpu_us": 1e6 * cpu / queued, "client system CPU us": 1e6 * sys_cpu / queued,
                "server_cpu_us": 1e6 * server_cpu / queued, "postgresql_cpu_us": 1e6 * pg_cpu / queued, "gc us": 1e6 * collections.seconds / queued,
                "gc oldest passes per 1000": 1000 * collections.passes[2] / queued, "live_objects": live,
                "trees taken": (TREES.hits - hits) / queued,
                **_sender_counts(client, queued), **(counts.report(queued) if counts is not None else {})}
    finally:
        client.stop(timeout=5)
        server.stdin.write("stop\n")
        server.stdin.flush()
        server.wait(30)


#: What every drain reports (the rest are ``--count``'s counts a message).
_FIGURES = ("rate", "first_after", "seconds", "client_cpu_us", "server_cpu_us", "postgresql_cpu_us", "client system CPU us", "gc us",
            "gc oldest passes per 1000", "live_objects", "sender messages sent", "sender retransmissions",
            "sender fast retransmits", "sender loss probes", "sender refill claims", "flow outstanding at end",
            "flow pipelined at end", "trees taken")


def _print_counts(stores: list[str], sizes: tuple[int, int],
                  figures: dict[tuple[str, int], list[dict[str, float]]]) -> None:
    """The counts a message (medians of the rounds) at each backlog, side by side: what grows."""
    print(f"counts a message (client), at {sizes[0]} and {sizes[1]} queued:")
    for kind in stores:
        small, large = figures[(kind, sizes[0])], figures[(kind, sizes[1])]
        names = sorted({name for f in small + large for name in f
                        if name not in _FIGURES},
                       key=lambda n: -max(f.get(n, 0.0) for f in large))
        for name in names:
            a = statistics.median(f.get(name, 0.0) for f in small)
            b = statistics.median(f.get(name, 0.0) for f in large)
            if max(a, b) >= 0.005:
                print(f"  {kind:10s} {a:10.2f} {b:10.2f}  {name}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=("coordinator", "server"), default="coordinator")
    p.add_argument("--small", type=int, default=1000)
    p.add_argument("--large", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--stores", default="memory,sqlite,postgresql")
    p.add_argument("--keep-trees", action="store_true",
                   help="send the backlog from the parsed trees its fill left (a small backlog fits them all)")
    p.add_argument("--bracket", action="store_true",
                   help="drain the small backlog after the large one too, in each round: on a loaded machine "
                        "the small one's rate is then taken before and after the large one's (a median of both)")
    p.add_argument("--count", action="store_true",
                   help="count the client store's work a message: SQLite's statements and VM steps by kind, "
                        "memory's rows visited and copied, PostgreSQL's tuples read and blocks by statement")
    p.add_argument("--python-calls", type=int, default=None, metavar="N",
                   help="count the client's Python calls a message, and list its N most called (slows it)")
    p.add_argument("--server-python-calls", type=int, default=0, metavar="N",
                   help="count the service's Python calls a message (by function, and by caller and function), "
                        "print its N most called to stderr (slows the service)")
    p.add_argument("--store-url", default="")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--expect", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.role == "server":
        return server_role(args)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    from wsrm_plugin.tools.pgserver import ThrowawayPostgres

    settings = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"}
    pg = (ThrowawayPostgres(max_connections=100, settings=settings if args.count else None).start()
          if "postgresql" in stores else None)
    tmp = Path(tempfile.mkdtemp(prefix="bench-backlog-"))
    print(f"backlog drain: {args.small} and {args.large} queued one-way messages, {args.rounds} interleaved "
          f"round(s); rate = messages / (client start .. last delivery)", flush=True)
    figures: dict[tuple[str, int], list[dict[str, float]]] = {}
    # The process's first engine start collects and freezes its start-up objects
    # (RMPolicy.freeze_gc_at_start): 0.13 s, which counted as 131 us a message of the first
    # drain of 1,000 (the smaller backlog's client CPU, when it came first).  Done here instead.
    from wsrm_plugin.engine import ReliableEngine

    ReliableEngine("memory:", _policy(), name="backlog-warm-up").start().stop(timeout=5)
    try:
        for round_no in range(1, args.rounds + 1):
            print(f"round {round_no}", flush=True)
            for kind in stores:
                for turn, queued in enumerate((args.small, args.large) + ((args.small,) if args.bracket else ())):
                    counts = _Counts(args.python_calls) if args.count or args.python_calls is not None else None
                    got = drain(kind, queued, tmp, pg, f"{kind[:3]}{queued}r{round_no}t{turn}", counts,
                                args.keep_trees, args.server_python_calls)
                    figures.setdefault((kind, queued), []).append(got)
                    print(f"  {kind:10s} {queued:>7} queued: {got['rate']:7.1f} msg/s ({got['seconds']:.1f} s, "
                          f"first after {1000 * got['first_after']:.0f} ms), client CPU "
                          f"{got['client_cpu_us']:.0f} us/msg (garbage collector {got['gc us']:.0f}, "
                          f"{got['live_objects']:.0f} objects live at the start), service CPU "
                          f"{got['server_cpu_us']:.0f} us/msg"
                          + (f", PostgreSQL CPU {got['postgresql_cpu_us']:.0f} us/msg" if kind == "postgresql" else "")
                          + f"; sent {got['sender messages sent']:.3f} a message, "
                          f"retransmitted {got['sender retransmissions']:.3f}, outstanding at the end "
                          f"{got['flow outstanding at end']:.0f}, sent pipelined at the end "
                          f"{got['flow pipelined at end']:.0f}; parsed trees taken {got['trees taken']:.2f} a message",
                          flush=True)
        if any(set(f[0]) - set(_FIGURES) for f in figures.values()):
            _print_counts(stores, (args.small, args.large), figures)
        print("medians, and the aim (issue 33): the large backlog drains at >= 0.8 of the small one's rate")
        for kind in stores:
            small = statistics.median(f["rate"] for f in figures[(kind, args.small)])
            large = statistics.median(f["rate"] for f in figures[(kind, args.large)])
            cpu_s = statistics.median(f["client_cpu_us"] for f in figures[(kind, args.small)])
            cpu_l = statistics.median(f["client_cpu_us"] for f in figures[(kind, args.large)])
            srv_s = statistics.median(f["server_cpu_us"] for f in figures[(kind, args.small)])
            srv_l = statistics.median(f["server_cpu_us"] for f in figures[(kind, args.large)])
            gc_s = statistics.median(f["gc us"] for f in figures[(kind, args.small)])
            gc_l = statistics.median(f["gc us"] for f in figures[(kind, args.large)])
            pg_s = statistics.median(f["postgresql_cpu_us"] for f in figures[(kind, args.small)])
            pg_l = statistics.median(f["postgresql_cpu_us"] for f in figures[(kind, args.large)])
            ratio = large / small
            print(f"  {kind:10s} {small:7.1f} msg/s at {args.small}, {large:7.1f} at {args.large}: "
                  f"{ratio:.2f} {'ok' if ratio >= 0.8 else 'BELOW'}  (client CPU {cpu_s:.0f} / {cpu_l:.0f} us/msg, "
                  f"of it the garbage collector {gc_s:.0f} / {gc_l:.0f}; service CPU {srv_s:.0f} / {srv_l:.0f}"
                  + (f"; PostgreSQL CPU {pg_s:.0f} / {pg_l:.0f}" if kind == "postgresql" else "") + ")")
    finally:
        if pg is not None:
            pg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
