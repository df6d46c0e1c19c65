"""WS-Addressing message headers and endpoint references, both 2004/08 and 2005/08.

WS-RM rides on WS-Addressing: sequences are created by messages with
``wsa:Action``, acknowledgements go to an ``AcksTo`` endpoint reference,
responses are correlated with ``wsa:RelatesTo``.  Peers use either version
(gSOAP and WCF pair WS-RM 1.0 with 2005/08), so reading detects the version
from the headers and writing takes it as an argument; the objects themselves
are version-neutral.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from lxml import etree

from .faults import InvalidAddressingHeader, MalformedMessageError, MessageAddressingHeaderRequired
from .namespaces import (
    ADDRESSING_VERSIONS, PREFIXES, WSA_2004_08, WSA_2005_08, AddressingVersion, SoapVersion,
    mc_anonymous_id,
)
from .xmlsafe import children, resolve_qname, text_of

__all__ = ["EndpointReference", "AddressingHeaders", "new_message_id", "HEADER_NAMES"]

#: Local names of the message addressing headers (same in both versions).
HEADER_NAMES = ("To", "Action", "MessageID", "RelatesTo", "ReplyTo", "FaultTo", "From")
_SINGLE = ("To", "Action", "MessageID", "ReplyTo", "FaultTo", "From")
_HEADER_NAME_SET = frozenset(HEADER_NAMES)
#: the WS-A versions by namespace (AddressingVersion.for_namespace's table, read without a call)
_WSA_BY_NS = {v.ns: v for v in ADDRESSING_VERSIONS}
_IS_REF_PARAM = etree.QName(WSA_2005_08.ns, "IsReferenceParameter").text


#: (WS-A namespace, SOAP namespace or None, local name, mustUnderstand) -> an empty header (_copy_of)
_MADE: dict[tuple[str, str | None, str, bool], etree._Element] = {}


def _copy_of(wsa: AddressingVersion, soap: SoapVersion | None, local: str, must_understand: bool) -> etree._Element:
    """A new, empty ``wsa:local`` header block with the namespaces (and mustUnderstand) of
    :meth:`AddressingHeaders.to_elements`: a copy of one made once, since every message sent and
    every answer has three or four of them, and lxml copies an element about three times faster
    than it makes one with its namespace map.  ``__copy__`` is lxml's deep copy itself
    (``copy.deepcopy`` calls it, after a memo and a keep-alive list made in Python)."""
    key = (wsa.ns, soap.ns if soap is not None else None, local, must_understand)
    made = _MADE.get(key)
    if made is None:
        made = etree.Element(wsa.qname(local), nsmap={"wsa": wsa.ns, **({"soap": soap.ns} if soap else {})})
        if must_understand and soap is not None:
            made.set(soap.qname("mustUnderstand").text, soap.must_understand_true)
        _MADE[key] = made
    return made.__copy__()  # type: ignore[attr-defined]  # lxml-stubs lack it


def new_message_id() -> str:
    """A fresh, globally unique wsa:MessageID: a random (version 4) UUID URN.

    Formatted from 16 bytes of ``os.urandom`` here rather than through
    ``uuid.uuid4()``, whose ``UUID`` constructor checks and converts in Python:
    every message and every acknowledgement takes one.
    """
    h = os.urandom(16).hex()
    return f"urn:uuid:{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


#: RFC 4122 variant bits (10xx) on the first hex digit of the clock sequence
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def _as_addressing(version: AddressingVersion | str | None) -> AddressingVersion:
    if version is None:
        return WSA_2005_08
    if isinstance(version, AddressingVersion):
        return version
    found = AddressingVersion.for_namespace(version)
    if found is None:
        raise ValueError(f"unknown WS-Addressing namespace {version!r}")
    return found


def _c14n(elements: Iterable[etree._Element]) -> list[bytes]:
    return [etree.tostring(e, method="c14n", exclusive=True) for e in elements]


@dataclass(eq=False)
class EndpointReference:
    """An endpoint reference: an address plus reference parameters to echo as headers.

    ``reference_properties`` only exists in 2004/08; written as 2005/08 they
    become reference parameters (the migration the W3C version prescribes).
    """

    address: str
    reference_parameters: list[etree._Element] = field(default_factory=list)
    reference_properties: list[etree._Element] = field(default_factory=list)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EndpointReference):
            return NotImplemented
        return (self.address == other.address
                and _c14n(self.reference_parameters) == _c14n(other.reference_parameters)
                and _c14n(self.reference_properties) == _c14n(other.reference_properties))

    @property
    def is_anonymous(self) -> bool:
        """True for either version's anonymous URI (reply on the back-channel)."""
        return any(self.address == v.anonymous for v in ADDRESSING_VERSIONS)

    @property
    def is_none(self) -> bool:
        """True for 2005/08's "none" address: messages to it are discarded."""
        return self.address == WSA_2005_08.none

    @property
    def mc_id(self) -> str | None:
        """The id of a WS-MakeConnection anonymous address, else None."""
        return mc_anonymous_id(self.address)

    def header_parameters(self) -> list[etree._Element]:
        """Copies of everything that must be echoed as headers to this endpoint."""
        return [copy.deepcopy(e) for e in (*self.reference_properties, *self.reference_parameters)]

    def to_xml(self, tag: etree.QName | str,
               version: AddressingVersion | str | None = None) -> etree._Element:
        """Render as element ``tag`` (wsa:ReplyTo, wsrm:AcksTo, ...) in WS-A ``version``."""
        wsa = _as_addressing(version)
        if not self.address:
            raise ValueError("an endpoint reference needs an address")
        tag = etree.QName(tag)  # type: ignore[arg-type]  # lxml-stubs: QName() accepts a QName too
        nsmap = {"wsa": wsa.ns}
        if tag.namespace and tag.namespace != wsa.ns:
            nsmap[PREFIXES.get(tag.namespace, "ns0")] = tag.namespace
        element = etree.Element(tag, nsmap=nsmap)
        etree.SubElement(element, wsa.qname("Address")).text = self.address
        if wsa is WSA_2004_08:
            if self.reference_properties:
                props = etree.SubElement(element, wsa.qname("ReferenceProperties"))
                props.extend(copy.deepcopy(e) for e in self.reference_properties)
            params = self.reference_parameters
        else:
            params = [*self.reference_properties, *self.reference_parameters]
        if params:
            holder = etree.SubElement(element, wsa.qname("ReferenceParameters"))
            holder.extend(copy.deepcopy(e) for e in params)
        return element

    @classmethod
    def from_xml(cls, element: etree._Element) -> tuple[EndpointReference, AddressingVersion]:
        """Read an EPR-typed element; the WS-A version is that of its Address child.

        Raises MalformedMessageError if there is no usable Address; header
        parsing turns that into the WS-A fault.
        """
        wsa = None
        address = None
        params: list[etree._Element] = []
        props: list[etree._Element] = []
        for child in children(element):
            qname = etree.QName(child)
            if wsa is None:
                if qname.localname == "Address":
                    wsa = AddressingVersion.for_namespace(qname.namespace)
                    if wsa is not None:
                        address = text_of(child)
                continue
            if qname.namespace != wsa.ns:
                continue
            if qname.localname == "ReferenceParameters":
                params.extend(copy.deepcopy(e) for e in children(child))
            elif qname.localname == "ReferenceProperties" and wsa is WSA_2004_08:
                props.extend(copy.deepcopy(e) for e in children(child))
        if wsa is None or not address:
            raise MalformedMessageError(
                f"endpoint reference {etree.QName(element).localname} has no wsa:Address")
        return cls(address, params, props), wsa


@dataclass(eq=False)
class AddressingHeaders:
    """The message addressing properties of one message.

    ``relationship_type`` None means the default "reply".  ``reference_parameters``
    are the headers marked wsa:IsReferenceParameter (on reading) or to be
    echoed (on writing).  ``version`` is what was read (None if the message
    had no WS-A headers), and the default for writing.
    """

    to: str | None = None
    action: str | None = None
    message_id: str | None = None
    relates_to: str | None = None
    relationship_type: str | None = None
    reply_to: EndpointReference | None = None
    fault_to: EndpointReference | None = None
    from_: EndpointReference | None = None
    reference_parameters: list[etree._Element] = field(default_factory=list)
    version: AddressingVersion | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AddressingHeaders):
            return NotImplemented
        fields = ("to", "action", "message_id", "relates_to", "relationship_type",
                  "reply_to", "fault_to", "from_")
        return (all(getattr(self, f) == getattr(other, f) for f in fields)
                and _c14n(self.reference_parameters) == _c14n(other.reference_parameters))

    # -- writing --------------------------------------------------------------
    def to_elements(self, version: AddressingVersion | str | None = None, *,
                    soap: SoapVersion | None = None) -> list[etree._Element]:
        """The header blocks, in ``version`` (default: self.version, else 2005/08).

        With ``soap`` given, wsa:Action and wsa:To are marked mustUnderstand,
        as WCF does: a receiver that ignores WS-A would misroute the message.
        """
        wsa = _as_addressing(version or self.version)
        nsmap = {"wsa": wsa.ns}
        if soap is not None:
            nsmap["soap"] = soap.ns
        elements: list[etree._Element] = []

        def simple(local: str, value: str, extra_ns: dict[str, str] | None = None, *,
                   must_understand: bool = False) -> etree._Element:
            if extra_ns:
                element = etree.Element(wsa.qname(local), nsmap={**nsmap, **extra_ns})
            else:
                element = _copy_of(wsa, soap, local, must_understand)
            element.text = value
            elements.append(element)
            return element

        if self.to is not None:
            simple("To", self.to, must_understand=soap is not None)
        if self.action is not None:
            simple("Action", self.action, must_understand=soap is not None)
        if self.message_id is not None:
            simple("MessageID", self.message_id)
        if self.relates_to is not None:
            kind = self.relationship_type
            if kind == wsa.reply_relationship:
                kind = None
            if kind and wsa is WSA_2004_08:
                # 2004/08 types RelationshipType as a QName: bind its prefix.
                qname = etree.QName(kind)
                if qname.namespace == wsa.ns:
                    relates, value = simple("RelatesTo", self.relates_to), f"wsa:{qname.localname}"
                elif qname.namespace:
                    relates = simple("RelatesTo", self.relates_to, {"rt": qname.namespace})
                    value = f"rt:{qname.localname}"
                else:
                    relates, value = simple("RelatesTo", self.relates_to), qname.localname
                relates.set("RelationshipType", value)
            else:
                relates = simple("RelatesTo", self.relates_to)
                if kind:
                    relates.set("RelationshipType", kind)
        for local, epr in (("From", self.from_), ("ReplyTo", self.reply_to), ("FaultTo", self.fault_to)):
            if epr is not None:
                elements.append(epr.to_xml(wsa.qname(local), wsa))
        for parameter in self.reference_parameters:
            parameter = copy.deepcopy(parameter)
            if wsa is WSA_2005_08:
                parameter.set(_IS_REF_PARAM, "true")
            elements.append(parameter)
        return elements

    def reply_headers(self, action: str | None, message_id: str | None = None, *,
                      fault: bool = False) -> AddressingHeaders:
        """Headers for the reply (or fault, which prefers FaultTo) to this message."""
        wsa = self.version or WSA_2005_08
        target = (self.fault_to if fault else None) or self.reply_to
        return AddressingHeaders(
            to=target.address if target is not None else wsa.anonymous,
            action=action,
            message_id=message_id or new_message_id(),
            relates_to=self.message_id,
            reference_parameters=target.header_parameters() if target is not None else [],
            version=wsa,
        )

    def require(self, *names: str) -> None:
        """Raise MessageAddressingHeaderRequired for the first missing property.

        Names are attribute names ("action", "message_id", "reply_to", ...).
        """
        wsa = self.version or WSA_2005_08
        local = {"to": "To", "action": "Action", "message_id": "MessageID",
                 "relates_to": "RelatesTo", "reply_to": "ReplyTo", "fault_to": "FaultTo",
                 "from_": "From"}
        for name in names:
            if getattr(self, name) is None:
                raise MessageAddressingHeaderRequired(
                    f"the message has no wsa:{local[name]} header",
                    problem_header=wsa.qname(local[name]), version=wsa)

    # -- reading --------------------------------------------------------------
    @classmethod
    def from_header(cls, header_elements: Iterable[etree._Element]) -> AddressingHeaders:
        """Read the WS-A headers among a SOAP Header's children; detects the version.

        Raises InvalidAddressingHeader (with the problem header) for mixed
        versions, duplicates of single-valued headers, empty values and
        endpoint references without an address.
        """
        # One pass, no closures: every message received and every response read comes here.
        # The errors, and which of several is raised, are those of reading each header in turn
        # (mixed versions, then duplicates in _SINGLE's order, then RelatesTo, To, Action,
        # MessageID, ReplyTo, FaultTo, From).
        found: dict[str, list[etree._Element]] = {}
        wsa: AddressingVersion | None = None
        mixed = repeated = False
        parameters: list[etree._Element] = []
        for header in header_elements:
            tag = header.tag
            if not isinstance(tag, str):
                continue
            if tag[:1] == "{":
                namespace, _, local = tag[1:].partition("}")
                version = _WSA_BY_NS.get(namespace)
            else:
                version, local = None, tag
            if version is not None and local in _HEADER_NAME_SET:
                if wsa is None:
                    wsa = version
                elif version is not wsa:
                    mixed = True
                same = found.get(local)
                if same is None:
                    found[local] = [header]
                else:
                    same.append(header)
                    repeated = True
            elif header.get(_IS_REF_PARAM, "").strip() in ("true", "1"):
                # The marker is a wire artifact of echoing; to_elements adds it back.
                parameter = copy.deepcopy(header)
                del parameter.attrib[_IS_REF_PARAM]
                parameters.append(parameter)
        if mixed:
            raise InvalidAddressingHeader(
                "the message mixes WS-Addressing 2004/08 and 2005/08 headers",
                version=WSA_2005_08)
        if wsa is None:
            return cls(reference_parameters=parameters)
        if repeated:
            for local in _SINGLE:
                if len(found.get(local, ())) > 1:
                    raise InvalidAddressingHeader(
                        f"wsa:{local} appears {len(found[local])} times; at most once is allowed",
                        subsubcode="InvalidCardinality", problem_header=wsa.qname(local), version=wsa)
        relates = found.get("RelatesTo")
        relates_to, relationship = cls._relates_to(relates, wsa) if relates else (None, None)
        values: dict[str, str | None] = {"To": None, "Action": None, "MessageID": None}
        for local in values:
            elements = found.get(local)
            if elements:
                text = text_of(elements[0])
                if not text:
                    raise InvalidAddressingHeader(
                        f"wsa:{local} is empty", subsubcode="InvalidAddress" if local == "To" else None,
                        problem_header=wsa.qname(local), version=wsa)
                values[local] = text
        endpoints: dict[str, EndpointReference | None] = {"ReplyTo": None, "FaultTo": None, "From": None}
        for local in endpoints:
            elements = found.get(local)
            if elements:
                try:
                    endpoints[local], _ = EndpointReference.from_xml(elements[0])
                except MalformedMessageError as exc:
                    raise InvalidAddressingHeader(
                        exc.reason, subsubcode="MissingAddressInEPR",
                        problem_header=wsa.qname(local), version=wsa) from None
        return cls(
            to=values["To"], action=values["Action"], message_id=values["MessageID"],
            relates_to=relates_to, relationship_type=relationship,
            reply_to=endpoints["ReplyTo"], fault_to=endpoints["FaultTo"], from_=endpoints["From"],
            reference_parameters=parameters, version=wsa,
        )

    @staticmethod
    def _relates_to(elements: list[etree._Element],
                    wsa: AddressingVersion) -> tuple[str | None, str | None]:
        """The reply relationship if there is one, else the first RelatesTo."""
        chosen: tuple[str | None, str | None] = (None, None)
        for element in elements:
            raw = element.get("RelationshipType")
            if raw is None:
                kind = None
            elif wsa is WSA_2004_08:
                qname = resolve_qname(element, raw)
                kind = qname.text if qname is not None else raw.strip()
            else:
                kind = raw.strip()
            if kind == wsa.reply_relationship:
                kind = None
            text = text_of(element)
            if not text:
                raise InvalidAddressingHeader(
                    "wsa:RelatesTo is empty", problem_header=wsa.qname("RelatesTo"), version=wsa)
            if kind is None:
                return text, None
            if chosen[0] is None:
                chosen = (text, kind)
        return chosen
