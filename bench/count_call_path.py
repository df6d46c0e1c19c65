"""Instructions per request-reply call (callgrind), by thread: the caller's, the service's.

Wall and CPU times on a shared machine wander; instruction counts do not.  The calls of
``bench_call_path.py`` (a reliable zeep client and spyne service in one process, over loopback
HTTP) run under ``valgrind --tool=callgrind --separate-threads=yes``, once with ``--few`` and
once with ``--many`` calls; the difference, divided by the calls between, is the cost of one
call without start-up, for each thread (waitress's threads summed).  What makes this the path a
real run takes, not valgrind's:

* the benchmark's own counting is off (it adds work to every store commit and wake-up);
* the workers' poll and retransmission intervals are 60 s: only what the calls do is counted;
* a request waits up to 60 s for its caller's thread to send it (``caller_send_grace``, 10 ms by
  default): under valgrind a caller could take longer than 10 ms to come back for it, and the
  sender's thread then sent it and read the reply, which moved the count between threads from
  run to run with the machine's load (0.03 to 0.16 M a call on the client's sender);
* the application counts as quick (``QUICK_APPLICATION``): under valgrind every call is slow,
  and a slow application is delivered by the invoker's thread instead of on receipt;
* spyne's collection once a second is off (under valgrind it ran every ~15 messages).

Run: .venv/bin/python bench/count_call_path.py [--store memory|sqlite|xa1] [--few 20] [--many 120]
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def run(store: str, calls: int) -> None:
    """``calls`` measured calls of bench_call_path (what valgrind runs); prints the threads in
    the order they started (valgrind numbers them so)."""
    sys.path.insert(0, str(BENCH))
    import bench_call_path

    from wsrm_plugin.engine import invoker

    invoker.QUICK_APPLICATION = 1e9  # type: ignore[misc]
    _no_timed_collections()
    bench_call_path._instrument = lambda: None  # type: ignore[assignment]
    started = ["MainThread"]
    start = threading.Thread.start

    def named_start(self: threading.Thread) -> None:
        started.append(self.name)
        start(self)
    threading.Thread.start = named_start  # type: ignore[method-assign]
    try:
        bench_call_path.main(["--store", store, "--calls", str(calls), "--no-timeline",
                              "--policy", "poll_interval=60,base_retransmission_interval=60,caller_send_grace=60"])
    finally:
        print("THREADS " + " ".join(started), flush=True)


def _no_timed_collections() -> None:
    """spyne runs ``gc.collect()`` after a request when a second has passed since the last
    (``spyne.const.MIN_GC_INTERVAL``): once per ~700 messages in a real run, but once per ~15
    under valgrind, where it was ~5% of the count and moved with how long the run took.  Off
    while counting."""
    import spyne.const

    spyne.const.MIN_GC_INTERVAL = float("inf")


def instructions(store: str, calls: int) -> dict[str, int]:
    """Instructions by thread name (waitress's and the HTTP loop's numbered threads as one)."""
    with tempfile.TemporaryDirectory() as tmp:
        # one hash seed for every run: dict probes (and so the count) move a little with it
        done = subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes",
                               f"--callgrind-out-file={tmp}/out", sys.executable, __file__,
                               "--run", store, "--calls", str(calls)],
                              check=True, capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": "0"})
        names = next(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("THREADS "))
        by_thread: collections.Counter[str] = collections.Counter()
        for path in glob.glob(f"{tmp}/out-*"):  # one file per thread ("out" itself stays empty)
            with open(path) as f:
                text = f.read()
            thread, totals = re.search(r"^thread: (\d+)", text, re.M), re.search(r"^totals: (\d+)", text, re.M)
            if thread is None or totals is None:
                continue
            number = int(thread.group(1))
            name = names[number - 1] if number <= len(names) else f"thread {number}"
            name = re.sub(r"-\d+$", "", name) if name.startswith(("waitress", "wsrm-http")) else name
            by_thread[name] += int(totals.group(1))
        return by_thread


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=("memory", "sqlite", "xa1"), default="memory",
                   help="xa1: PostgreSQL stores under XA (bench_call_path's; PostgreSQL's own processes "
                        "run outside valgrind: the count is the two Python sides')")
    p.add_argument("--few", type=int, default=20)
    p.add_argument("--many", type=int, default=120)
    p.add_argument("--run", help=argparse.SUPPRESS)
    p.add_argument("--calls", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run:
        run(args.run, args.calls)
        return
    few, many = instructions(args.store, args.few), instructions(args.store, args.many)
    calls = args.many - args.few
    per = {name: (many[name] - few.get(name, 0)) / calls for name in many}
    print(f"{args.store}: {sum(per.values()) / 1e6:.3f} M instructions per call, both sides")
    for name, n in sorted(per.items(), key=lambda kv: -kv[1]):
        if abs(n) >= 1000:
            print(f"  {name:32} {n / 1e6:.3f} M")


if __name__ == "__main__":
    main()
