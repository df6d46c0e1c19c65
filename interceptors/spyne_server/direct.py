"""Run a request through spyne's own ``WsgiApplication.handle_rpc``, skipping only its WSGI ``__call__``.

The adapter hands spyne every request it lets through (a delivery from the
store above all) with an environ it builds itself, and reads spyne's answer
back from ``start_response`` and the returned iterable.  For a POST, spyne's
``WsgiApplication.__call__`` only rebuilds the request's URL and asks
``is_wsdl_request`` (which a POST never is) before it calls ``handle_rpc``:
:func:`follows` says when the adapter may call ``handle_rpc`` itself, so
that everything spyne does with a request (contexts, events, error handling,
auxiliary methods) is spyne's own code, not a copy of it.

Once the request is done, :func:`let_go` unlinks its method contexts from
their parts, so that reference counting frees them (see :func:`_let_go`).
That reads spyne's context internals, so it runs only on the spyne versions
in :data:`FOLLOWED`; :func:`watch` registers the two listeners it needs.

A request may also be read ahead (:func:`read_ahead`): spyne's first steps of
``handle_rpc`` (its method contexts made, the request read into objects and
validated) run at once, by spyne's own ``generate_contexts`` and
``get_in_object``, and ``handle_rpc`` called later with the same environ takes
up those contexts and goes on from the method.  A receive that delivers inside
a store transaction owning the whole file (SQLite) reads its request before
it takes the file, which every other receive waits for.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

import spyne
from spyne.server.wsgi import WsgiApplication, WsgiMethodContext

__all__ = ["FOLLOWED", "follows", "let_go", "read_ahead", "watch", "watching"]

#: spyne versions whose method contexts :func:`let_go` knows the insides of
FOLLOWED = ("2.14.",)

#: the methods of ``WsgiApplication`` that answer a POST before ``handle_rpc``; a subclass
#: overriding one is called through WSGI
_BEFORE_HANDLING = ("__call__", "is_wsdl_request")
#: in a request environ while the adapter runs it: the method context that ran it, once closed
_CONTEXT_KEY = "wsrm.spyne_context"
_WATCHED = "_wsrm_watched_contexts"
#: in a request environ read ahead: spyne's method contexts of its request, for ``handle_rpc``
_READ_KEY = "wsrm.spyne_read"
#: in that environ while ``handle_rpc`` runs: the primary context it took up (read already)
_TAKEN_KEY = "wsrm.spyne_read_taken"
#: spyne's events fired around reading a request: on the server (``wsgi_call``, fired by
#: ``handle_rpc`` on a context of its own, which a request read ahead does not use), on the in
#: protocol (reading), and on the application and its methods (a context made, which reading
#: ahead makes once more; a request it cannot read)
_SERVER_READ_EVENTS = ("wsgi_call",)
_PROTOCOL_READ_EVENTS = ("before_deserialize", "after_deserialize")
_METHOD_READ_EVENTS = ("method_context_created", "method_exception_object")
#: on a listener of those events that may see a request read ahead (the project's own)
READ_AHEAD_SAFE = "_wsrm_read_ahead_safe"


def follows(server: Any) -> bool:
    """May the adapter call ``server.handle_rpc`` in place of its WSGI call for a POST?

    A ``WsgiApplication`` of a spyne version in :data:`FOLLOWED` whose
    ``__call__`` and ``is_wsdl_request`` are spyne's: its WSGI call of a POST
    then does nothing but call ``handle_rpc`` (which a subclass may override:
    its own handling runs either way)."""
    if not isinstance(server, WsgiApplication) or not spyne.__version__.startswith(FOLLOWED):
        return False
    cls = type(server)
    return all(getattr(cls, name) is getattr(WsgiApplication, name) for name in _BEFORE_HANDLING)


def watch(server: WsgiApplication) -> None:
    """Let :func:`let_go` find a request's method context: spyne's ``wsgi_close`` event shows the
    one that ran it, closed (a listener added once per server)."""
    if getattr(server, _WATCHED, False):
        return
    server.event_manager.add_listener("wsgi_close", _closed)
    # a request read ahead: handle_rpc takes up its contexts (instance attributes, called as
    # self.generate_contexts / self.get_in_object by spyne's handle_rpc)
    server.generate_contexts = functools.partial(_generate_contexts, server.generate_contexts)
    server.get_in_object = functools.partial(_get_in_object, server.get_in_object)
    setattr(server, _WATCHED, True)


def read_ahead(server: WsgiApplication, req_env: dict[str, Any]) -> bool:
    """Read the request of ``req_env`` now, as ``server.handle_rpc(req_env, ...)`` would first:
    its method contexts (the envelope taken apart, the method found) and the request read
    into objects and validated, by spyne's own steps, kept in ``req_env`` for that later
    call, which then runs the method on them.  False (nothing read) unless ``server`` is
    :func:`watch`-ed and no listener but the project's own (:data:`READ_AHEAD_SAFE`) hears
    an event the reading fires, which would otherwise fire before the request's delivery, or
    on a context it does not use (``wsgi_call``).

    A request spyne cannot read keeps its error too: ``handle_rpc`` answers it with spyne's
    fault, as when it reads it itself.  ``req_env`` must not be read by anything else
    before that call, nor passed to another."""
    if not getattr(server, _WATCHED, False) or not _quiet_reading(server):
        return False
    ctx = WsgiMethodContext(server, req_env, server.app.out_protocol.mime_type)
    ctx.in_string, charset = server._WsgiApplication__reconstruct_wsgi_request(req_env)  # a lazy read
    cls = type(server)
    contexts = cls.generate_contexts(server, ctx, charset)
    primary = contexts[0]
    if primary.in_error is None:
        cls.get_in_object(server, primary)
    req_env[_READ_KEY] = contexts
    return True


def _quiet_reading(server: WsgiApplication) -> bool:
    """Does reading a request fire events only the project's own listeners hear?"""
    app = server.app
    checks = [(server.event_manager, _SERVER_READ_EVENTS),
              (getattr(app.in_protocol, "event_manager", None), _PROTOCOL_READ_EVENTS),
              (app.event_manager, _METHOD_READ_EVENTS)]
    for descriptors in app.interface.service_method_map.values():
        for descriptor in descriptors:
            checks.extend((events, _METHOD_READ_EVENTS) for events in getattr(descriptor, "event_managers", None) or ())
    return all(_only_safe(events, names) for events, names in checks)


def _only_safe(events: Any, names: tuple[str, ...]) -> bool:
    if events is None:
        return True
    handlers = getattr(events, "handlers", None)
    if handlers is None:
        return False
    return all(getattr(handler, READ_AHEAD_SAFE, False) for name in names for handler in handlers.get(name, ()))


def _generate_contexts(generate: Any, ctx: Any, in_string_charset: str | None = None) -> Any:
    """``WsgiApplication.generate_contexts``, or the contexts read ahead for the request (:func:`read_ahead`)."""
    req_env = getattr(ctx.transport, "req_env", None)
    if not isinstance(req_env, dict) or _READ_KEY not in req_env:
        return generate(ctx, in_string_charset)
    contexts = req_env.pop(_READ_KEY)
    req_env[_TAKEN_KEY] = contexts[0]
    return contexts


def _get_in_object(get: Any, ctx: Any) -> None:
    """``WsgiApplication.get_in_object``, but for a request read ahead (its objects are there)."""
    req_env = getattr(ctx.transport, "req_env", None)
    if isinstance(req_env, dict) and req_env.get(_TAKEN_KEY) is ctx:
        del req_env[_TAKEN_KEY]
        return
    get(ctx)


def _closed(ctx: Any) -> None:
    environ = getattr(ctx.transport, "req_env", None)
    if isinstance(environ, dict) and _CONTEXT_KEY in environ:
        environ[_CONTEXT_KEY] = ctx


def watching(req_env: dict[str, Any]) -> None:
    """Note the method context of the request ``req_env`` is the environ of, once closed (:func:`let_go`)."""
    req_env[_CONTEXT_KEY] = None


def let_go(req_env: dict[str, Any]) -> None:
    """The request of ``req_env`` (see :func:`watching`) is done: let go of its method contexts.

    Only once spyne closed the context that ran it, and only when no
    auxiliary method shares its parts: spyne makes every context of a request
    a shallow copy of the first one (the parts are shared), each copy pointing
    the parts back to itself, the auxiliary ones after the primary one; so the
    parts pointing back to the closed primary context say there is none."""
    ctx = req_env.pop(_CONTEXT_KEY, None)
    if ctx is not None and getattr(ctx.transport, "parent", None) is ctx:
        _let_go(ctx)


#: the parts of a spyne method context that link back to it
_PARTS = ("transport", "inprot_ctx", "outprot_ctx", "event", "aux")


def _let_go(ctx: Any) -> None:
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
    for name in _PARTS:
        part = getattr(ctx, name, None)
        if part is None:
            continue
        if getattr(part, "parent", None) is ctx:
            part.parent = None
        subcontexts = getattr(part, "_subctx", None)
        if isinstance(subcontexts, defaultdict) and not subcontexts:
            make = functools.partial(part.__class__, None, part.itself, part.type)
            part._subctx = defaultdict(make)
