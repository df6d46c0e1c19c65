"""A memory-store spyne service delivers a one-way request in the thread that received it, once
its HTTP response (the acknowledgement) is written, not in an invoker thread woken for it (issue
33: those wake-ups were about 4.5 of the service's 12-14 thread switches a message at 16
sequences).  See ``wsrm_plugin.engine.after_response``."""

from __future__ import annotations

import threading

import zeep

from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for

from . import service
from .conftest import fast_policy


def test_one_way_requests_are_delivered_by_their_receiving_threads_in_order(monkeypatch):
    """Fails without: the service's invoker threads delivered them."""
    threads: list[str] = []
    remember = service._remember

    def remembered(ctx, item):  # noqa: ANN001 -- spyne's context
        threads.append(threading.current_thread().name)
        remember(ctx, item)
    monkeypatch.setattr(service, "_remember", remembered)
    service.reset()
    # the first invoker thread's look once a poll interval is put off past the test
    svc = reliable_service(service.application(), "memory:", fast_policy(poll_interval=300.0))
    svc.serve()
    svc.start()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), "memory:", fast_policy())
    try:
        for i in range(6):
            rc.service.record(f"one-way-{i}")
        assert wait_for(lambda: service.recorded() == [f"one-way-{i}" for i in range(6)], timeout=30)
        assert threads and not any("-invoker-" in name for name in threads), threads
        assert svc.engine.destination.delivered_on_receipt == 0  # buffered, then delivered
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)
