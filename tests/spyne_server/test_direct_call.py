"""The adapter calls spyne's own request handling without spyne's WSGI call, and spyne answers as through it.

A delivery from the store (and any request the chain lets through) used to reach spyne as a
WSGI call with an environ the adapter built; the adapter now calls spyne's
``WsgiApplication.handle_rpc`` itself (``interceptors.spyne_server.direct``), skipping only
``__call__``.  A server whose ``__call__`` is overridden is still called through WSGI: the two
are compared answer for answer.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from spyne.auxproc import AuxProcBase
from spyne.server.wsgi import WsgiApplication

from interceptors.chain import Direction, InterceptorChain, Message, Role
from interceptors.spyne_server.adapter import engage
from tests.engine.support import wait_for

from . import service
from .conftest import Envelopes, action, fast_policy

TNS = service.TNS
SOAP = "http://schemas.xmlsoap.org/soap/envelope/"


def _codes_on_stack() -> set[Any]:
    frame, codes = sys._getframe(1), set()
    while frame is not None:
        codes.add(frame.f_code)
        frame = frame.f_back
    return codes


def test_a_delivery_runs_the_method_without_spyne_s_wsgi_call(clients):
    """Fails without the direct call: every method ran under ``WsgiApplication.__call__``."""
    from wsrm_plugin import reliable_service

    app = service.application()
    stacks: list[set[Any]] = []
    app.event_manager.add_listener("method_call", lambda ctx: stacks.append(_codes_on_stack()))
    server = reliable_service(app, "memory:", fast_policy())
    server.serve()
    server.start()
    try:
        answers: list[bytes] = []
        client = clients("memory:", application=lambda envelope, context: answers.append(envelope))
        build = Envelopes(server.url)
        client.send(server.url, build("record", "a"), action=action("record"))
        client.send(server.url, build("echo", "q"), action=action("echo"), expect_reply=True)
        assert wait_for(lambda: len(answers) == 1 and len(stacks) == 2), (answers, len(stacks))
    finally:
        server.stop(timeout=5)
    assert [WsgiApplication.__call__.__code__ in codes for codes in stacks] == [False, False]
    assert [WsgiApplication.handle_rpc.__code__ in codes for codes in stacks] == [True, True]


class _OwnHandling(WsgiApplication):
    """Overrides spyne's WSGI call (as it was): the adapter must make the WSGI call."""

    handled = 0

    def __call__(self, req_env: dict[str, Any], start_response: Any, wsgi_url: Any = None) -> Any:
        self.handled += 1
        return super().__call__(req_env, start_response, wsgi_url)


class _OwnRpc(WsgiApplication):
    """Overrides spyne's ``handle_rpc`` only: the adapter calls it, without the WSGI call."""

    handled = 0

    def handle_rpc(self, req_env: dict[str, Any], start_response: Any) -> Any:
        self.handled += 1
        return super().handle_rpc(req_env, start_response)


#: spyne's events, the application's and the WSGI server's, recorded in the order they fire
_APP_EVENTS = ("method_context_created", "method_context_closed", "method_call", "method_return_object",
               "method_return_document", "method_return_string", "method_exception_object",
               "method_exception_document", "method_exception_string", "method_accept_document")
_SERVER_EVENTS = ("wsgi_call", "wsgi_return", "wsgi_exception", "wsgi_close")


def _served(server_class: type[WsgiApplication]) -> tuple[Any, list[str]]:
    app = service.application()
    server = server_class(app)
    events: list[str] = []
    for name in _APP_EVENTS:
        app.event_manager.add_listener(name, lambda ctx, name=name: events.append(name))
    for name in _SERVER_EVENTS:
        server.event_manager.add_listener(name, lambda ctx, name=name: events.append(name))
    middleware = engage(app, InterceptorChain(), wsgi_application=server, rm_policy=False)
    return middleware, events


def _request(body: str) -> bytes:
    return (f'<?xml version="1.0" encoding="utf-8"?><soap:Envelope xmlns:soap="{SOAP}" xmlns:t="{TNS}">'
            f"<soap:Body>{body}</soap:Body></soap:Envelope>").encode()


CASES = {
    "answer": _request("<t:echo><t:text>q</t:text></t:echo>"),
    "one-way": _request("<t:record><t:item>a</t:item></t:record>"),
    "declared client fault": _request("<t:echo><t:text>bad-1</t:text></t:echo>"),
    "declared server fault": _request("<t:echo><t:text>fail-1</t:text></t:echo>"),
    "one-way fault": _request("<t:record><t:item>fail-2</t:item></t:record>"),
    "method raised": _request("<t:record><t:item>oops</t:item></t:record>"),
    "no such method": _request("<t:nosuch><t:text>q</t:text></t:nosuch>"),
    "invalid request": _request("<t:echo><t:text>q</t:text><t:extra/></t:echo>"),
    "empty body": _request(""),
}


@pytest.mark.parametrize("case", list(CASES))
def test_spyne_answers_a_delivery_as_through_its_wsgi_call(case: str) -> None:
    """Same status, headers, reply bytes and spyne events on both paths (declared faults, a
    method's exception, requests spyne cannot read)."""
    service.configure(broken={"oops"})
    directly, direct_events = _served(WsgiApplication)
    through_wsgi, wsgi_events = _served(_OwnHandling)
    assert directly._direct is directly.application and through_wsgi._direct is None

    def answer(middleware: Any) -> tuple[Any, ...]:
        message = Message.from_bytes(CASES[case], Direction.IN, Role.SERVER, address="http://127.0.0.1:8080/orders",
                                     http_headers=[("Content-Type", "text/xml; charset=utf-8"),
                                                   ("SOAPAction", f'"{action("echo")}"')])
        response = middleware.deliver(message)
        body = response.body()
        return response.status_code, dict(response.headers(body)), body

    assert answer(directly) == answer(through_wsgi)
    assert direct_events == wsgi_events and direct_events


def test_a_server_put_in_place_later_is_called_as_it_handles_requests() -> None:
    """The adapter's WSGI application replaced after it was made: the new one's own request
    handling runs (fails without the check of which server may run directly: 0 calls)."""
    middleware, _ = _served(WsgiApplication)
    replaced = _OwnHandling(service.application())
    middleware.application = replaced
    message = Message.from_bytes(CASES["answer"], Direction.IN, Role.SERVER,
                                 http_headers=[("Content-Type", "text/xml; charset=utf-8")])
    assert middleware.deliver(message).status_code == 200
    assert replaced.handled == 1


def test_a_server_s_own_handle_rpc_is_called_without_its_wsgi_call() -> None:
    """A subclass's own ``handle_rpc`` runs for a delivery, and its WSGI call does not (fails with
    the WSGI call: ``__call__`` on the stack)."""
    middleware, _ = _served(_OwnRpc)
    stacks: list[set[Any]] = []
    middleware.application.app.event_manager.add_listener("method_call",
                                                          lambda ctx: stacks.append(_codes_on_stack()))
    message = Message.from_bytes(CASES["answer"], Direction.IN, Role.SERVER,
                                 http_headers=[("Content-Type", "text/xml; charset=utf-8")])
    assert middleware.deliver(message).status_code == 200
    assert middleware.application.handled == 1
    assert [WsgiApplication.__call__.__code__ in codes for codes in stacks] == [False]


def _sentinels_of_ordered_sets(garbage: list[Any]) -> int:
    """spyne's ``oset`` sentinels among ``garbage``: a list ``[None, itself, itself]``."""
    return sum(1 for o in garbage if type(o) is list and len(o) == 3 and o[0] is None and o[1] is o and o[2] is o)


def test_spyne_s_events_leave_no_reference_cycle_behind() -> None:
    """spyne builds an empty ordered set (a sentinel list referring to itself) for every event it
    fires; the engaged application's managers do not: fails without (17 such cycles a request-reply call)."""
    import gc

    middleware, events = _served(WsgiApplication)
    events_before = list(events)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(3):
            message = Message.from_bytes(CASES["answer"], Direction.IN, Role.SERVER,
                                         http_headers=[("Content-Type", "text/xml; charset=utf-8")])
            middleware.deliver(message)
        gc.collect()
        sentinels = _sentinels_of_ordered_sets(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    assert sentinels == 0
    assert len(events) - len(events_before) == 3 * 9  # the listeners still ran, each event once


@pytest.mark.parametrize("case", ["answer", "one-way", "declared server fault"])
def test_a_finished_request_leaves_no_spyne_context_for_the_collector(case: str) -> None:
    """A request's method contexts are freed by reference counting once it is done (each made a
    reference cycle with its transport, protocol and event contexts: fails without), and what a
    listener kept of its context still reads its transport and environ.  (A request spyne could
    not read keeps one: the error it stores holds its traceback's frames, which hold the context.)"""
    import gc

    from spyne import MethodContext

    middleware, _ = _served(WsgiApplication)
    kept: list[Any] = []
    middleware.application.app.event_manager.add_listener("method_context_closed", kept.append)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        message = Message.from_bytes(CASES[case], Direction.IN, Role.SERVER,
                                     http_headers=[("Content-Type", "text/xml; charset=utf-8")])
        middleware.deliver(message)
        kept_env = kept[-1].transport.req_env
        kept.clear()
        gc.collect()
        contexts = sum(1 for o in gc.garbage if isinstance(o, MethodContext))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    assert contexts == 0
    assert kept_env["REQUEST_METHOD"] == "POST"


class _LaterAuxProc(AuxProcBase):
    """An auxiliary processor that runs its methods' contexts when told (as spyne's
    ``ThreadAuxProc`` runs them in its pool, after the request's answer), not during the request."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[tuple[Any, Any]] = []

    def process_context(self, server: Any, ctx: Any) -> None:
        self.waiting.append((server, ctx))

    def run_waiting(self) -> None:
        while self.waiting:
            self.process(*self.waiting.pop(0))


def _with_auxiliary(server_class: type[WsgiApplication]) -> tuple[Any, Any, list[tuple[bool, Any, Any]]]:
    """A service whose method has an auxiliary one run later: its adapter, the auxiliary processor,
    and what the auxiliary method saw of its context (its transport's link to it, the method
    context its protocol contexts' sub-contexts link to)."""
    from spyne import Application, ServiceBase, Unicode, rpc
    from spyne.protocol.soap import Soap11

    later = _LaterAuxProc()
    seen: list[tuple[bool, Any, Any]] = []

    class Primary(ServiceBase):
        @rpc(Unicode)
        def note(ctx, text):  # noqa: N805 -- spyne's signature
            return None

    class Auxiliary(ServiceBase):
        @rpc(Unicode, _aux=later)
        def note(ctx, text):  # noqa: N805 -- spyne's signature
            seen.append((ctx.transport.parent is ctx, ctx.inprot_ctx["sub"].parent, ctx.outprot_ctx["sub"].parent))

    app = Application([Primary, Auxiliary], tns=TNS, in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())
    return engage(app, InterceptorChain(), wsgi_application=server_class(app), rm_policy=False), later, seen


def test_a_context_an_auxiliary_method_shares_is_not_unlinked() -> None:
    """An auxiliary method's context shares its parts with the request's (spyne copies it): the
    adapter leaves them linked when the request is done, so the auxiliary method, run after it,
    reads its context as through spyne's WSGI call (fails without the check: the protocol
    contexts' sub-contexts have lost their method context)."""
    seen = {}
    for server_class in (WsgiApplication, _OwnHandling):
        middleware, later, seen[server_class] = _with_auxiliary(server_class)
        assert (middleware._direct is not None) is (server_class is WsgiApplication)
        message = Message.from_bytes(_request("<t:note><t:text>q</t:text></t:note>"), Direction.IN, Role.SERVER,
                                     http_headers=[("Content-Type", "text/xml; charset=utf-8")])
        assert middleware.deliver(message).status_code == 200
        assert len(later.waiting) == 1 and seen[server_class] == []  # the auxiliary method waits for its turn
        later.run_waiting()
    [(linked, inner, outer)] = seen[WsgiApplication]
    assert linked and inner is not None and outer is not None
    [(wsgi_linked, wsgi_inner, wsgi_outer)] = seen[_OwnHandling]
    assert wsgi_linked and type(inner) is type(wsgi_inner) and type(outer) is type(wsgi_outer)
