"""Faults: the errors a bad message causes, as exceptions that can render themselves.

Every problem found while reading a message is raised as a :class:`SoapFault`
subclass that already knows the SOAP fault to answer with (code, subcode,
reason, detail, WS-Addressing fault action).  The code that catches it only
decides where to send it.  Rendering follows the specifications' SOAP bindings:

* SOAP 1.2: ``Code/Value`` is ``Sender``/``Receiver``, the protocol's fault
  code goes in ``Subcode/Value``, the detail in ``Detail``.
* SOAP 1.1 has no subcodes: ``faultcode`` carries the most specific subcode
  (``wsrm:UnknownSequence``, ``wsa:ActionNotSupported``), as WS-Addressing's
  SOAP 1.1 binding, WCF and gSOAP do.  WS-RM faults also carry a
  ``wsrm:SequenceFault`` header with ``FaultCode`` and the detail (1.0: after
  FaultCode; 1.1: inside ``wsrm:Detail``), which is what CXF reads.  WS-A 2005/08
  faults carry their detail in a ``wsa:FaultDetail`` header.

Reading a received fault back into these classes is :func:`wsrm_plugin.wire.soap.parse_fault`
(it needs the envelope's headers).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import ClassVar

from lxml import etree

from .namespaces import (
    SOAP11, SOAP12, WSA_2004_08, WSA_2005_08, WSMC_FAULT_ACTION, WSMC_NS, XML_NS,
    FAULT_CODES, PREFIXES, AddressingVersion, RMVersion, SoapVersion,
)

__all__ = [
    "WireError", "SoapFault", "MalformedMessageError", "UnsafeXMLError",
    "MessageTooLargeError", "InvalidMessageNumber", "MustUnderstandFault",
    "VersionMismatchFault",
    "WSRMFault", "SequenceTerminated", "UnknownSequence", "InvalidAcknowledgement",
    "MessageNumberRollover", "LastMessageNumberExceeded", "CreateSequenceRefused",
    "SequenceClosed", "WSRMRequired", "RM_FAULT_CLASSES",
    "WSAddressingFault", "InvalidAddressingHeader", "MessageAddressingHeaderRequired",
    "DestinationUnreachable", "ActionNotSupported", "EndpointUnavailable",
    "WSA_FAULT_CLASSES",
    "WSMCFault", "UnsupportedSelection", "MissingSelection", "WSMC_FAULT_CLASSES",
]



class WireError(Exception):
    """Base of every error raised because a message (not the caller) is wrong."""


#: Characters of a fault reason sent or kept.  Reasons quote what was wrong (a value, a name);
#: a peer's input echoed whole would let it make the answer as large as its request.
MAX_REASON_LENGTH = 2048


def bounded(text: str, limit: int = MAX_REASON_LENGTH) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


def _nsmap_for(namespaces: Iterable[str | None]) -> dict[str, str]:
    """A prefix -> namespace map with readable prefixes, for QName-valued text."""
    nsmap: dict[str, str] = {}
    for ns in namespaces:
        if not ns or ns in nsmap.values():
            continue
        prefix = PREFIXES.get(ns)
        if prefix is None or prefix in nsmap:
            prefix = f"ns{len(nsmap)}"
        nsmap[prefix] = ns
    return nsmap


def _qname_text(nsmap: dict[str, str], qname: etree.QName) -> str:
    for prefix, ns in nsmap.items():
        if ns == qname.namespace:
            return f"{prefix}:{qname.localname}"
    return qname.localname


def _copies(elements: Iterable[etree._Element]) -> list[etree._Element]:
    return [copy.deepcopy(e) for e in elements]


class SoapFault(WireError):
    """A SOAP fault: raised where the problem is found, rendered where it's answered.

    ``code`` uses the SOAP 1.2 names (Sender, Receiver, MustUnderstand,
    VersionMismatch); SOAP 1.1 output maps them to Client/Server.
    """

    code: str = "Sender"

    def __init__(self, reason: str, *, code: str | None = None,
                 subcodes: Sequence[etree.QName | str] = (),
                 detail: Iterable[etree._Element] = ()) -> None:
        reason = bounded(reason)
        super().__init__(reason)
        self.reason = reason
        if code is not None:
            self.code = code
        if self.code not in FAULT_CODES:
            raise ValueError(f"SOAP fault code must be one of {FAULT_CODES}, not {self.code!r}")
        self._subcodes = tuple(etree.QName(q) for q in subcodes)  # type: ignore[arg-type]  # lxml-stubs: QName() accepts a QName too
        self.detail: list[etree._Element] = _copies(detail)

    # -- what the fault says ------------------------------------------------
    @property
    def subcodes(self) -> tuple[etree.QName, ...]:
        """Subcodes, outermost first (SOAP 1.2 nesting order)."""
        return self._subcodes

    @property
    def subcode(self) -> etree.QName | None:
        subcodes = self.subcodes
        return subcodes[0] if subcodes else None

    @property
    def is_sender_fault(self) -> bool:
        return self.code == "Sender"

    def fault_action(self, addressing: AddressingVersion = WSA_2005_08) -> str:
        """The wsa:Action a message carrying this fault should have."""
        return addressing.soap_fault_action

    def __str__(self) -> str:
        where = "/".join([self.code, *(q.localname for q in self.subcodes)])
        return f"{self.reason} [{where}]"

    # -- rendering ----------------------------------------------------------
    #: SOAP 1.1 puts detail in the body only for body errors; protocol faults
    #: that carry their detail in a header turn this off.
    _soap11_body_detail: ClassVar[bool] = True

    def detail_elements(self) -> list[etree._Element]:
        """The detail entries to send (fresh copies, safe to append anywhere)."""
        return _copies(self.detail)

    def header_elements(self, soap: SoapVersion) -> list[etree._Element]:
        """Header blocks that belong with this fault in a ``soap`` envelope."""
        return []

    def fault_element(self, soap: SoapVersion) -> etree._Element:
        """The ``Fault`` element to put in the ``soap`` Body."""
        subcodes = self.subcodes
        nsmap = _nsmap_for([soap.ns, *(q.namespace for q in subcodes)])
        fault = etree.Element(soap.qname("Fault"), nsmap=nsmap)
        detail = self.detail_elements()
        if soap is SOAP12:
            parent = etree.SubElement(fault, soap.qname("Code"))
            value = etree.SubElement(parent, soap.qname("Value"))
            value.text = _qname_text(nsmap, soap.qname(soap.code(self.code)))
            for subcode in subcodes:
                parent = etree.SubElement(parent, soap.qname("Subcode"))
                etree.SubElement(parent, soap.qname("Value")).text = _qname_text(nsmap, subcode)
            reason = etree.SubElement(fault, soap.qname("Reason"))
            text = etree.SubElement(reason, soap.qname("Text"))
            text.set(f"{{{XML_NS}}}lang", "en")
            text.text = self.reason
            if detail:
                etree.SubElement(fault, soap.qname("Detail")).extend(detail)
        else:
            code = subcodes[-1] if subcodes else soap.qname(soap.code(self.code))
            etree.SubElement(fault, "faultcode").text = _qname_text(nsmap, code)
            etree.SubElement(fault, "faultstring").text = self.reason
            if detail and self._soap11_body_detail:
                etree.SubElement(fault, "detail").extend(detail)
        return fault


class MalformedMessageError(SoapFault):
    """The message is not well-formed XML, or breaks the schema of a part we read."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, code="Sender")


class UnsafeXMLError(MalformedMessageError):
    """The message uses an XML feature refused for safety (DOCTYPE, entities)."""


class MessageTooLargeError(SoapFault):
    """The message is bigger than the configured limit; it was not parsed."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"message of {size} bytes exceeds the limit of {limit} bytes; "
            "send smaller messages or raise max_message_size", code="Sender")


class InvalidMessageNumber(MalformedMessageError):
    """A message number that is not an integer in 1..2**63-1 (0, negative, garbage).

    WS-RM defines no fault for this (it is a schema violation), so it is a
    plain SOAP Sender fault.  Numbers beyond xs:long are
    :class:`MessageNumberRollover` instead.
    """

    def __init__(self, value: str, identifier: str | None = None, field: str = "MessageNumber") -> None:
        self.value = value
        self.identifier = identifier
        self.field = field
        where = f" in sequence {identifier!r}" if identifier else ""
        problem = f"invalid {field} {value!r}" if value else f"missing {field}"
        super().__init__(f"{problem}{where}: must be an integer from 1 to 2**63-1")


class MustUnderstandFault(SoapFault):
    """Header blocks marked mustUnderstand that this node does not process."""

    def __init__(self, not_understood: Sequence[etree.QName | str], reason: str | None = None) -> None:
        self.not_understood = [etree.QName(q) for q in not_understood]  # type: ignore[arg-type]  # lxml-stubs: QName() accepts a QName too
        names = ", ".join(q.text for q in self.not_understood) or "?"
        super().__init__(reason or f"header(s) not understood: {names}", code="MustUnderstand")

    def header_elements(self, soap: SoapVersion) -> list[etree._Element]:
        if soap is not SOAP12:
            return []
        headers = []
        for qname in self.not_understood:
            nsmap = _nsmap_for([soap.ns, qname.namespace])
            element = etree.Element(soap.qname("NotUnderstood"), nsmap=nsmap)
            element.set("qname", _qname_text(nsmap, qname))
            headers.append(element)
        return headers


class VersionMismatchFault(SoapFault):
    """The message is not a SOAP 1.1 or 1.2 envelope."""

    def __init__(self, reason: str | None = None, found: str | None = None) -> None:
        self.found = found
        super().__init__(
            reason or f"not a SOAP 1.1 or 1.2 Envelope (found {found!r})", code="VersionMismatch")

    def header_elements(self, soap: SoapVersion) -> list[etree._Element]:
        if soap is not SOAP12:
            return []
        nsmap = {"soap": SOAP12.ns, "soap11": SOAP11.ns}
        upgrade = etree.Element(SOAP12.qname("Upgrade"), nsmap=nsmap)
        for prefix in ("soap", "soap11"):
            etree.SubElement(upgrade, SOAP12.qname("SupportedEnvelope")).set("qname", f"{prefix}:Envelope")
        return [upgrade]


# -- WS-ReliableMessaging -----------------------------------------------------

RM_FAULT_CLASSES: dict[str, type[WSRMFault]] = {}


class WSRMFault(SoapFault):
    """A WS-RM fault: ``fault_code`` is the spec's name (``UnknownSequence``...).

    ``version`` picks the namespace; it must be known before rendering (a
    fault raised while parsing knows it from the element; the engine knows
    its sequence's version).  ``identifier`` is the sequence the fault is
    about, sent as the detail.  A received fault may lack it (gSOAP sends none).
    """

    FAULT_CODE: ClassVar[str | None] = None
    DEFAULT_REASON: ClassVar[str] = "WS-ReliableMessaging fault."
    DEFAULT_SENDER: ClassVar[bool] = True
    _soap11_body_detail = False

    def __init__(self, fault_code: str, reason: str | None = None, identifier: str | None = None,
                 *, sender: bool | None = None, version: RMVersion | None = None,
                 detail: Iterable[etree._Element] = ()) -> None:
        self.fault_code = fault_code
        self.identifier = identifier
        self.version = version
        sender = self.DEFAULT_SENDER if sender is None else sender
        super().__init__(reason or self.DEFAULT_REASON,
                         code="Sender" if sender else "Receiver", detail=detail)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.FAULT_CODE:
            RM_FAULT_CLASSES[cls.FAULT_CODE] = cls

    def _version(self) -> RMVersion:
        if self.version is None:
            raise ValueError(
                f"{type(self).__name__} has no WS-RM version; set fault.version "
                "(RM10 or RM11) before rendering it")
        if self.FAULT_CODE and self.FAULT_CODE not in self.version.fault_codes:
            raise ValueError(
                f"WS-RM {self.version.name} has no {self.FAULT_CODE} fault; a peer of that "
                f"version would not understand it (it knows {sorted(self.version.fault_codes)})")
        return self.version

    @property
    def subcodes(self) -> tuple[etree.QName, ...]:
        if self.version is None:
            return ()
        return (self.version.qname(self.fault_code),)

    def fault_action(self, addressing: AddressingVersion = WSA_2005_08) -> str:
        return self._version().fault_action

    def _generated_detail(self, version: RMVersion) -> list[etree._Element]:
        if self.identifier is None:
            return []
        identifier = etree.Element(version.qname("Identifier"), nsmap={"wsrm": version.ns})
        identifier.text = bounded(self.identifier, 1024)  # an identifier a peer made up: never echoed whole
        return [identifier]

    def detail_elements(self) -> list[etree._Element]:
        if self.detail:
            return _copies(self.detail)
        return self._generated_detail(self._version())

    def header_elements(self, soap: SoapVersion) -> list[etree._Element]:
        if soap is not SOAP11:
            return []
        version = self._version()
        fault = etree.Element(version.qname("SequenceFault"), nsmap={"wsrm": version.ns})
        etree.SubElement(fault, version.qname("FaultCode")).text = f"wsrm:{self.fault_code}"
        detail = self.detail_elements()
        if detail:
            if version.is_11:
                etree.SubElement(fault, version.qname("Detail")).extend(detail)
            else:
                fault.extend(detail)
        return [fault]

    def fault_element(self, soap: SoapVersion) -> etree._Element:
        self._version()
        return super().fault_element(soap)


class _KnownRMFault(WSRMFault):
    def __init__(self, identifier: str | None = None, reason: str | None = None, *,
                 sender: bool | None = None, version: RMVersion | None = None,
                 detail: Iterable[etree._Element] = ()) -> None:
        assert self.FAULT_CODE is not None
        super().__init__(self.FAULT_CODE, reason, identifier, sender=sender,
                         version=version, detail=detail)


class SequenceTerminated(_KnownRMFault):
    FAULT_CODE = "SequenceTerminated"
    DEFAULT_REASON = "The Sequence has been terminated due to an unrecoverable error."


class UnknownSequence(_KnownRMFault):
    FAULT_CODE = "UnknownSequence"
    DEFAULT_REASON = "The value of wsrm:Identifier is not a known Sequence identifier."


class InvalidAcknowledgement(_KnownRMFault):
    """Detail is the offending SequenceAcknowledgement element when it is known."""

    FAULT_CODE = "InvalidAcknowledgement"
    DEFAULT_REASON = ("The SequenceAcknowledgement violates the cumulative "
                      "Acknowledgement invariant.")


class MessageNumberRollover(_KnownRMFault):
    """WS-RM 1.1 adds ``MaxMessageNumber`` (the last number used) to the detail."""

    FAULT_CODE = "MessageNumberRollover"
    DEFAULT_REASON = "The maximum value for wsrm:MessageNumber has been exceeded."

    def __init__(self, identifier: str | None = None, reason: str | None = None, *,
                 max_message_number: int | None = None, **kwargs) -> None:
        self.max_message_number = max_message_number
        super().__init__(identifier, reason, **kwargs)

    def _generated_detail(self, version: RMVersion) -> list[etree._Element]:
        detail = super()._generated_detail(version)
        if version.is_11 and self.max_message_number is not None:
            element = etree.Element(version.qname("MaxMessageNumber"), nsmap={"wsrm": version.ns})
            element.text = str(self.max_message_number)
            detail.append(element)
        return detail


class LastMessageNumberExceeded(_KnownRMFault):
    """WS-RM 1.0 only."""

    FAULT_CODE = "LastMessageNumberExceeded"
    DEFAULT_REASON = ("The value for wsrm:MessageNumber exceeds the value of the "
                      "MessageNumber accompanying a LastMessage element in this Sequence.")


class CreateSequenceRefused(_KnownRMFault):
    FAULT_CODE = "CreateSequenceRefused"
    DEFAULT_REASON = "The Create Sequence request has been refused by the RM Destination."


class SequenceClosed(_KnownRMFault):
    """WS-RM 1.1 only."""

    FAULT_CODE = "SequenceClosed"
    DEFAULT_REASON = "The Sequence is closed and cannot accept new messages."


class WSRMRequired(_KnownRMFault):
    """WS-RM 1.1 only."""

    FAULT_CODE = "WSRMRequired"
    DEFAULT_REASON = "The RM Destination requires the use of WSRM."


# -- WS-Addressing --------------------------------------------------------------

WSA_FAULT_CLASSES: dict[str, type[WSAddressingFault]] = {}

# The 2004/08 submission names two faults differently.
_WSA_2004_NAMES = {
    "InvalidAddressingHeader": "InvalidMessageInformationHeader",
    "MessageAddressingHeaderRequired": "MessageInformationHeaderRequired",
}
_WSA_2005_NAMES = {v: k for k, v in _WSA_2004_NAMES.items()}


class WSAddressingFault(SoapFault):
    """A WS-Addressing fault; ``fault_code`` uses the 2005/08 names.

    ``subsubcode`` (2005/08 only) refines InvalidAddressingHeader
    (InvalidCardinality, MissingAddressInEPR, ...).  ``problem_header`` and
    ``problem_action`` become ProblemHeaderQName / ProblemAction detail.
    """

    FAULT_CODE: ClassVar[str | None] = None
    DEFAULT_REASON: ClassVar[str] = "WS-Addressing fault."
    DEFAULT_SENDER: ClassVar[bool] = True
    _soap11_body_detail = False

    def __init__(self, fault_code: str, reason: str | None = None, *,
                 subsubcode: str | None = None,
                 problem_header: etree.QName | str | None = None,
                 problem_action: str | None = None,
                 version: AddressingVersion | None = None, sender: bool | None = None,
                 detail: Iterable[etree._Element] = ()) -> None:
        self.fault_code = _WSA_2005_NAMES.get(fault_code, fault_code)
        self.subsubcode = subsubcode
        self.problem_header = (etree.QName(problem_header)  # type: ignore[arg-type]  # lxml-stubs: QName() accepts a QName too
                               if problem_header is not None else None)
        self.problem_action = problem_action
        self.version = version
        sender = self.DEFAULT_SENDER if sender is None else sender
        super().__init__(reason or self.DEFAULT_REASON,
                         code="Sender" if sender else "Receiver", detail=detail)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.FAULT_CODE:
            WSA_FAULT_CLASSES[cls.FAULT_CODE] = cls

    @property
    def _wsa(self) -> AddressingVersion:
        return self.version or WSA_2005_08

    @property
    def subcodes(self) -> tuple[etree.QName, ...]:
        wsa = self._wsa
        if wsa is WSA_2004_08:
            return (wsa.qname(_WSA_2004_NAMES.get(self.fault_code, self.fault_code)),)
        if self.subsubcode:
            return (wsa.qname(self.fault_code), wsa.qname(self.subsubcode))
        return (wsa.qname(self.fault_code),)

    def fault_action(self, addressing: AddressingVersion | None = None) -> str:
        return (self.version or addressing or WSA_2005_08).fault_action

    def detail_elements(self) -> list[etree._Element]:
        if self.detail:
            return _copies(self.detail)
        wsa = self._wsa
        if wsa is not WSA_2005_08:
            return []
        detail = []
        if self.problem_header is not None:
            nsmap = _nsmap_for([wsa.ns, self.problem_header.namespace])
            element = etree.Element(wsa.qname("ProblemHeaderQName"), nsmap=nsmap)
            element.text = _qname_text(nsmap, self.problem_header)
            detail.append(element)
        if self.problem_action is not None:
            element = etree.Element(wsa.qname("ProblemAction"), nsmap={"wsa": wsa.ns})
            etree.SubElement(element, wsa.qname("Action")).text = self.problem_action
            detail.append(element)
        return detail

    def header_elements(self, soap: SoapVersion) -> list[etree._Element]:
        detail = self.detail_elements()
        if soap is not SOAP11 or not detail or self._wsa is not WSA_2005_08:
            return []
        header = etree.Element(WSA_2005_08.qname("FaultDetail"), nsmap={"wsa": WSA_2005_08.ns})
        header.extend(detail)
        return [header]


class _KnownWSAFault(WSAddressingFault):
    def __init__(self, reason: str | None = None, **kwargs) -> None:
        assert self.FAULT_CODE is not None
        super().__init__(self.FAULT_CODE, reason, **kwargs)


class InvalidAddressingHeader(_KnownWSAFault):
    FAULT_CODE = "InvalidAddressingHeader"
    DEFAULT_REASON = "A header representing a Message Addressing Property is not valid."


class MessageAddressingHeaderRequired(_KnownWSAFault):
    FAULT_CODE = "MessageAddressingHeaderRequired"
    DEFAULT_REASON = "A required header representing a Message Addressing Property is not present."


class DestinationUnreachable(_KnownWSAFault):
    FAULT_CODE = "DestinationUnreachable"
    DEFAULT_REASON = "No route can be determined to reach the destination role."


class ActionNotSupported(_KnownWSAFault):
    FAULT_CODE = "ActionNotSupported"
    DEFAULT_REASON = "The action cannot be processed at the receiver."


class EndpointUnavailable(_KnownWSAFault):
    FAULT_CODE = "EndpointUnavailable"
    DEFAULT_REASON = "The endpoint is unable to process the message at this time."
    DEFAULT_SENDER = False


# -- WS-MakeConnection ------------------------------------------------------------

WSMC_FAULT_CLASSES: dict[str, type[WSMCFault]] = {}


class WSMCFault(SoapFault):
    """A WS-MakeConnection fault (UnsupportedSelection, MissingSelection)."""

    FAULT_CODE: ClassVar[str | None] = None
    DEFAULT_REASON: ClassVar[str] = "WS-MakeConnection fault."

    def __init__(self, fault_code: str, reason: str | None = None, *,
                 detail: Iterable[etree._Element] = ()) -> None:
        self.fault_code = fault_code
        super().__init__(reason or self.DEFAULT_REASON, code="Sender",
                         subcodes=[etree.QName(WSMC_NS, fault_code)], detail=detail)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.FAULT_CODE:
            WSMC_FAULT_CLASSES[cls.FAULT_CODE] = cls

    def fault_action(self, addressing: AddressingVersion = WSA_2005_08) -> str:
        return WSMC_FAULT_ACTION


class _KnownMCFault(WSMCFault):
    def __init__(self, reason: str | None = None, *, detail: Iterable[etree._Element] = ()) -> None:
        assert self.FAULT_CODE is not None
        super().__init__(self.FAULT_CODE, reason, detail=detail)


class UnsupportedSelection(_KnownMCFault):
    FAULT_CODE = "UnsupportedSelection"
    DEFAULT_REASON = ("The extension element used in the message selection is not supported "
                      "by the MakeConnection receiver.")


class MissingSelection(_KnownMCFault):
    FAULT_CODE = "MissingSelection"
    DEFAULT_REASON = "The MakeConnection request did not contain any selection criteria."
