"""How fast a backlog drains when the peer returns: N queued one-way messages, each store.

A source whose peer is down queues what its application sends; when the peer
comes back, the sender drains the backlog.  If a send batch or an
acknowledgement cost more as the backlog grows, draining N messages costs N
squared: the rate at 100,000 queued falls far below the rate at 1,000.  The
aim (issue 33): the large backlog drains within 20% of the small one's rate.

For each store (``memory``, ``sqlite``, ``postgresql``: the same kind on both
sides, no transaction manager) and each backlog size, the client engine's
store is filled while the service is down (in transactions of 5,000, outside
the measurement), the service process starts, then the client's engine; the
rate is the messages delivered to the service's application over the time
from the client's start to the last delivery (the first delivery's time is
printed too).  Sizes and stores are interleaved within each round; the
figures are medians of the rounds.

Run::

    .venv/bin/python bench/bench_backlog.py [--small 1000] [--large 100000] [--rounds 3]
        [--stores memory,sqlite,postgresql]

The client's CPU per message is printed beside each rate (this process's, the
client engine's only: the service runs in a process of its own).
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ENVELOPE = (b'<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/"><s:Header/><s:Body>'
            b'<order xmlns="urn:bench">%d</order></s:Body></s:Envelope>')
ACTION = "urn:bench:order"
FILL = 5000


def _policy() -> Any:
    from wsrm_plugin.engine import RMPolicy

    return RMPolicy(soap_version="1.1")


def server_role(args: argparse.Namespace) -> int:
    """The service: counts deliveries, prints each thousandth's time, and the last one's."""
    from wsrm_plugin.engine import ReliableEngine

    lock = threading.Lock()
    seen = {"count": 0, "first": 0.0}

    def application(envelope: bytes, context: Any) -> None:
        with lock:
            seen["count"] += 1
            now = time.time()
            if seen["count"] == 1:
                seen["first"] = now
                print(f"FIRST {now}", flush=True)
            if seen["count"] == args.expect:
                print(f"LAST {now}", flush=True)

    engine = ReliableEngine(args.store_url, _policy(), application=application, name="backlog-server")
    engine.serve("127.0.0.1", args.port)
    engine.start()
    print("READY", flush=True)
    sys.stdin.readline()
    engine.stop(timeout=5)
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _store_urls(kind: str, tmp: Path, pg: Any, tag: str) -> tuple[str, str]:
    if kind == "memory":
        return "memory:", "memory:"
    if kind == "sqlite":
        return f"sqlite:///{tmp}/client-{tag}.db", f"sqlite:///{tmp}/server-{tag}.db"
    return ("postgresql:" + pg.create_database(f"cli_{tag}"), "postgresql:" + pg.create_database(f"srv_{tag}"))


def drain(kind: str, queued: int, tmp: Path, pg: Any, tag: str) -> dict[str, float]:
    """Fill a client store with ``queued`` messages for a service that is down, start the service
    and the client; the drain's figures."""
    from wsrm_plugin.engine import ReliableEngine
    from wsrm_plugin.engine.envelopes import prepare_outgoing

    client_url, server_url = _store_urls(kind, tmp, pg, tag)
    port = _free_port()
    target = f"http://127.0.0.1:{port}/"
    client = ReliableEngine(client_url, _policy(), name="backlog-client")
    policy = client.policy
    for start in range(0, queued, FILL):  # outside the measurement: the application's backlog
        with client.store.begin() as tx:
            for i in range(start, min(queued, start + FILL)):
                outgoing = prepare_outgoing(ENVELOPE % i, to=target, action=ACTION, message_id=None, reply_to=None,
                                            relates_to=None, wsa=policy.addressing,
                                            max_size=policy.max_message_size)
                client.source._enqueue_outgoing(tx, (target, "backlog", False), outgoing)
    server = subprocess.Popen(
        [sys.executable, __file__, "--role", "server", "--store-url", server_url, "--port", str(port),
         "--expect", str(queued)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert server.stdout is not None and server.stdin is not None
    try:
        if server.stdout.readline().strip() != "READY":
            raise RuntimeError("the service did not start")
        cpu0, t0 = _cpu(), time.time()
        client.start()
        first = last = 0.0
        for line in server.stdout:
            word, _, value = line.strip().partition(" ")
            if word == "FIRST":
                first = float(value)
            elif word == "LAST":
                last = float(value)
                break
        cpu = _cpu() - cpu0
        if not last:
            raise RuntimeError("the service ended before the last delivery")
        return {"rate": queued / (last - t0), "first_after": first - t0, "seconds": last - t0,
                "client_cpu_us": 1e6 * cpu / queued}
    finally:
        client.stop(timeout=5)
        server.stdin.write("stop\n")
        server.stdin.flush()
        server.wait(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=("coordinator", "server"), default="coordinator")
    p.add_argument("--small", type=int, default=1000)
    p.add_argument("--large", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--stores", default="memory,sqlite,postgresql")
    p.add_argument("--store-url", default="")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--expect", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.role == "server":
        return server_role(args)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    from wsrm_plugin.tools.pgserver import ThrowawayPostgres

    pg = ThrowawayPostgres(max_connections=100).start() if "postgresql" in stores else None
    tmp = Path(tempfile.mkdtemp(prefix="bench-backlog-"))
    print(f"backlog drain: {args.small} and {args.large} queued one-way messages, {args.rounds} interleaved "
          f"round(s); rate = messages / (client start .. last delivery)", flush=True)
    figures: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for round_no in range(1, args.rounds + 1):
            print(f"round {round_no}", flush=True)
            for kind in stores:
                for queued in (args.small, args.large):
                    got = drain(kind, queued, tmp, pg, f"{kind[:3]}{queued}r{round_no}")
                    figures.setdefault((kind, queued), []).append(got)
                    print(f"  {kind:10s} {queued:>7} queued: {got['rate']:7.1f} msg/s ({got['seconds']:.1f} s, "
                          f"first after {1000 * got['first_after']:.0f} ms), client CPU "
                          f"{got['client_cpu_us']:.0f} us/msg", flush=True)
        print("medians, and the aim (issue 33): the large backlog drains at >= 0.8 of the small one's rate")
        for kind in stores:
            small = statistics.median(f["rate"] for f in figures[(kind, args.small)])
            large = statistics.median(f["rate"] for f in figures[(kind, args.large)])
            cpu_s = statistics.median(f["client_cpu_us"] for f in figures[(kind, args.small)])
            cpu_l = statistics.median(f["client_cpu_us"] for f in figures[(kind, args.large)])
            ratio = large / small
            print(f"  {kind:10s} {small:7.1f} msg/s at {args.small}, {large:7.1f} at {args.large}: "
                  f"{ratio:.2f} {'ok' if ratio >= 0.8 else 'BELOW'}  (client CPU {cpu_s:.0f} / {cpu_l:.0f} us/msg)")
    finally:
        if pg is not None:
            pg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
