"""One-way and request-response calls to a reliable spyne service, driven by a reliable engine."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.engine.support import wait_for
from wsrm_plugin.wire import parse_envelope

from . import service
from .conftest import Envelopes, action, fast_policy

TNS = service.TNS


def _store(kind: str, tmp_path: Path, name: str) -> str:
    return "memory:" if kind == "memory" else f"sqlite:///{tmp_path}/{name}.db"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("rm_version", ["1.0", "1.1"])
def test_one_way_messages_are_delivered_exactly_once_in_order(servers, clients, tmp_path, kind, rm_version):
    policy = fast_policy(rm_version=rm_version)
    server = servers(_store(kind, tmp_path, "server"), policy)
    client = clients(_store(kind, tmp_path, "client"), policy)
    build = Envelopes(server.url)
    items = [f"item-{i}" for i in range(8)]
    for item in items:
        client.send(server.url, build("record", item), action=action("record"))

    assert wait_for(lambda: len(service.recorded()) >= len(items)), service.recorded()
    assert wait_for(lambda: client.status().unacked == 0)
    assert service.recorded() == items
    sequences = {seq for seq, _ in service.DELIVERIES}
    assert len(sequences) == 1
    assert [number for _, number in service.DELIVERIES] == list(range(1, len(items) + 1))
    assert wait_for(lambda: server.engine.status().delivered == len(items), timeout=15)  # counted after the commit


def _collector():
    answers: list[tuple[bytes, object]] = []
    return answers, lambda envelope, context: answers.append((envelope, context))


def _by_request(answers, receipts):
    """The answers in the order of the requests they relate to: replies are handed out as they
    arrive (``RMPolicy.replies_in_order`` is False by default), each to its own request."""
    position = {receipt.message_id: i for i, receipt in enumerate(receipts)}
    return sorted(answers, key=lambda answer: position[answer[1].relates_to])


def _echo_text(envelope: bytes) -> str | None:
    return parse_envelope(envelope).root.findtext(f".//{{{TNS}}}echoResult")


@pytest.mark.parametrize("rm_version", ["1.0", "1.1"])
def test_replies_come_back_on_the_offered_sequence(servers, clients, rm_version):
    policy = fast_policy(rm_version=rm_version)
    server = servers("memory:", policy)
    answers, application = _collector()
    client = clients("memory:", policy, application=application)
    build = Envelopes(server.url)
    receipts = [client.send(server.url, build("echo", f"q{i}"), action=action("echo"), expect_reply=True)
                for i in range(5)]

    assert wait_for(lambda: len(answers) >= 5), answers
    answers = _by_request(answers, receipts)  # each reply answers its own request
    assert [_echo_text(envelope) for envelope, _ in answers] == [f"re:q{i}" for i in range(5)]
    # the replies travelled on one sequence: the one the client offered
    assert len({context.sequence_id for _, context in answers}) == 1
    assert service.recorded() == [f"q{i}" for i in range(5)]


def test_a_service_fault_goes_back_on_the_response_sequence(servers, clients):
    server = servers("memory:", fast_policy(max_delivery_attempts=2))
    answers, application = _collector()
    client = clients("memory:", application=application)
    build = Envelopes(server.url)
    receipts = [client.send(server.url, build("echo", text), action=action("echo"), expect_reply=True)
                for text in ["a", "fail-b", "c"]]

    assert wait_for(lambda: len(answers) >= 3), answers
    answers = _by_request(answers, receipts)
    assert [_echo_text(envelope) for envelope, _ in answers] == ["re:a", None, "re:c"]
    fault_envelope, context = answers[1]
    fault = parse_envelope(fault_envelope).fault()
    # the service's own fault (spyne's code and reason), not a generic one
    assert "the service refuses fail-b" in fault.reason
    assert b"Server.Refused" in fault_envelope
    assert context.relates_to is not None
    assert service.recorded() == ["a", "c"]
    # counted once the fault reply's transaction committed: the reply may be answered before that
    assert wait_for(lambda: server.engine.status().delivery_failures == 1), server.engine.status()


def test_a_client_fault_is_answered_at_once_not_retried(servers, clients):
    server = servers("memory:", fast_policy(max_delivery_attempts=3))
    answers, application = _collector()
    client = clients("memory:", application=application)
    build = Envelopes(server.url)
    receipts = [client.send(server.url, build("echo", text), action=action("echo"), expect_reply=True)
                for text in ["bad-x", "fail-y"]]

    assert wait_for(lambda: len(answers) >= 2), answers
    answers = _by_request(answers, receipts)
    assert [b"Client.BadItem" in envelope for envelope, _ in answers] == [True, False]
    # the request itself is wrong: one attempt; a server fault is retried up to the policy's limit
    assert service.CALLS == ["bad-x", "fail-y", "fail-y", "fail-y"]


def test_spyne_writes_no_answer_to_a_one_way_call_and_still_answers_a_request(clients):
    """A one-way call is answered 202 with no body (WS-I BP R2750): spyne's serialization of its
    empty answer would be thrown away, so it does not run; a request's answer still does."""
    from wsrm_plugin import reliable_service

    app = service.application()
    documents: list[str] = []
    app.event_manager.add_listener("method_return_document", lambda ctx: documents.append(ctx.method_name))
    server = reliable_service(app, "memory:", fast_policy())
    server.serve()
    server.start()
    try:
        answers, application = _collector()
        client = clients("memory:", application=application)
        build = Envelopes(server.url)
        for item in ["a", "b", "c"]:
            client.send(server.url, build("record", item), action=action("record"))
        client.send(server.url, build("echo", "q"), action=action("echo"), expect_reply=True)
        assert wait_for(lambda: len(answers) == 1 and len(service.recorded()) == 4), service.recorded()
        assert [_echo_text(envelope) for envelope, _ in answers] == ["re:q"]
        assert documents == ["echo"]  # written for the request only
    finally:
        server.stop(timeout=5)


def _in_sequence(server_url: str, body: bytes, identifier: str, number: int, *, reply_to: str | None,
                 operation: str) -> bytes:
    """``body`` (a zeep-built request) as message ``number`` of ``identifier``, as a foreign client sends it."""
    from wsrm_plugin.engine.envelopes import prepare_outgoing, stamp
    from wsrm_plugin.wire import RM11, SequenceHeader, SOAP11

    outgoing = prepare_outgoing(body, to=server_url, action=action(operation), message_id=None,
                                reply_to=reply_to, relates_to=None, wsa=RM11.addressing, max_size=1 << 20)
    return stamp(outgoing.payload, [SequenceHeader(identifier, number).to_xml(RM11, SOAP11)])


def test_a_request_no_reply_could_reach_is_refused_before_it_runs(servers, clients):
    """A sequence without an Offer, and an anonymous ReplyTo: the echo request's reply could
    reach nobody.  It is refused at once, unrecorded and not run (it used to run, and its reply
    was dropped with an ERROR); a one-way call, or the request with an addressable ReplyTo
    (answered on a sequence to it), still goes through."""
    from tests.engine.support import post
    from tests.engine.test_bad_input import open_sequence
    from wsrm_plugin.wire import RM11, SOAP11

    server = servers("memory:", fast_policy(rm_version="1.1"))
    answers, application = _collector()
    listener = clients("memory:", application=application)  # an addressable ReplyTo
    build = Envelopes(server.url)
    identifier = open_sequence(server.url, RM11)  # no Offer
    send = lambda n, op, text, reply_to=None: post(  # noqa: E731
        server.url, _in_sequence(server.url, build(op, text), identifier, n, reply_to=reply_to, operation=op),
        soap=SOAP11)

    assert send(1, "record", "first").status in (200, 202)
    refused = send(2, "echo", "q")
    fault = refused.fault()
    assert refused.status == 500 and fault.code == "Sender", refused.body
    assert "no reply could reach you" in fault.reason
    assert send(2, "echo", "q", reply_to=listener.endpoint_address).status in (200, 202)
    assert wait_for(lambda: len(answers) == 1)
    assert [_echo_text(envelope) for envelope, _ in answers] == ["re:q"]
    assert service.recorded() == ["first", "q"]  # the refused copy never ran


def test_a_source_whose_message_is_refused_for_good_faults_the_sequence_at_once(servers, clients):
    """A Sender fault answers every copy of the message the same: the client's sequence faults
    at once and hands the message to its fault hook, instead of sending it again and again."""
    server = servers("memory:", fast_policy())
    faults = []
    client = clients("memory:", on_sequence_fault=faults.append)
    build = Envelopes(server.url)
    client.send(server.url, build("record", "first"), action=action("record"))  # no Offer
    assert wait_for(lambda: service.recorded() == ["first"])
    client.send(server.url, build("echo", "q"), action=action("echo"))  # anonymous ReplyTo: refused
    assert wait_for(lambda: len(faults) == 1, timeout=15), client.status()
    assert "no reply could reach you" in faults[0].reason
    assert [m.number for m in faults[0].messages] == [2]  # kept, not dropped
    refusals = server.engine.inbound.faults_sent  # copies already in flight when it faulted
    time.sleep(1.0)  # many retransmission intervals of fast_policy
    assert server.engine.inbound.faults_sent == refusals  # no copy went after the fault
    assert service.recorded() == ["first"]
