"""The store's gauges and the engine's counters through OpenTelemetry metrics, beside the Prometheus text."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tests.spyne_server.conftest import fast_policy
from wsrm_plugin import otel
from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.metrics import GAUGES, exposition
from wsrm_plugin.status import report


def _points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict, float]]]:
    found: dict[str, list[tuple[dict, float]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = [(dict(p.attributes or {}), p.value) for p in metric.data.data_points]
    return found


def test_every_prometheus_gauge_is_an_opentelemetry_instrument_with_the_same_value(tmp_path):
    # a client engine whose peer answers nothing yet: its messages stay unacknowledged
    client = ReliableEngine(f"sqlite:///{tmp_path}/c.db", fast_policy(), name="client")
    reader = InMemoryMetricReader()
    otel.register_metrics(client.store, engine=client, meter_provider=MeterProvider(metric_readers=[reader]))
    envelope = (b'<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/"><s:Body>'
                b'<n xmlns="urn:t">x</n></s:Body></s:Envelope>')
    for _ in range(3):
        client.send("http://127.0.0.1:9/", envelope, action="urn:t:n")  # nobody listens on port 9
    try:
        points = _points(reader)
        text = exposition(report(client.store))
        for name, _, value in GAUGES:
            otel_name = name.replace("_", ".", 1)
            assert otel_name in points, sorted(points)
            assert points[otel_name][0][1] == value(report(client.store))
            assert f"{name} {value(report(client.store))}" in text
        assert points["wsrm.unacknowledged_messages"] == [({}, 3)]
        assert [attributes["side"] for attributes, _ in points["wsrm.sequences"]] == ["source"]
        assert [attributes for attributes, _ in points["wsrm.sequence.unacknowledged_messages"]] == [
            {"sequence": report(client.store).sequences[0].sequence_id}]
        assert {name: value for name, [(_, value)] in points.items() if name.startswith("wsrm.engine.")} == {
            f"wsrm.engine.{field}": 0 for field, _ in otel.metrics.ENGINE_COUNTERS}
    finally:
        client.stop(timeout=5)
