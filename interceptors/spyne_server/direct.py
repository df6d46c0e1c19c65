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
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

import spyne
from spyne.server.wsgi import WsgiApplication

__all__ = ["FOLLOWED", "follows", "let_go", "watch", "watching"]

#: spyne versions whose method contexts :func:`let_go` knows the insides of
FOLLOWED = ("2.14.",)

#: the methods of ``WsgiApplication`` that answer a POST before ``handle_rpc``; a subclass
#: overriding one is called through WSGI
_BEFORE_HANDLING = ("__call__", "is_wsdl_request")
#: in a request environ while the adapter runs it: the method context that ran it, once closed
_CONTEXT_KEY = "wsrm.spyne_context"
_WATCHED = "_wsrm_watched_contexts"


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
    setattr(server, _WATCHED, True)


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
    transport = ctx.transport if ctx is not None else None
    if transport is not None and transport.__dict__.get("parent") is ctx:
        _let_go(ctx)


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
    # (the parts and their fields read as attributes and ``__dict__`` entries: a delivery let
    # go of its context with 13 ``getattr`` calls; spyne 2.14's parts are plain objects)
    for part in (ctx.transport, ctx.inprot_ctx, ctx.outprot_ctx, ctx.event, ctx.aux):
        if part is None:
            continue
        state = part.__dict__
        if "parent" in state and state["parent"] is ctx:
            part.parent = None
        subcontexts = state["_subctx"] if "_subctx" in state else None
        if type(subcontexts) is defaultdict and not subcontexts:
            make = functools.partial(part.__class__, None, part.itself, part.type)
            part._subctx = defaultdict(make)
