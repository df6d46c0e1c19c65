"""Many sequences into one SQLite service: what each message costs the service's store file.

An SQLite store's transactions take turns on the whole file, so with many
sequences at once what bounds the service is how long each message holds the
file, not only its CPU.  This runs a reliable service on an SQLite store and a
client (memory store) in one process, sends ``--calls`` one-way messages over
``--sequences`` sequences at once over loopback HTTP, and reports per message:

* how often the service's file was taken and for how long in all (the
  ``_FileGate`` between acquire and release),
* the service's commits and the WAL fsyncs they shared (``_GroupSync``),
* the statements its store transactions ran (besides BEGIN, the in-doubt
  check and COMMIT: three per transaction),
* the process's CPU (client and service together) and the rate.

The method sleeps ``--app-ms`` (as a method that commits to its own database
waits for that commit).  These counts hold on a loaded machine; the rate does not.

Run::

    PYTHONPATH=. .venv/bin/python bench/bench_sqlite_sequences.py [--calls 1600] [--sequences 16] [--app-ms 1]
        [--deliver-apart auto|true|false]

``bench_compare.py --clients 16 --scenarios plainN,sqlite`` measures the same
against plain calls, whole processes, on a quiet machine.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from wsrm_plugin.engine import ReliableEngine, RMPolicy  # noqa: E402
from wsrm_plugin.store import sqlite as sqlite_store  # noqa: E402
from wsrm_plugin.store.sql import SqlTransaction  # noqa: E402
from bench._one_process import ACTION, Deliveries, open_sequences, payload  # noqa: E402



class _Counts:
    """The file's hold time and the statements, counted by wrapping the store's own parts."""

    def __init__(self) -> None:
        self.held = 0.0
        self.taken = 0
        self.statements = 0
        self._local = threading.local()
        gate, tx = sqlite_store._FileGate, SqlTransaction
        acquire, release, execute = gate.acquire, gate.release, tx.execute
        counts = self

        def timed_acquire(self: object, *args: object, **kwargs: object) -> None:
            acquire(self, *args, **kwargs)  # type: ignore[arg-type]
            counts._local.since = time.perf_counter()

        def timed_release(self: object) -> None:
            counts.held += time.perf_counter() - counts._local.since
            counts.taken += 1
            release(self)  # type: ignore[arg-type]

        def counted_execute(self: SqlTransaction, *args: object, **kwargs: object) -> object:
            if isinstance(self._store, sqlite_store.SqliteStore):
                counts.statements += 1
            return execute(self, *args, **kwargs)  # type: ignore[arg-type]

        gate.acquire, gate.release = timed_acquire, timed_release  # type: ignore[method-assign]
        tx.execute = counted_execute  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1600)
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--app-ms", type=float, default=1.0, help="how long the method waits per message")
    p.add_argument("--deliver-apart", choices=("auto", "true", "false"), default="auto",
                   help="RMPolicy.deliver_apart: auto (None, the default), true or false")
    args = p.parse_args(argv)
    counts = _Counts()
    delivered = Deliveries(args.app_ms)

    apart_choice = {"auto": None, "true": True, "false": False}[args.deliver_apart]
    policy = RMPolicy(deliver_on_receive=True, deliver_apart=apart_choice)

    with tempfile.TemporaryDirectory() as tmp:
        server = ReliableEngine(f"sqlite:///{tmp}/service.db", policy,
                                application=delivered.application)
        server.serve()
        server.start()
        client = ReliableEngine("memory:", RMPolicy()).start()
        try:
            url = server.endpoint_address
            open_sequences(client, url, args.sequences, delivered)
            sync = server.store._sync  # type: ignore[attr-defined]
            before = (sync.syncs, sync.commits, counts.held, counts.taken, counts.statements)
            # receipts buffered together to deliver apart, and the removals of those delivered
            apart = server.destination._apart_receipts
            apart_before = (apart.batches, apart.items)
            cpu = resource.getrusage(resource.RUSAGE_SELF)
            started = time.monotonic()
            for i in range(args.calls):
                client.send(url, payload(f"m{i}"), action=ACTION, key=f"k{i % args.sequences}")
            delivered.wait(args.sequences + args.calls)
            wall = time.monotonic() - started
            cpu_after = resource.getrusage(resource.RUSAGE_SELF)
            n = args.calls
            syncs, commits = sync.syncs - before[0], sync.commits - before[1]
            print(f"{n} one-way calls on {args.sequences} sequences, method {args.app_ms} ms: {n / wall:.0f} msg/s")
            print(f"  service per message: file taken {(counts.taken - before[3]) / n:.2f} times, "
                  f"held {(counts.held - before[2]) / n * 1e3:.3f} ms; commits {commits / n:.2f}, "
                  f"fsyncs {syncs / n:.2f}; statements {(counts.statements - before[4]) / n:.1f} (+3 a transaction)")
            batches, items = apart.batches - apart_before[0], apart.items - apart_before[1]
            print(f"  receipts buffered to deliver apart and removals from the buffer: {items / n:.2f} per "
                  f"message, in {batches / n:.2f} transactions ({items / max(batches, 1):.1f} a transaction)")
            used = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu.ru_utime + cpu.ru_stime)
            print(f"  process CPU (client and service) {used / n * 1e3:.2f} ms/msg; "
                  f"load average {Path('/proc/loadavg').read_text().split()[0]}")
        finally:
            client.stop(timeout=5)
            server.stop(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
