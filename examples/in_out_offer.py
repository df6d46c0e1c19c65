"""In-out over WS-RM with an offered sequence and a callback (seed 004, 4.1.2 "In Out Invocation").

What it shows: WS-RM carries an in-out exchange on two sequences, one per
direction.  The client offers the identifier of the reply sequence in its
CreateSequence (WS-RM ``Offer``), so no second handshake is needed; the
service's replies then come back reliably on that offered sequence to the
client's own listener (dual channel: ``listen=``).  Each call is
asynchronous: it returns a ``concurrent.futures.Future`` at once, and names a
callback by import path (``_callback="replies:on_reply"``) that receives the
reply together with the call's ``_context``, the way Mercury's
``sendAsynchronousMessage`` took an Axis2 callback.

Run it::

    python examples/in_out_offer.py [--messages 20] [--loss 0.2]

The last line reads ``delivered N of N, lost 0, duplicated 0`` (replies that
reached the callback); exit status 0 only when every reply arrived exactly
once, on the offered sequence.
"""

from __future__ import annotations

import argparse
import sys

import zeep
from spyne import Application, Integer, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11

import replies
from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client

from _support import example_policy, lossy_proxy, quiet_logging, report, wait_for

TNS = "urn:wsrm-example:in-out"


class InMemoryInOutService(ServiceBase):
    @rpc(Unicode, Integer, _returns=Unicode)
    def quote(ctx, item, quantity):  # noqa: N805 -- spyne's signature
        return f"{quantity} x {item} = {quantity * 3} EUR"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--loss", type=float, default=0.0, help="fraction of HTTP requests dropped (0..1)")
    args = parser.parse_args(argv)
    quiet_logging()

    app = Application([InMemoryInOutService], tns=TNS, in_protocol=Soap11(validator="lxml"),
                      out_protocol=Soap11())
    service = reliable_service(app, store="memory:", policy=example_policy())
    service.serve("127.0.0.1", 0)
    service.start()
    proxy = lossy_proxy(service.url, args.loss) if args.loss else None
    ok = False
    try:
        client = zeep.Client((proxy.url if proxy else service.url) + "?wsdl")
        # listen: the client's endpoint for acknowledgements and replies (dual channel)
        rc = reliable_client(client, store="memory:", policy=example_policy(), key="key1",
                             listen=("127.0.0.1", 0))
        try:
            orders = {f"order-{i}": (f"item-{i}", i) for i in range(1, args.messages + 1)}
            futures = {order: rc.service.quote(item, quantity, _callback="replies:on_reply", _context=order)
                       for order, (item, quantity) in orders.items()}
            with rc.engine.store.begin() as tx:
                offered = {seq.offered_id for seq in tx.rms.list_all()}
            results = {order: future.result(timeout=120) for order, future in futures.items()}
            wait_for(lambda: len(replies.received()) >= len(orders), timeout=30)
            got = replies.received()
            # each reply reached the callback with its own call's context, and matches its future
            right = all(r.result == results[r.user_context] == "{1} x {0} = {2} EUR".format(
                *orders[r.user_context], 3 * orders[r.user_context][1]) for r in got)
            on_offered = {r.sequence_id for r in got} <= offered - {None}
            print(f"first reply: {results['order-1']!r}; replies correct: {right}; "
                  f"on the offered sequence: {on_offered} ({len(offered)} offered)")
            if proxy is not None:
                print(f"proxy dropped {proxy.stats.dropped} of {proxy.stats.received} requests")
            rc.close()
            wait_for(lambda: not rc.engine.store.status().rms, timeout=30)
            ok = report(orders, [r.user_context for r in got]) and right and on_offered
        finally:
            rc.stop(timeout=5)
    finally:
        if proxy is not None:
            proxy.stop()
        service.stop(timeout=5)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
