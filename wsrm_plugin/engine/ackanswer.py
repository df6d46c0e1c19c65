"""The HTTP answer that only acknowledges, written as bytes from pieces made once.

Almost every application message a service receives is answered with an envelope carrying its
WS-A headers (To anonymous, the SequenceAcknowledgement action, a new MessageID) and the
sequence's SequenceAcknowledgement, nothing else.  Built as an lxml tree (a copy of a made
envelope, the acknowledgement's elements, then serialized) that answer cost the service's
one Python thread about 150 us a message on this machine under load, a tenth of a receive:
lxml makes each element with its namespace map, then walks the tree again to write it.

Here the bytes come from pieces cut once, per SOAP version, WS-A version, action and WS-RM
version, out of what that very tree path writes for marked values (:func:`_pieces`): the
answer is those pieces joined around the MessageID, the identifier and the ranges.  So the
bytes are the tree path's, byte for byte (``tests/engine/test_ackanswer.py`` compares them),
and anything the pieces do not cover -- Nacks, 1.1's None or Final, an identifier with a
character XML escapes or refuses -- goes the tree path (:func:`acknowledgement_bytes` returns
None).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from ..wire import SequenceAcknowledgement
from ..wire.addressing import AddressingHeaders, AddressingVersion
from ..wire.namespaces import RMVersion
from ..wire.rm import MAX_IDENTIFIER_LENGTH, MAX_MESSAGE_NUMBER
from ..wire.soap import SoapVersion, build_envelope, to_bytes

__all__ = ["acknowledgement_bytes", "read_acknowledgement_bytes"]

#: Identifiers written as they are: no character XML escapes in text (``& < >``, ``\r`` as
#: ``&#13;``) or refuses (other C0 controls, surrogates, U+FFFE/U+FFFF), none that is blank.
_PLAIN_IDENTIFIER = re.compile(
    "[^&<>\x00-\x20\x7f\ud800-\udfff\ufffe\uffff][^&<>\x00-\x1f\x7f\ud800-\udfff\ufffe\uffff]*")

# marks no real value takes (identifiers are URIs or opaque tokens; numbers are below 2**63)
_MESSAGE_ID = "urn:uuid:00000000-0000-4000-8000-00000000a11d"
_IDENTIFIER = "urn:mark:identifier-5d0c"
_UPPER, _LOWER = 9_100_000_000_000_000_003, 9_100_000_000_000_000_001


class _Pieces(NamedTuple):
    """The text between the values (joined as text, encoded once: UTF-8, as the tree path writes)."""

    head: str  # the envelope up to the MessageID's text
    headers: str  # from there to the first acknowledgement
    tail: str  # after the last acknowledgement
    block: str  # an acknowledgement up to its Identifier's text
    ranges: str  # from there to the first range's Upper value
    lower: str  # between a range's Upper and Lower values
    between: str  # from a range's Lower to the next range's Upper
    end: str  # from the last range's Lower to the block's end


_PIECES: dict[tuple[str, str, str, str], _Pieces] = {}


def _pieces(soap: SoapVersion, wsa: AddressingVersion, action: str, version: RMVersion) -> _Pieces:
    """The pieces of the tree path's answer, cut out of its bytes for marked values: the
    envelope of ``inbound._acknowledgement_envelope`` and ``SequenceAcknowledgement.to_xml``,
    with two ranges (so the bytes between ranges are known too)."""
    addressing = AddressingHeaders(to=wsa.anonymous, action=action, message_id=_MESSAGE_ID, version=wsa)
    marked = SequenceAcknowledgement(_IDENTIFIER, [(_LOWER, _UPPER), (_LOWER + 1, _UPPER + 1)])
    written = to_bytes(build_envelope(soap, [*addressing.to_elements(wsa, soap=soap), marked.to_xml(version, soap)]))
    text = written.decode("utf-8")
    head, rest = text.split(_MESSAGE_ID, 1)
    headers_and_block, rest = rest.split(_IDENTIFIER, 1)
    ranges, rest = rest.split(str(_UPPER), 1)
    lower, rest = rest.split(str(_LOWER), 1)
    between, rest = rest.split(str(_UPPER + 1), 1)
    second_lower, rest = rest.split(str(_LOWER + 1), 1)
    if second_lower != lower:
        raise AssertionError("a range's text depends on its place")
    block_at = headers_and_block.rindex("<", 0, headers_and_block.index(version.ns))
    end_at = rest.index("</", rest.index("/>") + 2)  # the block's closing tag: after the last range
    end_at = rest.index(">", end_at) + 1
    return _Pieces(head, headers_and_block[:block_at], rest[end_at:], headers_and_block[block_at:],
                   ranges, lower, between, rest[:end_at])


def acknowledgement_bytes(soap: SoapVersion, wsa: AddressingVersion, action: str, message_id: str,
                          acks: Sequence[tuple[SequenceAcknowledgement, RMVersion]]) -> bytes | None:
    """The envelope answering with ``acks`` alone (``message_id`` its MessageID), as the tree
    path writes it; None when one of them is not a plain list of ranges (see the module)."""
    parts: list[str] = []
    pieces = None
    for ack, version in acks:
        identifier, ranges = ack.identifier, ack.ranges
        if ack.nacks or ack.final or not ranges or type(identifier) is not str \
                or _PLAIN_IDENTIFIER.fullmatch(identifier) is None or not identifier.strip():
            return None
        key = (soap.ns, wsa.ns, action, version.ns)
        pieces = _PIECES.get(key)
        if pieces is None:
            pieces = _PIECES[key] = _pieces(soap, wsa, action, version)
        parts += (pieces.block, identifier)
        separator, lower_piece = pieces.ranges, pieces.lower
        for lower, upper in ranges:
            if not (type(lower) is int and type(upper) is int and 1 <= lower <= upper <= MAX_MESSAGE_NUMBER):
                return None  # the tree path says what is wrong with it
            parts.append(f"{separator}{upper}{lower_piece}{lower}")
            separator = pieces.between
        parts.append(pieces.end)
    if pieces is None:
        return None
    return f"{pieces.head}{message_id}{pieces.headers}{''.join(parts)}{pieces.tail}".encode()


# -- reading such an answer (the sender's side) -------------------------------------------------

#: (head, pattern of the rest, the WS-RM version), for every SOAP, WS-A and WS-RM version, the
#: action the one a service answers with (:func:`read_acknowledgement_bytes`); made at first use
_READERS: list[tuple[bytes, re.Pattern[str], re.Pattern[str], re.Pattern[str], RMVersion]] = []
_NUMBER = "[1-9][0-9]{0,18}"


def _readers() -> list[tuple[bytes, re.Pattern[str], re.Pattern[str], re.Pattern[str], RMVersion]]:
    if not _READERS:
        from ..wire.namespaces import ADDRESSING_VERSIONS, RM_VERSIONS, SOAP_VERSIONS
        made = []
        for soap in SOAP_VERSIONS:
            for wsa in ADDRESSING_VERSIONS:
                for version in RM_VERSIONS:
                    p = _pieces(soap, wsa, version.sequence_acknowledgement_action, version)
                    ack_range = f"({_NUMBER}){re.escape(p.lower)}({_NUMBER})"
                    ranges = f"{re.escape(p.ranges)}{ack_range}(?:{re.escape(p.between)}{ack_range})*{re.escape(p.end)}"
                    block = f"{re.escape(p.block)}([^<&]+?)({ranges})"
                    whole = re.compile(f"([^<&]+){re.escape(p.headers)}((?:{block})+){re.escape(p.tail)}",
                                       re.ASCII | re.DOTALL)
                    made.append((p.head.encode(), whole, re.compile(block, re.ASCII | re.DOTALL),
                                 re.compile(ack_range, re.ASCII), version))
        _READERS[:] = made
    return _READERS


def read_acknowledgement_bytes(data: bytes) -> list[tuple[SequenceAcknowledgement, RMVersion]] | None:
    """The acknowledgements of an answer written as :func:`acknowledgement_bytes` writes it
    (a service of this package answering a message with them alone), without an XML parse;
    None for anything else, which the caller reads whole: another shape or peer, a fault, a
    reply, an identifier or number the full reading would refuse or read otherwise."""
    reader = next((r for r in _readers() if data.startswith(r[0])), None)
    if reader is None:
        return None  # (a reply, a fault: not decoded here, however large)
    head, whole, block, ack_range, version = reader
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    match = whole.fullmatch(text, len(head))
    if match is None:
        return None
    acks: list[tuple[SequenceAcknowledgement, RMVersion]] = []
    for one in block.finditer(match.group(2)):
        identifier = one.group(1)
        if identifier != identifier.strip() or len(identifier) > MAX_IDENTIFIER_LENGTH \
                or _PLAIN_IDENTIFIER.fullmatch(identifier) is None:
            return None
        ranges = []
        for upper_text, lower_text in ack_range.findall(one.group(2)):
            lower, upper = int(lower_text), int(upper_text)
            if not lower <= upper <= MAX_MESSAGE_NUMBER:
                return None  # the full reading says what is wrong with it
            ranges.append((lower, upper))
        acks.append((SequenceAcknowledgement(identifier, ranges), version))
    return acks
