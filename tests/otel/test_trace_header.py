"""The trace context header: W3C fields in our namespace, rewritten on the bytes, never in a body."""

from __future__ import annotations

import subprocess
import sys

import pytest
from lxml import etree

from wsrm_plugin.wire import tracecontext
from wsrm_plugin.wire.soap import SOAP11, build_envelope, to_bytes

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _envelope(body_text: str = "x", state: str | None = "vendor=1") -> bytes:
    body = etree.Element("{urn:t}note")
    body.text = body_text
    return to_bytes(build_envelope(SOAP11, [tracecontext.header(PARENT, state)], body))


def test_the_header_carries_both_fields_and_no_must_understand():
    data = _envelope()
    assert tracecontext.read(data=data) == (PARENT, "vendor=1")
    root = etree.fromstring(data)
    [header] = root.find(SOAP11.qname("Header").text)
    assert header.tag == tracecontext.TRACE_CONTEXT
    assert not any("mustUnderstand" in name for name in header.attrib)
    assert tracecontext.read(headers=list(root.find(SOAP11.qname("Header").text))) == (PARENT, "vendor=1")


def test_with_parent_changes_only_the_parent_id():
    data = _envelope()
    changed = tracecontext.with_parent(data, "1111222233334444")
    assert len(changed) == len(data)
    assert tracecontext.read(data=changed) == (PARENT.replace("00f067aa0ba902b7", "1111222233334444"), "vendor=1")


def test_a_body_that_looks_like_the_header_is_never_read_or_changed():
    plain = to_bytes(build_envelope(SOAP11, [], etree.fromstring(
        f"<n xmlns='urn:t' xmlns:tc='{tracecontext.NS}'><tc:traceparent>"
        "00-4bf92f3577b34da6a3ce929d0e0e4736-aaaaaaaaaaaaaaaa-01</tc:traceparent></n>")))
    assert tracecontext.read(data=plain) is None
    assert tracecontext.with_parent(plain, "1111222233334444") == plain


@pytest.mark.parametrize("bad", ["", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                                 "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                                 "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                                 "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"])
def test_a_traceparent_w3c_refuses_is_refused_or_ignored(bad):
    with pytest.raises(ValueError, match="traceparent"):
        tracecontext.header(bad)
    element = etree.Element(tracecontext.TRACE_CONTEXT)
    etree.SubElement(element, f"{{{tracecontext.NS}}}traceparent").text = bad
    assert tracecontext.read_element(element) is None


def test_nothing_of_opentelemetry_is_imported_without_the_instrumentation():
    code = ("import wsrm_plugin, wsrm_plugin.engine, wsrm_plugin.metrics, interceptors.zeep_client.client, "
            "interceptors.spyne_server.service, sys; print(any(m.startswith('opentelemetry') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_set_parent_changes_a_tree_as_with_parent_changes_its_bytes():
    data = _envelope()
    root = etree.fromstring(data)
    headers = list(root.find(SOAP11.qname("Header").text))
    assert tracecontext.set_parent(headers, "1111222233334444")
    assert to_bytes(root) == tracecontext.with_parent(data, "1111222233334444")
    assert not tracecontext.set_parent([], "1111222233334444")
