"""A client behind a firewall polls for its replies with WS-MakeConnection.

What it shows: a client that cannot accept connections (a firewall, a NAT, a
browser-like host) still gets the replies to its in-out calls reliably.  It
names itself with a WS-MakeConnection anonymous URI (``make_connection=True``:
a stable one for its ``name``) as the endpoint of the sequence it offers; the
service, made with ``reliable_service(..., make_connection=True)``, keeps each
reply in its mailbox for that URI (and retransmits it there until it is
acknowledged) instead of posting it; the client polls the service with
MakeConnection and acknowledges what it got.  No connection ever goes from the
service to the client: the firewall here is simply that the client serves no
address at all.  ``--loss`` drops that fraction of the client's requests and
polls on their way (a lossy proxy in front of the service): requests are
retransmitted, replies parked again, polls repeated.

Run it::

    python examples/make_connection.py [--calls 20] [--loss 0.2]

The last line reads ``delivered N of N, lost 0, duplicated 0`` (replies that
reached their calls); exit status 0 only when every reply arrived exactly once
(the service parks them: it has no address of the client to post to).
"""

from __future__ import annotations

import argparse
import sys

import zeep
from spyne import Application, Integer, ServiceBase, rpc
from spyne.protocol.soap import Soap11

from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client
from wsrm_plugin.wire.namespaces import mc_anonymous_id

from _support import example_policy, lossy_proxy, quiet_logging, report, wait_for

TNS = "urn:wsrm-example:make-connection"


class PriceService(ServiceBase):
    @rpc(Integer, _returns=Integer)
    def price(ctx, quantity):  # noqa: N805 -- spyne's signature
        return 3 * quantity


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--loss", type=float, default=0.0, help="fraction of HTTP requests dropped (0..1)")
    args = parser.parse_args(argv)
    quiet_logging()

    app = Application([PriceService], tns=TNS, in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())
    # the service keeps replies for polling clients in its mailbox
    service = reliable_service(app, store="memory:", policy=example_policy(), make_connection=True)
    service.serve("127.0.0.1", 0)
    service.start()
    proxy = lossy_proxy(service.url, args.loss) if args.loss else None
    ok = False
    try:
        client = zeep.Client((proxy.url if proxy else service.url) + "?wsdl")
        # no listen=: nothing to connect to; make_connection: replies are fetched by polling
        rc = reliable_client(client, store="memory:", policy=example_policy(), name="behind-the-firewall",
                             make_connection=True, poll_interval=0.1)
        try:
            print(f"client endpoint: {rc.engine.endpoint_address} (a WS-MakeConnection anonymous URI, "
                  "not an address anyone can connect to)")
            futures = {f"call-{q}": rc.service.price(q) for q in range(1, args.calls + 1)}
            results = {call: future.result(timeout=120) for call, future in futures.items()}
            right = all(results[f"call-{q}"] == 3 * q for q in range(1, args.calls + 1))
            wait_for(lambda: service.engine.status().unacked == 0, timeout=60)  # every reply acknowledged
            mc_id = mc_anonymous_id(rc.engine.endpoint_address)
            # a copy retransmitted before its acknowledgement came may still be parked: the next poll takes it
            wait_for(lambda: service.mailbox.pending(mc_id) == 0, timeout=30)
            print(f"replies right: {right}; polls answered with a reply: {rc.poller.received}; "
                  f"left in the service's mailbox: {service.mailbox.pending(mc_id)}")
            if proxy is not None:
                print(f"proxy dropped {proxy.stats.dropped} of {proxy.stats.received} requests")
            rc.close()
            wait_for(lambda: not rc.engine.store.status().rms, timeout=30)
            ok = report(futures, [call for call in results if results[call] is not None]) and right
        finally:
            rc.stop(timeout=5)
    finally:
        if proxy is not None:
            proxy.stop()
        service.stop(timeout=5)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
