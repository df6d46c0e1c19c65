"""What a backlog costs a store: one send batch, one window count and one acknowledgement at N queued.

A source that cannot reach its destination queues messages; when the peer comes
back, every acknowledgement and every batch of the retransmission worker works
on that backlog.  Both must cost about the same at 10,000 queued as at 1,000,
or draining a backlog is quadratic.  So must a sending round's count of a
sequence's messages in flight, which a window (``max_unacknowledged``) asks
for once a round.  Reported as ratios (cost at the large backlog / cost at
the small one, median of interleaved rounds); 1.0 is flat, 10 is linear in
the backlog.

Run: .venv/bin/python bench/bench_store_backlog.py [--small 1000 --large 10000 --rounds 5]
    [--store memory|sqlite]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from wsrm_plugin.store import StorageManager, open_store

OPS = 200
#: The window a round counts its sequence's messages in flight against
WINDOW = 16


def backlog(n: int, kind: str = "memory") -> StorageManager:
    """A store with one sequence of ``n`` queued messages, the first OPS of them sent once."""
    store = open_store("memory:" if kind == "memory" else f"sqlite:///{tempfile.mkdtemp()}/backlog.db")
    with store.begin() as tx:
        tx.rms.create("k", target="http://127.0.0.1:9/", acks_to="urn:a", rm_version="v", wsa_version="w")
        tx.rms.update("k", sequence_id="sid")
        for i in range(n):
            tx.rms_messages.enqueue("k", b"x" * 200, action="a", soap_version="1.1", message_id=f"m{i}")
        for number in range(1, OPS + 1):
            tx.rms_messages.record_send_attempt("k", number, next_send_at=time.time() + 3600)
    return store


def costs(n: int, kind: str = "memory") -> tuple[float, float, float]:
    """Seconds per send batch (due_messages, 100 at a time), per count of the messages in
    flight (against a window of WINDOW) and per cumulative acknowledgement."""
    store = backlog(n, kind)
    t0 = time.perf_counter()
    for _ in range(OPS):
        with store.begin() as tx:
            tx.rms_messages.due_messages(limit=100, per_sequence=100)
    t1 = time.perf_counter()
    for _ in range(OPS):
        with store.begin() as tx:
            tx.rms_messages.count_in_flight("k", WINDOW)
    t2 = time.perf_counter()
    for number in range(1, OPS + 1):
        with store.begin() as tx:
            tx.rms_messages.mark_acked("k", [(1, number)])
    t3 = time.perf_counter()
    store.close()
    return (t1 - t0) / OPS, (t2 - t1) / OPS, (t3 - t2) / OPS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", type=int, default=1000)
    p.add_argument("--large", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    args = p.parse_args()
    rows: dict[int, list[tuple[float, float, float]]] = {args.small: [], args.large: []}
    for _ in range(args.rounds):
        for n in (args.small, args.large):
            rows[n].append(costs(n, args.store))
    for what, i in (("send batch", 0), ("window count", 1), ("acknowledgement", 2)):
        small = statistics.median(r[i] for r in rows[args.small])
        large = statistics.median(r[i] for r in rows[args.large])
        print(f"{what:16s} {small * 1e3:8.3f} ms at {args.small:>6} queued, {large * 1e3:8.3f} ms at "
              f"{args.large:>6}: ratio {large / small:5.2f} (backlog ratio {args.large / args.small:.0f})")


if __name__ == "__main__":
    main()
