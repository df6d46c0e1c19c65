"""Where one reliable request-reply call's time goes: store transactions, fsyncs, HTTP exchanges
and thread wake-ups, by thread, in one process.

``bench_compare.py --latency`` measures whole processes from outside; this one says what a call
does on its way.  A reliable zeep client and a reliable spyne service (the ``quote`` operation of
``bench_compare``, no database) run in this process over loopback HTTP, on memory or SQLite
stores; after ``--warm-up`` calls, ``--calls`` sequential calls are made, each waiting for its
answer, while every store commit, fsync, HTTP POST and ``Event.set`` is counted per thread
(the engine's workers are named ``<engine>-rms``, ``-rmd``, ``-invoker-N``; waitress's threads
serve the service).  It prints the counts per call, then one call's timeline with the stack
that led to each event (the client and the service share one interpreter, so the timeline's
milliseconds are only indicative: count, don't time).

Run::

    .venv/bin/python bench/bench_call_path.py [--store memory|sqlite|xa1|xa2] [--calls 50] [--no-timeline]
        [--idle-sequences N] [--policy poll_interval=60] [--pg-profile]

``--store xa2`` puts each side's store in a database of its own (two-phase commit, the store's
branch with the commit mark), as ``bench_compare``'s xa2; a service's phase 2 run after its answer
(``RMPolicy.answer_at_decision``) is counted on its own thread (``service-phase-two-N``).

``--pg-profile`` (xa1) says what PostgreSQL's CPU went to through the calls, by ``perf``'s samples
of its processes (see ``pg_profile.py``): the statements' run, which ``pg_stat_statements``
times, against the plans' set-up, the protocol's reads and wake-ups, commits.

``--idle-sequences N`` first fills the service's store with N other clients' sequences (each a
destination sequence and the reply sequence accepted from its Offer, as a request-reply client
leaves them): a call's cost must not grow with them (``--idle-sequences 0`` against ``900``; ``max_open_sequences`` is 1,000).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

#: (perf_counter, thread name, event) while recording
EVENTS: list[tuple[float, str, str]] = []
_recording = threading.Event()


def _note(what: str) -> None:
    if _recording.is_set():
        EVENTS.append((time.perf_counter(), threading.current_thread().name, what))


def _where(depth: int = 5) -> str:
    """The last few frames of the library (wsrm_plugin, interceptors) that led here."""
    frames = traceback.extract_stack(limit=24)[:-3]
    names = [f.name for f in frames if "wsrm_plugin" in f.filename or "interceptors" in f.filename]
    return "/".join(names[-depth:])


def _instrument() -> None:
    """Count commits, fsyncs, POSTs and wake-ups (monkeypatched: a measuring tool only)."""
    from wsrm_plugin.engine import http_client
    from wsrm_plugin.store import memory, sqlite

    def wrap_finish(cls: Any, label: str) -> None:
        original = cls._finish

        def finish(self: Any, tx: Any, commit: bool) -> None:
            durable = getattr(tx, "waits_for_disk", True)
            how = "" if not durable or not getattr(tx, "returns_before_disk", False) else " (disk waited for later)"
            _note(f"{label} {'commit' if commit else 'rollback'}{'' if durable else ' (not durable)'}{how}"
                  f"  {_where()}")
            original(self, tx, commit)
        cls._finish = finish

    wrap_finish(memory.MemoryStore, "memory")
    wrap_finish(sqlite.SqliteStore, "sqlite")
    _instrument_postgres()
    def counted(real: Any) -> Any:
        def fsync(fd: int) -> None:
            _note("fsync")
            real(fd)
        return fsync
    os.fsync = counted(os.fsync)  # type: ignore[assignment]
    if hasattr(os, "fdatasync"):  # the SQLite store's WAL sync where there is one
        os.fdatasync = counted(os.fdatasync)  # type: ignore[assignment]
    post = http_client.HttpConnection.post

    def counted_post(self: Any, path: str, headers: dict[str, str], body: bytes, limit: int) -> Any:
        _note(f"POST {headers.get('SOAPAction', '')}  {_where()}")
        response = post(self, path, headers, body, limit)
        _note(f"response {response[0]}, {len(response[2])} bytes")
        return response
    http_client.HttpConnection.post = counted_post  # type: ignore[method-assign]
    event_set = threading.Event.set

    def counted_set(self: threading.Event) -> None:
        if self is not _recording:  # the bench's own switch, set before each call: not the library's
            _note(f"wake  {_where(3)}")
        event_set(self)
    threading.Event.set = counted_set  # type: ignore[method-assign]


def _instrument_postgres() -> None:
    """Count PostgreSQL round trips of the store's and the XA data source's sessions (their
    LazyBeginCursor, and the branch's own COMMIT/PREPARE), each named by what it ends or starts."""
    from txmanager import lazy_begin

    cursor_execute = lazy_begin.LazyBeginCursor.execute

    def execute(self: Any, query: Any, vars: Any = None) -> Any:  # noqa: A002
        _note(f"pg {_statement(query, self.connection)}  {_where()}")
        return cursor_execute(self, query, vars)
    lazy_begin.LazyBeginCursor.execute = execute  # type: ignore[method-assign]
    by_sql = lazy_begin.LazyBeginConnection._by_sql

    def counted_by_sql(self: Any, statement: str, params: Any, expected: str) -> None:
        _note(f"pg {_statement(statement, self)}  {_where()}")
        by_sql(self, statement, params, expected)
    lazy_begin.LazyBeginConnection._by_sql = counted_by_sql  # type: ignore[method-assign]
    commit_branch = lazy_begin.LazyBeginConnection.commit_branch

    def counted_commit_branch(self: Any) -> None:
        if getattr(self, "_mode", None) == "sql":  # the one-phase COMMIT it sends itself (else by _by_sql)
            _note(f"pg COMMIT+COMMIT  {_where()}")
        commit_branch(self)
    lazy_begin.LazyBeginConnection.commit_branch = counted_commit_branch  # type: ignore[method-assign]
    from txmanager.postgres import resource

    fused = resource.PostgresXAResource.end_and_commit_one_phase

    def counted_fused(self: Any, xid: Any, *args: Any) -> Any:
        # the sole branch's COMMIT sent from here (a plain cursor of psycopg2's, which the counts
        # above do not see), with what rides on it (LazyBeginConnection.ride, ride_to_commit)
        conn = self._session
        sends = getattr(conn, "_mode", None) == "sql" and self._branch is not None and self._branch.xid is xid
        riding, rider = len(getattr(conn, "_riding", ())), getattr(conn, "_rider", None) is not None
        done = fused(self, xid, *args)  # (True, or txmanager.xa.SYNC_RAN: a COMMIT sent all the same)
        if done and sends:
            _note(f"fused COMMIT ({riding} riding{', a read after it' if rider else ''})  {_where()}")
        return done
    resource.PostgresXAResource.end_and_commit_one_phase = counted_fused  # type: ignore[method-assign]
    send_rider = getattr(lazy_begin.LazyBeginConnection, "_send_rider", None)  # (absent before 2026-11-30)

    def counted_send_rider(self: Any) -> None:
        _note(f"pg a write riding to the COMMIT, sent before something else  {_where()}")
        send_rider(self)
    if send_rider is not None:
        lazy_begin.LazyBeginConnection._send_rider = counted_send_rider  # type: ignore[method-assign]
    from wsrm_plugin.store.sql import transaction

    text = transaction.SqlTransaction._text

    def named_text(self: Any, sql: str, params: Any) -> str:
        _LAST_SQL.sql = " ".join(sql.split()[:6])  # which statement an EXECUTE runs
        return text(self, sql, params)
    transaction.SqlTransaction._text = named_text  # type: ignore[method-assign]


#: the store's last statement in this thread (its first words): what an EXECUTE runs
_LAST_SQL = threading.local()


def _statement(query: Any, conn: Any) -> str:
    """A round trip's kind: what it ends (COMMIT, PREPARE...), else its first statement's verb."""
    text = query.decode() if isinstance(query, bytes) else str(query)
    words = " ".join(text.split()).upper()
    verb = words.removeprefix("BEGIN;").strip().split(" ", 1)[0].rstrip(";")
    if verb == "EXECUTE":  # a prepared statement: name its own first words
        verb = getattr(_LAST_SQL, "sql", "EXECUTE")
    elif verb in ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "PREPARE", "SET"):
        verb = " ".join(words.removeprefix("BEGIN;").split()[:6])
    lazy = "BEGIN+" if words.startswith("BEGIN;") or getattr(conn, "_mode", None) == "pending" else ""
    ends = ""
    for end in ("COMMIT PREPARED", "PREPARE TRANSACTION", "ROLLBACK", "COMMIT"):
        if words.endswith(end) or words.endswith(end + ";") or f";{end}" in words.replace("; ", ";"):
            ends = "+" + end
            break
    durable = " (not durable)" if "SYNCHRONOUS_COMMIT TO OFF" in words else ""
    return f"{lazy}{verb}{ends}{durable}"


def _switches_by_thread() -> collections.Counter[str]:
    """Context switches so far of this process's live threads, by name (waitress's summed):
    voluntary (the thread waited: a lock, an Event, a socket) and involuntary (preempted)."""
    found: collections.Counter[str] = collections.Counter()
    for thread in threading.enumerate():
        try:
            with open(f"/proc/self/task/{thread.native_id}/status") as f:
                status = f.read()
        except OSError:  # not Linux, or the thread just ended
            continue
        name = thread.name.rsplit("-", 1)[0] if thread.name.startswith("waitress") else thread.name
        for line in status.splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                found[name] += int(line.split()[1])
    return found


def _kind(event: str) -> str:
    return event.split("  ")[0]


def _idle_sequences(store: Any, count: int) -> None:
    """``count`` other clients' sequences, as request-reply clients that went quiet leave them."""
    from wsrm_plugin.engine.source import reply_sequence_key
    from wsrm_plugin.wire import RM11, WSA_2005_08

    anonymous = "http://www.w3.org/2005/08/addressing/anonymous"
    for first in range(0, count, 500):
        with store.begin() as tx:
            for i in range(first, min(count, first + 500)):  # RMD locks before RMS ones
                tx.rmd.create(f"urn:uuid:idle-{i}", acks_to=anonymous, rm_version=RM11.ns,
                              wsa_version=WSA_2005_08.ns)
            for i in range(first, min(count, first + 500)):
                sid, offered = f"urn:uuid:idle-{i}", f"urn:uuid:idle-offer-{i}"
                key = reply_sequence_key(sid)
                tx.rms.create(key, target=anonymous, acks_to=anonymous, rm_version=RM11.ns,
                              wsa_version=WSA_2005_08.ns, next_control_at=None)
                tx.rms.update(key, sequence_id=offered, started=True)


def _plans(store: Any) -> list[int]:
    """Generic and custom plans so far of the prepared statements on a PostgreSQL store's idle sessions.

    The sessions are taken out of the store's pool while they are read, and given back after:
    its workers still run, and one that took a session being read here found it inside this
    transaction ("set_session cannot be used inside a transaction" in a worker's step, or
    "cursor already closed" here, at the end of a loaded run: this benchmark's, not the store's)."""
    found = [0, 0]
    if not hasattr(store, "_idle"):
        return found
    with store._lock:
        taken, store._idle[:] = list(store._idle), []
    try:
        for resource in taken:
            conn = resource._session
            if conn is None or conn.closed:
                continue
            with conn.cursor() as cur:
                cur.execute("SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0) "
                            "FROM pg_prepared_statements")
                generic, custom = cur.fetchone()
                cur.execute("SELECT custom_plans, generic_plans, left(regexp_replace(statement, '\\s+', ' ', 'g'), 90) "
                            "FROM pg_prepared_statements WHERE custom_plans > 5")
                for row in cur.fetchall():
                    print("  re-planned at each EXECUTE:", *row)
            conn.rollback()
            found[0] += int(generic)
            found[1] += int(custom)
    finally:
        for resource in taken:
            store._release(resource)
    return [found[0], found[1]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("memory", "sqlite", "xa1", "xa2"), default="memory",
                        help="xa1: PostgreSQL stores under XA, each in its side's application database "
                             "(a throwaway server; the business row and the service's row written "
                             "through an XADataSource, as bench_compare's xa1); xa2: each store in a "
                             "database of its own (as bench_compare's xa2)")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--warm-up", type=int, default=10)
    parser.add_argument("--no-timeline", action="store_true")
    parser.add_argument("--idle-sequences", type=int, default=0)
    parser.add_argument("--policy", default="", metavar="KNOB=VALUE,...",
                        help="RMPolicy knobs on both sides, as bench_compare's variants (e.g. poll_interval=60: "
                             "count only what the calls do, under callgrind)")
    parser.add_argument("--pg-set", action="append", default=[], metavar="NAME=VALUE",
                        help="xa1: a PostgreSQL setting for both databases (ALTER DATABASE ... SET), "
                             "e.g. plan_cache_mode=force_generic_plan; repeatable")
    parser.add_argument("--pg-profile", action="store_true",
                        help="xa1: perf record the PostgreSQL server's processes through the calls and say "
                             "what its CPU went to (statements' run, plan set-up, protocol, commit...: "
                             "see pg_profile.py)")
    args = parser.parse_args(argv)
    if args.pg_profile:
        import pg_profile
        if args.store != "xa1" or not pg_profile.PerfRecording.available():
            parser.error("--pg-profile needs --store xa1 and perf (apt-get install linux-perf)")
    _instrument()

    import zeep

    import bench_compare as bc
    from interceptors.spyne_server.service import reliable_service
    from interceptors.zeep_client.client import reliable_client

    class _NoRows:
        def record(self, item: str, note: str) -> None:
            pass
    bc.ROWS = _NoRows()  # type: ignore[assignment]
    tmp = Path(tempfile.mkdtemp(prefix="call-path-"))
    closers: list[Any] = []
    pg: Any = None
    tms: dict[str, Any] = {}
    client_ds = None
    recording: Any = None
    profile: Any = None
    if args.store in ("xa1", "xa2"):
        from txmanager import TransactionManager
        from txmanager.postgres import XADataSource
        from wsrm_plugin.tools.pgserver import ThrowawayPostgres

        pg = ThrowawayPostgres().start()
        closers.append(pg.close)
        dsns = {role: pg.create_database(f"{role}_app") for role in ("service", "client")}
        bc._execute(dsns["service"], "CREATE TABLE received (item text NOT NULL, note text)")
        bc._execute(dsns["client"], "CREATE TABLE business (id bigserial PRIMARY KEY, item text NOT NULL)")
        for setting in args.pg_set:
            name, value = setting.split("=", 1)
            for role in dsns:
                bc._execute(pg.dsn("postgres"), f"ALTER DATABASE {role}_app SET {name} = '{value}'")
        for role in dsns:
            tms[role] = TransactionManager(node=f"call-path-{role}", log=tmp / f"{role}.tmlog")
            closers.insert(0, tms[role].close)
        service_ds = XADataSource(dsns["service"], tms["service"])
        client_ds = XADataSource(dsns["client"], tms["client"])
        closers[:0] = [service_ds.close, client_ds.close]
        bc.ROWS = bc._Rows(dsns["service"], ds=service_ds)
        urls = {role: "postgresql:" + (dsn if args.store == "xa1" else pg.create_database(f"{role}_store"))
                for role, dsn in dsns.items()}
    elif args.store == "memory":
        urls = {"service": "memory:", "client": "memory:"}
    else:
        urls = {role: f"sqlite:///{tmp}/{role}.db" for role in ("service", "client")}
    policy = bc._policy(0.2, f"{args.store}~{args.policy}")
    service = reliable_service(bc._application(), urls["service"], policy, name="service",
                               tm=tms.get("service"))
    _idle_sequences(service.engine.store, args.idle_sequences)
    service.serve(threads=4)
    service.start()
    rc = reliable_client(zeep.Client(service.url + "?wsdl"), urls["client"], policy, key="bench",
                         name="client", tm=tms.get("client"))

    def quote(item: str) -> None:
        """One call (under XA: the business row and the enqueue in one transaction), and its answer."""
        tm = tms.get("client")
        if tm is None:
            future = rc.service.quote(item, "x")
        else:
            with tm.transaction():
                with client_ds.connection() as conn, conn.cursor() as cur:
                    cur.execute("INSERT INTO business (item) VALUES (%s)", (item,))
                future = rc.service.quote(item, "x")
            _note("caller's transaction committed")
        future.result(timeout=30)
    try:
        for i in range(args.warm_up):
            quote(f"warm-{i}")
        time.sleep(0.2)
        timeline: list[tuple[float, str, str]] = []
        if pg is not None:
            pg_before, pg_cpu_before = bc._pg_counters(pg), sum(bc._pg_cpu(pg, reaped=True).values())
            if args.pg_profile:
                import pg_profile
                recording = pg_profile.PerfRecording(pg_profile.server_pids(pg.pid))
                recording.start()
                closers.insert(0, recording.close)
        cpu, started = time.process_time(), time.perf_counter()
        switches = _switches_by_thread()
        for i in range(args.calls):
            _recording.set()
            t0 = time.perf_counter()
            quote(f"call-{i}")
            if i == args.calls // 2:
                timeline = [(t0, "caller", "call starts"), *EVENTS[-200:], (time.perf_counter(), "caller", "answered")]
                timeline = [e for e in timeline if e[0] >= t0]
        time.sleep(0.2)  # what a call leaves to do after its answer is counted too
        _recording.clear()
        switches = _switches_by_thread() - switches
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        if pg is not None:
            pg_cpu = (sum(bc._pg_cpu(pg, reaped=True).values()) - pg_cpu_before) / os.sysconf("SC_CLK_TCK")
            if recording is not None:
                profile = recording.stop()
            pg_after = bc._pg_counters(pg)
        if pg is not None:
            plans = _plans(rc.engine.store) + _plans(service.engine.store)
    finally:
        rc.stop(timeout=5)
        service.stop(timeout=5)
        for close in closers:
            close()
    counts: collections.Counter[tuple[str, str]] = collections.Counter(
        (name.rsplit("-", 1)[0] if name.startswith("waitress") else name, _kind(what)) for _, name, what in EVENTS)
    print(f"{args.store} stores, {args.calls} sequential calls: {wall / args.calls * 1000:.2f} ms and "
          f"{cpu / args.calls * 1000:.2f} ms of CPU (client and service together) per call")
    print("per call, by thread:")
    for (thread, kind), n in sorted(counts.items()):
        print(f"  {thread:28} {kind:34} {n / args.calls:6.2f}")
    print("context switches per call, by thread: " + ", ".join(
        f"{name} {n / args.calls:.2f}" for name, n in sorted(switches.items()) if n)
          + f" (all {sum(switches.values()) / args.calls:.2f})")
    if args.store in ("xa1", "xa2"):  # PostgreSQL round trips and transactions ended, by side
        sides: collections.Counter[str] = collections.Counter()
        for (thread, kind), n in counts.items():
            if kind.startswith("pg "):
                side = "service" if thread.startswith(("service", "waitress")) else "client"
                sides[f"{side} round trips"] += n
                if thread == "MainThread":  # the caller's own thread: what a call waits for on its side
                    sides["caller's thread round trips"] += n
                if "+COMMIT" in kind or "+ROLLBACK" in kind:
                    sides[f"{side} commits"] += n
            elif kind.startswith("fused COMMIT"):  # (counted apart, as before: not in the round trips)
                side = "service" if thread.startswith(("service", "waitress")) else "client"
                sides[f"{side} fused COMMITs"] += n
                if thread == "MainThread":
                    sides["caller's thread fused COMMITs"] += n
        print("PostgreSQL per call: " + ", ".join(f"{k} {v / args.calls:.2f}" for k, v in sorted(sides.items())))
        print(f"PostgreSQL per call: WAL syncs {(pg_after['wal_sync'] - pg_before['wal_sync']) / args.calls:.2f}, "
              f"transactions {(pg_after['xact_commit'] - pg_before['xact_commit']) / args.calls:.2f}, "
              f"CPU {pg_cpu / args.calls * 1000:.2f} ms (the server's processes, ended backends included)")
        print(f"the stores' prepared statements on their idle sessions: {plans[0]} generic plans, "
              f"{plans[1]} custom plans (each custom one planned at its EXECUTE)")
        if profile is not None:
            import pg_profile
            print("\n".join(pg_profile.report(profile, pg_cpu / args.calls * 1000)))
    if not args.no_timeline and timeline:
        print("one call (ms from its start; the two sides share one interpreter):")
        t0 = timeline[0][0]
        for at, thread, what in timeline:
            print(f"  {(at - t0) * 1000:8.3f}  {thread[:28]:28} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
