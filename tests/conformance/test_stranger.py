"""A stranger on a client's listener changes nothing (issue 32, item 10).

Whoever learns a client's sequence identifier can reach the client's listener.
Before, a SequenceAcknowledgement posted there made the client drop messages the
service never received, and a forged SequenceTerminated faulted its sequence.  A
sequence hears about its messages only where its acknowledgements are due: in
the HTTP responses to what it sends (its AcksTo is anonymous), or piggybacked on
a message of the sequence it offered (whose identifier only its peer was told).
"""

from __future__ import annotations

from pathlib import Path

from tests.engine.support import ACTION, Recorder, item_text, payload, post, protocol_request, wait_for
from wsrm_plugin.engine import ReliableEngine, RMPolicy
from wsrm_plugin.wire import (
    RM11, SOAP12, SequenceAcknowledgement, SequenceTerminated, UnknownSequence, fault_envelope, to_bytes,
)

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
    from tests.engine.support import NS
    from wsrm_plugin.engine import DeliveryContext

    def answer(envelope: bytes, context: DeliveryContext) -> None:
        context.reply(payload(f"re:{item_text(envelope)}"), action=f"{NS}:answer")

    server = ReliableEngine("memory:", RMPolicy(**FAST, decoupled_acks=False), application=answer,
                            name="server")
    server.serve()
    server.start()
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
