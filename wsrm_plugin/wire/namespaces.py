"""The names the wire speaks: namespaces, versions, action URIs, anonymous addresses.

A WS-RM peer is defined by three independent choices: the WS-RM version (1.0 of
2005/02 or 1.1 of 2007/02), the WS-Addressing version (the 2004/08 submission or
the W3C 2005/08 recommendation) and the SOAP version.  1.0 is usually paired with
2004/08 and 1.1 with 2005/08, but real peers (gSOAP, WCF) pair 1.0 with 2005/08,
so every combination is representable and the defaults are only defaults.  Each
version is a small frozen object so the rest of the code asks ``version.ns``
instead of comparing strings.
"""

from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

__all__ = [
    "XML_NS", "XSI_NS", "FAULT_CODES",
    "SoapVersion", "SOAP11", "SOAP12", "SOAP_VERSIONS",
    "AddressingVersion", "WSA_2004_08", "WSA_2005_08", "ADDRESSING_VERSIONS",
    "RMVersion", "RM10", "RM11", "RM_VERSIONS",
    "WSMC_NS", "WSMC_ANONYMOUS_PREFIX", "MAKE_CONNECTION_ACTION", "WSMC_FAULT_ACTION",
    "mc_anonymous_uri", "mc_anonymous_id",
    "MAX_MESSAGE_NUMBER", "PREFIXES",
    "SOAP11_NS", "SOAP12_NS", "RM10_NS", "RM11_NS",
]

XML_NS = "http://www.w3.org/XML/1998/namespace"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"

#: SOAP fault codes by their SOAP 1.2 names (SOAP 1.1 says Client/Server for Sender/Receiver).
FAULT_CODES = ("Sender", "Receiver", "MustUnderstand", "VersionMismatch", "DataEncodingUnknown")

#: Message numbers are xs:long in practice (WS-RM 1.1 MessageNumberType): 1 .. 2**63-1.
MAX_MESSAGE_NUMBER = 2**63 - 1


@dataclass(frozen=True)
class SoapVersion:
    """One SOAP version: its envelope namespace, media type and fault code names.

    Fault codes are named here by their SOAP 1.2 names (``Sender``,
    ``Receiver``, ...); :meth:`code` gives the local name this version writes
    (``Client``/``Server`` in SOAP 1.1), so fault code stays version-neutral.
    """

    name: str
    ns: str
    content_type: str
    must_understand_true: str
    _codes: tuple[tuple[str, str], ...]

    def code(self, generic: str) -> str:
        """The local name of fault code ``generic`` ("Sender", ...) in this version."""
        return dict(self._codes).get(generic, generic)

    def generic_code(self, local: str) -> str:
        """Map this version's fault code local name back to the SOAP 1.2 name."""
        for generic, mine in self._codes:
            if mine == local:
                return generic
        return local

    def qname(self, local: str) -> etree.QName:
        return etree.QName(self.ns, local)

    def http_headers(self, action: str | None = None) -> dict[str, str]:
        """The HTTP headers that carry this envelope, with the SOAP action where each version puts it."""
        if self.ns == SOAP11_NS:
            headers = {"Content-Type": f"{self.content_type}; charset=utf-8"}
            headers["SOAPAction"] = f'"{action}"' if action is not None else '""'
            return headers
        content_type = f"{self.content_type}; charset=utf-8"
        if action is not None:
            content_type += f'; action="{action}"'
        return {"Content-Type": content_type}

    @staticmethod
    def for_namespace(ns: str | None) -> SoapVersion | None:
        return _SOAP_BY_NS.get(ns or "")

    def __repr__(self) -> str:
        return f"SOAP{self.name.replace('.', '')}"


SOAP11_NS = "http://schemas.xmlsoap.org/soap/envelope/"
SOAP12_NS = "http://www.w3.org/2003/05/soap-envelope"

SOAP11 = SoapVersion(
    name="1.1", ns=SOAP11_NS, content_type="text/xml", must_understand_true="1",
    _codes=(("Sender", "Client"), ("Receiver", "Server"),
            ("MustUnderstand", "MustUnderstand"), ("VersionMismatch", "VersionMismatch")),
)
SOAP12 = SoapVersion(
    name="1.2", ns=SOAP12_NS, content_type="application/soap+xml", must_understand_true="true",
    _codes=(("Sender", "Sender"), ("Receiver", "Receiver"),
            ("MustUnderstand", "MustUnderstand"), ("VersionMismatch", "VersionMismatch"),
            ("DataEncodingUnknown", "DataEncodingUnknown")),
)
SOAP_VERSIONS = (SOAP11, SOAP12)
_SOAP_BY_NS = {v.ns: v for v in SOAP_VERSIONS}


@dataclass(frozen=True)
class AddressingVersion:
    """One WS-Addressing version and the URIs that differ between them.

    ``fault_action`` is for faults WS-Addressing itself defines;
    ``soap_fault_action`` for plain SOAP faults (2005/08 distinguishes them,
    2004/08 has a single fault action).  ``none`` only exists in 2005/08.
    """

    name: str
    ns: str
    anonymous: str
    none: str | None
    fault_action: str
    soap_fault_action: str
    reply_relationship: str

    @staticmethod
    def for_namespace(ns: str | None) -> AddressingVersion | None:
        return _WSA_BY_NS.get(ns or "")

    def qname(self, local: str) -> etree.QName:
        return etree.QName(self.ns, local)

    def is_anonymous(self, address: str | None) -> bool:
        return address is None or address == self.anonymous

    def __repr__(self) -> str:
        return f"WSA_{self.name.replace('/', '_')}"


_WSA04 = "http://schemas.xmlsoap.org/ws/2004/08/addressing"
_WSA05 = "http://www.w3.org/2005/08/addressing"

WSA_2004_08 = AddressingVersion(
    name="2004/08", ns=_WSA04,
    anonymous=_WSA04 + "/role/anonymous", none=None,
    fault_action=_WSA04 + "/fault", soap_fault_action=_WSA04 + "/fault",
    reply_relationship="{%s}Reply" % _WSA04,
)
WSA_2005_08 = AddressingVersion(
    name="2005/08", ns=_WSA05,
    anonymous=_WSA05 + "/anonymous", none=_WSA05 + "/none",
    fault_action=_WSA05 + "/fault", soap_fault_action=_WSA05 + "/soap/fault",
    reply_relationship=_WSA05 + "/reply",
)
ADDRESSING_VERSIONS = (WSA_2004_08, WSA_2005_08)
_WSA_BY_NS = {v.ns: v for v in ADDRESSING_VERSIONS}


@dataclass(frozen=True)
class RMVersion:
    """One WS-ReliableMessaging version: namespace, default WS-A version and actions.

    Action URIs are the namespace plus "/" plus the message name; a name this
    version lacks (CloseSequence in 1.0, LastMessage in 1.1) is refused by
    :meth:`action` so a 1.1-only message can't silently go out as 1.0.
    """

    name: str
    ns: str
    addressing: AddressingVersion
    action_names: frozenset[str]
    fault_codes: frozenset[str]

    def action(self, message: str) -> str:
        if message not in self.action_names:
            raise ValueError(
                f"WS-RM {self.name} has no {message!r} message; "
                f"it knows {sorted(self.action_names)}")
        return f"{self.ns}/{message}"

    def qname(self, local: str) -> etree.QName:
        return etree.QName(self.ns, local)

    @property
    def is_11(self) -> bool:
        return self.ns == RM11_NS

    @property
    def fault_action(self) -> str:
        return f"{self.ns}/fault"

    @property
    def create_sequence_action(self) -> str:
        return self.action("CreateSequence")

    @property
    def create_sequence_response_action(self) -> str:
        return self.action("CreateSequenceResponse")

    @property
    def terminate_sequence_action(self) -> str:
        return self.action("TerminateSequence")

    @property
    def sequence_acknowledgement_action(self) -> str:
        return self.action("SequenceAcknowledgement")

    @property
    def ack_requested_action(self) -> str:
        return self.action("AckRequested")

    @staticmethod
    def for_namespace(ns: str | None) -> RMVersion | None:
        return _RM_BY_NS.get(ns or "")

    def __repr__(self) -> str:
        return f"RM{self.name.replace('.', '')}"


RM10_NS = "http://schemas.xmlsoap.org/ws/2005/02/rm"
RM11_NS = "http://docs.oasis-open.org/ws-rx/wsrm/200702"

_COMMON_ACTIONS = {
    "CreateSequence", "CreateSequenceResponse", "TerminateSequence",
    "SequenceAcknowledgement", "AckRequested",
}
_COMMON_FAULTS = {
    "SequenceTerminated", "UnknownSequence", "InvalidAcknowledgement",
    "MessageNumberRollover", "CreateSequenceRefused",
}

RM10 = RMVersion(
    name="1.0", ns=RM10_NS, addressing=WSA_2004_08,
    action_names=frozenset(_COMMON_ACTIONS | {"LastMessage"}),
    fault_codes=frozenset(_COMMON_FAULTS | {"LastMessageNumberExceeded"}),
)
RM11 = RMVersion(
    name="1.1", ns=RM11_NS, addressing=WSA_2005_08,
    action_names=frozenset(_COMMON_ACTIONS | {
        "CloseSequence", "CloseSequenceResponse", "TerminateSequenceResponse"}),
    fault_codes=frozenset(_COMMON_FAULTS | {"SequenceClosed", "WSRMRequired"}),
)
RM_VERSIONS = (RM10, RM11)
_RM_BY_NS = {v.ns: v for v in RM_VERSIONS}


WSMC_NS = "http://docs.oasis-open.org/ws-rx/wsmc/200702"
WSMC_ANONYMOUS_PREFIX = WSMC_NS + "/anonymous?id="
MAKE_CONNECTION_ACTION = WSMC_NS + "/MakeConnection"
WSMC_FAULT_ACTION = WSMC_NS + "/fault"


#: The prefixes this package writes, so output reads like the specifications' examples.
PREFIXES = {
    RM10_NS: "wsrm", RM11_NS: "wsrm", _WSA04: "wsa", _WSA05: "wsa", WSMC_NS: "wsmc",
    SOAP11_NS: "soap", SOAP12_NS: "soap",
}


def mc_anonymous_uri(identifier: str) -> str:
    """The WS-MakeConnection anonymous URI for a polling client named ``identifier``."""
    if not identifier:
        raise ValueError("a WS-MakeConnection anonymous URI needs a non-empty id")
    return WSMC_ANONYMOUS_PREFIX + identifier


def mc_anonymous_id(address: str | None) -> str | None:
    """The id in a WS-MakeConnection anonymous URI, or None if ``address`` isn't one."""
    if address and address.startswith(WSMC_ANONYMOUS_PREFIX):
        return address[len(WSMC_ANONYMOUS_PREFIX):] or None
    return None
