"""Version checks and HTTP statuses, on the engine's own endpoint and the spyne front end alike (issue 10, item 5).

* a sequence takes only its own WS-RM version: a 1.0 Sequence header on a
  1.1 sequence (and the reverse) is UnknownSequence in the version the peer
  spoke, not acknowledged, not delivered;
* a Content-Type naming the other SOAP version than the envelope's is 415
  with a VersionMismatch fault, before anything is recorded; a SOAP 1.2
  application message to a SOAP 1.1 spyne service is VersionMismatch too
  (it was acknowledged, then failed every delivery);
* both front ends answer the same status for the same error: 413 for an
  oversized body, 415, 503 with Retry-After for "retry later".
"""

from __future__ import annotations

import pytest

from tests.engine.support import (
    RM10, RM11, SOAP11, SOAP12, Recorder, application_message, create_sequence, post, wait_for,
)
from tests.spyne_server.conftest import Envelopes
from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.engine.envelopes import prepare_outgoing, stamp
from wsrm_plugin.wire import (
    WSA_2005_08, CreateSequenceResponse, SequenceAcknowledgement, SequenceHeader, parse_envelope,
    parse_rm_element,
)

from . import service
from .conftest import fast_policy


def _open(url: str, rm, soap=SOAP12) -> str:
    response = post(url, create_sequence(rm, url, soap=soap), soap=soap)
    assert response.status == 200, response.body
    parsed, _ = parse_rm_element(response.envelope().body_element)
    assert isinstance(parsed, CreateSequenceResponse)
    return parsed.identifier


def _acked(response, rm) -> list[tuple[int, int]]:
    header = parse_envelope(response.body).header(rm.qname("SequenceAcknowledgement"))
    return SequenceAcknowledgement.from_xml(header)[0].ranges


@pytest.fixture
def engine_server():
    received = Recorder()
    engine = ReliableEngine("memory:", fast_policy(soap_version="1.2", max_message_size=50_000),
                            application=received, name="versions")
    engine.serve()
    engine.start()
    engine.received = received
    yield engine
    engine.stop(timeout=5)


@pytest.mark.parametrize("own, other", [(RM11, RM10), (RM10, RM11)])
def test_a_sequence_takes_only_its_own_ws_rm_version(engine_server, own, other):
    url = engine_server.endpoint_address
    identifier = _open(url, own)
    refused = post(url, application_message(other, url, identifier, 1, "wrong version"))
    fault = refused.fault()
    assert fault.fault_code == "UnknownSequence" and fault.version is other  # in the peer's own version
    assert b"SequenceAcknowledgement" not in refused.body
    # the sequence itself is untouched: its own version's message 1 is new to it
    taken = post(url, application_message(own, url, identifier, 1, "right version"))
    assert taken.status == 200 and _acked(taken, own) == [(1, 1)]
    assert wait_for(lambda: engine_server.received.snapshot() == ["right version"])


@pytest.mark.parametrize("envelope_soap, content_soap", [(SOAP11, SOAP12), (SOAP12, SOAP11)])
def test_a_content_type_of_the_other_soap_version_is_415_on_the_engine_endpoint(
        engine_server, envelope_soap, content_soap):
    url = engine_server.endpoint_address
    identifier = _open(url, RM11)
    message = application_message(RM11, url, identifier, 1, "mislabelled", soap=envelope_soap)
    refused = post(url, message, soap=content_soap)
    assert refused.status == 415
    assert refused.fault().code == "VersionMismatch"
    assert b"SequenceAcknowledgement" not in refused.body
    assert _acked(post(url, application_message(RM11, url, identifier, 2, "labelled")), RM11) == [(2, 2)]
    assert engine_server.received.snapshot() == []  # 1 was never recorded, so 2 waits behind it


def test_an_oversized_body_is_413_on_both_front_ends(engine_server, servers):
    spyne_server = servers(fast_policy(max_message_size=50_000))
    big = b"<x>" + b"a" * 60_000 + b"</x>"
    for url in (engine_server.endpoint_address, spyne_server.url):
        for soap in (SOAP11, SOAP12):
            response = post(url, big, soap=soap)
            assert response.status == 413, (url, soap, response.status)
            assert response.fault().reason


def _sequence_message(url: str, identifier: str, number: int, text: str) -> bytes:
    stored = prepare_outgoing(Envelopes(url)("note", text), to=url, action=f"{service.TNS}/note",
                              message_id=None, reply_to=None, relates_to=None, wsa=WSA_2005_08,
                              max_size=1 << 20)
    return stamp(stored.payload, [SequenceHeader(identifier, number).to_xml(RM11, SOAP11)])


def test_the_spyne_front_end_checks_the_soap_version_like_the_engine(servers):
    spyne_server = servers()
    url = spyne_server.url
    identifier = _open(url, RM11, soap=SOAP11)
    # a SOAP 1.1 envelope labelled SOAP 1.2: 415, as on the engine's own endpoint
    refused = post(url, _sequence_message(url, identifier, 1, "mislabelled"), soap=SOAP12)
    assert refused.status == 415 and refused.fault().code == "VersionMismatch"
    # a SOAP 1.2 application message, correctly labelled, to this SOAP 1.1 service: VersionMismatch,
    # not acknowledged (it used to be acknowledged, then fail each delivery and be dropped)
    soap12 = application_message(RM11, url, identifier, 1, "soap 1.2", soap=SOAP12)
    refused = post(url, soap12, soap=SOAP12)
    assert refused.status == 500 and refused.fault().code == "VersionMismatch"
    assert b"SequenceAcknowledgement" not in refused.body
    # WS-RM's own messages may still use SOAP 1.2 (a client's policy chooses them)
    assert _open(url, RM11, soap=SOAP12)
    taken = post(url, _sequence_message(url, identifier, 1, "right"), soap=SOAP11)
    assert taken.status in (200, 202)
    assert wait_for(lambda: service.RAN["right"] == 1)
    assert service.RAN["soap 1.2"] == 0 and service.RAN["mislabelled"] == 0


def test_retry_later_is_503_with_retry_after_on_both_front_ends(engine_server, servers):
    """A message over the held-count limit: both front ends answer 503 + Retry-After, not 500."""
    spyne_server = servers(fast_policy(max_unacknowledged_held=1))
    engine = ReliableEngine("memory:", fast_policy(max_unacknowledged_held=1), application=Recorder(), name="busy")
    engine.serve()
    engine.start()
    try:
        for url, soap, build in (
                (engine.endpoint_address, SOAP12,
                 lambda u, i, n: application_message(RM11, u, i, n, f"m{n}")),
                (spyne_server.url, SOAP11, lambda u, i, n: _sequence_message(u, i, n, f"m{n}"))):
            identifier = _open(url, RM11, soap=soap)
            assert post(url, build(url, identifier, 2), soap=soap).status in (200, 202)
            refused = post(url, build(url, identifier, 3), soap=soap)
            assert refused.status == 503, (url, refused.status)
            assert refused.headers.get("Retry-After") == "5"
            assert refused.fault().code == "Receiver"
    finally:
        engine.stop(timeout=5)
