"""The answer that only acknowledges, written from pieces (``engine/ackanswer.py``): the tree
path's bytes exactly, or None where only the tree path knows what to write."""

from __future__ import annotations

import pytest
from lxml import etree

from interceptors.message import Response
from interceptors.spyne_server.reliable import response_of
from wsrm_plugin.engine import inbound
from wsrm_plugin.engine.ackanswer import acknowledgement_bytes
from wsrm_plugin.engine.transport import Reply
from wsrm_plugin.wire import SequenceAcknowledgement, parse_envelope, to_bytes
from wsrm_plugin.wire.namespaces import ADDRESSING_VERSIONS, RM10, RM11, RM_VERSIONS
from wsrm_plugin.wire.soap import SOAP11, SOAP12

MESSAGE_ID = "urn:uuid:5e1a0c4e-1111-4222-8333-444455556666"
OTHER = (SequenceAcknowledgement("urn:uuid:other", [(2, 3)]), RM11)


def _by_tree(soap, wsa, action, acks) -> bytes:
    """What the answer was before the pieces: a copy of the made envelope, the blocks' elements."""
    envelope = inbound._acknowledgement_envelope(soap, wsa, action)
    envelope[0][2].text = MESSAGE_ID
    for ack, version in acks:
        envelope[0].append(ack.to_xml(version, soap))
    return to_bytes(envelope)


@pytest.mark.parametrize("soap", [SOAP11, SOAP12], ids=["soap11", "soap12"])
@pytest.mark.parametrize("wsa", ADDRESSING_VERSIONS, ids=lambda v: v.name)
@pytest.mark.parametrize("version", RM_VERSIONS, ids=lambda v: v.name)
@pytest.mark.parametrize("identifier", ["urn:uuid:8c2b", "héllo wörld 中", "a\"b'c", "opaque id "])
@pytest.mark.parametrize("ranges", [[(1, 1)], [(1, 5), (7, 9), (11, 2**63 - 1)]], ids=["one", "three"])
@pytest.mark.parametrize("more", [False, True], ids=["alone", "with-another"])
def test_the_pieces_write_the_tree_paths_bytes(soap, wsa, version, identifier, ranges, more):
    acks = [(SequenceAcknowledgement(identifier, ranges), version), *([OTHER] if more else [])]
    action = version.sequence_acknowledgement_action
    written = acknowledgement_bytes(soap, wsa, action, MESSAGE_ID, acks)
    assert written == _by_tree(soap, wsa, action, acks)
    # and it reads back as what was acknowledged
    read = parse_envelope(written)
    blocks = [SequenceAcknowledgement.from_xml(h)[0] for h in read.headers
              if etree.QName(h).localname == "SequenceAcknowledgement"]
    # (an identifier is read stripped)
    assert [(b.identifier, b.ranges) for b in blocks] == [(a.identifier.strip(), a.ranges) for a, _ in acks]


@pytest.mark.parametrize("ack, version", [
    (SequenceAcknowledgement("urn:x", nacks=[2]), RM10),  # Nacks
    (SequenceAcknowledgement("urn:x", []), RM11),  # 1.1's None
    (SequenceAcknowledgement("urn:x", [(1, 2)], final=True), RM11),  # Final
    (SequenceAcknowledgement("a&b", [(1, 2)]), RM10),  # escaped
    (SequenceAcknowledgement("a<b>", [(1, 2)]), RM10),
    (SequenceAcknowledgement("a\rb", [(1, 2)]), RM10),  # written &#13;
    (SequenceAcknowledgement("a\tb", [(1, 2)]), RM10),  # a control character: left to lxml
    (SequenceAcknowledgement("a\x01b", [(1, 2)]), RM10),  # refused by XML
    (SequenceAcknowledgement("\u3000", [(1, 2)]), RM10),  # blank: refused by to_xml
    (SequenceAcknowledgement("urn:x", [(3, 2)]), RM10),  # out of order: to_xml says so
    (SequenceAcknowledgement("urn:x", [(0, 2)]), RM10),
    (SequenceAcknowledgement("urn:x", [(True, 2)]), RM10),
])
def test_what_the_pieces_leave_to_the_tree_path(ack, version):
    assert acknowledgement_bytes(SOAP11, version.addressing, version.sequence_acknowledgement_action,
                                 MESSAGE_ID, [(ack, version), OTHER]) is None
    assert acknowledgement_bytes(SOAP11, version.addressing, version.sequence_acknowledgement_action,
                                 MESSAGE_ID, [OTHER, (ack, version)]) is None
    assert acknowledgement_bytes(SOAP11, version.addressing, version.sequence_acknowledgement_action,
                                 MESSAGE_ID, []) is None


def test_an_answer_without_a_tree_goes_out_as_its_bytes():
    written = acknowledgement_bytes(SOAP12, RM11.addressing, RM11.sequence_acknowledgement_action, MESSAGE_ID,
                                    [OTHER])
    response = response_of(Reply.envelope(written, SOAP12, RM11.sequence_acknowledgement_action), 1 << 20)
    assert response.envelope is None and response.status_code == 200
    assert response.body() == written
    headers = dict(response.headers(response.body()).pairs())
    assert headers["Content-Length"] == str(len(written))
    assert headers["Content-Type"].startswith("application/soap+xml")
    # an envelope set later is what goes out
    response.envelope = parse_envelope(_by_tree(SOAP11, RM10.addressing, "urn:a", [])).root
    assert response.body() != written
    # bytes alone, no status: 200, as with an envelope
    assert Response(raw=b"<x/>").status_code == 200 and Response().status_code == 202
