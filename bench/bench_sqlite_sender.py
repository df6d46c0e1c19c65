"""Many callers sending on a client's SQLite store: what each message costs the client's store file.

The sending side of ``bench_sqlite_sequences.py``: a client engine on an SQLite store, ``--sequences``
calling threads each enqueuing on a sequence of its own (one-way messages), a service in memory
in the same process over loopback HTTP.  Per message it reports the client's store transactions
by what opened them (the callers' enqueues, the sender's claim, its acknowledgements, control
messages...), the statements they ran by kind (besides each transaction's BEGIN, its look for
in-doubt branches and its COMMIT), and the commits and WAL fsyncs.  Counts, not times: they hold
on a loaded machine (the rate printed does not).

Run::

    PYTHONPATH=. .venv/bin/python bench/bench_sqlite_sender.py [--calls 1600] [--sequences 16]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from wsrm_plugin.engine import ReliableEngine, RMPolicy  # noqa: E402
from wsrm_plugin.store import sqlite as sqlite_store  # noqa: E402
from wsrm_plugin.store.sql import SqlTransaction  # noqa: E402
from bench._one_process import ACTION, Deliveries, open_sequences, payload  # noqa: E402

#: The engine's functions a client transaction is named after (the innermost on its stack).
ORIGINS = ("_claim", "_flush_acks", "_flush_ack", "_enqueue_outgoing", "send_for_caller", "_apply_callers_acks",
           "_control", "_reclaim", "_make_due", "_hold", "_acknowledge_replies", "_keep_alive", "step")


def _origin() -> str:
    names = [f.name for f in traceback.extract_stack(limit=40)]
    for name in reversed(names):
        if name in ORIGINS:
            return name
    return "/".join(names[-6:-2])


class _Counts:
    """The client store's transactions and statements, counted by wrapping the store's own parts."""

    def __init__(self, path: str) -> None:
        self.transactions: collections.Counter[str] = collections.Counter()
        self.statements: collections.Counter[tuple[str, str]] = collections.Counter()
        self._lock = threading.Lock()
        execute, attach = SqlTransaction.execute, sqlite_store.SqliteStore._attach
        counts = self

        def counted_execute(self: SqlTransaction, sql: str, *args: object, **kwargs: object) -> object:
            if getattr(self._store, "path", None) == path:
                words = sql.split()
                with counts._lock:
                    counts.statements[(_origin(), " ".join(words[:4])[:60])] += 1
            return execute(self, sql, *args, **kwargs)  # type: ignore[arg-type]

        def counted_attach(self: sqlite_store.SqliteStore, tx: SqlTransaction, **kwargs: object) -> None:
            if self.path == path:
                with counts._lock:
                    counts.transactions[_origin()] += 1
            attach(self, tx, **kwargs)  # type: ignore[arg-type]

        SqlTransaction.execute = counted_execute  # type: ignore[method-assign]
        sqlite_store.SqliteStore._attach = counted_attach  # type: ignore[method-assign]

    def clear(self) -> None:
        with self._lock:
            self.transactions.clear()
            self.statements.clear()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1600)
    p.add_argument("--sequences", type=int, default=16)
    args = p.parse_args(argv)
    delivered = Deliveries()

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp, "client.db").resolve())
        counts = _Counts(path)
        server = ReliableEngine("memory:", RMPolicy(), application=delivered.application)
        server.serve()
        server.start()
        client = ReliableEngine(f"sqlite:///{path}", RMPolicy()).start()
        try:
            url = server.endpoint_address
            open_sequences(client, url, args.sequences, delivered)
            while client.status().unacked:
                time.sleep(0.01)
            counts.clear()
            sync = client.store._sync  # type: ignore[attr-defined]
            before = (sync.syncs, sync.commits)
            per = args.calls // args.sequences
            n = per * args.sequences

            def caller(k: int) -> None:
                for i in range(per):
                    client.send(url, payload(f"m{i}"), action=ACTION, key=f"k{k}")

            threads = [threading.Thread(target=caller, args=(k,)) for k in range(args.sequences)]
            started = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            delivered.wait(args.sequences + n)
            while client.status().unacked:  # the last acknowledgements applied
                time.sleep(0.01)
            wall = time.monotonic() - started
            syncs, commits = sync.syncs - before[0], sync.commits - before[1]
            print(f"{n} one-way calls from {args.sequences} threads, a sequence each: {n / wall:.0f} msg/s "
                  f"(load average {Path('/proc/loadavg').read_text().split()[0]})")
            print(f"  client per message: commits {commits / n:.2f}, fsyncs {syncs / n:.2f}, statements "
                  f"{sum(counts.statements.values()) / n:.2f} (+3 a transaction)")
            print("  transactions per message, by what opened them:")
            for origin, count in counts.transactions.most_common():
                print(f"    {count / n:6.3f}  {origin}")
            print("  statements per message:")
            for (origin, statement), count in counts.statements.most_common(20):
                print(f"    {count / n:6.3f}  {origin:18s} {statement}")
        finally:
            client.stop(timeout=5)
            server.stop(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
