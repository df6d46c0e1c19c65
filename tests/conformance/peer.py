"""A peer that writes its WS-RM messages by hand, as another implementation would, and reads the answers.

The conformance tests need to put on the wire exactly what CXF, gSOAP, WCF or
the specifications' examples put there, and to look at every header of every
answer (each acknowledgement's ranges, Final, fault codes).  A reliable client
of this project would hide both; this peer posts raw envelopes over real HTTP
and parses what comes back with the package's wire classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from lxml import etree

from tests.engine.support import RawResponse, post
from wsrm_plugin.wire import (
    RM11, SOAP12, AckRequested, AddressingHeaders, AddressingVersion, CloseSequence, CreateSequence,
    CreateSequenceResponse, EndpointReference, Offer, RMVersion, SequenceAcknowledgement, SequenceHeader,
    SoapFault, SoapVersion, TerminateSequence, build_envelope, new_message_id, parse_envelope,
    parse_rm_element, to_bytes,
)

from .service import TNS


def acks_of(response: RawResponse) -> list[SequenceAcknowledgement]:
    """Every SequenceAcknowledgement header of an answer (none for an empty 202)."""
    if not response.body:
        return []
    found = []
    for header in parse_envelope(response.body).headers:
        parsed = parse_rm_element(header)
        if parsed is not None and isinstance(parsed[0], SequenceAcknowledgement):
            found.append(parsed[0])
    return found


def ranges_of(response: RawResponse, identifier: str) -> list[tuple[int, int]] | None:
    """The ranges of the answer's acknowledgement of ``identifier``; None when it carries none."""
    for ack in acks_of(response):
        if ack.identifier == identifier:
            return [tuple(r) for r in ack.ranges]
    return None


def fault_of(response: RawResponse) -> SoapFault | None:
    return parse_envelope(response.body).fault() if response.body else None


def echo(text: str) -> etree._Element:
    element = etree.Element(f"{{{TNS}}}echo", nsmap={"c": TNS})
    etree.SubElement(element, f"{{{TNS}}}text").text = text
    return element


def note(text: str) -> etree._Element:
    element = etree.Element(f"{{{TNS}}}note", nsmap={"c": TNS})
    etree.SubElement(element, f"{{{TNS}}}text").text = text
    return element


@dataclass
class RawPeer:
    """One hand-writing peer of ``url`` (its anonymous ReplyTo: it has no listener)."""

    url: str
    rm: RMVersion = RM11
    soap: SoapVersion = SOAP12
    wsa: AddressingVersion | None = None
    #: Every (request, answer) exchanged, in order.
    log: list[tuple[bytes, RawResponse]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.wsa is None:
            self.wsa = self.rm.addressing

    @property
    def anonymous(self) -> str:
        assert self.wsa is not None
        return self.wsa.anonymous

    def post(self, envelope: bytes) -> RawResponse:
        response = post(self.url, envelope, soap=self.soap)
        self.log.append((envelope, response))
        return response

    def envelope(self, action: str, body: etree._Element | None, headers: Iterable[etree._Element] = (),
                 *, reply_to: str | None = None) -> bytes:
        assert self.wsa is not None
        addressing = AddressingHeaders(to=self.url, action=action, message_id=new_message_id(),
                                       reply_to=EndpointReference(reply_to or self.anonymous), version=self.wsa)
        return to_bytes(build_envelope(self.soap, [*addressing.to_elements(self.wsa, soap=self.soap), *headers],
                                       body))

    # -- protocol messages -------------------------------------------------------------------

    def create_sequence(self, *, offer: bool = False, headers: Iterable[etree._Element] = ()
                        ) -> tuple[CreateSequenceResponse | None, RawResponse, str | None]:
        """(the response read, the raw answer, the offered identifier)."""
        offered = f"urn:uuid:{new_message_id()[9:]}" if offer else None
        request = CreateSequence(
            EndpointReference(self.anonymous),
            offer=Offer(offered, endpoint=EndpointReference(self.anonymous) if self.rm.is_11 else None)
            if offered else None)
        assert self.wsa is not None
        response = self.post(self.envelope(self.rm.create_sequence_action, request.to_xml(self.rm, self.wsa),
                                           headers))
        body = parse_envelope(response.body).body_element if response.body else None
        parsed = parse_rm_element(body) if body is not None else None
        created = parsed[0] if parsed is not None and isinstance(parsed[0], CreateSequenceResponse) else None
        return created, response, offered

    def open(self, *, offer: bool = False) -> tuple[str, str | None]:
        created, response, offered = self.create_sequence(offer=offer)
        assert created is not None, response
        return created.identifier, offered

    def message(self, identifier: str, number: int, body: etree._Element | None, *, action: str | None = None,
                ack_requested: bool = False, headers: Iterable[etree._Element] = (),
                last: bool = False) -> RawResponse:
        blocks = [SequenceHeader(identifier, number, last_message=last).to_xml(self.rm, self.soap)]
        if ack_requested:
            blocks.append(AckRequested(identifier).to_xml(self.rm, self.soap))
        name = etree.QName(body).localname if body is not None else "empty"
        return self.post(self.envelope(action or f"{TNS}/{name}", body, [*blocks, *headers]))

    def ack_request(self, identifier: str) -> RawResponse:
        return self.post(self.envelope(self.rm.action("AckRequested"), None,
                                       [AckRequested(identifier).to_xml(self.rm, self.soap)]))

    def acknowledge(self, ack: SequenceAcknowledgement) -> RawResponse:
        return self.post(self.envelope(self.rm.sequence_acknowledgement_action, None,
                                       [ack.to_xml(self.rm, self.soap)]))

    def close(self, identifier: str, last: int | None = None) -> RawResponse:
        return self.post(self.envelope(self.rm.action("CloseSequence"),
                                       CloseSequence(identifier, last).to_xml(self.rm)))

    def terminate(self, identifier: str, last: int | None = None) -> RawResponse:
        return self.post(self.envelope(self.rm.action("TerminateSequence"),
                                       TerminateSequence(identifier, last).to_xml(self.rm)))
