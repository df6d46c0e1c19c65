"""A receive that delivers inside a SQLite store's transaction lets spyne read its request first.

The store's transaction holds the whole file, which every other receive waits for; spyne's
reading of the request (the envelope taken apart, the method found, the parameters read and
validated) needs nothing of the store, so it runs before the file is taken
(``ChainDeliverer.read_ahead``, ``interceptors.spyne_server.direct.read_ahead``).  The answer,
a fault for a request spyne cannot read included, is the one spyne gives when it reads the
request at the delivery.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from lxml import etree
from spyne import Application
from spyne.protocol.soap import Soap11

from interceptors.chain import Direction, Interceptor, InterceptorChain, Message, Phase, Role
from interceptors.spyne_server.adapter import engage
from tests.engine.support import wait_for
from wsrm_plugin.engine import invoker as invoker_module
from wsrm_plugin.wire import parse_envelope

from . import service
from .conftest import Envelopes, action, fast_policy
from .test_direct_call import _APP_EVENTS, _SERVER_EVENTS, CASES

TNS = service.TNS


class _Watched(Soap11):
    """spyne's SOAP 1.1, validating with lxml, noting at each request it validates whether this
    thread holds the service's store file then (``holding``, set once the service exists)."""

    def __init__(self) -> None:
        super().__init__(validator="lxml")
        self.holding: Any = lambda: False
        self.reads: list[bool] = []

    def validate_body(self, ctx: Any, message: Any) -> Any:
        self.reads.append(self.holding())
        return super().validate_body(ctx, message)


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    # every request delivered on its receipt: under load an application's average above
    # QUICK_APPLICATION sends messages through the buffer (by design), read by invoker threads
    monkeypatch.setattr(invoker_module, "QUICK_APPLICATION", 60.0)


def test_a_request_delivered_inside_sqlite_is_read_before_the_file_is_taken(clients, tmp_path):
    """Fails without reading ahead: every request was validated by a thread holding the store's
    file (the receive delivering it in its transaction).  A request that fails validation is
    answered with spyne's fault, as before, and the calls around it are answered."""
    from wsrm_plugin import reliable_service

    protocol = _Watched()
    app = Application([service.OrderService], tns=TNS, name="OrderService",
                      in_protocol=protocol, out_protocol=Soap11())
    server = reliable_service(app, f"sqlite:///{tmp_path}/server.db", fast_policy())
    gate = server.engine.store._gate
    protocol.holding = lambda: gate.holder == threading.current_thread().name
    server.serve()
    server.start()
    try:
        answers: list[tuple[bytes, Any]] = []
        client = clients("memory:", application=lambda envelope, context: answers.append((envelope, context)))
        build = Envelopes(server.url)
        invalid = etree.fromstring(build("echo", "q1"))
        etree.SubElement(invalid.find(f".//{{{TNS}}}echo"), f"{{{TNS}}}extra")
        requests = [build("echo", "q0"), etree.tostring(invalid, xml_declaration=True, encoding="utf-8"),
                    build("echo", "q2")]
        for n, request in enumerate(requests, 1):  # one at a time: each in order, on its receipt
            client.send(server.url, request, action=action("echo"), expect_reply=True)
            assert wait_for(lambda n=n: len(answers) == n), answers
    finally:
        server.stop(timeout=5)
    texts = [parse_envelope(envelope).root.findtext(f".//{{{TNS}}}echoResult") for envelope, _ in answers]
    assert texts == ["re:q0", None, "re:q2"]
    assert b"SchemaValidationError" in answers[1][0]
    assert service.CALLS == ["q0", "q2"]  # the method never saw the request it could not read
    assert server.engine.destination.delivered_on_receipt == 2
    assert protocol.reads and not any(protocol.reads), protocol.reads


class _Received(Interceptor):
    """Where a delivery resumes the chain (as the WS-RM interceptor is): nothing runs after it."""

    name = "received"
    phase = Phase.RELIABLE_MESSAGING


def _middleware() -> tuple[Any, list[str]]:
    """The adapter in front of the test service, recording spyne's events but those that fire
    while a request is read (a listener of them keeps spyne from reading ahead)."""
    from interceptors.spyne_server import direct

    app = service.application()
    chain = InterceptorChain()
    chain.add(_Received())
    middleware = engage(app, chain, rm_policy=False)
    events: list[str] = []
    for name in set(_APP_EVENTS) - set(direct._METHOD_READ_EVENTS):
        app.event_manager.add_listener(name, lambda ctx, name=name: events.append(name))
    for name in set(_SERVER_EVENTS) - set(direct._SERVER_READ_EVENTS):
        middleware.application.event_manager.add_listener(name, lambda ctx, name=name: events.append(name))
    return middleware, events


@pytest.mark.parametrize("case", list(CASES))
def test_a_request_read_ahead_is_answered_as_one_read_at_its_delivery(case: str) -> None:
    """Same status, headers, reply bytes and spyne events after it (declared faults, a method's
    exception, requests spyne cannot read), and the method runs at the delivery, not before."""
    service.configure(broken={"oops"})

    def answer(read_ahead: bool) -> tuple[Any, ...]:
        middleware, events = _middleware()
        message = Message.from_bytes(CASES[case], Direction.IN, Role.SERVER, address="http://127.0.0.1:8080/orders",
                                     http_headers=[("Content-Type", "text/xml; charset=utf-8"),
                                                   ("SOAPAction", f'"{action("echo")}"')])
        if read_ahead:
            assert middleware.read_ahead(message, after="received")
            assert events == [] and service.CALLS == []
        response = middleware.deliver(message, after="received")
        body = response.body()
        service.reset()
        service.configure(broken={"oops"})
        return response.status_code, dict(response.headers(body)), body, events

    assert answer(read_ahead=True) == answer(read_ahead=False)


def test_a_listener_of_what_reading_fires_keeps_the_request_for_its_delivery() -> None:
    """A listener of an event the reading fires would hear it before the delivery (or, for
    ``wsgi_call``, on a context the request does not use): spyne reads it at the delivery."""
    middleware, _ = _middleware()
    middleware.application.app.event_manager.add_listener("method_context_created", lambda ctx: None)
    message = Message.from_bytes(CASES["answer"], Direction.IN, Role.SERVER,
                                 http_headers=[("Content-Type", "text/xml; charset=utf-8")])
    assert not middleware.read_ahead(message, after="received")
    assert middleware.deliver(message, after="received").status_code == 200


def test_nothing_is_read_ahead_when_the_chain_runs_something_after_the_resume_point() -> None:
    """An interceptor after it may change the request before spyne reads it."""

    class _After(Interceptor):
        name = "after"
        phase = Phase.DISPATCH

        def handle_in(self, message: Message) -> None:
            pass

    middleware, _ = _middleware()
    middleware.chain.add(_After())
    message = Message.from_bytes(CASES["answer"], Direction.IN, Role.SERVER,
                                 http_headers=[("Content-Type", "text/xml; charset=utf-8")])
    assert not middleware.read_ahead(message, after="received")
