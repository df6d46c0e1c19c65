"""OpenTelemetry for reliable messaging: one trace per message, and the store's metrics.

Install the extra (``pip install 'wsrm-plugin[otel]'``: the OpenTelemetry
API; the application brings its SDK and exporters), then, once per process::

    from wsrm_plugin import otel
    otel.instrument()                                    # the global tracer provider, or tracer_provider=
    otel.register_metrics(service.engine.store, engine=service.engine)   # the global meter provider

Nothing here is imported unless the application imports it.  The spans
(:mod:`.tracing`): the call's ``send`` (inside the caller's transaction when
there is one), a ``transmit`` per attempt with its number and why it went
again, the peer's ``receive`` and its ``deliver`` (the delivery transaction),
each the child of the one before, across the hop through the trace context
header (:mod:`wsrm_plugin.wire.tracecontext`), so a message sent three times
is one trace with three ``transmit`` spans.  The metrics (:mod:`.metrics`):
the gauges ``wsrm status --prometheus`` serves, as OpenTelemetry instruments.
"""

from __future__ import annotations

from .metrics import register_metrics
from .tracing import TracingObserver, instrument, uninstrument

__all__ = ["instrument", "uninstrument", "register_metrics", "TracingObserver"]
