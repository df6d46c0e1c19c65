"""Every message kind the project puts on the wire validates against the published XSDs.

Real traffic, not hand-built elements: a client engine and a server engine exchange
requests that answer and one-way messages, acknowledgements (on the HTTP response, piggybacked,
and standalone to an addressable AcksTo), AckRequested, CloseSequence (1.1) or LastMessage
(1.0), TerminateSequence, and the faults the server answers a stranger's, a bad and a
not-understood message with; a MakeConnection poll and its answer with MessagePending.  Every
envelope that crossed the wire (requests and the bodies of their responses, both ways) is
validated with the local copies of the WS-RM, WS-Addressing, WS-MakeConnection and SOAP
schemas (``tests/wire/schemas``, see its README), in both WS-RM versions and both SOAP
versions.  The issue found it already true; this keeps it true.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import pytest
from lxml import etree

from tests.engine.support import ACTION, NS, Recorder, item_text, payload, post, protocol_request, wait_for
from tests.wire import assert_valid
from wsrm_plugin.engine import AckRequestMode, DeliveryContext, ReliableEngine, RMPolicy
from wsrm_plugin.engine.transport import HttpTransport, Response
from wsrm_plugin.makeconnection import Mailbox, Poller, mc_address_for
from wsrm_plugin.wire import (
    RM10, RM11, SOAP11, SOAP12, SequenceAcknowledgement, SequenceHeader, parse_envelope,
)
from wsrm_plugin.wire.namespaces import ADDRESSING_VERSIONS, RM_VERSIONS, WSMC_NS
from wsrm_plugin.wire.soap import set_must_understand

FAST = dict(base_retransmission_interval=0.2, exponential_backoff=False, poll_interval=0.05, http_timeout=5.0)


class _Recording(HttpTransport):
    """An HTTP transport that keeps every envelope it sends and every envelope it gets back."""

    def __init__(self, seen: list[bytes]) -> None:
        super().__init__(timeout=5.0)
        self.seen = seen
        self._lock = threading.Lock()

    def send(self, address: str, envelope: bytes, headers: Mapping[str, str]) -> Response:
        response = super().send(address, envelope, headers)
        with self._lock:
            self.seen.append(bytes(envelope))
            if response.body and response.is_xml:
                self.seen.append(response.body)
        return response


def _versions_of(data: bytes) -> tuple[str, str]:
    namespaces = {etree.QName(el).namespace for el in parse_envelope(data).root.iter() if isinstance(el.tag, str)}
    rm = next((v.ns for v in RM_VERSIONS if v.ns in namespaces), None)
    wsa = next((v.ns for v in ADDRESSING_VERSIONS if v.ns in namespaces), None)
    if rm is None:  # no WS-RM element (a MakeConnection, a SOAP fault): the version its WS-A goes with
        rm = RM10.ns if wsa == RM10.addressing.ns else RM11.ns
    return rm, wsa or RM11.addressing.ns


def _kinds(data: bytes) -> set[str]:
    envelope = parse_envelope(data)
    kinds = {etree.QName(h).localname for h in envelope.headers}
    body = envelope.body_element
    if body is not None:
        kinds.add(etree.QName(body).localname)
        if etree.QName(body).localname == "Fault":
            code = envelope.fault()
            kinds.add(f"fault:{getattr(code, 'fault_code', None) or code.code}")
    return kinds


def _validate(data: bytes) -> None:
    rm, wsa = _versions_of(data)
    root = parse_envelope(data).root
    soap11_rm11_fault = (rm == RM11.ns and etree.QName(root).namespace == SOAP11.ns
                         and root.find(f".//{{{RM11.ns}}}SequenceFault") is not None)
    # the 1.1 spec's SOAP 1.1 SequenceFault detail needs the ##any variant (tests/wire/schemas/README.md)
    assert_valid(root, rm, wsa, "wsrm-200702-detail-any.xsd" if soap11_rm11_fault else None)


@pytest.mark.parametrize("rm", [RM10, RM11], ids=["wsrm1.0", "wsrm1.1"])
@pytest.mark.parametrize("soap", [SOAP11, SOAP12], ids=["soap1.1", "soap1.2"])
def test_every_message_the_project_sends_validates(rm, soap):
    seen: list[bytes] = []

    def answer(envelope: bytes, context: DeliveryContext) -> None:
        if "ask" in (item_text(envelope) or ""):
            context.reply(payload(f"re:{item_text(envelope)}", soap), action=f"{NS}:answer")

    policy = dict(FAST, rm_version=rm, soap_version=soap, ack_request=AckRequestMode.ALWAYS)
    mailbox = Mailbox()
    server = ReliableEngine("memory:", RMPolicy(**policy, decoupled_acks=True), application=answer,
                            transport=mailbox.transport(_Recording(seen)), name="server")
    server.serve(middleware=mailbox.middleware)
    server.start()
    replies = Recorder()
    client = ReliableEngine("memory:", RMPolicy(**policy, decoupled_acks=True), application=replies,
                            transport=_Recording(seen), name="client")
    client.serve()
    client.start()
    polling = ReliableEngine("memory:", RMPolicy(**policy), application=Recorder(),
                             endpoint_address=mc_address_for("schemas"), transport=_Recording(seen), name="mc")
    poller = Poller(polling, polling.endpoint_address, lambda: [server.endpoint_address], interval=0.05)
    polling.start()
    poller.start()
    try:
        target = server.endpoint_address
        for i in range(3):
            client.send(target, payload(f"ask{i}", soap), action=ACTION, expect_reply=True)
            client.send(target, payload(f"tell{i}", soap), action=ACTION)
        polling.send(target, payload("ask-mc", soap), action=ACTION, expect_reply=True)
        assert wait_for(lambda: len(replies.snapshot()) == 3 and client.status().unacked == 0, timeout=60)
        assert wait_for(lambda: polling.status().unacked == 0 and poller.received >= 1, timeout=60)
        client.close(target)
        polling.close(target)
        assert wait_for(lambda: not client.store.status().rms and not polling.store.status().rms, timeout=60)

        # the server's faults: a stranger's acknowledgement, a bad number, a header nobody understands
        stray = SequenceAcknowledgement("urn:uuid:no-such-sequence", [(1, 1)])
        seen.append(post(target, protocol_request(rm, target, rm.sequence_acknowledgement_action, None,
                                                  [stray.to_xml(rm, soap)], soap=soap), soap=soap).body)
        marked = set_must_understand(etree.Element("{urn:x}Unknown"), soap)
        seen.append(post(target, protocol_request(rm, target, rm.create_sequence_action, None, [marked], soap=soap),
                         soap=soap).body)
        bad = protocol_request(rm, target, ACTION, etree.Element(f"{{{NS}}}item"),
                               [SequenceHeader("urn:uuid:no-such-sequence", 1).to_xml(rm, soap)], soap=soap)
        seen.append(post(target, bad, soap=soap).body)
    finally:
        poller.stop()
        for engine in (polling, client, server):
            engine.stop(timeout=5)

    kinds: set[str] = set()
    for data in seen:
        if data:
            _validate(data)
            kinds |= _kinds(data)
    expected = {"CreateSequence", "CreateSequenceResponse", "Sequence", "SequenceAcknowledgement", "AckRequested",
                "TerminateSequence", "MakeConnection", "MessagePending", "fault:UnknownSequence",
                "fault:MustUnderstand"}
    if rm.is_11:
        expected |= {"CloseSequence", "CloseSequenceResponse", "TerminateSequenceResponse"}
    assert expected <= kinds, f"not seen: {sorted(expected - kinds)}"
    assert any(WSMC_NS in d.decode("utf-8", "replace") for d in seen if d)
