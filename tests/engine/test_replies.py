"""Request-reply over an offered sequence, reply callbacks, and what a failing service answers."""

from __future__ import annotations

import threading

import pytest
from lxml import etree

from wsrm_plugin.engine import ApplicationFault
from wsrm_plugin.wire import SOAP12, SoapFault, fault_envelope, parse_envelope, to_bytes

from .conftest import fast_policy
from .support import ACTION, Recorder, item_text, payload, wait_for

CALLBACK_REPLIES: list[tuple[str | None, bytes | None, str | None]] = []
_callback_lock = threading.Lock()


def on_reply(envelope: bytes, context, reply_context: bytes | None) -> None:
    """Imported by path ("tests.engine.test_replies:on_reply") by the client's invoker."""
    with _callback_lock:
        CALLBACK_REPLIES.append((item_text(envelope), reply_context, context.relates_to))


def echo_service(envelope: bytes, context) -> None:
    context.reply(payload("re:" + item_text(envelope)), action="urn:wsrm-engine-test:reply")


def _empty(engine) -> bool:
    status = engine.store.status()
    return not status.rms and not status.rmd


@pytest.mark.parametrize("rm_version", ["1.0", "1.1"])
def test_replies_come_back_on_the_offered_sequence(engines, store_for, rm_version):
    policy = fast_policy(rm_version=rm_version)
    server = engines(store_for("memory", "s"), policy, serve=True, application=echo_service, name="server")
    answers = Recorder()
    client = engines(store_for("memory", "c"), policy, serve=True, application=answers, name="client")
    target = server.endpoint_address
    receipts = [client.send(target, payload(f"q{i}"), action=ACTION, expect_reply=True) for i in range(5)]

    # replies are handed out as they arrive (RMPolicy.replies_in_order=False), each once
    assert wait_for(lambda: sorted(answers.snapshot()) == [f"re:q{i}" for i in range(5)]), answers.snapshot()
    # each answers its own request, whatever order they came in
    assert dict(zip(answers.snapshot(), (ctx.relates_to for ctx in answers.contexts))) == {
        f"re:q{i}": receipt.message_id for i, receipt in enumerate(receipts)}
    assert len({ctx.sequence_id for ctx in answers.contexts}) == 1

    client.close(target)
    # the request sequence ends, then the server ends the reply sequence it was offered
    assert wait_for(lambda: _empty(client) and _empty(server), timeout=30), (client.store.status(),
                                                                            server.store.status())


def test_reply_callback_gets_the_reply_instead_of_the_application(engines, store_for):
    server = engines(store_for("memory", "s"), serve=True, application=echo_service, name="server")
    application = Recorder()
    client = engines(store_for("sqlite", "c"), serve=True, application=application, name="client")
    receipt = client.send(server.endpoint_address, payload("ping"), action=ACTION,
                          reply_callback="tests.engine.test_replies:on_reply", reply_context=b"order-42")
    assert wait_for(lambda: ("re:ping", b"order-42", receipt.message_id) in CALLBACK_REPLIES)
    assert application.snapshot() == []


def test_expect_reply_without_an_endpoint_asks_for_the_back_channel(engines, store_for):
    """No endpoint: the reply is asked for with the anonymous ReplyTo (tests/anonymous covers the rest)."""
    from wsrm_plugin.wire import AddressingHeaders, parse_envelope

    client = engines(store_for("memory", "c"))
    receipt = client.send("http://127.0.0.1:9/", payload("x"), action=ACTION, expect_reply=True)
    with client.store.begin() as tx:
        stored = tx.rms_messages.find_by_message_id(receipt.message_id)
    reply_to = AddressingHeaders.from_header(parse_envelope(stored.payload).headers).reply_to
    assert reply_to is not None and reply_to.is_anonymous


def test_a_failing_service_answers_with_a_fault_on_the_reply_sequence(engines, store_for):
    failures = []
    server_app = Recorder(fail_on=lambda text: text == "bad")

    def service(envelope, context):
        try:
            server_app(envelope, context)
        except RuntimeError as exc:  # the service's declared fault (not a failure to process)
            raise ApplicationFault(to_bytes(fault_envelope(SoapFault(str(exc), code="Receiver"), SOAP12))) from exc
        echo_service(envelope, context)

    server = engines(store_for("memory", "s"), fast_policy(max_delivery_attempts=2), serve=True,
                     application=service, on_delivery_failure=failures.append, name="server")
    answers: list[tuple[bytes, object]] = []
    client = engines(store_for("memory", "c"), serve=True, application=lambda env, ctx: answers.append((env, ctx)),
                     name="client")
    target = server.endpoint_address
    sent = [client.send(target, payload(text), action=ACTION, expect_reply=True) for text in ("ok", "bad", "ok2")]

    assert wait_for(lambda: len(answers) == 3, timeout=30), answers
    position = {receipt.message_id: i for i, receipt in enumerate(sent)}  # replies come as they arrive
    answers.sort(key=lambda answer: position[answer[1].relates_to])
    assert [item_text(env) for env, _ in answers] == ["re:ok", None, "re:ok2"]
    envelope, context = answers[1]
    assert context.relates_to == sent[1].message_id
    fault = parse_envelope(envelope).fault()
    assert fault.code == "Receiver" and "refuses 'bad'" in fault.reason
    assert server_app.calls == 4  # ok, bad twice (each attempt rolled back), ok2
    assert server_app.snapshot() == ["ok", "ok2"]
    assert failures == []  # answered with a fault: nobody else needs telling


def test_a_declined_offer_faults_the_sequence_before_any_request_is_sent(engines, store_for):
    """A service that takes no offers answers CreateSequence without an Accept: the replies of
    the calls could never come back, so the client's sequence faults at once, its requests
    unsent and kept (the fault hook gets them), instead of the service running them and
    dropping every reply."""
    ran = Recorder()
    server = engines(store_for("memory", "s"), fast_policy(accept_offers=False), serve=True, application=ran,
                     name="server")
    faults = []
    client = engines(store_for("memory", "c"), serve=True, application=Recorder(), name="client",
                     on_sequence_fault=faults.append)
    receipts = [client.send(server.endpoint_address, payload(f"q{i}"), action=ACTION, expect_reply=True)
                for i in range(3)]
    # (a call enqueued after the first sequence faulted opens another, which is declined too)
    assert wait_for(lambda: sum(len(f.messages) for f in faults) == 3, timeout=15), client.status()
    assert all("declined the offered sequence" in f.reason for f in faults)
    assert sorted(m.message_id for f in faults for m in f.messages) == sorted(r.message_id for r in receipts)
    assert client.status().messages_sent == 0 and ran.snapshot() == []


def test_a_request_without_an_offer_is_answered_on_a_sequence_to_its_reply_to(engines):
    """CXF's clients include no Offer by default: a request to an addressable ReplyTo is then
    answered reliably on a sequence the service opens to that endpoint, not dropped."""
    from wsrm_plugin.wire import RM11, AddressingHeaders, EndpointReference, SequenceHeader, build_envelope
    from wsrm_plugin.wire import new_message_id as make_id

    from .support import NS, post
    from .test_bad_input import open_sequence

    server = engines("memory:", serve=True, application=echo_service, name="server")
    answers = Recorder()
    client = engines("memory:", serve=True, application=answers, name="client")
    url = server.endpoint_address
    identifier = open_sequence(url, RM11)  # no Offer
    request_ids = []
    for number in (1, 2):
        request_ids.append(make_id())
        wsa = RM11.addressing
        addressing = AddressingHeaders(to=url, action=ACTION, message_id=request_ids[-1],
                                       reply_to=EndpointReference(client.endpoint_address), version=wsa)
        item = etree.Element(f"{{{NS}}}item", nsmap={"t": NS})
        item.text = f"q{number}"
        body = to_bytes(build_envelope(SOAP12, [*addressing.to_elements(wsa, soap=SOAP12),
                                                SequenceHeader(identifier, number).to_xml(RM11, SOAP12)], item))
        assert post(url, body).status in (200, 202)
    assert wait_for(lambda: sorted(answers.snapshot()) == ["re:q1", "re:q2"], timeout=20), (answers.snapshot(),
                                                                                           server.status())
    answered = dict(zip(answers.snapshot(), (ctx.relates_to for ctx in answers.contexts), strict=True))
    assert answered == {"re:q1": request_ids[0], "re:q2": request_ids[1]}  # each answers its own request
    with server.store.begin() as tx:  # one sequence of the server's own carried both
        targets = [s.target for s in tx.rms.list_all()]
    assert targets == [client.endpoint_address]
