"""In/out interceptor chains and the spyne/zeep adapters (the Axis2 "module" of seed 004).

The chain and WS-Addressing are importable from here; the adapters are
imported from their modules, so a client does not pull in spyne (nor a server
zeep)::

    from interceptors import InterceptorChain, AddressingInterceptor
    from interceptors.spyne_server.adapter import engage           # server
    from interceptors.zeep_client.adapter import engage_client     # client
"""

from __future__ import annotations

from .addressing import AddressingInterceptor, apply_addressing, read_addressing
from .chain import (
    ENTRY_POINT_GROUP, ChainConfigurationError, ChainError, Direction, Exchange, HttpHeaders,
    Interceptor, InterceptorChain, InterceptorLike, Message, MessageConsumed, Phase, Response, Role,
)
from .hookspecs import hookimpl, hookspec

__all__ = [
    "ENTRY_POINT_GROUP", "Phase", "Direction", "Role", "HttpHeaders", "Response", "Exchange",
    "Message", "Interceptor", "InterceptorLike", "InterceptorChain", "ChainError",
    "ChainConfigurationError", "MessageConsumed", "AddressingInterceptor", "apply_addressing",
    "read_addressing", "hookimpl", "hookspec", "default_chain",
]


def default_chain(*, load_entry_points: bool = True, **addressing: object) -> InterceptorChain:
    """WS-Addressing plus every interceptor installed under the ``wsrm_interceptors`` group.

    What :func:`~interceptors.spyne_server.adapter.engage` and
    :func:`~interceptors.zeep_client.adapter.engage_client` use when given no chain;
    ``addressing`` are :class:`AddressingInterceptor` options.
    """
    return InterceptorChain([AddressingInterceptor(**addressing)],  # type: ignore[arg-type]
                            load_entry_points=load_entry_points)
