"""The hooks a pluggy plugin may implement to take part in an interceptor chain.

Two ways exist to extend a chain, as in pytest: write an
:class:`~interceptors.chain.Interceptor` (ordered by phase and before/after,
with in, out and fault handlers), or implement some of the hooks below in any
object or module and register it (``chain.register_plugin(obj)`` or an entry
point in the ``wsrm_interceptors`` group).  Hooks suit code that wants to watch
or touch every message at a phase without caring about its neighbours; an
interceptor suits code that must run before or after a named peer (WS-RM after
WS-Addressing).

Implementations are marked with :data:`hookimpl`::

    from interceptors import hookimpl

    @hookimpl
    def wsrm_in_message(message, phase):
        if phase is Phase.DISPATCH:
            audit(message)

A hook implementation may take fewer arguments than the spec names (pluggy
passes only those it asks for).  Return values are ignored; to stop a message a
hook calls ``message.abort(...)`` like an interceptor would.
"""

from __future__ import annotations

from typing import Any, Protocol

import pluggy

from .message import Message, Phase

__all__ = ["PROJECT_NAME", "hookspec", "hookimpl", "InterceptorRegistry",
           "wsrm_register_interceptors", "wsrm_in_message", "wsrm_out_message", "wsrm_fault",
           "wsrm_lifecycle_started"]

#: The pluggy project name: markers of another project (pytest's) are not ours.
PROJECT_NAME = "wsrm"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class InterceptorRegistry(Protocol):
    """What :func:`wsrm_register_interceptors` is given: an
    :class:`~interceptors.chain.InterceptorChain` (named by what a plugin may do
    with it, so that this module does not import the chain that loads it)."""

    def add(self, *interceptors: Any) -> None: ...

    def remove(self, name: str) -> Any: ...


@hookspec(historic=True)
def wsrm_register_interceptors(chain: InterceptorRegistry) -> None:
    """Add this plugin's interceptors to ``chain`` (``chain.add(MyInterceptor())``).

    Historic: a plugin registered after the chain was built is still called,
    so loading order between plugins and chain does not matter.  Each chain has
    its own plugin manager, so the hook runs once per chain.
    """


@hookspec
def wsrm_in_message(message: Message, phase: Phase) -> None:
    """Called for a received message once per phase, after that phase's interceptors.

    Phases come in the in order (TRANSPORT first).  Not called for the phases
    after an interceptor or an earlier hook aborted or suspended the message.
    """


@hookspec
def wsrm_out_message(message: Message, phase: Phase) -> None:
    """Called for a message being sent once per phase, after that phase's interceptors.

    Phases come in the out order (DISPATCH first, TRANSPORT last), the mirror
    of the in order.
    """


@hookspec
def wsrm_fault(message: Message, error: BaseException) -> None:
    """Called when an interceptor or hook raised while handling ``message``.

    Runs after the interceptors that had already handled the message were
    unwound (their ``handle_fault``), before the error reaches the adapter,
    which answers the peer with a SOAP fault (server) or raises it to the
    caller (client).  Must not raise: an exception here is logged and ignored
    so the original error is the one reported.
    """


@hookspec
def wsrm_lifecycle_started(engine: object, report: object) -> None:
    """A node finished its start-up pass (:class:`wsrm_plugin.lifecycle.LifecycleListener`).

    Called after transaction recovery, callback restoration, resumption and
    orphan termination, before the engine's workers start; ``report`` is the
    :class:`~wsrm_plugin.lifecycle.LifecycleReport`.  Use it to alert on
    missing callbacks or heuristic outcomes before traffic flows again.
    """
