"""WS-Addressing headers and endpoint references, 2004/08 and 2005/08."""

from __future__ import annotations

import pytest
from lxml import etree

from tests.wire import assert_valid
from wsrm_plugin.wire import (
    RM10, SOAP11, SOAP12, WSA_2004_08, WSA_2005_08, AddressingHeaders, EndpointReference,
    InvalidAddressingHeader, MessageAddressingHeaderRequired, build_envelope, mc_anonymous_uri,
    new_message_id, parse_envelope, to_bytes,
)

VERSIONS = [WSA_2004_08, WSA_2005_08]


def _param(name: str = "Key", text: str = "42") -> etree._Element:
    element = etree.Element(f"{{urn:app}}{name}", nsmap={"app": "urn:app"})
    element.text = text
    return element


def full_headers(wsa) -> AddressingHeaders:
    return AddressingHeaders(
        to="http://server.example/service",
        action="urn:example:Echo",
        message_id=new_message_id(),
        relates_to="urn:uuid:request-1",
        reply_to=EndpointReference("http://client.example/replies", [_param()]),
        fault_to=EndpointReference("http://client.example/faults"),
        from_=EndpointReference(wsa.anonymous),
        reference_parameters=[_param("Tenant", "acme")],
        version=wsa,
    )


@pytest.mark.parametrize("soap", [None, SOAP11, SOAP12])
@pytest.mark.parametrize("wsa", VERSIONS, ids=["wsa2004", "wsa2005"])
def test_headers_validate_and_round_trip(wsa, soap):
    headers = full_headers(wsa)
    elements = headers.to_elements(wsa, soap=soap)
    for element in elements:
        if etree.QName(element).namespace == wsa.ns:
            assert_valid(element, RM10.ns, wsa.ns)
    envelope = build_envelope(soap or SOAP12, elements)
    assert_valid(envelope, RM10.ns, wsa.ns)
    read = AddressingHeaders.from_header(parse_envelope(to_bytes(envelope)).headers)
    assert read.version is wsa
    if wsa is WSA_2005_08:
        assert read == headers
    else:
        # 2004/08 has no IsReferenceParameter marker: echoed parameters are plain headers.
        assert read == AddressingHeaders(**{**headers.__dict__, "reference_parameters": []})


@pytest.mark.parametrize("soap", [SOAP11, SOAP12])
def test_action_and_to_are_must_understand_when_soap_is_given(soap):
    elements = AddressingHeaders(to="http://x", action="urn:a", message_id="urn:m").to_elements(soap=soap)
    marked = {etree.QName(e).localname for e in elements
              if e.get(f"{{{soap.ns}}}mustUnderstand") == soap.must_understand_true}
    assert marked == {"To", "Action"}


def test_reference_parameters_are_marked_in_2005_08():
    (element,) = AddressingHeaders(reference_parameters=[_param()]).to_elements(WSA_2005_08)
    assert element.get(f"{{{WSA_2005_08.ns}}}IsReferenceParameter") == "true"
    (plain,) = AddressingHeaders(reference_parameters=[_param()]).to_elements(WSA_2004_08)
    assert plain.get(f"{{{WSA_2005_08.ns}}}IsReferenceParameter") is None


@pytest.mark.parametrize("wsa, kind", [
    (WSA_2005_08, "http://example.org/relationship/previous"),
    (WSA_2004_08, "{urn:rel}Previous"),
    (WSA_2004_08, f"{{{WSA_2004_08.ns}}}Other"),
])
def test_non_reply_relationship_round_trips(wsa, kind):
    headers = AddressingHeaders(relates_to="urn:uuid:x", relationship_type=kind, version=wsa)
    elements = headers.to_elements()
    assert_valid(elements[0], RM10.ns, wsa.ns)
    assert AddressingHeaders.from_header(parse_envelope(to_bytes(build_envelope(SOAP12, elements))).headers) == headers


@pytest.mark.parametrize("wsa", VERSIONS)
def test_explicit_reply_relationship_reads_as_default(wsa):
    value = "wsa:Reply" if wsa is WSA_2004_08 else wsa.reply_relationship
    element = etree.fromstring(
        f'<wsa:RelatesTo xmlns:wsa="{wsa.ns}" RelationshipType="{value}">urn:x</wsa:RelatesTo>')
    read = AddressingHeaders.from_header([element])
    assert (read.relates_to, read.relationship_type) == ("urn:x", None)


def test_reply_relationship_is_preferred_among_several_relates_to():
    wsa = WSA_2005_08.ns
    headers = [
        etree.fromstring(f'<wsa:RelatesTo xmlns:wsa="{wsa}" RelationshipType="urn:other">urn:a</wsa:RelatesTo>'),
        etree.fromstring(f'<wsa:RelatesTo xmlns:wsa="{wsa}">urn:b</wsa:RelatesTo>'),
    ]
    assert AddressingHeaders.from_header(headers).relates_to == "urn:b"


def test_no_addressing_headers_reads_as_empty():
    read = AddressingHeaders.from_header([etree.fromstring('<x xmlns="urn:other"/>')])
    assert read.version is None and read.action is None and read == AddressingHeaders()


def _header(wsa, local: str, text: str = "urn:x") -> etree._Element:
    return etree.fromstring(f'<wsa:{local} xmlns:wsa="{wsa.ns}">{text}</wsa:{local}>')


def test_mixed_versions_are_invalid():
    with pytest.raises(InvalidAddressingHeader, match="mixes"):
        AddressingHeaders.from_header([_header(WSA_2004_08, "Action"), _header(WSA_2005_08, "To")])


@pytest.mark.parametrize("wsa", VERSIONS)
def test_duplicate_single_valued_header_is_invalid_cardinality(wsa):
    with pytest.raises(InvalidAddressingHeader) as info:
        AddressingHeaders.from_header([_header(wsa, "Action"), _header(wsa, "Action", "urn:y")])
    fault = info.value
    assert fault.subsubcode == "InvalidCardinality"
    assert fault.problem_header == wsa.qname("Action") and fault.version is wsa


def test_empty_action_is_invalid():
    with pytest.raises(InvalidAddressingHeader, match="Action is empty"):
        AddressingHeaders.from_header([_header(WSA_2005_08, "Action", " ")])


def test_endpoint_without_address_is_missing_address_in_epr():
    reply_to = etree.fromstring(f'<wsa:ReplyTo xmlns:wsa="{WSA_2005_08.ns}"><wsa:Metadata/></wsa:ReplyTo>')
    with pytest.raises(InvalidAddressingHeader) as info:
        AddressingHeaders.from_header([reply_to])
    assert info.value.subsubcode == "MissingAddressInEPR"
    assert info.value.problem_header == WSA_2005_08.qname("ReplyTo")


def test_reply_headers_answer_to_reply_to_and_echo_its_parameters():
    request = full_headers(WSA_2005_08)
    reply = request.reply_headers("urn:example:EchoResponse")
    assert reply.to == "http://client.example/replies"
    assert reply.relates_to == request.message_id
    assert reply.action == "urn:example:EchoResponse" and reply.message_id.startswith("urn:uuid:")
    assert [etree.tostring(p) for p in reply.reference_parameters] == [etree.tostring(_param())]
    assert request.reply_headers("urn:fault", fault=True).to == "http://client.example/faults"


@pytest.mark.parametrize("wsa", VERSIONS)
def test_reply_without_reply_to_goes_to_anonymous(wsa):
    request = AddressingHeaders(action="urn:a", message_id="urn:m", version=wsa)
    assert request.reply_headers("urn:r").to == wsa.anonymous
    assert request.reply_headers("urn:r", fault=True).to == wsa.anonymous


def test_require_names_the_missing_header():
    headers = AddressingHeaders(action="urn:a", version=WSA_2004_08)
    headers.require("action")
    with pytest.raises(MessageAddressingHeaderRequired) as info:
        headers.require("action", "message_id")
    assert info.value.problem_header == WSA_2004_08.qname("MessageID")


def test_endpoint_reference_kinds():
    assert EndpointReference(WSA_2004_08.anonymous).is_anonymous
    assert EndpointReference(WSA_2005_08.anonymous).is_anonymous
    assert not EndpointReference("http://x").is_anonymous
    assert EndpointReference(WSA_2005_08.none).is_none
    assert EndpointReference(mc_anonymous_uri("client-7")).mc_id == "client-7"
    assert EndpointReference("http://x").mc_id is None


def test_reference_properties_become_parameters_in_2005_08():
    epr = EndpointReference("http://x", reference_properties=[_param()])
    element = epr.to_xml(WSA_2005_08.qname("ReplyTo"), WSA_2005_08)
    assert_valid(element, RM10.ns, WSA_2005_08.ns)
    read, version = EndpointReference.from_xml(element)
    assert version is WSA_2005_08
    assert read == EndpointReference("http://x", [_param()])


def test_endpoint_reference_equality_compares_parameters_by_content():
    assert EndpointReference("http://x", [_param()]) == EndpointReference("http://x", [_param()])
    assert EndpointReference("http://x", [_param()]) != EndpointReference("http://x", [_param(text="43")])
    assert EndpointReference("http://x") != EndpointReference("http://y")


def test_unknown_addressing_namespace_is_refused_when_writing():
    with pytest.raises(ValueError):
        AddressingHeaders(action="urn:a").to_elements("urn:not-addressing")


def test_a_new_message_id_is_a_random_rfc4122_uuid_urn():
    import uuid

    ids = [new_message_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for message_id in ids:
        assert message_id.startswith("urn:uuid:")
        parsed = uuid.UUID(message_id[len("urn:uuid:"):])
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert str(parsed) == message_id[len("urn:uuid:"):]  # lower case, canonical groups
    # every variant digit occurs (the two random bits of the clock sequence's first digit)
    assert {message_id[len("urn:uuid:") + 19] for message_id in ids} == set("89ab")


def test_headers_made_from_copies_are_each_their_own() -> None:
    """wsa:To/Action/MessageID are copies of blocks made once: one changed after it was written
    (an envelope's, stamped) never shows in the next message's."""
    first = AddressingHeaders(to="http://a/", action="urn:a", message_id="urn:uuid:1",
                              version=WSA_2005_08).to_elements(soap=SOAP11)
    for element in first:
        element.text = "changed"
        element.set("extra", "1")
    second = AddressingHeaders(to="http://b/", action="urn:b", message_id="urn:uuid:2",
                               version=WSA_2005_08).to_elements(soap=SOAP11)
    assert [e.text for e in second] == ["http://b/", "urn:b", "urn:uuid:2"]
    assert all(e.get("extra") is None for e in second)
    assert second[2].get(f"{{{SOAP11.ns}}}mustUnderstand") is None
