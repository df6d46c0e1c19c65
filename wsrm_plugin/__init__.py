"""Reliable and transactional SOAP for spyne servers and zeep clients: the public API.

Everything a user needs is importable from here, named the same on both sides::

    from wsrm_plugin import reliable_service, reliable_client, RMPolicy, DeliveryAssurance

The names are resolved lazily (module ``__getattr__``): importing the client
side (:func:`reliable_client`) never imports spyne, and the server side
(:func:`reliable_service`) never imports zeep, so a process only needs the
framework it uses.  The engine itself (:mod:`wsrm_plugin.engine`) depends on
neither.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it (imported on first use)
_EXPORTS: dict[str, str] = {
    # the server side (imports spyne)
    "reliable_service": "interceptors.spyne_server.service",
    "ReliableService": "interceptors.spyne_server.service",
    "delivery_context": "interceptors.spyne_server.service",
    # the client side (imports zeep)
    "reliable_client": "interceptors.zeep_client.client",
    "ReliableClient": "interceptors.zeep_client.client",
    "ReliableReply": "interceptors.zeep_client.client",
    "ReplyNotDelivered": "interceptors.zeep_client.client",
    "ZeepSessionTransport": "interceptors.zeep_client.session",
    "AsyncReliableClient": "interceptors.zeep_client.aio",
    # the knobs and what the engine hands back (neither framework)
    "RMPolicy": "wsrm_plugin.engine.policy",
    "DeliveryAssurance": "wsrm_plugin.engine.policy",
    "AckRequestMode": "wsrm_plugin.engine.policy",
    "ReliableEngine": "wsrm_plugin.engine.engine",
    "SendReceipt": "wsrm_plugin.engine.source",
    "SequenceFault": "wsrm_plugin.engine.source",
    "DeliveryContext": "wsrm_plugin.engine.invoker",
    "FailedDelivery": "wsrm_plugin.engine.invoker",
    "PublishedRMPolicy": "interceptors.policy_reader",
    "read_rm_policy": "interceptors.policy_reader",
    "open_store": "wsrm_plugin.store",
    "StorageManager": "wsrm_plugin.store",
}

__all__ = [
    "__version__",
    "reliable_service", "ReliableService", "delivery_context",
    "reliable_client", "ReliableClient", "ReliableReply", "ReplyNotDelivered", "ZeepSessionTransport",
    "AsyncReliableClient",
    "RMPolicy", "DeliveryAssurance", "AckRequestMode", "ReliableEngine", "SendReceipt", "SequenceFault",
    "DeliveryContext", "FailedDelivery", "PublishedRMPolicy", "read_rm_policy", "open_store", "StorageManager",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on demand
    from interceptors.policy_reader import PublishedRMPolicy, read_rm_policy
    from interceptors.spyne_server.service import ReliableService, delivery_context, reliable_service
    from interceptors.zeep_client.client import (
        ReliableClient, ReliableReply, ReplyNotDelivered, reliable_client,
    )
    from interceptors.zeep_client.aio import AsyncReliableClient
    from interceptors.zeep_client.session import ZeepSessionTransport
    from wsrm_plugin.engine.engine import ReliableEngine
    from wsrm_plugin.engine.invoker import DeliveryContext, FailedDelivery
    from wsrm_plugin.engine.policy import AckRequestMode, DeliveryAssurance, RMPolicy
    from wsrm_plugin.engine.source import SendReceipt, SequenceFault
    from wsrm_plugin.store import StorageManager, open_store


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wsrm_plugin' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
