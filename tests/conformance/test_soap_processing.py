"""SOAP's processing model and its HTTP binding, before anything is acknowledged (issue 32, items 3-5).

* a header marked mustUnderstand that nothing in front of the service processes faults the
  message (MustUnderstand; SOAP 1.2 adds NotUnderstood headers), including WS-RM 1.1's
  UsesSequenceSTR and UsesSequenceSSL on CreateSequence, which bind a sequence to a security
  token or a TLS session this package does not implement; what the chain and the service do
  understand (WS-A, WS-RM, the method's declared header) still goes through;
* SOAP 1.1 faults travel with HTTP 500;
* a message whose body names no operation of the service is refused before it is
  acknowledged (WS-Addressing's ActionNotSupported), so its sequence is not blocked.
"""

from __future__ import annotations

from lxml import etree

from tests.engine.support import wait_for
from wsrm_plugin.wire import (
    RM10, RM11, SOAP11, SOAP12, ActionNotSupported, MustUnderstandFault, SoapFault, parse_envelope,
)
from wsrm_plugin.wire.soap import set_must_understand

from . import service
from .peer import RawPeer, fault_of, note, ranges_of

_STR = RM11.qname("UsesSequenceSTR")
_SSL = RM11.qname("UsesSequenceSSL")


def _marked(tag: etree.QName | str, soap, text: str | None = None) -> etree._Element:
    element = etree.Element(etree.QName(tag), nsmap={"x": etree.QName(tag).namespace})
    element.text = text
    return set_must_understand(element, soap)


def test_uses_sequence_str_on_create_sequence_is_refused_with_must_understand(server):
    for soap in (SOAP12, SOAP11):
        peer = RawPeer(server.url, soap=soap)
        created, response, _ = peer.create_sequence(headers=[_marked(_STR, soap)])
        assert created is None
        fault = fault_of(response)
        assert isinstance(fault, MustUnderstandFault) and fault.code == "MustUnderstand", fault
        assert response.status == 500  # both bindings: MustUnderstand is a 500
        if soap is SOAP12:
            envelope = parse_envelope(response.body)
            not_understood = envelope.headers_named(SOAP12.qname("NotUnderstood"))
            assert [h.get("qname").split(":")[1] for h in not_understood] == ["UsesSequenceSTR"]
    assert server.engine.store.status().rmd == ()  # no sequence was created


def test_uses_sequence_ssl_is_refused_too(server):
    peer = RawPeer(server.url)
    created, response, _ = peer.create_sequence(headers=[_marked(_SSL, SOAP12)])
    assert created is None and isinstance(fault_of(response), MustUnderstandFault)


def test_an_unknown_must_understand_header_on_an_application_message_is_refused_unacknowledged(peer):
    identifier, _ = peer.open()
    unknown = _marked("{urn:example:security}Token", SOAP12, "secret")
    response = peer.message(identifier, 1, note("guarded"), headers=[unknown])
    assert isinstance(fault_of(response), MustUnderstandFault)
    assert ranges_of(response, identifier) is None
    # nothing was recorded: the same number with the header dropped is message 1, accepted
    assert ranges_of(peer.message(identifier, 1, note("plain")), identifier) == [(1, 1)]
    assert wait_for(lambda: service.ran("plain") == 1)
    assert service.ran("guarded") == 0


def test_what_the_chain_and_the_service_understand_goes_through(peer):
    """wsa:Action and wsa:To (mustUnderstand, as WCF writes them), the WS-RM Sequence header
    (mustUnderstand as the spec writes it), and the Tag header the method declares."""
    identifier, _ = peer.open()
    tag = _marked(f"{{{service.TNS}}}Tag", SOAP12)
    etree.SubElement(tag, f"{{{service.TNS}}}value").text = "t1"
    body = etree.Element(f"{{{service.TNS}}}tagged", nsmap={"c": service.TNS})
    etree.SubElement(body, f"{{{service.TNS}}}text").text = "hello"
    response = peer.message(identifier, 1, body, headers=[tag])
    assert ranges_of(response, identifier) == [(1, 1)], response.body
    assert wait_for(lambda: service.ran("hello/t1") == 1)


def test_a_header_for_another_role_is_not_this_nodes_to_understand(peer):
    identifier, _ = peer.open()
    other = _marked("{urn:example:routing}Hop", SOAP12)
    other.set(SOAP12.qname("role").text, "urn:example:some-intermediary")
    assert ranges_of(peer.message(identifier, 1, note("routed"), headers=[other]), identifier) == [(1, 1)]


def test_a_header_the_deployment_understands_goes_through(servers):
    server = servers(understands=["{urn:example:security}Token"])
    peer = RawPeer(server.url)
    identifier, _ = peer.open()
    token = _marked("{urn:example:security}Token", SOAP12, "checked by a middleware")
    assert ranges_of(peer.message(identifier, 1, note("secured"), headers=[token]), identifier) == [(1, 1)]


def test_soap_1_1_faults_travel_with_http_500(servers):
    server = servers(soap="1.1")
    peer = RawPeer(server.url, rm=RM10, soap=SOAP11)
    response = peer.message("urn:uuid:no-such-sequence", 1, note("x"))
    assert response.status == 500 and fault_of(response).code == "Sender"
    created, response, _ = peer.create_sequence(headers=[_marked("{urn:x}Unknown", SOAP11)])
    assert response.status == 500 and isinstance(fault_of(response), MustUnderstandFault)


def test_a_make_connection_fault_over_soap_1_1_is_a_500(servers):
    from wsrm_plugin.wire.mc import MakeConnection
    from wsrm_plugin.wire.namespaces import MAKE_CONNECTION_ACTION

    server = servers(make_connection=True, soap="1.1")
    peer = RawPeer(server.url, soap=SOAP11)
    response = peer.post(peer.envelope(MAKE_CONNECTION_ACTION, MakeConnection("http://example.org/not-mc").to_xml()))
    assert response.status == 500
    fault = fault_of(response)
    assert fault.code == "Sender" and "not a WS-MC anonymous URI" in fault.reason
    envelope = parse_envelope(response.body)
    assert any(etree.QName(h).localname == "Action" for h in envelope.headers)  # a WS-A fault reply


def test_a_message_naming_no_operation_is_refused_before_it_is_acknowledged(peer):
    """Sandesha2's test message (its body names no operation here) and the WS-RM spec's own
    example flow (an empty body): ActionNotSupported, nothing acknowledged, nothing poisoned,
    and the sequence goes on."""
    identifier, _ = peer.open()
    stranger = etree.Element("{http://tempuri.org/}ping", nsmap={"t": "http://tempuri.org/"})
    refused = peer.message(identifier, 1, stranger, action="urn:wsrm:Ping")
    fault = fault_of(refused)
    assert isinstance(fault, ActionNotSupported) and fault.code == "Sender", fault
    assert ranges_of(refused, identifier) is None
    empty = peer.message(identifier, 1, None, action="http://example.com/serviceB/123/request")
    assert isinstance(fault_of(empty), ActionNotSupported) and ranges_of(empty, identifier) is None
    without_wsa = peer.message(identifier, 1, None, action="")
    assert isinstance(fault_of(without_wsa), SoapFault) and ranges_of(without_wsa, identifier) is None
    # the sequence is not blocked: message 1 with a real operation goes through and is delivered
    assert ranges_of(peer.message(identifier, 1, note("real")), identifier) == [(1, 1)]
    assert wait_for(lambda: service.ran("real") == 1)
    assert peer.url and not peer.log[-1][1].fault()


def test_a_ws_rm_1_0_last_message_marker_needs_no_operation(servers):
    server = servers(soap="1.1")
    peer = RawPeer(server.url, rm=RM10, soap=SOAP11)
    identifier, _ = peer.open()
    assert ranges_of(peer.message(identifier, 1, note("one")), identifier) == [(1, 1)]
    last = peer.message(identifier, 2, None, action=RM10.action("LastMessage"), last=True)
    assert ranges_of(last, identifier) == [(1, 2)], last.body
