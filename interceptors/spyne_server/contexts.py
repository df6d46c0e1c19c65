"""spyne's method context of a request the adapter runs, made without a Python call per field.

spyne 2.14's ``MethodContext`` refuses new attributes once built (``frozen``) through a
``__setattr__`` of its own, so its ``__init__`` makes a Python call for each of the 39 fields
it sets; the WSGI transport context then lists the request's headers with a ``startswith`` call
for every key of the environ.  At 16 sequences on memory stores that was 64 of the 700 Python
calls a delivery makes (``bench/bench_server_path.py --python-calls``), where spyne's whole
request handling is 435.

:func:`handle_rpc` is spyne's own ``WsgiApplication.handle_rpc``, the same code, where
``WsgiMethodContext(...)`` is :func:`method_context`: it makes the same object (spyne's
``WsgiMethodContext``, its transport spyne's ``WsgiTransportContext``), writing the same fields,
in the same order, with the same values, straight into the instance's ``__dict__``, and reading
the headers with a slice.  The same ``method_context_created`` event fires at the same point,
the context is as frozen, every listener and method sees what spyne makes
(``tests/spyne_server/test_quick_context.py`` compares the two field by field).  Only the spyne
versions :data:`~.direct.FOLLOWED` lists, and only for a server whose ``handle_rpc`` is spyne's
(:func:`handles_quickly`): a subclass's own runs as it is.  Nothing of spyne is patched: other
applications in the process make their contexts as before.  (The copy of ``handle_rpc`` reads
the module's other names as they were when this module was imported.)
"""

from __future__ import annotations

import logging
import types
from time import time
from typing import Any

from spyne.context import EventContext
from spyne.server.wsgi import WsgiApplication, WsgiMethodContext, WsgiTransportContext

__all__ = ["handle_rpc", "handles_quickly", "method_context", "transport_context"]

#: spyne's logger of the request headers it reads (``spyne.server.wsgi._get_http_headers``)
_HEADERS_LOG = logging.getLogger("spyne.server.wsgi")
_new = object.__new__


def transport_context(parent: Any, transport: Any, req_env: dict[str, Any], content_type: Any) -> Any:
    """``WsgiTransportContext(parent, transport, req_env, content_type)``: the same object, its
    headers read without a call a key of the environ."""
    ctx = _new(WsgiTransportContext)
    # TransportContext's, HttpTransportContext's and WsgiTransportContext's __init__, in order
    ctx.parent = parent
    ctx.itself = transport
    ctx.type = "http"
    ctx.app = transport.app
    ctx.request_encoding = None
    ctx.remote_addr = None
    ctx.sessid = ""
    ctx.req = req_env
    ctx.resp_headers = {}
    ctx.mime_type = content_type  # (a property: the response's Content-Type)
    ctx.resp_code = None
    ctx.wsdl = None
    ctx.wsdl_error = None
    ctx.req_env = req_env
    ctx.req_method = req_env.get("REQUEST_METHOD", None)
    headers = {key[5:].lower(): [value] for key, value in req_env.items() if key[:5] == "HTTP_"}
    if _HEADERS_LOG.isEnabledFor(logging.DEBUG):
        for key, value in headers.items():
            _HEADERS_LOG.debug("Add http header %r = %r", key, value)
    ctx.headers = headers
    return ctx


def method_context(transport: Any, req_env: dict[str, Any], content_type: Any) -> Any:
    """``WsgiMethodContext(transport, req_env, content_type)``: the same object, its fields
    written into its ``__dict__`` (``MethodContext.__init__`` then ``HttpMethodContext.__init__``)."""
    ctx = _new(WsgiMethodContext)
    fields = ctx.__dict__
    app = transport.app
    fields["call_start"] = time()
    fields["call_end"] = None
    fields["is_closed"] = False
    fields["app"] = app
    fields["udc"] = None
    fields["transport"] = None  # (TransportContext is None: HttpMethodContext's, below)
    fields["outprot_ctx"] = None
    if app.out_protocol is not None:
        fields["outprot_ctx"] = app.out_protocol.get_context(ctx, transport)
    fields["inprot_ctx"] = None
    if app.in_protocol is not None:
        fields["inprot_ctx"] = app.in_protocol.get_context(ctx, transport)
    fields["protocol"] = fields["inprot_ctx"]  # a server's context
    fields["event"] = EventContext(ctx)
    fields["aux"] = None
    fields["method_request_string"] = None
    fields["files"] = []
    fields["active"] = False
    fields["_MethodContext__descriptor"] = None
    fields["in_string"] = None
    fields["in_document"] = None
    fields["in_header_doc"] = None
    fields["in_body_doc"] = None
    fields["in_error"] = None
    fields["in_header"] = None
    fields["in_object"] = None
    fields["out_object"] = None
    fields["out_header"] = None
    fields["out_error"] = None
    fields["out_body_doc"] = None
    fields["out_header_doc"] = None
    fields["out_document"] = None
    fields["out_string"] = None
    fields["out_stream"] = None
    fields["function"] = None
    fields["locale"] = None
    fields["_in_protocol"] = app.in_protocol
    fields["_out_protocol"] = app.out_protocol
    fields["pusher_stack"] = []
    fields["frozen"] = True
    ctx.fire_event("method_context_created")
    ctx.transport = transport_context(ctx, transport, req_env, content_type)
    return ctx


def _with_context(function: types.FunctionType, context: Any) -> types.FunctionType:
    """``function`` (spyne's code) with ``WsgiMethodContext`` meaning ``context`` in it."""
    namespace = dict(function.__globals__)
    namespace["WsgiMethodContext"] = context
    quick = types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__,
                               function.__closure__)
    quick.__kwdefaults__ = function.__kwdefaults__
    return quick


#: spyne's ``WsgiApplication.handle_rpc(self, req_env, start_response)``, its context made by
#: :func:`method_context`
handle_rpc = _with_context(WsgiApplication.handle_rpc, method_context)


def handles_quickly(server: Any) -> bool:
    """May :func:`handle_rpc` stand for ``server.handle_rpc`` (a server :func:`~.direct.follows`)?
    When that is spyne's own, and spyne's WSGI contexts are as this module copies them."""
    return (type(server).handle_rpc is WsgiApplication.handle_rpc
            and "__init__" not in vars(WsgiMethodContext)
            and WsgiMethodContext.HttpTransportContext is WsgiTransportContext
            and WsgiMethodContext.TransportContext is None)
