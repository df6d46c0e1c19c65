"""Building the envelopes the engine sends, and stamping stored ones at each transmission.

An application message is stored once, with its WS-Addressing headers, when
the application sends it; what changes per attempt (the wsrm:Sequence
header, which needs the identifier the peer hands out later, an
AckRequested, acknowledgements riding along) is added by :func:`stamp` just
before the bytes go out.  Protocol messages (CreateSequence, acks, Close,
Terminate, their responses) are built whole by :func:`protocol_message`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from lxml import etree

from ..wire import (
    AddressingHeaders, AddressingVersion, EndpointReference, Envelope, SoapVersion, build_envelope,
    RMVersion, SequenceHeader, new_message_id, parse_envelope, to_bytes,
)
from ..wire.faults import MessageTooLargeError
from ..wire.namespaces import RM_VERSIONS
from ..wire.rm import MAX_MESSAGE_NUMBER, RM_HEADER_NAMES
from ..wire.xmlsafe import split_tag
from .parsed import TREES

__all__ = ["OutgoingMessage", "prepare_outgoing", "protocol_message", "stamp", "stamp_sequence", "read_trusted"]

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
                     addressing: AddressingHeaders | None = None, remember: bool = True) -> OutgoingMessage:
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
    ``remember=False``: the message goes to the sending lanes, whose :func:`stamp` writes into
    the bytes (the tree is not kept for them).
    """
    if isinstance(data, etree._Element):
        if not remember and not extra and relates_to is None and action:
            written = _written_with_headers(data, to, action, message_id or new_message_id(), reply_to, wsa)
            if written is not None:
                if len(written.payload) > max_size:
                    raise MessageTooLargeError(len(written.payload), max_size)
                return written
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
    if remember:
        TREES.remember(payload, envelope.root)
    return OutgoingMessage(payload, envelope.version, chosen_action, chosen_id)


#: Values written as they are in text: none that XML escapes or refuses (see ackanswer's identifiers)
_PLAIN_TEXT = re.compile("[^&<>\x00-\x1f\x7f\ud800-\udfff\ufffe\uffff]+")
# marks no real value takes, to cut the WS-A headers' pieces out of the tree path's bytes
_MARKS = ("urn:mark:to-5d0c", "urn:mark:action-5d0c", "urn:mark:message-id-5d0c", "urn:mark:reply-to-5d0c")
#: (SOAP prefix, SOAP namespace, WS-A namespace, with ReplyTo) -> the Header's text around the values
_HEADER_PIECES: dict[tuple[str, str, str, bool], tuple[str, ...]] = {}


def _written_with_headers(root: etree._Element, to: str, action: str, message_id: str, reply_to: str | None,
                          wsa: AddressingVersion) -> OutgoingMessage | None:
    """:func:`prepare_outgoing`'s message for an envelope without a Header (what a SOAP client
    such as zeep builds for a call without headers): its bytes, with the Header the tree path
    would add written from pieces (cut once from what that path writes, per SOAP prefix and
    version, WS-A version and ReplyTo or not) into them; None for any other envelope, or a
    value XML would escape or refuse, which the tree path writes."""
    nsmap = root.nsmap
    if len(nsmap) != 1 or root.attrib or len(root) == 0:
        return None
    (prefix, namespace), = nsmap.items()
    if prefix is None or root.tag != f"{{{namespace}}}Envelope":
        return None
    soap = SoapVersion.for_namespace(namespace)
    if soap is None or root.find(soap.qname("Header").text) is not None:
        return None
    values = (to, action, message_id) if reply_to is None else (to, action, message_id, reply_to)
    for value in values:
        if type(value) is not str or _PLAIN_TEXT.fullmatch(value) is None:
            return None
    key = (prefix, namespace, wsa.ns, reply_to is not None)
    pieces = _HEADER_PIECES.get(key)
    if pieces is None:
        pieces = _HEADER_PIECES[key] = _header_pieces(prefix, soap, wsa, reply_to is not None)
    payload = to_bytes(root)
    opening = _DECLARATION + f'<{prefix}:Envelope xmlns:{prefix}="{namespace}">'.encode()
    if not payload.startswith(opening):
        return None
    parts = [pieces[0]]
    for value, piece in zip(values, pieces[1:], strict=True):
        parts += (value, piece)
    at = len(opening)
    payload = _inserted(payload, at, "".join(parts).encode())
    return OutgoingMessage(payload, soap, action, message_id)


def _header_pieces(prefix: str, soap: SoapVersion, wsa: AddressingVersion, with_reply_to: bool
                   ) -> tuple[str, ...]:
    """The Header the tree path writes into an envelope without one, cut at the marked values."""
    root = etree.fromstring(f'<{prefix}:Envelope xmlns:{prefix}="{soap.ns}"><{prefix}:Body/></{prefix}:Envelope>')
    to, action, message_id, reply_to = _MARKS
    written = prepare_outgoing(root, to=to, action=action, message_id=message_id,
                               reply_to=reply_to if with_reply_to else None, relates_to=None, wsa=wsa,
                               max_size=_TRUSTED_MAX).payload.decode()
    opening = f"{_DECLARATION.decode()}<{prefix}:Envelope xmlns:{prefix}=\"{soap.ns}\">"
    closing = f"</{prefix}:Header>"
    header = written[len(opening):written.index(closing) + len(closing)]
    pieces = []
    for mark in _MARKS if with_reply_to else _MARKS[:3]:
        before, header = header.split(mark)
        pieces.append(before)
    return (*pieces, header)


def stamp(payload: bytes, headers: Iterable[etree._Element]) -> bytes:
    """``payload`` with ``headers`` first in its Header, replacing older WS-RM headers.

    An envelope as :func:`prepare_outgoing` writes one (every application message a client
    sends) gets the headers' bytes put into its own, after its Header's start tag: the bytes
    the tree path writes (:func:`_spliced`), without parsing and writing the whole envelope
    at each transmission."""
    headers = list(headers)
    spliced = _spliced(payload, headers)
    if spliced is not None:
        return spliced
    return stamped(payload, headers)[0]


def stamp_sequence(payload: bytes, version: RMVersion, soap: SoapVersion, sequence: SequenceHeader,
                   headers: list[etree._Element]) -> bytes:
    """:func:`stamp` with ``sequence`` (its block written with ``version`` and ``soap``) first,
    then ``headers``: the Sequence header of every transmission written from pieces (cut once
    from what the tree path writes, per envelope prefix and namespace, WS-RM and SOAP version
    and LastMessage or not) where the bytes can take it, not made as elements first."""
    start = _header_start(payload)
    identifier, number = sequence.identifier, sequence.message_number
    if start is not None and type(number) is int and 1 <= number <= MAX_MESSAGE_NUMBER \
            and type(identifier) is str and identifier.strip() and _PLAIN_TEXT.fullmatch(identifier):
        prefix, namespace, at = start
        key = (prefix, namespace, version.ns, soap.ns, sequence.last_message)
        pieces = _SEQUENCE_PIECES.get(key)
        if pieces is None:
            pieces = _SEQUENCE_PIECES[key] = _sequence_pieces(prefix, namespace, version, soap,
                                                              sequence.last_message)
        more = _headers_bytes(prefix, namespace, headers) if headers else b""
        if more is not None:
            written = f"{pieces[0]}{identifier}{pieces[1]}{number}{pieces[2]}".encode()
            return _inserted(payload, at, written, more)
    return stamp(payload, [sequence.to_xml(version, soap), *headers])


#: (SOAP prefix, its namespace, WS-RM namespace, SOAP namespace of the block, LastMessage) -> the
#: Sequence block's text around its identifier and number
_SEQUENCE_PIECES: dict[tuple[bytes, bytes, str, str, bool], tuple[str, str, str]] = {}
_MARK_NUMBER = 9_100_000_000_000_000_001


def _sequence_pieces(prefix: bytes, namespace: bytes, version: RMVersion, soap: SoapVersion,
                     last: bool) -> tuple[str, str, str]:
    envelope = b"".join((_DECLARATION, b"<", prefix, b":Envelope xmlns:", prefix, b'="', namespace, b'"><',
                         prefix, b":Header></", prefix, b":Header><", prefix, b":Body></", prefix,
                         b":Body></", prefix, b":Envelope>"))
    marked = SequenceHeader(_MARKS[0], _MARK_NUMBER, last).to_xml(version, soap)
    written = stamped(envelope, [marked])[0].decode()
    opening, closing = f"<{prefix.decode()}:Header>", f"</{prefix.decode()}:Header>"
    block = written[written.index(opening) + len(opening):written.index(closing)]
    before, rest = block.split(_MARKS[0])
    between, after = rest.split(str(_MARK_NUMBER))
    return before, between, after


_DECLARATION = b"<?xml version='1.0' encoding='utf-8'?>\n"
#: The start of an envelope :func:`to_bytes` wrote whose Header has no namespace of its own:
#: the SOAP prefix the only one declared where the headers go
_ENVELOPE_START = re.compile(rb'<([A-Za-z_][A-Za-z0-9_.-]*):Envelope xmlns:\1="([^"<>&]+)"><\1:Header>')
#: (SOAP prefix, SOAP namespace) -> an envelope with an empty Header, to write headers in
_SPLICE_ENVELOPES: dict[tuple[bytes, bytes], etree._Element] = {}
_RM_NAMESPACES = tuple(v.ns.encode() for v in RM_VERSIONS)


def _spliced(payload: bytes, headers: list[etree._Element]) -> bytes | None:
    """:func:`stamped`'s bytes, written into ``payload`` without parsing it; None unless the
    envelope's Header is its root's first child, its start tag plain, the SOAP namespace the
    only one declared above it (so the headers are written as the tree path writes them in
    that place) and no WS-RM header in it to replace (nor a comment, a CDATA section or a
    processing instruction, which could hide one)."""
    start = _header_start(payload)
    if start is None:
        return None
    prefix, namespace, at = start
    written = _headers_bytes(prefix, namespace, headers)
    if written is None:
        return None
    return _inserted(payload, at, written)


def _inserted(payload: bytes, at: int, *parts: bytes) -> bytes:
    """``payload`` with ``parts`` at ``at``: one copy of it (no slice copied first: a large message)."""
    whole = memoryview(payload)
    return b"".join((whole[:at], *parts, whole[at:]))


def _header_start(payload: bytes) -> tuple[bytes, bytes, int] | None:
    """The SOAP prefix, its namespace and the place after the Header's start tag, of an
    envelope the headers can be written into as bytes (see :func:`_spliced`)."""
    if type(payload) is not bytes or not payload.startswith(_DECLARATION):
        return None
    start = _ENVELOPE_START.match(payload, len(_DECLARATION))
    if start is None:
        return None
    prefix, at = start.group(1), start.end()
    header_end = payload.find(b"</" + prefix + b":Header>", at)
    if header_end < 0:
        return None
    header = payload[at:header_end]
    if b"<!" in header or b"<?" in header or any(ns in header for ns in _RM_NAMESPACES):
        return None
    return prefix, start.group(2), at


def _headers_bytes(prefix: bytes, namespace: bytes, headers: list[etree._Element]) -> bytes | None:
    """``headers`` as the tree path writes them first in a Header under ``prefix``'s
    declaration alone: written in an envelope of that shape and cut out of it."""
    key = (prefix, namespace)
    made = _SPLICE_ENVELOPES.get(key)
    if made is None:
        text = prefix.decode("ascii")
        made = _SPLICE_ENVELOPES[key] = etree.fromstring(
            f'<{text}:Envelope xmlns:{text}="{namespace.decode()}"><{text}:Header/></{text}:Envelope>')
    root = made.__copy__()  # type: ignore[attr-defined]  # lxml's deep copy (see addressing._copy_of)
    header = root[0]
    for position, element in enumerate(headers):
        header.insert(position, element)
    written = etree.tostring(root, encoding="utf-8")  # (no declaration: utf-8 needs none)
    opening = b"".join((b"<", prefix, b":Envelope xmlns:", prefix, b'="', namespace, b'"><', prefix, b":Header>"))
    closing = b"".join((b"</", prefix, b":Header></", prefix, b":Envelope>"))
    if not (written.startswith(opening) and written.endswith(closing)):
        return None
    return written[len(opening):-len(closing)]


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
