"""A message's known bytes stand in for serializing its tree only while nothing can have changed it,
and spyne reads the chain's tree instead of parsing the request again, unless its parser would
build another tree."""

from __future__ import annotations

import threading

from lxml import etree
from spyne import Application, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11, soap11

from interceptors import AddressingInterceptor, Direction, Interceptor, InterceptorChain, Message, Phase, Response, Role
from interceptors.chain import serialize
from interceptors.spyne_server.adapter import engage
from wsrm_plugin.wire.namespaces import SOAP11
from wsrm_plugin.wire.soap import build_envelope

from .conftest import TNS, Service


def _echo_request(text: str) -> etree._Element:
    body = etree.Element(f"{{{TNS}}}echo")
    etree.SubElement(body, f"{{{TNS}}}text").text = text
    return build_envelope(SOAP11, [], body)


class _Noop(Interceptor):
    name, phase = "noop", Phase.DISPATCH

    def handle_in(self, message: Message) -> None:
        pass


class _Rewrite(Interceptor):
    """Changes the request's argument in place, as a DISPATCH interceptor may."""

    name, phase = "rewrite", Phase.DISPATCH

    def handle_in(self, message: Message) -> None:
        for element in message.envelope.iter(f"{{{TNS}}}text"):
            element.text = element.text.upper()


class _Counting:
    """Counts spyne's own parses of a request (its SOAP protocol's parse function)."""

    def __init__(self, monkeypatch) -> None:
        self.parses = 0
        self._lock = threading.Lock()
        real = soap11._parse_xml_string

        def counting(*args, **kwargs):
            with self._lock:
                self.parses += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(soap11, "_parse_xml_string", counting)


def test_known_bytes_are_used_until_anything_may_change_the_envelope():
    envelope = _echo_request("a")
    message = Message(envelope, Direction.IN, Role.SERVER)
    stored = serialize(envelope)
    message.serialized_as(stored)
    assert message.to_bytes() is stored  # not serialized again

    InterceptorChain([_Noop()]).handle_in(message)  # an interceptor ran: it may have changed it
    assert message.to_bytes() is not stored and message.to_bytes() == stored

    message.serialized_as(stored)
    message.add_header(etree.Element("{urn:x}h"))
    assert b"urn:x" in message.to_bytes()

    message.serialized_as(stored)
    message.envelope = _echo_request("b")
    assert b">b<" in message.to_bytes()


def test_a_response_sends_its_bytes_only_while_its_envelope_is_the_one_they_were_given_with():
    envelope = _echo_request("a")
    response = Response(200, envelope, raw=b"<given/>")
    assert response.body() == b"<given/>"
    response.envelope = _echo_request("b")
    assert b">b<" in response.body()
    assert Response(200, envelope).body() == serialize(envelope)


def _deliver(service: Service, chain: InterceptorChain, text: str) -> Response:
    middleware = engage(service.application, chain)
    envelope = _echo_request(text)
    stored = serialize(envelope)
    message = Message(envelope, Direction.IN, Role.SERVER,
                      http_headers={"Content-Type": "text/xml; charset=utf-8", "SOAPAction": '"echo"'},
                      address="http://127.0.0.1:9/", resume_point="addressing")
    message.serialized_as(stored)
    return middleware.deliver(message)


def test_spyne_runs_a_delivered_request_from_the_chains_tree(service: Service, monkeypatch):
    counting = _Counting(monkeypatch)
    response = _deliver(service, InterceptorChain([AddressingInterceptor()]), "stored")
    assert response.status_code == 200
    assert service.calls == [("echo", "stored")]
    assert counting.parses == 0


def test_a_dispatch_interceptor_changing_the_delivered_request_is_what_spyne_runs(service: Service, monkeypatch):
    counting = _Counting(monkeypatch)
    response = _deliver(service, InterceptorChain([AddressingInterceptor(), _Rewrite()]), "stored")
    assert response.status_code == 200
    assert service.calls == [("echo", "STORED")]
    assert counting.parses == 0


def test_spyne_parses_itself_when_its_parser_would_build_another_tree(monkeypatch):
    calls: list[str] = []

    class Echo(ServiceBase):
        @rpc(Unicode, _returns=Unicode)
        def echo(ctx, text):  # noqa: N805 -- spyne's signature
            calls.append(text)
            return text

    application = Application([Echo], tns=TNS, name="BlankTextApp",
                              in_protocol=Soap11(validator="lxml", remove_blank_text=True),
                              out_protocol=Soap11())
    counting = _Counting(monkeypatch)
    response = _deliver(Service(application, []), InterceptorChain([AddressingInterceptor()]), "own parse")
    assert response.status_code == 200
    assert calls == ["own parse"]
    assert counting.parses == 1


def _count_safe_parses(monkeypatch) -> list[int]:
    """The adapter's own parses from now on (every safe parse takes ``xmlsafe._parser``)."""
    from wsrm_plugin.wire import xmlsafe

    parses = [0]
    real = xmlsafe._parser

    def counting():
        parses[0] += 1
        return real()

    monkeypatch.setattr(xmlsafe, "_parser", counting)
    return parses


def _answer_app(name: str) -> Application:
    class Answer(ServiceBase):
        @rpc(Unicode, _returns=Unicode)
        def echo(ctx, text):  # noqa: N805 -- spyne's signature
            return f"re:{text}"

    return Application([Answer], tns=TNS, name=name, in_protocol=Soap11(validator="lxml"),
                       out_protocol=Soap11())


def test_spyne_hands_over_its_answers_tree_instead_of_writing_it_out(monkeypatch):
    parses = _count_safe_parses(monkeypatch)
    response = _deliver(Service(_answer_app("TreeAnswerApp"), []), InterceptorChain([AddressingInterceptor()]),
                        "tree")
    assert response.status_code == 200
    assert b">re:tree<" in response.body()
    assert parses[0] == 0  # neither the request (the chain's tree) nor spyne's answer was parsed


def test_a_listener_of_the_written_answer_sees_it_written_and_what_it_changes_is_sent(monkeypatch):
    application = _answer_app("WrittenAnswerApp")

    def rewrite(ctx):
        ctx.out_string = [b"".join(ctx.out_string).replace(b"re:", b"seen:")]

    application.event_manager.add_listener("method_return_string", rewrite)
    parses = _count_safe_parses(monkeypatch)
    response = _deliver(Service(application, []), InterceptorChain([AddressingInterceptor()]), "bytes")
    assert response.status_code == 200
    assert b">seen:bytes<" in response.body()
    assert parses[0] == 1  # the written answer, read back by the adapter
