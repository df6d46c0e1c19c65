"""Building the envelopes the engine sends, and stamping stored ones at each transmission.

An application message is stored once, with its WS-Addressing headers, when
the application sends it; what changes per attempt (the wsrm:Sequence
header, which needs the identifier the peer hands out later, an
AckRequested, acknowledgements riding along) is added by :func:`stamp` just
before the bytes go out.  Protocol messages (CreateSequence, acks, Close,
Terminate, their responses) are built whole by :func:`protocol_message`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lxml import etree

from ..wire import (
    AddressingHeaders, AddressingVersion, EndpointReference, Envelope, SoapVersion, build_envelope,
    new_message_id, parse_envelope, to_bytes,
)
from ..wire.faults import MessageTooLargeError
from ..wire.namespaces import RM_VERSIONS
from ..wire.rm import RM_HEADER_NAMES
from ..wire.xmlsafe import split_tag
from .parsed import TREES

__all__ = ["OutgoingMessage", "prepare_outgoing", "protocol_message", "stamp", "read_trusted"]

#: Our own stored envelopes were size-checked when they were sent; re-reading them needs no limit
#: beyond a sanity bound.
_TRUSTED_MAX = 1 << 30
_RM_HEADER_TAGS = frozenset(etree.QName(v.ns, name).text for v in RM_VERSIONS for name in RM_HEADER_NAMES)


@dataclass(frozen=True)
class OutgoingMessage:
    """An application envelope ready to be stored: with WS-A headers, and what they say."""

    payload: bytes
    soap: SoapVersion
    action: str
    message_id: str


def read_trusted(data: bytes) -> Envelope:
    """Parse an envelope this engine stored itself (still with the safe parser)."""
    return parse_envelope(data, max_size=_TRUSTED_MAX)


def _header_parent(root: etree._Element, version: SoapVersion) -> etree._Element:
    header = root.find(version.qname("Header").text)
    if header is None:
        header = etree.Element(version.qname("Header"))
        root.insert(0, header)
    return header


def _version_of(root: etree._Element) -> SoapVersion | None:
    """The SOAP version of an envelope's root element, from its tag (None: not an Envelope)."""
    tag = root.tag
    if not isinstance(tag, str):
        return None
    namespace, local = split_tag(tag)
    return SoapVersion.for_namespace(namespace) if local == "Envelope" and namespace else None


def prepare_outgoing(data: bytes | etree._Element, *, to: str, action: str | None, message_id: str | None,
                     reply_to: str | None, relates_to: str | None, wsa: AddressingVersion,
                     max_size: int, extra: Iterable[etree._Element] = (),
                     addressing: AddressingHeaders | None = None) -> OutgoingMessage:
    """Add the WS-Addressing headers the application left out (To, Action, MessageID, ReplyTo).

    ``extra`` header blocks (an observer's trace context) come after them,
    each replacing a block of its name the envelope has already.

    Headers the envelope already has (a zeep WS-A plugin writes its own) are
    kept and their version used; ``action`` is required when the envelope has
    no wsa:Action.

    ``data`` may be the envelope's tree (a SOAP client's, no parse needed):
    it is then changed in place and becomes the stored message's tree, handed
    to the first transmission (:mod:`.parsed`) instead of a parse there.
    ``addressing``: the WS-A headers the tree carries, as whoever wrote them (a
    front end's addressing interceptor) knows them: not read from it again.
    """
    if isinstance(data, etree._Element):
        envelope = Envelope.from_element(data)
        size = None
    else:
        envelope = parse_envelope(data, max_size=max_size)
        size = len(data)
    present = addressing if addressing is not None and size is None else AddressingHeaders.from_header(envelope.headers)
    version = present.version or wsa
    if action is not None and present.action is not None and action != present.action:
        raise ValueError(f"action {action!r} disagrees with the envelope's wsa:Action {present.action!r}")
    chosen_action = present.action or action
    if not chosen_action:
        raise ValueError("an action is needed: pass action= or put a wsa:Action header in the envelope")
    chosen_id = present.message_id or message_id or new_message_id()
    missing = AddressingHeaders(
        to=None if present.to else to,
        action=None if present.action else chosen_action,
        message_id=None if present.message_id else chosen_id,
        relates_to=None if present.relates_to else relates_to,
        reply_to=EndpointReference(reply_to) if reply_to and present.reply_to is None else None,
        version=version,
    )
    header = _header_parent(envelope.root, envelope.version)
    for position, element in enumerate(missing.to_elements(version, soap=envelope.version)):
        header.insert(position, element)
    for element in extra:
        for old in [h for h in header if h.tag == element.tag]:
            header.remove(old)
        header.append(element)
    payload = to_bytes(envelope.root)
    if size is None and len(payload) > max_size:
        raise MessageTooLargeError(len(payload), max_size)
    TREES.remember(payload, envelope.root)
    return OutgoingMessage(payload, envelope.version, chosen_action, chosen_id)


def stamp(payload: bytes, headers: Iterable[etree._Element]) -> bytes:
    """``payload`` with ``headers`` first in its Header, replacing older WS-RM headers."""
    return stamped(payload, headers)[0]


def stamped(payload: bytes, headers: Iterable[etree._Element]) -> tuple[bytes, etree._Element]:
    """:func:`stamp`, and the tree the bytes were serialized from (the caller's now: a front end
    that answers with it need neither parse the bytes nor serialize the tree again).

    A tree filed for ``payload`` (:func:`prepare_outgoing` files the one it wrote) is an
    envelope read whole when it was made: only its version is read here, from its tag, and its
    Header found; the stored bytes are read whole."""
    root = TREES.take(payload)
    version = _version_of(root) if root is not None else None
    if root is None or version is None:
        envelope = read_trusted(payload)
        root, version = envelope.root, envelope.version
    header = _header_parent(root, version)
    for old in [h for h in header if isinstance(h.tag, str) and h.tag in _RM_HEADER_TAGS]:
        header.remove(old)
    for position, element in enumerate(headers):
        header.insert(position, element)
    return to_bytes(root), root


def protocol_message(soap: SoapVersion, wsa: AddressingVersion, *, to: str, action: str,
                     body: etree._Element | None = None, headers: Iterable[etree._Element] = (),
                     relates_to: str | None = None, reply_to: str | None = None,
                     reference_parameters: Iterable[etree._Element] = (),
                     message_id: str | None = None) -> bytes:
    """A whole protocol message: WS-A headers, then ``headers``, then ``body``.

    ``message_id`` is for retransmissions that must stay recognisable as the
    same message; by default every message gets a fresh one.
    """
    addressing = AddressingHeaders(
        to=to, action=action, message_id=message_id or new_message_id(), relates_to=relates_to,
        reply_to=EndpointReference(reply_to) if reply_to else None,
        reference_parameters=list(reference_parameters), version=wsa,
    )
    blocks = [*addressing.to_elements(wsa, soap=soap), *headers]
    return to_bytes(build_envelope(soap, blocks, body))
