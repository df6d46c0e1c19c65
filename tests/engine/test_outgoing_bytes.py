"""A client's envelope written with its WS-A headers from pieces (``envelopes.prepare_outgoing``
with ``remember=False``), and a stored envelope stamped in its bytes (``envelopes.stamp``): the
bytes the tree path writes (the headers made as elements and inserted, the whole written; at
each transmission a parse of the envelope first), or that path itself where the pieces or the
bytes alone cannot say how the headers are written."""

from __future__ import annotations

import pytest
from lxml import etree

from wsrm_plugin.engine import envelopes
from wsrm_plugin.engine.envelopes import prepare_outgoing, stamp, stamped
from wsrm_plugin.wire.faults import MessageTooLargeError
from wsrm_plugin.wire import AckRequested, SequenceAcknowledgement, SequenceHeader
from wsrm_plugin.wire.namespaces import ADDRESSING_VERSIONS, RM10, RM11, RM_VERSIONS
from wsrm_plugin.wire.soap import SOAP11, SOAP12

BODIES = ['<ns0:record xmlns:ns0="urn:bench"><item>x&amp;y &lt;z&gt;</item><note>é😀 &#13;</note></ns0:record>',
          '<a b="&gt;&quot;"/>', '']


def _outgoing(soap, prefix, body, wsa, reply_to=None) -> bytes:
    source = f'<{prefix}:Envelope xmlns:{prefix}="{soap.ns}"><{prefix}:Body>{body}</{prefix}:Body></{prefix}:Envelope>'
    return prepare_outgoing(etree.fromstring(source), to="http://127.0.0.1:1/svc", action="urn:bench/record",
                            message_id=None, reply_to=reply_to, relates_to=None, wsa=wsa, max_size=1 << 20,
                            remember=False).payload


def _headers(which: int, version, soap):
    made = ([SequenceHeader("urn:uuid:1234", 7)],
            [SequenceHeader("id é", 2**63 - 1), AckRequested("id é")],
            [SequenceHeader("x", 1, last_message=version is RM10),
             SequenceAcknowledgement("y", [(1, 3), (5, 5)])])[which]
    return [h.to_xml(version, soap) for h in made]


@pytest.mark.parametrize("soap", [SOAP11, SOAP12], ids=["soap11", "soap12"])
@pytest.mark.parametrize("prefix", ["soap-env", "S", "SOAP-ENV"])
@pytest.mark.parametrize("body", BODIES, ids=["record", "attributes", "empty"])
@pytest.mark.parametrize("wsa", ADDRESSING_VERSIONS, ids=lambda v: v.name)
@pytest.mark.parametrize("version", RM_VERSIONS, ids=lambda v: v.name)
@pytest.mark.parametrize("which", [0, 1, 2], ids=["sequence", "ack-requested", "acknowledging"])
def test_an_envelope_prepare_outgoing_wrote_is_stamped_in_its_bytes_as_the_tree_path_writes_it(
        soap, prefix, body, wsa, version, which):
    payload = _outgoing(soap, prefix, body, wsa, reply_to="http://me/" if which else None)
    spliced = envelopes._spliced(payload, _headers(which, version, soap))
    assert spliced is not None
    assert spliced == stamped(payload, _headers(which, version, soap))[0]
    assert stamp(payload, _headers(which, version, soap)) == spliced


def _other_shapes():
    payload = _outgoing(SOAP11, "soap-env", BODIES[0], ADDRESSING_VERSIONS[1])
    header = b"<soap-env:Header>"
    yield "stamped before", stamped(payload, _headers(0, RM11, SOAP11))[0]  # a WS-RM header to replace
    yield "a comment", payload.replace(header, header + b"<!-- c -->")
    yield "another namespace", payload.replace(b'xmlns:soap-env="', b'xmlns:x="urn:x" xmlns:soap-env="')
    yield "no declaration", payload.split(b"\n", 1)[1]
    yield "an empty header", payload.split(header)[0] + b"<soap-env:Header/>" + payload.split(b"</soap-env:Header>")[1]
    yield "no header", payload.split(header)[0] + payload.split(b"</soap-env:Header>")[1]
    yield "a header attribute", payload.replace(header, b'<soap-env:Header soap-env:x="1">')


@pytest.mark.parametrize("name, payload", list(_other_shapes()), ids=lambda v: v if isinstance(v, str) else "")
def test_any_other_envelope_is_stamped_by_the_tree_path(name, payload):
    assert envelopes._spliced(payload, _headers(0, RM10, SOAP11)) is None
    stamped_bytes = stamp(payload, _headers(0, RM10, SOAP11))
    assert stamped_bytes == stamped(payload, _headers(0, RM10, SOAP11))[0]
    assert stamped_bytes.count(b"wsrm:Sequence ") == 1  # an older Sequence header was replaced


def _prepared(source: str, remember: bool, **values):
    arguments = dict(to="http://127.0.0.1:1/svc", action="urn:bench/record", message_id="urn:uuid:1",
                     reply_to=None, relates_to=None, wsa=ADDRESSING_VERSIONS[1], max_size=1 << 20)
    arguments.update(values)
    return prepare_outgoing(etree.fromstring(source), **arguments, remember=remember)


@pytest.mark.parametrize("soap", [SOAP11, SOAP12], ids=["soap11", "soap12"])
@pytest.mark.parametrize("prefix", ["soap-env", "S"])
@pytest.mark.parametrize("body", BODIES, ids=["record", "attributes", "empty"])
@pytest.mark.parametrize("wsa", ADDRESSING_VERSIONS, ids=lambda v: v.name)
@pytest.mark.parametrize("reply_to", [None, "http://me:8/é?a=1;b"], ids=["one-way", "reply-to"])
def test_the_headers_written_from_pieces_are_the_tree_paths_bytes(soap, prefix, body, wsa, reply_to):
    source = f'<{prefix}:Envelope xmlns:{prefix}="{soap.ns}"><{prefix}:Body>{body}</{prefix}:Body></{prefix}:Envelope>'
    root = etree.fromstring(source)
    assert envelopes._written_with_headers(root, "http://x/", "urn:a", "urn:uuid:1", reply_to, wsa) is not None
    by_pieces = _prepared(source, False, wsa=wsa, reply_to=reply_to)
    assert by_pieces == _prepared(source, True, wsa=wsa, reply_to=reply_to)  # the tree path
    assert by_pieces.message_id == "urn:uuid:1" and by_pieces.action == "urn:bench/record"


ZEEP = ('<soap-env:Envelope xmlns:soap-env="http://schemas.xmlsoap.org/soap/envelope/"><soap-env:Body>'
        '<ns0:record xmlns:ns0="urn:bench"><item>x</item></ns0:record></soap-env:Body></soap-env:Envelope>')


@pytest.mark.parametrize("source, values", [
    (ZEEP.replace("<soap-env:Body>", "<soap-env:Header><h xmlns='urn:h'/></soap-env:Header><soap-env:Body>"), {}),
    (ZEEP.replace('xmlns:soap-env="', 'xmlns:x="urn:x" xmlns:soap-env="'), {}),
    (ZEEP.replace('<soap-env:Envelope ', '<soap-env:Envelope x="1" '), {}),
    (ZEEP, {"to": "http://x/?a=1&b=2"}),
    (ZEEP, {"action": "urn:a<b>"}),
    (ZEEP, {"message_id": "urn:uuid:1\r"}),
    (ZEEP, {"reply_to": "http://me/&"}),
    (ZEEP, {"relates_to": "urn:uuid:2"}),
], ids=["a-header", "another-namespace", "an-attribute", "to-escaped", "action-escaped", "id-escaped",
        "reply-to-escaped", "relates-to"])
def test_any_other_envelope_or_value_is_written_by_the_tree_path(source, values):
    assert _prepared(source, False, **values) == _prepared(source, True, **values)


def test_a_message_too_large_is_refused_either_way():
    with pytest.raises(MessageTooLargeError):
        _prepared(ZEEP, False, max_size=100)


@pytest.mark.parametrize("soap", [SOAP11, SOAP12], ids=["soap11", "soap12"])
@pytest.mark.parametrize("block_soap", [SOAP11, SOAP12], ids=["block11", "block12"])
@pytest.mark.parametrize("prefix", ["soap-env", "S"])
@pytest.mark.parametrize("version", RM_VERSIONS, ids=lambda v: v.name)
@pytest.mark.parametrize("sequence", [("urn:uuid:1234", 7, False), ("é 中 😀'\"", 2**63 - 1, False),
                                      ("x", 1, True)], ids=["plain", "unicode", "last"])
@pytest.mark.parametrize("more", [0, 1, 2], ids=["alone", "ack-requested", "acknowledging"])
def test_the_sequence_header_written_from_pieces_is_the_tree_paths_bytes(soap, block_soap, prefix, version,
                                                                        sequence, more):
    if sequence[2] and version is RM11:
        sequence = (sequence[0], sequence[1], False)  # WS-RM 1.1 has no LastMessage
    payload = _outgoing(soap, prefix, BODIES[0], ADDRESSING_VERSIONS[0])
    header = SequenceHeader(*sequence)
    others = _headers(more, version, block_soap)[1:] if more else []
    by_pieces = envelopes.stamp_sequence(payload, version, block_soap, header, others)
    assert by_pieces == stamped(payload, [header.to_xml(version, block_soap), *others])[0]
    assert envelopes._header_start(payload) is not None


@pytest.mark.parametrize("name, payload", list(_other_shapes()), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("identifier", ["urn:x", "a&b", "a\rb"])
def test_a_sequence_header_for_any_other_envelope_or_identifier_is_written_by_the_tree_path(name, payload,
                                                                                           identifier):
    header = SequenceHeader(identifier, 3)
    assert envelopes.stamp_sequence(payload, RM10, SOAP11, header, []) == \
        stamped(payload, [header.to_xml(RM10, SOAP11)])[0]


def test_a_number_or_identifier_the_block_refuses_is_refused_as_before():
    payload = _outgoing(SOAP11, "soap-env", BODIES[0], ADDRESSING_VERSIONS[1])
    for header in (SequenceHeader("urn:x", 0), SequenceHeader("urn:x", 2**63), SequenceHeader(" ", 1)):
        with pytest.raises(ValueError):
            envelopes.stamp_sequence(payload, RM10, SOAP11, header, [])
