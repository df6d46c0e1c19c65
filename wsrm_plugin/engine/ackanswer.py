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
from ..wire.rm import MAX_MESSAGE_NUMBER
from ..wire.soap import SoapVersion, build_envelope, to_bytes

__all__ = ["acknowledgement_bytes"]

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
