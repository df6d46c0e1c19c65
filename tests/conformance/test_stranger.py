"""A stranger on a client's listener changes nothing (issue 32, item 10).

Whoever learns a client's sequence identifier can reach the client's listener.
Before, a SequenceAcknowledgement posted there made the client drop messages the
service never received, and a forged SequenceTerminated faulted its sequence.  A
sequence hears about its messages only where its acknowledgements are due: in
the HTTP responses to what it sends (its AcksTo is anonymous), or piggybacked on
a message of the sequence it offered (whose identifier only its peer was told).

The sequence the client offered takes its messages only where its peer was told
to send them: a client whose Offer Endpoint and ReplyTo are anonymous gets them in
the HTTP responses to its requests, so the same messages posted to a listener of
its (replies, AckRequested, Close, Terminate) are a stranger's.
"""

from __future__ import annotations

from pathlib import Path

from tests.engine.support import (
    ACTION, NS, Recorder, application_message, item_text, payload, post, protocol_request, wait_for,
)
from wsrm_plugin.engine import DeliveryContext, ReliableEngine, RMPolicy
from wsrm_plugin.engine.http_server import HttpServer
from wsrm_plugin.makeconnection import Poller, mc_address_for
from wsrm_plugin.wire import (
    RM11, SOAP12, AckRequested, CloseSequence, SequenceAcknowledgement, SequenceTerminated, TerminateSequence,
    UnknownSequence, build_envelope, fault_envelope, to_bytes,
)

from . import service as conformance
from .peer import echo

FAST = dict(base_retransmission_interval=0.2, exponential_backoff=False, poll_interval=0.05, http_timeout=5.0)


def _server(path: Path, port: int, received: Recorder) -> ReliableEngine:
    engine = ReliableEngine(f"sqlite:///{path}", RMPolicy(**FAST), application=received, name="server")
    engine.serve("127.0.0.1", port)
    return engine.start()


def test_a_stranger_cannot_acknowledge_or_fault_a_clients_sequence(tmp_path):
    received = Recorder()
    server = _server(tmp_path / "server.db", 0, received)
    port = int(server.endpoint_address.rsplit(":", 1)[1].strip("/"))
    client = ReliableEngine("memory:", RMPolicy(**FAST), name="client")
    client.serve()  # it listens (for replies), and asked for its acknowledgements on the back-channel
    client.start()
    try:
        client.send(server.endpoint_address, payload("m1"), action=ACTION)
        assert wait_for(lambda: client.status().unacked == 0 and received.snapshot() == ["m1"])
        server.stop(timeout=5)  # from now on nothing reaches the service
        for i in range(2, 11):
            client.send(server.endpoint_address, payload(f"m{i}"), action=ACTION)
        [sequence] = client.store.status().rms
        identifier = sequence.sequence_id
        assert client.status().unacked == 9

        # the stranger acknowledges everything, standalone and piggybacked on a message of its own
        forged = SequenceAcknowledgement(identifier, [(1, 10)])
        standalone = post(client.endpoint_address, protocol_request(
            RM11, client.endpoint_address, RM11.sequence_acknowledgement_action, None, [forged.to_xml(RM11, SOAP12)]))
        assert isinstance(standalone.fault(), UnknownSequence)  # learns nothing
        # ... and faults the sequence
        terminated = SequenceTerminated(identifier, "forged", version=RM11)
        faulted = post(client.endpoint_address, to_bytes(fault_envelope(terminated, SOAP12)))
        assert faulted.status >= 400 and isinstance(faulted.fault(), UnknownSequence)

        status = client.store.status()
        assert status.unacked == 9 and status.faulted == 0, status  # nothing dropped, nothing faulted

        restarted = _server(tmp_path / "server.db", port, received)  # the service comes back
        try:
            assert wait_for(lambda: client.status().unacked == 0, timeout=60)
            assert wait_for(lambda: sorted(received.snapshot(), key=lambda t: int(t[1:]))
                            == [f"m{i}" for i in range(1, 11)], timeout=30), received.snapshot()
            assert len(received.snapshot()) == 10  # each exactly once
        finally:
            restarted.stop(timeout=5)
    finally:
        client.stop(timeout=5)
        server.stop(timeout=5)


def test_the_peers_replies_still_reach_the_listener(tmp_path):
    """What the listener is for still works: replies on the sequence the client offered, and the
    requests acknowledged.  (Acknowledgements riding on such replies, as gSOAP's server sends
    them and WCF's R1601 allows, are heard: tests/interop/test_gsoap_interop.py's Echo with an
    Offer depends on it.)"""
    server = _answering_server("memory:", 0)
    replies = Recorder()
    client = ReliableEngine("memory:", RMPolicy(**FAST), application=replies, name="client")
    client.serve()
    client.start()
    try:
        for i in range(3):
            client.send(server.endpoint_address, payload(f"q{i}"), action=ACTION, expect_reply=True)
        assert wait_for(lambda: sorted(replies.snapshot()) == ["re:q0", "re:q1", "re:q2"], timeout=30)
        assert wait_for(lambda: client.status().unacked == 0, timeout=30)
    finally:
        client.stop(timeout=5)
        server.stop(timeout=5)


def _answer(envelope: bytes, context: DeliveryContext) -> None:
    context.reply(payload(f"re:{item_text(envelope)}"), action=f"{NS}:answer")


def _answering_server(store: str, port: int) -> ReliableEngine:
    server = ReliableEngine(store, RMPolicy(**FAST, decoupled_acks=False), application=_answer, name="server")
    server.serve("127.0.0.1", port)
    return server.start()


def _offered_state(client: ReliableEngine) -> tuple[str, str, tuple]:
    """(the request sequence's identifier, the offered one's, what the client stored of the latter)."""
    with client.store.begin() as tx:
        [requests] = tx.rms.list_all()
        offered = tx.rmd.get(requests.offered_id)
    assert requests.sequence_id is not None and offered is not None
    return requests.sequence_id, offered.sequence_id, (str(offered.received), offered.closed, offered.terminated)


def test_a_stranger_cannot_post_on_the_sequence_a_back_channel_client_offered(tmp_path):
    """The client names no address (its Offer Endpoint and ReplyTo are anonymous: the replies come
    in the HTTP responses), yet its engine's endpoint is reachable (mounted in a web server of its
    own).  A stranger who learnt the offered identifier posts there: a reply with the number the
    real one will have (with an acknowledgement of every request riding on it), AckRequested,
    CloseSequence and TerminateSequence.  Each is UnknownSequence, nothing stored changes, and the
    real reply still reaches the application."""
    server_db = tmp_path / "server.db"
    server = _answering_server(f"sqlite:///{server_db}", 0)
    port = int(server.endpoint_address.rsplit(":", 1)[1].strip("/"))
    replies = Recorder()
    client = ReliableEngine("memory:", RMPolicy(**FAST), application=replies, name="client")
    listener = HttpServer(client.endpoint, "127.0.0.1", 0).start()
    client.start()
    try:
        assert client.endpoint_address is None  # it asks for its replies on the back-channel
        for i in range(2):
            client.send(server.endpoint_address, payload(f"q{i}"), action=ACTION, expect_reply=True)
        assert wait_for(lambda: sorted(replies.snapshot()) == ["re:q0", "re:q1"], timeout=30), replies.snapshot()
        assert wait_for(lambda: client.status().unacked == 0, timeout=30)
        server.stop(timeout=5)  # from now on nothing reaches the service
        client.send(server.endpoint_address, payload("q2"), action=ACTION, expect_reply=True)
        request_id, offered_id, before = _offered_state(client)
        assert wait_for(lambda: client.status().unacked == 1)

        def refused(body: bytes) -> None:  # a SOAP 1.2 Sender fault: HTTP 400
            answer = post(listener.url, body)
            fault = answer.fault() if answer.body else None
            assert answer.status == 400 and isinstance(fault, UnknownSequence), (answer.status, answer.body)
            assert fault.identifier == offered_id

        everything = SequenceAcknowledgement(request_id, [(1, 10)]).to_xml(RM11, SOAP12)
        refused(application_message(RM11, listener.url, offered_id, 3, "forged", extra_headers=[everything]))
        refused(protocol_request(RM11, listener.url, RM11.action("AckRequested"), None,
                                 [AckRequested(offered_id).to_xml(RM11, SOAP12)]))
        refused(protocol_request(RM11, listener.url, RM11.action("CloseSequence"),
                                 CloseSequence(offered_id).to_xml(RM11)))
        refused(protocol_request(RM11, listener.url, RM11.action("TerminateSequence"),
                                 TerminateSequence(offered_id).to_xml(RM11)))
        assert _offered_state(client)[2] == before  # nothing received, closed or terminated
        assert client.status().unacked == 1 and client.store.status().faulted == 0
        assert sorted(replies.snapshot()) == ["re:q0", "re:q1"]

        restarted = _answering_server(f"sqlite:///{server_db}", port)  # the service comes back
        try:
            # reply 3 is the real one: the stranger's number 3 took no slot
            assert wait_for(lambda: sorted(replies.snapshot()) == ["re:q0", "re:q1", "re:q2"], timeout=60), \
                replies.snapshot()
            assert wait_for(lambda: client.status().unacked == 0, timeout=30)
        finally:
            restarted.stop(timeout=5)
    finally:
        client.stop(timeout=5)
        listener.stop(timeout=5)
        server.stop(timeout=5)


def test_an_addressed_client_hears_its_peer_on_the_offered_sequence(tmp_path):
    """The legitimate case: the client names its listener (Offer Endpoint and ReplyTo), so its peer
    posts the offered sequence's messages there -- replies, and AckRequested, which is answered
    with the acknowledgement, not refused."""
    server = _answering_server("memory:", 0)
    replies = Recorder()
    client = ReliableEngine("memory:", RMPolicy(**FAST), application=replies, name="client")
    client.serve()
    client.start()
    try:
        for i in range(2):
            client.send(server.endpoint_address, payload(f"q{i}"), action=ACTION, expect_reply=True)
        assert wait_for(lambda: sorted(replies.snapshot()) == ["re:q0", "re:q1"], timeout=30), replies.snapshot()
        _, offered_id, _ = _offered_state(client)
        answer = post(client.endpoint_address, protocol_request(
            RM11, client.endpoint_address, RM11.action("AckRequested"), None,
            [AckRequested(offered_id).to_xml(RM11, SOAP12)]))
        assert answer.status < 300, (answer.status, answer.body)
    finally:
        client.stop(timeout=5)
        server.stop(timeout=5)


def test_a_stranger_cannot_post_on_the_sequence_a_polling_client_offered(servers):
    """The same with a WS-MakeConnection client: its Offer Endpoint and ReplyTo are a WS-MC anonymous
    URI, its replies come in the answers to its MakeConnection polls, and its engine's endpoint is
    nonetheless reachable (served inside the firewall).  A stranger's reply on the offered sequence,
    AckRequested, Close and Terminate are UnknownSequence; the real replies still arrive."""
    server = servers(make_connection=True)
    replies: list[bytes] = []

    def take(envelope: bytes, context: DeliveryContext) -> None:
        replies.append(envelope)

    client = ReliableEngine("memory:", RMPolicy(**FAST), application=take, name="client",
                            endpoint_address=mc_address_for("behind-the-firewall"))
    listener = HttpServer(client.endpoint, "127.0.0.1", 0).start()
    client.start()
    poller = Poller(client, client.endpoint_address, lambda: [server.url], interval=0.05).start()
    try:
        def call(text: str) -> None:
            client.send(server.url, to_bytes(build_envelope(SOAP12, [], echo(text))),
                        action=f"{conformance.TNS}/echo", expect_reply=True)

        call("p1")
        assert wait_for(lambda: len(replies) == 1, timeout=30)
        _, offered_id, before = _offered_state(client)
        for body in (application_message(RM11, listener.url, offered_id, 2, "forged"),
                     protocol_request(RM11, listener.url, RM11.action("AckRequested"), None,
                                      [AckRequested(offered_id).to_xml(RM11, SOAP12)]),
                     protocol_request(RM11, listener.url, RM11.action("CloseSequence"),
                                      CloseSequence(offered_id).to_xml(RM11)),
                     protocol_request(RM11, listener.url, RM11.action("TerminateSequence"),
                                      TerminateSequence(offered_id).to_xml(RM11))):
            answer = post(listener.url, body)
            assert answer.status == 400 and isinstance(answer.fault(), UnknownSequence), answer.body
        assert _offered_state(client)[2] == before
        call("p2")  # its reply is number 2 on the offered sequence: the stranger's took no slot
        assert wait_for(lambda: len(replies) == 2, timeout=30)
        assert b"re:p2" in replies[1] and b"forged" not in b"".join(replies)
    finally:
        poller.stop(timeout=5)
        client.stop(timeout=5)
        listener.stop(timeout=5)
