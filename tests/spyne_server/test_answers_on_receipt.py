"""A memory-store service answers a back-channel request in the thread that receives it.

With the automatic ``RMPolicy.deliver_on_receive`` a store whose commits cost
little (memory) buffers messages for its invoker threads, except a request
whose reply goes back in the HTTP response: its receiving thread waits for the
reply anyway, so it delivers the request itself, in its receive's transaction,
and answers with the reply (no hand-off to an invoker thread and back).  One-way
messages and requests behind a gap still go through the buffer; every call is
answered once, in order, through a lossy network.
"""

from __future__ import annotations

import zeep

from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for
from wsrm_plugin.engine import destination
from wsrm_plugin.tools.proxy import LossyProxy

from . import service
from .conftest import fast_policy


def test_back_channel_requests_are_answered_by_their_receiving_thread_one_ways_buffered(monkeypatch):
    counted = []  # replies counted as sent by a statement after their enqueue
    monkeypatch.setattr(destination, "count_reply_handed_out", lambda *a: counted.append(a))
    service.reset()
    svc = reliable_service(service.application(), "memory:", fast_policy())
    svc.serve()
    svc.start()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), "memory:", fast_policy())
    try:
        engine = svc.engine
        answers = [rc.service.echo(f"call-{i}").result(timeout=30) for i in range(5)]
        assert answers == [f"re:call-{i}" for i in range(5)]
        assert engine.destination.delivered_on_receipt == 5  # never buffered for an invoker thread
        assert counted == []  # each reply enqueued as handed out already, in the delivery
        for i in range(3):
            rc.service.record(f"one-way-{i}")
        assert wait_for(lambda: service.recorded()[5:] == [f"one-way-{i}" for i in range(3)], timeout=30)
        assert engine.destination.delivered_on_receipt == 5  # one-way: buffered, as before
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)


def test_back_channel_requests_through_a_lossy_network_are_answered_once_in_order():
    """Lost requests, lost responses (the reply's copy comes in the response to the request's
    copy), duplicates: the ones next in order are delivered on receipt, the others from the
    buffer; each call answered once, each request run once."""
    service.reset()
    svc = reliable_service(service.application(), "memory:", fast_policy())
    svc.serve()
    svc.start()
    with LossyProxy(svc.url, drop=0.2, drop_response=0.2, duplicate=0.1, seed=33) as proxy:
        rc = reliable_client(zeep.Client(proxy.url + "?wsdl"), "memory:", fast_policy())
        try:
            futures = [rc.service.echo(f"call-{i}") for i in range(20)]
            answers = [f.result(timeout=60) for f in futures]
            assert answers == [f"re:call-{i}" for i in range(20)]
            assert svc.engine.destination.delivered_on_receipt >= 1
            assert wait_for(lambda: svc.engine.invoker.delivered == 20, timeout=30)
            assert sorted(service.CALLS) == sorted(f"call-{i}" for i in range(20))  # each run once
        finally:
            rc.stop(timeout=5)
            svc.stop(timeout=5)
