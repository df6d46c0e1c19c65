"""Helpers of the replay tests: load a stored message, adapt it to a live sequence, catch what the
service sends to the peer's own (unreachable) addresses."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from lxml import etree

from tests.engine.support import RawResponse, post
from wsrm_plugin.engine.transport import HttpTransport, Response
from wsrm_plugin.wire import (
    SequenceAcknowledgement, SequenceHeader, SoapVersion, parse_envelope, parse_rm_element, to_bytes,
)
from wsrm_plugin.wire.namespaces import ADDRESSING_VERSIONS, RM_VERSIONS
from wsrm_plugin.wire.xmlsafe import parse_xml

MESSAGES = Path(__file__).parent / "messages"


def stored(name: str) -> bytes:
    """A message as its project wrote it (``cxf/Message1.xml``)."""
    return (MESSAGES / name).read_bytes()


def adapt(data: bytes, *, to: str | None = None, identifiers: Mapping[str, str] | None = None,
          body: etree._Element | None = None, empty_body: bool = False) -> bytes:
    """``data`` with only what must change to reach a live sequence changed: wsa:To, the
    sequence Identifiers named in ``identifiers`` (old -> new, compared without the white space
    some peers write around them), and the Body's content."""
    root = parse_xml(data)
    soap = SoapVersion.for_namespace(etree.QName(root).namespace)
    assert soap is not None
    for element in root.iter():
        if not isinstance(element.tag, str):
            continue
        qname = etree.QName(element)
        if to is not None and qname.localname == "To" and qname.namespace in {v.ns for v in ADDRESSING_VERSIONS}:
            element.text = to
        if identifiers and qname.localname == "Identifier" and qname.namespace in {v.ns for v in RM_VERSIONS}:
            current = (element.text or "").strip()
            if current in identifiers:
                element.text = identifiers[current]
    if body is not None or empty_body:
        holder = root.find(soap.qname("Body").text)
        assert holder is not None
        for child in list(holder):
            holder.remove(child)
        holder.text = None
        if body is not None:
            holder.append(body)
    return to_bytes(root)


def send(url: str, data: bytes) -> RawResponse:
    """POST a stored or adapted envelope as its SOAP version is sent."""
    soap = SoapVersion.for_namespace(etree.QName(parse_xml(data)).namespace)
    assert soap is not None
    action = next((el.text.strip() for el in parse_xml(data).iter()
                   if isinstance(el.tag, str) and etree.QName(el).localname == "Action" and el.text), None)
    # the HTTP header cannot carry the line break some stored files have inside their wsa:Action
    return post(url, data, soap=soap, headers=soap.http_headers("".join(action.split()) if action else None))


class PeerTransport:
    """The service's transport: what it sends to the peers' own addresses (``hosts``, which do
    not exist here) is kept and answered 202, as a peer's listener would; anything else goes out."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self.hosts = {h.lower() for h in hosts}
        self.sent: list[tuple[str, bytes]] = []
        self._inner = HttpTransport(timeout=10.0)
        self._lock = threading.Lock()

    def send(self, address: str, envelope: bytes, headers: Mapping[str, str]) -> Response:
        if urlsplit(address).netloc.lower() in self.hosts:
            with self._lock:
                self.sent.append((address, bytes(envelope)))
            return Response(202, url=address)
        return self._inner.send(address, envelope, headers)

    def close(self) -> None:
        self._inner.close()

    def messages(self, address_part: str = "") -> list[bytes]:
        with self._lock:
            return [data for address, data in self.sent if address_part in address]

    def acks(self, identifier: str) -> list[SequenceAcknowledgement]:
        """Every acknowledgement of ``identifier`` sent to the peers, in order (standalone or riding)."""
        found = []
        for data in self.messages():
            for header in parse_envelope(data).headers:
                parsed = parse_rm_element(header)
                if parsed is not None and isinstance(parsed[0], SequenceAcknowledgement) \
                        and parsed[0].identifier == identifier:
                    found.append(parsed[0])
        return found

    def sequence_messages(self, identifier: str) -> list[tuple[int, bytes]]:
        """(number, envelope) of every message sent on sequence ``identifier``."""
        found = []
        for data in self.messages():
            for header in parse_envelope(data).headers:
                parsed = parse_rm_element(header)
                if parsed is not None and isinstance(parsed[0], SequenceHeader) and parsed[0].identifier == identifier:
                    found.append((parsed[0].message_number, data))
        return found


def body_of(response: RawResponse) -> etree._Element | None:
    return parse_envelope(response.body).body_element if response.body else None


def rm_body(response: RawResponse):
    element = body_of(response)
    parsed = parse_rm_element(element) if element is not None else None
    return parsed[0] if parsed is not None else None
