"""Reading a service's WS-RM policy assertion out of its WSDL (the client's half of WS-Policy).

A service says in its WSDL that it requires WS-RM, and how: a ``wsp:Policy``
holding an ``RMAssertion``, attached to the binding (``wsp:PolicyReference``,
an inline ``wsp:Policy``, or ``wsp:PolicyURIs``) or to a port of it.  CXF
and WCF clients read it and configure themselves; :func:`read_rm_policy`
lets a zeep client do the same
(:func:`~interceptors.zeep_client.wsdl_policy.policy_from_wsdl`).

Understood:

* WS-Policy 2004/09 (the submission), 2006/07 and 1.5 (``http://www.w3.org/ns/ws-policy``);
* WS-RM Policy 1.0 (``http://schemas.xmlsoap.org/ws/2005/02/rm/policy``): the
  WS-RM version 1.0 and its timing parameters ``InactivityTimeout``,
  ``BaseRetransmissionInterval``, ``ExponentialBackoff``,
  ``AcknowledgementInterval`` (milliseconds);
* WS-RM Policy 1.1 and 1.2 (both ``http://docs.oasis-open.org/ws-rx/wsrmp/200702``):
  the WS-RM version 1.1 and the ``DeliveryAssurance`` (ExactlyOnce,
  AtLeastOnce, AtMostOnce, InOrder); WCF's timers beside it
  (``http://schemas.microsoft.com/ws-rx/wsrmp/200702``) are read too.

Only fragment references (``#id``) are resolved, within the document that
holds them; a policy in another document is reported in the log and ignored.
A malformed timer is a :class:`PolicyError`: a client must not guess what the
service meant.  This module is lxml only (no spyne, no zeep).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from lxml import etree

from wsrm_plugin.engine.policy import DeliveryAssurance, RMPolicy
from wsrm_plugin.wire.namespaces import RM10, RM11, RMVersion
from wsrm_plugin.wire.xmlsafe import children, resolve_qname

__all__ = ["PolicyError", "PublishedRMPolicy", "read_rm_policy", "WSP_NAMESPACES", "WSRMP_NAMESPACES"]

log = logging.getLogger(__name__)

WSDL_NS = "http://schemas.xmlsoap.org/wsdl/"
WSU_NS = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"
XML_NS = "http://www.w3.org/XML/1998/namespace"
#: WS-Policy namespaces: 2004/09 submission, W3C 2006/07 draft, W3C 1.5.
WSP_NAMESPACES = ("http://schemas.xmlsoap.org/ws/2004/09/policy", "http://www.w3.org/2006/07/ws-policy",
                  "http://www.w3.org/ns/ws-policy")
WSRMP_10_NS = "http://schemas.xmlsoap.org/ws/2005/02/rm/policy"
WSRMP_11_NS = "http://docs.oasis-open.org/ws-rx/wsrmp/200702"  # WS-RM Policy 1.1 and 1.2
WCF_RMP_NS = "http://schemas.microsoft.com/ws-rx/wsrmp/200702"
#: WS-RM Policy namespace -> the WS-RM version it asks for.
WSRMP_NAMESPACES: dict[str, RMVersion] = {WSRMP_10_NS: RM10, WSRMP_11_NS: RM11}

_TIMERS = {"InactivityTimeout": "inactivity_timeout",
           "BaseRetransmissionInterval": "base_retransmission_interval",
           "AcknowledgementInterval": "acknowledgement_interval"}
_ASSURANCES = {"ExactlyOnce": DeliveryAssurance.EXACTLY_ONCE,
               "AtLeastOnce": DeliveryAssurance.AT_LEAST_ONCE,
               "AtMostOnce": DeliveryAssurance.AT_MOST_ONCE}
_MAX_DEPTH = 8  # nested policy references: a cycle or an absurd chain is cut off here


class PolicyError(ValueError):
    """The WSDL's WS-RM policy assertion is malformed (a timer that is not a number of milliseconds)."""


@dataclass(frozen=True)
class PublishedRMPolicy:
    """What a service's WS-RM assertion says: the version, and whatever else it states.

    None means "the assertion does not say"; times are seconds.
    ``exponential_backoff`` is True when the 1.0 assertion has
    ``ExponentialBackoff`` and None otherwise (its absence is not read as
    "no backoff": the assertion describes the minimum, and our own default
    backs off).
    """

    rm_version: RMVersion
    delivery: DeliveryAssurance | None = None
    in_order: bool | None = None
    inactivity_timeout: float | None = None
    base_retransmission_interval: float | None = None
    exponential_backoff: bool | None = None
    acknowledgement_interval: float | None = None

    def apply(self, policy: RMPolicy) -> RMPolicy:
        """``policy`` with what the service published, except fields the user set explicitly.

        A field is the user's when :attr:`RMPolicy.explicit_fields` names it
        (given to the constructor or to :meth:`RMPolicy.replace`).
        """
        explicit = policy.explicit_fields
        changes: dict[str, Any] = {}
        if "rm_version" not in explicit and policy.rm_version is not self.rm_version:
            changes["rm_version"] = self.rm_version
        if "delivery" not in explicit and (self.delivery is not None or self.in_order is not None):
            assurance = (self.delivery if self.delivery is not None
                         else policy.delivery & DeliveryAssurance.EXACTLY_ONCE)
            in_order = self.in_order if self.in_order is not None else policy.in_order
            changes["delivery"] = assurance | DeliveryAssurance.IN_ORDER if in_order else assurance
        for name in ("inactivity_timeout", "base_retransmission_interval", "exponential_backoff",
                     "acknowledgement_interval"):
            value = getattr(self, name)
            if value is not None and name not in explicit:
                changes[name] = value
        base = changes.get("base_retransmission_interval")
        if isinstance(base, float) and base > policy.max_retransmission_interval:
            if "max_retransmission_interval" in explicit:
                raise PolicyError(f"the service's BaseRetransmissionInterval ({base} s) exceeds the "
                                  f"max_retransmission_interval you set ({policy.max_retransmission_interval} s)")
            changes["max_retransmission_interval"] = base
        if base == 0.0:
            del changes["base_retransmission_interval"]  # 0 ms: "as soon as possible"; keep ours (> 0)
        if not changes:
            return policy
        log.info("taking %s from the service's WS-RM policy assertion",
                 ", ".join(f"{k}={getattr(v, 'name', v)}" for k, v in changes.items()))
        merged = replace(policy, **changes)
        object.__setattr__(merged, "_explicit", explicit)  # what the WSDL gave stays the WSDL's
        return merged


def _is_policy(element: etree._Element) -> bool:
    return etree.QName(element).namespace in WSP_NAMESPACES and etree.QName(element).localname == "Policy"


def _policy_id(policy: etree._Element) -> str | None:
    return policy.get(f"{{{WSU_NS}}}Id") or policy.get(f"{{{XML_NS}}}id") or policy.get("Id")


def _policies_by_id(root: etree._Element) -> dict[str, etree._Element]:
    found: dict[str, etree._Element] = {}
    for element in root.iter():
        if isinstance(element.tag, str) and _is_policy(element):
            pid = _policy_id(element)
            if pid:
                found.setdefault(pid, element)
            name = element.get("Name")
            if name:
                found.setdefault(name, element)
    return found


def _resolve(uri: str, policies: dict[str, etree._Element]) -> etree._Element | None:
    key = uri[1:] if uri.startswith("#") else uri
    policy = policies.get(key)
    if policy is None:
        log.warning("WS-Policy reference %r is not in this WSDL document; ignored "
                    "(policies in other documents are not fetched)", uri)
    return policy


def _attached(subject: etree._Element, policies: dict[str, etree._Element]) -> Iterator[etree._Element]:
    """The policies attached to a WSDL element: inline, by reference, by PolicyURIs."""
    for ns in WSP_NAMESPACES:
        for uri in (subject.get(f"{{{ns}}}PolicyURIs") or "").split():
            policy = _resolve(uri, policies)
            if policy is not None:
                yield policy
    for child in children(subject):
        qname = etree.QName(child)
        if qname.namespace not in WSP_NAMESPACES:
            continue
        if qname.localname == "Policy":
            yield child
        elif qname.localname == "PolicyReference" and (reference := child.get("URI")):
            policy = _resolve(reference, policies)
            if policy is not None:
                yield policy


def _expand(policy: etree._Element, policies: dict[str, etree._Element], depth: int = 0) -> Iterator[etree._Element]:
    """Every element of ``policy``, nested references followed (depth-limited)."""
    for element in policy.iter():
        if not isinstance(element.tag, str):
            continue
        yield element
        qname = etree.QName(element)
        uri = element.get("URI")
        if qname.namespace in WSP_NAMESPACES and qname.localname == "PolicyReference" and uri:
            if depth >= _MAX_DEPTH:
                log.warning("WS-Policy references nested deeper than %d; %s not followed", _MAX_DEPTH, uri)
                continue
            target = _resolve(uri, policies)
            if target is not None:
                yield from _expand(target, policies, depth + 1)


def _milliseconds(element: etree._Element) -> float:
    text = element.get("Milliseconds")
    try:
        value = int(text or "")
    except ValueError:
        value = -1
    if value < 0:
        raise PolicyError(f"the WSDL's WS-RM policy has {etree.QName(element).localname} "
                          f"Milliseconds={text!r}: expected a non-negative integer")
    return value / 1000.0


def _read_assertion(assertion: etree._Element, alternative: Iterable[etree._Element]) -> PublishedRMPolicy:
    ns = etree.QName(assertion).namespace
    fields: dict[str, object] = {"rm_version": WSRMP_NAMESPACES[ns]}
    for element in assertion.iter():
        if not isinstance(element.tag, str) or element is assertion:
            continue
        qname = etree.QName(element)
        if qname.namespace != ns:
            continue
        if qname.localname in _TIMERS:
            fields[_TIMERS[qname.localname]] = _milliseconds(element)
        elif qname.localname == "ExponentialBackoff":
            fields["exponential_backoff"] = True
        elif qname.localname in _ASSURANCES:
            fields["delivery"] = _ASSURANCES[qname.localname]
        elif qname.localname == "InOrder":
            fields["in_order"] = True
        elif qname.localname == "DeliveryAssurance":
            fields.setdefault("in_order", False)  # stated without InOrder: unordered
    for element in alternative:  # WCF states its timers beside the 1.1 assertion
        qname = etree.QName(element)
        if qname.namespace == WCF_RMP_NS and qname.localname in _TIMERS:
            fields.setdefault(_TIMERS[qname.localname], _milliseconds(element))
    return PublishedRMPolicy(**fields)  # type: ignore[arg-type]


def _binding_subjects(definitions: etree._Element, binding: etree.QName | str | None) -> list[etree._Element]:
    """The binding element (and the ports using it) whose attached policies apply."""
    tns = definitions.get("targetNamespace")
    qname = etree.QName(binding) if binding is not None else None  # type: ignore[arg-type]
    subjects: list[etree._Element] = []
    names: set[str] = set()
    for element in definitions.findall(f"{{{WSDL_NS}}}binding"):
        if qname is None or (element.get("name") == qname.localname and qname.namespace in (None, tns)):
            subjects.append(element)
            names.add(element.get("name") or "")
    for port in definitions.iterfind(f"{{{WSDL_NS}}}service/{{{WSDL_NS}}}port"):
        target = resolve_qname(port, port.get("binding"))
        if target is None:
            continue
        if qname is not None and (target.localname, target.namespace) == (qname.localname, qname.namespace):
            subjects.append(port)
        elif qname is None and target.localname in names:
            subjects.append(port)
    return subjects


def read_rm_policy(definitions: etree._Element | Iterable[etree._Element],
                   binding: etree.QName | str | None = None) -> PublishedRMPolicy | None:
    """The WS-RM assertion attached to ``binding`` (a QName; None: any binding), or None.

    ``definitions`` is a ``wsdl:definitions`` element, or several (a WSDL
    and the documents it imports).  The first policy alternative holding an
    ``RMAssertion`` wins.
    """
    documents = [definitions] if isinstance(definitions, etree._Element) else list(definitions)
    for document in documents:
        if document.tag != f"{{{WSDL_NS}}}definitions":
            raise ValueError(f"expected a wsdl:definitions element, got {document.tag!r}")
        policies = _policies_by_id(document)
        for subject in _binding_subjects(document, binding):
            for policy in _attached(subject, policies):
                elements = list(_expand(policy, policies))
                for element in elements:
                    qname = etree.QName(element)
                    if qname.localname == "RMAssertion" and qname.namespace in WSRMP_NAMESPACES:
                        found = _read_assertion(element, elements)
                        log.debug("WS-RM policy of %s: %s", subject.get("name"), found)
                        return found
    return None
