"""The method context a delivery runs in is the one spyne makes, field for field (``interceptors.spyne_server.contexts``)."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
from spyne.context import EventContext, ProtocolContext
from spyne.server.wsgi import WsgiApplication, WsgiMethodContext, WsgiTransportContext

from interceptors.chain import Direction, InterceptorChain, Message, Role
from interceptors.spyne_server import contexts
from interceptors.spyne_server.adapter import engage

from . import service

TNS = service.TNS
SOAP = "http://schemas.xmlsoap.org/soap/envelope/"


def _environ() -> dict[str, Any]:
    return {"REQUEST_METHOD": "POST", "CONTENT_TYPE": "text/xml; charset=utf-8", "CONTENT_LENGTH": "0",
            "HTTP_SOAPACTION": '"urn:a"', "HTTP_X_TRACE": "t-1", "SERVER_NAME": "h", "SERVER_PORT": "80",
            "wsgi.input": io.BytesIO(), "wsgi.url_scheme": "http"}


def _fields(part: Any, owner: Any) -> list[tuple[str, Any]]:
    """A part's fields in order, each as compared: its back-link to ``owner`` as a mark, the
    request's start time as its type, a sub-context factory by what it makes."""
    out = []
    for name, value in vars(part).items():
        if value is owner:
            value = "<owner>"
        elif name == "call_start":
            value = type(value)
        elif name == "_subctx":
            value = (type(value), dict(value))
        elif isinstance(value, (ProtocolContext, EventContext, WsgiTransportContext)):
            value = (type(value), _fields(value, owner))
        out.append((name, value))
    return out


def test_the_quick_context_is_spyne_s_own_field_for_field(caplog: pytest.LogCaptureFixture) -> None:
    """Same class, same fields in the same order with the same values, its parts' too, as
    frozen, and the same header lines logged (fails on any field missed, added or reordered)."""
    server = WsgiApplication(service.application())
    seen: list[list[tuple[str, Any]]] = []
    server.app.event_manager.add_listener("method_context_created", lambda ctx: seen.append(_fields(ctx, ctx)))
    made = []
    environ = _environ()
    with caplog.at_level(logging.DEBUG, logger="spyne.server.wsgi"):
        for make in (WsgiMethodContext, contexts.method_context):
            caplog.clear()
            ctx = make(server, environ, "text/xml; charset=utf-8")
            made.append((type(ctx), type(ctx.transport), _fields(ctx, ctx), [r.getMessage() for r in caplog.records]))
            with pytest.raises(ValueError, match="udc"):
                ctx.something_else = 1
    assert made[0] == made[1]
    assert made[1][3] and made[1][2][0][0] == "call_start"
    assert len(seen) == 2 and seen[0] == seen[1]  # as the event's listeners see it (no transport yet)


def test_a_delivery_runs_in_a_context_made_quickly_unless_the_server_handles_requests_its_own_way() -> None:
    """spyne's ``handle_rpc`` with the quick context for spyne's server; a subclass's own
    ``handle_rpc`` runs as it is (fails without: the adapter calls ``server.handle_rpc``)."""

    class OwnRpc(WsgiApplication):
        def handle_rpc(self, req_env: dict[str, Any], start_response: Any) -> Any:
            return super().handle_rpc(req_env, start_response)

    body = (f'<?xml version="1.0" encoding="utf-8"?><soap:Envelope xmlns:soap="{SOAP}" xmlns:t="{TNS}">'
            "<soap:Body><t:echo><t:text>q</t:text></t:echo></soap:Body></soap:Envelope>").encode()
    for server_class, quick in ((WsgiApplication, True), (OwnRpc, False)):
        app = service.application()
        server = server_class(app)
        assert contexts.handles_quickly(server) is quick
        middleware = engage(app, InterceptorChain(), wsgi_application=server, rm_policy=False)
        made: list[Any] = []
        app.event_manager.add_listener("method_call", lambda ctx: made.append(ctx.transport.headers))
        message = Message.from_bytes(body, Direction.IN, Role.SERVER,
                                     http_headers=[("Content-Type", "text/xml; charset=utf-8"),
                                                   ("SOAPAction", '"urn:echo"')])
        response = middleware.deliver(message)
        assert response.status_code == 200 and b"q" in response.body()
        assert made == [{"soapaction": ['"urn:echo"']}]
        if quick:
            assert middleware._handle_rpc.func is contexts.handle_rpc
        else:
            assert middleware._handle_rpc == server.handle_rpc


@pytest.mark.parametrize("content_type", ["text/xml; charset=utf-8", 'application/soap+xml; charset="UTF-8"; action="a"',
                                          "text/xml", None])
def test_a_request_s_charset_and_body_are_read_as_spyne_reads_them(content_type: str | None) -> None:
    """The server's own reading of a request (``read_quickly``) gives spyne's charset and body
    (fails on a charset read another way: quoted, upper case, absent)."""
    server = WsgiApplication(service.application())
    contexts.read_quickly(server)
    assert "_WsgiApplication__reconstruct_wsgi_request" in vars(server)
    read = []
    for reconstruct in (server._WsgiApplication__reconstruct_wsgi_request,
                        WsgiApplication._WsgiApplication__reconstruct_wsgi_request.__get__(server)):
        environ = {"CONTENT_LENGTH": "5", "wsgi.input": io.BytesIO(b"<a/>x")}
        if content_type is not None:
            environ["CONTENT_TYPE"] = content_type
        chunks, charset = reconstruct(environ)
        read.append((list(chunks), charset))
    assert read[0] == read[1]


def test_a_request_s_method_contexts_are_copies_as_spyne_makes_them() -> None:
    """``copy_quickly``'s copy of a context is ``ctx.copy()``'s: the same class and fields, its
    parts pointing to the copy (fails on a part left pointing to the first context)."""
    server = WsgiApplication(service.application())
    environ = _environ()
    made = [WsgiMethodContext(server, environ, "text/xml; charset=utf-8") for _ in range(2)]
    assert contexts._plainly_copied(WsgiMethodContext)
    copies = [made[0].copy(), contexts._copy(made[1])]
    assert [type(c) for c in copies] == [WsgiMethodContext] * 2
    assert _fields(copies[0], copies[0]) == _fields(copies[1], copies[1])
    assert all(getattr(copies[1], part).parent is copies[1] for part in ("transport", "inprot_ctx", "outprot_ctx",
                                                                          "event"))
    protocol = server.app.in_protocol
    contexts.copy_quickly(protocol)
    assert "generate_method_contexts" in vars(protocol)
