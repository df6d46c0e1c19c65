"""The WS-Addressing interceptor on messages, without HTTP: what it writes and when it doesn't."""

from __future__ import annotations

import pytest
from lxml import etree

from interceptors import (
    AddressingInterceptor, Direction, InterceptorChain, Message, Role, apply_addressing,
    read_addressing,
)
from wsrm_plugin.wire.addressing import AddressingHeaders, EndpointReference
from wsrm_plugin.wire.faults import (
    InvalidAddressingHeader, MessageAddressingHeaderRequired, UnknownSequence,
)
from wsrm_plugin.wire.namespaces import RM11, SOAP11, SOAP12, WSA_2004_08, WSA_2005_08
from wsrm_plugin.wire.soap import build_envelope, fault_envelope, is_must_understand


def request(soap=SOAP11, headers=(), **kwargs) -> Message:
    return Message(build_envelope(soap, list(headers), etree.Element("{urn:svc}Op")),
                   Direction.OUT, Role.CLIENT, address="http://peer/svc", **kwargs)


def wsa(message: Message) -> AddressingHeaders:
    return AddressingHeaders.from_header(message.header_elements())


def test_a_request_gets_to_action_message_id_and_reply_to():
    message = request(action="urn:svc/Op")
    InterceptorChain([AddressingInterceptor()]).handle_out(message)
    written = wsa(message)
    assert written.version is WSA_2005_08
    assert (written.to, written.action) == ("http://peer/svc", "urn:svc/Op")
    assert written.message_id.startswith("urn:uuid:") and written.reply_to.is_anonymous
    assert message.addressing == written


def test_the_action_falls_back_to_the_http_action_then_the_body_name():
    from_http = request(http_headers={"SOAPAction": '"urn:from-http"'})
    apply_addressing(from_http)
    assert from_http.addressing.action == "urn:from-http"
    from_body = request()
    apply_addressing(from_body)
    assert from_body.addressing.action == "urn:svc/Op"


def test_writing_is_idempotent_so_a_stored_copy_keeps_its_message_id():
    message = request(action="a")
    first = apply_addressing(message)          # what a WS-RM interceptor does before storing
    InterceptorChain([AddressingInterceptor()]).handle_out(message)
    assert len(message.header_elements()) == len(first.to_elements())
    assert wsa(message).message_id == first.message_id


def test_preset_properties_win_and_the_version_and_must_understand_are_honoured():
    message = request(SOAP12, action="a")
    message.addressing = AddressingHeaders(message_id="urn:mine", to="http://elsewhere/")
    AddressingInterceptor(WSA_2004_08, must_understand=True,
                          reply_to="http://me/replies").handle_out(message)
    written = wsa(message)
    assert written.version is WSA_2004_08
    assert (written.message_id, written.to) == ("urn:mine", "http://elsewhere/")
    assert written.reply_to == EndpointReference("http://me/replies")
    marked = {etree.QName(h).localname for h in message.header_elements()
              if is_must_understand(h, SOAP12)}
    assert marked == {"To", "Action"}


def server_pair(request_headers: AddressingHeaders | None, *, fault=None):
    headers = request_headers.to_elements() if request_headers else []
    incoming = Message(build_envelope(SOAP11, headers, etree.Element("{urn:svc}Op")),
                       Direction.IN, Role.SERVER)
    if fault is None:
        body = build_envelope(SOAP11, [], etree.Element("{urn:svc}OpResponse"))
    else:
        body = fault_envelope(fault, SOAP11)
    reply = Message(body, Direction.OUT, Role.SERVER, exchange=incoming.exchange)
    reply.fault = fault
    return incoming, reply


def test_a_reply_answers_the_request_reply_to_and_echoes_reference_parameters():
    parameter = etree.Element("{urn:p}Ticket")
    parameter.text = "42"
    sent = AddressingHeaders(action="urn:svc/Op", message_id="urn:uuid:1",
                             reply_to=EndpointReference("http://client/cb", [parameter]),
                             version=WSA_2004_08)
    incoming, reply = server_pair(sent)
    chain = InterceptorChain([AddressingInterceptor()])
    chain.handle_in(incoming)
    chain.handle_out(reply)
    answered = wsa(reply)
    assert answered.version is WSA_2004_08                   # answers in the request's version
    assert (answered.to, answered.relates_to) == ("http://client/cb", "urn:uuid:1")
    assert answered.action == "urn:svc/OpResponse"
    # 2004/08 echoes reference parameters as plain header blocks (no IsReferenceParameter).
    assert [h.text for h in reply.header_elements() if h.tag == "{urn:p}Ticket"] == ["42"]


def test_a_fault_reply_gets_the_fault_action_of_its_fault():
    fault = UnknownSequence("urn:seq", version=RM11)
    incoming, reply = server_pair(AddressingHeaders(action="a", message_id="urn:uuid:2",
                                                    version=WSA_2005_08), fault=fault)
    AddressingInterceptor().handle_out(reply)
    assert wsa(reply).action == fault.fault_action(WSA_2005_08)
    assert wsa(reply).relates_to == "urn:uuid:2"


def test_no_ws_addressing_in_the_request_means_none_in_the_reply():
    incoming, reply = server_pair(None)
    chain = InterceptorChain([AddressingInterceptor()])
    chain.handle_in(incoming)
    chain.handle_out(reply)
    assert read_addressing(incoming).version is None
    assert reply.header_elements() == [] and reply.addressing is None


def test_required_addressing_and_bad_headers_are_the_ws_a_faults():
    incoming, _ = server_pair(None)
    with pytest.raises(MessageAddressingHeaderRequired, match="requires WS-Addressing"):
        AddressingInterceptor(required=True).handle_in(incoming)
    without_action, _ = server_pair(AddressingHeaders(message_id="urn:uuid:3", version=WSA_2005_08))
    with pytest.raises(MessageAddressingHeaderRequired, match="Action"):
        AddressingInterceptor().handle_in(without_action)
    twice = AddressingHeaders(action="a", version=WSA_2005_08).to_elements() * 2
    doubled = Message(build_envelope(SOAP11, twice, etree.Element("{urn:svc}Op")),
                      Direction.IN, Role.SERVER)
    with pytest.raises(InvalidAddressingHeader, match="at most once"):
        AddressingInterceptor().handle_in(doubled)


def test_unknown_versions_are_refused():
    with pytest.raises(ValueError, match="unknown WS-Addressing namespace"):
        AddressingInterceptor("urn:not-wsa")
