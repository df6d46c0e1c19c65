"""Instructions a message at 16 sequences, by side (callgrind): the service's threads, the client's.

``bench_sequences_cpu.py`` runs both sides in one process; under callgrind with
``BENCH_CALLGRIND_ROUNDS=1`` its dump holds the measured rounds alone, but as one count.  This
runs it under ``valgrind --tool=callgrind --separate-threads=yes`` (one dump a thread) and sums
the threads by side, by name as ``bench_sequences_cpu`` does (waitress's, the service engine's,
its HTTP loop: the service; the rest: the client).  Valgrind numbers a thread by the lowest slot
free when it starts (a slot an ended thread left is taken again), so the run records every
thread's start and end and plays them back to name the slots; a slot two threads of different
sides held in turn is reported apart (``mixed``: it should stay 0, the service's threads start
first and live to the end).  The counts depend on the machine's load (waits, wake-ups, batches):
compare trees run side by side, at the same time::

    .venv/bin/python bench/count_sequences_sides.py [--store memory|sqlite|plain] [--calls 800]
        [--tree DIR]  (another checkout's bench_sequences_cpu and code, e.g. main's)
        [--knobs one_way_caller_sends=false]  (RMPolicy knobs of both sides, as bench_compare's ~)
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
from typing import Any

BENCH = Path(__file__).resolve().parent


def run(tree: Path, args: list[str]) -> None:
    """``bench_sequences_cpu.main(args)`` of ``tree`` (what valgrind runs); prints the threads each
    valgrind slot held, in order."""
    for path in (tree, tree / "bench"):
        sys.path.insert(0, str(path))
    events: list[tuple[bool, str]] = []
    lock = threading.Lock()
    start = threading.Thread.start

    def recorded_start(self: threading.Thread) -> None:
        run_body = self.run

        def body() -> None:
            try:
                run_body()
            finally:
                with lock:
                    events.append((False, self.name))
        self.run = body  # type: ignore[method-assign]
        with lock:
            events.append((True, self.name))
        start(self)
    threading.Thread.start = recorded_start  # type: ignore[method-assign]
    import bench_sequences_cpu

    try:
        bench_sequences_cpu.main(args)
    finally:
        held: dict[int, str] = {1: "MainThread"}
        slots: dict[int, list[str]] = collections.defaultdict(list, {1: ["MainThread"]})
        for started, name in events:
            if started:
                slot = min(n for n in range(1, len(held) + 2) if n not in held)
                held[slot] = name
                slots[slot].append(name)
            else:
                slot = next((n for n, who in held.items() if who == name), 0)
                held.pop(slot, None)
        print("SLOTS " + ";".join(f"{n}=" + ",".join(names) for n, names in sorted(slots.items())), flush=True)


def instructions(tree: Path, store: str, calls: int, policy: str = "") -> dict[str, int]:
    """The measured rounds' instructions by side: service, client, mixed."""
    sys.path.insert(0, str(tree / "bench"))
    from bench_sequences_cpu import _SERVICE_THREADS

    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes",
                               f"--callgrind-out-file={tmp}/out", sys.executable, str(Path(__file__).resolve()),
                               "--run", str(tree), "--store", store, "--calls", str(calls),
                               "--policy", "+".join(["base_retransmission_interval=60", *filter(None, [policy])])],
                              check=True, capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": "0", "BENCH_CALLGRIND_ROUNDS": "1"}, cwd=tmp)
        print(done.stdout, end="", flush=True)
        found = re.search(r"^SLOTS (.*)$", done.stdout, re.M)
        if found is None:
            raise SystemExit(f"the run named no threads: {done.stdout[-2000:]}")
        slots = {int(n): names.split(",") for n, names in (part.split("=", 1) for part in found.group(1).split(";"))}
        sides: collections.Counter[str] = collections.Counter()
        for path in glob.glob(f"{tmp}/out.*-*"):  # the dump after the last round, a file a thread
            text = Path(path).read_text()
            thread, totals = re.search(r"^thread: (\d+)", text, re.M), re.search(r"^totals: (\d+)", text, re.M)
            if thread is None or totals is None:
                continue
            kinds = {"service" if name.startswith(_SERVICE_THREADS) else "client"
                     for name in slots.get(int(thread.group(1)), ["?"])}
            sides[kinds.pop() if len(kinds) == 1 else "mixed"] += int(totals.group(1))
        return dict(sides)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=("memory", "sqlite", "plain"), default="memory")
    p.add_argument("--calls", type=int, default=800)
    p.add_argument("--tree", type=Path, default=BENCH.parent, help="the checkout whose code runs")
    p.add_argument("--knobs", default="", help="RMPolicy knobs of both sides, bench_compare's variant syntax "
                   "(one_way_caller_sends=false+send_batch=20)")
    p.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    args, rest = p.parse_known_args()
    if args.run:
        run(args.run, ["--store", args.store, "--calls", str(args.calls), *rest])
        return
    sides: dict[str, Any] = instructions(args.tree.resolve(), args.store, args.calls, args.knobs)
    per = {side: n / args.calls / 1e6 for side, n in sides.items()}
    service, client, mixed = (per.get(side, 0.0) for side in ("service", "client", "mixed"))
    print(f"{args.store}{'~' + args.knobs if args.knobs else ''} ({args.tree}): {sum(per.values()):.3f} M instructions a message: service "
          f"{service:.3f} M, client {client:.3f} M, mixed {mixed:.3f} M")


if __name__ == "__main__":
    main()
