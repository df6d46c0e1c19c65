"""Delivered-and-committed one-way calls per second, zeep -> spyne, against what a team writes by hand.

One run, interleaved rounds, every scenario from fresh processes and databases
on one throwaway PostgreSQL server.  The service of every scenario writes
each item it runs into its OWN PostgreSQL table (``received``); a message
counts once that row is committed, and the run is verified from that table
(every item exactly once; plain scenarios may only lose, never repeat).

Scenarios:

* ``plain``    - zeep calls the plain spyne service (waitress), one call at a time;
                 the method inserts its row (one local commit);
* ``plain8``   - the same from 8 client threads (the server's capacity: the ceiling
                 of any layer on top);
* ``plainN``   - the same from ``--clients`` threads (the baseline of N sequences at once);
* ``outbox``   - the hand-written transactional outbox: the client commits its
                 business row and an outbox row in one local transaction, a relay
                 thread sends the outbox with plain calls (and deletes what it sent);
                 the service inserts the message id into ``processed`` ON CONFLICT
                 DO NOTHING and, if new, its row, in one local transaction;
* ``memory``   - reliable_client -> reliable_service on ``memory:`` stores (the
                 method's row: one local commit, as in plain);
* ``sqlite``   - the same on SQLite stores;
* ``xa2``      - XA, store and application in different databases: the client's
                 business row (XADataSource) and the enqueue (PostgreSQL store) in
                 one global transaction; the server's dequeue and the method's row
                 in one; two-phase commit on both sides, the store's default way:
                 only the application's branch is prepared, the store's commits last
                 in one phase with the decision as a commit mark (txmanager.marks);
* ``xa2log``   - xa2 without commit marks (``store.commit_marks=0``): both branches
                 prepared, the decision written to the recovery log;
* ``xa1``      - the same with each side's store in its application's database:
                 one branch, committed in one phase.

Per message the run also reports the CPU time of the client, the server and
the PostgreSQL server (all its processes, from /proc; on a 2-core machine the
three share the cores, so their sum bounds the rate), fsync/fdatasync calls of the client and
server processes (counted with ``strace --seccomp-bpf`` in a separate first
round whose rates are not used, since a traced process runs slower: SQLite
and the recovery log), PostgreSQL WAL syncs and kB written (pg_stat_wal), PostgreSQL commits
(pg_stat_database.xact_commit, all databases) and the transaction managers'
prepared branches, two-phase decisions (logged, or committed as a commit mark)
and one-phase commits (their checkpoint hook, set in the counting round only, or in every round
with BENCH_TM_POINTS=1: it takes a manager off its fast path), and the caller's share: the time the client's
calling loop took over the whole time (near 1.00, the caller bounds the rate; well below it,
what comes after the call does: the relay, the sender, the service) and the share of the messages
in the service's table by then (``in at callers' end``, when some were still to come: well below
the caller share, the two sides took turns instead of working at once; memory at 16 sequences:
0.13-0.17 in after 0.31-0.34 of the time); and how busy the machine
was meanwhile (its CPUs' share not idle, from ``/proc/stat``: near 1.00 the run is bound by CPU,
well below by the wait of one part for another).  Ratios are against plain
(sequential and concurrent) and the outbox of the same round; the median of the rounds is reported.

Modes (issue 33: cost as the work grows); each picks its scenarios and aims unless ``--scenarios``:

* ``--clients 16``: 16 sequences at once, against plain calls from 16 threads (``plainN``) and
  the outbox with 16 relays;
* ``--latency``: sequential request-reply calls (``quote``: the same row, and an answer), each
  caller waiting for its answer; the calls' p50, p90, p99 and max against plain calls (the first
  ``LATENCY_WARM_UP`` calls of each thread, which open its sequence, are left out);
* ``--note 1048576``: 1 MiB per call; every scenario also reports the resident memory a message
  leaves behind in each process (``kB/msg kept``) and the peak over the start (``peak MB``).

``--clients N`` runs the outbox and the reliable scenarios from N calling threads: each reliable
one with a client of its own on one engine (``ReliableClient.with_key``: N sequences, which the
service delivers side by side), each outbox one with its own relay sending its own rows (so N
requests in flight there too).  plain
and plain8 stay one and eight threads.  A variant ``~clients=N`` sets it for one scenario, to
measure it beside the one-thread run in the same rounds (``--scenarios xa1,xa1~clients=4``).

Run::

    .venv/bin/python bench/bench_compare.py [--calls 1000] [--rounds 3]
        [--scenarios plain,plain8,outbox,memory,sqlite,xa2,xa2log,xa1] [--no-strace] [--clients 1]
        [--latency] [--note 64]

A scenario may name RMPolicy knobs for both sides after a ``~``, to measure a
variant beside its base in the same rounds:
``--scenarios xa1,xa1~delivery_batch=10,memory~send_concurrency=1``; a ``store.NAME`` knob
is an option of the store instead (``xa1~store.prepare_statements=false``), an ``env.NAME``
knob an environment variable of the scenario's processes (``xa1~env.TXMANAGER_LAZY_BEGIN=0``);
``~switch_interval=0.0005`` runs the service with that ``sys.setswitchinterval`` (Python's 0.005 s
otherwise: a thread back from I/O, such as the one holding a SQLite store's file after its
application's database commit, may wait that long for the interpreter while others compute).
``~server_threads=8`` serves the reliable service with 8 HTTP threads instead of the product's automatic
count (``ReliableEngine.http_threads``: 4, 16 under XA and SQLite delivering apart); the XA service's data source
keeps as many idle sessions.
Several knobs in one variant are joined with ``+`` (``sqlite~send_concurrency=2+receive_batch=4``).

``BENCH_PG_STATEMENTS=1`` loads ``pg_stat_statements`` and lists, at the end,
the statements PostgreSQL spent longest on (run one scenario to read them); a number above 1
lists that many; ``BENCH_PG_STATEMENTS=calls`` lists the 15 run most often instead, ``=wal`` the 15 that wrote most WAL
(``=calls:40``: 40 of them); it first gives every database's statements per message (all kinds); a
transaction's gid is folded (``PREPARE TRANSACTION '...'``), so each kind is one line.
``BENCH_LAPS=1`` gives each row of the tables an instant and prints, after each scenario, the lap
of one sequence's turn (between its consecutive rows in the service's table), the calling thread's
own lap, and each item's time from its business row to its service row (p50/p90).
``BENCH_FILE_HOLDERS=1`` splits a SQLite store's ``file held ms`` and ``file turns`` by the kind of thread that held
the file (its name without its number: the HTTP threads, the sender, the calling threads...).
``BENCH_THREAD_SWITCHES=1`` splits each process's ``switches`` by the kind of thread (its name
without its numbers) and by why: a wait (``KIND waits``: voluntary) or preempted (``KIND preempted``),
and its CPU (``KIND cpu ms``, in the kernel's ticks: a rough split).
``BENCH_WAITS=1`` counts each process's waits a message by where they wait: every
``threading.Condition.wait`` (``Event.wait`` too) by its caller, and a SQLite store's file taken
while another thread held it (``wait file gate``): the thread switches a design can remove.
``BENCH_SQLITE_STATEMENTS=1`` counts a SQLite store's statements a message (``sqlite statements``),
those run holding the file (``in hold``) and each kind apart (``stmt KIND``: the first word, and the table), for each role.
``BENCH_SQLITE_COMMITS=1`` counts a SQLite store's commits a message by the kind of thread that
committed (``commits KIND``), the WAL frames (pages) each kind's commits wrote (``frames KIND``), the
rows they changed and the statements they ran, how long their commits took (the fsync's wait included) and
the checkpoints.
``BENCH_PG_CPU=1`` lists, after each round, PostgreSQL's CPU per message by process: the
backends of each database (the client's side and the service's, their stores apart under xa2),
the background processes, and the postmaster with the backends that ended meanwhile (counted
through its reaped children, as the round's total is: the outbox's callers close their sessions
before the service has counted every row).
``BENCH_PG_SESSIONS=1`` turns on ``log_connections`` and ``log_disconnections`` and lists, after each
round, the sessions each side's databases opened and ended from the round's start, a message, and
the ended ones' median life (a session opened for a message's work costs PostgreSQL a backend's
start, about 6 ms of CPU with the store's statements prepared again).
``BENCH_PG_PROFILE=1`` records the backends of each side's databases with ``perf`` once a tenth
of the round's messages is in (``pg_profile.py``) and lists their CPU a message by what the server was doing;
``BENCH_PG_PROFILE_DUMP=DIR`` also keeps each recording's stacks (``perf script``) in ``DIR``.
``BENCH_PERF_STAT=1`` counts with ``perf stat``, from the round's start, what the client's and the
service's processes and each side's PostgreSQL backends did a message (a backend started later
is counted with the postmaster, in ``pg rest``): CPU,
thread switches, system calls (a backend's ``sendto`` calls are its round trips), ``futex`` and
``poll`` waits, flushes (``perf_stat.py``).
``BENCH_PG_WAITS=1`` samples ``pg_stat_activity`` every 2 ms through the rounds and lists, at the
end, what the active sessions were doing or waiting for (wait event, the statement's start), with
the lock holders' statements for lock waits: who waits on what (run one scenario to read them).
``BENCH_PG_COMMITS=1`` lists, after each round, its commits a message on each side: the transactions
each side's databases ended (``pg_stat_database``: read-only ones and statements run alone count),
those that wrote a commit record (``pg_waldump``: the ones a WAL flush may wait for, unless
committed with ``synchronous_commit`` off) and their WAL bytes each; the WAL's writes and syncs a
message (``pg_stat_wal``), the commit records one sync grouped and a sync's time
(``track_wal_io_timing``); ``BENCH_PG_COMMITS=tables`` also the commit records by the tables
whose rows their transactions wrote, and how (insert, hot_update, delete, lock...); and what each side's active sessions did, sampled every 2 ms (``IO:WALSync``:
flushing the WAL, ``LWLock:WALWrite``: waiting for another's flush, ``CPU``: running; the sampling
costs PostgreSQL some CPU of its own: leave it out where rates matter).
``BENCH_PG_WALDUMP=1`` reads each round's WAL with ``pg_waldump --stats=record`` and lists, per
message, the record types that wrote most (record bytes and full-page images apart);
``BENCH_PG_WALDUMP=rel`` also lists the heap and index records by relation (which table's rows
were inserted, updated in place (HOT) or not, locked).

Profiling: ``BENCH_PROFILE=DIR`` attaches ``py-spy record --idle --threads``
(raw collapsed stacks, waits included; ``BENCH_PROFILE_IDLE=0``: py-spy's on-CPU guess, which counts
lock waits; ``BENCH_PROFILE_IDLE=gil``: only the thread holding the GIL, the Python CPU) to every
client and server process and writes ``DIR/<scenario>-<tag>-<role>.txt``; ``BENCH_PROFILER=yappi`` writes
yappi CPU profiles of all threads (``.pstats``) from inside the processes instead (wall time, waits
included, with ``BENCH_PROFILE_CLOCK=wall``).
``BENCH_CALLGRIND=server,client`` runs those roles under ``valgrind --tool=callgrind`` (output in
``BENCH_CALLGRIND_DIR``, one file per process, start-up included: take the difference of two
``--calls``, and a long ``--timeout``).  Every scenario reports each process's context switches per
message (``switches``: voluntary and involuntary, all its threads, from ``getrusage``).  A reliable
client reports its sender's counts per message: its sending lanes' claims (``refill claims``) and the
messages they took (``refilled``; the rest came in its rounds' claims), the messages it sent, those
its callers sent themselves, and its retransmissions.  A service that delivers receives together
(``receive_together``) reports its batches a message (``batches(server)``: one over the mean batch;
under XA across two databases each batch is one PREPARE, one commit mark and one COMMIT PREPARED,
three WAL flushes, for all its messages).  A SQLite
store reports, per message, its commits and fsyncs (``sqlite commits``/``sqlite fsyncs``, its group
sync's own counts), its transactions' turns on the file (``file turns``) and the milliseconds its
writers waited for the file and held it (``file wait ms``, ``file held ms``), for each role.
Every service with a method of its own reports the wall time the method spent on its rows per message
(``app ms(server)``: the INSERT and its commit, summed over the threads; on SQLite, delivering
inside, all of it is spent holding the store's file), and what those sums say over the round's
wall time, load or not: the methods running at once on average (``app in flight(server)``,
Little's law: plain's threads run several, whose commits share a WAL flush; delivering inside
SQLite's file, at most one), and the share of the time each SQLite store's file was held
(``file held share``: near 1.00, the file bounds the rate), and the cores each process used
(``cores used``: its CPU over the round's wall time; one Python process runs its threads' Python
one at a time, so near 1.00 little more can come from it.  At 16 sequences plainN's client (zeep)
and memory's service each average 0.75-0.80; memory's service works mostly after its callers are
done, see ``in at callers' end``).  Every service counts, per message, the
requests that arrived with none of its HTTP threads idle (``queued(server)``: waitress's "Task
queue depth is N") and the depths they found summed (``queue depth(server)``): requests waiting
for a thread, not for the service's work.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TNS = "urn:wsrm-bench"
SCENARIOS = ("plain", "plain8", "plainN", "outbox", "memory", "sqlite", "xa2", "xa2log", "xa1")
#: the scenarios of plain calls (no layer at all: the floor), and the baselines ratios are taken against
PLAIN = ("plain", "plain8", "plainN")
BASES = ("plain", "plain8", "plainN", "outbox")
#: named variants
_ALIASES = {"xa2log": "xa2~store.commit_marks=false"}
THREADS = 8
#: variant knobs of this benchmark, not RMPolicy's: calling threads, the reliable service's HTTP threads
_BENCH_KNOBS = ("clients", "server_threads", "switch_interval")

#: (scenario, baseline, aim) from issue 12: one calling thread
AIMS = [("memory", "plain", 1.0), ("memory", "plain8", 0.7), ("sqlite", "plain", 0.8),
        ("xa1", "outbox", 0.9), ("xa2", "outbox", 0.6)]
#: issue 33, ``--clients N`` (16): N sequences against plain calls from N threads and the outbox
#: with N relays
AIMS_CLIENTS = [("memory", "plainN", 1.0), ("sqlite", "plainN", 0.8), ("xa1", "outbox", 0.95),
                ("xa2", "outbox", 0.7)]
#: issue 33, ``--latency``: (scenario, p50 at most this many times plain's p50); and every
#: scenario's p99 at most LATENCY_TAIL times its own p50
AIMS_LATENCY = [("memory", 1.5), ("sqlite", 2.5), ("xa1", 3.0)]
LATENCY_TAIL = 2.0
#: calls of each calling thread left out of the latency figures (the sequence's creation, zeep's first)
LATENCY_WARM_UP = 5
#: issue 33, ``--note 1048576``: every reliable path against plain calls with the same payload
AIMS_PAYLOAD = [("memory", "plain", 0.8), ("sqlite", "plain", 0.8), ("xa1", "plain", 0.8),
                ("xa2", "plain", 0.8)]


# -- the service (server process) ---------------------------------------------------------------

class _Rows:
    """The service's own table: local commits on a connection per thread, or the XA data source."""

    def __init__(self, dsn: str, ds: Any = None, outbox: bool = False) -> None:
        self.dsn = dsn
        self.ds = ds
        self.outbox = outbox
        self._local = threading.local()
        #: wall seconds the method spent on its rows (statements, commit), summed over its threads:
        #: on SQLite, delivering inside, all of it is spent holding the service's store file
        self.seconds = 0.0

    def _conn(self) -> Any:
        import psycopg2

        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._local.conn = psycopg2.connect(self.dsn)
        return conn

    def record(self, item: str, note: str) -> None:
        started = time.perf_counter()
        try:
            self._record(item, note)
        finally:
            self.seconds += time.perf_counter() - started  # a race loses a sample at most

    def _record(self, item: str, note: str) -> None:
        if self.ds is not None:  # in the delivery's global transaction
            with self.ds.connection() as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO received (item, note) VALUES (%s, %s)", (item, note))
            return
        conn = self._conn()
        with conn, conn.cursor() as cur:
            if self.outbox:  # the message id doubles as the item: each is unique
                cur.execute("INSERT INTO processed (id) VALUES (%s) ON CONFLICT DO NOTHING", (item,))
                if cur.rowcount == 0:
                    return  # a duplicate: done before
            cur.execute("INSERT INTO received (item, note) VALUES (%s, %s)", (item, note))


ROWS: _Rows | None = None


def _application() -> Any:
    from spyne import Application, ServiceBase, Unicode, rpc
    from spyne.protocol.soap import Soap11

    class BenchService(ServiceBase):
        @rpc(Unicode, Unicode, _is_async=True)
        def record(ctx, item, note):  # noqa: N805 -- spyne's signature
            assert ROWS is not None
            ROWS.record(item, note)

        @rpc(Unicode, Unicode, _returns=Unicode)
        def quote(ctx, item, note):  # noqa: N805 -- the request-reply call of --latency
            assert ROWS is not None
            ROWS.record(item, note)
            return item

    return Application([BenchService], tns=TNS, name="BenchService",
                       in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())


def _variant(scenario: str) -> tuple[str, dict[str, Any]]:
    """``"xa1~delivery_batch=10"``: scenario xa1, with that RMPolicy knob on both sides
    (a variant measured beside its base in the same rounds)."""
    if scenario.partition("~")[0] in _ALIASES:
        name, _, more = scenario.partition("~")
        scenario = _ALIASES[name] + ("," + more if more else "")
    base, _, knobs = scenario.partition("~")
    overrides: dict[str, Any] = {}
    for knob in filter(None, knobs.replace("+", ",").split(",")):
        name, _, value = knob.partition("=")
        overrides[name] = json.loads(value.lower()) if value.lower() in ("true", "false") else json.loads(value)
    return base, overrides


def _policy(retransmission_interval: float, scenario: str = "") -> Any:
    from wsrm_plugin.engine import RMPolicy

    knobs = {k: v for k, v in _variant(scenario)[1].items()
             if not k.startswith(("store.", "env.")) and k not in _BENCH_KNOBS}
    return RMPolicy(**{"soap_version": "1.1", "base_retransmission_interval": retransmission_interval, **knobs})


def _store(url: str, scenario: str) -> Any:
    """The store URL, or the store opened with the variant's ``store.NAME=value`` options."""
    options = {k.removeprefix("store."): v for k, v in _variant(scenario)[1].items() if k.startswith("store.")}
    if not options:
        return url
    from wsrm_plugin.store import open_store

    return open_store(url, **options)


class _Points:
    """The transaction manager's checkpoint hook, as counters."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, point: str, index: int) -> None:
        with self._lock:
            self.seen[point] += 1


#: the transaction manager's own counters (prepared, decided, one-phase): its checkpoint hook, which
#: is a crash-test hook and takes the manager off its fast one-phase path (1,359 bytecodes a
#: transaction against 610), so it is set only in the counting round (``--tm-points``) or with
#: BENCH_TM_POINTS=1: the measured rounds run the path a user runs.
_TM_POINTS = "prepared", "before_log", "before_commit_one_phase"


def _tm(node: str, tmp: Path, points: _Points, counted: bool) -> Any:
    from txmanager import TransactionManager

    return TransactionManager(node=node, log=tmp / f"{node}.tmlog", checkpoint=points if counted else None)


_CPU_AT_START = 0.0


def _cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _start_clock() -> None:
    """The measured part starts: the coordinator's T0, and this process's CPU time so far."""
    global _CPU_AT_START, _RSS_AT_START, _SWITCHES_AT_START, _BY_KIND_AT_START
    _CPU_AT_START = _cpu()
    _RSS_AT_START = _rss_kb()
    _SWITCHES_AT_START = _switches()
    _BY_KIND_AT_START = _switches_by_kind()
    print(f"T0 {time.monotonic()}", flush=True)


def _cpu_ms() -> int:
    """CPU time (user + system, all threads) of this process since the measured part started:
    a cost per message that a loaded machine distorts far less than the rates."""
    return round((_cpu() - _CPU_AT_START) * 1000)


_RSS_AT_START = 0
_SWITCHES_AT_START = 0


def _switches() -> int:
    """Context switches of this process so far, every thread, voluntary (a wait) or not (preempted)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def _thread_kind(name: str) -> str:
    """A thread's kind: its name without its numbers (the HTTP threads, the sender, the callers...)."""
    return "".join(c for c in name if not c.isdigit()).strip("-_ ").replace(" ", "") or "?"


def _switches_by_kind() -> Counter[str]:
    """``BENCH_THREAD_SWITCHES=1``: the context switches so far of each live thread of this
    process, voluntary (a wait: ``KIND waits``) and not (preempted: ``KIND preempted``), summed
    by the kind of thread (/proc/self/task/TID/status)."""
    out: Counter[str] = Counter()
    if not os.environ.get("BENCH_THREAD_SWITCHES"):
        return out
    for thread in threading.enumerate():
        try:
            with open(f"/proc/self/task/{thread.native_id}/status", encoding="ascii") as f:
                fields = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
        except OSError:  # ended meanwhile
            continue
        kind = _thread_kind(thread.name)
        out[f"{kind} waits"] += int(fields["voluntary_ctxt_switches"])
        out[f"{kind} preempted"] += int(fields["nonvoluntary_ctxt_switches"])
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat", encoding="ascii") as f:
                ticks = f.read().rsplit(")", 1)[1].split()[11:13]  # utime, stime
        except OSError:
            continue
        out[f"{kind} cpu ms"] += (int(ticks[0]) + int(ticks[1])) * 1000 // os.sysconf("SC_CLK_TCK")
    return out


_BY_KIND_AT_START: Counter[str] = Counter()


def _switches_by_kind_since_start(role: str) -> dict[str, int]:
    """What :func:`_switches_by_kind` counted since the measured part started, as ``count:``
    entries (per message once reported); the threads that ended meanwhile are in the process's
    ``switches`` alone."""
    now = _switches_by_kind()
    return {f"count:switches {kind}({role})": now[kind] - _BY_KIND_AT_START.get(kind, 0) for kind in now}


def _rss_kb() -> int:
    """This process's resident memory now, in kB (/proc)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _memory() -> dict[str, int]:
    """Resident memory: at the start of the measured part, now, and the peak of the process's life
    (kB).  Their difference over the messages is the memory a message leaves behind; the peak over
    the start, what the largest moment of the run held (with large payloads: how many copies)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"rss_start_kb": _RSS_AT_START, "rss_end_kb": _rss_kb(), "rss_peak_kb": int(usage.ru_maxrss),
            "switches": usage.ru_nvcsw + usage.ru_nivcsw - _SWITCHES_AT_START}


def _yappi_start() -> Any:
    """CPU profile of every thread of this role, when BENCH_PROFILER=yappi asks for it (wall
    time, waits included, with ``BENCH_PROFILE_CLOCK=wall``)."""
    if not os.environ.get("BENCH_PROFILE") or os.environ.get("BENCH_PROFILER") != "yappi":
        return None
    import yappi

    yappi.set_clock_type(os.environ.get("BENCH_PROFILE_CLOCK", "cpu"))
    yappi.start(builtins=False)
    return yappi


def _yappi_save(yappi: Any, args: argparse.Namespace) -> None:
    if yappi is None:
        return
    yappi.stop()
    out = Path(os.environ["BENCH_PROFILE"]) / f"{args.scenario}-{args.run or 'server'}-{args.role}-{os.getpid()}.pstats"
    yappi.get_func_stats().save(str(out), type="pstat")


class _Queued(logging.Handler):
    """Counts waitress's "Task queue depth is N" (a request arrived with no HTTP thread idle; N
    requests then wait for one): how often, and their depths summed."""

    def __init__(self) -> None:
        super().__init__()
        self.times = 0
        self.depth = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.times += 1
        self.depth += int(record.args[0]) if isinstance(record.args, tuple) and record.args else 0

    @classmethod
    def install(cls) -> "_Queued":
        queued = cls()
        logger = logging.getLogger("waitress.queue")
        logger.setLevel(logging.WARNING)
        logger.propagate = False  # counted, not printed
        logger.addHandler(queued)
        return queued


def server_role(args: argparse.Namespace) -> int:
    global ROWS, _CPU_AT_START, _RSS_AT_START, _SWITCHES_AT_START, _BY_KIND_AT_START
    yappi = _yappi_start()
    queued = _Queued.install()
    from wsrm_plugin.engine.transport import HttpServer

    interval = _variant(args.scenario)[1].get("switch_interval")  # ~switch_interval=0.0005
    if interval is not None:
        sys.setswitchinterval(float(interval))

    tmp = Path(tempfile.mkdtemp(prefix="bench-server-", dir=os.environ.get("BENCH_WORKDIR")))
    points = _Points()
    closers: list[Any] = []
    scenario = _variant(args.scenario)[0]
    if scenario in (*PLAIN, "outbox"):
        from spyne.server.wsgi import WsgiApplication

        from interceptors.wsdl import drop_undefined_header_messages

        ROWS = _Rows(args.app_dsn, outbox=scenario == "outbox")
        wsgi = WsgiApplication(_application())
        wsgi.doc.wsdl11.event_manager.add_listener(
            "wsdl_document_built", lambda document: drop_undefined_header_messages(document.root_elt))
        server = HttpServer(wsgi, threads=THREADS).start()
        closers.append(server.stop)
        url = server.url
    else:
        from interceptors.spyne_server.service import reliable_service

        tm = None
        if scenario == "memory":
            store = "memory:"
            ROWS = _Rows(args.app_dsn)
        elif scenario == "sqlite":
            store = f"sqlite:///{tmp}/server.db"
            ROWS = _Rows(args.app_dsn)
        else:
            from txmanager.postgres import XADataSource

            tm = _tm("bench-server", tmp, points, args.tm_points)
            # idle sessions kept for every HTTP thread, as the client's data source keeps one per caller
            ds = XADataSource(args.app_dsn, tm, pool_size=max(8, int(_variant(args.scenario)[1].get(
                "server_threads", 16))))
            closers.append(ds.close)
            ROWS = _Rows(args.app_dsn, ds=ds)
            store = f"postgresql:{args.store_dsn}"
        service = reliable_service(_application(), _store(store, args.scenario),
                                   _policy(args.retransmission_interval, args.scenario),
                                   tm=tm)
        threads = _variant(args.scenario)[1].get("server_threads")  # None: the product's automatic count
        service.serve(threads=None if threads is None else int(threads))
        _count_holders(service.engine.store, "server", points)
        _count_statements(service.engine.store, "server", points)
        _count_commits(service.engine.store, "server", points)
        _count_waits(service.engine.store, "server", points)
        _count_hold_phases(service.engine.store, "server", points)
        service.start()
        closers.insert(0, lambda: service.stop(timeout=5))
        if tm is not None:
            closers.append(tm.close)
        url = service.url
    _CPU_AT_START = _cpu()
    _RSS_AT_START = _rss_kb()
    _SWITCHES_AT_START = _switches()
    _BY_KIND_AT_START = _switches_by_kind()
    print(f"URL {url}", flush=True)
    sys.stdin.readline()  # "stop"
    points.seen.update(_switches_by_kind_since_start("server"))
    for close in closers:
        close()
    _yappi_save(yappi, args)
    if scenario not in (*PLAIN, "outbox"):  # messages delivered in their receive's transaction
        points.seen["on_receipt"] = service.engine.destination.delivered_on_receipt
        points.seen["count:before receipt(server)"] = getattr(service.engine.destination, "delivered_before_receipt", 0)
        points.seen["count:guessed in memory(server)"] = getattr(service.engine.destination, "foreseen_in_memory", 0)
        points.seen["count:at commit(server)"] = getattr(service.engine.destination, "receipts_at_commit", 0)
        together = getattr(service.engine.destination, "_together", None)
        if together is not None:  # receives delivered together: batches a message (1 / the mean batch)
            points.seen["count:batches(server)"] = together.batches
        points.seen.update(_sqlite_counts(service.engine.store, "server"))
    if ROWS is not None:
        points.seen["count:app ms(server)"] = 1000 * ROWS.seconds
    points.seen["count:queued(server)"] = queued.times
    points.seen["count:queue depth(server)"] = queued.depth
    print("STATS " + json.dumps({**points.seen, "cpu_ms": _cpu_ms(), **_memory()}), flush=True)
    return 0


# -- the client process ---------------------------------------------------------------------------

def _items(args: argparse.Namespace) -> list[str]:
    return [f"{args.run}-{i:06d}" for i in range(args.calls)]


def client_role(args: argparse.Namespace) -> int:
    import zeep

    yappi = _yappi_start()
    args.clients = int(_variant(args.scenario)[1].get("clients", args.clients))  # ~clients=N
    if args.clients < 1:
        raise SystemExit("clients must be at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="bench-client-", dir=os.environ.get("BENCH_WORKDIR")))
    points = _Points()
    scenario = _variant(args.scenario)[0]
    items = _items(args)
    note = "x" * args.note
    zc = zeep.Client(args.url + "?wsdl")
    stoppers: list[Any] = []
    errors = 0
    #: --latency: each request-reply call's wall time (seconds), by calling thread
    latencies: list[list[float]] = [[] for _ in range(max(args.clients, THREADS))]
    if scenario in PLAIN:
        threads = {"plain": 1, "plain8": THREADS, "plainN": args.clients}[scenario]
        clients = [zc, *(zeep.Client(args.url + "?wsdl") for _ in range(1, threads))]
        failed = Counter()

        def worker(n: int) -> None:
            service = clients[n].service
            for item in items[n::threads]:
                started = time.perf_counter()
                try:
                    if args.latency:
                        service.quote(item, note)
                    else:
                        service.record(item, note)
                except Exception:  # noqa: BLE001 -- plain may lose a call
                    failed[n] += 1
                    continue
                latencies[n].append(time.perf_counter() - started)

        _start_clock()
        _in_threads(worker, threads)
        errors = sum(failed.values())
    elif scenario == "outbox":
        if args.latency:
            raise SystemExit("the outbox has no request-reply call: leave it out of --latency")
        errors = _outbox_client(args, zc, items, note, stoppers)
    else:
        from interceptors.zeep_client.client import reliable_client

        tm = ds = None
        if scenario == "memory":
            store = "memory:"
        elif scenario == "sqlite":
            store = f"sqlite:///{tmp}/client.db"
        else:
            from txmanager.postgres import XADataSource

            tm = _tm("bench-client", tmp, points, args.tm_points)
            ds = XADataSource(args.app_dsn, tm, pool_size=max(8, args.clients))
            store = f"postgresql:{args.store_dsn}"
        if os.environ.get("BENCH_COUNT_READS"):
            _count_reads(points)
        # a client (so a sequence) per calling thread, all on one engine (ReliableClient.with_key)
        keys = ["bench", *(f"bench{n}" for n in range(1, args.clients))]
        first = reliable_client(zc, _store(store, args.scenario),
                                _policy(args.retransmission_interval, args.scenario), tm=tm,
                                key=keys[0], active_keys=keys)
        rcs = [first, *(first.with_key(key) for key in keys[1:])]
        _count_holders(first.engine.store, "client", points)
        _count_statements(first.engine.store, "client", points)
        _count_commits(first.engine.store, "client", points)
        _count_waits(first.engine.store, "client", points)
        stoppers.append(lambda: first.stop(timeout=5))  # and the clients made from it
        if ds is not None:
            stoppers.append(ds.close)
        if tm is not None:
            stoppers.append(tm.close)

        def call(rc: Any, item: str) -> Any:
            """One call: the business row and the enqueue in one transaction under XA."""
            operation = rc.service.quote if args.latency else rc.service.record
            if tm is None:
                return operation(item, note)
            with tm.transaction():
                with ds.connection() as conn, conn.cursor() as cur:
                    cur.execute("INSERT INTO business (item) VALUES (%s)", (item,))
                return operation(item, note)

        def calls(n: int) -> None:
            rc = rcs[n]
            for item in items[n::args.clients]:
                started = time.perf_counter()
                answer = call(rc, item)
                if args.latency:  # the caller waits for the reply
                    answer.result(timeout=args.timeout)
                    latencies[n].append(time.perf_counter() - started)

        _start_clock()
        _in_threads(calls, args.clients)
    if args.latency:
        # each thread's first calls open its sequence (and warm zeep): not the steady state
        print("LAT " + json.dumps([d for per_thread in latencies for d in per_thread[LATENCY_WARM_UP:]]),
              flush=True)
    print(f"LOOP {time.monotonic()}", flush=True)  # the calls are made (a relay may still be sending)
    print(f"SENT {errors}", flush=True)
    sys.stdin.readline()  # "stop": everything arrived (or the coordinator gave up)
    points.seen.update(_switches_by_kind_since_start("client"))
    for stop in stoppers:
        stop()
    _yappi_save(yappi, args)
    if scenario not in PLAIN and scenario != "outbox":
        points.seen.update(_sqlite_counts(first.engine.store, "client"))
        points.seen.update(_sender_counts(first.engine.retransmission))
    print("STATS " + json.dumps({**points.seen, "cpu_ms": _cpu_ms(), **_memory()}), flush=True)
    return 0


def _count_holders(store: Any, role: str, points: _Points) -> None:
    """``BENCH_FILE_HOLDERS=1``: the milliseconds each kind of thread held the SQLite store's
    file (its name without its number: the HTTP threads, the sender, the callers...), as
    ``count:`` entries per message (monkeypatched: a measuring tool only)."""
    gate = getattr(store, "_gate", None)
    if gate is None or not os.environ.get("BENCH_FILE_HOLDERS"):
        return
    release = gate.release

    def counted_release() -> None:
        who = "".join(c for c in gate.holder or "?" if not c.isdigit()).strip("-_ ").replace(" ", "")
        held = time.monotonic() - gate._since
        release()
        with points._lock:
            points.seen[f"count:held ms {who}({role})"] += 1000 * held
            points.seen[f"count:turns {who}({role})"] += 1
    gate.release = counted_release


def _count_hold_phases(store: Any, role: str, points: _Points) -> None:
    """``BENCH_HOLD_PHASES=1``: what a SQLite store's file holds are made of, per message (all
    its holders'): their wall time and the holding thread's CPU time in them (``hold ms``,
    ``hold cpu ms``: the rest it waited, for I/O or for the interpreter), the holding thread's
    switches in them (``hold waits``: each a wait, for I/O or the interpreter; ``hold
    preempted``), the file's idle time between two holds (``hold gap ms``: under 50 ms each) and
    how much of it passed before the next holder asked for it (``hold gap unasked ms``), and the deliveries' hand-overs (spyne, the method and its rows: ``hand-over
    ms``, ``hand-over cpu ms``; delivering inside, all of them within the holds).
    ``BENCH_HOLD_PHASES=calls`` also counts the Python calls made holding the file (``hold
    calls``) and, delivering inside, those of the hand-overs among them (``hand-over calls``):
    ``sys.setprofile`` in the holding thread, so the times are no use then.  Monkeypatched: a
    measuring tool only."""
    gate = getattr(store, "_gate", None)
    mode = os.environ.get("BENCH_HOLD_PHASES")
    if gate is None or not mode:
        return
    from wsrm_plugin.engine import invoker as invoker_module

    acquire, release = gate.acquire, gate.release
    local = threading.local()
    calls = [0]

    def count_call(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            calls[0] += 1

    def thread_switches() -> tuple[int, int]:
        with open("/proc/thread-self/status", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
        return int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"])

    released = [0.0]  # when the file was last given back

    def counted_acquire(deadline: float, what: str) -> None:
        asked = time.monotonic()
        acquire(deadline, what)
        gap = gate._since - released[0]
        if released[0] and gap < 0.05:  # the file idle between two holds (not a pause of the run)
            with points._lock:
                points.seen[f"count:hold gap ms({role})"] += 1000 * gap
                points.seen[f"count:hold gap unasked ms({role})"] += 1000 * max(0.0, min(gap, asked - released[0]))
        local.switches = thread_switches()
        local.cpu = time.thread_time()
        if mode == "calls":
            sys.setprofile(count_call)

    def counted_release() -> None:
        if mode == "calls":
            sys.setprofile(None)
        cpu = time.thread_time() - getattr(local, "cpu", time.thread_time())
        held = time.monotonic() - gate._since
        waits, preempted = thread_switches()
        release()
        released[0] = time.monotonic()
        with points._lock:
            points.seen[f"count:hold waits({role})"] += waits - local.switches[0]
            points.seen[f"count:hold preempted({role})"] += preempted - local.switches[1]
            points.seen[f"count:hold ms({role})"] += 1000 * held
            points.seen[f"count:hold cpu ms({role})"] += 1000 * cpu
            points.seen[f"count:hold calls({role})"] = calls[0]
    gate.acquire, gate.release = counted_acquire, counted_release

    hand_over = invoker_module.InvokerWorker._hand_over

    def counted_hand_over(self: Any, tx: Any, msg: Any, context: Any) -> None:
        wall, cpu, before = time.monotonic(), time.thread_time(), calls[0]
        try:
            hand_over(self, tx, msg, context)
        finally:
            with points._lock:
                points.seen[f"count:hand-over calls({role})"] += calls[0] - before
                points.seen[f"count:hand-over ms({role})"] += 1000 * (time.monotonic() - wall)
                points.seen[f"count:hand-over cpu ms({role})"] += 1000 * (time.thread_time() - cpu)
    invoker_module.InvokerWorker._hand_over = counted_hand_over  # type: ignore[method-assign]


def _count_waits(store: Any, role: str, points: _Points) -> None:
    """``BENCH_WAITS=1``: the waits of this process's threads that each cost a thread switch
    (or two: the wait, and the wake of whoever waits), by where they wait, per message: every
    ``threading.Condition.wait`` (so ``Event.wait`` too) by its caller outside ``threading``
    (``wait FILE:LINE FUNCTION``), and a SQLite store's file taken while another thread of the
    process held it (``wait file gate``); monkeypatched: a measuring tool only."""
    if not os.environ.get("BENCH_WAITS"):
        return
    wait = threading.Condition.wait

    def counted_wait(self: Any, timeout: float | None = None) -> bool:
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename == threading.__file__:
            frame = frame.f_back
        where = "?" if frame is None else \
            f"{'/'.join(frame.f_code.co_filename.rsplit('/', 2)[-2:])}:{frame.f_lineno} {frame.f_code.co_name}"
        with points._lock:
            points.seen[f"count:wait {where}({role})"] += 1
        return wait(self, timeout)
    threading.Condition.wait = counted_wait  # type: ignore[method-assign]
    gate = getattr(store, "_gate", None)
    if gate is None:
        return
    lock = gate._thread_lock

    class _Counted:
        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if lock.acquire(False):
                return True
            with points._lock:
                points.seen[f"count:wait file gate({role})"] += 1
            return lock.acquire(blocking, timeout)

        def release(self) -> None:
            lock.release()

        def locked(self) -> bool:
            return lock.locked()
    gate._thread_lock = _Counted()


def _count_statements(store: Any, role: str, points: _Points) -> None:
    """``BENCH_SQLITE_STATEMENTS=1``: the statements a SQLite store's connections ran (its pooled
    writers' and its readers', from SQLite's trace callback), per message, in all
    (``sqlite statements``), those run while the running thread held the store's file
    (``in hold``), and by kind (``stmt KIND``: the first word, and the table of an INSERT,
    UPDATE, DELETE or SELECT, as ``count:`` entries; monkeypatched: a measuring tool only).  Each
    statement is a step of SQLite's during which Python's ``sqlite3`` lets go of the
    interpreter: inside the hold, a wait for it when another thread computes."""
    gate = getattr(store, "_gate", None)
    if gate is None or not os.environ.get("BENCH_SQLITE_STATEMENTS"):
        return
    connect = store._connect

    def traced(sql: str) -> None:
        words = sql.split(None, 4)
        kind = words[0].upper() if words else "?"
        if kind in ("INSERT", "UPDATE", "DELETE") and len(words) > 2:
            kind += " " + (words[1] if kind == "UPDATE" else words[2])
        elif kind == "SELECT":
            source = sql.upper().partition(" FROM ")[2].split(None, 1)
            kind += " " + (source[0].lower() if source else "-")
        held = gate.holder is not None and gate.holder == threading.current_thread().name
        with points._lock:
            points.seen[f"count:sqlite statements({role})"] += 1
            points.seen[f"count:stmt {kind}({role})"] += 1
            if held:
                points.seen[f"count:sqlite statements in hold({role})"] += 1

    def counted_connect() -> Any:
        conn = connect()
        conn.set_trace_callback(traced)
        return conn
    store._connect = counted_connect


def _count_commits(store: Any, role: str, points: _Points) -> None:
    """``BENCH_SQLITE_COMMITS=1``: a SQLite store's commits by the kind of thread that committed
    (its name without its numbers), each kind's WAL frames (pages written: SQLite writes a page
    into the WAL once for every commit that changed it), rows changed and statements, and the
    WAL's restarts after a checkpoint, per message (``commits KIND``, ``frames KIND``, ``rows
    KIND``, ``stmts KIND``, ``wal restarts``), the milliseconds each kind's commits took, their
    wait for the fsync included (``commit ms KIND``), and the commits that ran a checkpoint and
    their milliseconds (``checkpoints``, ``checkpoint commit ms``).  The frames are read from the
    WAL index's header (``mxFrame``, in the mapped ``-shm`` file; ``nBackfill`` after it for the
    checkpoints) before each transaction and after its commit, under the file.
    Monkeypatched: a measuring tool only."""
    gate = getattr(store, "_gate", None)
    if gate is None or not os.environ.get("BENCH_SQLITE_COMMITS"):
        return
    import mmap
    import struct

    shm: list[Any] = []

    def frames() -> int:
        if not shm:
            try:
                with open(store.path + "-shm", "rb") as f:
                    shm.append(mmap.mmap(f.fileno(), 100, access=mmap.ACCESS_READ))
            except (OSError, ValueError):
                return 0
        return struct.unpack_from("=I", shm[0], 16)[0]

    def backfilled() -> int:
        """The WAL's frames copied into the database so far (``nBackfill``, after the header's two copies)."""
        return struct.unpack_from("=I", shm[0], 96)[0] if shm else 0

    take, finish, release = store._take, store._finish, gate.release
    stmts = threading.local()

    def traced(sql: str) -> None:
        stmts.n = getattr(stmts, "n", 0) + 1

    def counted_take() -> Any:
        conn = take()
        conn.set_trace_callback(traced)
        stmts.n = 0
        stmts.before = frames()
        stmts.changes = conn.total_changes
        return conn

    def counted_release() -> None:
        """The frames after the COMMIT (and whether it checkpointed), read by the holder before
        it lets the file go (set once: a holder's release must not be patched per commit, or
        one thread's restore undoes another's)."""
        stmts.after = (frames(), backfilled())
        release()

    def counted_finish(tx: Any, commit: bool) -> None:
        conn = tx.conn
        if conn is None or not commit:
            return finish(tx, commit)
        changes = conn.total_changes - getattr(stmts, "changes", conn.total_changes)
        n = getattr(stmts, "n", 0)
        before = getattr(stmts, "before", 0)
        stmts.after = None
        started, filled = time.perf_counter(), backfilled()
        finish(tx, commit)
        took = time.perf_counter() - started
        after = stmts.after
        who = "".join(c for c in threading.current_thread().name if not c.isdigit()).strip("-_ ").replace(" ", "")
        written = 0 if after is None else after[0] - before if after[0] >= before else after[0]
        with points._lock:
            points.seen[f"count:commits {who}({role})"] += 1
            points.seen[f"count:frames {who}({role})"] += written
            points.seen[f"count:rows {who}({role})"] += changes
            points.seen[f"count:stmts {who}({role})"] += n + 1
            points.seen[f"count:commit ms {who}({role})"] += 1000 * took
            if after is not None and after[0] < before:
                points.seen[f"count:wal restarts({role})"] += 1
            if after is not None and after[1] != filled:
                points.seen[f"count:checkpoints({role})"] += 1
                points.seen[f"count:checkpoint commit ms({role})"] += 1000 * took
    store._take = counted_take
    store._finish = counted_finish
    gate.release = counted_release


def _sqlite_counts(store: Any, role: str) -> dict[str, float]:
    """A SQLite store's commits, fsyncs (its group sync's), turns on the file, and the
    milliseconds its writers waited for the file and held it (reported per message)."""
    sync, gate = getattr(store, "_sync", None), getattr(store, "_gate", None)
    if sync is None or gate is None:
        return {}
    return {f"count:sqlite commits({role})": sync.commits, f"count:sqlite fsyncs({role})": sync.syncs,
            f"count:file turns({role})": gate.turns, f"count:file wait ms({role})": 1000 * gate.waited,
            f"count:file held ms({role})": 1000 * gate.held}


def _sender_counts(sender: Any) -> dict[str, float]:
    """The client's sender, per message: its sending lanes' refill claims and the messages they
    claimed, the messages it sent and those its callers sent themselves, and retransmissions."""
    return {f"count:{name.replace('_', ' ')}(client)": getattr(sender, name, 0)
            for name in ("refill_claims", "refilled", "messages_sent", "sent_by_callers", "callers_paced",
                         "retransmissions", "lane_rounds", "lanes", "lane_busy_ms", "lane_slot_ms",
                         "lane_ends_untaken", "lane_ends_alone", "lane_ends_closed", "lane_ends_empty")}


def _count_reads(points: _Points) -> None:
    """``BENCH_COUNT_READS=1``: count, in the client, the payloads its store reads back (COPY
    out of large ones), and the POSTs of application messages by the thread that sends them
    (the caller's, or the sender's), as ``count:`` entries per message (monkeypatched: a
    measuring tool only)."""
    from wsrm_plugin.engine import http_client
    from wsrm_plugin.store.sql import transaction

    copy_out = transaction.SqlTransaction.copy_out_payloads

    def counted_copy_out(self: Any, table: str, keys: str, wanted: Any) -> Any:
        found = copy_out(self, table, keys, wanted)
        who = threading.current_thread().name.rsplit("-", 1)[-1]
        if os.environ.get("BENCH_COUNT_READS") == "where":
            import traceback
            who += ":" + "/".join(f.name for f in traceback.extract_stack(limit=12)[:-2]
                                  if "wsrm_plugin" in f.filename)
        with points._lock:
            points.seen[f"count:payloads read({who})"] += len(found)
            points.seen["count:payload MB read"] += sum(len(v) for v in found.values()) / 1e6
        return found
    transaction.SqlTransaction.copy_out_payloads = counted_copy_out  # type: ignore[method-assign]
    post = http_client.HttpConnection.post

    def counted_post(self: Any, path: str, headers: dict[str, str], body: bytes, limit: int) -> Any:
        if len(body) > 65536:
            who = threading.current_thread().name.rsplit("-", 1)[-1]
            points(f"count:large POSTs({who})", 0)
        return post(self, path, headers, body, limit)
    http_client.HttpConnection.post = counted_post  # type: ignore[method-assign]


def _in_threads(work: Any, threads: int) -> None:
    """``work(n)`` for n in range(threads): in this thread when there is one, else in threads."""
    if threads == 1:
        work(0)
        return
    failed: list[BaseException] = []

    def run(n: int) -> None:
        try:
            work(n)
        except BaseException as exc:  # noqa: BLE001 -- raised below, in the caller
            failed.append(exc)

    pool = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if failed:
        raise failed[0]


def _outbox_client(args: argparse.Namespace, zc: Any, items: list[str], note: str,
                   stoppers: list[Any]) -> int:
    """Business row + outbox row in one local transaction; a relay sends the outbox with plain calls.

    With ``--clients N``: N calling threads, each with its own relay (and zeep client) sending its
    own rows (the outbox's ``lane``), so N requests are in flight as with N reliable clients."""
    import psycopg2
    import zeep

    stop = threading.Event()
    wakes = [threading.Event() for _ in range(args.clients)]
    errors = Counter()

    zcs = [zc, *(zeep.Client(args.url + "?wsdl") for _ in range(1, args.clients))]
    relay_conns = [psycopg2.connect(args.app_dsn) for _ in range(args.clients)]
    call_conns = [psycopg2.connect(args.app_dsn) for _ in range(args.clients)]

    def relay(lane: int) -> None:
        zc, wake, conn = zcs[lane], wakes[lane], relay_conns[lane]
        try:
            while not stop.is_set():
                with conn, conn.cursor() as cur:
                    cur.execute("SELECT id, item, note FROM outbox WHERE lane = %s ORDER BY id LIMIT 100",
                                (lane,))
                    batch = cur.fetchall()
                if not batch:
                    wake.wait(0.01)
                    wake.clear()
                    continue
                sent = []
                for row_id, item, row_note in batch:
                    try:
                        zc.service.record(item, row_note)
                        sent.append(row_id)
                    except Exception:  # noqa: BLE001 -- stays in the outbox, sent again
                        errors["send"] += 1
                        break
                if sent:
                    with conn, conn.cursor() as cur:
                        cur.execute("DELETE FROM outbox WHERE id = ANY(%s)", (sent,))
        finally:
            conn.close()

    relays = [threading.Thread(target=relay, args=(n,), name=f"relay-{n}", daemon=True)
              for n in range(args.clients)]

    def stop_relays() -> None:
        stop.set()
        for wake in wakes:
            wake.set()
        for thread in relays:
            thread.join(10)

    stoppers.append(stop_relays)

    def calls(lane: int) -> None:
        conn = call_conns[lane]
        try:
            for item in items[lane::args.clients]:
                with conn, conn.cursor() as cur:
                    cur.execute("INSERT INTO business (item) VALUES (%s)", (item,))
                    cur.execute("INSERT INTO outbox (item, note, lane) VALUES (%s, %s, %s)", (item, note, lane))
                wakes[lane].set()
        finally:
            conn.close()

    _start_clock()
    for thread in relays:
        thread.start()
    _in_threads(calls, args.clients)
    return sum(errors.values())


# -- the coordinator --------------------------------------------------------------------------------

@dataclass
class Result:
    scenario: str
    calls: int
    once: int = 0
    duplicated: int = 0
    missing: int = 0
    seconds: float = 0.0
    #: how long the client's calling loop took (its last call returned): near ``seconds``,
    #: the caller bounds the rate; well below, what comes after it does
    loop_seconds: float = 0.0
    #: the share of the messages in the service's table when the calling loop was seen done
    #: (None: all were in first, as with plain calls): beside ``caller share``, how much the
    #: service did while the callers ran
    in_at_loop: float | None = None
    errors: int = 0
    fsyncs: dict[str, int] = field(default_factory=dict)
    cpu_ms: dict[str, int] = field(default_factory=dict)
    #: context switches of each role's process (getrusage: voluntary and involuntary, all threads)
    switches: dict[str, int] = field(default_factory=dict)
    pg: dict[str, int] = field(default_factory=dict)
    tm: dict[str, int] = field(default_factory=dict)
    #: the machine's CPUs' share not idle while the scenario ran (all processes, the kernel's too)
    busy: float = 0.0
    #: resident memory of each role (its STATS: rss_start_kb, rss_end_kb, rss_peak_kb)
    memory: dict[str, dict[str, int]] = field(default_factory=dict)
    #: --latency: every timed call's wall time, seconds
    latencies: list[float] = field(default_factory=list)
    failed: str = ""

    def percentile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of the calls' wall times, in milliseconds (nearest rank)."""
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    @property
    def rate(self) -> float:
        return self.once / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        if self.failed or self.duplicated:
            return False
        return _variant(self.scenario)[0] in PLAIN or self.once == self.calls

    def per_message(self) -> dict[str, float]:
        n = max(self.once, 1)
        return {
            "cpu ms(client)": self.cpu_ms.get("client", 0) / n,
            "cpu ms(server)": self.cpu_ms.get("server", 0) / n,
            "cpu ms(postgres)": self.cpu_ms.get("postgres", 0) / n,
            "switches(client)": self.switches.get("client", 0) / n,
            "switches(server)": self.switches.get("server", 0) / n,
            "fsync(client)": self.fsyncs.get("client", 0) / n,
            "fsync(server)": self.fsyncs.get("server", 0) / n,
            "pg WAL syncs": self.pg.get("wal_sync", 0) / n,
            "pg WAL kB": self.pg.get("wal_bytes", 0) / n / 1024,
            "pg commits": self.pg.get("xact_commit", 0) / n,
            "pg sessions": self.pg.get("sessions", 0) / n,
            "prepared": self.tm.get("prepared", 0) / n,
            "decided": self.tm.get("before_log", 0) / n,
            "1PC": self.tm.get("before_commit_one_phase", 0) / n,
            "on receipt": self.tm.get("on_receipt", 0) / n,
            "caller share": self.loop_seconds / self.seconds if self.seconds > 0 else 0.0,
            **({} if self.in_at_loop is None else {"in at callers' end": self.in_at_loop}),
            **{k.removeprefix("count:"): v / n for k, v in sorted(self.tm.items()) if k.startswith("count:")},
            **self._shares(),
            "machine busy": self.busy,
            # what a message leaves behind in each process, and the largest moment over the start
            **{f"kB/msg kept({role})": (m.get("rss_end_kb", 0) - m.get("rss_start_kb", 0)) / n
               for role, m in sorted(self.memory.items())},
            **{f"peak MB({role})": (m.get("rss_peak_kb", 0) - m.get("rss_start_kb", 0)) / 1024
               for role, m in sorted(self.memory.items())},
        }


    def _shares(self) -> dict[str, float]:
        """The round's summed wall times over its wall time: the service's methods running at once
        on average, and the share of the time each SQLite store's file was held."""
        if self.seconds <= 0:
            return {}
        shares = {"app in flight(server)": self.tm["count:app ms(server)"] / 1000 / self.seconds} \
            if "count:app ms(server)" in self.tm else {}
        for role in ("client", "server"):  # one interpreter each: its threads take turns on one lock
            if role in self.cpu_ms:
                shares[f"cores used({role})"] = self.cpu_ms[role] / 1000 / self.seconds
        lanes = self.tm.get("count:lanes(client)")
        if lanes:  # the client's sending lanes: their slots idle at their rounds' ends, their messages
            shares["lane idle share(client)"] = 1 - self.tm["count:lane busy ms(client)"] / max(
                self.tm["count:lane slot ms(client)"], 1)
            shares["msgs a lane(client)"] = self.tm["count:messages sent(client)"] / lanes
            for why in ("untaken", "alone", "closed", "empty"):
                shares[f"lanes ending {why}(client)"] = self.tm.get(f"count:lane ends {why}(client)", 0) / lanes
        for role in ("client", "server"):
            held = self.tm.get(f"count:file held ms({role})")
            if held is not None:
                shares[f"file held share({role})"] = held / 1000 / self.seconds
        return shares


class _Child:
    """A role of this script in its own process, optionally under strace counting fsyncs."""

    def __init__(self, argv: list[str], strace_out: str | None, profile_out: str | None = None) -> None:
        cmd = [sys.executable, __file__, *argv]
        if strace_out is not None:
            cmd = ["strace", "--seccomp-bpf", "-f", "-qq", "-c", "-e", "trace=fsync,fdatasync",
                   "-o", strace_out, *cmd]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        if "--scenario" in argv:  # ~env.NAME=value: the variant's processes run with that variable
            knobs = _variant(argv[argv.index("--scenario") + 1])[1]
            env.update({k.removeprefix("env."): str(v) for k, v in knobs.items() if k.startswith("env.")})
        role = argv[argv.index("--role") + 1] if "--role" in argv else ""
        if role and role in os.environ.get("BENCH_CALLGRIND", "").split(","):
            # instructions of the whole process (its start-up too: take the difference of two --calls)
            out = Path(os.environ.get("BENCH_CALLGRIND_DIR", ".")) / f"callgrind.{role}.%p"
            cmd = ["valgrind", "--tool=callgrind", "--quiet", f"--callgrind-out-file={out}", *cmd]
        self.strace_out = strace_out
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.spy: subprocess.Popen[bytes] | None = None
        if profile_out is not None and os.environ.get("BENCH_PROFILER", "py-spy") == "py-spy":
            spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
            pid = self.proc.pid
            if strace_out is not None:  # the python process is strace's child
                time.sleep(0.5)
                kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                pid = int(kids[0]) if kids else pid
            mode = os.environ.get("BENCH_PROFILE_IDLE", "1")  # "gil": only the thread holding the GIL
            idle = ["--gil"] if mode == "gil" else ["--idle"] if mode != "0" else []
            self.spy = subprocess.Popen([spy, "record", "--pid", str(pid), *idle, "--threads", "-r", "200",
                                         "-f", "raw", "-o", profile_out],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("EOF")
            self._cond.notify_all()

    def expect(self, prefix: str, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line[len(prefix):].strip()
                    if line == "EOF":
                        raise RuntimeError(f"process ended before {prefix!r}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no {prefix!r} within {timeout}s")
                self._cond.wait(remaining)

    def stop(self) -> dict[str, int]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
            stats = json.loads(self.expect("STATS ", timeout=60))
        except (OSError, RuntimeError, TimeoutError):
            stats = {}
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.spy is not None:
            self.spy.wait(30)  # ends with its target, then writes its file
        return stats

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def fsyncs(self) -> int:
        if self.strace_out is None or not os.path.exists(self.strace_out):
            return 0
        total = 0
        with open(self.strace_out, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if parts and parts[-1] in ("fsync", "fdatasync") and len(parts) >= 5:
                    total += int(parts[3])
        return total


def _machine() -> tuple[int, int]:
    """The machine's CPU clock ticks since boot, (busy, all): idle and waiting for I/O are not busy."""
    with open("/proc/stat", encoding="ascii") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle, iowait
    total = sum(ticks[:8])  # user nice system idle iowait irq softirq steal (guest time is in user)
    return total - idle, total


def _busy(start: tuple[int, int], end: tuple[int, int]) -> float:
    """The share of the CPUs' time between two looks that was not idle."""
    total = end[1] - start[1]
    return (end[0] - start[0]) / total if total > 0 else 0.0


def _pg_cpu(pg: Any, *, reaped: bool = False) -> dict[int, int]:
    """CPU clock ticks (user + system) of every live process of the PostgreSQL server, by pid;
    with ``reaped``, the postmaster's count adds its ended children's (the backends that quit)."""
    ticks = {}
    for pid in pg.pids():
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        ticks[pid] = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        if reaped and pid == pg.pid:
            ticks[pid] += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks


def _pg_cpu_ms(start: dict[int, int], end: dict[int, int]) -> float:
    """PostgreSQL's CPU between two looks taken with ``reaped``: a backend that ended in between
    is counted in the postmaster's reaped children (the outbox's callers close their sessions
    before the service has counted every row: without them the outbox's callers' backends were
    left out, 0.006 instead of about 0.2 ms a message)."""
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(end.values()) - sum(start.values())) * 1000 / tick


def _print_pg_cpu(start: dict[int, int], end: dict[int, int], roles: dict[str, str], messages: int,
                  postmaster: int | None) -> None:
    """``BENCH_PG_CPU=1``: PostgreSQL's CPU per message by process, grouped by what the process
    is (a backend by its database: the client's or the service's side; walwriter, autovacuum...)."""
    tick = os.sysconf("SC_CLK_TCK")
    from psycopg2.extensions import parse_dsn

    names = {parse_dsn(dsn)["dbname"]: role for dsn, role in roles.items() if dsn}
    groups: Counter[str] = Counter()
    for pid, t in end.items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().replace(b"\0", b" ").decode(errors="replace").split()
        except OSError:
            title = ["?"]
        kind = " ".join(title[1:3]) if len(title) > 2 else " ".join(title)
        if pid == postmaster:
            kind = "postmaster and the processes that ended (the outbox's callers' backends)"
        for word in title:
            if word in names:
                kind = f"backends of {word} ({names[word]})"
        groups[kind] += t - start.get(pid, 0)
    print("PostgreSQL CPU by process (ms per message): " + ", ".join(
        f"{kind}: {ticks * 1000 / tick / messages:.3f}" for kind, ticks in groups.most_common() if ticks), flush=True)


def _log_size(pg: Any) -> int:
    try:
        return os.path.getsize(pg.log_path)
    except OSError:
        return 0


def _print_sessions(pg: Any, start: int, roles: dict[str, str], messages: int) -> None:
    """``BENCH_PG_SESSIONS=1``: the sessions each side's databases opened and closed from the round's
    start (``log_connections``, ``log_disconnections``): a session opened for a message's work
    costs PostgreSQL a backend's start (catalog caches) and end."""
    from psycopg2.extensions import parse_dsn

    names = {parse_dsn(dsn)["dbname"]: role for dsn, role in roles.items() if dsn}
    opened: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    lived: dict[str, list[float]] = {}
    with open(pg.log_path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    for line in text.splitlines():
        found = re.search(r"database=(\S+)", line)
        if found is None:
            continue
        role = names.get(found.group(1), found.group(1))
        if "connection authorized" in line:
            opened[role] += 1
        elif "disconnection: session time:" in line:
            ended[role] += 1
            h, m, sec = re.search(r"session time: (\d+):(\d+):([\d.]+)", line).groups()
            lived.setdefault(role, []).append(int(h) * 3600 + int(m) * 60 + float(sec))
    print("PostgreSQL sessions from the round's start (opened, ended a message; ended sessions' "
          "median life): " + ", ".join(
              f"{role}: {opened[role] / messages:.4f}, {ended[role] / messages:.4f}"
              f" ({statistics.median(lived[role]) if role in lived else 0:.3f} s, {opened[role]} opened)"
              for role in sorted(set(opened) | set(ended))), flush=True)


def _print_statements(pg: Any, messages: int, top: int = 15) -> None:
    """``BENCH_PG_STATEMENTS=1``: the statements that took PostgreSQL longest, over the whole run
    (all scenarios: run one scenario to read them per message)."""
    import psycopg2

    conn = psycopg2.connect(pg.dsn("postgres"))
    try:
        with conn.cursor() as cur:
            order, _, many = os.environ.get("BENCH_PG_STATEMENTS", "").partition(":")
            top = int(many) if many.isdigit() else top
            by_calls = order == "calls"  # else by time, or by WAL written
            # every statement each database ran (the utility ones too: BEGIN, SET, COMMIT), however
            # many were sent in one query string
            cur.execute("SELECT split_part(d.datname, '_', 1) || '_' || split_part(d.datname, '_', 2), "
                        "sum(calls), sum(calls) FILTER (WHERE toplevel), "
                        "sum(total_exec_time + total_plan_time) FILTER (WHERE toplevel), "
                        "sum(total_plan_time) FILTER (WHERE toplevel), sum(plans) FILTER (WHERE toplevel), "
                        "sum(wal_bytes) FILTER (WHERE toplevel) FROM pg_stat_statements s "
                        "JOIN pg_database d ON d.oid = s.dbid GROUP BY 1 ORDER BY 1")
            totals = cur.fetchall()
            # each database apart (a scenario's client and service sides), named by its prefix; a
            # transaction's gid (PREPARE TRANSACTION 'gid', COMMIT PREPARED 'gid') is a literal
            # pg_stat_statements keeps: one statement each, unless the literals are folded here
            cur.execute("SELECT split_part(d.datname, '_', 1) || '_' || split_part(d.datname, '_', 2) || ': ' "
                        "|| regexp_replace(query, '''[^'']*''', '''...''', 'g'), sum(calls), "
                        "sum(total_exec_time + total_plan_time), "
                        "sum(total_plan_time), sum(wal_bytes), sum(wal_fpi), sum(plans), sum(rows), "
                        "sum(shared_blks_hit), sum(wal_records) FROM pg_stat_statements s "
                        "JOIN pg_database d ON d.oid = s.dbid GROUP BY 1 "
                        f"ORDER BY {2 if by_calls else 5 if order == 'wal' else 3} DESC LIMIT %s", (top,))
            rows = cur.fetchall()
    finally:
        conn.close()
    print("statements per message of the run, by database: " + ", ".join(
        f"{name}: {int(calls) / messages:.2f}" for name, calls, *_ in totals))
    # each database's statements together (those sent at top level: a statement run inside
    # another, as a DO block's, is in its caller's time): time, planning, plans, WAL
    print("statement time per message of the run, by database (planning; plans; WAL): " + ", ".join(
        f"{name}: {1000 * (ms or 0) / messages:.0f} us ({1000 * (planning or 0) / messages:.0f} us; "
        f"{(plans or 0) / messages:.2f}; {int(wal or 0) / messages:.0f} B)"
        for name, _, _, ms, planning, plans, wal in totals))
    print(f"statements by {'calls' if by_calls else 'WAL' if order == 'wal' else 'PostgreSQL time'}, planning included (per message of the run, {messages} messages; "
          f"these {len(rows)}: {sum(r[1] for r in rows) / messages:.2f} calls, "
          f"{1000 * sum(r[2] for r in rows) / messages:.0f} us):")
    for query, calls, ms, planning, wal, fpi, plans, nrows, hits, records in rows:
        # plans a call: near 1, PostgreSQL plans the statement at every call (text, or a prepared
        # statement whose custom plans win, or whose generic plan is invalidated again and again)
        print(f"  {calls / messages:6.2f} calls {1000 * ms / messages:7.0f} us "
              f"({1000 * planning / messages:5.0f} planning, {plans / calls if calls else 0:4.2f} plans a call) "
              f"{int(wal) / messages:6.0f} B WAL ({fpi / messages:4.2f} FPI, {int(records) / messages:5.2f} rec) "
              f"{int(nrows) / messages:5.2f} rows {int(hits) / messages:6.1f} hits  "
              f"{' '.join(query.split())[:int(os.environ.get('BENCH_PG_STATEMENTS_WIDTH', '100'))]}")


class _WaitSampler:
    """``BENCH_PG_WAITS=1``: samples of what PostgreSQL's active sessions wait for (or run); with
    ``sides`` (database name -> the side's name: ``BENCH_PG_COMMITS=1``, one round's), each sample
    is named by its side, and ``report`` lists every side's waits apart."""

    def __init__(self, pg: Any, sides: dict[str, str] | None = None) -> None:
        self.dsn = pg.dsn("postgres")
        self.sides = sides
        self.samples = 0
        self.seen: Counter[tuple[str, str]] = Counter()
        self.blockers: Counter[tuple[str, str]] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-wait-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psycopg2

        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                # prepared: planned once (planned at every sample, it cost PostgreSQL about 0.45 ms of
                # planning a message of a 16-sequence round, beside the scenario's own work)
                cur.execute(
                    "PREPARE pg_wait_sample AS SELECT a.wait_event_type || ':' || a.wait_event, left(a.query, 70), "
                    "(SELECT left(string_agg(b.state || ' ' || left(b.query, 50), ' | '), 160) "
                    "FROM pg_stat_activity b WHERE b.pid = ANY(pg_blocking_pids(a.pid))), a.datname "
                    "FROM pg_stat_activity a WHERE a.state = 'active' AND a.pid <> pg_backend_pid() "
                    "AND a.backend_type = 'client backend'")
                while not self._stop.wait(0.002):
                    cur.execute("EXECUTE pg_wait_sample")
                    self.samples += 1
                    for event, query, blocker, datname in cur.fetchall():
                        if self.sides is not None:  # by side and wait alone: the statements are the sides'
                            if datname not in self.sides:
                                continue  # another sampler, the coordinator's counting
                            query = self.sides[datname]
                        what = (event or "CPU", " ".join((query or "").split()))
                        self.seen[what] += 1
                        if blocker:
                            self.blockers[(what[1][:50], " ".join(blocker.split()))] += 1
        finally:
            conn.close()

    def report(self, top: int = 20) -> None:
        self._stop.set()
        self._thread.join()
        n = max(1, self.samples)
        if self.sides is not None:
            print(f"PostgreSQL's active sessions by side, {self.samples} samples every 2 ms (average sessions "
                  "per sample): " + "; ".join(
                      f"{side}: " + ", ".join(f"{event} {count / n:.3f}" for (event, s), count in
                                              self.seen.most_common() if s == side)
                      for side in sorted({s for _, s in self.seen})), flush=True)
            return
        print(f"PostgreSQL's active sessions, {self.samples} samples (average sessions per sample):")
        for (event, query), count in self.seen.most_common(top):
            print(f"  {count / n:6.3f}  {event:28s} {query}")
        if self.blockers:
            print("lock waits: the waiting statement <- what its blockers were doing:")
            for (query, blocker), count in self.blockers.most_common(top):
                print(f"  {count / n:6.3f}  {query} <- {blocker}")


def _pg_counters(pg: Any) -> dict[str, Any]:
    import psycopg2

    conn = psycopg2.connect(pg.dsn("postgres"))
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_stat_force_next_flush()")
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute("SELECT datname, xact_commit, xact_rollback, sessions FROM pg_stat_database "
                        "WHERE datname IS NOT NULL")
            databases = {name: (int(c), int(r), int(s)) for name, c, r, s in cur.fetchall()}
            cur.execute("SELECT sum(xact_commit)::bigint, sum(sessions)::bigint FROM pg_stat_database")
            commits, sessions = (int(v) for v in cur.fetchone())
            cur.execute("SELECT wal_sync, wal_bytes::bigint, wal_write, wal_records, wal_sync_time, wal_write_time "
                        "FROM pg_stat_wal")
            wal_sync, wal_bytes, wal_write, wal_records, sync_ms, write_ms = cur.fetchone()
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            lsn = cur.fetchone()[0]
        return {"xact_commit": commits, "wal_sync": int(wal_sync), "wal_bytes": wal_bytes, "sessions": sessions,
                "lsn": lsn, "databases": databases, "wal_write": int(wal_write), "wal_records": int(wal_records),
                "wal_sync_ms": float(sync_ms), "wal_write_ms": float(write_ms)}
    finally:
        conn.close()


def _commit_records(pg: Any, start: str, end: str) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """The commit records a stretch of WAL holds by the database whose rows the transaction wrote
    (its first heap or index record's), the WAL bytes of those transactions by database, and the
    commit records by the tables whose rows their transactions wrote (heap records: inserted,
    updated, locked or deleted rows), from ``pg_waldump``'s records (a commit that wrote no row is
    counted under ``?``; a prepared transaction's at its COMMIT PREPARED)."""
    import psycopg2

    conn = psycopg2.connect(pg.dsn("postgres"))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT oid::text, datname FROM pg_database")
            databases = dict(cur.fetchall())
    finally:
        conn.close()
    relations = _relation_names(pg) if os.environ.get("BENCH_PG_COMMITS") == "tables" else {}
    out = subprocess.run([str(pg.bindir / "pg_waldump"), "-p", str(pg.data_dir / "pg_wal"), "-s", start, "-e", end],
                         capture_output=True, text=True, check=False)
    database_of: dict[str, str] = {}
    tables_of: dict[str, set[str]] = {}
    size_of: Counter[str] = Counter()
    commits: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    shapes: Counter[str] = Counter()
    for line in out.stdout.splitlines():
        found = re.search(r"rmgr: (\S+)\s+len \(rec/tot\):\s*\d+/\s*(\d+), tx:\s*(\d+),.*desc: (\S+)", line)
        if found is None:
            continue
        rmgr, size, xid, desc = found.group(1), int(found.group(2)), found.group(3), found.group(4)
        if desc in ("COMMIT", "COMMIT_PREPARED"):
            if desc == "COMMIT_PREPARED":  # "COMMIT_PREPARED <xid>: ...": the prepared one's
                xid = line.split("desc: COMMIT_PREPARED ", 1)[1].split(":")[0]
            # its subtransactions' records (a SAVEPOINT's) carry their own xids, listed here
            subs = line.split("; subxacts: ", 1)[1].split(";")[0].split() if "; subxacts: " in line else []
            database = database_of.pop(xid, "?")
            tables = tables_of.pop(xid, set())
            for sub in subs:
                found_db = database_of.pop(sub, "?")
                database = found_db if database == "?" else database
                size += size_of.pop(sub, 0)
                tables |= tables_of.pop(sub, set())
            commits[database] += 1
            sizes[database] += size_of.pop(xid, 0) + size
            if relations:
                shapes[" ".join(sorted(tables)) or "(no row)"] += 1
            continue
        size_of[xid] += size
        rel = re.search(r" rel \d+/(\d+)/(\d+)", line)
        if rel is not None:
            db, node = rel.groups()
            database_of.setdefault(xid, databases.get(db, "?"))
            if relations and rmgr == "Heap":  # (an insert that starts a page is an insert)
                how = desc.lower().removesuffix("+init")
                tables_of.setdefault(xid, set()).add(relations.get((db, node), node) + f"[{how}]")
    return commits, sizes, shapes


def _print_commits(pg: Any, scenario: str, before: dict[str, Any], after: dict[str, Any], sides: dict[str, str],
                   messages: int) -> None:
    """``BENCH_PG_COMMITS=1``: what one scenario's round cost PostgreSQL in commits a message, each
    side apart: the transactions each side's databases ended (``pg_stat_database``: a read-only
    one and a statement run alone count), those that wrote a commit record (the ones a WAL flush
    may wait for, unless committed with ``synchronous_commit`` off), and the WAL's writes and
    syncs (``pg_stat_wal``: how many commits one flush grouped, and how long a flush took)."""
    n = max(1, messages)
    records, sizes, shapes = _commit_records(pg, before["lsn"], after["lsn"])
    by_side: dict[str, list[int]] = {}
    for name, (commits, rollbacks, _sessions) in after["databases"].items():
        side = sides.get(name)
        if side is None:
            continue
        was = before["databases"].get(name, (0, 0, 0))
        entry = by_side.setdefault(side, [0, 0, 0, 0])
        entry[0] += commits - was[0]
        entry[1] += rollbacks - was[1]
        entry[2] += records.pop(name, 0)
        entry[3] += sizes.pop(name, 0)
    syncs = after["wal_sync"] - before["wal_sync"]
    recorded = sum(e[2] for e in by_side.values()) + sum(records.values())
    print(f"commits of {scenario} a message: " + "; ".join(
        f"{side}: {e[0] / n:.2f} ended ({e[1] / n:.2f} rolled back), {e[2] / n:.2f} with a commit record "
        f"({e[3] / max(1, e[2]):.0f} B of WAL each)" for side, e in sorted(by_side.items()))
        + (f"; elsewhere {sum(records.values()) / n:.2f} with a commit record" if records else "")
        + f"; WAL {(after['wal_records'] - before['wal_records']) / n:.1f} records, "
        f"{(after['wal_write'] - before['wal_write']) / n:.2f} writes, {syncs / n:.2f} syncs "
        f"({recorded / max(1, syncs):.2f} commit records a sync, "
        f"{(after['wal_sync_ms'] - before['wal_sync_ms']) / max(1, syncs):.2f} ms a sync, "
        f"{(after['wal_write_ms'] - before['wal_write_ms']) / max(1, after['wal_write'] - before['wal_write']):.2f}"
        " ms a write)", flush=True)
    if shapes:
        print(f"commit records of {scenario} a message, by the rows their transactions wrote (table[how]):")
        for shape, count in shapes.most_common(15):
            print(f"  {count / n:6.3f}  {shape}")


def _print_waldump(pg: Any, scenario: str, start: str, end: str, messages: int, top: int = 12) -> None:
    """``BENCH_PG_WALDUMP=1``: the WAL record types one scenario's round wrote, per message."""
    out = subprocess.run([str(pg.bindir / "pg_waldump"), "--stats=record", "-p", str(pg.data_dir / "pg_wal"),
                          "-s", start, "-e", end], capture_output=True, text=True, check=False)
    rows = []
    for line in out.stdout.splitlines():
        parts = line.replace("(", " ").replace(")", " ").split()
        if len(parts) >= 9 and "/" in parts[0] and parts[1].isdigit():
            # Type N (%) record-size (%) FPI-size (%) combined (%)
            rows.append((parts[0], int(parts[1]), int(parts[3]), int(parts[5]), int(parts[7])))
    rows.sort(key=lambda r: -r[4])
    n = max(1, messages)
    print(f"WAL of {scenario} by record type (pg_waldump, per message; {sum(r[4] for r in rows) / n:.0f} B in all"
          f"{'; ' + out.stderr.strip()[:160] if out.returncode else ''}):")
    for name, count, size, fpi, _combined in rows[:top]:
        print(f"  {name:34s} {count / n:6.2f} records {size / n:7.0f} B  FPI {fpi / n:6.0f} B")
    if os.environ.get("BENCH_PG_WALDUMP") == "rel":
        _print_waldump_by_relation(pg, scenario, start, end, n, top=3 * top)


def _relation_names(pg: Any) -> dict[tuple[str, str], str]:
    """Every relation of the server's databases, ``(database oid, filenode) -> side.table`` (the side:
    the database name's first word), as ``pg_waldump`` names a block's relation."""
    import psycopg2

    names: dict[tuple[str, str], str] = {}
    conn = psycopg2.connect(pg.dsn("postgres"))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT oid::text, datname FROM pg_database WHERE datallowconn")
            databases = cur.fetchall()
    finally:
        conn.close()
    for oid, datname in databases:
        conn = psycopg2.connect(pg.dsn(datname))
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_relation_filenode(oid)::text, relname FROM pg_class "
                            "WHERE pg_relation_filenode(oid) IS NOT NULL")
                names.update({(oid, node): f"{datname.split('_')[0]}.{rel}" for node, rel in cur.fetchall()})
        finally:
            conn.close()
    return names


def _print_waldump_by_relation(pg: Any, scenario: str, start: str, end: str, n: int, top: int) -> None:
    """``BENCH_PG_WALDUMP=rel``: the heap and index records of the round by type and relation
    (database.table), per message: which table's rows an UPDATE rewrote, locked or inserted."""
    names = _relation_names(pg)
    out = subprocess.run([str(pg.bindir / "pg_waldump"), "-p", str(pg.data_dir / "pg_wal"), "-s", start, "-e", end],
                         capture_output=True, text=True, check=False)
    seen: Counter[tuple[str, str]] = Counter()
    size: Counter[tuple[str, str]] = Counter()
    for line in out.stdout.splitlines():
        if not line.startswith("rmgr: Heap") and not line.startswith("rmgr: Btree"):
            continue
        rmgr = line.split()[1]
        desc = line.split("desc: ", 1)[1].split()[0] if "desc: " in line else "?"
        if desc == "LOCK" and "flags 0x" in line:  # which lock (KEYSHR_LOCK: FOR KEY SHARE; EXCL_LOCK: ...)
            bits = line.split("flags 0x", 1)[1].split(",")[0].split()[1:]
            desc += "[" + " ".join(b for b in bits if b.isupper() and b != "LOCK_ONLY") + "]"
        rel = "?"
        if "blkref #0: rel " in line:
            _spc, db, node = line.split("blkref #0: rel ", 1)[1].split()[0].split("/")
            rel = names.get((db, node), node)
        total = int(line.split("len (rec/tot):", 1)[1].split("/")[1].split(",")[0]) if "len (rec/tot):" in line else 0
        seen[(f"{rmgr}/{desc}", rel)] += 1
        size[(f"{rmgr}/{desc}", rel)] += total
    print(f"WAL of {scenario} by record type and relation (heap and index records, per message):")
    for (kind, rel), count in sorted(seen.items(), key=lambda kv: -size[kv[0]])[:top]:
        print(f"  {kind:34s} {rel:34s} {count / n:6.2f} records {size[(kind, rel)] / n:7.0f} B")


def _pg_profiles(pg: Any, sides: dict[str, str]) -> dict[str, Any]:
    """``BENCH_PG_PROFILE=1``: ``perf record`` (``pg_profile.py``) started on the backends of each
    side's databases that are connected now (the scenario's sessions, opened by its warm-up)."""
    import psycopg2

    sys.path.insert(0, str(ROOT / "bench"))
    import pg_profile

    names = {psycopg2.extensions.parse_dsn(dsn).get("dbname"): side for dsn, side in sides.items() if dsn}
    conn = psycopg2.connect(pg.dsn("postgres"))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT datname, pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                        "AND pid <> pg_backend_pid()")
            rows = cur.fetchall()
    finally:
        conn.close()
    by_side: dict[str, list[int]] = {}
    for datname, pid in rows:
        side = names.get(datname)
        if side is not None:
            by_side.setdefault(side, []).append(pid)
    recordings = {side: pg_profile.PerfRecording(pids) for side, pids in by_side.items()}
    for recording in recordings.values():
        recording.start()
    return recordings


def _perf_stats(pg: Any, processes: dict[str, int], sides: dict[str, str]) -> dict[str, Any]:
    """``BENCH_PERF_STAT=1``: ``perf stat`` (``perf_stat.py``) started on the client's and the
    service's processes, on the backends of each side's databases connected now, and on the rest
    of the server (the postmaster, whose backends started later are counted with it: perf follows
    a fork, and the background processes)."""
    import psycopg2

    sys.path.insert(0, str(ROOT / "bench"))
    import perf_stat
    import pg_profile

    names = {psycopg2.extensions.parse_dsn(dsn).get("dbname"): side for dsn, side in sides.items() if dsn}
    conn = psycopg2.connect(pg.dsn("postgres"))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT datname, pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                        "AND pid <> pg_backend_pid()")
            rows = cur.fetchall()
    finally:
        conn.close()
    groups: dict[str, list[int]] = {role: [pid] for role, pid in processes.items()}
    seen = set()
    for datname, pid in rows:
        side = names.get(datname)
        if side is not None:
            groups.setdefault(f"pg {side}", []).append(pid)
            seen.add(pid)
    groups["pg rest"] = [pid for pid in pg_profile.server_pids(pg.pid) if pid not in seen] + [pg.pid]
    counters = {group: perf_stat.PerfStat(pids) for group, pids in groups.items()}
    for counter in counters.values():
        counter.start()
    return counters


def _execute(dsn: str, *statements: str) -> None:
    import psycopg2

    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


class _Counter:
    """The coordinator's look at the service's table, on one session for the whole scenario.

    It looks every 10 ms: a new connection each time (a backend forked and
    authenticated) cost PostgreSQL several milliseconds of CPU per message on
    the machine the scenarios share, more than some scenarios' own work.
    """

    def __init__(self, dsn: str) -> None:
        import psycopg2

        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        #: statements run (each its own transaction, left out of the commit count)
        self.queries = 0

    def received(self, expected: int | None = None) -> tuple[int, int]:
        """Rows and distinct items in the service's table.

        While fewer than ``expected`` rows are in, only the rows are counted
        (the distinct count is ``-1``): ``count(DISTINCT item)`` sorts the
        whole table, and at one look every 10 ms it cost PostgreSQL 0.4 ms of
        CPU per delivered message, which the CPU-bound scenarios paid for in
        their rate.
        """
        with self.conn.cursor() as cur:
            if expected is not None:
                self.queries += 1
                cur.execute("SELECT count(*) FROM received")
                (total,) = cur.fetchone()
                if total < expected:
                    return int(total), -1
            self.queries += 1
            cur.execute("SELECT count(*), count(DISTINCT item) FROM received")
            total, distinct = cur.fetchone()
            return int(total), int(distinct)

    def close(self) -> None:
        self.conn.close()


def _statement_name(query: str) -> str:
    """A statement without its parameters (``EXECUTE wsrm_3``), or its first 90 characters."""
    text = " ".join(query.split())
    return text.split(" (", 1)[0] if text.startswith("EXECUTE ") else text[:90]


class _LockSampler:
    """``BENCH_PG_LOCKS=1``: who waits for a lock, and for whom, every 5 ms of a scenario (a thread
    of the coordinator on a session of its own): the waiting statement and the blockers' current
    or last statements, counted."""

    def __init__(self, dsn: str) -> None:
        import psycopg2

        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        self.samples = 0
        self.waits: Counter[tuple[str, str]] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self.conn.cursor() as cur:
            while not self._stop.wait(0.005):
                cur.execute("SELECT w.query, b.query, b.state FROM pg_stat_activity w "
                            "JOIN pg_stat_activity b ON b.pid = ANY(pg_blocking_pids(w.pid)) "
                            "WHERE w.wait_event_type = 'Lock'")
                self.samples += 1
                for waiting, blocker, state in cur.fetchall():
                    self.waits[(_statement_name(waiting), f"[{state}] {_statement_name(blocker)}")] += 1

    def report(self, scenario: str) -> None:
        self._stop.set()
        self._thread.join(5)
        self.conn.close()
        print(f"  lock waits of {scenario} in {self.samples} samples, {sum(self.waits.values())} in all "
              "(waiting <- blocker):")
        for (waiting, blocker), n in self.waits.most_common(8):
            print(f"    {n:5d}  {waiting}\n           <- {blocker}")


def _next_look(total: int, expected: int, elapsed: float) -> float:
    """Seconds until the next count of the service's rows: a quarter of the time the rest
    should take at the rate so far, 10 ms near the end (the end's resolution).

    A look every 10 ms throughout cost the measured machine about 130 us of CPU each
    (PostgreSQL's count and this process), 1.3% of a core, paid most by the scenarios
    bound by CPU."""
    if total <= 0 or elapsed <= 0:
        return 0.05
    remaining = (expected - total) * elapsed / total
    return min(0.2, max(0.01, remaining / 4))


def run_scenario(scenario: str, args: argparse.Namespace, pg: Any, workdir: Path, *,
                 strace: bool = False) -> Result:
    import psycopg2

    variant, scenario = scenario, _variant(scenario)[0]
    tag = uuid.uuid4().hex[:8]
    server_app = pg.create_database(f"srv_app_{tag}")
    client_app = pg.create_database(f"cli_app_{tag}")
    server_store = client_store = ""
    if scenario == "xa2":
        server_store = pg.create_database(f"srv_store_{tag}")
        client_store = pg.create_database(f"cli_store_{tag}")
    elif scenario == "xa1":
        server_store, client_store = server_app, client_app
    # BENCH_LAPS=1: each row's instant, for the laps of a sequence (see _print_laps)
    at = ", at timestamptz NOT NULL DEFAULT clock_timestamp()" if os.environ.get("BENCH_LAPS") else ""
    _execute(server_app, f"CREATE TABLE received (item text NOT NULL, note text{at})",
             "CREATE TABLE processed (id text PRIMARY KEY)")
    _execute(client_app, f"CREATE TABLE business (id bigserial PRIMARY KEY, item text NOT NULL{at})",
             "CREATE TABLE outbox (id bigserial PRIMARY KEY, item text NOT NULL, note text, "
             f"lane integer NOT NULL DEFAULT 0{at})")
    if scenario in ("xa1", "xa2"):  # the stores' schemas, outside the measurement
        from wsrm_plugin.store import open_store

        for dsn in {server_store, client_store}:
            open_store("postgresql:" + dsn).close()
    result = Result(variant, args.calls)
    profile = os.environ.get("BENCH_PROFILE")

    def profile_out(role: str) -> str | None:
        return str(Path(profile) / f"{scenario}-{tag}-{role}.txt") if profile else None
    common = ["--scenario", variant, "--retransmission-interval", str(args.retransmission_interval)]
    if args.latency:
        common.append("--latency")
    if strace or os.environ.get("BENCH_TM_POINTS"):
        common.append("--tm-points")
    server = client = None
    before = _pg_counters(pg)
    counter = _Counter(server_app)
    locks = _LockSampler(pg.dsn("postgres")) if os.environ.get("BENCH_PG_LOCKS") else None
    sides = {psycopg2.extensions.parse_dsn(dsn)["dbname"]: side for dsn, side in (
        (client_app, "client"), (server_app, "server"), (client_store, "client store"),
        (server_store, "server store")) if dsn}
    if scenario == "xa1":  # each side's store in its application's database
        sides = {name: side.removesuffix(" store") for name, side in sides.items()}
    waits = _WaitSampler(pg, sides) if os.environ.get("BENCH_PG_COMMITS") else None
    try:
        server = _Child(["--role", "server", *common, "--app-dsn", server_app, "--store-dsn", server_store],
                        str(workdir / f"{scenario}-{tag}-server.strace") if strace else None,
                        profile_out("server"))
        url = server.expect("URL ")
        client = _Child(["--role", "client", *common, "--app-dsn", client_app, "--store-dsn", client_store,
                         "--url", url, "--calls", str(args.calls), "--note", str(args.note), "--run", tag,
                         "--clients", str(args.clients)],
                        str(workdir / f"{scenario}-{tag}-client.strace") if strace else None,
                        profile_out("client"))
        t0 = float(client.expect("T0 ", timeout=120))
        profiles: dict[str, Any] = {}
        profiled_from = 0  # messages in when the recording started (once a tenth is in: sessions open)
        # the whole round from T0: the callers of a one-way scenario are done long before its end
        counting = _perf_stats(pg, {"client": client.proc.pid, "server": server.proc.pid},
                               {client_app: "client", server_app: "server", client_store: "client store",
                                server_store: "server store"}) if os.environ.get("BENCH_PERF_STAT") else {}
        pg_cpu_at_start = _pg_cpu(pg, reaped=True)
        log_at_start = _log_size(pg)
        machine_at_start = _machine()
        deadline = time.monotonic() + args.timeout
        sent_errors = None
        while True:
            total, distinct = counter.received(args.calls)
            now = time.monotonic()
            if distinct >= args.calls:
                break
            if os.environ.get("BENCH_PG_PROFILE") and not profiles and total >= args.calls // 10:
                profiled_from = total
                profiles = _pg_profiles(pg, {client_app: "client", server_app: "server", client_store: "client store",
                                             server_store: "server store"})
            if sent_errors is None:
                with client._cond:
                    done = [line for line in client.lines if line.startswith("SENT ")]
                if done:
                    sent_errors = int(done[0].split()[1])
                    result.in_at_loop = total / max(args.calls, 1)
                    if scenario in PLAIN and sent_errors:
                        time.sleep(0.5)  # what got through is in; the rest is lost
                        total, distinct = counter.received()
                        now = time.monotonic()
                        break
            if now > deadline:
                total, distinct = counter.received()
                result.failed = f"timed out with {distinct} of {args.calls}"
                break
            time.sleep(_next_look(total, args.calls, now - t0))
        result.seconds = now - t0
        result.busy = _busy(machine_at_start, _machine())
        pg_cpu_at_end = _pg_cpu(pg, reaped=True)
        result.cpu_ms["postgres"] = _pg_cpu_ms(pg_cpu_at_start, pg_cpu_at_end)
        if os.environ.get("BENCH_PG_SESSIONS"):
            _print_sessions(pg, log_at_start, {client_app: "client", server_app: "server",
                                               client_store: "client store", server_store: "server store"},
                            distinct)
        if os.environ.get("BENCH_PG_CPU"):
            _print_pg_cpu(pg_cpu_at_start, pg_cpu_at_end, {client_app: "client", server_app: "server",
                                                          client_store: "client store",
                                                          server_store: "server store"}, args.calls, pg.pid)
        if counting:
            import perf_stat

            print("\n".join(perf_stat.report({group: c.stop() for group, c in counting.items()},
                                              distinct)), flush=True)
        for side, recording in profiles.items():
            import pg_profile

            counts = recording.stop()
            ms = sum(counts.values()) / recording.frequency * 1000 / max(1, distinct - profiled_from)
            print("\n".join(line.replace("PostgreSQL's CPU", f"PostgreSQL's CPU ({side} backends)", 1)
                            for line in pg_profile.report(counts, ms)))
        result.once = distinct
        result.duplicated = total - distinct
        result.missing = args.calls - distinct
        result.errors = int(client.expect("SENT ", timeout=120))
        result.loop_seconds = float(client.expect("LOOP ", timeout=120)) - t0
        if args.latency:
            result.latencies = json.loads(client.expect("LAT ", timeout=120))
    except Exception as exc:  # noqa: BLE001 -- reported as a failed scenario
        result.failed = f"{type(exc).__name__}: {exc}"
    finally:
        stats: Counter[str] = Counter()
        for name, child in (("client", client), ("server", server)):
            if child is not None:
                seen = child.stop()
                result.cpu_ms[name] = seen.pop("cpu_ms", 0)
                result.switches[name] = seen.pop("switches", 0)
                result.memory[name] = {k: seen.pop(k) for k in ("rss_start_kb", "rss_end_kb", "rss_peak_kb")
                                       if k in seen}
                stats.update(seen)
                result.fsyncs[name] = child.fsyncs()
        result.tm = dict(stats)
        counter.close()
        if locks is not None:
            locks.report(variant)
        if waits is not None:
            waits.report()
    after = _pg_counters(pg)
    if os.environ.get("BENCH_PG_WALDUMP"):
        _print_waldump(pg, scenario, before["lsn"], after["lsn"], result.once)
    if os.environ.get("BENCH_PG_COMMITS"):
        _print_commits(pg, variant, before, after, sides, result.once)
    result.pg = {k: after[k] - before[k] for k in ("xact_commit", "wal_sync", "wal_bytes", "sessions")}
    # the coordinator's own read-only transactions, and the first _pg_counters' own
    result.pg["xact_commit"] -= counter.queries + 1 + (waits.samples + 1 if waits is not None else 0)
    if at:
        _print_laps(variant, server_app, client_app, int(_variant(variant)[1].get("clients", args.clients)))
    if scenario in ("xa1", "xa2"):
        for dsn in {server_app, client_app, server_store, client_store}:
            conn = psycopg2.connect(dsn)
            try:
                with conn, conn.cursor() as cur:
                    cur.execute("SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()")
                    left = cur.fetchone()[0]
            finally:
                conn.close()
            if left:
                result.failed += f" {left} prepared transaction(s) left"
    return result


def _print_laps(variant: str, server_app: str, client_app: str, clients: int) -> None:
    """``BENCH_LAPS=1``: the lap of one sequence's turn, from the rows' instants (``clock_timestamp()``
    at each INSERT): calling thread ``n`` makes items ``n``, ``n + clients``, ... (one sequence each
    in the reliable scenarios, one relay's lane in the outbox's).  ``lap``: between one sequence's
    consecutive rows in the service's table; ``caller lap``: between its consecutive business rows
    (the calling thread's own turn: its transaction and call); ``end to end``: an item's service row
    after its business row (the reliable scenarios and the outbox write one); ``ahead``: how many
    of the sequence's own items were made but not yet in the service's table at each arrival
    (end to end over the caller's lap: 1 or more, the sequence was pipelined; below 1, each message
    waited for the one before it)."""
    import psycopg2

    def instants(dsn: str, table: str) -> dict[int, float]:
        conn = psycopg2.connect(dsn)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(f"SELECT item, extract(epoch FROM at)::float8 FROM {table}")
                return {int(item.rsplit("-", 1)[1]): t for item, t in cur.fetchall()}
        finally:
            conn.close()

    def gaps(by_item: dict[int, float]) -> list[float]:
        out: list[float] = []
        for n in range(clients):
            times = sorted(t for i, t in by_item.items() if i % clients == n)
            out.extend(1000 * (b - a) for a, b in zip(times, times[1:]))
        return sorted(out)

    def q(values: list[float], at: float) -> float:
        return values[min(len(values) - 1, int(at * len(values)))] if values else float("nan")

    served = instants(server_app, "received")
    made = instants(client_app, "business")
    laps, caller_laps = gaps(served), gaps(made)
    e2e = sorted(1000 * (served[i] - made[i]) for i in served if i in made)
    caller = q(caller_laps, 0.5)
    ahead = f"{q(e2e, 0.5) / caller:.2f}" if e2e and caller > 0 else "-"
    print(f"  laps of {variant} ({clients} sequences), ms p50/p90: lap {q(laps, 0.5):.1f}/{q(laps, 0.9):.1f}, "
          f"caller lap {q(caller_laps, 0.5):.1f}/{q(caller_laps, 0.9):.1f}, end to end "
          f"{q(e2e, 0.5):.1f}/{q(e2e, 0.9):.1f}, ahead (p50) {ahead}", flush=True)


def _line(result: Result) -> str:
    pm = result.per_message()
    detail = " ".join(f"{k}={v:.2f}" for k, v in pm.items())
    state = "" if result.ok else f"  FAILED {result.failed} dup={result.duplicated} missing={result.missing}"
    return (f"  {result.scenario:7s} {result.rate:8.1f} msg/s ({result.seconds:6.2f} s, {result.once} once"
            f"{', errors ' + str(result.errors) if result.errors else ''})  per msg: {detail}{state}")


def _default_scenarios(args: argparse.Namespace) -> str:
    """The scenarios each mode compares: request-reply latency has no outbox; N calling threads
    compare with plain calls from N threads; one thread with the issue 12 table."""
    if args.latency:
        return "plain,memory,sqlite,xa1"
    if args.clients > 1:
        return "plainN,outbox,memory,sqlite,xa1,xa2"
    if args.note >= 65536:
        return "plain,outbox,memory,sqlite,xa1,xa2"
    return "plain,plain8,outbox,memory,sqlite,xa2,xa2log,xa1"


def _aims_of(args: argparse.Namespace) -> list[tuple[str, str, float]]:
    if args.clients > 1:
        return AIMS_CLIENTS
    if args.note >= 65536:
        return AIMS_PAYLOAD
    return AIMS


def _report_aims(args: argparse.Namespace, ratios: dict[str, list[float]],
                 cpu_ratios: dict[str, list[float]]) -> None:
    print("aims (rates; CPU ratio in brackets):")
    for scenario, base, aim in _aims_of(args):
        values = ratios.get(f"{scenario}/{base}")
        if values:
            med = statistics.median(values)
            cpu_values = cpu_ratios.get(f"{scenario}/{base}")
            by_cpu = f" (CPU {statistics.median(cpu_values):.2f})" if cpu_values else ""
            print(f"  {scenario}/{base} >= {aim}: {med:.2f} {'ok' if med >= aim else 'BELOW'}{by_cpu}")


def _report_latency(scenarios: list[str], results: dict[str, list[Result]]) -> int:
    """Each scenario's call latency (medians over the rounds of each round's percentiles), its p50
    against plain's of the same round, and the aims; 1 when a scenario timed no call."""
    print("latency of a request-reply call, ms (medians over the rounds; per round in brackets):")
    missing = 0
    for scenario in scenarios:
        runs = results[scenario]
        if not any(r.latencies for r in runs):
            print(f"  {scenario:7s} no call timed")
            missing += 1
            continue
        cells = []
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)):
            values = [r.percentile(q) for r in runs]
            cells.append(f"{name} {statistics.median(values):6.2f} ({', '.join(f'{v:.2f}' for v in values)})")
        print(f"  {scenario:7s} " + "  ".join(cells))
    plain = results.get("plain")
    print("aims (p50 against plain's p50 of the same round; p99 against the scenario's own p50):")
    for scenario in scenarios:
        runs = results[scenario]
        base, _ = _variant(scenario)
        aim = dict(AIMS_LATENCY).get(base)
        if plain and aim is not None and all(r.latencies for r in runs):
            p50s = [r.percentile(0.5) / p.percentile(0.5) for r, p in zip(runs, plain, strict=True)
                    if p.latencies]
            if p50s:
                med = statistics.median(p50s)
                print(f"  {scenario}/plain p50 <= {aim}x: {med:.2f}x {'ok' if med <= aim else 'ABOVE'}")
        if base not in PLAIN and all(r.latencies for r in runs):
            tails = [r.percentile(0.99) / r.percentile(0.5) for r in runs]
            med = statistics.median(tails)
            print(f"  {scenario} p99 <= {LATENCY_TAIL}x its p50: {med:.2f}x "
                  f"{'ok' if med <= LATENCY_TAIL else 'ABOVE'}")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("coordinator", "server", "client"), default="coordinator")
    parser.add_argument("--scenario", default="")
    parser.add_argument("--scenarios", default=None,
                        help="comma-separated; default: every scenario that fits the mode (see MODES)")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=1,
                        help="calling threads of the outbox and reliable scenarios: each reliable one with "
                             "its own client (its own sequence), each outbox one with its own relay")
    parser.add_argument("--note", type=int, default=64, help="bytes of payload per call")
    parser.add_argument("--latency", action="store_true",
                        help="request-reply calls, each caller waiting for its answer: the calls' wall "
                             "time percentiles (p50, p99) against plain calls")
    parser.add_argument("--retransmission-interval", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--no-strace", action="store_true", help="do not count fsyncs (strace)")
    parser.add_argument("--tm-points", action="store_true",
                        help="(a role's) count the transaction managers' prepared/decided/one-phase commits "
                             "through their checkpoint hook, which takes them off their fast path")
    parser.add_argument("--app-dsn", default="")
    parser.add_argument("--store-dsn", default="")
    parser.add_argument("--url", default="")
    parser.add_argument("--run", default="")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.role == "server":
        return server_role(args)
    if args.role == "client":
        return client_role(args)

    if args.scenarios is None:
        args.scenarios = _default_scenarios(args)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if args.latency and any(_variant(s)[0] == "outbox" for s in scenarios):
        parser.error("the outbox has no request-reply call: leave it out of --latency")
    unknown = {_variant(s)[0] for s in scenarios} - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}")
    from wsrm_plugin.tools.pgserver import ThrowawayPostgres

    statements = bool(os.environ.get("BENCH_PG_STATEMENTS"))
    settings: dict[str, str] = {"shared_preload_libraries": "pg_stat_statements",
                                "pg_stat_statements.track": "all",
                                "pg_stat_statements.track_planning": "on"} if statements else {}
    if os.environ.get("BENCH_PG_SESSIONS"):
        settings.update(log_connections="on", log_disconnections="on")
    if os.environ.get("BENCH_PG_COMMITS"):
        settings.update(track_wal_io_timing="on")
    pg = ThrowawayPostgres(max_connections=200, settings=settings or None).start()
    if statements:
        _execute(pg.dsn("postgres"), "CREATE EXTENSION pg_stat_statements")
    sampler: _WaitSampler | None = None
    workdir = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    os.environ["BENCH_WORKDIR"] = str(workdir)  # the roles' files go there too: removed at the end
    kind = "request-reply (each caller waits for its answer)" if args.latency else "one-way"
    print(f"zeep -> spyne, {args.calls} {kind} calls of {args.note} bytes per scenario from {args.clients} "
          f"calling thread(s), {args.rounds} interleaved rounds; rates count rows committed in the "
          f"service's own table", flush=True)
    results: dict[str, list[Result]] = {s: [] for s in scenarios}
    ratios: dict[str, list[float]] = {}
    #: base's CPU per message / the scenario's (client + server processes): what the rate ratio
    #: would be if both were bound by that CPU.  Steadier than rates on a shared, noisy machine.
    cpu_ratios: dict[str, list[float]] = {}
    failures = 0
    # fsyncs are counted in a round of their own: strace on a process (even --seccomp-bpf, which
    # stops only at the traced calls and at thread creation) halved the reliable scenarios' rates
    # against plain (memory/plain 0.43 traced, 0.93-0.97 untraced, same code, minutes apart)
    counted: dict[str, Result] = {}
    try:
        if not args.no_strace and shutil.which("strace") is not None:
            print("counting round (under strace, for the fsyncs only; its rates are not used)", flush=True)
            for scenario in scenarios:
                counted[scenario] = run_scenario(scenario, args, pg, workdir, strace=True)
                failures += not counted[scenario].ok
                print(_line(counted[scenario]), flush=True)
        if os.environ.get("BENCH_PG_WAITS"):
            sampler = _WaitSampler(pg)
        for round_no in range(1, args.rounds + 1):
            print(f"round {round_no}", flush=True)
            rates: dict[str, float] = {}
            cpu: dict[str, float] = {}
            # every other round runs the scenarios in the reverse order: a machine that warms up
            # or slows down through a round then favours no scenario over its base (plain ran
            # first in every round before, and its p50 paired with later scenarios' only)
            for scenario in (scenarios if round_no % 2 else scenarios[::-1]):
                result = run_scenario(scenario, args, pg, workdir)
                if scenario in counted:  # the fsyncs of this scenario, from the counting round
                    result.fsyncs = dict(counted[scenario].fsyncs)
                    for point in _TM_POINTS:  # and the manager's counters, unless counted here too
                        result.tm.setdefault(point, counted[scenario].tm.get(point, 0))
                results[scenario].append(result)
                rates[scenario] = result.rate
                per = result.per_message()
                cpu[scenario] = per["cpu ms(client)"] + per["cpu ms(server)"]
                failures += not result.ok
                print(_line(result), flush=True)
            for s in scenarios:
                for base in BASES:
                    if base in rates and s != base and rates[base] > 0:
                        ratios.setdefault(f"{s}/{base}", []).append(rates[s] / rates[base])
                    if base in cpu and s != base and cpu[s] > 0:
                        cpu_ratios.setdefault(f"{s}/{base}", []).append(cpu[base] / cpu[s])
        print(f"median over {args.rounds} round(s):")
        for scenario in scenarios:
            runs = results[scenario]
            rate = statistics.median(r.rate for r in runs)
            per = {k: statistics.median(r.per_message().get(k, 0.0) for r in runs) for k in runs[0].per_message()}
            print(f"  {scenario:7s} {rate:8.1f} msg/s  per msg: "
                  + " ".join(f"{k}={v:.2f}" for k, v in per.items()), flush=True)
        print("median ratios (values per round):")
        for name, values in ratios.items():
            print(f"  {name:15s} {statistics.median(values):5.2f}  ({', '.join(f'{v:.2f}' for v in values)})")
        if cpu_ratios:
            print("median CPU ratios (the base's client+server CPU per message / the scenario's):")
            for name, values in cpu_ratios.items():
                print(f"  {name:15s} {statistics.median(values):5.2f}  ({', '.join(f'{v:.2f}' for v in values)})")
        if args.latency:
            failures += _report_latency(scenarios, results)
        else:
            _report_aims(args, ratios, cpu_ratios)
        if statements:
            top = os.environ["BENCH_PG_STATEMENTS"]
            _print_statements(pg, args.calls * args.rounds * len(scenarios),
                              int(top) if top.isdigit() and int(top) > 1 else 15)
        if sampler is not None:
            sampler.report()
    finally:
        pg.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
