"""Bad input on the wire: each gets its fault, and nothing accepted before is lost.

Every test first gets a message accepted on a sequence, then sends the bad
input, then shows the sequence still works and the application saw exactly
the good messages once.  Messages are built by hand and posted raw, because
a well-behaved engine never sends them.
"""

from __future__ import annotations

import io
import threading

import pytest
from lxml import etree

from wsrm_plugin.engine import BasicAuth, HttpTransport
from wsrm_plugin.engine.transport import RMEndpoint
from wsrm_plugin.wire import (
    AckRequested, CloseSequence, TerminateSequence, CreateSequenceRefused, CreateSequenceResponse, InvalidAcknowledgement,
    LastMessageNumberExceeded, MessageNumberRollover, SequenceAcknowledgement, SequenceClosed,
    SoapFault, UnknownSequence, WSRMRequired, parse_envelope, parse_rm_element,
)

from .conftest import fast_policy
from .support import (
    ACTION, RM10, RM11, SOAP11, SOAP12, Recorder, application_message, create_sequence, payload, post,
    protocol_request, wait_for,
)


def open_sequence(url: str, rm, **kwargs) -> str:
    response = post(url, create_sequence(rm, url), **kwargs)
    assert response.status == 200, response.body
    body = response.envelope().body_element
    parsed, version = parse_rm_element(body)
    assert isinstance(parsed, CreateSequenceResponse) and version is rm
    return parsed.identifier


def send_ok(url: str, rm, identifier: str, number: int, text: str, **kwargs) -> list[tuple[int, int]]:
    """Post one good message; returns the acknowledged ranges from the back-channel."""
    response = post(url, application_message(rm, url, identifier, number, text, **kwargs.pop("msg", {})), **kwargs)
    assert response.status == 200, response.body
    ack = parse_envelope(response.body).header(rm.qname("SequenceAcknowledgement"))
    parsed, _ = SequenceAcknowledgement.from_xml(ack)
    assert parsed.identifier == identifier
    return parsed.ranges


def first_message_senders(url: str, rm, identifiers: list[str]
                          ) -> tuple[list[threading.Thread], dict[str, list[tuple[int, int]]]]:
    """Threads (not started) that each send one sequence's message 1, ``m<n>`` for the n-th
    identifier (receives of many sequences arriving at once), and the ranges each was
    answered with, by identifier, filled as they end."""
    answered: dict[str, list[tuple[int, int]]] = {}

    def send(identifier: str, text: str) -> None:
        answered[identifier] = send_ok(url, rm, identifier, 1, text)

    return ([threading.Thread(target=send, args=(identifier, f"m{n}")) for n, identifier in enumerate(identifiers)],
            answered)


@pytest.fixture
def server(engines, store_for):
    received = Recorder()
    engine = engines(store_for("memory", "server"), fast_policy(max_message_size=20_000), serve=True,
                     application=received, name="server")
    engine.received = received
    return engine


def _delivered(engine, expected: list[str]) -> bool:
    return wait_for(lambda: engine.received.snapshot() == expected, timeout=10)


@pytest.fixture
def accepted(server):
    """A 1.1 sequence on ``server`` with message 1 accepted: (url, identifier)."""
    url = server.endpoint_address
    identifier = open_sequence(url, RM11)
    assert send_ok(url, RM11, identifier, 1, "first") == [(1, 1)]
    return url, identifier


def _still_works(server, url: str, identifier: str) -> None:
    assert send_ok(url, RM11, identifier, 2, "second") == [(1, 2)]
    assert _delivered(server, ["first", "second"]), server.received.snapshot()


def test_malformed_xml_is_a_sender_fault(server, accepted):
    url, identifier = accepted
    response = post(url, b"<soap:Envelope xmlns:soap='http://www.w3.org/2003/05/soap-envelope'><unclosed>")
    assert response.status == 400
    fault = response.fault()
    assert fault.code == "Sender" and "malformed" in fault.reason
    _still_works(server, url, identifier)


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
<!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">]>
<soap:Envelope xmlns:soap="http://www.w3.org/2003/05/soap-envelope"><soap:Body>&lol4;</soap:Body></soap:Envelope>"""

EXTERNAL_ENTITY = b"""<?xml version="1.0"?>
<!DOCTYPE x [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<soap:Envelope xmlns:soap="http://www.w3.org/2003/05/soap-envelope"><soap:Body><x>&secret;</x></soap:Body></soap:Envelope>"""


@pytest.mark.parametrize("document", [BILLION_LAUGHS, EXTERNAL_ENTITY], ids=["expansion", "external"])
def test_entities_are_refused_unexpanded(server, accepted, document):
    url, identifier = accepted
    response = post(url, document)
    assert response.status == 400
    fault = response.fault()
    assert fault.code == "Sender" and "DOCTYPE" in fault.reason
    assert b"root:" not in response.body and b"lollol" not in response.body
    _still_works(server, url, identifier)


def test_oversized_body_is_refused_with_413(server, accepted):
    url, identifier = accepted
    big = application_message(RM11, url, identifier, 2, "x" * 30_000)
    response = post(url, big)
    assert response.status == 413
    assert "exceeds the limit of 20000 bytes" in response.fault().reason
    _still_works(server, url, identifier)  # number 2 was never accepted: still free


def test_oversized_body_is_refused_before_reading_it():
    class Untouchable(io.RawIOBase):
        def read(self, *args):
            raise AssertionError("the endpoint read a body it should have refused")

    class NeverCalled:
        def handle(self, *args, **kwargs):
            raise AssertionError("the engine saw a body it should have refused")

    endpoint = RMEndpoint(NeverCalled(), max_size=1000)
    seen = {}
    body = endpoint({"REQUEST_METHOD": "POST", "CONTENT_LENGTH": "5000000",
                     "CONTENT_TYPE": "application/soap+xml", "wsgi.input": Untouchable()},
                    lambda status, headers: seen.update(status=status, headers=dict(headers)))
    assert seen["status"].startswith("413")
    assert "5000000 bytes exceeds" in parse_envelope(b"".join(body)).fault().reason


def test_unknown_sequence(server, accepted):
    url, identifier = accepted
    response = post(url, application_message(RM11, url, "urn:uuid:not-a-sequence-of-yours", 1, "stray"))
    assert response.status == 400
    fault = response.fault()
    assert isinstance(fault, UnknownSequence)
    _still_works(server, url, identifier)


def test_message_number_zero_is_a_sender_fault(server, accepted):
    url, identifier = accepted
    response = post(url, application_message(RM11, url, identifier, 0, "zero"))
    assert response.status == 400
    fault = response.fault()
    assert fault.code == "Sender" and "MessageNumber '0'" in fault.reason
    _still_works(server, url, identifier)


def test_message_number_beyond_xs_long_is_rollover(server, accepted):
    url, identifier = accepted
    response = post(url, application_message(RM11, url, identifier, 2**63, "too far"))
    fault = response.fault()
    assert isinstance(fault, MessageNumberRollover) and fault.identifier == identifier
    _still_works(server, url, identifier)


def test_message_after_close_is_sequence_closed(server, accepted):
    url, identifier = accepted
    close = protocol_request(RM11, url, RM11.action("CloseSequence"), CloseSequence(identifier, 1).to_xml(RM11))
    response = post(url, close)
    assert response.status == 200
    ack, _ = SequenceAcknowledgement.from_xml(response.envelope().header(RM11.qname("SequenceAcknowledgement")))
    assert ack.ranges == [(1, 1)] and ack.final
    response = post(url, application_message(RM11, url, identifier, 2, "late"))
    assert isinstance(response.fault(), SequenceClosed)
    # the accepted message is still delivered; the late one never is
    assert _delivered(server, ["first"])
    assert wait_for(lambda: server.status().delivered == 1, timeout=30)


def test_number_past_last_message_in_1_0(server):
    url = server.endpoint_address
    identifier = open_sequence(url, RM10)
    send_ok(url, RM10, identifier, 1, "first")
    assert send_ok(url, RM10, identifier, 2, "last", msg={"last": True}) == [(1, 2)]
    response = post(url, application_message(RM10, url, identifier, 3, "beyond"))
    fault = response.fault()
    assert isinstance(fault, LastMessageNumberExceeded) and fault.identifier == identifier
    assert _delivered(server, ["first", "last"])
    # a duplicate of an accepted message is still acknowledged, not faulted
    assert send_ok(url, RM10, identifier, 2, "last", msg={"last": True}) == [(1, 2)]


def test_ack_for_unsent_numbers_is_invalid_acknowledgement(engines, store_for):
    """The client asks for its acknowledgements at its listener (decoupled_acks): an
    acknowledgement there is heard, and one naming numbers never sent is refused.  (With an
    anonymous AcksTo the listener takes none at all: tests/engine/test_stranger.py.)"""
    received = Recorder()
    server = engines(store_for("memory", "s"), serve=True, application=received, name="server")
    client = engines(store_for("memory", "c"), fast_policy(decoupled_acks=True), serve=True, name="client")
    target = server.endpoint_address
    for i in range(3):
        client.send(target, payload(f"m{i}"), action=ACTION)
    assert wait_for(lambda: client.status().unacked == 0 and received.snapshot() == ["m0", "m1", "m2"])
    [sequence] = client.store.status().rms
    bogus = SequenceAcknowledgement(sequence.sequence_id, [(1, 10)])
    request = protocol_request(RM11, client.endpoint_address, RM11.sequence_acknowledgement_action, None,
                               [bogus.to_xml(RM11, SOAP12)])
    response = post(client.endpoint_address, request)
    fault = response.fault()
    assert isinstance(fault, InvalidAcknowledgement) and fault.identifier == sequence.sequence_id
    # the source sequence is unharmed: more messages go through, in order
    client.send(target, payload("m3"), action=ACTION)
    client.close(target)
    assert wait_for(lambda: not client.store.status().rms)
    # a buffered message is delivered after its acknowledgement: wait for the delivery
    assert wait_for(lambda: received.snapshot() == ["m0", "m1", "m2", "m3"]), received.snapshot()


def test_create_sequence_beyond_the_limits_is_refused(engines, store_for):
    received = Recorder()
    server = engines(store_for("memory", "s"), fast_policy(max_open_sequences=2), serve=True,
                     application=received)
    url = server.endpoint_address
    first = open_sequence(url, RM11)
    open_sequence(url, RM11)
    response = post(url, create_sequence(RM11, url))
    fault = response.fault()
    assert isinstance(fault, CreateSequenceRefused)
    assert "2 sequences are open" in fault.reason
    assert server.status().refused_sequences == 1
    send_ok(url, RM11, first, 1, "first")
    assert wait_for(lambda: received.snapshot() == ["first"])


def test_per_peer_limit(engines, store_for):
    server = engines(store_for("memory", "s"), fast_policy(max_open_sequences_per_peer=1), serve=True,
                     application=Recorder())
    url = server.endpoint_address
    open_sequence(url, RM10)
    assert isinstance(post(url, create_sequence(RM10, url)).fault(), CreateSequenceRefused)


def _basic(user: str) -> dict[str, str]:
    import base64
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{user}-pw".encode()).decode()}


@pytest.mark.parametrize("kind", ["memory", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_sequence_belongs_to_the_principal_that_created_it(engines, store_for, request, kind):
    """On PostgreSQL a receive records the next message in the round trip that locks its
    sequence, before the checks (Transaction.receive_in_order): bob's message is recorded
    there, refused, and rolled back."""
    received = Recorder()
    users = {"alice": "alice-pw", "bob": "bob-pw"}
    url = (store_for(kind, "s") if kind == "memory"
           else "postgresql:" + request.getfixturevalue("pg_dsn_factory")("owned"))
    server = engines(url, serve=True, application=received,
                     middleware=lambda app: BasicAuth(app, users))
    url = server.endpoint_address
    assert post(url, create_sequence(RM11, url)).status == 401  # not authenticated at all
    identifier = open_sequence(url, RM11, headers=_basic("alice"))
    send_ok(url, RM11, identifier, 1, "from alice", headers=_basic("alice"))

    # bob may not add messages, ask for acknowledgements, close or terminate alice's sequence
    intruding = [
        application_message(RM11, url, identifier, 2, "from bob"),
        protocol_request(RM11, url, RM11.ack_requested_action, None, [AckRequested(identifier).to_xml(RM11, SOAP12)]),
        protocol_request(RM11, url, RM11.action("CloseSequence"), CloseSequence(identifier).to_xml(RM11)),
        protocol_request(RM11, url, RM11.terminate_sequence_action, TerminateSequence(identifier).to_xml(RM11)),
    ]
    for message in intruding:
        response = post(url, message, headers=_basic("bob"))
        assert isinstance(response.fault(), UnknownSequence), response.body

    # alice carries on; bob's message never reaches the application, nor the store
    assert send_ok(url, RM11, identifier, 2, "alice again", headers=_basic("alice")) == [(1, 2)]
    assert wait_for(lambda: received.snapshot() == ["from alice", "alice again"])

    # the engine's own client authenticates with the transport's credentials
    client = engines(store_for("memory", "c"), transport=HttpTransport(auth=("bob", "bob-pw")))
    client.send(url, payload("bob's own"), action=ACTION)
    client.close(url)
    assert wait_for(lambda: not client.store.status().rms)
    assert wait_for(lambda: received.snapshot() == ["from alice", "alice again", "bob's own"])


def test_message_without_ws_rm_is_refused(server):
    url = server.endpoint_address
    response = post(url, payload("unreliable"))
    assert isinstance(response.fault(), WSRMRequired)


def test_soap11_faults_use_http_500(server):
    url = server.endpoint_address
    message = application_message(RM11, url, "urn:uuid:nope", 1, "x", soap=SOAP11)
    response = post(url, message, soap=SOAP11)
    assert response.status == 500
    assert isinstance(response.fault(), UnknownSequence)
    assert response.headers["Content-Type"].startswith("text/xml")


def test_get_is_not_allowed(server):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(server.endpoint_address, timeout=10)
    assert caught.value.code == 405


def test_fault_carries_ws_addressing_relates_to(server):
    url = server.endpoint_address
    message = application_message(RM11, url, "urn:uuid:nope", 1, "x")
    sent_id = parse_envelope(message).header(RM11.addressing.qname("MessageID")).text
    response = post(url, message)
    relates = response.envelope().header(RM11.addressing.qname("RelatesTo"))
    assert relates is not None and relates.text == sent_id
    action = response.envelope().header(RM11.addressing.qname("Action"))
    assert action.text == RM11.fault_action
    assert isinstance(response.fault(), SoapFault)
    assert etree.QName(response.envelope().body_element).localname == "Fault"


def test_a_request_no_reply_could_reach_is_refused_when_the_engine_is_told_what_answers(engines, store_for):
    """``ReliableEngine(answers=...)``: a plain-callable application says which bodies answer, so a
    request on a sequence without an Offer, with an anonymous ReplyTo, is refused unrecorded (a
    Sender fault, as the spyne adapter does) instead of being run with a reply that cannot go."""
    received = Recorder()

    def answers(body) -> bool:
        return (body.text or "").startswith("ask")

    engine = engines(store_for("memory", "server"), fast_policy(), serve=True, application=received,
                     answers=answers, name="server")
    url = engine.endpoint_address
    identifier = open_sequence(url, RM11)
    refused = post(url, application_message(RM11, url, identifier, 1, "ask-1"))
    fault = refused.fault()
    assert refused.status == 400 and fault.code == "Sender", refused.body  # SOAP 1.2: a Sender fault is 400
    assert "no reply could reach you" in fault.reason
    with engine.store.begin() as tx:  # nothing recorded: the number is still free
        assert list(tx.rmd.get(identifier).received.ranges) == []
    assert send_ok(url, RM11, identifier, 1, "tell-1") == [(1, 1)]  # a one-way body goes through
    assert wait_for(lambda: received.snapshot() == ["tell-1"])
