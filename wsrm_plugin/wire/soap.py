"""SOAP 1.1 and 1.2 envelopes: build them, read them, and read the faults they carry.

Reading goes through :func:`wsrm_plugin.wire.xmlsafe.parse_xml`, so every
envelope this package reads was size-limited and DOCTYPE-free.  An unknown
envelope namespace is SOAP's VersionMismatch fault.  :func:`parse_fault` turns
a received fault (either SOAP version, WS-RM/WS-A/WS-MC or plain) back into the
exception classes of :mod:`wsrm_plugin.wire.faults`, so a client can ``raise``
what the server sent.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Any

from lxml import etree

from .faults import (
    RM_FAULT_CLASSES, WSA_FAULT_CLASSES, WSMC_FAULT_CLASSES, MalformedMessageError,
    MessageNumberRollover, MustUnderstandFault, SoapFault, VersionMismatchFault,
    WSAddressingFault, WSMCFault, WSRMFault,
)
from .namespaces import (
    FAULT_CODES, SOAP11, SOAP12, SOAP_VERSIONS, WSA_2005_08, WSMC_NS, XML_NS, AddressingVersion,
    RMVersion, SoapVersion,
)
from .xmlsafe import DEFAULT_MAX_SIZE, children, parse_xml, resolve_qname, split_tag, text_of

__all__ = [
    "SoapVersion", "SOAP11", "SOAP12", "Envelope", "parse_envelope", "build_envelope",
    "fault_envelope", "to_bytes", "parse_fault", "is_must_understand", "set_must_understand",
    "SOAP_VERSIONS",
]

_ROLE_NEXT_12 = SOAP12.ns + "/role/next"
_ROLE_ULTIMATE_12 = SOAP12.ns + "/role/ultimateReceiver"
_ACTOR_NEXT_11 = "http://schemas.xmlsoap.org/soap/actor/next"
_WSA_SUBSUBCODES = {"InvalidAddress", "InvalidEPR", "InvalidCardinality", "MissingAddressInEPR",
                    "DuplicateMessageID", "ActionMismatch"}


def is_must_understand(header: etree._Element, soap: SoapVersion) -> bool:
    """Is ``header`` marked mustUnderstand *and* aimed at this (ultimate) receiver?"""
    # attribute names as text, not through etree.QName: every header of every message is asked
    if (header.get(f"{{{soap.ns}}}mustUnderstand") or "").strip() not in ("1", "true"):
        return False
    if soap is SOAP12:
        role = (header.get(f"{{{soap.ns}}}role") or "").strip()
        return role in ("", _ROLE_NEXT_12, _ROLE_ULTIMATE_12)
    actor = (header.get(f"{{{soap.ns}}}actor") or "").strip()
    return actor in ("", _ACTOR_NEXT_11)


def set_must_understand(header: etree._Element, soap: SoapVersion) -> etree._Element:
    header.set(soap.qname("mustUnderstand").text, soap.must_understand_true)
    return header


@dataclass
class Envelope:
    """A read envelope: its version, header blocks and body children."""

    version: SoapVersion
    root: etree._Element
    headers: list[etree._Element]
    body: list[etree._Element]

    @property
    def body_element(self) -> etree._Element | None:
        return self.body[0] if self.body else None

    def header(self, qname: etree.QName | str) -> etree._Element | None:
        """The first header block named ``qname`` ("{ns}local"), or None."""
        found = self.headers_named(qname)
        return found[0] if found else None

    def headers_named(self, qname: etree.QName | str) -> list[etree._Element]:
        tag = etree.QName(qname).text  # type: ignore[arg-type]  # lxml-stubs: QName() accepts a QName too
        return [h for h in self.headers if h.tag == tag]

    @property
    def is_fault(self) -> bool:
        body = self.body_element
        return body is not None and body.tag == f"{{{self.version.ns}}}Fault"

    def fault(self) -> SoapFault | None:
        """The fault this envelope carries, as an exception (not raised), or None."""
        if not self.is_fault:
            return None
        return parse_fault(self.body[0], self.headers)

    def check_must_understand(self, understood: Container[str]) -> None:
        """Raise MustUnderstandFault for mustUnderstand headers not in ``understood`` ("{ns}local")."""
        # the set first: most blocks are understood (WS-A's, WS-RM's), and each look at the
        # attributes costs calls on every block of every message
        missing = [etree.QName(h) for h in self.headers
                   if h.tag not in understood and is_must_understand(h, self.version)]
        if missing:
            raise MustUnderstandFault(missing)

    @classmethod
    def from_element(cls, root: etree._Element) -> Envelope:
        """Read an already-parsed envelope (zeep and spyne hand one over)."""
        root_tag = root.tag
        if not isinstance(root_tag, str):
            raise VersionMismatchFault(found=None)
        namespace, local = split_tag(root_tag)  # tags compared as text: every message is read here
        version = SoapVersion.for_namespace(namespace)
        if version is None or local != "Envelope":
            raise VersionMismatchFault(found=root_tag)
        header_tag, body_tag = f"{{{version.ns}}}Header", f"{{{version.ns}}}Body"
        headers: list[etree._Element] | None = None
        body: list[etree._Element] | None = None
        for child in children(root):
            tag = child.tag
            if tag == header_tag and headers is None and body is None:
                headers = list(children(child))
            elif tag == body_tag and body is None:
                body = list(children(child))
            elif body is not None and version is SOAP11 and split_tag(tag)[0] != version.ns:
                continue  # SOAP 1.1 allows trailing elements after the Body
            else:
                raise MalformedMessageError(
                    f"unexpected {tag} in the SOAP {version.name} Envelope "
                    "(expected an optional Header, then one Body)")
        if body is None:
            raise MalformedMessageError(f"the SOAP {version.name} Envelope has no Body")
        return cls(version, root, headers or [], body)


def parse_envelope(data: bytes, max_size: int = DEFAULT_MAX_SIZE) -> Envelope:
    """Safely parse received bytes into an :class:`Envelope`."""
    return Envelope.from_element(parse_xml(data, max_size))


def _adopt(element: etree._Element) -> etree._Element:
    """Elements that already live in a tree are copied, so building never mutates inputs."""
    return copy.deepcopy(element) if element.getparent() is not None else element


def build_envelope(version: SoapVersion, headers: Iterable[etree._Element] = (),
                   body: etree._Element | Iterable[etree._Element] | None = None) -> etree._Element:
    """An Envelope with these header blocks and body content (a Header only if needed)."""
    envelope = etree.Element(version.qname("Envelope"), nsmap={"soap": version.ns})
    headers = list(headers)
    if headers:
        header = etree.SubElement(envelope, version.qname("Header"))
        for block in headers:
            header.append(_adopt(block))
    body_element = etree.SubElement(envelope, version.qname("Body"))
    if body is not None:
        for part in ([body] if isinstance(body, etree._Element) else body):
            body_element.append(_adopt(part))
    return envelope


def fault_envelope(fault: SoapFault, version: SoapVersion,
                   headers: Iterable[etree._Element] = ()) -> etree._Element:
    """An envelope answering with ``fault``; ``headers`` are typically its WS-A headers."""
    return build_envelope(version, [*headers, *fault.header_elements(version)],
                          fault.fault_element(version))


def to_bytes(envelope: etree._Element) -> bytes:
    """UTF-8 with a declaration; an empty Body is written ``<Body></Body>``, never ``<Body/>``.

    gSOAP 2.8's generated readers of header-only messages (an acknowledgement on
    the back-channel, a standalone SequenceAcknowledgement) fail on the
    self-closing form with "tag name or namespace mismatch in element Body".
    """
    for child in children(envelope):
        namespace, local = split_tag(child.tag)
        if (local == "Body" and SoapVersion.for_namespace(namespace) is not None
                and len(child) == 0 and child.text is None):
            child.text = ""  # same infoset; only the serialization changes
    return etree.tostring(envelope, xml_declaration=True, encoding="utf-8")


# -- reading faults -------------------------------------------------------------------

def _child(parent: etree._Element | None, namespace: str | None, local: str,
           also: str | None = None) -> etree._Element | None:
    """First child named ``local`` in ``namespace`` (or in ``also``: SOAP 1.1 peers
    sometimes qualify faultcode/faultstring/detail)."""
    if parent is None:
        return None
    for child in children(parent):
        qname = etree.QName(child)
        if qname.localname == local and (qname.namespace or None) in (namespace, also):
            return child
    return None


def _generic_code(version: SoapVersion, qname: etree.QName | None) -> str | None:
    """SOAP 1.2 name of a fault code in ``version``'s namespace; None if it isn't one."""
    if qname is None or (qname.namespace not in (version.ns, None)):
        return None
    generic = version.generic_code(qname.localname.split(".")[0])  # SOAP 1.1 "Client.Auth"
    return generic if generic in FAULT_CODES else None


def _first(detail: list[etree._Element], tag: str) -> etree._Element | None:
    for element in detail:
        for found in element.iter(tag):
            return found
    return None


@dataclass
class _Parts:
    """What a received fault says, before deciding which exception class it is.

    ``sender`` is None when the message didn't say (SOAP 1.1 faultcode = subcode).
    """

    code: str
    sender: bool | None
    subcodes: list[etree.QName]
    reason: str
    detail: list[etree._Element]


def _read_soap12(fault: etree._Element) -> _Parts:
    ns = SOAP12.ns
    code_element = _child(fault, ns, "Code")
    value = _child(code_element, ns, "Value")
    if value is None:
        raise MalformedMessageError("SOAP 1.2 Fault without Code/Value")
    code = _generic_code(SOAP12, resolve_qname(value, text_of(value))) or "Receiver"
    subcodes = []
    parent = code_element
    for _ in range(16):  # subcodes nest; real ones are one or two deep
        parent = _child(parent, ns, "Subcode")
        sub_value = _child(parent, ns, "Value")
        if sub_value is None:
            break
        subcode = resolve_qname(sub_value, text_of(sub_value))
        if subcode is not None:
            subcodes.append(subcode)
    reason_element = _child(fault, ns, "Reason")
    texts = [] if reason_element is None else [
        t for t in children(reason_element) if t.tag == SOAP12.qname("Text").text]
    english = [t for t in texts if (t.get(f"{{{XML_NS}}}lang") or "").lower().startswith("en")]
    reason = text_of((english or texts)[0]) if texts else ""
    detail_element = _child(fault, ns, "Detail")
    detail = list(children(detail_element)) if detail_element is not None else []
    return _Parts(code, code == "Sender", subcodes, reason, detail)


def _read_soap11(fault: etree._Element, headers: list[etree._Element]) -> _Parts:
    faultcode = _child(fault, None, "faultcode", also=SOAP11.ns)
    if faultcode is None:
        raise MalformedMessageError("SOAP 1.1 Fault without faultcode")
    code_qname = resolve_qname(faultcode, text_of(faultcode))
    code = _generic_code(SOAP11, code_qname)
    parts = _Parts(code or "Sender", None if code is None else code == "Sender", [], "", [])
    if code is None and code_qname is not None:
        parts.subcodes.append(code_qname)  # faultcode carries the subcode (gSOAP, WCF, WS-A)
    faultstring = _child(fault, None, "faultstring", also=SOAP11.ns)
    parts.reason = text_of(faultstring) if faultstring is not None else ""
    detail_element = _child(fault, None, "detail", also=SOAP11.ns)
    if detail_element is not None:
        parts.detail.extend(children(detail_element))
    for header in headers:
        qname = etree.QName(header)
        rm = RMVersion.for_namespace(qname.namespace)
        if rm is not None and qname.localname == "SequenceFault":
            # CXF: faultcode Client/Server, the WS-RM code in this header.
            fault_code_element = _child(header, rm.ns, "FaultCode")
            if fault_code_element is not None:
                fault_code = resolve_qname(fault_code_element, text_of(fault_code_element))
                if fault_code is not None:
                    parts.subcodes = [fault_code]
            for part in children(header):
                if part.tag == rm.qname("Detail").text:  # 1.1
                    parts.detail.extend(children(part))
                elif part.tag != rm.qname("FaultCode").text:  # 1.0
                    parts.detail.append(part)
        elif header.tag == WSA_2005_08.qname("FaultDetail").text:
            parts.detail.extend(children(header))
    return parts


def parse_fault(fault: etree._Element, headers: Iterable[etree._Element] = ()) -> SoapFault:
    """Read a received ``Fault`` (and its envelope's headers) back into an exception.

    Understands the SOAP 1.2 Code/Subcode form, the SOAP 1.1 forms (faultcode
    = wsrm:X as gSOAP/WCF write it, or Client/Server plus a wsrm:SequenceFault
    header as CXF does) and faults with no Identifier detail (gSOAP).
    """
    qname = etree.QName(fault)
    version = SoapVersion.for_namespace(qname.namespace)
    if version is None or qname.localname != "Fault":
        raise MalformedMessageError(f"not a SOAP Fault element: {qname.text}")
    headers = [h for h in headers if isinstance(h.tag, str)]
    parts = _read_soap12(fault) if version is SOAP12 else _read_soap11(fault, headers)
    return _classify(parts, headers)


def _classify(parts: _Parts, headers: list[etree._Element]) -> SoapFault:
    code, sender, subcodes, reason, detail = (
        parts.code, parts.sender, parts.subcodes, parts.reason, parts.detail)
    first = subcodes[0] if subcodes else None
    if first is not None:
        rm = RMVersion.for_namespace(first.namespace)
        if rm is not None:
            return _rm_fault(rm, first.localname, reason, sender, detail)
        wsa = AddressingVersion.for_namespace(first.namespace)
        if wsa is not None:
            return _wsa_fault(wsa, subcodes, reason, sender, detail)
        if first.namespace == WSMC_NS:
            # a registered subclass takes (reason, *, detail), not the base class's fault_code first
            cls: Callable[..., WSMCFault] | None = WSMC_FAULT_CLASSES.get(first.localname)
            if cls is not None:
                return cls(reason or None, detail=detail)
            return WSMCFault(first.localname, reason or None, detail=detail)
    if code == "MustUnderstand":
        not_understood = []
        for header in headers:
            if header.tag == SOAP12.qname("NotUnderstood").text:
                found = resolve_qname(header, header.get("qname"))
                if found is not None:
                    not_understood.append(found)
        return MustUnderstandFault(not_understood, reason or None)
    if code == "VersionMismatch":
        return VersionMismatchFault(reason or None)
    return SoapFault(reason, code=code, subcodes=subcodes, detail=detail)


def _rm_fault(rm: RMVersion, fault_code: str, reason: str, sender: bool | None,
              detail: list[etree._Element]) -> WSRMFault:
    identifier_element = _first(detail, rm.qname("Identifier").text)
    identifier = text_of(identifier_element) if identifier_element is not None else None
    # a registered subclass takes (identifier, reason, ...), not the base class's fault_code first
    cls: Callable[..., WSRMFault] | None = RM_FAULT_CLASSES.get(fault_code)
    if cls is None:
        return WSRMFault(fault_code, reason or None, identifier or None,
                         sender=sender, version=rm, detail=detail)
    if cls is MessageNumberRollover:
        maximum = _first(detail, rm.qname("MaxMessageNumber").text)
        text = text_of(maximum) if maximum is not None else ""
        number = int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None
        return MessageNumberRollover(identifier or None, reason or None, max_message_number=number,
                                     sender=sender, version=rm, detail=detail)
    return cls(identifier or None, reason or None, sender=sender, version=rm, detail=detail)


def _wsa_fault(wsa: AddressingVersion, subcodes: list[etree.QName], reason: str,
               sender: bool | None, detail: list[etree._Element]) -> WSAddressingFault:
    name = subcodes[0].localname
    subsubcode = subcodes[1].localname if len(subcodes) > 1 else None
    if name in _WSA_SUBSUBCODES:  # SOAP 1.1 faultcode carries the most specific code
        name, subsubcode = "InvalidAddressingHeader", name
    header_element = _first(detail, wsa.qname("ProblemHeaderQName").text)
    problem_header = (resolve_qname(header_element, text_of(header_element))
                      if header_element is not None else None)
    action_element = _first(detail, wsa.qname("ProblemAction").text)
    action = _child(action_element, wsa.ns, "Action") if action_element is not None else None
    kwargs: dict[str, Any] = dict(subsubcode=subsubcode, problem_header=problem_header,
                                  problem_action=text_of(action) if action is not None else None,
                                  version=wsa, sender=sender, detail=detail)
    canonical = {"InvalidMessageInformationHeader": "InvalidAddressingHeader",
                 "MessageInformationHeaderRequired": "MessageAddressingHeaderRequired"}.get(name, name)
    # a registered subclass takes (reason, ...), not the base class's fault_code first
    cls: Callable[..., WSAddressingFault] | None = WSA_FAULT_CLASSES.get(canonical)
    if cls is None:
        return WSAddressingFault(canonical, reason or None, **kwargs)
    return cls(reason or None, **kwargs)

