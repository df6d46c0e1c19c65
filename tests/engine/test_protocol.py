"""The destination's protocol answers, message by message, and the engine's lifecycle duties."""

from __future__ import annotations

import logging

import pytest

from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.wire import (
    AckRequested, SequenceAcknowledgement, TerminateSequence, TerminateSequenceResponse, UnknownSequence,
    parse_rm_element,
)

from .conftest import fast_policy
from .support import ACTION, RM10, RM11, SOAP12, Recorder, application_message, payload, post, protocol_request, wait_for
from .test_bad_input import open_sequence, send_ok


def _ack(response, rm) -> SequenceAcknowledgement:
    return SequenceAcknowledgement.from_xml(response.envelope().header(rm.qname("SequenceAcknowledgement")))[0]


def test_duplicates_are_acknowledged_and_delivered_once(engines, store_for):
    received = Recorder()
    server = engines(store_for("sqlite", "s"), serve=True, application=received)
    url = server.endpoint_address
    identifier = open_sequence(url, RM11)
    assert send_ok(url, RM11, identifier, 1, "one") == [(1, 1)]
    assert send_ok(url, RM11, identifier, 3, "three") == [(1, 1), (3, 3)]
    assert send_ok(url, RM11, identifier, 1, "one again") == [(1, 1), (3, 3)]
    assert send_ok(url, RM11, identifier, 2, "two") == [(1, 3)]
    assert send_ok(url, RM11, identifier, 3, "three again") == [(1, 3)]
    # in order, each once: 3 waited for 2
    assert wait_for(lambda: received.snapshot() == ["one", "two", "three"])
    assert wait_for(lambda: server.status().delivered == 3)  # counted after the commit


def test_ack_requested_is_answered_with_the_current_ranges(engines, store_for):
    server = engines(store_for("memory", "s"), serve=True, application=Recorder())
    url = server.endpoint_address
    identifier = open_sequence(url, RM10)
    send_ok(url, RM10, identifier, 2, "two")
    request = protocol_request(RM10, url, RM10.ack_requested_action, None,
                               [AckRequested(identifier).to_xml(RM10, SOAP12)])
    response = post(url, request)
    assert response.status == 200
    assert _ack(response, RM10).ranges == [(2, 2)]
    unknown = protocol_request(RM10, url, RM10.ack_requested_action, None,
                               [AckRequested("urn:uuid:unknown").to_xml(RM10, SOAP12)])
    assert isinstance(post(url, unknown).fault(), UnknownSequence)


def test_terminate_1_1_answers_with_response_and_final_ack(engines, store_for):
    received = Recorder()
    server = engines(store_for("memory", "s"), serve=True, application=received)
    url = server.endpoint_address
    identifier = open_sequence(url, RM11)
    send_ok(url, RM11, identifier, 1, "one")
    response = post(url, protocol_request(RM11, url, RM11.terminate_sequence_action,
                                          TerminateSequence(identifier, 1).to_xml(RM11)))
    assert response.status == 200
    body, _ = parse_rm_element(response.envelope().body_element)
    assert isinstance(body, TerminateSequenceResponse) and body.identifier == identifier
    ack = _ack(response, RM11)
    assert ack.ranges == [(1, 1)] and ack.final
    assert wait_for(lambda: received.snapshot() == ["one"])
    # delivered, then released: the sequence is gone
    assert wait_for(lambda: not server.store.status().rmd)
    assert isinstance(post(url, application_message(RM11, url, identifier, 2, "late")).fault(), UnknownSequence)


def test_an_abandoned_sequence_ends_after_the_inactivity_timeout(engines, store_for):
    received = Recorder()
    server = engines(store_for("memory", "s"), fast_policy(inactivity_timeout=0.3), serve=True, application=received)
    url = server.endpoint_address
    identifier = open_sequence(url, RM11)
    send_ok(url, RM11, identifier, 1, "one")
    send_ok(url, RM11, identifier, 3, "three (2 never comes)")
    assert wait_for(lambda: not server.store.status().rmd, timeout=30)
    assert received.snapshot() == ["one"]  # 3 waited behind the gap and went with the sequence
    assert isinstance(post(url, application_message(RM11, url, identifier, 2, "two")).fault(), UnknownSequence)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgresql"])
def test_messages_held_behind_a_gap_are_limited(engines, store_for, request, kind):
    """Each store counts what is held (the SQL stores from the delivered ranges their put read)."""
    received = Recorder()
    store = ("postgresql:" + request.getfixturevalue("pg_dsn_factory")("held") if kind == "postgresql"
             else store_for(kind, "s"))
    server = engines(store, fast_policy(max_unacknowledged_held=2), serve=True, application=received)
    url = server.endpoint_address
    identifier = open_sequence(url, RM11)
    assert send_ok(url, RM11, identifier, 2, "two") == [(2, 2)]
    assert send_ok(url, RM11, identifier, 3, "three") == [(2, 3)]
    # two messages wait for number 1: the third is refused, unacknowledged, for a later retry
    refused = post(url, application_message(RM11, url, identifier, 4, "four"))
    assert refused.status == 503 and refused.headers["Retry-After"] == "5"  # retry later, not an error
    fault = refused.fault()
    assert fault.code == "Receiver" and "retransmit later" in fault.reason
    assert send_ok(url, RM11, identifier, 1, "one") == [(1, 3)]
    assert wait_for(lambda: received.snapshot() == ["one", "two", "three"])
    assert send_ok(url, RM11, identifier, 4, "four") == [(1, 4)]
    assert wait_for(lambda: received.snapshot() == ["one", "two", "three", "four"])


def test_terminate_on_shutdown_ends_open_sequences(engines, store_for):
    received = Recorder()
    server = engines(store_for("memory", "s"), serve=True, application=received)
    client_store = store_for("sqlite", "c")
    client = ReliableEngine(client_store, fast_policy(terminate_on_shutdown=True)).start()
    for i in range(3):
        client.send(server.endpoint_address, payload(f"m{i}"), action=ACTION)
    client.stop(timeout=30)
    after = ReliableEngine(client_store)
    try:
        assert not after.store.status().rms
    finally:
        after.stop()
    assert wait_for(lambda: received.snapshot() == ["m0", "m1", "m2"])
    assert wait_for(lambda: not server.store.status().rmd)


def test_log_records_name_their_sequence(engines, store_for, caplog):
    server = engines(store_for("memory", "s"), serve=True, application=Recorder())
    url = server.endpoint_address
    with caplog.at_level(logging.DEBUG, logger="wsrm_plugin.engine"):
        identifier = open_sequence(url, RM11)
        send_ok(url, RM11, identifier, 1, "one")
        assert wait_for(lambda: server.status().delivered == 1)
    about = [r for r in caplog.records if getattr(r, "sequence_id", None) == identifier]
    assert any(r.message_number == 1 and f"[seq {identifier} #1]" in r.getMessage() for r in about)
    assert any("sequence created" in r.getMessage() for r in about)


def test_a_create_sequence_response_sent_to_our_endpoint_is_matched(engines, store_for):
    from wsrm_plugin.engine.transport import free_port
    from wsrm_plugin.wire import AddressingHeaders, CreateSequenceResponse, build_envelope, to_bytes

    client = engines(store_for("memory", "c"), fast_policy(base_retransmission_interval=30.0), serve=True)
    client.send(f"http://127.0.0.1:{free_port()}/", payload("m0"), action=ACTION)
    assert wait_for(lambda: client.status().send_failures >= 1)  # CreateSequence got nowhere
    with client.store.begin() as tx:
        [seq] = tx.rms.list_all()
    wsa = RM11.addressing
    headers = AddressingHeaders(to=client.endpoint_address, action=RM11.create_sequence_response_action,
                                message_id="urn:uuid:csr-1", relates_to="urn:uuid:forged", version=wsa)
    forged = to_bytes(build_envelope(SOAP12, headers.to_elements(wsa, soap=SOAP12),
                                     CreateSequenceResponse("urn:forged").to_xml(RM11)))
    assert post(client.endpoint_address, forged).status == 202
    assert client.store.status().rms[0].sequence_id is None  # relates to nothing we sent

    headers.relates_to = client.source.create_message_id(seq)
    genuine = to_bytes(build_envelope(SOAP12, headers.to_elements(wsa, soap=SOAP12),
                                      CreateSequenceResponse("urn:late-answer").to_xml(RM11)))
    assert post(client.endpoint_address, genuine).status == 202
    assert client.store.status().rms[0].sequence_id == "urn:late-answer"


def test_ws_rm_1_0_with_w3c_addressing(engines, store_for):
    """Real 1.0 peers (gSOAP, WCF) often pair 1.0 with WS-Addressing 2005/08."""
    received = Recorder()
    server = engines(store_for("memory", "s"), serve=True, application=received)
    client = engines(store_for("memory", "c"), fast_policy(rm_version="1.0", wsa_version="2005/08"))
    for i in range(3):
        client.send(server.endpoint_address, payload(f"m{i}"), action=ACTION)
    client.close(server.endpoint_address)
    assert wait_for(lambda: not client.store.status().rms)
    # a buffered message is delivered after its acknowledgement: wait for the delivery
    assert wait_for(lambda: received.snapshot() == ["m0", "m1", "m2"]), received.snapshot()
    assert all(ctx.action == ACTION for ctx in received.contexts)


def test_stopping_an_engine_leaves_no_thread_behind(store_for):
    import threading

    before = set(threading.enumerate())
    engine = ReliableEngine(store_for("memory", "x"), fast_policy(invoker_threads=2))
    engine.serve()
    engine.start()
    assert len(set(threading.enumerate()) - before) >= 5
    engine.stop()
    assert wait_for(lambda: not [t for t in set(threading.enumerate()) - before if t.is_alive()], timeout=10)
