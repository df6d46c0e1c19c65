"""A service that raises: its SOAP faults reach the client reliably (seed 004, 4.1.3 "Fault Handling").

What it shows: the service method raises a spyne ``Fault`` on every call,
like the seed's message receiver that always sends an AxisFault.  The
server's invoker worker runs each delivery in a transaction: when the method
raises, that transaction (the dequeue and anything the method did) rolls
back and the delivery is tried again, up to the policy's
``max_delivery_attempts``; then a new transaction takes the message out and
enqueues the fault on the response sequence the client offered.  WS-RM
carries the fault like any reply: retransmitted until acknowledged, handed to
the client once.  The client sees it twice over: its ``Future`` raises
``zeep.exceptions.Fault``, and the callback named by import path gets a
reply whose ``fault`` is set.

Run it::

    python examples/fault_handling.py [--messages 10] [--loss 0.2]

The last line reads ``delivered N of N, lost 0, duplicated 0`` (faults that
reached the callback); exit status 0 only when every call's fault arrived
exactly once and carries the service's own message.
"""

from __future__ import annotations

import argparse
import sys
import threading

import zeep
import zeep.exceptions
from spyne import Application, Fault, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11

import replies
from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client

from _support import example_policy, lossy_proxy, quiet_logging, report, wait_for

TNS = "urn:wsrm-example:faults"
ATTEMPTS: list[str] = []  # every time the method ran, rolled-back attempts included
_lock = threading.Lock()


class FaultService(ServiceBase):
    @rpc(Unicode, _returns=Unicode)
    def reserve(ctx, item):  # noqa: N805 -- spyne's signature
        with _lock:
            ATTEMPTS.append(item)
        raise Fault("Server.OutOfStock", f"{item} is out of stock")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--loss", type=float, default=0.0, help="fraction of HTTP requests dropped (0..1)")
    parser.add_argument("--attempts", type=int, default=2, help="deliveries tried before the fault is sent")
    args = parser.parse_args(argv)
    quiet_logging()

    app = Application([FaultService], tns=TNS, in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())
    service = reliable_service(app, store="memory:", policy=example_policy(max_delivery_attempts=args.attempts))
    service.serve("127.0.0.1", 0)
    service.start()
    proxy = lossy_proxy(service.url, args.loss) if args.loss else None
    ok = False
    try:
        client = zeep.Client((proxy.url if proxy else service.url) + "?wsdl")
        rc = reliable_client(client, store="memory:", policy=example_policy(), key="key1",
                             listen=("127.0.0.1", 0))
        try:
            items = [f"item-{i}" for i in range(1, args.messages + 1)]
            futures = {item: rc.service.reserve(item, _callback="replies:on_reply", _context=item)
                       for item in items}
            raised: dict[str, str] = {}
            for item, future in futures.items():
                try:
                    future.result(timeout=120)
                except zeep.exceptions.Fault as fault:  # the service's fault, as a synchronous call raises it
                    raised[item] = fault.message
            wait_for(lambda: len(replies.received()) >= len(items), timeout=30)
            got = replies.received()
            own_message = (all(raised.get(item) == f"{item} is out of stock" for item in items)
                           and all(r.fault == f"{r.user_context} is out of stock" and r.result is None
                                   for r in got))
            with _lock:
                attempts = len(ATTEMPTS)
            print(f"first fault: {raised.get(items[0])!r}; service attempts: {attempts} "
                  f"({args.attempts} per call, each rolled back); faults carry the service's message: "
                  f"{own_message}")
            if proxy is not None:
                print(f"proxy dropped {proxy.stats.dropped} of {proxy.stats.received} requests")
            rc.close()
            wait_for(lambda: not rc.engine.store.status().rms, timeout=30)
            ok = (report(items, [r.user_context for r in got]) and own_message
                  and attempts == args.attempts * len(items))
        finally:
            rc.stop(timeout=5)
    finally:
        if proxy is not None:
            proxy.stop()
        service.stop(timeout=5)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
