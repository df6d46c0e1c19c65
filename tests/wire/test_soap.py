"""SOAP 1.1 / 1.2 envelopes: building, reading, version detection, mustUnderstand."""

from __future__ import annotations

import pytest
from lxml import etree

from tests.wire import assert_valid
from wsrm_plugin.wire import (
    RM11, SOAP11, SOAP12, WSA_2005_08, Envelope, MalformedMessageError, MustUnderstandFault,
    SequenceHeader, SoapVersion, VersionMismatchFault, build_envelope, parse_envelope, to_bytes,
)

SOAPS = [SOAP11, SOAP12]


def _payload() -> etree._Element:
    element = etree.Element("{urn:app}Echo", nsmap={"app": "urn:app"})
    etree.SubElement(element, "{urn:app}text").text = "hello"
    return element


@pytest.mark.parametrize("soap", SOAPS)
def test_build_and_parse_round_trip(soap):
    header = SequenceHeader("urn:s", 1).to_xml(RM11, soap)
    envelope = build_envelope(soap, [header], _payload())
    assert_valid(envelope, RM11.ns, WSA_2005_08.ns)
    read = parse_envelope(to_bytes(envelope))
    assert read.version is soap
    assert [h.tag for h in read.headers] == [header.tag]
    assert read.header(RM11.qname("Sequence")) is not None
    assert read.header("{urn:nothing}Here") is None
    assert read.headers_named(RM11.qname("Sequence"))[0].tag == header.tag
    assert (etree.tostring(read.body_element, method="c14n", exclusive=True)
            == etree.tostring(_payload(), method="c14n", exclusive=True))
    assert not read.is_fault and read.fault() is None


@pytest.mark.parametrize("soap", SOAPS)
def test_envelope_without_header_and_with_empty_body(soap):
    envelope = build_envelope(soap)
    assert [etree.QName(c).localname for c in envelope] == ["Body"]
    assert_valid(envelope, RM11.ns, WSA_2005_08.ns)
    read = parse_envelope(to_bytes(envelope))
    assert read.headers == [] and read.body == [] and read.body_element is None


def test_building_copies_elements_that_belong_to_another_tree():
    owner = etree.Element("owner")
    owner.append(_payload())
    build_envelope(SOAP12, [owner[0]], owner[0])
    assert len(owner) == 1, "build_envelope moved an element out of the caller's tree"


def test_several_body_parts():
    envelope = build_envelope(SOAP11, body=[_payload(), _payload()])
    assert len(parse_envelope(to_bytes(envelope)).body) == 2


@pytest.mark.parametrize("data", [
    b'<Envelope xmlns="urn:not-soap"><Body/></Envelope>',
    b'<Envelope><Body/></Envelope>',
    b'<soap:Body xmlns:soap="http://www.w3.org/2003/05/soap-envelope"/>',
    b'<html><body>502 Bad Gateway</body></html>',
])
def test_not_a_soap_envelope_is_version_mismatch(data):
    with pytest.raises(VersionMismatchFault) as info:
        parse_envelope(data)
    assert info.value.code == "VersionMismatch"


@pytest.mark.parametrize("soap", SOAPS)
@pytest.mark.parametrize("inner, why", [
    ("<s:Header/>", "no Body"),
    ("<s:Body/><s:Header/>", "unexpected"),
    ("<s:Body/><s:Body/>", "unexpected"),
    ("<s:Header/><s:Header/><s:Body/>", "unexpected"),
    ("<x:Other xmlns:x='urn:x'/><s:Body/>", "unexpected"),
])
def test_broken_envelope_structure_is_malformed(soap, inner, why):
    data = f'<s:Envelope xmlns:s="{soap.ns}">{inner}</s:Envelope>'.encode()
    with pytest.raises(MalformedMessageError, match=why):
        parse_envelope(data)


def test_soap11_tolerates_trailing_elements_soap12_does_not():
    trailer = "<s:Body/><x:Trailer xmlns:x='urn:x'/>"
    assert parse_envelope(f'<s:Envelope xmlns:s="{SOAP11.ns}">{trailer}</s:Envelope>'.encode()).body == []
    with pytest.raises(MalformedMessageError):
        parse_envelope(f'<s:Envelope xmlns:s="{SOAP12.ns}">{trailer}</s:Envelope>'.encode())


def test_from_element_reads_trees_built_elsewhere_with_comments():
    root = etree.fromstring(
        f'<s:Envelope xmlns:s="{SOAP11.ns}"><!-- zeep --><s:Header><!-- c --><a xmlns="urn:a"/>'
        '</s:Header><s:Body><b xmlns="urn:b"/></s:Body></s:Envelope>')
    read = Envelope.from_element(root)
    assert [h.tag for h in read.headers] == ["{urn:a}a"] and read.body_element.tag == "{urn:b}b"


def _with_headers(soap, headers: str) -> Envelope:
    return parse_envelope(
        f'<s:Envelope xmlns:s="{soap.ns}" xmlns:x="urn:x"><s:Header>{headers}</s:Header>'
        '<s:Body/></s:Envelope>'.encode())


@pytest.mark.parametrize("soap, yes, no", [(SOAP11, "1", "0"), (SOAP12, "true", "false")])
def test_check_must_understand(soap, yes, no):
    envelope = _with_headers(soap, f'<x:Known s:mustUnderstand="{yes}"/><x:Unknown s:mustUnderstand="{yes}"/>'
                                   f'<x:Optional s:mustUnderstand="{no}"/><x:Plain/>')
    envelope.check_must_understand({"{urn:x}Known", "{urn:x}Unknown"})
    with pytest.raises(MustUnderstandFault) as info:
        envelope.check_must_understand({"{urn:x}Known"})
    assert info.value.not_understood == [etree.QName("urn:x", "Unknown")]
    assert info.value.code == "MustUnderstand"


def test_must_understand_ignores_headers_for_other_roles():
    envelope = _with_headers(SOAP12, '<x:A s:mustUnderstand="true" s:role="http://www.w3.org/2003/05/soap-envelope/role/none"/>'
                                     '<x:B s:mustUnderstand="true" s:role="urn:some-intermediary"/>')
    envelope.check_must_understand(set())
    envelope = _with_headers(SOAP12, '<x:C s:mustUnderstand="true" s:role="http://www.w3.org/2003/05/soap-envelope/role/ultimateReceiver"/>')
    with pytest.raises(MustUnderstandFault):
        envelope.check_must_understand(set())
    envelope = _with_headers(SOAP11, '<x:D s:mustUnderstand="1" s:actor="urn:elsewhere"/>')
    envelope.check_must_understand(set())


def test_http_headers_put_the_action_where_each_version_wants_it():
    assert SOAP11.http_headers("urn:a") == {"Content-Type": "text/xml; charset=utf-8", "SOAPAction": '"urn:a"'}
    assert SOAP12.http_headers("urn:a") == {
        "Content-Type": 'application/soap+xml; charset=utf-8; action="urn:a"'}
    assert SOAP12.http_headers() == {"Content-Type": "application/soap+xml; charset=utf-8"}


def test_versions_are_found_by_namespace():
    assert SoapVersion.for_namespace(SOAP11.ns) is SOAP11
    assert SoapVersion.for_namespace(SOAP12.ns) is SOAP12
    assert SoapVersion.for_namespace("urn:x") is None
    assert SOAP11.code("Sender") == "Client" and SOAP12.code("Sender") == "Sender"
    assert SOAP11.generic_code("Server") == "Receiver"
