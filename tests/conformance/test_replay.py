"""Messages other implementations and the specifications wrote, replayed against a reliable spyne service.

Each flow goes in the order a real exchange would, and each answer is checked
against what the specification says it must be -- every acknowledgement's
ranges included, wherever the service sends it (the HTTP response when AcksTo is
anonymous; the peer's own AcksTo address otherwise, caught by
:class:`~tests.conformance.replay.PeerTransport`).  Stored messages
(``messages/``, Apache CXF's and Sandesha2's test resources) are changed only in
``wsa:To``, the sequence Identifier and the body, and each step says which.  The
specification and WCF examples are retyped from the public documents (named
beside each); where a document leaves out namespace declarations, they are the
ones its prefix table names.

Microsoft's MS-WSRVCRR and MS-WSRVCRM section 4 examples are replayed by
``test_microsoft.py``; WCF's messages here come from Microsoft's WS-RM 1.1
interoperability page (CreateSequence with Offer, Sequence, AckRequested,
SequenceAcknowledgement with the flow-control extension ``netrm:BufferRemaining``
that MS-WSRVCRM defines, CloseSequence and TerminateSequence).
"""

from __future__ import annotations

from lxml import etree

from tests.engine.support import wait_for
from wsrm_plugin.wire import (
    RM10, RM11, SOAP11, WSA_2004_08, ActionNotSupported, CloseSequenceResponse, CreateSequence,
    CreateSequenceResponse, EndpointReference, InvalidAcknowledgement, Offer,
    SequenceHeader, SoapFault, TerminateSequenceResponse, UnknownSequence, parse_envelope,
)
from wsrm_plugin.wire.mc import MessagePending

from . import service
from .peer import RawPeer, acks_of, echo, fault_of, note, ranges_of
from .replay import PeerTransport, adapt, body_of, rm_body, send, stored


def _acked(transport: PeerTransport, identifier: str, ranges: list[tuple[int, int]], *, final: bool = False) -> bool:
    """Has the service sent the peer an acknowledgement of ``identifier`` saying exactly ``ranges``?"""
    return any([tuple(r) for r in a.ranges] == ranges and a.final == final for a in transport.acks(identifier))


def _never_shrinks(transport: PeerTransport, identifier: str) -> None:
    seen: set[int] = set()
    for ack in transport.acks(identifier):
        now = {n for lo, hi in ack.ranges for n in range(lo, hi + 1)}
        assert seen <= now, f"an acknowledgement of {identifier} shrank: {sorted(seen)} then {ack.ranges}"
        seen = now


# -- Apache Sandesha2 (WS-RM 1.0 with WS-Addressing 2005/08, SOAP 1.1) ------------------------------------

def test_sandesha2_messages(servers):
    peer_host = "127.0.0.1:9090"  # Sandesha2's AcksTo and ReplyTo: http://127.0.0.1:9090/axis/services/RMService
    transport = PeerTransport([peer_host])
    server = servers(soap="1.1", transport=transport, make_connection=True)
    try:
        # CreateSequence with an Offer (1.0: no Endpoint; replies go to ReplyTo). Changed: wsa:To.
        created = send(server.url, adapt(stored("sandesha2/CreateSequence.xml"), to=server.url))
        response = rm_body(created)
        assert isinstance(response, CreateSequenceResponse) and response.accept is not None, created.body
        identifier, offered = response.identifier, "uuid:c3671020-15e0-11da-9b3b-f0439d4867bd"
        ids = {"uuid:879da420-1624-11da-bed9-84d13db13902": identifier,
               "uuid:897ee740-1624-11da-a28e-b3b9c4e71445": identifier}

        # Sequence.xml as written: its body (tempuri's echoStringResponse) is no operation of this
        # service. Changed: wsa:To, Identifier. Refused before it is acknowledged.
        refused = send(server.url, adapt(stored("sandesha2/Sequence.xml"), to=server.url, identifiers=ids))
        assert isinstance(fault_of(refused), ActionNotSupported) and refused.status == 500
        assert transport.acks(identifier) == []

        # the same message with a body the service runs. Changed: wsa:To, Identifier, body (a
        # one-way Note: the stored message is itself a reply and names no ReplyTo to answer to).
        accepted = send(server.url, adapt(stored("sandesha2/Sequence.xml"), to=server.url, identifiers=ids,
                                          body=note("Sandesha Echo 1")))
        assert accepted.status == 202 and not accepted.body  # the acknowledgement goes to AcksTo
        assert wait_for(lambda: _acked(transport, identifier, [(1, 1)]))

        # AckRequested: answered at AcksTo with the same ranges. Changed: wsa:To, Identifier.
        before = len(transport.acks(identifier))
        asked = send(server.url, adapt(stored("sandesha2/AckRequested.xml"), to=server.url, identifiers=ids))
        assert asked.status == 202
        assert wait_for(lambda: len(transport.acks(identifier)) > before)
        assert [tuple(r) for r in transport.acks(identifier)[-1].ranges] == [(1, 1)]

        # SequenceAcknowledgement of the service's reply sequence naming 1-2, 4-6, 8-10 and Nacks:
        # the service sent nothing on it, so it names messages never sent (and the schema allows
        # ranges or Nacks, not both): InvalidAcknowledgement. Changed: wsa:To,
        # Identifier (the offered sequence's, as Sandesha2 would have it).
        acked = send(server.url, adapt(stored("sandesha2/SequenceAcknowledgement.xml"), to=server.url,
                                       identifiers={"uuid:897ee740-1624-11da-a28e-b3b9c4e71445": offered}))
        assert isinstance(fault_of(acked), InvalidAcknowledgement), acked.body

        # TerminateSequence in the 1.1 namespace for a 1.0 sequence: no such 1.1 sequence.
        # Changed: wsa:To, Identifier.
        ended = send(server.url, adapt(stored("sandesha2/TerminateSequence.xml"), to=server.url,
                                       identifiers={"uuid:59b0c910-1625-11da-bdfc-b09ed76a1f06": identifier}))
        fault = fault_of(ended)
        assert isinstance(fault, UnknownSequence) and fault.version is RM11 and ended.status == 500

        # MessagePending.xml: a Sequence header without a MessageNumber. Changed: wsa:To.
        pending = send(server.url, adapt(stored("sandesha2/MessagePending.xml"), to=server.url))
        fault = fault_of(pending)
        assert fault.code == "Sender" and "MessageNumber" in fault.reason and pending.status == 500

        # MakeConnection.xml: an address of a withdrawn draft's anonymous URI, not WS-MC's. Changed: wsa:To.
        polled = send(server.url, adapt(stored("sandesha2/MakeConnection.xml"), to=server.url))
        fault = fault_of(polled)
        assert isinstance(fault, SoapFault) and fault.code == "Sender" and polled.status == 500, polled.body

        # CreateSequenceResponse.xml sent to the service: it answers nothing the service asked. Changed: wsa:To.
        stray = send(server.url, adapt(stored("sandesha2/CreateSequenceResponse.xml"), to=server.url))
        assert stray.status == 202
        _never_shrinks(transport, identifier)
        assert service.ran("Sandesha Echo 1") == 1
    finally:
        transport.close()


# -- Apache CXF (WS-RM 1.0 with WS-Addressing 2004/08, SOAP 1.1) ------------------------------------------

def test_cxf_messages(servers):
    server = servers(soap="1.1")
    # CXF's resources have no CreateSequence: the sequence is opened as a CXF client opens it
    # (WS-A 2004/08, anonymous AcksTo), so the acknowledgements come in the HTTP responses.
    peer = RawPeer(server.url, rm=RM10, soap=SOAP11, wsa=WSA_2004_08)
    identifier, _ = peer.open()
    ids = {"http://Business456.com/RM/ABC": identifier}

    # Message1.xml as written: the WS-RM 1.0 spec's example, "Some Application Data" (an empty
    # body): no operation. Changed: wsa:To, Identifier.
    first = send(server.url, adapt(stored("cxf/Message1.xml"), to=server.url, identifiers=ids))
    assert isinstance(fault_of(first), ActionNotSupported) and ranges_of(first, identifier) is None

    # with a body the service runs. Changed: wsa:To, Identifier, body.
    one = send(server.url, adapt(stored("cxf/Message1.xml"), to=server.url, identifiers=ids, body=note("cxf-1")))
    assert ranges_of(one, identifier) == [(1, 1)]
    # Retransmission.xml: message 2 with AckRequested. Changed: wsa:To, Identifier, body.
    two = send(server.url, adapt(stored("cxf/Retransmission.xml"), to=server.url, identifiers=ids,
                                 body=note("cxf-2")))
    assert ranges_of(two, identifier) == [(1, 2)]
    # the same copy again: a duplicate, acknowledged (cumulatively), not delivered twice
    again = send(server.url, adapt(stored("cxf/Retransmission.xml"), to=server.url, identifiers=ids,
                                   body=note("cxf-2")))
    assert ranges_of(again, identifier) == [(1, 2)]
    assert wait_for(lambda: service.ran("cxf-1") == 1 and service.ran("cxf-2") == 1)

    # Acknowledgment.xml and Acknowledgment2.xml (white space around its numbers) acknowledge a
    # sequence the service never sent on: UnknownSequence. Changed: wsa:To.
    for name in ("cxf/Acknowledgment.xml", "cxf/Acknowledgment2.xml"):
        answered = send(server.url, adapt(stored(name), to=server.url))
        fault = fault_of(answered)
        assert isinstance(fault, UnknownSequence) and fault.identifier == "http://Business456.com/RM/ABC"
        assert answered.status == 500


# -- WS-ReliableMessaging 1.1, Appendix C (OASIS, wsrm-1.1-spec-os, "Message Examples") -----------------

_SPEC_NS = ('xmlns:soap="http://www.w3.org/2003/05/soap-envelope" '
            'xmlns:wsrm="http://docs.oasis-open.org/ws-rx/wsrm/200702" xmlns:wsa="http://www.w3.org/2005/08/addressing"')

C1_CREATE = f"""<soap:Envelope {_SPEC_NS}>
  <soap:Header>
    <wsa:MessageID>http://Business456.com/guid/0baaf88d-483b-4ecf-a6d8</wsa:MessageID>
    <wsa:To>http://example.com/serviceB/123</wsa:To>
    <wsa:Action>http://docs.oasis-open.org/ws-rx/wsrm/200702/CreateSequence</wsa:Action>
    <wsa:ReplyTo><wsa:Address>http://Business456.com/serviceA/789</wsa:Address></wsa:ReplyTo>
  </soap:Header>
  <soap:Body>
    <wsrm:CreateSequence>
      <wsrm:AcksTo><wsa:Address>http://Business456.com/serviceA/789</wsa:Address></wsrm:AcksTo>
    </wsrm:CreateSequence>
  </soap:Body>
</soap:Envelope>"""


def _c2_message(number: int, message_id: str, ack_requested: bool = False) -> str:
    requested = ("<wsrm:AckRequested><wsrm:Identifier>http://Business456.com/RM/ABC</wsrm:Identifier>"
                 "</wsrm:AckRequested>") if ack_requested else ""
    return f"""<soap:Envelope {_SPEC_NS}>
  <soap:Header>
    <wsa:MessageID>http://Business456.com/guid/{message_id}</wsa:MessageID>
    <wsa:To>http://example.com/serviceB/123</wsa:To>
    <wsa:From><wsa:Address>http://Business456.com/serviceA/789</wsa:Address></wsa:From>
    <wsa:Action>http://example.com/serviceB/123/request</wsa:Action>
    <wsrm:Sequence>
      <wsrm:Identifier>http://Business456.com/RM/ABC</wsrm:Identifier>
      <wsrm:MessageNumber>{number}</wsrm:MessageNumber>
    </wsrm:Sequence>
    {requested}
  </soap:Header>
  <soap:Body><!-- Some Application Data --></soap:Body>
</soap:Envelope>"""


def _c6(body: str, message_id: str) -> str:
    action = etree.QName(etree.fromstring(f"<x {_SPEC_NS}>{body}</x>")[0]).localname
    return f"""<soap:Envelope {_SPEC_NS}>
  <soap:Header>
    <wsa:MessageID>http://Business456.com/guid/{message_id}</wsa:MessageID>
    <wsa:To>http://example.com/serviceB/123</wsa:To>
    <wsa:Action>http://docs.oasis-open.org/ws-rx/wsrm/200702/{action}</wsa:Action>
    <wsa:From><wsa:Address>http://Business456.com/serviceA/789</wsa:Address></wsa:From>
  </soap:Header>
  <soap:Body>{body}</soap:Body>
</soap:Envelope>"""


def test_ws_rm_1_1_appendix_c(servers):
    """C.1 create, C.2 messages 1 and 3 (2 is lost), C.3 the acknowledgement 1, 3 to AcksTo, C.4
    message 2 again, C.5 1-3, C.6 close and terminate with Final 1-3."""
    transport = PeerTransport(["business456.com"])
    server = servers(transport=transport)
    try:
        created = send(server.url, adapt(C1_CREATE.encode(), to=server.url))  # changed: wsa:To
        response = rm_body(created)
        assert isinstance(response, CreateSequenceResponse), created.body
        identifier = response.identifier
        ids = {"http://Business456.com/RM/ABC": identifier}

        # C.2 as written: "Some Application Data", an empty body: no operation of the service
        literal = send(server.url, adapt(_c2_message(1, "71e0654e-5ce8-477b-bb9d").encode(), to=server.url,
                                         identifiers=ids))
        assert isinstance(fault_of(literal), ActionNotSupported)
        assert transport.acks(identifier) == []

        def message(number: int, mid: str, requested: bool = False):  # changed: wsa:To, Identifier, body
            return send(server.url, adapt(_c2_message(number, mid, requested).encode(), to=server.url,
                                          identifiers=ids, body=note(f"C{number}")))

        assert message(1, "71e0654e-5ce8-477b-bb9d").status == 202
        # message 2 (guid/daa7d0b2-c8e0-476e-a9a4) is lost on its way
        assert message(3, "f4c91f1a-04a1-4d04-aa20", requested=True).status == 202
        assert wait_for(lambda: _acked(transport, identifier, [(1, 1), (3, 3)]))       # C.3
        assert message(2, "daa7d0b2-c8e0-476e-a9a4", requested=True).status == 202     # C.4
        assert wait_for(lambda: _acked(transport, identifier, [(1, 3)]))               # C.5
        assert wait_for(lambda: [service.ran(f"C{n}") for n in (1, 2, 3)] == [1, 1, 1])

        closing = send(server.url, adapt(_c6("<wsrm:CloseSequence><wsrm:Identifier>http://Business456.com/RM/ABC"
                                             "</wsrm:Identifier><wsrm:LastMsgNumber>3</wsrm:LastMsgNumber>"
                                             "</wsrm:CloseSequence>", "0baaf88d-483b-4ecf-a6d9").encode(),
                                         to=server.url, identifiers=ids))
        assert isinstance(rm_body(closing), CloseSequenceResponse)
        assert [(a.ranges, a.final) for a in acks_of(closing)] == [([(1, 3)], True)]
        ending = send(server.url, adapt(_c6("<wsrm:TerminateSequence><wsrm:Identifier>http://Business456.com/RM/ABC"
                                            "</wsrm:Identifier><wsrm:LastMsgNumber>3</wsrm:LastMsgNumber>"
                                            "</wsrm:TerminateSequence>", "0baaf88d-483b-4ecf-a6da").encode(),
                                        to=server.url, identifiers=ids))
        assert isinstance(rm_body(ending), TerminateSequenceResponse)
        assert [(a.ranges, a.final) for a in acks_of(ending)] == [([(1, 3)], True)]
        _never_shrinks(transport, identifier)
    finally:
        transport.close()


# -- WCF (Microsoft, "Reliable Messaging Protocol version 1.1", .NET Framework docs) ---------------------

_WCF_NS = ('xmlns:s="http://www.w3.org/2003/05/soap-envelope" '
           'xmlns:wsrm="http://docs.oasis-open.org/ws-rx/wsrm/200702" '
           'xmlns:wsa="http://www.w3.org/2005/08/addressing" xmlns:netrm="http://schemas.microsoft.com/ws/2006/05/rm"')

WCF_CREATE = f"""<s:Envelope {_WCF_NS}>
  <s:Header>
    <wsa:Action s:mustUnderstand="1">http://docs.oasis-open.org/ws-rx/wsrm/200702/CreateSequence</wsa:Action>
    <wsa:MessageID>urn:uuid:949cca61-8813-42ff-ab33-18d9e3fa82fa</wsa:MessageID>
    <wsa:ReplyTo><wsa:Address>http://Business456.com/clientA</wsa:Address></wsa:ReplyTo>
    <wsa:To s:mustUnderstand="1">http://BusinessABC.com/serviceA</wsa:To>
  </s:Header>
  <s:Body>
    <wsrm:CreateSequence>
      <wsrm:AcksTo><wsa:Address>http://Business456.com/clientA</wsa:Address></wsrm:AcksTo>
      <wsrm:Offer>
        <wsrm:Identifier>urn:uuid:066b4730-fc82-458a-a5c1-210be4fb4e4e</wsrm:Identifier>
        <wsrm:Endpoint><wsa:Address>http://Business456.com/clientA</wsa:Address></wsrm:Endpoint>
        <wsrm:IncompleteSequenceBehavior>DiscardFollowingFirstGap</wsrm:IncompleteSequenceBehavior>
      </wsrm:Offer>
    </wsrm:CreateSequence>
  </s:Body>
</s:Envelope>"""

WCF_MESSAGE = f"""<s:Envelope {_WCF_NS}>
  <s:Header>
    <wsa:Action s:mustUnderstand="1">urn:wsrm-conformance/echo</wsa:Action>
    <wsa:MessageID>urn:uuid:5f8a3c80-2f6e-4d4b-9c4e-01d2a8e7c001</wsa:MessageID>
    <wsa:ReplyTo><wsa:Address>http://Business456.com/clientA</wsa:Address></wsa:ReplyTo>
    <wsa:To s:mustUnderstand="1">http://BusinessABC.com/serviceA</wsa:To>
    <wsrm:Sequence s:mustUnderstand="1">
      <wsrm:Identifier>urn:uuid:656652b8-9af2-4e94-9d07-2dc21c05ed27</wsrm:Identifier>
      <wsrm:MessageNumber>1</wsrm:MessageNumber>
    </wsrm:Sequence>
    <wsrm:AckRequested>
      <wsrm:Identifier>urn:uuid:656652b8-9af2-4e94-9d07-2dc21c05ed27</wsrm:Identifier>
    </wsrm:AckRequested>
  </s:Header>
  <s:Body/>
</s:Envelope>"""

WCF_ACK = f"""<s:Envelope {_WCF_NS}>
  <s:Header>
    <wsa:Action s:mustUnderstand="1">http://docs.oasis-open.org/ws-rx/wsrm/200702/SequenceAcknowledgement</wsa:Action>
    <wsa:To s:mustUnderstand="1">http://BusinessABC.com/serviceA</wsa:To>
    <wsrm:SequenceAcknowledgement>
      <wsrm:Identifier>urn:uuid:066b4730-fc82-458a-a5c1-210be4fb4e4e</wsrm:Identifier>
      <wsrm:AcknowledgementRange Upper="1" Lower="1"/>
      <netrm:BufferRemaining>8</netrm:BufferRemaining>
    </wsrm:SequenceAcknowledgement>
  </s:Header>
  <s:Body/>
</s:Envelope>"""


def _wcf_control(body: str, message_id: str) -> str:
    local = etree.QName(etree.fromstring(f"<x {_WCF_NS}>{body}</x>")[0]).localname
    return f"""<s:Envelope {_WCF_NS}>
  <s:Header>
    <wsa:Action s:mustUnderstand="1">http://docs.oasis-open.org/ws-rx/wsrm/200702/{local}</wsa:Action>
    <wsa:MessageID>urn:uuid:{message_id}</wsa:MessageID>
    <wsa:ReplyTo><wsa:Address>http://Business456.com/clientA</wsa:Address></wsa:ReplyTo>
    <wsa:To s:mustUnderstand="1">http://BusinessABC.com/serviceA</wsa:To>
  </s:Header>
  <s:Body>{body}</s:Body>
</s:Envelope>"""


def test_wcf_messages(servers):
    """WCF's CreateSequence with an Offer (its AcksTo, ReplyTo and Offer endpoint the same, R1102),
    a Sequence message with AckRequested, an acknowledgement of the reply carrying the flow
    control extension (netrm:BufferRemaining, B4001), CloseSequence and TerminateSequence (both
    with LastMsgNumber 30 as written: the Final acknowledgement names what really arrived)."""
    transport = PeerTransport(["business456.com"])
    server = servers(transport=transport)
    offered = "urn:uuid:066b4730-fc82-458a-a5c1-210be4fb4e4e"
    try:
        created = send(server.url, adapt(WCF_CREATE.encode(), to=server.url))  # changed: wsa:To
        response = rm_body(created)
        assert isinstance(response, CreateSequenceResponse) and response.accept is not None, created.body
        identifier = response.identifier
        ids = {"urn:uuid:656652b8-9af2-4e94-9d07-2dc21c05ed27": identifier}

        # changed: wsa:To, Identifier, body (the example's body is not shown: an Echo)
        sent = send(server.url, adapt(WCF_MESSAGE.encode(), to=server.url, identifiers=ids, body=echo("wcf")))
        assert sent.status == 202
        assert wait_for(lambda: _acked(transport, identifier, [(1, 1)]))  # to AcksTo (clientA)
        assert wait_for(lambda: [n for n, _ in transport.sequence_messages(offered)][:1] == [1])
        assert b"re:wcf" in transport.sequence_messages(offered)[0][1]

        # WCF acknowledges the reply, with its flow-control extension: accepted. Changed: wsa:To.
        acked = send(server.url, adapt(WCF_ACK.encode(), to=server.url))
        assert acked.status == 202, acked.body
        assert wait_for(lambda: server.engine.status().unacked == 0)

        closing = send(server.url, adapt(_wcf_control(
            "<wsrm:CloseSequence><wsrm:Identifier>urn:uuid:656652b8-9af2-4e94-9d07-2dc21c05ed27</wsrm:Identifier>"
            "<wsrm:LastMsgNumber>30</wsrm:LastMsgNumber></wsrm:CloseSequence>",
            "6ce1d4c3-e1c1-474f-a8c9-4210e37f7877").encode(), to=server.url, identifiers=ids))
        assert isinstance(rm_body(closing), CloseSequenceResponse), closing.body
        assert [(a.ranges, a.final) for a in acks_of(closing)] == [([(1, 1)], True)]
        ending = send(server.url, adapt(_wcf_control(
            "<wsrm:TerminateSequence><wsrm:Identifier>urn:uuid:656652b8-9af2-4e94-9d07-2dc21c05ed27"
            "</wsrm:Identifier><wsrm:LastMsgNumber>30</wsrm:LastMsgNumber></wsrm:TerminateSequence>",
            "3597a398-4f3c-40f4-9335-8f1515572fdf").encode(), to=server.url, identifiers=ids))
        assert isinstance(rm_body(ending), TerminateSequenceResponse), ending.body
        assert [(a.ranges, a.final) for a in acks_of(ending)] == [([(1, 1)], True)]
        _never_shrinks(transport, identifier)
    finally:
        transport.close()


# -- WS-MakeConnection 1.1, section 3.2 (OASIS, wsmc-1.1-spec-os) ----------------------------------------

_MC_ADDRESS = "http://docs.oasis-open.org/ws-rx/wsmc/200702/anonymous?id=550e8400-e29b-11d4-a716-446655440000"

MC_POLL = f"""<S:Envelope xmlns:S="http://www.w3.org/2003/05/soap-envelope"
    xmlns:wsmc="http://docs.oasis-open.org/ws-rx/wsmc/200702" xmlns:wsa="http://www.w3.org/2005/08/addressing">
  <S:Header>
    <wsa:Action>http://docs.oasis-open.org/ws-rx/wsmc/200702/MakeConnection</wsa:Action>
    <wsa:To>http://example.org/serviceA</wsa:To>
  </S:Header>
  <S:Body>
    <wsmc:MakeConnection>
      <wsmc:Address>{_MC_ADDRESS}</wsmc:Address>
    </wsmc:MakeConnection>
  </S:Body>
</S:Envelope>"""


def test_ws_make_connection_polling(servers):
    """A client behind a firewall: its Offer endpoint and ReplyTo are the WS-MC anonymous URI of
    the spec's example; its request is acknowledged on the HTTP response, its reply waits at the
    server until the client polls with the spec's MakeConnection (changed: wsa:To), and comes
    with MessagePending saying whether more wait."""
    server = servers(make_connection=True)
    empty = send(server.url, adapt(MC_POLL.encode(), to=server.url))
    assert empty.status == 202 and not empty.body  # nothing waits yet

    peer = RawPeer(server.url)
    offered = "urn:uuid:3c7d2f5e-0000-4000-8000-550e8400e29b"
    request = CreateSequence(EndpointReference(peer.anonymous),
                             offer=Offer(offered, endpoint=EndpointReference(_MC_ADDRESS)))
    created = rm_body(peer.post(peer.envelope(RM11.create_sequence_action, request.to_xml(RM11, peer.wsa))))
    assert isinstance(created, CreateSequenceResponse) and created.accept is not None
    identifier = created.identifier
    sent = peer.post(peer.envelope(f"{service.TNS}/echo", echo("polled"),
                                   [SequenceHeader(identifier, 1).to_xml(RM11, peer.soap)], reply_to=_MC_ADDRESS))
    assert ranges_of(sent, identifier) == [(1, 1)]  # acknowledged at once; the reply is not on this exchange

    assert wait_for(lambda: server.mailbox.pending("550e8400-e29b-11d4-a716-446655440000") >= 1)
    answered = send(server.url, adapt(MC_POLL.encode(), to=server.url))
    assert answered.status == 200 and b"re:polled" in answered.body
    pending = [h for h in parse_envelope(answered.body).headers if etree.QName(h).localname == "MessagePending"]
    assert [MessagePending.from_xml(h).pending for h in pending] == [False]
    assert body_of(answered) is not None
