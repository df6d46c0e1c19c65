"""Run a request through a spyne ``WsgiApplication`` the way its WSGI call would, without the WSGI call.

The adapter hands spyne every request it lets through (a delivery from the
store above all) with an environ it builds itself, and reads spyne's answer
back from ``start_response`` and the returned iterable.  Between the two,
spyne's ``WsgiApplication.__call__`` rebuilds the request's URL (to tell a
``?wsdl`` request, which a POST never is), parses the Content-Type with
``cgi`` for its charset, and hands back its answer through ``start_response``
and a ``chain`` of its parts: about 50 Python calls per message around the
steps that matter (``bench_sequences_cpu.py --python-calls``).

:func:`handle_rpc` is ``WsgiApplication.handle_rpc`` of the spyne versions in
:data:`FOLLOWED`, step for step: the same method context (a
``WsgiMethodContext`` on the same environ, so a method's ``ctx.transport``
reads what it read), the server's own ``generate_contexts``,
``get_in_object``, ``get_out_object`` and ``get_out_string``, the same events
(``wsgi_call``, ``wsgi_return``, ``wsgi_exception``, ``wsgi_close`` and every
event those steps fire), the same error handling and the same order of
closing the context and running auxiliary methods.  It returns the status
line, headers and body parts spyne would have passed to ``start_response``
and returned.  :func:`follows` says whether a server is one it follows: a
``WsgiApplication`` of such a spyne version whose request handling is not
overridden; for any other the adapter makes the WSGI call as before.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable
from inspect import isgenerator
from itertools import chain
from typing import Any

import spyne
from spyne.server import wsgi as spyne_wsgi
from spyne.server.wsgi import WsgiApplication, WsgiMethodContext

__all__ = ["FOLLOWED", "follows", "handle_rpc"]

#: spyne versions whose ``WsgiApplication.handle_rpc`` :func:`handle_rpc` follows
FOLLOWED = ("2.14.",)

#: the methods of ``WsgiApplication`` that handle a POST; a subclass overriding one is called through WSGI
_REQUEST_HANDLING = ("__call__", "handle_rpc", "handle_error", "_WsgiApplication__reconstruct_wsgi_request",
                     "_WsgiApplication__wsgi_input_to_iterable", "_WsgiApplication__finalize")


def follows(server: Any) -> bool:
    """May :func:`handle_rpc` stand for ``server``'s WSGI call (see the module's docstring)?"""
    if not isinstance(server, WsgiApplication) or not spyne.__version__.startswith(FOLLOWED):
        return False
    cls = type(server)
    return all(getattr(cls, name) is getattr(WsgiApplication, name) for name in _REQUEST_HANDLING)


@functools.lru_cache(maxsize=64)
def _charset(content_type: str | None) -> str | None:
    """The charset ``WsgiApplication`` reads from a request's Content-Type (with ``cgi``, as it does)."""
    if content_type is None:
        return None
    return spyne_wsgi.cgi.parse_header(content_type)[1].get("charset", None)


def handle_rpc(server: WsgiApplication, req_env: dict[str, Any]) -> tuple[str, list[tuple[str, str]], Iterable[Any]]:
    """``server.handle_rpc(req_env, start_response)`` for a POST: (status line, headers, body parts).

    ``req_env`` must hold the request's body in ``wsgi.input`` and its length in
    ``CONTENT_LENGTH``, as for the WSGI call.
    """
    initial_ctx = WsgiMethodContext(server, req_env, server.app.out_protocol.mime_type)
    server.event_manager.fire_event("wsgi_call", initial_ctx)
    initial_ctx.in_string = server._WsgiApplication__wsgi_input_to_iterable(req_env)
    contexts = server.generate_contexts(initial_ctx, _charset(req_env.get("CONTENT_TYPE")))
    p_ctx, others = contexts[0], contexts[1:]
    p_ctx.active = True
    if p_ctx.in_error:
        return _handle_error(server, p_ctx, others, p_ctx.in_error)
    server.get_in_object(p_ctx)
    if p_ctx.in_error:
        spyne_wsgi.logger.error(p_ctx.in_error)
        return _handle_error(server, p_ctx, others, p_ctx.in_error)
    server.get_out_object(p_ctx)
    if p_ctx.out_error:
        return _handle_error(server, p_ctx, others, p_ctx.out_error)

    assert p_ctx.out_object is not None  # spyne's own check
    g = next(iter(p_ctx.out_object))
    if len(p_ctx.out_object) == 1 and isgenerator(g):  # spyne runs the method to its first yield
        first_obj = next(g)
        p_ctx.out_object = (chain((first_obj,), g),)
    transport = p_ctx.transport
    if transport.resp_code is None:
        transport.resp_code = spyne_wsgi.HTTP_200
    try:
        server.get_out_string(p_ctx)
    except Exception as e:
        spyne_wsgi.logger.exception(e)
        p_ctx.out_error = spyne_wsgi.Fault("Server", spyne_wsgi.get_fault_string_from_exception(e))
        return _handle_error(server, p_ctx, others, p_ctx.out_error)

    if isinstance(p_ctx.out_protocol, spyne_wsgi.HttpRpc) and p_ctx.out_header_doc is not None:
        transport.resp_headers.update(p_ctx.out_header_doc)
    if p_ctx.descriptor and p_ctx.descriptor.mtom:
        out_type_info = p_ctx.descriptor.out_message._type_info
        if len(out_type_info) == 1:
            p_ctx.out_object = [p_ctx.out_object]
        transport.resp_headers, p_ctx.out_string = spyne_wsgi.apply_mtom(
            transport.resp_headers, p_ctx.out_string, out_type_info.values(), p_ctx.out_object)
    server.event_manager.fire_event("wsgi_return", p_ctx)
    if server.chunked:
        if "Content-Length" in transport.resp_headers:
            del transport.resp_headers["Content-Length"]
    else:
        p_ctx.out_string = ["".join(p_ctx.out_string)]
    try:
        len(p_ctx.out_string)
        transport.resp_headers["Content-Length"] = str(sum([len(a) for a in p_ctx.out_string]))
    except TypeError:
        pass
    status, headers = transport.resp_code, spyne_wsgi._gen_http_headers(transport.resp_headers)
    parts = p_ctx.out_string
    _finalize(server, p_ctx)  # spyne closes the context as it builds its answer's iterable
    try:
        spyne_wsgi.process_contexts(server, others, p_ctx, error=None)
    except Exception as e:  # spyne reports and ignores what auxiliary methods raise
        spyne_wsgi.logger.exception(e)
    if not others:
        _let_go(initial_ctx, p_ctx)
    return status, headers, parts


def _handle_error(server: WsgiApplication, p_ctx: Any, others: Any, error: Any
                  ) -> tuple[str, list[tuple[str, str]], Iterable[Any]]:
    """``WsgiApplication.handle_error``: the fault's answer."""
    transport = p_ctx.transport
    if transport.resp_code is None:
        transport.resp_code = p_ctx.out_protocol.fault_to_http_response_code(error)
    server.get_out_string(p_ctx)
    p_ctx.out_string = list(p_ctx.out_string)
    transport.resp_headers["Content-Length"] = str(sum(len(s) for s in p_ctx.out_string))
    server.event_manager.fire_event("wsgi_exception", p_ctx)
    status, headers = transport.resp_code, spyne_wsgi._gen_http_headers(transport.resp_headers)
    try:
        spyne_wsgi.process_contexts(server, others, p_ctx, error=error)
    except Exception as e:
        spyne_wsgi.logger.exception(e)
    parts = p_ctx.out_string
    _finalize(server, p_ctx)
    if not others:
        _let_go(p_ctx)
    return status, headers, parts


#: the parts of a spyne method context that link back to it
_PARTS = ("transport", "inprot_ctx", "outprot_ctx", "event", "aux")


def _let_go(*contexts: Any) -> None:
    """Unlink a finished request's method contexts from their parts, so reference counting frees them.

    Every spyne request makes a reference cycle: its method context holds its
    transport, protocol and event contexts, each of which points back to it
    (``parent``), and each protocol context's factory of sub-contexts closes
    over itself and the method context.  With what they hold (the environ and
    the chain's message in it), 58 of the 62 objects the garbage collector
    found a message at 16 sequences, a young collection every 11 messages
    (``bench_sequences_cpu.py``).  Once the context is closed, ``wsgi_close``
    fired and no auxiliary method is left to run, nothing of spyne's reads
    them: the parts' ``parent`` is cleared and an empty sub-context factory is
    replaced by one that makes the same contexts without the method context.
    A context kept past its request (by a listener, say) still reads its
    transport, environ and protocols; only the back-links are gone.  (A request
    spyne could not read still makes a cycle: the error its context keeps holds
    its traceback, whose frames hold the context.)
    """
    linked = {id(ctx) for ctx in contexts if ctx is not None}
    for ctx in contexts:
        if ctx is None:
            continue
        for name in _PARTS:
            part = getattr(ctx, name, None)
            if part is None:
                continue
            if id(getattr(part, "parent", None)) in linked:
                part.parent = None
            subcontexts = getattr(part, "_subctx", None)
            if isinstance(subcontexts, defaultdict) and not subcontexts:
                make = functools.partial(part.__class__, None, part.itself, part.type)
                part._subctx = defaultdict(make)


def _finalize(server: WsgiApplication, p_ctx: Any) -> None:
    """``WsgiApplication.__finalize``."""
    p_ctx.close()
    server.event_manager.fire_event("wsgi_close", p_ctx)
