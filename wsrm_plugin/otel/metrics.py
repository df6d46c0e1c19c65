"""The store's gauges (what ``wsrm status --prometheus`` serves) as OpenTelemetry instruments.

::

    register_metrics(service.engine.store, engine=service.engine)

Each gauge of :data:`wsrm_plugin.metrics.GAUGES` becomes an observable gauge
of the same name with dots (``wsrm.unacknowledged_messages``; a Prometheus
exporter writes it back as ``wsrm_unacknowledged_messages``), plus
``wsrm.sequences`` by side and state and ``wsrm.sequence.unacknowledged_messages``
by sequence.  The store is read (without its locks) once per collection,
not once per instrument.  With ``engine``, this process's own counters
(``ReliableEngine.status()``: messages sent, retransmissions, deliveries,
failures) come as observable counters ``wsrm.engine.*``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from wsrm_plugin import __version__
from wsrm_plugin.metrics import GAUGES
from wsrm_plugin.status import StoreReport, report
from wsrm_plugin.store import StorageManager

__all__ = ["register_metrics", "ENGINE_COUNTERS"]

log = logging.getLogger(__name__)

#: Counters of ``EngineStatus`` exposed per process, with what they count.
ENGINE_COUNTERS = (
    ("messages_sent", "Application messages this process put on the wire (answered)"),
    ("retransmissions", "Application messages this process sent again"),
    ("send_failures", "Transmissions that failed in transport (refused, reset, timed out)"),
    ("delivered", "Messages this process handed to its application"),
    ("delivery_failures", "Messages this process's application kept failing on (given up)"),
    ("delivery_retries", "Failed delivery attempts rolled back and scheduled again"),
    ("faults_sent", "SOAP faults this process answered with"),
)


class _Reading:
    """One store report shared by the instruments of one collection (read again after ``ttl``)."""

    def __init__(self, store: StorageManager, ttl: float = 1.0) -> None:
        self.store = store
        self.ttl = ttl
        self._lock = threading.Lock()
        self._at = 0.0
        self._report: StoreReport | None = None

    def get(self) -> StoreReport | None:
        with self._lock:
            now = time.monotonic()
            if self._report is None or now - self._at > self.ttl:
                try:
                    self._report = report(self.store)
                except Exception:  # noqa: BLE001 -- a store down must not break the exporter
                    log.warning("reading the store for its metrics failed", exc_info=True)
                    self._report = None
                    return None
                self._at = now
            return self._report


_Callback = Callable[[CallbackOptions], Iterable[Observation]]


def _gauge(reading: _Reading, value: Callable[[StoreReport], Any]) -> _Callback:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        found = reading.get()
        return [] if found is None else [Observation(value(found))]
    return observe


def register_metrics(store: StorageManager, *, engine: Any = None,
                     meter_provider: metrics.MeterProvider | None = None) -> metrics.Meter:
    """Expose ``store``'s gauges (and ``engine``'s counters) through ``meter_provider``'s meter."""
    meter = metrics.get_meter("wsrm_plugin", __version__, meter_provider=meter_provider)
    reading = _Reading(store)
    for name, help_text, value in GAUGES:
        meter.create_observable_gauge(name.replace("_", ".", 1), [_gauge(reading, value)], description=help_text)

    def sequences(options: CallbackOptions) -> Iterable[Observation]:
        found = reading.get()
        if found is None:
            return []
        counts: dict[tuple[str, str], int] = {}
        for s in found.sequences:
            counts[(s.side, s.state)] = counts.get((s.side, s.state), 0) + 1
        return [Observation(n, {"side": side, "state": state}) for (side, state), n in sorted(counts.items())]

    def per_sequence(options: CallbackOptions) -> Iterable[Observation]:
        found = reading.get()
        if found is None:
            return []
        return [Observation(s.unacked, {"sequence": s.sequence_id}) for s in found.sequences if s.unacked is not None]

    meter.create_observable_gauge("wsrm.sequences", [sequences], description="Sequences in the store by side and state")
    meter.create_observable_gauge("wsrm.sequence.unacknowledged_messages", [per_sequence],
                                  description="Unacknowledged messages of each source sequence")
    if engine is not None:
        status = _Status(engine)
        for field, help_text in ENGINE_COUNTERS:
            meter.create_observable_counter(f"wsrm.engine.{field}", [_counter(status, field)], description=help_text)
    return meter


class _Status(_Reading):
    """An engine's status, read once per collection like the store's report."""

    def __init__(self, engine: Any, ttl: float = 1.0) -> None:
        super().__init__(engine.store, ttl)
        self.engine = engine

    def status(self) -> Any:
        with self._lock:
            now = time.monotonic()
            if self._status is None or now - self._status_at > self.ttl:
                try:
                    self._status = self.engine.status()
                except Exception:  # noqa: BLE001 -- a store down must not break the exporter
                    log.warning("reading the engine's status for its metrics failed", exc_info=True)
                    return None
                self._status_at = now
            return self._status

    _status: Any = None
    _status_at = 0.0


def _counter(status: _Status, field: str) -> _Callback:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        found = status.status()
        return [] if found is None else [Observation(getattr(found, field))]
    return observe
