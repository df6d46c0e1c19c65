"""WS-ReliableMessaging 1.0 and 1.1 protocol elements, as plain dataclasses.

Each element is one dataclass with ``to_xml(version, ...)`` and
``from_xml(element) -> (obj, version)``.  The objects are version-neutral;
the version is a rendering choice and is read back from the namespace, so
one engine serves 1.0 and 1.1 peers.  Reading is tolerant where real peers
differ (gSOAP's Sequence without mustUnderstand, Final before the ranges,
identifiers that are not URIs, 1.0 with 2005/08 addressing, unknown
extension elements and attributes) and strict where a mistake would corrupt
the protocol: message numbers outside 1..2**63-1, impossible
acknowledgement ranges and missing identifiers raise the fault to answer with.

A 1.1 acknowledgement of nothing is ``<wsrm:None/>``; here it is simply an
empty ``ranges`` list (with no ``nacks``).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from collections.abc import Callable
from datetime import timedelta
from typing import ClassVar, TypeVar

from lxml import etree

from .addressing import EndpointReference
from .faults import (
    InvalidAcknowledgement, InvalidMessageNumber, MalformedMessageError, MessageNumberRollover,
)
from .namespaces import MAX_MESSAGE_NUMBER, RM_VERSIONS, AddressingVersion, RMVersion, SoapVersion
from .xmlsafe import children, split_tag, text_of

__all__ = [
    "CreateSequence", "Offer", "CreateSequenceResponse", "SequenceHeader",
    "SequenceAcknowledgement", "AckRequested", "CloseSequence", "CloseSequenceResponse",
    "TerminateSequence", "TerminateSequenceResponse",
    "INCOMPLETE_SEQUENCE_BEHAVIORS", "RM_HEADER_NAMES", "RM_BODY_NAMES",
    "parse_rm_element", "parse_message_number", "parse_duration", "format_duration",
    "expires_after", "MAX_IDENTIFIER_LENGTH",
]

INCOMPLETE_SEQUENCE_BEHAVIORS = ("DiscardEntireSequence", "DiscardFollowingFirstGap", "NoDiscard")
#: Elements that travel as SOAP headers; the others are bodies.
RM_HEADER_NAMES = ("Sequence", "SequenceAcknowledgement", "AckRequested")
RM_BODY_NAMES = ("CreateSequence", "CreateSequenceResponse", "CloseSequence",
                 "CloseSequenceResponse", "TerminateSequence", "TerminateSequenceResponse")

_T = TypeVar("_T")

# -- values ---------------------------------------------------------------------

_UNSIGNED = re.compile(r"\+?0*([0-9]+)")
_DURATION = re.compile(
    r"(-)?P(?!$)(?:([0-9]+)Y)?(?:([0-9]+)M)?(?:([0-9]+)D)?"
    r"(?:T(?!$)(?:([0-9]+)H)?(?:([0-9]+)M)?(?:([0-9]+(?:\.[0-9]*)?)S)?)?")


def parse_message_number(text: str, identifier: str | None = None, *,
                         field: str = "MessageNumber", version: RMVersion | None = None) -> int:
    """Read a message number: 1..2**63-1.

    Beyond xs:long is MessageNumberRollover (the fault WS-RM defines for
    it); 0, negatives and non-numbers are InvalidMessageNumber (a Sender fault).
    """
    raw = (text or "").strip()
    match = _UNSIGNED.fullmatch(raw)
    if match is None:
        raise InvalidMessageNumber(raw, identifier, field)
    digits = match.group(1)
    if len(digits) > 19 or int(digits) > MAX_MESSAGE_NUMBER:
        raise MessageNumberRollover(
            identifier, f"{field} {raw} is beyond the largest allowed value 2**63-1",
            version=version, max_message_number=MAX_MESSAGE_NUMBER)
    number = int(digits)
    if number == 0:
        raise InvalidMessageNumber(raw, identifier, field)
    return number


def parse_duration(text: str) -> timedelta:
    """xs:duration -> timedelta; years count 365 days and months 30 (Expires only needs an estimate)."""
    match = _DURATION.fullmatch((text or "").strip())
    if match is None:
        raise ValueError(f"{text!r} is not an xs:duration (e.g. PT10M, P1D)")
    sign, years, months, days, hours, minutes, seconds = match.groups()
    try:
        value = timedelta(
            days=int(years or 0) * 365 + int(months or 0) * 30 + int(days or 0),
            hours=int(hours or 0), minutes=int(minutes or 0), seconds=float(seconds or 0))
    except OverflowError:
        raise ValueError(f"duration {text!r} is too long") from None
    return -value if sign else value


def format_duration(value: timedelta) -> str:
    """timedelta -> xs:duration (days, hours, minutes, seconds)."""
    sign = "-" if value < timedelta(0) else ""
    value = abs(value)
    hours, rest = divmod(value.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    seconds_text = f"{seconds}.{value.microseconds:06d}".rstrip("0").rstrip(".") if value.microseconds else str(seconds)
    date = f"{value.days}D" if value.days else ""
    time = "".join(f"{n}{u}" for n, u in ((hours, "H"), (minutes, "M")) if n)
    if seconds or value.microseconds or not (date or time):
        time += f"{seconds_text}S"
    return f"{sign}P{date}" + (f"T{time}" if time else "")


def expires_after(expires: str | None) -> timedelta | None:
    """The lifetime an Expires value grants; None means never expires (absent or PT0S)."""
    if expires is None:
        return None
    value = parse_duration(expires)
    return None if value == timedelta(0) else value


# -- shared reading/writing helpers ----------------------------------------------

def _version_of(element: etree._Element, local: str) -> RMVersion:
    qname = etree.QName(element)
    version = RMVersion.for_namespace(qname.namespace)
    if version is None or qname.localname != local:
        raise MalformedMessageError(f"expected a WS-RM {local} element, got {qname.text}")
    return version


def _own_children(element: etree._Element, version: RMVersion):
    """(local name, child) for children in the WS-RM namespace; extensions are skipped."""
    for child in children(element):
        namespace, local = split_tag(child.tag)
        if namespace == version.ns:
            yield local, child


def _once(current: _T | None, value: _T, what: str, parent: str) -> _T:
    if current is not None:
        raise MalformedMessageError(f"wsrm:{parent} has more than one {what}")
    return value


#: Characters a sequence identifier may have.  Identifiers are URIs in practice (WCF, CXF and
#: this package write ``urn:uuid:`` + 36; gSOAP a few more); a peer's identifier is stored and
#: echoed in faults, so one of a megabyte is refused before it is either.
MAX_IDENTIFIER_LENGTH = 1024


def _identifier_text(element: etree._Element, parent: str) -> str:
    text = text_of(element)
    if not text:
        raise MalformedMessageError(f"wsrm:{parent} has an empty Identifier")
    if len(text) > MAX_IDENTIFIER_LENGTH:
        raise MalformedMessageError(f"wsrm:{parent} has an Identifier of {len(text)} characters; at most "
                                    f"{MAX_IDENTIFIER_LENGTH} are accepted")
    return text


def _require(value: _T | None, what: str, parent: str) -> _T:
    if value is None:
        raise MalformedMessageError(f"wsrm:{parent} has no {what}")
    return value


def _expires_text(element: etree._Element, parent: str) -> str:
    text = text_of(element)
    try:
        parse_duration(text)
    except ValueError as exc:
        raise MalformedMessageError(f"wsrm:{parent}/Expires: {exc}") from None
    return text


def _behavior_text(element: etree._Element, parent: str) -> str:
    text = text_of(element)
    if text not in INCOMPLETE_SEQUENCE_BEHAVIORS:
        raise MalformedMessageError(
            f"wsrm:{parent}/IncompleteSequenceBehavior {text!r} is not one of "
            f"{INCOMPLETE_SEQUENCE_BEHAVIORS}")
    return text


def _epr(element: etree._Element, parent: str) -> EndpointReference:
    try:
        return EndpointReference.from_xml(element)[0]
    except MalformedMessageError as exc:
        raise MalformedMessageError(f"wsrm:{parent}: {exc.reason}") from None


def _new(version: RMVersion, local: str, extra_ns: dict[str, str] | None = None) -> etree._Element:
    return etree.Element(version.qname(local), nsmap={"wsrm": version.ns, **(extra_ns or {})})


#: (WS-RM namespace, SOAP namespace or None, tag, children) -> an empty header block (see _block)
_BLOCKS: dict[tuple[str, str | None, str, tuple[str, ...]], etree._Element] = {}


def _block(version: RMVersion, soap: SoapVersion | None, local: str, *kids: str) -> etree._Element:
    """A new header block ``local`` (mustUnderstand with ``soap``) with empty children ``kids``.

    Every message sent carries a Sequence header and most answers a SequenceAcknowledgement:
    lxml copies a made one about four times faster than it builds one with its namespace map."""
    key = (version.ns, soap.ns if soap is not None else None, local, kids)
    made = _BLOCKS.get(key)
    if made is None:
        made = _new(version, local, {"soap": soap.ns} if soap else None)
        if soap is not None:
            made.set(soap.qname("mustUnderstand").text, soap.must_understand_true)
        for kid in kids:
            _sub(made, version, kid)
        _BLOCKS[key] = made
    return made.__copy__()  # type: ignore[attr-defined]  # lxml's deep copy (see addressing._copy_of)


def _sub(parent: etree._Element, version: RMVersion, local: str, text: str | None = None) -> etree._Element:
    element = etree.SubElement(parent, version.qname(local))
    if text is not None:
        element.text = text
    return element


def _check_identifier(identifier: str) -> None:
    if not identifier or not identifier.strip():
        raise ValueError("a sequence identifier must be a non-empty string")


def _check_number(number: int, what: str) -> None:
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_MESSAGE_NUMBER:
        raise ValueError(f"{what} must be an int from 1 to 2**63-1, not {number!r}")


def _check_11(version: RMVersion, what: str) -> None:
    if not version.is_11:
        raise ValueError(f"{what} only exists in WS-RM 1.1; this sequence speaks {version.name}")


def _addressing(version: RMVersion, addressing: AddressingVersion | None) -> AddressingVersion:
    return addressing or version.addressing


# -- CreateSequence ------------------------------------------------------------------

@dataclass
class Offer:
    """A sequence the initiator offers for the responses (CreateSequence/Offer).

    WS-RM 1.1 requires ``endpoint`` (where the offered sequence's messages
    go); WCF insists it equal AcksTo and ReplyTo.
    """

    identifier: str
    endpoint: EndpointReference | None = None
    expires: str | None = None
    incomplete_sequence_behavior: str | None = None

    def _to_xml(self, parent: etree._Element, version: RMVersion, wsa: AddressingVersion) -> None:
        _check_identifier(self.identifier)
        offer = _sub(parent, version, "Offer")
        _sub(offer, version, "Identifier", self.identifier)
        if version.is_11:
            if self.endpoint is None:
                raise ValueError("a WS-RM 1.1 Offer needs an endpoint")
            offer.append(self.endpoint.to_xml(version.qname("Endpoint"), wsa))
        if self.expires is not None:
            _sub(offer, version, "Expires", self.expires)
        if self.incomplete_sequence_behavior is not None:
            _check_11(version, "Offer/IncompleteSequenceBehavior")
            _sub(offer, version, "IncompleteSequenceBehavior", self.incomplete_sequence_behavior)

    @classmethod
    def _from_xml(cls, element: etree._Element, version: RMVersion) -> Offer:
        identifier = endpoint = expires = behavior = None
        for local, child in _own_children(element, version):
            if local == "Identifier":
                identifier = _once(identifier, _identifier_text(child, "Offer"), "Identifier", "Offer")
            elif local == "Endpoint" and version.is_11:
                endpoint = _once(endpoint, _epr(child, "Offer/Endpoint"), "Endpoint", "Offer")
            elif local == "Expires":
                expires = _once(expires, _expires_text(child, "Offer"), "Expires", "Offer")
            elif local == "IncompleteSequenceBehavior" and version.is_11:
                behavior = _once(behavior, _behavior_text(child, "Offer"),
                                 "IncompleteSequenceBehavior", "Offer")
        identifier = _require(identifier, "Identifier", "Offer")
        if version.is_11:
            _require(endpoint, "Endpoint (required by WS-RM 1.1)", "Offer")
        return cls(identifier, endpoint, expires, behavior)


@dataclass
class CreateSequence:
    """Body of the request that opens a sequence."""

    TAG: ClassVar[str] = "CreateSequence"

    acks_to: EndpointReference
    expires: str | None = None
    offer: Offer | None = None

    @property
    def expires_after(self) -> timedelta | None:
        return expires_after(self.expires)

    def to_xml(self, version: RMVersion, addressing: AddressingVersion | None = None) -> etree._Element:
        wsa = _addressing(version, addressing)
        element = _new(version, self.TAG, {"wsa": wsa.ns})
        element.append(self.acks_to.to_xml(version.qname("AcksTo"), wsa))
        if self.expires is not None:
            _sub(element, version, "Expires", self.expires)
        if self.offer is not None:
            self.offer._to_xml(element, version, wsa)
        return element

    @classmethod
    def from_xml(cls, element: etree._Element) -> tuple[CreateSequence, RMVersion]:
        version = _version_of(element, cls.TAG)
        acks_to = expires = offer = None
        for local, child in _own_children(element, version):
            if local == "AcksTo":
                acks_to = _once(acks_to, _epr(child, "CreateSequence/AcksTo"), "AcksTo", cls.TAG)
            elif local == "Expires":
                expires = _once(expires, _expires_text(child, cls.TAG), "Expires", cls.TAG)
            elif local == "Offer":
                offer = _once(offer, Offer._from_xml(child, version), "Offer", cls.TAG)
        return cls(_require(acks_to, "AcksTo", cls.TAG), expires, offer), version


@dataclass
class CreateSequenceResponse:
    """Body of the answer naming the new sequence; ``accept`` is the Accept/AcksTo for an offer."""

    TAG: ClassVar[str] = "CreateSequenceResponse"

    identifier: str
    expires: str | None = None
    incomplete_sequence_behavior: str | None = None
    accept: EndpointReference | None = None

    @property
    def expires_after(self) -> timedelta | None:
        return expires_after(self.expires)

    def to_xml(self, version: RMVersion, addressing: AddressingVersion | None = None) -> etree._Element:
        _check_identifier(self.identifier)
        wsa = _addressing(version, addressing)
        element = _new(version, self.TAG, {"wsa": wsa.ns} if self.accept else None)
        _sub(element, version, "Identifier", self.identifier)
        if self.expires is not None:
            _sub(element, version, "Expires", self.expires)
        if self.incomplete_sequence_behavior is not None:
            _check_11(version, "IncompleteSequenceBehavior")
            _sub(element, version, "IncompleteSequenceBehavior", self.incomplete_sequence_behavior)
        if self.accept is not None:
            accept = _sub(element, version, "Accept")
            accept.append(self.accept.to_xml(version.qname("AcksTo"), wsa))
        return element

    @classmethod
    def from_xml(cls, element: etree._Element) -> tuple[CreateSequenceResponse, RMVersion]:
        version = _version_of(element, cls.TAG)
        identifier = expires = behavior = accept = None
        for local, child in _own_children(element, version):
            if local == "Identifier":
                identifier = _once(identifier, _identifier_text(child, cls.TAG), "Identifier", cls.TAG)
            elif local == "Expires":
                expires = _once(expires, _expires_text(child, cls.TAG), "Expires", cls.TAG)
            elif local == "IncompleteSequenceBehavior" and version.is_11:
                behavior = _once(behavior, _behavior_text(child, cls.TAG),
                                 "IncompleteSequenceBehavior", cls.TAG)
            elif local == "Accept":
                acks_to = None
                for inner, grandchild in _own_children(child, version):
                    if inner == "AcksTo":
                        acks_to = _once(acks_to, _epr(grandchild, "Accept/AcksTo"), "AcksTo", "Accept")
                accept = _once(accept, _require(acks_to, "AcksTo", "Accept"), "Accept", cls.TAG)
        return cls(_require(identifier, "Identifier", cls.TAG), expires, behavior, accept), version


# -- headers ----------------------------------------------------------------------

@dataclass
class SequenceHeader:
    """The wsrm:Sequence header of an application message.

    ``last_message`` is WS-RM 1.0's LastMessage marker.  Written with
    mustUnderstand when ``soap`` is given (the spec requires it); read
    whether or not it is there (gSOAP omits it).
    """

    TAG: ClassVar[str] = "Sequence"

    identifier: str
    message_number: int
    last_message: bool = False

    def to_xml(self, version: RMVersion, soap: SoapVersion | None = None) -> etree._Element:
        _check_identifier(self.identifier)
        _check_number(self.message_number, "MessageNumber")
        element = _block(version, soap, self.TAG, "Identifier", "MessageNumber")
        element[0].text = self.identifier
        element[1].text = str(self.message_number)
        if self.last_message:
            if version.is_11:
                raise ValueError("WS-RM 1.1 has no LastMessage; close the sequence with CloseSequence")
            _sub(element, version, "LastMessage")
        return element

    @classmethod
    def from_xml(cls, element: etree._Element) -> tuple[SequenceHeader, RMVersion]:
        version = _version_of(element, cls.TAG)
        identifier = number_text = None
        last = False
        for local, child in _own_children(element, version):
            if local == "Identifier":
                identifier = _once(identifier, _identifier_text(child, cls.TAG), "Identifier", cls.TAG)
            elif local == "MessageNumber":
                number_text = _once(number_text, text_of(child), "MessageNumber", cls.TAG)
            elif local == "LastMessage" and not version.is_11:
                last = True
        identifier = _require(identifier, "Identifier", cls.TAG)
        if number_text is None:
            raise InvalidMessageNumber("", identifier)
        number = parse_message_number(number_text, identifier, version=version)
        return cls(identifier, number, last), version


@dataclass
class SequenceAcknowledgement:
    """Acknowledgement ranges ``[(lower, upper), ...]``, or ``nacks``, for one sequence.

    An empty ``ranges`` with no ``nacks`` is 1.1's ``<None/>``.  ``final``
    (1.1) says the destination will accept no more messages.  Ranges are
    kept in the order received; overlap is the engine's business.
    """

    TAG: ClassVar[str] = "SequenceAcknowledgement"

    identifier: str
    ranges: list[tuple[int, int]] = field(default_factory=list)
    nacks: list[int] = field(default_factory=list)
    final: bool = False

    @staticmethod
    def ranges_from_numbers(numbers) -> list[tuple[int, int]]:
        """Collapse message numbers into sorted, disjoint (lower, upper) ranges."""
        ranges: list[tuple[int, int]] = []
        for number in sorted(set(numbers)):
            if ranges and number == ranges[-1][1] + 1:
                ranges[-1] = (ranges[-1][0], number)
            else:
                ranges.append((number, number))
        return ranges

    def acknowledges(self, number: int) -> bool:
        return any(lower <= number <= upper for lower, upper in self.ranges)

    def to_xml(self, version: RMVersion, soap: SoapVersion | None = None) -> etree._Element:
        _check_identifier(self.identifier)
        if self.ranges and self.nacks:
            raise ValueError("an acknowledgement carries ranges or Nacks, not both")
        if self.final and self.nacks:
            raise ValueError("Final goes with acknowledgement ranges, not with Nacks")
        if self.final:
            _check_11(version, "Final")
        if not self.ranges and not self.nacks:
            _check_11(version, "an acknowledgement of nothing (None)")
        element = _block(version, soap, self.TAG, "Identifier")
        element[0].text = self.identifier
        range_tag = f"{{{version.ns}}}AcknowledgementRange"  # the tag as text: no QName per range
        for lower, upper in self.ranges:
            # plain ints in order (every range a store or AckRanges made) checked inline: this
            # runs for each range of every acknowledgement sent; anything else gets the precise error
            if not (type(lower) is int and type(upper) is int and 1 <= lower <= upper <= MAX_MESSAGE_NUMBER):
                _check_number(lower, "AcknowledgementRange Lower")
                _check_number(upper, "AcknowledgementRange Upper")
                if lower > upper:
                    raise ValueError(f"AcknowledgementRange Lower {lower} > Upper {upper}")
            ack_range = etree.SubElement(element, range_tag)
            ack_range.set("Upper", str(upper))
            ack_range.set("Lower", str(lower))
        for nack in self.nacks:
            _check_number(nack, "Nack")
            _sub(element, version, "Nack", str(nack))
        if not self.ranges and not self.nacks:
            _sub(element, version, "None")
        if self.final:
            _sub(element, version, "Final")
        return element

    @classmethod
    def from_xml(cls, element: etree._Element) -> tuple[SequenceAcknowledgement, RMVersion]:
        version = _version_of(element, cls.TAG)
        identifier = None
        ranges: list[tuple[int, int]] = []
        nacks: list[int] = []
        none = final = False
        pending: list[tuple[str, etree._Element]] = []
        for local, child in _own_children(element, version):
            if local == "Identifier":
                identifier = _once(identifier, _identifier_text(child, cls.TAG), "Identifier", cls.TAG)
            else:
                pending.append((local, child))
        identifier = _require(identifier, "Identifier", cls.TAG)

        def invalid(why: str) -> InvalidAcknowledgement:
            return InvalidAcknowledgement(
                identifier, f"invalid SequenceAcknowledgement for {identifier!r}: {why}",
                version=version, detail=[copy.deepcopy(element)])

        def number(text: str | None, what: str) -> int:
            try:
                return parse_message_number(text or "", identifier, field=what, version=version)
            except (InvalidMessageNumber, MessageNumberRollover) as exc:
                raise invalid(exc.reason) from None

        for local, child in pending:
            if local == "AcknowledgementRange":
                upper = number(child.get("Upper"), "Upper")
                lower = number(child.get("Lower"), "Lower")
                if lower > upper:
                    raise invalid(f"range Lower {lower} > Upper {upper}")
                ranges.append((lower, upper))
            elif local == "Nack":
                nacks.append(number(text_of(child), "Nack"))
            elif local == "None" and version.is_11:
                none = True
            elif local == "Final" and version.is_11:
                final = True
        if sum(map(bool, (ranges, nacks, none))) != 1:
            raise invalid("needs exactly one of AcknowledgementRange elements, Nack elements or None")
        if final and nacks:
            raise invalid("Final cannot accompany Nack")
        return cls(identifier, ranges, nacks, final), version


@dataclass
class AckRequested:
    """Asks the destination for an acknowledgement now.

    ``message_number`` is 1.0's optional highest number sent, written as
    ``MaxMessageNumberUsed`` (the 2005/02 schema's name); ``MessageNumber``
    is read too.
    """

    TAG: ClassVar[str] = "AckRequested"

    identifier: str
    message_number: int | None = None

    def to_xml(self, version: RMVersion, soap: SoapVersion | None = None) -> etree._Element:
        _check_identifier(self.identifier)
        element = _new(version, self.TAG, {"soap": soap.ns} if soap else None)
        if soap is not None:
            element.set(soap.qname("mustUnderstand").text, soap.must_understand_true)
        _sub(element, version, "Identifier", self.identifier)
        if self.message_number is not None:
            if version.is_11:
                raise ValueError("WS-RM 1.1 AckRequested carries no message number")
            _check_number(self.message_number, "MaxMessageNumberUsed")
            _sub(element, version, "MaxMessageNumberUsed", str(self.message_number))
        return element

    @classmethod
    def from_xml(cls, element: etree._Element) -> tuple[AckRequested, RMVersion]:
        version = _version_of(element, cls.TAG)
        identifier = number_text = None
        for local, child in _own_children(element, version):
            if local == "Identifier":
                identifier = _once(identifier, _identifier_text(child, cls.TAG), "Identifier", cls.TAG)
            elif local in ("MaxMessageNumberUsed", "MessageNumber") and not version.is_11:
                number_text = _once(number_text, text_of(child), "MaxMessageNumberUsed", cls.TAG)
        identifier = _require(identifier, "Identifier", cls.TAG)
        number = None
        if number_text is not None:
            number = parse_message_number(number_text, identifier, field="MaxMessageNumberUsed",
                                          version=version)
        return cls(identifier, number), version


# -- closing and terminating -----------------------------------------------------------

class _IdentifiedBody:
    """Bodies made of an Identifier and, for some, a 1.1 LastMsgNumber."""

    TAG: ClassVar[str]
    ONLY_11: ClassVar[bool] = False
    HAS_LAST: ClassVar[bool] = False

    identifier: str

    def _last(self) -> int | None:
        return getattr(self, "last_msg_number", None)

    def to_xml(self, version: RMVersion) -> etree._Element:
        if self.ONLY_11:
            _check_11(version, self.TAG)
        _check_identifier(self.identifier)
        element = _new(version, self.TAG)
        _sub(element, version, "Identifier", self.identifier)
        last = self._last()
        if last is not None:
            _check_11(version, f"{self.TAG}/LastMsgNumber")
            _check_number(last, "LastMsgNumber")
            _sub(element, version, "LastMsgNumber", str(last))
        return element

    @classmethod
    def from_xml(cls, element: etree._Element):
        version = _version_of(element, cls.TAG)
        if cls.ONLY_11 and not version.is_11:
            raise MalformedMessageError(f"WS-RM {version.name} has no {cls.TAG}")
        identifier = last_text = None
        for local, child in _own_children(element, version):
            if local == "Identifier":
                identifier = _once(identifier, _identifier_text(child, cls.TAG), "Identifier", cls.TAG)
            elif local == "LastMsgNumber" and cls.HAS_LAST and version.is_11:
                last_text = _once(last_text, text_of(child), "LastMsgNumber", cls.TAG)
        identifier = _require(identifier, "Identifier", cls.TAG)
        make: Callable[..., _IdentifiedBody] = cls  # each subclass is a dataclass with its own fields
        if not cls.HAS_LAST:
            return make(identifier), version
        last = None
        if last_text is not None:
            last = parse_message_number(last_text, identifier, field="LastMsgNumber", version=version)
        return make(identifier, last), version


@dataclass
class CloseSequence(_IdentifiedBody):
    """WS-RM 1.1: no more messages will be accepted; ``last_msg_number`` is the last sent."""

    TAG: ClassVar[str] = "CloseSequence"
    ONLY_11: ClassVar[bool] = True
    HAS_LAST: ClassVar[bool] = True

    identifier: str
    last_msg_number: int | None = None


@dataclass
class CloseSequenceResponse(_IdentifiedBody):
    TAG: ClassVar[str] = "CloseSequenceResponse"
    ONLY_11: ClassVar[bool] = True

    identifier: str


@dataclass
class TerminateSequence(_IdentifiedBody):
    """Ends the sequence; ``last_msg_number`` exists in 1.1 only."""

    TAG: ClassVar[str] = "TerminateSequence"
    HAS_LAST: ClassVar[bool] = True

    identifier: str
    last_msg_number: int | None = None


@dataclass
class TerminateSequenceResponse(_IdentifiedBody):
    TAG: ClassVar[str] = "TerminateSequenceResponse"
    ONLY_11: ClassVar[bool] = True

    identifier: str


# -- dispatch ---------------------------------------------------------------------

_TYPES = {cls.TAG: cls for cls in (
    CreateSequence, CreateSequenceResponse, SequenceHeader, SequenceAcknowledgement,
    AckRequested, CloseSequence, CloseSequenceResponse, TerminateSequence,
    TerminateSequenceResponse)}

#: "{namespace}local" -> the class of every element a version defines: a received message's
#: headers and body are each looked up once (most are not WS-RM's: WS-A's, the application's)
_BY_TAG: dict[str, type] = {f"{{{version.ns}}}{local}": cls
                            for version in RM_VERSIONS for local, cls in _TYPES.items()
                            if version.is_11 or not getattr(cls, "ONLY_11", False)}


def parse_rm_element(element: etree._Element) -> tuple[object, RMVersion] | None:
    """Parse any WS-RM protocol element; None if ``element`` is not one.

    Faults in a well-recognised element are raised (they name the fault to
    send); an element this version doesn't define is "not one" (None).
    """
    cls = _BY_TAG.get(element.tag)  # a comment's tag is a function: not found
    if cls is None:
        return None
    return cls.from_xml(element)  # type: ignore[attr-defined]

