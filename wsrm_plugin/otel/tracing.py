"""The engine's steps as OpenTelemetry spans (an :class:`~wsrm_plugin.engine.observe.Observer`).

One message, one trace::

    send echo                      PRODUCER  the call: enqueued, in the caller's transaction
    ├── transmit echo              CLIENT    attempt 1 (lost on the way: an error, or no answer)
    └── transmit echo              CLIENT    attempt 2, wsrm.retransmission.reason says why
        └── receive echo           SERVER    the peer stored it (or saw a duplicate)
            └── deliver echo       CONSUMER  the delivery transaction: the service ran, committed
                └── send echo      PRODUCER  its reply, enqueued in that transaction ...

The parent of each span travels with the message: the ``send`` span's
context goes into the stored envelope's trace header; each transmission
names itself there as the parent of what the peer does with that copy; the
receiver's ``receive`` span names itself in what it stores, for the
``deliver`` span, however much later that runs.  A peer without the header
(or an older sender) starts its ``receive`` under the current context (an
HTTP server instrumentation's span) instead.

Attributes follow OpenTelemetry's messaging conventions where they apply
(``messaging.system`` is ``ws-rm``; ``messaging.destination.name`` the
target address; ``messaging.message.id`` the wsa:MessageID), and name the
rest ``wsrm.*``: ``wsrm.sequence.id``, ``wsrm.message.number``,
``wsrm.attempt``, ``wsrm.retransmission.reason``, ``wsrm.duplicate``,
``wsrm.acknowledged``, ``wsrm.transaction`` (the XA transaction id) and
``wsrm.transaction.outcome``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from lxml import etree
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from wsrm_plugin import __version__
from wsrm_plugin.engine import observe
from wsrm_plugin.wire import tracecontext

__all__ = ["TracingObserver", "instrument", "uninstrument"]

_PROPAGATOR = TraceContextTextMapPropagator()
_SYSTEM = "ws-rm"

#: What the engine notes (``Step.note``) -> the span attribute it becomes.
_ATTRIBUTES = {
    "message_id": "messaging.message.id",
    "sequence_key": "wsrm.sequence.key",
    "sequence_id": "wsrm.sequence.id",
    "number": "wsrm.message.number",
    "status": "http.response.status_code",
    "duplicate": "wsrm.duplicate",
    "acknowledged": "wsrm.acknowledged",
    "transaction_outcome": "wsrm.transaction.outcome",
    "error": "error.message",
    "action": "wsrm.action",
}


def _context_of(fields: tuple[str, str | None] | None) -> otel_context.Context | None:
    if fields is None:
        return None
    carrier = {"traceparent": fields[0]}
    if fields[1]:
        carrier["tracestate"] = fields[1]
    return _PROPAGATOR.extract(carrier)


def _span_id(span: trace.Span) -> str | None:
    context = span.get_span_context()
    return format(context.span_id, "016x") if context.is_valid else None


class _SpanStep(observe.Step):
    """A step that is a span: noted facts become attributes; ``end`` sets its status."""

    def __init__(self, span: trace.Span, data: bytes = b"", verb: str = "") -> None:
        self.span = span
        self.data = data
        self._verb = verb
        self._ended = False
        self._lock = threading.Lock()
        self._failure: str | None = None  # a lost attempt: an HTTP error status, a transport error

    def headers(self) -> list[etree._Element]:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(self.span))
        if "traceparent" not in carrier:
            return []  # not sampled, or no SDK: nothing to carry
        return [tracecontext.header(carrier["traceparent"], carrier.get("tracestate"))]

    def note(self, **facts: Any) -> None:
        if not self.span.is_recording():
            return
        for name, value in facts.items():
            if value is None:
                continue
            if name == "error" or (name == "status" and value >= 500):
                self._failure = str(value) if name == "error" else f"HTTP {value}"
            if name == "action" and self._verb:
                self.span.update_name(f"{self._verb} {value}")
            self.span.set_attribute(_ATTRIBUTES.get(name, f"wsrm.{name}"), value)

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        with trace.use_span(self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield

    def end(self, error: BaseException | None = None) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        if error is not None:
            self.span.record_exception(error)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        elif self._failure is not None:
            self.span.set_status(Status(StatusCode.ERROR, self._failure))
        self.span.end()


def _named(verb: str, action: str | None) -> str:
    return f"{verb} {action}" if action else verb


class TracingObserver(observe.Observer):
    """Spans for every engine of the process, from ``tracer_provider`` (the global one by default)."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer("wsrm_plugin", __version__, tracer_provider=tracer_provider)

    def sending(self, *, target: str | None, action: str | None, reply: bool,
                transaction: str | None) -> observe.Step:
        attributes: dict[str, Any] = {"messaging.system": _SYSTEM, "messaging.operation.type": "send",
                                      "messaging.operation.name": "send", "wsrm.reply": reply}
        if target:
            attributes["messaging.destination.name"] = target
        if transaction:
            attributes["wsrm.transaction"] = transaction
        span = self.tracer.start_span(_named("send", action), kind=SpanKind.PRODUCER, attributes=attributes)
        return _SpanStep(span, verb="send")

    def transmitting(self, data: bytes, *, target: str, action: str, sequence_id: str, number: int,
                     attempt: int, reason: str | None) -> observe.Step:
        attributes: dict[str, Any] = {
            "messaging.system": _SYSTEM, "messaging.operation.type": "send", "messaging.operation.name": "transmit",
            "messaging.destination.name": target, "url.full": target, "wsrm.sequence.id": sequence_id,
            "wsrm.message.number": number, "wsrm.attempt": attempt}
        if reason is not None:
            attributes["wsrm.retransmission.reason"] = reason
        parent = _context_of(tracecontext.read(data=data))
        span = self.tracer.start_span(_named("transmit", action), context=parent, kind=SpanKind.CLIENT,
                                      attributes=attributes)
        span_id = _span_id(span)
        return _SpanStep(span, tracecontext.with_parent(data, span_id) if span_id else data)

    def receiving(self, data: bytes, *, headers: list[etree._Element], sequence_id: str, number: int,
                  action: str | None, message_id: str | None) -> observe.Step:
        attributes: dict[str, Any] = {
            "messaging.system": _SYSTEM, "messaging.operation.type": "receive",
            "messaging.operation.name": "receive", "wsrm.sequence.id": sequence_id, "wsrm.message.number": number}
        if message_id:
            attributes["messaging.message.id"] = message_id
        parent = _context_of(tracecontext.read(headers=headers))  # None: the current context
        span = self.tracer.start_span(_named("receive", action), context=parent, kind=SpanKind.SERVER,
                                      attributes=attributes)
        span_id = _span_id(span)
        return _SpanStep(span, tracecontext.with_parent(data, span_id) if span_id and parent is not None else data)

    def delivering(self, payload: bytes, *, sequence_id: str, number: int, action: str,
                   message_id: str | None, transaction: str | None) -> observe.Step:
        attributes: dict[str, Any] = {
            "messaging.system": _SYSTEM, "messaging.operation.type": "process",
            "messaging.operation.name": "deliver", "wsrm.sequence.id": sequence_id, "wsrm.message.number": number}
        if message_id:
            attributes["messaging.message.id"] = message_id
        if transaction:
            attributes["wsrm.transaction"] = transaction
        parent = _context_of(tracecontext.read(data=payload))
        span = self.tracer.start_span(_named("deliver", action), context=parent, kind=SpanKind.CONSUMER,
                                      attributes=attributes)
        return _SpanStep(span)


def instrument(tracer_provider: trace.TracerProvider | None = None) -> TracingObserver:
    """Trace every reliable message of this process (replaces an earlier instrumentation)."""
    observer = TracingObserver(tracer_provider)
    observe.install(observer)
    return observer


def uninstrument() -> None:
    """Stop tracing (the spans already started end as they would)."""
    if isinstance(observe.active, TracingObserver):
        observe.uninstall()
