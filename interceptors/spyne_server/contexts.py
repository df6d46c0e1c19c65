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

Two more of spyne's per-request steps are replaced on the engaged server and its in protocol
themselves (not on spyne's classes), where their classes' methods are spyne's:
:func:`read_quickly` reads a request's charset from a Content-Type seen before instead of
``cgi.parse_header`` each time, and :func:`copy_quickly` copies the request's first context for
each method without ``copy.copy``'s reduce protocol (``tests/spyne_server/test_quick_context.py``
compares both with spyne's).  A delivery's Python calls, all three: 602 -> 575.
"""

from __future__ import annotations

import functools
import logging
import types
from time import time
from typing import Any

from spyne.context import EventContext, MethodContext
from spyne.error import ResourceNotFoundError
from spyne.protocol._base import ProtocolMixin
from spyne.server import wsgi as spyne_wsgi
from spyne.server.wsgi import WsgiApplication, WsgiMethodContext, WsgiTransportContext

__all__ = ["copy_quickly", "handle_rpc", "handles_quickly", "method_context", "read_quickly", "transport_context"]

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


#: spyne's private ``WsgiApplication`` methods (name-mangled) :func:`read_quickly` stands in for
_RECONSTRUCT = "_WsgiApplication__reconstruct_wsgi_request"
_INPUT = "_WsgiApplication__wsgi_input_to_iterable"


def read_quickly(server: WsgiApplication) -> None:
    """Let ``server`` (one :func:`handles_quickly` answers for) read a request's charset from a
    Content-Type it saw before: spyne's ``__reconstruct_wsgi_request`` parses it with
    ``cgi.parse_header`` for every request (16 Python calls a delivery), and a service is sent
    the same one or two.  Set on the server itself (its method, not spyne's class, is replaced):
    the same request body and the same charset, read by spyne's own ``__wsgi_input_to_iterable``."""
    if getattr(type(server), _RECONSTRUCT) is not _SPYNE_RECONSTRUCT or _RECONSTRUCT in vars(server):
        return
    read_input = getattr(server, _INPUT)

    def reconstruct_wsgi_request(http_env: dict[str, Any]) -> tuple[Any, str | None]:
        content_type = http_env.get("CONTENT_TYPE")
        return read_input(http_env), (None if content_type is None else _charset_of(content_type))

    setattr(server, _RECONSTRUCT, reconstruct_wsgi_request)


_SPYNE_RECONSTRUCT = getattr(WsgiApplication, _RECONSTRUCT)


@functools.lru_cache(maxsize=64)
def _charset_of(content_type: str) -> str | None:
    """What spyne reads of a request's Content-Type: its charset parameter (``cgi.parse_header``,
    as spyne calls it)."""
    return spyne_wsgi.cgi.parse_header(content_type)[1].get("charset", None)


def copy_quickly(protocol: Any) -> None:
    """Let spyne's in ``protocol`` make a request's method contexts (one per method its request
    names: the primary one, and its auxiliary ones) without ``copy.copy``: spyne's
    ``generate_method_contexts`` copies the first context for each (``MethodContext.copy``,
    15 Python calls a delivery through ``copy``'s reduce protocol), which for spyne's context
    classes is a new instance of the class with the same ``__dict__`` (:func:`_copy`).  Set on
    the protocol itself, where its class's method is spyne's; a context class that copies its
    own way is copied as spyne copies it."""
    if not isinstance(protocol, ProtocolMixin) or "generate_method_contexts" in vars(protocol) \
            or type(protocol).generate_method_contexts is not ProtocolMixin.generate_method_contexts:
        return
    get_call_handles = protocol.get_call_handles

    def generate_method_contexts(ctx: Any) -> list[Any]:
        # ProtocolMixin.generate_method_contexts, with _copy for ctx.copy()
        call_handles = get_call_handles(ctx)
        if len(call_handles) == 0:
            raise ResourceNotFoundError(ctx.method_request_string)
        copy = _copy if _plainly_copied(type(ctx)) else type(ctx).copy
        retval = []
        for d in call_handles:
            assert d is not None
            c = copy(ctx)
            c.descriptor = d
            retval.append(c)
        return retval

    protocol.generate_method_contexts = generate_method_contexts


def _plainly_copied(cls: Any) -> bool:
    """Does ``copy.copy`` of a ``cls`` instance make a new one with the same ``__dict__``, and
    is its ``copy`` spyne's ``MethodContext.copy``?  (Nothing of the reduce protocol overridden;
    worked out once a class.)"""
    known = _PLAIN.get(cls)
    if known is None:
        known = _PLAIN[cls] = (
            cls.copy is MethodContext.copy and getattr(cls, "__copy__", None) is None
            and cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
            and cls.__getstate__ is object.__getstate__ and not hasattr(cls, "__setstate__")
            and cls.__new__ is object.__new__ and "__slots__" not in vars(cls))
    return known


_PLAIN: dict[type, bool] = {}


def _copy(ctx: Any) -> Any:
    """``MethodContext.copy(ctx)`` for a class :func:`_plainly_copied` answers for: ``copy.copy``
    (a new instance, the same ``__dict__``), its parts pointed to the copy."""
    retval = _new(type(ctx))
    retval.__dict__.update(ctx.__dict__)
    if retval.transport is not None:
        retval.transport.parent = retval
    if retval.inprot_ctx is not None:
        retval.inprot_ctx.parent = retval
    if retval.outprot_ctx is not None:
        retval.outprot_ctx.parent = retval
    if retval.event is not None:
        retval.event.parent = retval
    if retval.aux is not None:
        retval.aux.parent = retval
    return retval
