"""The sender's reading of an answer that only acknowledges (``ackanswer.read_acknowledgement_bytes``):
what the full reading (a parse, ``inbound.read_message``) reads, or None for the full reading to
say what it is."""

from __future__ import annotations

import pytest

from wsrm_plugin.engine import inbound
from wsrm_plugin.engine.ackanswer import acknowledgement_bytes, read_acknowledgement_bytes
from wsrm_plugin.engine.inbound import read_message
from wsrm_plugin.wire import SequenceAcknowledgement, SoapFault, to_bytes
from wsrm_plugin.wire.namespaces import ADDRESSING_VERSIONS, RM10, RM11, RM_VERSIONS
from wsrm_plugin.wire.soap import SOAP11, SOAP12

MESSAGE_ID = "urn:uuid:5e1a0c4e-1111-4222-8333-444455556666"


def _full(data: bytes):
    """The full reading's acknowledgements, or None when it refuses the answer."""
    try:
        message = read_message(data, 1 << 20)
    except SoapFault:
        return None
    assert message.sequence is None and message.fault is None and message.body is None
    return message.acks


def _answer(acks, soap=SOAP11, wsa=ADDRESSING_VERSIONS[1]) -> bytes:
    version = acks[-1][1]
    return acknowledgement_bytes(soap, wsa, version.sequence_acknowledgement_action, MESSAGE_ID, acks)


@pytest.mark.parametrize("soap", [SOAP11, SOAP12], ids=["soap11", "soap12"])
@pytest.mark.parametrize("wsa", ADDRESSING_VERSIONS, ids=lambda v: v.name)
@pytest.mark.parametrize("version", RM_VERSIONS, ids=lambda v: v.name)
@pytest.mark.parametrize("identifier", ["urn:uuid:8c2b", "héllo wörld 中", "a\"b'c", "x" * 1024, "😀"])
@pytest.mark.parametrize("ranges", [[(1, 1)], [(1, 5), (7, 9), (11, 2**63 - 1)], [(9, 9), (1, 3)]],
                         ids=["one", "three", "unordered"])
@pytest.mark.parametrize("more", [False, True], ids=["alone", "with-another"])
def test_an_answer_written_from_pieces_reads_as_the_full_reading_reads_it(soap, wsa, version, identifier,
                                                                         ranges, more):
    acks = [(SequenceAcknowledgement(identifier, ranges), version)]
    if more:
        acks.append((SequenceAcknowledgement("urn:uuid:other", [(2, 3)]), version))
    data = _answer(acks, soap, wsa)
    read = read_acknowledgement_bytes(data)
    assert read is not None
    assert read == _full(data) == acks


def _changed(old: bytes, new: bytes):
    data = _answer([(SequenceAcknowledgement("urn:uuid:8c2b", [(1, 37)]), RM10)])
    assert old in data
    return data.replace(old, new, 1)


@pytest.mark.parametrize("data", [
    _changed(b'Lower="1"', b'Lower="01"'),  # a zero first: the full reading decides
    _changed(b'Upper="37"', b'Upper="0"'),  # not a message number
    _changed(b'Upper="37" Lower="1"', b'Upper="1" Lower="37"'),  # Lower above Upper
    _changed(b'Upper="37"', b'Upper="9223372036854775808"'),  # past xs:long
    _changed(b"urn:uuid:8c2b<", b" urn:uuid:8c2b<"),  # read stripped by the full reading
    _changed(b"urn:uuid:8c2b<", b"a&amp;b<"),  # escaped
    _changed(b"urn:uuid:8c2b<", b"x" * 1025 + b"<"),  # too long: refused
    _changed(b"<soap:Body></soap:Body>", b"<soap:Body><x/></soap:Body>"),  # a body
    _changed(b"</wsrm:Identifier>", b"</wsrm:Identifier><wsrm:Nack>3</wsrm:Nack>"),
    _changed(b"<wsa:MessageID", b"<!-- c --><wsa:MessageID"),
    _changed(b"</soap:Envelope>", b"</soap:Envelope>\n"),
    _changed(b"<soap:Header>", b"<soap:Header><wsa:RelatesTo xmlns:wsa=\"urn:x\">a</wsa:RelatesTo>"),
    _changed(b"urn:uuid:8c2b", b"\xff"),  # not UTF-8
    _changed(b"</wsrm:SequenceAcknowledgement>", b"</wsrm:SequenceAcknowledgement>"
             b"<wsrm:SequenceAcknowledgement xmlns:wsrm=\"" + RM11.ns.encode() + b"\"><wsrm:Identifier>b"
             b"</wsrm:Identifier><wsrm:AcknowledgementRange Upper=\"2\" Lower=\"1\"/>"
             b"</wsrm:SequenceAcknowledgement>"),  # another version's block
    b"",
    b"<not-soap/>",
], ids=lambda d: repr(d[-60:]))
def test_anything_else_is_left_to_the_full_reading(data):
    assert read_acknowledgement_bytes(data) is None


def test_a_final_a_none_or_a_nack_written_by_the_tree_path_is_left_to_the_full_reading():
    for ack, version in ((SequenceAcknowledgement("urn:x", [(1, 2)], final=True), RM11),
                         (SequenceAcknowledgement("urn:x", []), RM11),
                         (SequenceAcknowledgement("urn:x", nacks=[2]), RM10)):
        envelope = inbound._acknowledgement_envelope(SOAP11, ADDRESSING_VERSIONS[1],
                                                     version.sequence_acknowledgement_action)
        envelope[0][2].text = MESSAGE_ID
        envelope[0].append(ack.to_xml(version, SOAP11))
        data = to_bytes(envelope)
        assert read_acknowledgement_bytes(data) is None
        assert _full(data) == [(ack, version)]
