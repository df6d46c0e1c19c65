"""What the one-process benchmarks (``bench_sqlite_sender.py``, ``bench_sqlite_sequences.py``)
share: the message they send, a method that counts its deliveries, and opening every sequence
before the measured part (so that no CreateSequence exchange is counted in it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from lxml import etree

from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.wire import SOAP12, build_envelope, to_bytes

ACTION = "urn:wsrm-bench:item"


def payload(text: str) -> bytes:
    item = etree.Element("{urn:wsrm-bench}item")
    item.text = text
    return to_bytes(build_envelope(SOAP12, [], item))


class Deliveries:
    """The service's method (:meth:`application`, which waits ``app_ms`` first as a method that
    commits to its own database waits for that commit) and a wait for a number of its calls."""

    def __init__(self, app_ms: float = 0.0) -> None:
        self.count = 0
        self._app_s = app_ms / 1000
        self._lock = threading.Lock()

    @property
    def application(self) -> Callable[[bytes, object], None]:
        def application(envelope: bytes, context: object) -> None:
            if self._app_s:
                time.sleep(self._app_s)
            with self._lock:
                self.count += 1
        return application

    def wait(self, n: int, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while self.count < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {self.count} of {n} delivered after {timeout:.0f} s")
            time.sleep(0.005)


def open_sequences(client: ReliableEngine, url: str, sequences: int, delivered: Deliveries) -> None:
    """One message on each of ``sequences`` keys (``k0``, ``k1``...), delivered."""
    for k in range(sequences):
        client.send(url, payload("warm"), action=ACTION, key=f"k{k}")
    delivered.wait(sequences)
