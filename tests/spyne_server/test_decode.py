"""The adapter reads the chain's tree for spyne without XPath, and spyne decodes it as before.

The engaged protocol finds the id-carrying elements and the envelope's Header and
Body by walking the tree (an XPath runs without the GIL, and taking it back cost the
thread holding a sequence's turn).  What spyne then holds must be what its own
``create_in_document`` and ``decompose_incoming_envelope`` give for the same bytes:
compared here on envelopes that take the less common paths (multiref ids, no Header,
an empty Header, a Fault body, SOAP 1.2), and end to end through a WSGI call.
"""

from __future__ import annotations

import io

import pytest
from lxml import etree
from spyne import Application, Integer, ServiceBase, Unicode, rpc
from spyne.model.fault import Fault
from spyne.protocol.soap import Soap11, Soap12
from spyne.server.wsgi import WsgiApplication

from interceptors.chain import InterceptorChain
from interceptors.spyne_server.adapter import _TREE_KEY, _elements_by_id, engage

TNS = "urn:decode-test"
S11 = "http://schemas.xmlsoap.org/soap/envelope/"
S12 = "http://www.w3.org/2003/05/soap-envelope"


class Echo(ServiceBase):
    @rpc(Unicode, Integer, _returns=Unicode)
    def echo(ctx, text, times):  # noqa: N805 -- spyne's signature
        return (text or "") * (times or 1)


def _app(protocol: type) -> Application:
    return Application([Echo], tns=TNS, in_protocol=protocol(), out_protocol=protocol())


def _envelope(soap: str, header: str | None, body: str) -> bytes:
    head = "" if header is None else f"<s:Header>{header}</s:Header>"
    return (f'<s:Envelope xmlns:s="{soap}" xmlns:t="{TNS}">{head}<s:Body>{body}</s:Body>'
            f"</s:Envelope>").encode()


CASES = {
    "plain": (S11, "<h:a xmlns:h='urn:h'>1</h:a>", "<t:echo><t:text>hi</t:text><t:times>2</t:times></t:echo>"),
    "no-header": (S11, None, "<t:echo><t:text>hi</t:text></t:echo>"),
    "empty-header": (S11, "", "<t:echo><t:text>hi</t:text></t:echo>"),
    "ids": (S11, "<h:a xmlns:h='urn:h' id='x1'>1</h:a><h:b xmlns:h='urn:h' id=''>2</h:b>",
            "<t:echo id='e'><t:text id='x2'>hi</t:text></t:echo>"),
    "fault": (S11, None, "<s:Fault><faultcode>s:Client</faultcode><faultstring>no</faultstring></s:Fault>"),
    "soap12": (S12, "<h:a xmlns:h='urn:h'>1</h:a>", "<t:echo><t:text>hi</t:text></t:echo>"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_tree_decodes_as_spynes_own_parse_does(case):
    soap, header, body = CASES[case]
    data = _envelope(soap, header, body)
    protocol_class = Soap12 if soap == S12 else Soap11
    plain = WsgiApplication(_app(protocol_class))
    engaged_wsgi = WsgiApplication(_app(protocol_class))
    engage(engaged_wsgi.app, InterceptorChain([], load_entry_points=False), wsgi_application=engaged_wsgi)
    engaged = engaged_wsgi.app.in_protocol
    assert engaged.decompose_incoming_envelope.func.__name__ == "_decompose_incoming_envelope"

    root, ids = etree.XMLID(data)
    assert {k: v.tag for k, v in _elements_by_id(root).items()} == {k: v.tag for k, v in ids.items()}

    def decoded(wsgi: WsgiApplication, tree: etree._Element | None):
        from spyne.server.wsgi import WsgiMethodContext

        env = {"REQUEST_METHOD": "POST", "CONTENT_TYPE": "text/xml", "wsgi.input": io.BytesIO(data)}
        if tree is not None:
            env[_TREE_KEY] = tree
        ctx = WsgiMethodContext(wsgi, env, "text/xml")
        ctx.in_string = [data]
        try:
            contexts = wsgi.generate_contexts(ctx)
        except Exception as exc:  # noqa: BLE001 -- spyne's own failure is part of what is compared
            return ("raised", type(exc).__name__, ctx.in_body_doc.tag if ctx.in_body_doc is not None else None)
        c = contexts[0]
        header_tags = None if c.in_header_doc is None else [e.tag for e in c.in_header_doc]
        error = None if c.in_error is None else (c.in_error.faultcode, c.in_error.faultstring)
        return (header_tags, getattr(c.in_body_doc, "tag", None), c.method_request_string, error,
                len(contexts))

    assert decoded(engaged_wsgi, etree.fromstring(data)) == decoded(plain, None)


def test_an_engaged_service_answers_as_before_through_wsgi():
    data = _envelope(S11, None, "<t:echo><t:text>ab</t:text><t:times>3</t:times></t:echo>")
    wsgi = WsgiApplication(_app(Soap11))
    middleware = engage(wsgi.app, InterceptorChain([], load_entry_points=False), wsgi_application=wsgi)
    answer: dict[str, object] = {}

    def start_response(status, headers, exc_info=None):
        answer["status"] = status

    env = {"REQUEST_METHOD": "POST", "CONTENT_TYPE": "text/xml; charset=utf-8",
           "CONTENT_LENGTH": str(len(data)), "wsgi.input": io.BytesIO(data), "SERVER_NAME": "127.0.0.1",
           "SERVER_PORT": "80", "PATH_INFO": "/", "wsgi.url_scheme": "http"}
    body = b"".join(middleware(env, start_response))
    assert answer["status"].startswith("200"), body
    assert etree.fromstring(body).findtext(f".//{{{TNS}}}echoResult") == "ababab"


def test_an_empty_body_is_the_clients_fault():
    wsgi = WsgiApplication(_app(Soap11))
    engage(wsgi.app, InterceptorChain([], load_entry_points=False), wsgi_application=wsgi)
    from spyne.server.wsgi import WsgiMethodContext

    data = _envelope(S11, None, "")
    env = {"REQUEST_METHOD": "POST", _TREE_KEY: etree.fromstring(data)}
    ctx = WsgiMethodContext(wsgi, env, "text/xml")
    c = wsgi.generate_contexts(ctx)[0]
    assert isinstance(c.in_error, Fault) and c.in_error.faultcode == "Client.SoapError"
