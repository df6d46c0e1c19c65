"""Parse untrusted XML safely, and read elements without tripping on what peers send.

A SOAP message never needs a DTD (SOAP 1.2 forbids one), so any DOCTYPE is
refused outright, and *before* libxml2 reads it: a check after the parse would
come after libxml2 had processed the internal subset (entity declarations,
parameter entities), which is where billion-laughs and XXE tricks live, and
would depend on libxml2's own limits being right.  The prolog is scanned with
expat, stopping at the root start tag; expat reports the DOCTYPE before reading
any declaration in it.  Only then does lxml parse the document, with entity
resolution, DTD loading and network access all off (a second line of defence),
and the result is checked once more for a DTD.  Oversized input is refused
before either parser sees it.

SOAP restricts encodings to UTF-8 and UTF-16 (WS-I BP R1012); expat accepts
those (and ASCII/Latin-1), and a prolog it can't read is refused as malformed
rather than handed to a parser with wider tastes.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from xml.parsers import expat
from typing import NoReturn

from lxml import etree

from .faults import MalformedMessageError, MessageTooLargeError, UnsafeXMLError

__all__ = [
    "DEFAULT_MAX_SIZE", "parse_xml", "children", "text_of", "resolve_qname", "split_tag",
]

#: Default limit on a message's size in bytes (4 MiB); callers pass their own.
DEFAULT_MAX_SIZE = 4 * 1024 * 1024

_local = threading.local()


def _parser() -> etree.XMLParser:
    # lxml parsers keep per-parse state; one per thread is the documented safe use.
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = etree.XMLParser(
            resolve_entities=False, no_network=True, load_dtd=False, dtd_validation=False,
            huge_tree=False, remove_comments=True, remove_pis=True, collect_ids=False,
            attribute_defaults=False,
        )
        _local.parser = parser
    return parser


class _Doctype(Exception):
    pass


class _RootReached(Exception):
    pass


#: the encoding a document's XML declaration names
_DECLARED_ENCODING = re.compile(rb"""encoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")
#: encodings in which every byte below 0x80 is the ASCII character
_ASCII_BASED = frozenset((b"utf-8", b"utf8", b"us-ascii", b"ascii"))
#: the root element's start tag, after nothing but whitespace
_ROOT_NEXT = re.compile(rb"[ \t\r\n]*<[A-Za-z_]")


def _cannot_hold_doctype(data: bytes) -> bool:
    """True when the bytes alone prove ``data`` has no DOCTYPE: its root element comes first.

    A DOCTYPE can only stand before the root element.  In the common SOAP
    message (UTF-8, at most an XML declaration that names no other encoding,
    then the root's start tag) nothing stands there, and in an ASCII-based
    encoding those bytes cannot be anything else; the expat scan of
    :func:`_refuse_doctype` would find nothing, at a cost (a parser made and
    run) that was a fifth of the whole parse of a short message.  Anything
    else (UTF-16, another declared encoding, a comment or processing
    instruction before the root) is scanned as before.
    """
    pos = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    if data.startswith(b"<?xml", pos):
        end = data.find(b"?>", pos)
        if end < 0:
            return False
        declared = _DECLARED_ENCODING.search(data, pos, end)
        if declared is not None and declared.group(1).lower() not in _ASCII_BASED:
            return False
        pos = end + 2
    return _ROOT_NEXT.match(data, pos) is not None


def _refuse_doctype(data: bytes) -> None:
    """Read the prolog with expat and refuse a DOCTYPE before anything expands it."""
    scanner = expat.ParserCreate()

    def on_doctype(*_args: object) -> NoReturn:
        raise _Doctype

    def on_root(*_args: object) -> NoReturn:
        raise _RootReached

    scanner.StartDoctypeDeclHandler = on_doctype
    scanner.StartElementHandler = on_root
    # Belt and braces: none of these should fire before the root, but if one
    # does it is DTD machinery.
    scanner.EntityDeclHandler = on_doctype
    scanner.ExternalEntityRefHandler = on_doctype
    try:
        scanner.Parse(data, True)
    except _Doctype:
        raise UnsafeXMLError(
            "DOCTYPE declarations are not allowed in SOAP messages "
            "(refused before parsing; no entity was expanded or fetched)") from None
    except _RootReached:
        return
    except expat.ExpatError as exc:
        raise MalformedMessageError(f"malformed XML: {exc}") from None
    except (ValueError, LookupError) as exc:  # odd encodings declared in the prolog
        raise MalformedMessageError(f"malformed XML: {exc}") from None
    raise MalformedMessageError("malformed XML: no root element")


def parse_xml(data: bytes, max_size: int = DEFAULT_MAX_SIZE) -> etree._Element:
    """Parse ``data`` (bytes, as received) into its root element.

    Raises MessageTooLargeError if ``len(data) > max_size`` (before parsing),
    UnsafeXMLError for any DOCTYPE, MalformedMessageError for anything that
    isn't a well-formed UTF-8/UTF-16 XML document.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"parse_xml wants the received bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_size:
        raise MessageTooLargeError(len(data), max_size)
    if not _cannot_hold_doctype(data):
        _refuse_doctype(data)
    try:
        root = etree.fromstring(data, _parser())
    except etree.XMLSyntaxError as exc:
        raise MalformedMessageError(f"malformed XML: {exc}") from None
    except (ValueError, LookupError) as exc:
        raise MalformedMessageError(f"malformed XML: {exc}") from None
    docinfo = root.getroottree().docinfo
    if docinfo.doctype or docinfo.internalDTD is not None:  # type: ignore[union-attr]  # lxml-stubs lack DocInfo.doctype
        raise UnsafeXMLError("DOCTYPE declarations are not allowed in SOAP messages")
    return root


# -- reading helpers --------------------------------------------------------------

def children(element: etree._Element) -> Iterator[etree._Element]:
    """Element children only: comments and PIs (from trees we didn't parse) are skipped.

    lxml's own filter (in C), not a generator: the envelope readers walk
    some forty children per message."""
    return element.iterchildren(etree.Element)


def split_tag(tag: str) -> tuple[str | None, str]:
    """An element's tag as (namespace or None, local name): what ``etree.QName(element)`` says,
    read from the tag's text (the readers of every header of every message ask, and a QName
    object costs several times this)."""
    if tag[:1] != "{":
        return None, tag
    namespace, _, local = tag[1:].partition("}")
    return namespace, local


def text_of(element: etree._Element) -> str:
    """The element's text with XML Schema whitespace collapsed at the ends."""
    return (element.text or "").strip()


def resolve_qname(context: etree._Element, text: str | None) -> etree.QName | None:
    """Resolve QName-valued content (``wsrm:UnknownSequence``) against ``context``'s scope.

    Returns None when the text is not a usable QName (unbound prefix, bad
    name), so callers decide how strict to be.  An unprefixed name takes the
    default namespace, as XML Schema's QName does.
    """
    text = (text or "").strip()
    if not text:
        return None
    prefix, _, local = text.rpartition(":")
    if prefix:
        namespace = context.nsmap.get(prefix)
        if namespace is None:
            return None
    else:
        namespace = context.nsmap.get(None)
    try:
        return etree.QName(namespace or None, local)
    except ValueError:
        return None
