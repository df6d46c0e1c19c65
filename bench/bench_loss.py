"""Delivered messages/s through a lossy network, as a ratio to the same sender with no loss.

One sending engine (the default policy) sends ``--count`` one-way messages
of one sequence through :class:`~wsrm_plugin.tools.proxy.LossyProxy` to a
receiving engine, for each kind of destination -- one that buffers
out-of-order messages (``out_of_order="buffer"``, the default) and one that
discards them (``"discard"``, as gSOAP does) -- and each loss rate (0%, 10%,
30% of exchanges, half of them requests lost, half responses).  The clock
runs from the first ``send`` to the moment the receiver's application got
the last message.  A run where any message was missing, repeated or out of
order is reported FAILED.

Rounds are interleaved (every destination and loss rate once per round, in
turn) so a machine that slows down mid-run slows every case alike; each
case's figure is the median of ``--rounds`` (>= 3).  Reported: messages/s,
and the ratio to the no-loss rate of the same destination in the same run.
The issue's aims: >= 0.6 at 10% loss, >= 0.3 at 30%, for both destinations.

Run::

    .venv/bin/python bench/bench_loss.py [--count 1000] [--rounds 3] [--losses 0,0.1,0.3]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engine.support import ACTION, item_text, payload  # noqa: E402
from wsrm_plugin.engine import ReliableEngine, RMPolicy  # noqa: E402
from wsrm_plugin.tools.proxy import LossyProxy  # noqa: E402

DESTINATIONS = ("buffer", "discard")


class _Arrivals:
    def __init__(self, count: int) -> None:
        self.count = count
        self.items: list[str | None] = []
        self.done = threading.Event()
        self.at = 0.0
        self._lock = threading.Lock()

    def __call__(self, envelope: bytes, context: object) -> None:
        with self._lock:
            self.items.append(item_text(envelope))
            if len(self.items) >= self.count and not self.done.is_set():
                self.at = time.monotonic()
                self.done.set()


def run_case(destination: str, loss: float, count: int, seed: int, timeout: float) -> float | None:
    """Delivered messages/s for one case; None when delivery was wrong or incomplete."""
    arrivals = _Arrivals(count)
    server = ReliableEngine("memory:", RMPolicy(out_of_order=destination), application=arrivals,
                            name=f"bench-{destination}")
    server.serve()
    server.start()
    try:
        with LossyProxy(server.endpoint_address, drop=loss / 2, drop_response=loss / 2, seed=seed) as proxy:
            client = ReliableEngine("memory:", RMPolicy(), name="bench-sender").start()
            try:
                started = time.monotonic()
                for i in range(count):
                    client.send(proxy.url, payload(f"m{i:06d}"), action=ACTION, key="bench")
                if not arrivals.done.wait(timeout):
                    return None
                with arrivals._lock:
                    good = arrivals.items == [f"m{i:06d}" for i in range(count)]
                return count / (arrivals.at - started) if good else None
            finally:
                client.stop(timeout=5)
    finally:
        server.stop(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--losses", default="0,0.1,0.3")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be >= 3 (the figure is a median)")
    losses = [float(x) for x in args.losses.split(",")]
    if 0.0 not in losses:
        losses.insert(0, 0.0)
    logging.basicConfig(level=logging.ERROR)
    rates: dict[tuple[str, float], list[float | None]] = {}
    for round_ in range(args.rounds):
        for destination in DESTINATIONS:
            for loss in losses:
                rate = run_case(destination, loss, args.count, seed=1000 * round_ + int(loss * 100),
                                timeout=args.timeout)
                rates.setdefault((destination, loss), []).append(rate)
                shown = "FAILED" if rate is None else f"{rate:8.1f} msg/s"
                print(f"round {round_ + 1}: {destination:8s} loss {loss:4.0%}: {shown}", flush=True)
    print()
    print(f"{args.count} one-way messages, one sequence, default policy; median of {args.rounds} rounds")
    print(f"{'destination':12s} {'loss':>5s} {'msg/s':>9s} {'ratio':>6s}")
    failed = False
    for destination in DESTINATIONS:
        base = rates[(destination, 0.0)]
        for loss in losses:
            got = rates[(destination, loss)]
            if any(r is None for r in got) or any(r is None for r in base):
                print(f"{destination:12s} {loss:5.0%} {'FAILED':>9s}")
                failed = True
                continue
            ratios = [r / b for r, b in zip(got, base, strict=True)]  # against the no-loss run of the same round
            print(f"{destination:12s} {loss:5.0%} {statistics.median(got):9.1f} {statistics.median(ratios):6.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
