"""Throughput and memory of the WS-RM engine, engine to engine on loopback, against plain HTTP.

Two measurements, each from fresh processes and fresh stores:

* throughput: ``--count`` (10,000) one-way messages from a sending engine
  process to a receiving engine process, no loss, for each store (memory,
  SQLite files, PostgreSQL on a throwaway server); and, in the same run, the
  same application envelopes POSTed plainly, one after the other on one
  keep-alive connection, to a WSGI app served by the same HTTP server
  (waitress) that only parses them.  The clock runs from the first
  ``send`` (enqueueing is part of the cost) to the moment the receiver's
  application got the last message (``time.monotonic`` is system-wide, so
  both processes share it).  Reported: delivered messages/s and the ratio to
  plain.  A run where any message was missing, repeated or out of order is
  reported FAILED.
* memory: ``--rss-count`` (100,000) messages through ONE sequence (memory
  stores), the sender keeping at most ``--backlog`` messages unacknowledged
  (as an application that cannot outrun the network must); VmRSS of the
  sending and the receiving process when 10k, 50k and 100k were delivered,
  and their peaks (VmHWM).  A leak shows as RSS growing with the messages
  that flowed; the backlog bounds what is legitimately held.

Run::

    .venv/bin/python bench/bench_engine.py [--count 10000] [--rss-count 100000]
        [--stores memory,sqlite,postgresql] [--no-rss] [--profile DIR]

``--profile DIR`` writes yappi profiles (all threads, CPU time) of both
engine processes per store (``DIR/<store>-<sender|receiver>.pstats``).
"""

from __future__ import annotations

import argparse
import http.client
import logging
import multiprocessing as mp
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engine.support import ACTION, item_text, payload  # noqa: E402
from wsrm_plugin.engine import RMPolicy  # noqa: E402

log = logging.getLogger("bench_engine")


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


# --------------------------------------------------------------------------- #
# processes


def _profiler(profile: str | None) -> Any:
    if not profile:
        return None
    import yappi

    yappi.set_clock_type("cpu")
    yappi.start(builtins=False)
    return yappi


def _save_profile(yappi: Any, path: str | None) -> None:
    if yappi is None or path is None:
        return
    yappi.stop()
    yappi.get_func_stats().save(path, type="pstat")


def receiver(store: str, conn: Any, delivered: Any, last_at: Any, count: int, profile: str | None) -> None:
    """A receiving engine whose application checks order and counts; stops when told."""
    from wsrm_plugin.engine import ReliableEngine

    yappi = _profiler(profile)
    state = {"next": 0, "bad": 0}

    def application(envelope: bytes, context: Any) -> None:
        expected = f"m{state['next']}"
        if item_text(envelope) != expected:
            state["bad"] += 1
        state["next"] += 1
        last_at.value = time.monotonic()
        delivered.value += 1  # one invoker thread: the only writer

    engine = ReliableEngine(store, RMPolicy(), application=application, name="receiver")
    server = engine.serve()
    engine.start()
    conn.send(server.url)
    conn.recv()  # stop
    engine.stop(timeout=10)
    _save_profile(yappi, profile)
    conn.send({"bad": state["bad"], "delivered": state["next"], "pid": os.getpid()})


def unacked(engine: Any) -> int:
    with engine.store.begin() as tx:
        return tx.rms_messages.count_unacked()


def sender(store: str, target: str, count: int, backlog: int | None, conn: Any, profile: str | None) -> None:
    """A sending engine: waits for "go", enqueues ``count`` messages on one sequence, closes it."""
    from wsrm_plugin.engine import ReliableEngine

    yappi = _profiler(profile)
    engine = ReliableEngine(store, RMPolicy(), name="sender").start()
    prebuilt = [payload(f"m{i}") for i in range(count)] if backlog is None else None
    conn.send("ready")
    conn.recv()  # go
    started = time.monotonic()
    for i in range(count):
        if backlog is not None and i % 100 == 0:
            while unacked(engine) > backlog:
                time.sleep(0.005)
        engine.send(target, prebuilt[i] if prebuilt is not None else payload(f"m{i}"), action=ACTION)
    enqueued = time.monotonic()
    engine.close(target)
    # not engine.wait_until: its status() every 20 ms reads every stored message, which costs
    # the engine's workers more CPU than it measures
    deadline = time.monotonic() + 600
    while engine.store.status().rms and time.monotonic() < deadline:
        time.sleep(0.2)
    status = engine.status()
    engine.stop(timeout=10)
    _save_profile(yappi, profile)
    conn.send({"started": started, "enqueued": enqueued, "retransmissions": status.retransmissions,
               "messages_sent": status.messages_sent, "pid": os.getpid()})
    conn.recv()  # exit: stay until then, so the parent can still read this process's RSS


def plain_server(conn: Any) -> None:
    """The WSGI app that only parses what it is given, on the engine's HTTP server (waitress)."""
    from wsrm_plugin.engine import HttpServer
    from wsrm_plugin.wire import parse_envelope

    count = 0

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        nonlocal count
        length = int(environ.get("CONTENT_LENGTH") or 0)
        parse_envelope(environ["wsgi.input"].read(length))
        count += 1
        start_response("202 Accepted", [("Content-Length", "0")])
        return []

    server = HttpServer(app, "127.0.0.1", 0, threads=4, path="/").start()
    conn.send(server.url)
    conn.recv()
    server.stop(10)
    conn.send(count)


# --------------------------------------------------------------------------- #
# measurements


def run_plain(count: int) -> float:
    parent, child = mp.Pipe()
    proc = mp.Process(target=plain_server, args=(child,), daemon=True)
    proc.start()
    url = parent.recv()
    parts = urlsplit(url)
    envelopes = [payload(f"m{i}") for i in range(count)]
    headers = {"Content-Type": "application/soap+xml; charset=utf-8"}
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    t0 = time.monotonic()
    for body in envelopes:
        connection.request("POST", parts.path or "/", body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        if response.status != 202:
            raise RuntimeError(f"plain POST answered {response.status}")
    elapsed = time.monotonic() - t0
    connection.close()
    parent.send("stop")
    served = parent.recv()
    proc.join(10)
    if served != count:
        raise RuntimeError(f"plain server parsed {served} of {count}")
    return count / elapsed


def run_engine(store_pair: tuple[str, str], count: int, *, backlog: int | None = None,
               samples: tuple[int, ...] = (), profile_prefix: str | None = None) -> dict[str, Any]:
    recv_store, send_store = store_pair
    delivered, last_at = mp.Value("q", 0, lock=False), mp.Value("d", 0.0, lock=False)
    r_parent, r_child = mp.Pipe()
    s_parent, s_child = mp.Pipe()
    rproc = mp.Process(target=receiver, args=(recv_store, r_child, delivered, last_at, count,
                                              profile_prefix and f"{profile_prefix}-receiver.pstats"), daemon=True)
    rproc.start()
    url = r_parent.recv()
    sproc = mp.Process(target=sender, args=(send_store, url, count, backlog, s_child,
                                            profile_prefix and f"{profile_prefix}-sender.pstats"), daemon=True)
    sproc.start()
    assert s_parent.recv() == "ready"
    rss: list[tuple[int, int, int]] = []
    pending = list(samples)
    s_parent.send("go")
    deadline = time.monotonic() + 1800
    while delivered.value < count and time.monotonic() < deadline:
        if pending and delivered.value >= pending[0]:
            rss.append((pending.pop(0), rss_kb(sproc.pid), rss_kb(rproc.pid)))
        if not rproc.is_alive():
            break
        time.sleep(0.01)
    if pending and delivered.value >= pending[0]:
        rss.append((pending.pop(0), rss_kb(sproc.pid), rss_kb(rproc.pid)))
    peaks = (rss_kb(sproc.pid, "VmHWM"), rss_kb(rproc.pid, "VmHWM")) if rproc.is_alive() and sproc.is_alive() else None
    sent = s_parent.recv()
    s_parent.send("exit")
    r_parent.send("stop")
    received = r_parent.recv()
    sproc.join(30)
    rproc.join(30)
    elapsed = last_at.value - sent["started"]
    ok = received["delivered"] == count and received["bad"] == 0
    return {"rate": count / elapsed if elapsed > 0 else 0.0, "ok": ok, "received": received, "sent": sent,
            "rss": rss, "peaks": peaks, "elapsed": elapsed}


def stores(kind: str, tmp: Path, pg: Any) -> tuple[str, str]:
    if kind == "memory":
        return "memory:", "memory:"
    if kind == "sqlite":
        tag = uuid.uuid4().hex[:8]
        return f"sqlite:///{tmp}/recv-{tag}.db", f"sqlite:///{tmp}/send-{tag}.db"
    if kind == "postgresql":
        tag = uuid.uuid4().hex[:8]
        return ("postgresql:" + pg.create_database(f"bench_recv_{tag}"),
                "postgresql:" + pg.create_database(f"bench_send_{tag}"))
    raise ValueError(kind)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--stores", default="memory,sqlite,postgresql")
    p.add_argument("--rss-count", type=int, default=100_000)
    p.add_argument("--backlog", type=int, default=1000, help="unacknowledged messages the RSS sender allows")
    p.add_argument("--no-rss", action="store_true")
    p.add_argument("--no-throughput", action="store_true")
    p.add_argument("--profile", help="directory for yappi profiles of the engine processes")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    kinds = [k.strip() for k in args.stores.split(",") if k.strip()]
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)

    pg = None
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        try:
            if "postgresql" in kinds and not args.no_throughput:
                from wsrm_plugin.tools.pgserver import ThrowawayPostgres

                pg = ThrowawayPostgres()
                pg.start()
            if not args.no_throughput:
                plain = run_plain(args.count)
                print(f"plain HTTP (waitress, keep-alive, parse only): {plain:8.0f} msg/s", flush=True)
                for kind in kinds:
                    prefix = os.path.join(args.profile, kind) if args.profile else None
                    result = run_engine(stores(kind, Path(tmp), pg), args.count, profile_prefix=prefix)
                    failed |= not result["ok"]
                    verdict = "" if result["ok"] else f"  FAILED {result['received']}"
                    print(f"engine {kind:<10} {args.count} messages: {result['rate']:8.0f} msg/s "
                          f"(ratio to plain {result['rate'] / plain:.2f}; enqueue took "
                          f"{result['sent']['enqueued'] - result['sent']['started']:.1f} s; "
                          f"{result['sent']['retransmissions']} retransmissions){verdict}", flush=True)
            if not args.no_rss:
                marks = tuple(m for m in (10_000, 50_000, 100_000) if m <= args.rss_count)
                if args.rss_count not in marks:
                    marks = (*marks, args.rss_count)
                result = run_engine(("memory:", "memory:"), args.rss_count, backlog=args.backlog, samples=marks)
                failed |= not result["ok"]
                print(f"RSS, memory stores, {args.rss_count} messages on one sequence "
                      f"({result['rate']:.0f} msg/s, backlog <= {args.backlog}):", flush=True)
                for mark, s_kb, r_kb in result["rss"]:
                    print(f"  after {mark:>7} delivered: sender {s_kb / 1024:7.1f} MiB, "
                          f"receiver {r_kb / 1024:7.1f} MiB")
                if result["peaks"]:
                    print(f"  peak (VmHWM): sender {result['peaks'][0] / 1024:.1f} MiB, "
                          f"receiver {result['peaks'][1] / 1024:.1f} MiB")
                if not result["ok"]:
                    print(f"  FAILED {result['received']}")
        finally:
            if pg is not None:
                pg.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
