"""Safety of the XML parser: DTDs, entities, network, size, malformed input."""

from __future__ import annotations

import socket

import pytest
from lxml import etree

from wsrm_plugin.wire import (
    MalformedMessageError, MessageTooLargeError, UnsafeXMLError, parse_envelope, parse_xml,
)
from wsrm_plugin.wire import xmlsafe

ENVELOPE = (b'<soap:Envelope xmlns:soap="http://www.w3.org/2003/05/soap-envelope">'
            b'<soap:Body><x>%s</x></soap:Body></soap:Envelope>')

BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<soap:Envelope xmlns:soap="http://www.w3.org/2003/05/soap-envelope">
 <soap:Body><x a="&lol9;">&lol9;</x></soap:Body>
</soap:Envelope>"""


@pytest.fixture
def lxml_must_not_parse(monkeypatch):
    """Fail if the document reaches lxml: proof that it was refused before any expansion."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the document reached lxml; it should have been refused before")
    monkeypatch.setattr(xmlsafe.etree, "fromstring", refuse)


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("TOP-SECRET-42")
    return path


@pytest.fixture
def listener():
    """A loopback TCP socket that records whether anybody connected."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)

    def connections() -> int:
        count = 0
        while True:
            try:
                conn, _ = server.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    yield server.getsockname()[1], connections
    server.close()


def test_billion_laughs_is_refused_before_parsing(lxml_must_not_parse):
    with pytest.raises(UnsafeXMLError, match="DOCTYPE"):
        parse_xml(BILLION_LAUGHS)


def test_external_entity_file_is_refused_and_not_read(lxml_must_not_parse, secret_file):
    doc = (f'<!DOCTYPE x [<!ENTITY xxe SYSTEM "{secret_file.as_uri()}">]>'.encode()
           + ENVELOPE % b"&xxe;")
    with pytest.raises(UnsafeXMLError) as info:
        parse_envelope(doc)
    assert "TOP-SECRET" not in str(info.value)


def test_external_dtd_and_entities_never_touch_the_network(listener):
    port, connections = listener
    docs = [
        f'<!DOCTYPE x SYSTEM "http://127.0.0.1:{port}/evil.dtd">'.encode() + ENVELOPE % b"",
        f'<!DOCTYPE x [<!ENTITY e SYSTEM "http://127.0.0.1:{port}/e">]>'.encode() + ENVELOPE % b"&e;",
        f'<!DOCTYPE x [<!ENTITY % p SYSTEM "http://127.0.0.1:{port}/p"> %p;]>'.encode() + ENVELOPE % b"",
    ]
    for doc in docs:
        with pytest.raises(UnsafeXMLError):
            parse_xml(doc)
    assert connections() == 0


def test_any_doctype_is_refused_even_a_harmless_one():
    with pytest.raises(UnsafeXMLError):
        parse_xml(b"<!DOCTYPE soap:Envelope>" + ENVELOPE % b"ok")


def test_doctype_in_utf16_is_refused(lxml_must_not_parse):
    doc = ('<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE x [<!ENTITY a "b">]><x>&a;</x>')
    with pytest.raises(UnsafeXMLError):
        parse_xml(doc.encode("utf-16"))


def test_second_line_lxml_parser_does_not_resolve_entities_or_fetch(secret_file, listener):
    """Even if the DOCTYPE gate were bypassed, the parser expands and fetches nothing."""
    port, connections = listener
    doc = (f'<!DOCTYPE x [<!ENTITY xxe SYSTEM "{secret_file.as_uri()}">'
           f'<!ENTITY net SYSTEM "http://127.0.0.1:{port}/n">]><x>&xxe;&net;</x>').encode()
    root = etree.fromstring(doc, xmlsafe._parser())
    assert "TOP-SECRET" not in etree.tostring(root, encoding=str)
    assert connections() == 0


def test_oversized_input_is_refused_before_parsing(lxml_must_not_parse, monkeypatch):
    def no_expat(*_args, **_kwargs):
        raise AssertionError("the prolog scanner ran on an oversized message")
    monkeypatch.setattr(xmlsafe.expat, "ParserCreate", no_expat)
    data = ENVELOPE % (b"a" * 100)
    with pytest.raises(MessageTooLargeError) as info:
        parse_xml(data, max_size=len(data) - 1)
    assert info.value.size == len(data) and info.value.limit == len(data) - 1
    assert info.value.code == "Sender"


def test_input_at_the_limit_is_parsed():
    data = ENVELOPE % b"fits"
    assert parse_xml(data, max_size=len(data)).tag == "{http://www.w3.org/2003/05/soap-envelope}Envelope"


@pytest.mark.parametrize("data, fragment", [
    (b"<a><b></a>", "malformed XML"),
    (b"", "malformed XML"),
    (b"   ", "malformed XML"),
    (b"this is not xml", "malformed XML"),
    (b"<a>&undefined;</a>", "malformed XML"),
    (b"<a></a><b/>", "malformed XML"),
    (b"<?xml version='1.0' encoding='x-no-such-encoding'?><a/>", "malformed XML"),
    (b"\xff\xfe\x00<", "malformed XML"),
])
def test_malformed_xml_is_a_precise_sender_fault(data, fragment):
    with pytest.raises(MalformedMessageError) as info:
        parse_xml(data)
    assert fragment in info.value.reason
    assert info.value.code == "Sender"
    assert not isinstance(info.value, UnsafeXMLError)


def test_lxml_message_is_carried_for_errors_after_the_prolog():
    with pytest.raises(MalformedMessageError) as info:
        parse_xml(b"<a><b></a>")
    assert "line 1" in info.value.reason


def test_comments_and_processing_instructions_are_dropped():
    root = parse_xml(b"<a><!-- c --><?pi x?><b/></a>")
    assert [child.tag for child in root] == ["b"]


def test_text_instead_of_bytes_is_a_programming_error():
    with pytest.raises(TypeError):
        parse_xml("<a/>")  # type: ignore[arg-type]


@pytest.mark.parametrize("prolog", [
    b"", b'<?xml version="1.0"?>', b'<?xml version="1.0" encoding="UTF-8"?>\n',
    b"\xef\xbb\xbf<?xml version='1.0' encoding='utf-8'?>", b"\xef\xbb\xbf", b"  \r\n",
])
def test_a_plain_utf8_document_skips_the_prolog_scan(prolog, monkeypatch):
    """Its root comes first: the bytes prove there is no DOCTYPE, and expat is not run."""
    def no_scan(_data):
        raise AssertionError("the prolog was scanned")
    monkeypatch.setattr(xmlsafe, "_refuse_doctype", no_scan)
    assert etree.QName(parse_xml(prolog + ENVELOPE % b"ok")).localname == "Envelope"


@pytest.mark.parametrize("doc", [
    b'<!-- first --><!DOCTYPE x [<!ENTITY a "b">]>' + ENVELOPE % b"&a;",   # behind a comment
    b'<?xml version="1.0"?>\n<!DOCTYPE x [<!ENTITY a "b">]>' + ENVELOPE % b"&a;",
    b'<?pi x?><!DOCTYPE x [<!ENTITY a "b">]>' + ENVELOPE % b"&a;",        # behind a processing instruction
    b'\n\n<!DOCTYPE x [<!ENTITY a "b">]>' + ENVELOPE % b"&a;",
    b'<?xml version="1.0" encoding="ISO-8859-1"?><!DOCTYPE x [<!ENTITY a "b">]>' + ENVELOPE % b"&a;",
    '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE x [<!ENTITY a "b">]><x>&a;</x>'.encode("utf-16-le"),
    '<!DOCTYPE x [<!ENTITY a "b">]><x>&a;</x>'.encode("utf-16-be"),
])
def test_anything_but_a_plain_utf8_prolog_is_scanned_and_a_doctype_refused_unparsed(doc, lxml_must_not_parse):
    assert not xmlsafe._cannot_hold_doctype(doc)
    with pytest.raises((UnsafeXMLError, MalformedMessageError)):
        parse_xml(doc)


def test_a_declared_encoding_other_than_utf8_is_scanned_even_without_a_doctype():
    doc = b'<?xml version="1.0" encoding="UTF-7"?>' + ENVELOPE % b"ok"
    assert not xmlsafe._cannot_hold_doctype(doc)
    assert xmlsafe._cannot_hold_doctype(doc.replace(b"UTF-7", b"utf-8"))
