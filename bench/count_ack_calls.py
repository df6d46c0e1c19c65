"""Python calls of one acknowledgement on the memory store (cProfile: a count, not a time).

An acknowledgement rides on every request and every reply, and the memory store applies it
with ``rms_messages.acknowledge`` in a transaction of its own (the sender's, on a response):
this counts the calls of that transaction (begin, acknowledge, commit) for a sequence whose
messages are all sent and acknowledged two at a time, the ranges naming every number so far
(a peer's ranges are cumulative).  The count does not depend on the machine's load::

    .venv/bin/python bench/count_ack_calls.py [--rounds 5] [--per-ack 2]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RM11 = "http://docs.oasis-open.org/ws-rx/wsrm/200702"
WSA = "http://www.w3.org/2005/08/addressing"


def calls_of(work: Callable[[], object]) -> int:
    """Python calls (built-ins included) that ``work()`` makes."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        work()
    finally:
        profile.disable()
    return sum(entry[1] for entry in pstats.Stats(profile).stats.values())  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-ack", type=int, default=2, help="messages each acknowledgement acknowledges")
    args = parser.parse_args(argv)

    from wsrm_plugin.store.memory import MemoryStore

    store = MemoryStore()
    with store.begin() as tx:
        tx.rms.create("k1", target="http://server/svc", acks_to="http://client/acks", rm_version=RM11,
                      wsa_version=WSA)
        tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)
    highest = 0
    for r in range(args.rounds):
        with store.begin() as tx:
            for i in range(args.per_ack):
                msg = tx.rms_messages.enqueue("k1", b"<env/>", action="urn:op", soap_version="1.2",
                                              message_id=f"urn:m{r}-{i}")
                tx.rms_messages.record_send_attempt("k1", msg.number, next_send_at=1e12)
                highest = msg.number

        def acknowledge(upto: int = highest) -> None:
            with store.begin() as tx:
                tx.rms_messages.acknowledge("k1", [(1, upto)])
        print(f"round {r + 1}: ranges 1..{highest}, {args.per_ack} newly acknowledged: "
              f"{calls_of(acknowledge)} Python calls", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
