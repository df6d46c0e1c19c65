"""One message, one trace: the OpenTelemetry spans of a reliable call, retransmissions included.

A real zeep client and a real spyne service, each made reliable, in one
process with the OpenTelemetry SDK's in-memory exporter; the lossy proxy
between them loses exactly the copy the test says (``lose_first``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zeep
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for
from tests.spyne_server import service
from tests.spyne_server.conftest import fast_policy
from wsrm_plugin import otel
from wsrm_plugin.tools.proxy import LossyProxy, lose_first
from wsrm_plugin.wire import tracecontext


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    otel.instrument(tracer_provider=provider)
    spans.provider = provider  # type: ignore[attr-defined]  # for a test's own spans
    yield spans
    otel.uninstrument()
    provider.shutdown()


@pytest.fixture
def lossy_service() -> Iterator[object]:
    service.reset()
    server = reliable_service(service.application(), "memory:", fast_policy())
    server.serve()
    server.start()
    yield server
    server.stop(timeout=5)


def _named(spans, prefix):
    return [s for s in spans if s.name.startswith(prefix)]


def _client(url, **options):
    return reliable_client(zeep.Client(url + "?wsdl"), "memory:", fast_policy(), **options)


def test_a_message_lost_once_on_the_way_is_one_trace_with_two_transmissions(exporter, lossy_service):
    # 502: the proxy keeps the connection, so the transport does not send the copy again at once
    # on a fresh one (a closed connection would: one transmission span, wsrm.copies = 2)
    proxy = LossyProxy(lossy_service.url, script=lose_first(b">lost-once<"), drop_mode="502").start()
    rc = _client(proxy.url)
    try:
        rc.service.record("lost-once")
        assert wait_for(lambda: _named(exporter.get_finished_spans(), "deliver"))
        rc.flush(timeout=30)
    finally:
        rc.stop(timeout=5)
        proxy.stop()
    spans = exporter.get_finished_spans()
    [send] = _named(spans, "send")
    transmits = sorted(_named(spans, "transmit"), key=lambda s: s.attributes["wsrm.attempt"])
    [receive] = _named(spans, "receive")
    [deliver] = _named(spans, "deliver")
    assert len(transmits) == 2, [s.name for s in spans]
    assert {s.context.trace_id for s in spans} == {send.context.trace_id}  # one trace
    assert send.parent is None and send.kind is SpanKind.PRODUCER
    assert send.attributes["messaging.message.id"] == deliver.attributes["messaging.message.id"]
    first, second = transmits
    assert [t.parent.span_id for t in transmits] == [send.context.span_id] * 2
    assert (first.attributes["wsrm.attempt"], second.attributes["wsrm.attempt"]) == (1, 2)
    assert "wsrm.retransmission.reason" not in first.attributes
    assert second.attributes["wsrm.retransmission.reason"] == "the previous attempt was answered HTTP 502"
    assert first.attributes["http.response.status_code"] == 502 and first.attributes["wsrm.acknowledged"] is False
    assert first.status.status_code is StatusCode.ERROR and second.status.status_code is StatusCode.UNSET
    assert second.attributes["wsrm.acknowledged"] is True
    assert receive.parent.span_id == second.context.span_id and receive.kind is SpanKind.SERVER
    assert receive.attributes["wsrm.duplicate"] is False
    assert deliver.parent.span_id == receive.context.span_id and deliver.kind is SpanKind.CONSUMER
    assert deliver.attributes["wsrm.message.number"] == receive.attributes["wsrm.message.number"] == 1
    assert service.recorded() == ["lost-once"]


def test_a_lost_response_is_a_duplicate_receive_in_the_same_trace_and_one_delivery(exporter, lossy_service):
    proxy = LossyProxy(lossy_service.url, script=lose_first(b">twice<", response=True), drop_mode="502").start()
    rc = _client(proxy.url, listen=("127.0.0.1", 0))
    try:
        assert rc.service.echo("twice").result(timeout=30) == "re:twice"
        rc.flush(timeout=30)
    finally:
        rc.stop(timeout=5)
        proxy.stop()
    spans = exporter.get_finished_spans()
    [request] = [s for s in _named(spans, "send") if not s.attributes["wsrm.reply"]]
    trace = [s for s in spans if s.context.trace_id == request.context.trace_id]
    transmits = [s for s in _named(trace, "transmit") if s.parent.span_id == request.context.span_id]
    receives = [s for s in _named(trace, "receive") if s.parent.span_id in {t.context.span_id for t in transmits}]
    assert len(transmits) == 2 and len(receives) == 2
    assert sorted(r.attributes["wsrm.duplicate"] for r in receives) == [False, True]
    first_receive = next(r for r in receives if not r.attributes["wsrm.duplicate"])
    [deliver] = [s for s in _named(trace, "deliver") if s.parent.span_id == first_receive.context.span_id]
    # the reply: enqueued in the delivery, sent, received and delivered to the client, same trace
    [reply] = [s for s in _named(trace, "send") if s.attributes["wsrm.reply"]]
    assert reply.parent.span_id == deliver.context.span_id
    reply_delivery = [s for s in _named(trace, "deliver") if s is not deliver]
    assert len(reply_delivery) == 1


def test_the_header_is_never_must_understand_and_only_sent_when_tracing(exporter, lossy_service):
    seen: list[bytes] = []

    def script(request):
        seen.append(request.body)

    proxy = LossyProxy(lossy_service.url, script=script).start()
    rc = _client(proxy.url)
    try:
        rc.service.record("traced")
        rc.flush(timeout=30)
        otel.uninstrument()
        rc.service.record("untraced")
        rc.flush(timeout=30)
    finally:
        rc.stop(timeout=5)
        proxy.stop()
    traced = next(b for b in seen if b">traced<" in b)
    untraced = next(b for b in seen if b">untraced<" in b)
    assert tracecontext.NS.encode() in traced and b"mustUnderstand" not in traced.split(b"TraceContext")[1]
    assert tracecontext.NS.encode() not in untraced


def test_the_call_span_ends_with_the_callers_transaction_and_says_how(exporter, lossy_service, tmp_path):
    from txmanager import TransactionManager

    tm = TransactionManager(node="otel-client", log=tmp_path / "tm.log")
    rc = reliable_client(zeep.Client(lossy_service.url + "?wsdl"), f"sqlite:///{tmp_path}/c.db", fast_policy(),
                         tm=tm)
    try:
        with tm.transaction():
            rc.service.record("kept")
            assert not _named(exporter.get_finished_spans(), "send")  # still open: the transaction is
        with pytest.raises(RuntimeError):
            with tm.transaction():
                rc.service.record("dropped")
                raise RuntimeError("the caller changes its mind")
        rc.flush(timeout=30)
    finally:
        rc.stop(timeout=5)
        tm.close()
    sends = {s.attributes["messaging.message.id"]: s for s in _named(exporter.get_finished_spans(), "send")}
    kept, dropped = sorted(sends.values(), key=lambda s: s.start_time)
    assert kept.attributes["wsrm.transaction.outcome"] == "committed" and kept.status.status_code is StatusCode.UNSET
    assert dropped.attributes["wsrm.transaction.outcome"] == "rolled back"
    assert dropped.status.status_code is StatusCode.ERROR
    assert kept.attributes["wsrm.transaction"] != dropped.attributes["wsrm.transaction"]
    transmitted = {s.parent.span_id for s in _named(exporter.get_finished_spans(), "transmit")}
    assert kept.context.span_id in transmitted and dropped.context.span_id not in transmitted
    assert service.recorded() == ["kept"]


def test_an_asyncio_callers_span_is_the_parent_of_its_call(exporter, lossy_service):
    import asyncio

    tracer = exporter.provider.get_tracer("shop")

    async def main():
        rc = await asyncio.to_thread(reliable_client, zeep.AsyncClient(lossy_service.url + "?wsdl"), "memory:",
                                     fast_policy(), start=False)
        async with rc:
            with tracer.start_as_current_span("checkout") as checkout:
                await rc.service.record("from-a-task")
            await rc.flush(timeout=30)
        return checkout

    checkout = asyncio.run(main())
    [send] = _named(exporter.get_finished_spans(), "send")
    assert send.parent is not None and send.parent.span_id == checkout.get_span_context().span_id
