"""Issue 33 in one command: the cost as the work grows, every scenario against its baseline.

Runs, one after the other (each its own benchmark, its scenarios interleaved in
rounds, medians reported), and prints every aim's line at the end:

1. 16 sequences at once (``bench_compare.py --clients 16``): memory and SQLite
   against plain calls from 16 threads, XA in one and across two databases
   against the outbox with 16 relays;
2. request-reply latency (``bench_compare.py --latency``): p50 and p99 of
   sequential calls, plain, memory, SQLite, XA in one database;
3. payload size (``bench_compare.py --note``): 64 KiB and 1 MiB one-way calls,
   with each process's memory per message;
4. a backlog draining when the peer returns (``bench_backlog.py``), each store;
5. the transaction manager's one-phase client CPU above plain BEGIN/COMMIT
   (``bench_txmanager.py``).

Run::

    .venv/bin/python bench/bench_growth.py            # the full run (about an hour on 2 cores)
    .venv/bin/python bench/bench_growth.py --quick    # fewer calls and a smaller backlog (~15 min)
    .venv/bin/python bench/bench_growth.py --only latency,backlog

The full run takes more rounds where the machine's drift between rounds is widest against
what a session's change moves: 7 for latency (the p50 ratios of one run's rounds spread over
15-25% on a quiet 2-core machine) and 5 for 16 sequences; ``--quick`` keeps 3.

Every benchmark's whole output goes to ``--out`` (a directory, one file each) as
well as to the terminal; wall figures are only worth reading on a quiet machine
(the machine's load average is printed before and after each part).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

#: name -> (full arguments, quick arguments); every rate figure is a median of at least 3 rounds
PARTS: dict[str, tuple[list[str], list[str]]] = {
    "sequences": (["bench_compare.py", "--clients", "16", "--calls", "3200", "--rounds", "5", "--no-strace"],
                  ["bench_compare.py", "--clients", "16", "--calls", "1600", "--rounds", "3", "--no-strace"]),
    "latency": (["bench_compare.py", "--latency", "--calls", "400", "--rounds", "7", "--no-strace"],
                ["bench_compare.py", "--latency", "--calls", "200", "--rounds", "3", "--no-strace"]),
    "payload-64k": (["bench_compare.py", "--note", "65536", "--calls", "400", "--rounds", "3", "--no-strace"],
                    ["bench_compare.py", "--note", "65536", "--calls", "150", "--rounds", "3", "--no-strace"]),
    "payload-1m": (["bench_compare.py", "--note", "1048576", "--calls", "100", "--rounds", "3", "--no-strace"],
                   ["bench_compare.py", "--note", "1048576", "--calls", "40", "--rounds", "3", "--no-strace"]),
    "backlog": (["bench_backlog.py", "--small", "1000", "--large", "100000", "--rounds", "3"],
                ["bench_backlog.py", "--small", "1000", "--large", "10000", "--rounds", "3"]),
    "txmanager": (["bench_txmanager.py", "--blocks", "9"], ["bench_txmanager.py", "--blocks", "5"]),
}

#: the lines of each benchmark's output that hold its aims (and what they are measured against)
_SUMMARY_FROM = ("aims", "latency of a request-reply call", "medians, and the aim", "one-database tx:",
                 "one-database, one block", "plain + ", "one-database, no server")


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def run_part(name: str, argv: list[str], out: Path) -> list[str]:
    """Run one benchmark, echoing and keeping its output; the summary lines."""
    cmd = [sys.executable, str(BENCH / argv[0]), *argv[1:]]
    print(f"== {name}: {' '.join(argv)}  (load average {_load()})", flush=True)
    started = time.monotonic()
    lines: list[str] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc, \
            open(out / f"{name}.txt", "w", encoding="utf-8") as keep:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            keep.write(line)
            lines.append(line.rstrip("\n"))
    print(f"== {name} took {time.monotonic() - started:.0f} s, exit {proc.returncode} (load average {_load()})",
          flush=True)
    summary: list[str] = []
    taking = False
    for line in lines:
        if line.startswith(_SUMMARY_FROM):
            taking = True  # a heading and the indented lines under it, or a line of its own
        elif taking and not line.startswith("  "):
            taking = False
        if taking:
            summary.append(line)
    if proc.returncode:
        summary.append(f"  ({name} FAILED: exit {proc.returncode}; see {out / (name + '.txt')})")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer calls and a backlog of 10,000 (about 15 min)")
    p.add_argument("--only", default="", help=f"comma-separated parts: {', '.join(PARTS)}")
    p.add_argument("--out", default="", help="directory for each benchmark's whole output")
    args = p.parse_args(argv)
    parts = [s.strip() for s in args.only.split(",") if s.strip()] or list(PARTS)
    unknown = set(parts) - set(PARTS)
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}: choose among {', '.join(PARTS)}")
    out = Path(args.out or f"bench-growth-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    print(f"issue 33 benchmark ({'quick' if args.quick else 'full'}): {', '.join(parts)}; outputs in {out}; "
          f"{os.cpu_count()} CPUs, load average {_load()}", flush=True)
    summaries: dict[str, list[str]] = {}
    failed = 0
    for name in parts:
        full, quick = PARTS[name]
        summaries[name] = run_part(name, quick if args.quick else full, out)
        failed += any("FAILED" in line for line in summaries[name])
    print("\n===== issue 33: the aims =====")
    for name, lines in summaries.items():
        print(f"-- {name}")
        for line in lines:
            print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
