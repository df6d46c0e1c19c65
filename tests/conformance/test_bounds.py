"""Bounded identifiers and fault details (issue 32, item 11).

A 1 MiB identifier, offered in CreateSequence or named in a Sequence header, is
refused before it is stored, with a fault that does not echo it back.
"""

from __future__ import annotations

from wsrm_plugin.wire import MalformedMessageError, SoapFault
from wsrm_plugin.wire.rm import MAX_IDENTIFIER_LENGTH

from .peer import RawPeer, fault_of, note

HUGE = "urn:x:" + "a" * (1 << 20)


def test_an_oversized_offered_identifier_is_refused_and_not_stored(server):
    peer = RawPeer(server.url)
    created, response, _ = _create_with_offer(peer, HUGE)
    assert created is None
    fault = fault_of(response)
    assert isinstance(fault, SoapFault) and fault.code == "Sender"
    assert len(response.body) < 8192, f"the fault is {len(response.body)} bytes"
    assert server.engine.store.status().rmd == () and server.engine.store.status().rms == ()


def test_an_oversized_identifier_in_a_sequence_header_gets_a_small_fault(peer):
    response = peer.message(HUGE, 1, note("x"))
    fault = fault_of(response)
    assert isinstance(fault, MalformedMessageError) or fault.code == "Sender"
    assert len(response.body) < 8192, f"the fault is {len(response.body)} bytes"
    assert str(MAX_IDENTIFIER_LENGTH) in fault.reason


def test_a_long_but_allowed_identifier_is_echoed_bounded_in_a_fault(peer):
    unknown = "urn:x:" + "b" * (MAX_IDENTIFIER_LENGTH - 6)
    response = peer.message(unknown, 1, note("x"))
    assert fault_of(response).code == "Sender"
    assert len(response.body) < 3 * MAX_IDENTIFIER_LENGTH + 4096


def _create_with_offer(peer: RawPeer, identifier: str):
    from wsrm_plugin.wire import CreateSequence, EndpointReference, Offer, parse_envelope, parse_rm_element

    request = CreateSequence(EndpointReference(peer.anonymous),
                             offer=Offer(identifier, endpoint=EndpointReference(peer.anonymous)))
    response = peer.post(peer.envelope(peer.rm.create_sequence_action, request.to_xml(peer.rm, peer.wsa)))
    body = parse_envelope(response.body).body_element
    parsed = parse_rm_element(body)
    created = parsed[0] if parsed is not None and type(parsed[0]).__name__ == "CreateSequenceResponse" else None
    return created, response, identifier
