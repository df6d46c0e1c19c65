"""Tracing on, against a peer that knows nothing of the trace context header: gSOAP 2.8.

Our zeep client puts the header (never mustUnderstand) in every message it
sends; gSOAP must ignore it and deliver each message exactly once, in
order, as without tracing.  In the other direction gSOAP sends no header:
our service still traces each receive and delivery, each message a trace
of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wsrm_plugin import otel
from wsrm_plugin.tools.proxy import LossyProxy

from .test_gsoap_interop import (  # noqa: F401 -- the fixtures are used by name
    N, assert_gsoap_delivered_once_in_order, assert_ran_once_in_order, close_and_wait, gsoap_server,
    run_gsoap_client, spyne_server, texts, version, wait_until_released, zeep_clients,
)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider)
    yield exporter
    otel.uninstrument()
    provider.shutdown()


def test_gsoap_ignores_the_trace_header_and_delivers_each_note_once(version, gsoap_server, zeep_clients, spans):
    seen: list[bytes] = []

    def script(request):
        seen.append(request.body)

    with LossyProxy(gsoap_server.url, script=script) as proxy:
        rc = zeep_clients(proxy.url)
        sent = texts(N, f"{version}-traced")
        for text in sent:
            rc.service.Note(text=text)
        assert len(gsoap_server.wait_for_deliveries(N)) == N, gsoap_server.log()
        close_and_wait(rc)
    assert_gsoap_delivered_once_in_order(gsoap_server, sent)
    notes = [body for body in seen if b"Note" in body and b"CreateSequence" not in body]
    assert notes and all(b"urn:wsrm-plugin:trace-context" in body for body in notes)
    finished = spans.get_finished_spans()
    sends = [s for s in finished if s.name.startswith("send")]
    # (1.0's LastMessage is the engine's own, sent on close: no call, a trace of its own)
    transmits = [s for s in finished if s.name.startswith("transmit") and not s.name.endswith("/LastMessage")]
    assert len(sends) == N and len(transmits) >= N
    assert {t.parent.span_id for t in transmits} <= {s.context.span_id for s in sends}


def test_zeep_echo_answered_by_gsoap_without_a_header_is_traced_on_our_side(version, gsoap_server, zeep_clients,
                                                                             spans):
    rc = zeep_clients(gsoap_server.url, listen=True)
    sent = texts(3, f"{version}-traced-echo")
    answers = [f.result(timeout=60) for f in [rc.service.Echo(text=text) for text in sent]]
    assert [answer.body.text for answer in answers] == sent
    close_and_wait(rc)
    finished = spans.get_finished_spans()
    receives = [s for s in finished if s.name.startswith("receive")]
    delivers = [s for s in finished if s.name.startswith("deliver")]
    assert len(receives) >= 3 and len(delivers) == 3
    assert all(r.parent is None for r in receives)  # gSOAP sent no trace context: traces of their own


def test_a_gsoap_client_without_the_header_is_received_and_delivered_traced(version, spyne_server, spans):
    server = spyne_server("1.2")
    sent = texts(5, f"{version}-untraced-peer")
    result = run_gsoap_client(version, server.url, sent)
    assert result.ok, result.stderr
    wait_until_released(server, result.sequence)
    assert_ran_once_in_order(sent, result.sequence)
    finished = spans.get_finished_spans()
    delivers = [s for s in finished if s.name.startswith("deliver")]
    assert len(delivers) == 5 and all(d.parent is None for d in delivers)
