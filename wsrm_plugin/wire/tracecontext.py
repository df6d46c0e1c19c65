"""The trace context SOAP header: W3C Trace Context's two fields, in a namespace of this project.

A message's trace follows it across the hop in its envelope, not in HTTP
headers: a reliable message is stored, sent again after a crash or a lost
answer, and delivered later in another thread, and only the envelope goes
all that way.  The header::

    <tc:TraceContext xmlns:tc="urn:wsrm-plugin:trace-context">
      <tc:traceparent>00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01</tc:traceparent>
      <tc:tracestate>vendor=value</tc:tracestate>          <!-- when there is one -->
    </tc:TraceContext>

carries the ``traceparent`` and ``tracestate`` fields exactly as the W3C
Trace Context HTTP headers do (https://www.w3.org/TR/trace-context/).  It is
never ``mustUnderstand``: a peer that does not know it ignores it, as SOAP
says of any header it does not understand that does not demand it.

Each hop names its own span as the parent: the sender rewrites the
parent-id of the stored message for every transmission (so each attempt is
the parent of what the receiver does with that copy), and the receiver
rewrites it in what it stores (so the delivery is the child of the receive
that stored it).  The rewrite is done on the bytes (:func:`with_parent`):
the parent-id has a fixed length, and a stored message is not parsed again
for it.
"""

from __future__ import annotations

import re

from lxml import etree

__all__ = ["NS", "TRACE_CONTEXT", "header", "read", "read_element", "with_parent", "set_parent",
           "valid_traceparent"]

#: The namespace of the header: this project's, not a standard's (none exists for SOAP).
NS = "urn:wsrm-plugin:trace-context"
TRACE_CONTEXT = etree.QName(NS, "TraceContext").text
_PARENT = etree.QName(NS, "traceparent").text
_STATE = etree.QName(NS, "tracestate").text

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
#: The traceparent element's text in serialized bytes (any prefix): where the parent-id is rewritten.
_IN_BYTES = re.compile(rb"<(?:[A-Za-z_][\w.-]*:)?traceparent(?:\s[^>]*)?>\s*00-[0-9a-f]{32}-([0-9a-f]{16})-")
_NS_BYTES = NS.encode()
_BODY = re.compile(rb"<(?:[A-Za-z_][\w.-]*:)?Body[\s>/]")


def valid_traceparent(value: str) -> bool:
    """A version-00 traceparent with a trace id and a parent id that are not all zeros."""
    match = _TRACEPARENT.match(value)
    return match is not None and match.group(1) != "0" * 32 and match.group(2) != "0" * 16


def header(traceparent: str, tracestate: str | None = None) -> etree._Element:
    """The header element for these fields (ValueError for a traceparent W3C would not accept)."""
    if not valid_traceparent(traceparent):
        raise ValueError(f"{traceparent!r} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")
    element = etree.Element(TRACE_CONTEXT, nsmap={"tc": NS})
    etree.SubElement(element, _PARENT).text = traceparent
    if tracestate:
        etree.SubElement(element, _STATE).text = tracestate
    return element


def read_element(element: etree._Element) -> tuple[str, str | None] | None:
    """(traceparent, tracestate) of a TraceContext header element; None when it is not valid."""
    parent = (element.findtext(_PARENT) or "").strip()
    if not valid_traceparent(parent):
        return None
    state = (element.findtext(_STATE) or "").strip() or None
    return parent, state


def read(headers: list[etree._Element] | None = None, data: bytes | None = None) -> tuple[str, str | None] | None:
    """The trace context of a message: from its parsed header elements, else from its bytes."""
    if headers is not None:
        for element in headers:
            if element.tag == TRACE_CONTEXT:
                return read_element(element)
        return None
    if data is None or _NS_BYTES not in data:
        return None
    head = _head(data)
    start = head.find(b"TraceContext")
    if start < 0:
        return None
    end = head.find(b"TraceContext", start + 12)
    block = head[start:end if end > 0 else len(head)]
    parent = re.search(rb"traceparent(?:\s[^>]*)?>\s*([^<\s]+)", block)
    if parent is None:
        return None
    traceparent = parent.group(1).decode("ascii", "replace")
    if not valid_traceparent(traceparent):
        return None
    state = re.search(rb"tracestate(?:\s[^>]*)?>([^<]*)<", block)
    tracestate = state.group(1).decode("utf-8", "replace").strip() if state else None
    return traceparent, tracestate or None


def with_parent(data: bytes, span_id: str) -> bytes:
    """``data`` with its trace header's parent-id set to ``span_id`` (16 hex); unchanged without one."""
    if len(span_id) != 16 or _NS_BYTES not in data:
        return data
    match = _IN_BYTES.search(_head(data))
    if match is None:
        return data
    return data[:match.start(1)] + span_id.encode("ascii") + data[match.end(1):]


def set_parent(headers: list[etree._Element], span_id: str) -> bool:
    """Set the parent-id in a parsed envelope's trace header, as :func:`with_parent` does in its bytes.

    For a tree kept with its bytes (:mod:`wsrm_plugin.engine.parsed`): both must
    say the same.  False when there is no valid header to change.
    """
    for element in headers:
        if element.tag == TRACE_CONTEXT:
            parent = element.find(_PARENT)
            value = (parent.text or "").strip() if parent is not None else ""
            if parent is None or not valid_traceparent(value) or len(span_id) != 16:
                return False
            parent.text = f"{value[:36]}{span_id}{value[52:]}"
            return True
    return False


def _head(data: bytes) -> bytes:
    """The part of an envelope before its Body: a body's own "traceparent" is never read or changed."""
    body = _BODY.search(data)
    return data if body is None else data[:body.start()]
