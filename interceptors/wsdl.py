"""Post-processing of a published WSDL 1.1: spyne's one-way defect, and the WS-RM policy.

Both work on the lxml ``wsdl:definitions`` element, so they are independent of
spyne; :mod:`interceptors.spyne_server.adapter` calls them from spyne's
``wsdl_document_built`` event.

spyne 2.14 writes ``soap:header`` references to ``ReplyToHeader`` and
``MessageIDHeader`` messages into the binding of every one-way
(``_is_async``) operation but only defines those messages for callback
services, so strict readers (zeep) refuse the document.
:func:`drop_undefined_header_messages` removes references to messages the
document does not define.

:class:`RMPolicyAssertion` renders what a peer reads to learn that the
endpoint requires WS-RM (and WS-Addressing): a ``wsp:Policy`` holding the
``RMAssertion`` of WS-RM Policy 1.0 (2005/02, with WS-Policy 2004/09, as WCF
publishes it) or 1.1 (200702, with WS-Policy 1.5) plus ``wsam:Addressing``;
:func:`attach_policy` puts it in the definitions and references it from each
binding with ``wsp:PolicyReference`` (WS-PolicyAttachment's WSDL 1.1
attachment, the form CXF and WCF read).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from lxml import etree

from wsrm_plugin.wire.namespaces import RM10, RM11, RMVersion
from wsrm_plugin.wire.xmlsafe import children, resolve_qname

__all__ = [
    "WSDL_NS", "WSP_15_NS", "WSP_12_NS", "WSU_NS", "WSAM_NS", "WSRMP_10_NS", "WSRMP_11_NS",
    "DELIVERY_ASSURANCES", "RMPolicyAssertion", "drop_undefined_header_messages", "attach_policy",
]

log = logging.getLogger(__name__)

WSDL_NS = "http://schemas.xmlsoap.org/wsdl/"
_SOAP_BINDING_NS = ("http://schemas.xmlsoap.org/wsdl/soap/", "http://schemas.xmlsoap.org/wsdl/soap12/")
WSP_15_NS = "http://www.w3.org/ns/ws-policy"
WSP_12_NS = "http://schemas.xmlsoap.org/ws/2004/09/policy"
WSU_NS = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"
WSAM_NS = "http://www.w3.org/2007/05/addressing/metadata"
WSRMP_10_NS = "http://schemas.xmlsoap.org/ws/2005/02/rm/policy"
WSRMP_11_NS = "http://docs.oasis-open.org/ws-rx/wsrmp/200702"

#: WS-RM Policy 1.1 DeliveryAssurance choices (InOrder combines with any of them).
DELIVERY_ASSURANCES = ("ExactlyOnce", "AtLeastOnce", "AtMostOnce")


def drop_undefined_header_messages(definitions: etree._Element) -> list[str]:
    """Remove binding ``soap:header`` elements whose ``message`` this document doesn't define.

    Only references into the document's own target namespace are judged
    (anything else could come from an import).  Returns the message names
    dropped, for the log.
    """
    tns = definitions.get("targetNamespace")
    defined = {m.get("name") for m in definitions.findall(f"{{{WSDL_NS}}}message")}
    dropped = []
    for binding_ns in _SOAP_BINDING_NS:
        for header in list(definitions.iter(f"{{{binding_ns}}}header")):
            target = resolve_qname(header, header.get("message"))
            if target is None or target.namespace != tns or target.localname in defined:
                continue
            parent = header.getparent()
            if parent is not None:  # iter() found it below definitions, so it has one
                parent.remove(header)
            dropped.append(target.localname)
    if dropped:
        log.debug("dropped soap:header references to undefined messages %s", sorted(set(dropped)))
    return dropped


def _as_rm(version: RMVersion | str) -> RMVersion:
    if isinstance(version, RMVersion):
        return version
    found = RMVersion.for_namespace(version) or {"1.0": RM10, "1.1": RM11}.get(version)
    if found is None:
        raise ValueError(f"unknown WS-RM version {version!r}: use RM10, RM11, '1.0' or '1.1'")
    return found


def _milliseconds(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"{name} must be a non-negative int of milliseconds, not {value!r}")


@dataclass(frozen=True)
class RMPolicyAssertion:
    """The WS-RM (and WS-Addressing) policy a WSDL publishes.

    1.1 (the default) can say a delivery assurance and InOrder; 1.0 can say
    the timing parameters WS-RM Policy 1.0 defines (milliseconds).  Asking a
    version for what it cannot express is an error rather than silently
    dropped.  ``addressing`` adds ``wsam:Addressing`` (required WS-A).
    """

    version: RMVersion | str = RM11
    delivery_assurance: str | None = None
    in_order: bool = False
    inactivity_timeout_ms: int | None = None
    base_retransmission_interval_ms: int | None = None
    exponential_backoff: bool = False
    acknowledgement_interval_ms: int | None = None
    addressing: bool = True
    policy_id: str = "WSRMPolicy"

    def __post_init__(self) -> None:
        object.__setattr__(self, "version", _as_rm(self.version))
        if self.delivery_assurance is not None and self.delivery_assurance not in DELIVERY_ASSURANCES:
            raise ValueError(f"delivery_assurance must be one of {DELIVERY_ASSURANCES}, "
                             f"not {self.delivery_assurance!r}")
        timings = {"inactivity_timeout_ms": self.inactivity_timeout_ms,
                   "base_retransmission_interval_ms": self.base_retransmission_interval_ms,
                   "acknowledgement_interval_ms": self.acknowledgement_interval_ms}
        for name, value in timings.items():
            _milliseconds(name, value)
        if self.rm.is_11:
            given = [n for n, v in timings.items() if v is not None]
            if self.exponential_backoff:
                given.append("exponential_backoff")
            if given:
                raise ValueError(f"WS-RM Policy 1.1 has no {', '.join(given)} (1.0 does): "
                                 "use version=RM10 or leave them out")
        elif self.delivery_assurance is not None or self.in_order:
            raise ValueError("WS-RM Policy 1.0 has no delivery assurance or InOrder (1.1 does): "
                             "use version=RM11 or leave them out")
        if not self.policy_id or any(c in self.policy_id for c in " #:"):
            raise ValueError(f"policy_id must be an NCName-like id, not {self.policy_id!r}")

    @property
    def rm(self) -> RMVersion:
        """``version`` as ``__post_init__`` normalised it (a string is accepted on input only)."""
        assert isinstance(self.version, RMVersion)
        return self.version

    @property
    def policy_ns(self) -> str:
        """WS-Policy 1.5 for RM 1.1; the 2004/09 submission that RM Policy 1.0 was written for."""
        return WSP_15_NS if self.rm.is_11 else WSP_12_NS

    @property
    def assertion_ns(self) -> str:
        return WSRMP_11_NS if self.rm.is_11 else WSRMP_10_NS

    def to_element(self) -> etree._Element:
        """The ``wsp:Policy`` element, with ``wsu:Id`` so bindings can reference it."""
        wsp = self.policy_ns
        policy = etree.Element(f"{{{wsp}}}Policy", nsmap={"wsp": wsp, "wsu": WSU_NS})
        policy.set(f"{{{WSU_NS}}}Id", self.policy_id)
        rmp = self.assertion_ns
        assertion = etree.SubElement(policy, f"{{{rmp}}}RMAssertion", nsmap={"wsrmp": rmp})
        if self.rm.is_11:
            nested = etree.SubElement(assertion, f"{{{wsp}}}Policy")  # required, may be empty
            if self.delivery_assurance or self.in_order:
                assurance = etree.SubElement(nested, f"{{{rmp}}}DeliveryAssurance")
                inner = etree.SubElement(assurance, f"{{{wsp}}}Policy")
                if self.delivery_assurance:
                    etree.SubElement(inner, f"{{{rmp}}}{self.delivery_assurance}")
                if self.in_order:
                    etree.SubElement(inner, f"{{{rmp}}}InOrder")
        else:
            for local, value in (("InactivityTimeout", self.inactivity_timeout_ms),
                                 ("BaseRetransmissionInterval", self.base_retransmission_interval_ms),
                                 ("ExponentialBackoff", self.exponential_backoff),
                                 ("AcknowledgementInterval", self.acknowledgement_interval_ms)):
                if value is True:
                    etree.SubElement(assertion, f"{{{rmp}}}{local}")
                elif value is not None and value is not False:
                    etree.SubElement(assertion, f"{{{rmp}}}{local}").set("Milliseconds", str(value))
        if self.addressing:
            addressing = etree.SubElement(policy, f"{{{WSAM_NS}}}Addressing", nsmap={"wsam": WSAM_NS})
            etree.SubElement(addressing, f"{{{wsp}}}Policy")
        return policy


def _insert_after_documentation(parent: etree._Element, element: etree._Element) -> None:
    position = 0
    for index, child in enumerate(children(parent)):
        if child.tag != f"{{{WSDL_NS}}}documentation":
            break
        position = index + 1
    parent.insert(position, element)


def attach_policy(definitions: etree._Element, assertion: RMPolicyAssertion) -> etree._Element:
    """Add the policy to ``definitions`` and reference it from every ``wsdl:binding``.

    Idempotent: a policy with the same id is replaced, existing references kept.
    """
    if definitions.tag != f"{{{WSDL_NS}}}definitions":
        raise ValueError(f"expected a wsdl:definitions element, got {definitions.tag!r}")
    for old in definitions.findall("{*}Policy"):
        if old.get(f"{{{WSU_NS}}}Id") == assertion.policy_id:
            definitions.remove(old)
    policy = assertion.to_element()
    _insert_after_documentation(definitions, policy)
    uri = f"#{assertion.policy_id}"
    reference_tag = f"{{{assertion.policy_ns}}}PolicyReference"
    for binding in definitions.findall(f"{{{WSDL_NS}}}binding"):
        if any(r.get("URI") == uri for r in binding.findall(reference_tag)):
            continue
        reference = etree.Element(reference_tag, nsmap={"wsp": assertion.policy_ns})
        reference.set("URI", uri)
        _insert_after_documentation(binding, reference)
    return policy
