"""SOAP's processing model for a chain in front of a service: which header blocks it understands.

SOAP 1.1 (section 4.2.3) and SOAP 1.2 (part 1, section 2.4) make the ultimate
receiver fault a message carrying a header block marked ``mustUnderstand``
that it does not process, and do nothing else with it.  spyne itself never
looks at the attribute, so the adapter applies the rule, before any
interceptor runs: a reliable message with such a header is refused before it
is recorded and acknowledged, not run with the header silently ignored.

A header block is understood when something in front of the application
processes it:

* an interceptor of the chain says so in its ``understands`` attribute (the
  WS-Addressing interceptor: every wsa header; the WS-RM interceptor: the
  WS-RM and WS-MakeConnection headers);
* the spyne application declares it (``@rpc(_in_header=...)`` or a service's
  ``__in_header__``): spyne hands it to the method;
* the deployment says so (``engage(..., understands=[...])``): a header an
  outer WSGI middleware processes, such as WS-Security's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from wsrm_plugin.wire.headers import clark
from wsrm_plugin.wire.soap import Envelope

from .chain import InterceptorChain

__all__ = ["understood_by", "declared_headers", "UnderstoodHeaders"]


def declared_headers(application: Any) -> frozenset[str]:
    """The header blocks (``{ns}local``) the methods of spyne ``application`` declare as input."""
    found: set[str] = set()
    interface = getattr(application, "interface", None)
    methods = getattr(interface, "service_method_map", None) or {}
    tns = getattr(application, "tns", None)
    for descriptors in methods.values():
        for descriptor in descriptors:
            for cls in getattr(descriptor, "in_header", None) or ():
                ns = getattr(cls.Attributes, "sub_ns", None) or cls.get_namespace()
                if ns is None or ns == "__default__":  # spyne's DEFAULT_NS: the application's tns
                    ns = tns
                if ns:
                    found.add(clark(ns, cls.get_element_name()))
    return frozenset(found)


def understood_by(chain: InterceptorChain, application: Any = None,
                  extra: Iterable[str] = ()) -> frozenset[str]:
    """Every header block processed by ``chain``'s interceptors, ``application``'s methods, or
    named in ``extra``."""
    names: set[str] = set(extra)
    for interceptor in chain.in_order():
        names.update(getattr(interceptor, "understands", ()) or ())
    if application is not None:
        names.update(declared_headers(application))
    return frozenset(names)


class UnderstoodHeaders:
    """The understood set of a chain and an application, worked out again when the chain changes."""

    def __init__(self, chain: InterceptorChain, application: Any = None, extra: Iterable[str] = ()) -> None:
        self.chain = chain
        self.application = application
        self.extra = frozenset(extra)
        self._plan: object = None
        self._names: frozenset[str] = frozenset()

    def names(self) -> frozenset[str]:
        # the chain's in order, a tuple it replaces whenever it changes: every request asks
        plan = self.chain._in  # (the chain is of this package)
        if plan is not self._plan:
            self._names = understood_by(self.chain, self.application, self.extra)
            self._plan = plan
        return self._names

    def check(self, envelope: Envelope) -> None:
        """Raise SOAP's MustUnderstand fault for a mustUnderstand header block nothing here processes."""
        envelope.check_must_understand(self.names())
