"""Reception goes on while the application holds a delivery (memory store).

A delivery holds its sequence's invoker buffer from the claim to the commit,
the application's work included.  If buffering a received message waited for
that, every receive of the sequence would wait for the application: the
HTTP response (and the acknowledgement in it) of message n+1 would come only
after message n was processed, and the source could never get ahead of a slow
service (the memory store did that, and was slower than SQLite in bench_compare).
"""

from __future__ import annotations

import threading

from .conftest import fast_policy
from .support import ACTION, Recorder, item_text, payload, wait_for


def test_messages_are_received_and_acknowledged_while_a_delivery_is_held(engines) -> None:
    entered, release = threading.Event(), threading.Event()
    received = Recorder()

    def application(envelope: bytes, context: object) -> None:
        if item_text(envelope) == "m0":
            entered.set()
            release.wait(60)  # the application is busy with m0
        received(envelope, context)

    server = engines("memory:", fast_policy(), serve=True, application=application, name="server")
    client = engines("memory:", fast_policy(), name="client")
    for i in range(5):
        client.send(server.endpoint_address, payload(f"m{i}"), action=ACTION)
    try:
        assert entered.wait(30)
        # m0's delivery is held; the others arrive, are buffered and acknowledged meanwhile
        # (waiting for the delivery they would be acknowledged only after the store's 30 s
        # lock timeout, and only refused then)
        assert wait_for(lambda: client.status().unacked == 0, timeout=20), client.status()
        with server.store.begin() as tx:
            buffered = tx.invoker.count()
        assert buffered == 5 and received.snapshot() == []
    finally:
        release.set()
    assert wait_for(lambda: received.snapshot() == [f"m{i}" for i in range(5)], timeout=30)
    assert wait_for(lambda: server.status().delivered == 5, timeout=15)
