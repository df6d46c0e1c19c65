"""In-only over WS-RM with in-memory stores (seed 004, 4.1.1 "In Only invocation").

What it shows: a spyne service made reliable with one call
(``reliable_service``) and a zeep client made reliable with one call
(``reliable_client``).  The client sends 20 one-way messages on one sequence
(the client's ``key`` names it, like Mercury's internal key), then terminates
the sequence; the service receives each exactly once, in order.  Optional
``--loss`` puts the built-in lossy proxy between them (the seed's tcp monitor
that stops and starts the channel): WS-RM retransmits what was dropped.

In-memory stores survive network failures, not node failures: see
``persistent_in_only.py`` and ``xa_client_server.py`` for those.

Run it::

    python examples/in_only_memory.py [--messages 20] [--loss 0.2]

The last line reads ``delivered N of N, lost 0, duplicated 0``; exit status 0
only when every message arrived exactly once and in order.
"""

from __future__ import annotations

import argparse
import sys
import threading

import zeep
from spyne import Application, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11

from interceptors.spyne_server.service import delivery_context, reliable_service
from interceptors.zeep_client.client import reliable_client

from _support import example_policy, lossy_proxy, quiet_logging, report, wait_for

TNS = "urn:wsrm-example:in-only"
RECEIVED: list[tuple[str, int | None]] = []  # (text, message number) in the order the service ran
_lock = threading.Lock()


class InMemoryInService(ServiceBase):
    @rpc(Unicode, _is_async=True)  # one-way: no reply message
    def ping(ctx, text):  # noqa: N805 -- spyne's signature
        delivery = delivery_context(ctx)
        with _lock:
            RECEIVED.append((text, delivery.message_number if delivery else None))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--loss", type=float, default=0.0, help="fraction of HTTP requests dropped (0..1)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the messages")
    args = parser.parse_args(argv)
    quiet_logging()

    app = Application([InMemoryInService], tns=TNS, in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())
    service = reliable_service(app, store="memory:", policy=example_policy())
    service.serve("127.0.0.1", 0)
    service.start()
    proxy = lossy_proxy(service.url, args.loss) if args.loss else None
    try:
        # through the proxy, the WSDL's address is the proxy's: zeep then posts to it
        client = zeep.Client((proxy.url if proxy else service.url) + "?wsdl")
        rc = reliable_client(client, store="memory:", policy=example_policy(), key="key1")
        try:
            expected = [f"message {i}" for i in range(1, args.messages + 1)]
            for text in expected:
                rc.service.ping(text)  # enqueued; the engine's worker sends and retransmits
            arrived = wait_for(lambda: len(RECEIVED) >= len(expected), timeout=args.timeout)
            rc.close()  # TerminateSequence once every message is acknowledged
            terminated = wait_for(lambda: not rc.engine.store.status().rms, timeout=args.timeout)
            with _lock:
                texts = [text for text, _ in RECEIVED]
                numbers = [number for _, number in RECEIVED]
            in_order = texts == expected and numbers == list(range(1, len(expected) + 1))
            print(f"sequence terminated: {terminated}; in order: {in_order}")
            if proxy is not None:
                print(f"proxy: {proxy.stats}")
            ok = report(expected, texts) and arrived and terminated and in_order
        finally:
            rc.stop(timeout=5)
    finally:
        if proxy is not None:
            proxy.stop()
        service.stop(timeout=5)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
