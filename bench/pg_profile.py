"""Where PostgreSQL's own CPU goes, by what the server was doing: ``perf record -g`` on a server's
processes while a benchmark runs, each sample put in one bucket by its stack.

``pg_stat_statements`` times only a statement's run (``ExecutorRun`` and ``ExecutorFinish``)
and its planning.  An XA request-reply call cost PostgreSQL 1.9-2.3 ms of CPU against about 0.3
ms that it reported: the rest is what a round trip costs around its statements, and that is
what this says.  The buckets, from the root of a sample's stack to its leaf (the deepest one
named wins, except that a sample inside a statement's execution stays there):

- ``run``: the statements' execution (``ExecutorRun``, ``ExecutorFinish``: what
  ``pg_stat_statements`` counts);
- ``executor start/end``: a plan's set-up and tear-down at each execution (every node of a
  generic plan is initialised, CTEs and sub-plans that do nothing included), not in
  ``pg_stat_statements``;
- ``EXECUTE``: a prepared statement's call in a simple query besides its plan (its literal
  parameters coerced and evaluated, the portal), and ``plan cache``: the cached plan's
  revalidation (the query tree walked for its locks, twice an ``EXECUTE``);
- ``parse``, ``analyze/plan``: the query string's parse; analysis and planning (unprepared
  statements, custom plans);
- ``commit: WAL flush`` and ``commit: other``: a transaction's end;
- ``socket read and wake-up``, ``socket write``: the protocol, and ``kernel: other`` (samples
  in the kernel reached from the backend's main loop: mostly a wake-up from waiting for the
  next query, and the network stack);
- the background processes by name.

Needs ``perf`` (Linux) and a server whose binary names its functions (Debian's does: they are
exported for extensions; its static functions show as unknown frames and fall to the nearest
named caller).  ``BENCH_PG_PROFILE_DUMP=DIR`` keeps each recording's stacks (``perf script``
output, leaf first) in ``DIR``, to see what a bucket (``other``) holds.  A measuring tool only.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

#: (function, bucket); a sample goes to the bucket of the deepest function of its stack named here
#: (``run`` and ``executor start/end`` keep a sample once reached)
_MARKS: tuple[tuple[str, str], ...] = (
    ("PostgresMain", "backend: other"),
    ("pq_getbyte", "socket read and wake-up"), ("pq_getmessage", "socket read and wake-up"),
    ("secure_read", "socket read and wake-up"), ("WaitEventSetWait", "socket read and wake-up"),
    ("epoll_wait", "socket read and wake-up"), ("__libc_recv", "socket read and wake-up"),
    ("recv", "socket read and wake-up"),
    ("pq_flush", "socket write"), ("secure_write", "socket write"), ("__send", "socket write"),
    ("send", "socket write"),
    ("pg_parse_query", "parse"), ("raw_parser", "parse"),
    ("pg_analyze_and_rewrite_fixedparams", "analyze/plan"), ("parse_analyze_fixedparams", "analyze/plan"),
    ("pg_plan_queries", "analyze/plan"), ("standard_planner", "analyze/plan"),
    ("ExecuteQuery", "EXECUTE"),
    ("GetCachedPlan", "plan cache"), ("CachedPlanGetTargetList", "plan cache"),
    ("StartTransactionCommand", "transaction start"),
    ("CommitTransactionCommand", "commit: other"), ("XLogFlush", "commit: WAL flush"),
    ("standard_ExecutorStart", "executor start/end"), ("standard_ExecutorEnd", "executor start/end"),
    ("PortalDrop", "executor start/end"),
    ("standard_ExecutorRun", "run"), ("standard_ExecutorFinish", "run"),
    ("AutoVacLauncherMain", "autovacuum"), ("AutoVacWorkerMain", "autovacuum"),
    ("BackgroundWriterMain", "background writer"), ("WalWriterMain", "WAL writer"),
    ("CheckpointerMain", "checkpointer"),
)
_BUCKET = dict(_MARKS)
_STICKY = ("run", "executor start/end")


def bucket(stack: list[str]) -> str:
    """The bucket of one sample, its stack given leaf first (as ``perf script`` prints it)."""
    chosen = ""
    for name in reversed(stack):  # root to leaf
        found = _BUCKET.get(name)
        if found is None:
            continue
        if chosen in _STICKY:
            break
        if chosen == "commit: WAL flush" and found != "commit: WAL flush":
            continue
        chosen = found
    if chosen == "backend: other" and stack and stack[0].startswith("[k]"):
        return "kernel: other"
    return chosen or ("kernel: other" if stack and stack[0].startswith("[k]") else "other")


def buckets(perf_script: Iterable[str]) -> collections.Counter[str]:
    """Samples by bucket from ``perf script -F ip,sym,dso`` output (stacks leaf first, blank-line
    separated)."""
    counts: collections.Counter[str] = collections.Counter()
    stack: list[str] = []
    for line in perf_script:
        line = line.rstrip("\n")
        if not line.strip():
            if stack:
                counts[bucket(stack)] += 1
            stack = []
            continue
        if line[0] not in " \t":
            continue
        parts = line.split(None, 1)
        if len(parts) < 2:
            continue
        name = parts[1].split(" (", 1)[0].split("+0x", 1)[0]
        stack.append(("[k]" + name) if "kallsyms" in parts[1] else name)
    if stack:
        counts[bucket(stack)] += 1
    return counts


class PerfRecording:
    """``perf record -g`` on some processes from :meth:`start` to :meth:`stop`."""

    def __init__(self, pids: Iterable[int], frequency: int = 999) -> None:
        self.pids = sorted(set(pids))
        self.frequency = frequency
        self._dir = Path(tempfile.mkdtemp(prefix="pg-profile-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("perf") is not None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            ["perf", "record", "-F", str(self.frequency), "-g", "-o", str(self._dir / "perf.data"),
             "-p", ",".join(map(str, self.pids))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close(self) -> None:
        """Stop perf if it still runs (a benchmark that failed midway), and forget its data."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            self._proc.wait(timeout=120)
        self._proc = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def stop(self) -> collections.Counter[str]:
        """Samples by bucket (empty when perf could not record)."""
        if self._proc is None:
            return collections.Counter()
        self._proc.send_signal(signal.SIGINT)
        self._proc.wait(timeout=120)
        self._proc = None
        data = self._dir / "perf.data"
        try:
            if not data.exists():
                return collections.Counter()
            out = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym,dso"], capture_output=True,
                                 text=True, errors="replace", check=False, timeout=600)
            dump = os.environ.get("BENCH_PG_PROFILE_DUMP")
            if dump:  # the raw stacks too, one file per recording (for a closer look)
                Path(dump).mkdir(parents=True, exist_ok=True)
                (Path(dump) / f"{os.getpid()}-{self._dir.name}.txt").write_text(out.stdout)
            return buckets(out.stdout.splitlines())
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)


def report(counts: collections.Counter[str], cpu_ms_per_call: float) -> list[str]:
    """Lines: each bucket's share of the samples and, from the measured CPU per call, its ms."""
    total = sum(counts.values())
    if not total:
        return ["PostgreSQL's CPU by what it did: no samples (perf could not record)"]
    lines = [f"PostgreSQL's CPU by what it did ({total} samples; ms a call from the measured "
             f"{cpu_ms_per_call:.2f} ms):"]
    for name, n in counts.most_common():
        lines.append(f"  {name:28} {100 * n / total:5.1f}%  {cpu_ms_per_call * n / total:6.3f} ms")
    return lines


def server_pids(postmaster: int) -> list[int]:
    """The postmaster's children now (its backends and background processes)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == postmaster:
            pids.append(int(entry))
    return pids
