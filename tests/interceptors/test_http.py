"""zeep -> HTTP -> spyne with chains on both sides: what goes on the wire and who sees what."""

from __future__ import annotations

import threading

import pytest
import requests
import zeep
from lxml import etree

from interceptors import (
    AddressingInterceptor, Direction, Interceptor, InterceptorChain, Message, MessageConsumed,
    Phase, Response, Role,
)
from interceptors.spyne_server.adapter import engage
from interceptors.zeep_client.adapter import engage_client, resume_send
from wsrm_plugin.wire.addressing import AddressingHeaders
from wsrm_plugin.wire.namespaces import SOAP11, SOAP12, WSA_2005_08
from wsrm_plugin.wire.soap import Envelope, build_envelope
from wsrm_plugin.wire.xmlsafe import parse_xml

from .conftest import TNS, Service, Wire, make_service, serve


class Spy(Interceptor):
    """Keeps every message it sees."""

    def __init__(self, name: str = "spy", phase: Phase = Phase.DISPATCH) -> None:
        super().__init__(name=name, phase=phase)
        self.seen: list[Message] = []

    def handle_in(self, message: Message) -> None:
        self.seen.append(message)

    def handle_out(self, message: Message) -> None:
        self.seen.append(message)


class Holder(Interceptor):
    """Takes requests for the given operations out of the flow, like WS-RM's store does."""

    name = "holder"
    phase = Phase.RELIABLE_MESSAGING

    def __init__(self, *operations: str, answer: Response | None = None, suspend: bool = True):
        super().__init__()
        self.operations, self.answer, self.suspend = operations, answer, suspend
        self.held: list[Message] = []

    def _take(self, message: Message) -> None:
        body = message.body_element
        if message.is_request and body is not None and etree.QName(body).localname in self.operations:
            self.held.append(message)
            (message.suspend if self.suspend else message.abort)(self.answer)

    handle_in = handle_out = _take


def wire_headers(data: bytes) -> tuple[Envelope, AddressingHeaders]:
    envelope = Envelope.from_element(parse_xml(data))
    return envelope, AddressingHeaders.from_header(envelope.headers)


def post(url: str, body: bytes, content_type: str = "text/xml; charset=utf-8") -> requests.Response:
    return requests.post(url, data=body, headers={"Content-Type": content_type}, timeout=30)


def ping(local: str = "Ping") -> bytes:
    return etree.tostring(build_envelope(SOAP11, [], etree.Element(f"{{urn:rm}}{local}")))


# -- WS-Addressing both ways ------------------------------------------------------------

def test_addressing_headers_go_on_the_wire_and_are_read_on_the_other_side(service: Service):
    wire, server_spy, client_spy = Wire(), Spy(), Spy()
    app = wire.wrap(engage(service.application,
                           InterceptorChain([AddressingInterceptor(), server_spy])))
    with serve(app) as url:
        client = engage_client(zeep.Client(url + "?wsdl"),
                               InterceptorChain([AddressingInterceptor(), client_spy]))
        seen_by_service = client.service.whoami()
        assert client.service.echo("hello") == "hello"

    _, sent = wire_headers(wire.requests[0])
    assert sent.version is WSA_2005_08
    assert sent.to == url and sent.action == "whoami"
    assert sent.message_id.startswith("urn:uuid:") and sent.reply_to.is_anonymous
    assert seen_by_service == sent.message_id          # the service read it via the chain
    status, body = wire.responses[0]
    _, answered = wire_headers(body)
    assert status.startswith("200")
    assert answered.relates_to == sent.message_id
    assert answered.action == "whoamiResponse" and answered.to == WSA_2005_08.anonymous
    client_in = [m for m in client_spy.seen if m.direction is Direction.IN]
    assert [m.addressing.relates_to for m in client_in] == [
        sent.message_id, wire_headers(wire.requests[1])[1].message_id]
    server_in = [m for m in server_spy.seen if m.direction is Direction.IN]
    assert [m.addressing.action for m in server_in] == ["whoami", "echo"]


def test_a_client_without_ws_addressing_gets_none_back(service: Service):
    wire = Wire()
    app = wire.wrap(engage(service.application, InterceptorChain([AddressingInterceptor()])))
    with serve(app) as url:
        assert zeep.Client(url + "?wsdl").service.echo("plain") == "plain"
    assert wire_headers(wire.requests[0])[1].version is None
    assert wire_headers(wire.responses[0][1])[1].version is None


def test_soap12_round_trip_reads_the_action_from_the_content_type():
    service = make_service(soap12=True)
    server_spy = Spy()
    app = engage(service.application, InterceptorChain([AddressingInterceptor(), server_spy]))
    with serve(app) as url:
        client = engage_client(zeep.Client(url + "?wsdl"),
                               InterceptorChain([AddressingInterceptor()]))
        assert client.service.echo("v12") == "v12"
    request = server_spy.seen[0]
    assert request.soap_version.name == "1.2"
    assert request.action == "echo" and request.addressing.action == "echo"


# -- an interceptor answering in place of the service --------------------------------------

def test_an_interceptor_consumes_a_one_way_message_and_spyne_is_never_called(service: Service):
    wire = Wire()
    app = wire.wrap(engage(service.application, InterceptorChain([Holder("notify", suspend=False)])))
    with serve(app) as url:
        client = zeep.Client(url + "?wsdl")
        assert client.service.notify("kept") is None
    assert service.calls == []
    assert wire.responses == [("202 Accepted", b"")]


def test_an_interceptor_answers_a_protocol_message_spyne_does_not_know(service: Service):
    pong = build_envelope(SOAP11, [], etree.Element("{urn:rm}Pong"))
    app = engage(service.application,
                 InterceptorChain([Holder("Ping", answer=Response(envelope=pong), suspend=False)]))
    with serve(app) as url:
        answered = post(url, ping())
        unknown = post(url, ping("Unknown"))     # not consumed: spyne faults on it
    assert answered.status_code == 200
    assert Envelope.from_element(parse_xml(answered.content)).body_element.tag == "{urn:rm}Pong"
    assert answered.headers["Content-Type"].startswith("text/xml")
    assert unknown.status_code == 500 and b"Fault" in unknown.content
    assert service.calls == []


def test_one_way_operations_answer_202_without_an_envelope(service: Service):
    wire = Wire()
    app = wire.wrap(engage(service.application, InterceptorChain([AddressingInterceptor()])))
    with serve(app) as url:
        client = engage_client(zeep.Client(url + "?wsdl"), InterceptorChain([AddressingInterceptor()]))
        assert client.service.notify("hi") is None
    assert service.calls == [("notify", "hi")]
    assert wire.responses == [("202 Accepted", b"")]


# -- faults --------------------------------------------------------------------------------

def test_a_fault_raised_by_an_interceptor_reaches_the_zeep_caller(service: Service):
    app = engage(service.application, InterceptorChain([AddressingInterceptor(required=True)]))
    with serve(app) as url:
        with pytest.raises(zeep.exceptions.Fault) as info:
            zeep.Client(url + "?wsdl").service.echo("no wsa")
        client = engage_client(zeep.Client(url + "?wsdl"), InterceptorChain([AddressingInterceptor()]))
        assert client.service.echo("with wsa") == "with wsa"
    assert "requires WS-Addressing" in info.value.message
    assert info.value.code.endswith("MessageAddressingHeaderRequired")
    assert service.calls == [("echo", "with wsa")]


def test_soap12_sender_faults_are_http_400():
    service = make_service(soap12=True)
    app = engage(service.application, InterceptorChain([AddressingInterceptor(required=True)]))
    body = etree.tostring(build_envelope(
        SOAP12, [],
        etree.Element(f"{{{TNS}}}echo")))
    with serve(app) as url:
        answer = post(url, body, "application/soap+xml; charset=utf-8")
    assert answer.status_code == 400
    fault = Envelope.from_element(parse_xml(answer.content)).fault()
    assert fault.subcode.localname == "MessageAddressingHeaderRequired"


def test_a_bug_in_an_interceptor_is_a_receiver_fault_that_leaks_nothing(service: Service):
    class Broken(Interceptor):
        name, phase = "broken", Phase.RELIABLE_MESSAGING

        def handle_in(self, message):
            raise RuntimeError("secret internal detail")

    wire = Wire()
    app = wire.wrap(engage(service.application,
                           InterceptorChain([AddressingInterceptor(), Broken()])))
    with serve(app) as url:
        client = engage_client(zeep.Client(url + "?wsdl"), InterceptorChain([AddressingInterceptor()]))
        with pytest.raises(zeep.exceptions.Fault, match="could not process"):
            client.service.echo("x")
    status, body = wire.responses[0]
    assert status.startswith("500") and b"secret" not in body
    _, sent = wire_headers(wire.requests[0])
    _, answered = wire_headers(body)              # the fault went through the out chain
    assert answered.relates_to == sent.message_id
    assert answered.action == WSA_2005_08.soap_fault_action
    assert service.calls == []


@pytest.mark.parametrize("body, reason", [
    (b"this is not xml", b"malformed XML"),
    (b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "b">]><x>&a;</x>', b"DOCTYPE"),
    (b"<notsoap/>", b"VersionMismatch"),
    (b"", b"no body"),
])
def test_bad_requests_are_refused_before_any_interceptor_or_spyne(service: Service, body, reason):
    spy = Spy(phase=Phase.TRANSPORT)
    with serve(engage(service.application, InterceptorChain([spy]))) as url:
        answer = post(url, body)
    assert answer.status_code == 500 and reason in answer.content
    assert spy.seen == [] and service.calls == []


def test_oversized_requests_are_refused_from_their_length(service: Service):
    with serve(engage(service.application, InterceptorChain(), max_message_size=300)) as url:
        client = zeep.Client(url + "?wsdl")
        with pytest.raises(zeep.exceptions.Fault, match="300"):
            client.service.echo("x" * 400)
        assert client.service.echo("small") == "small"
    assert service.calls == [("echo", "small")]


# -- taking messages out of the flow and finishing them later ------------------------------

def test_client_side_consumed_request_is_not_sent_until_resumed(service: Service):
    wire, holder = Wire(), Holder("echo")
    with serve(wire.wrap(engage(service.application,
                                InterceptorChain([AddressingInterceptor()])))) as url:
        client = engage_client(zeep.Client(url + "?wsdl"),
                               InterceptorChain([AddressingInterceptor(), holder]))
        assert client.service.echo("later") is None      # the 202 the interceptor answered
        assert wire.requests == []
        assert client.service.whoami()                   # other requests still flow
        # A worker sends it: the rest of the out chain (WS-A), the POST, the in chain.
        stored = holder.held[0]
        again = Message.from_bytes(stored.to_bytes(), Direction.OUT, Role.CLIENT,
                                   address=stored.address, http_headers=stored.http_headers,
                                   resume_point=stored.resume_point)
        reply = resume_send(client, again)
    assert service.calls == [("whoami", ""), ("echo", "later")]
    _, sent = wire_headers(wire.requests[1])
    assert sent.action == "echo" and sent.message_id    # written after the holder, on resume
    assert reply.body_element.tag == f"{{{TNS}}}echoResponse"
    assert reply.addressing.relates_to == sent.message_id


def test_server_side_suspended_request_is_delivered_later_from_another_thread(service: Service):
    holder = Holder("echo", answer=Response(status=202))
    middleware = engage(service.application, InterceptorChain([AddressingInterceptor(), holder]))
    with serve(middleware) as url:
        client = engage_client(zeep.Client(url + "?wsdl"), InterceptorChain([AddressingInterceptor()]))
        assert client.service.echo("stored") is None
    assert service.calls == []
    stored = holder.held[0]
    sent_id = stored.addressing.message_id
    results: list[Response] = []

    def invoker_worker() -> None:
        message = Message.from_bytes(stored.to_bytes(), Direction.IN, Role.SERVER,
                                     http_headers=stored.http_headers, address=stored.address,
                                     resume_point="holder")
        results.append(middleware.deliver(message))

    worker = threading.Thread(target=invoker_worker)
    worker.start()
    worker.join(30)
    [response] = results
    assert service.calls == [("echo", "stored")]
    assert response.status_code == 200
    envelope, answered = wire_headers(response.body())
    assert envelope.body_element.tag == f"{{{TNS}}}echoResponse"
    assert answered.relates_to == sent_id and answered.action == "echoResponse"


def test_a_client_in_interceptor_consuming_the_reply_is_an_error_for_the_caller(service: Service):
    class EatReplies(Interceptor):
        name, phase = "eat", Phase.RELIABLE_MESSAGING

        def handle_in(self, message):
            message.abort()

    with serve(engage(service.application, InterceptorChain())) as url:
        client = engage_client(zeep.Client(url + "?wsdl"), InterceptorChain([EatReplies()]))
        with pytest.raises(MessageConsumed, match="no result"):
            client.service.echo("lost")
    assert service.calls == [("echo", "lost")]


def test_engage_client_is_idempotent_and_refuses_a_second_chain(service: Service):
    with serve(engage(service.application, InterceptorChain())) as url:
        client = zeep.Client(url + "?wsdl")
        chain = InterceptorChain()
        assert engage_client(client, chain) is engage_client(client, chain)
        assert len(client.plugins) == 1
        with pytest.raises(Exception, match="another interceptor chain"):
            engage_client(client, InterceptorChain())


def test_invalid_ws_addressing_headers_are_answered_with_the_ws_a_fault(service: Service, caplog):
    twice = AddressingHeaders(action="echo", message_id="urn:uuid:9",
                              version=WSA_2005_08).to_elements() * 2
    body = etree.tostring(build_envelope(SOAP11, twice, etree.Element(f"{{{TNS}}}echo")))
    with serve(engage(service.application, InterceptorChain([AddressingInterceptor()]))) as url:
        with caplog.at_level("ERROR"):
            answer = post(url, body)
    fault = Envelope.from_element(parse_xml(answer.content)).fault()
    assert answer.status_code == 500
    assert fault.subsubcode == "InvalidCardinality"
    assert [r for r in caplog.records if r.levelname == "ERROR"] == []   # answered, not crashed
    assert service.calls == []
