"""Microsoft's published protocol examples, replayed against the service and the client.

The messages in ``messages/microsoft/`` are retyped from section 4 ("Protocol
Examples") of two of Microsoft's Open Specifications (see that folder's
README): MS-WSRVCRR, WS-ReliableMessaging's reliable request-reply extension
(a CreateSequence with an Offer whose AcksTo and Offer Endpoint are anonymous,
and its response, in WS-RM 1.0 and 1.1), and MS-WSRVCRM, WCF's flow-control
extension (a one-way WS-RM 1.0 sequence: three messages, and the destination's
acknowledgements carrying ``netrm:BufferRemaining``).

Each answer is compared by meaning with the example's: the body and its action,
RelatesTo, the Accept and its AcksTo, every acknowledgement's ranges -- not
bytes.  Where this project answers differently, docs/conformance.md says why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from lxml import etree

from tests.engine.support import payload, wait_for
from wsrm_plugin.engine import ReliableEngine, RMPolicy
from wsrm_plugin.engine.http_server import HttpServer
from wsrm_plugin.wire import (
    RM10, RM11, SOAP12, WSA_2005_08, AckRequested, AddressingHeaders, CreateSequenceResponse, SequenceAcknowledgement,
    SequenceHeader, parse_envelope, parse_rm_element,
)
from wsrm_plugin.wire.xmlsafe import parse_xml

from . import service
from .peer import RawPeer, acks_of, echo, note, ranges_of
from .replay import adapt, rm_body, send, stored

_TEMPURI_ACTION = "http://tempuri.org/IAFCEExampleContract/Operation1"
_EXAMPLE_SEQUENCE = "urn:uuid:0b162747-99cf-479c-972f-95b776e141c3"  # MS-WSRVCRM's
_EXAMPLE_CREATED = "urn:uuid:57c7d4a2-2b43-4621-bc78-38c78f2defbd"  # MS-WSRVCRR 4.1.1's


def _example(name: str) -> bytes:
    return stored(f"microsoft/{name}")


def _acks_in(data: bytes) -> list[SequenceAcknowledgement]:
    found = []
    for header in parse_envelope(data).headers:
        parsed = parse_rm_element(header)
        if parsed is not None and isinstance(parsed[0], SequenceAcknowledgement):
            found.append(parsed[0])
    return found


def _example_ranges(name: str) -> list[tuple[int, int]]:
    """The ranges Microsoft's acknowledgement ``name`` gives."""
    [ack] = _acks_in(_example(name))
    return [tuple(r) for r in ack.ranges]


def _buffer_remaining(data: bytes) -> int | None:
    root = parse_xml(data)
    found = root.find(".//{http://schemas.microsoft.com/ws/2006/05/rm}BufferRemaining")
    return int(found.text.strip()) if found is not None and found.text else None


def rm_body_of(data: bytes):
    parsed = parse_rm_element(parse_envelope(data).body_element)
    assert parsed is not None
    return parsed[0]


def _addressing(data: bytes) -> AddressingHeaders:
    return AddressingHeaders.from_header(parse_envelope(data).headers)


# -- MS-WSRVCRR section 4: establishing the sequences, the service as the RMD ------------------------

@pytest.mark.parametrize("section, rm", [("4.1.1", RM10), ("4.2.1", RM11)], ids=["WS-RM 1.0", "WS-RM 1.1"])
def test_wsrvcrr_establish_the_sequences(servers, section, rm):
    """MS-WSRVCRR 4.1.1 / 4.2.1: WCF's CreateSequence with an Offer, AcksTo (and in 1.1 the Offer
    Endpoint) anonymous, no ReplyTo.  Changed: wsa:To.  The answer means what Microsoft's
    CreateSequenceResponse means: the CreateSequenceResponse action, RelatesTo the request, a new
    Identifier, and an Accept whose AcksTo is the service's own address (Microsoft's example:
    ``http://localhost/RMD``, the address the request was sent to).  Then the reliable
    request-reply the extension is for: a request with an anonymous ReplyTo gets its reply on the
    offered sequence in the HTTP response, with the request acknowledged."""
    server = servers()
    request = _example(f"wsrvcrr-{section}-CreateSequence.xml")
    answer = send(server.url, adapt(request, to=server.url))
    created = rm_body(answer)
    assert answer.status == 200 and isinstance(created, CreateSequenceResponse), answer.body
    addressing = _addressing(answer.body)
    assert addressing.action == rm.create_sequence_response_action
    assert addressing.relates_to == _addressing(request).message_id
    assert created.accept is not None and created.accept.address == server.url
    if section == "4.1.1":  # the one response whose text could be read in full: the same elements
        example = rm_body_of(_example("wsrvcrr-4.1.1-CreateSequenceResponse.xml"))
        assert example.accept is not None and example.accept.address == _addressing(request).to
        assert example.identifier == _EXAMPLE_CREATED
    offered = next(e.text.strip() for e in parse_xml(request).iter()
                   if isinstance(e.tag, str) and etree.QName(e).localname == "Identifier")

    peer = RawPeer(server.url, rm=rm, wsa=WSA_2005_08)  # WS-A 2005/08, as Microsoft's messages
    reply = peer.message(created.identifier, 1, echo("ms"), ack_requested=True)
    assert reply.status == 200 and b"re:ms" in reply.body, reply.body
    [sequence] = [h for h in parse_envelope(reply.body).headers
                  if (p := parse_rm_element(h)) is not None and isinstance(p[0], SequenceHeader)]
    header = parse_rm_element(sequence)[0]
    assert (header.identifier, header.message_number) == (offered, 1)
    assert ranges_of(reply, created.identifier) == [(1, 1)]


# -- MS-WSRVCRM section 4.1: a one-way sequence, the service as the RMD ------------------------------

def test_wsrvcrm_messages_against_the_service(servers):
    """MS-WSRVCRM 4.1.1, 4.1.3, 4.1.6 (messages 1, 3 and 6: numbers 1, 2, 3 of a WS-RM 1.0
    sequence, SOAP 1.2, no MessageID or ReplyTo: one-way) on a sequence opened with MS-WSRVCRR
    4.1.1's CreateSequence.  Changed: wsa:To, the Identifier (the service's), the body (the
    example's is ``...``: a one-way ``note``).  Each is answered, in its HTTP response (AcksTo is
    anonymous), with the acknowledgement Microsoft's messages 2 and 4 give (1-1, then 1-2) and then
    1-3.  Not given: ``netrm:BufferRemaining`` (the extension is optional; see
    docs/conformance.md)."""
    server = servers()
    created = rm_body(send(server.url, adapt(_example("wsrvcrr-4.1.1-CreateSequence.xml"), to=server.url)))
    assert isinstance(created, CreateSequenceResponse)
    ids = {_EXAMPLE_SEQUENCE: created.identifier}
    expected = [_example_ranges("wsrvcrm-4.1.2-Message2-Ack-BufferRemaining1.xml"),
                _example_ranges("wsrvcrm-4.1.4-Message4-Ack-BufferRemaining0.xml"), [(1, 3)]]
    assert expected[:2] == [[(1, 1)], [(1, 2)]]
    names = ["wsrvcrm-4.1.1-Message1-Sequence1.xml", "wsrvcrm-4.1.3-Message3-Sequence2.xml",
             "wsrvcrm-4.1.6-Message6-Sequence3.xml"]
    for i, (name, ranges) in enumerate(zip(names, expected, strict=True)):
        answer = send(server.url, adapt(_example(name), to=server.url, identifiers=ids, body=note(f"afce{i}")))
        assert answer.status == 200, answer.body
        [ack] = acks_of(answer)
        assert ack.identifier == created.identifier and [tuple(r) for r in ack.ranges] == ranges
        assert _addressing(answer.body).action == RM10.sequence_acknowledgement_action
    assert wait_for(lambda: all(service.ran(f"afce{i}") == 1 for i in range(3)))


# -- MS-WSRVCRM section 4.1: the client as the RMS, against a destination answering as the example -----

class _ExampleDestination:
    """An RMD on loopback that answers as MS-WSRVCRM's example does: MS-WSRVCRR 4.1.1's
    CreateSequenceResponse (changed: RelatesTo, and the Identifier, MS-WSRVCRM's sequence),
    then, in the HTTP response to each message of the client, Microsoft's acknowledgement for it
    (messages 2 and 4, as written); an AckRequested, or a message after the buffer filled, gets
    message 5 (1-2, BufferRemaining 1) once, then acknowledgements of everything received."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.ack_requests = 0
        self.answered: list[bytes] = []
        self._lock = threading.Lock()
        self._gave_message5 = False
        self.server = HttpServer(self._app, "127.0.0.1", 0).start()

    @property
    def url(self) -> str:
        return self.server.url

    def _answer(self, data: bytes) -> bytes | None:
        envelope = parse_envelope(data)
        body = envelope.body_element
        if body is not None and etree.QName(body).localname == "CreateSequence":
            response = adapt(_example("wsrvcrr-4.1.1-CreateSequenceResponse.xml"),
                             identifiers={_EXAMPLE_CREATED: _EXAMPLE_SEQUENCE})
            message_id = AddressingHeaders.from_header(envelope.headers).message_id or ""
            return response.replace(b"urn:uuid:20c29d59-2f5d-401a-80c7-55a6f57ffd52", message_id.encode())
        number = None
        for header in envelope.headers:
            parsed = parse_rm_element(header)
            if parsed is not None and isinstance(parsed[0], SequenceHeader):
                number = parsed[0].message_number
            elif parsed is not None and isinstance(parsed[0], AckRequested):
                self.ack_requests += 1
        if number is not None and number not in self.received:
            self.received.append(number)
        if number in (1, 2) and self.received == list(range(1, number + 1)) and not self._gave_message5:
            return _example({1: "wsrvcrm-4.1.2-Message2-Ack-BufferRemaining1.xml",
                             2: "wsrvcrm-4.1.4-Message4-Ack-BufferRemaining0.xml"}[number])
        message5 = _example("wsrvcrm-4.1.5-Message5-Ack-BufferRemaining1.xml")
        if not self._gave_message5:
            self._gave_message5 = True  # "the AD came online and processed message 1"
            return message5
        # afterwards (not in the example): message 5 saying everything received (1..n, no gap here)
        return message5.replace(b'Upper="2"', f'Upper="{max(self.received, default=2)}"'.encode())

    def _app(self, environ: dict, start_response: Callable) -> Iterator[bytes]:
        data = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        with self._lock:
            answer = self._answer(data)
            if answer is not None:
                self.answered.append(answer)
        if answer is None:
            start_response("202 Accepted", [("Content-Length", "0")])
            return [b""]
        start_response("200 OK", [("Content-Type", SOAP12.content_type), ("Content-Length", str(len(answer)))])
        return [answer]

    def stop(self) -> None:
        self.server.stop(timeout=5)


def test_wsrvcrm_acknowledgements_against_the_client(tmp_path):
    """The client sends three one-way messages on a WS-RM 1.0 sequence (SOAP 1.2, WS-A 2005/08, as
    the example) to a destination that answers with Microsoft's CreateSequenceResponse and its
    acknowledgements 2, 4 and 5 as written (their ``netrm:BufferRemaining`` included, an element
    the client does not know, inside SequenceAcknowledgement): it takes the Identifier it was
    given, reads each acknowledgement's ranges, and ends with nothing unacknowledged, each message
    received once."""
    destination = _ExampleDestination()
    policy = RMPolicy(rm_version=RM10, base_retransmission_interval=0.2, exponential_backoff=False,
                      poll_interval=0.05, http_timeout=5.0)
    client = ReliableEngine("memory:", policy, name="client").start()
    try:
        for i in range(3):
            client.send(destination.url, payload(f"afce{i}"), action=_TEMPURI_ACTION)
        assert wait_for(lambda: client.status().unacked == 0, timeout=60), (destination.received, client.status())
        assert sorted(destination.received) == [1, 2, 3]
        [sequence] = client.store.status().rms
        assert sequence.sequence_id == _EXAMPLE_SEQUENCE
        assert [_buffer_remaining(a) for a in destination.answered[1:4]] == [1, 0, 1]
    finally:
        client.stop(timeout=5)
        destination.stop()

