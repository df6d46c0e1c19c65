"""Our source reads a 503 as "retry later" and honours its Retry-After (capped by its own maximum)."""

from __future__ import annotations

import io
import threading
import time

from .conftest import fast_policy
from .support import ACTION, Recorder, payload, wait_for


class _BusyOnce:
    """Answers the first application message with 503 + Retry-After (as a full destination does)."""

    def __init__(self, app, retry_after: str) -> None:
        self.app = app
        self.retry_after = retry_after
        self.refused = 0
        #: when each copy of an application message arrived (monotonic seconds)
        self.arrivals: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        environ["wsgi.input"] = io.BytesIO(body)
        with self._lock:
            if b"MessageNumber" in body:
                self.arrivals.append(time.monotonic())
            refuse = b"MessageNumber" in body and self.refused == 0
            if refuse:
                self.refused += 1
        if refuse:
            start_response("503 Service Unavailable", [("Content-Length", "0"), ("Retry-After", self.retry_after)])
            return [b""]
        return self.app(environ, start_response)


def _resent_after(busy: _BusyOnce) -> float:
    """Seconds from the refused copy's arrival to the next copy's.

    Read off the arrivals rather than the store's planned time: a look at the plan can miss
    its window on a loaded machine (the copy already sent and acknowledged), while a load
    only makes this gap longer, never shorter."""
    first, second = busy.arrivals[:2]
    return second - first


def test_a_503_with_retry_after_postpones_the_retransmission(engines, store_for):
    received = Recorder()
    busy: list[_BusyOnce] = []
    server = engines(store_for("memory", "s"), fast_policy(), serve=True, application=received,
                     middleware=lambda app: busy.append(_BusyOnce(app, "3")) or busy[-1])
    client = engines(store_for("memory", "c"), fast_policy(base_retransmission_interval=0.2,
                                                           max_retransmission_interval=60.0))
    client.send(server.endpoint_address, payload("later"), action=ACTION)
    assert wait_for(lambda: busy[0].refused == 1)
    assert wait_for(lambda: received.snapshot() == ["later"], timeout=30)
    # its backoff alone would send it again 0.2 s later; the peer asked for 3 s
    assert _resent_after(busy[0]) >= 2.9, busy[0].arrivals
    assert wait_for(lambda: client.status().unacked == 0)


def test_a_retry_after_beyond_the_maximum_interval_is_capped(engines, store_for):
    received = Recorder()
    busy: list[_BusyOnce] = []
    server = engines(store_for("memory", "s"), fast_policy(), serve=True, application=received,
                     middleware=lambda app: busy.append(_BusyOnce(app, "86400")) or busy[-1])
    client = engines(store_for("memory", "c"), fast_policy(base_retransmission_interval=0.2,
                                                           max_retransmission_interval=2.0))
    client.send(server.endpoint_address, payload("capped"), action=ACTION)
    assert wait_for(lambda: busy[0].refused == 1)
    assert wait_for(lambda: received.snapshot() == ["capped"], timeout=30)  # a day's wait would fail this
    # honoured up to the cap: not the 0.2 s backoff
    assert _resent_after(busy[0]) >= 1.9, busy[0].arrivals
