"""The WS-I Reliable Secure Profile 1.0 checklist, for what it asks of WS-RM, WS-Addressing and
WS-MakeConnection: the checks that no other conformance test makes (docs/conformance.md lists
every item with the test that shows it)."""

from __future__ import annotations

from lxml import etree

from wsrm_plugin.wire import (
    RM11, SOAP11, SOAP12, AddressingHeaders, SequenceHeader, UnknownSequence, parse_envelope, parse_rm_element,
)

from .peer import RawPeer, echo, fault_of


def _sequence_header(response) -> etree._Element | None:
    for header in parse_envelope(response.body).headers:
        parsed = parse_rm_element(header)
        if parsed is not None and isinstance(parsed[0], SequenceHeader):
            return header
    return None


def test_a_reply_on_the_offered_sequence_has_a_must_understand_sequence_header(servers):
    """WS-RM 1.1 section 3.3 (the Sequence header is mustUnderstand), in both SOAP versions."""
    for soap, true in ((SOAP12, "true"), (SOAP11, "1")):
        server = servers(soap=soap.name)
        peer = RawPeer(server.url, soap=soap)
        identifier, _ = peer.open(offer=True)
        reply = peer.message(identifier, 1, echo("mu"))
        header = _sequence_header(reply)
        assert header is not None and header.get(soap.qname("mustUnderstand").text) == true


def test_answers_relate_to_the_request_and_name_their_action(peer):
    """WS-Addressing: a response carries wsa:Action and wsa:RelatesTo the request's MessageID; a
    fault carries the WS-RM fault action (WS-RM 1.1 section 4)."""
    created, response, _ = peer.create_sequence(offer=True)
    sent = AddressingHeaders.from_header(parse_envelope(peer.log[-1][0]).headers)
    answer = AddressingHeaders.from_header(parse_envelope(response.body).headers)
    assert answer.relates_to == sent.message_id and answer.action == RM11.create_sequence_response_action
    unknown = peer.ack_request("urn:uuid:not-a-sequence")
    fault = fault_of(unknown)
    assert isinstance(fault, UnknownSequence) and fault.identifier == "urn:uuid:not-a-sequence"
    headers = AddressingHeaders.from_header(parse_envelope(unknown.body).headers)
    assert headers.action == RM11.fault_action
    assert headers.relates_to == AddressingHeaders.from_header(parse_envelope(peer.log[-1][0]).headers).message_id


def test_a_repeated_create_sequence_gets_the_same_sequence(peer):
    """A CreateSequence sent again with its MessageID (its response was lost) opens no second
    sequence: the same response comes back."""
    first = peer.post(peer.envelope(RM11.create_sequence_action, _create(peer)))
    again = peer.post(peer.log[-1][0])
    ids = [parse_rm_element(parse_envelope(r.body).body_element)[0].identifier for r in (first, again)]
    assert ids[0] == ids[1]


def _create(peer: RawPeer) -> etree._Element:
    from wsrm_plugin.wire import CreateSequence, EndpointReference

    return CreateSequence(EndpointReference(peer.anonymous)).to_xml(RM11, peer.wsa)
