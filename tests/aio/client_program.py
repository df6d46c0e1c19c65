"""An asyncio program sending reliable calls, killable at any point: what the kill test runs.

    python -m tests.aio.client_program --wsdl URL --store sqlite:///c.db --listen-port N \\
        --one-way 500 --in-out 100

It sends ``--one-way`` one-way calls (``m00001``...), then ``--in-out``
request-reply calls (``e00001``...), each awaited until stored, in order,
from one task.  The reply of each in-out call goes to a persisted callback
(:func:`on_reply`) that records it in the client's own store, in the
delivery's transaction: replies to calls made before a SIGKILL arrive
after the restart all the same.  A restarted program resumes after the
highest message number its store handed out on each kind of sequence.
Lines on stdout: ``RESUMED ow io``, ``ENQUEUED n`` (n counts both kinds),
``REPLIES n``, ``LOOP <report>``, ``DONE``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

REPLY_TABLE = "aio_replies"


def one_way_item(number: int) -> str:
    return f"m{number:05d}"


def in_out_item(number: int) -> str:
    return f"e{number:05d}"


def on_reply(reply: Any) -> None:
    """The persisted callback: the reply, recorded in the delivery's store transaction (exactly once)."""
    if reply.fault is not None:
        raise RuntimeError(f"{reply.user_context} was answered with a fault: {reply.fault}")
    reply.context.transaction.write(f"INSERT INTO {REPLY_TABLE} VALUES (?, ?)", (reply.user_context, str(reply.result)))


def _progress(store: Any, key: str) -> tuple[int, int]:
    """Highest numbers handed out on the one-way and the in-out sequences of ``key``."""
    from wsrm_plugin.engine.source import SequenceKey

    done = {False: 0, True: 0}
    with store.begin() as tx:
        for seq in tx.rms.list_all():
            parsed = SequenceKey.decode(seq.key)
            if parsed is not None and parsed.key == key:
                done[parsed.offered] = max(done[parsed.offered], seq.highest_number)
    return done[False], done[True]


def _replies(store: Any) -> int:
    with store.begin() as tx:
        return int(tx.one(f"SELECT COUNT(*) FROM {REPLY_TABLE}")[0])


async def run(args: argparse.Namespace) -> None:
    import zeep

    from tests.aio.loopwatch import watch_loop
    from wsrm_plugin import reliable_client
    from wsrm_plugin.tools.demo_peer import POLICY

    with watch_loop() as loop_watch:
        rc = reliable_client(zeep.AsyncClient(args.wsdl), args.store, POLICY, key="aio", name="aio-client",
                             listen=("127.0.0.1", args.listen_port), start=False)
        store = rc.engine.store
        await asyncio.to_thread(_create_table, store)
        async with rc:
            ow, io = await asyncio.to_thread(_progress, store, "aio")
            print(f"RESUMED {ow} {io}", flush=True)
            for number in range(ow + 1, args.one_way + 1):
                await rc.service.record(one_way_item(number))
                print(f"ENQUEUED {number}", flush=True)
            replies = []
            for number in range(io + 1, args.in_out + 1):
                item = in_out_item(number)
                replies.append(await rc.enqueue.echo(item, _callback="tests.aio.client_program:on_reply",
                                                     _context=item))
                print(f"ENQUEUED {args.one_way + number}", flush=True)
            results = await asyncio.gather(*replies)  # this run's calls: their futures resolve too
            assert all(result.startswith("re:e") for result in results), results
            while (count := await asyncio.to_thread(_replies, store)) < args.in_out:
                await asyncio.sleep(0.1)
            print(f"REPLIES {count}", flush=True)
            await rc.flush(timeout=120)
    print(f"LOOP {loop_watch.report()} slowest_cpu_ms={loop_watch.slowest_cpu * 1000:.3f} "
          f"callbacks={loop_watch.callbacks} off_loop_calls={sum(loop_watch.off_loop_calls.values())}", flush=True)
    print("DONE", flush=True)


def _create_table(store: Any) -> None:
    with store.begin() as tx:
        tx.write(f"CREATE TABLE IF NOT EXISTS {REPLY_TABLE} (item TEXT NOT NULL, reply TEXT NOT NULL)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.aio.client_program")
    parser.add_argument("--wsdl", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--one-way", type=int, default=500)
    parser.add_argument("--in-out", type=int, default=100)
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval: how long another thread may hold the GIL the loop waits for")
    args = parser.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run(args))


if __name__ == "__main__":
    # as the importable module, not __main__: the reply callback is found by its import path
    from tests.aio.client_program import main as _main

    _main()
