"""The HTTP-authenticated principal reaches the engine through the spyne chain (issue 4)."""

from __future__ import annotations

import base64
import http.client
from urllib.parse import urlsplit

import pytest

from interceptors.spyne_server.service import reliable_service
from tests.engine.support import wait_for
from tests.spyne_server.conftest import Envelopes
from wsrm_plugin.engine import BasicAuth, HttpServer, HttpTransport, ReliableEngine
from wsrm_plugin.engine.envelopes import prepare_outgoing, protocol_message, stamp
from wsrm_plugin.wire import (
    RM11, SOAP11, SOAP12, WSA_2005_08, AckRequested, AddressingHeaders, CloseSequence, CloseSequenceResponse,
    SequenceAcknowledgement, SequenceHeader, SequenceTerminated, TerminateSequence, TerminateSequenceResponse,
    fault_envelope, new_message_id, parse_envelope, to_bytes,
)

from . import service
from .conftest import fast_policy

USERS = {"alice": "alice-pw", "bob": "bob-pw"}


class _AuthenticatedPosts:
    """Basic auth on POSTs; the WSDL (GET) stays public so clients can be built from it."""

    def __init__(self, app):
        self.app = app
        self.auth = BasicAuth(app, USERS)

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") == "GET":
            return self.app(environ, start_response)
        return self.auth(environ, start_response)


@pytest.fixture
def secured():
    server = reliable_service(service.application(), "memory:", fast_policy())
    http = HttpServer(_AuthenticatedPosts(server.wsgi_app)).start()
    server.engine.endpoint_address = http.url
    server.start()
    yield server
    http.stop(timeout=5)
    server.stop(timeout=5)


def _post(url: str, user: str, body: bytes) -> tuple[int, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    token = base64.b64encode(f"{user}:{USERS[user]}".encode()).decode()
    try:
        conn.request("POST", parts.path or "/", body=body, headers={
            "Content-Type": "text/xml; charset=utf-8", "Authorization": f"Basic {token}",
            "SOAPAction": '""'})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_a_sequence_takes_messages_and_terminate_only_from_its_creator(secured):
    url = secured.url
    alice = ReliableEngine("memory:", fast_policy(), name="alice",
                           transport=HttpTransport(timeout=10, auth=("alice", USERS["alice"])))
    alice.start()
    try:
        build = Envelopes(url)
        for text in ("a1", "a2"):
            alice.send(url, build("note", text), action=f"{service.TNS}/note")
        assert wait_for(lambda: service.RAN["a1"] == 1 and service.RAN["a2"] == 1)
        assert wait_for(lambda: alice.status().unacked == 0)
        with secured.engine.store.begin() as tx:
            [sequence] = tx.rmd.list_all()
        assert sequence.principal == "alice"

        # bob writes into alice's sequence: refused as unknown to him, nothing delivered
        stored = prepare_outgoing(build("note", "intruder"), to=url, action=f"{service.TNS}/note",
                                  message_id=None, reply_to=None, relates_to=None, wsa=WSA_2005_08,
                                  max_size=1 << 20)
        message = stamp(stored.payload, [SequenceHeader(sequence.sequence_id, 3).to_xml(RM11, SOAP11)])
        status, body = _post(url, "bob", message)
        assert status == 500
        assert parse_envelope(body).fault().fault_code == "UnknownSequence"

        # bob terminates alice's sequence: refused the same way, the sequence lives on
        terminate = protocol_message(SOAP11, WSA_2005_08, to=url, action=RM11.terminate_sequence_action,
                                     body=TerminateSequence(sequence.sequence_id, 2).to_xml(RM11),
                                     reply_to=WSA_2005_08.anonymous)
        status, body = _post(url, "bob", terminate)
        assert parse_envelope(body).fault().fault_code == "UnknownSequence"
        with secured.engine.store.begin() as tx:
            assert not tx.rmd.get(sequence.sequence_id).terminated

        # the same message from alice herself is taken
        status, body = _post(url, "alice", message)
        assert status in (200, 202)
        assert wait_for(lambda: service.RAN["intruder"] == 1)
    finally:
        alice.stop(timeout=5)


def _rm_fault(status: int, body: bytes) -> str:
    """The WS-RM fault code of a SOAP 1.1 fault answer (HTTP 500), else what came instead."""
    if status != 500 or not body:
        return f"HTTP {status}"
    fault = parse_envelope(body).fault()
    return getattr(fault, "fault_code", None) or fault.code


def test_a_stranger_cannot_acknowledge_close_terminate_or_fault_anothers_sequences(secured):
    """Issue 10, item 4: bob, authenticated too, aims every sequence-naming message at alice's
    request sequence and at the reply sequence she was offered: each is refused with
    UnknownSequence (to him they do not exist), nothing of hers changes, her calls all complete."""
    url = secured.url
    replies: list[bytes] = []
    alice = ReliableEngine("memory:", fast_policy(), name="alice", application=lambda env, ctx: replies.append(env),
                           transport=HttpTransport(timeout=10, auth=("alice", USERS["alice"])))
    alice.start()
    try:
        build = Envelopes(url)
        alice.send(url, build("echo", "a1"), action=f"{service.TNS}/echo", expect_reply=True)
        assert wait_for(lambda: service.RAN["a1"] == 1 and len(replies) == 1)
        with secured.engine.store.begin() as tx:
            [request] = tx.rmd.list_all()
            [reply] = [s for s in tx.rms.list_all() if s.sequence_id == request.offered_id]
        assert request.principal == "alice" and reply.sequence_id

        def send(action: str, body=None, headers=()) -> tuple[int, bytes]:
            message = protocol_message(SOAP11, WSA_2005_08, to=url, action=action, body=body,
                                       headers=list(headers), reply_to=WSA_2005_08.anonymous)
            return _post(url, "bob", message)

        refused = []
        for sequence_id in (request.sequence_id, reply.sequence_id):
            attempts = {
                "SequenceAcknowledgement": send(RM11.sequence_acknowledgement_action, headers=[
                    SequenceAcknowledgement(sequence_id, [(1, 1)]).to_xml(RM11, SOAP11)]),
                "AckRequested": send(RM11.action("AckRequested"), headers=[
                    AckRequested(sequence_id).to_xml(RM11, SOAP11)]),
                "CloseSequence": send(RM11.action("CloseSequence"), CloseSequence(sequence_id).to_xml(RM11)),
                "TerminateSequence": send(RM11.terminate_sequence_action,
                                          TerminateSequence(sequence_id).to_xml(RM11)),
                "CloseSequenceResponse": send(RM11.action("CloseSequenceResponse"),
                                              CloseSequenceResponse(sequence_id).to_xml(RM11)),
                "TerminateSequenceResponse": send(RM11.action("TerminateSequenceResponse"),
                                                  TerminateSequenceResponse(sequence_id).to_xml(RM11)),
            }
            for kind, (status, body) in attempts.items():
                refused.append((kind, sequence_id == reply.sequence_id, _rm_fault(status, body)))
            # a WS-RM fault "from the destination" that would end alice's reply sequence
            fault = to_bytes(fault_envelope(SequenceTerminated(sequence_id, "bob says so", version=RM11), SOAP11,
                                            AddressingHeaders(to=url, action=RM11.fault_action,
                                                              message_id=new_message_id(), version=WSA_2005_08)
                                            .to_elements(WSA_2005_08, soap=SOAP11)))
            status, body = _post(url, "bob", fault)
            refused.append(("SequenceTerminated fault", sequence_id == reply.sequence_id, _rm_fault(status, body)))
        assert refused == [(kind, on_reply, "UnknownSequence") for kind, on_reply, _ in refused]
        assert len(refused) == 14

        with secured.engine.store.begin() as tx:
            mine = tx.rmd.get(request.sequence_id)
            theirs = tx.rms.get(reply.key)
        assert not (mine.closed or mine.terminated)
        assert not (theirs.faulted or theirs.closed or theirs.terminate_sent)

        # alice's sequences work on: her next call runs once and its reply reaches her
        alice.send(url, build("echo", "a2"), action=f"{service.TNS}/echo", expect_reply=True)
        assert wait_for(lambda: service.RAN["a2"] == 1 and len(replies) == 2)
        assert wait_for(lambda: alice.status().unacked == 0)
        assert service.RAN["a1"] == 1 and service.RAN["a2"] == 1
        assert [b"re:a1" in r for r in replies] == [True, False] and b"re:a2" in replies[1]
    finally:
        alice.stop(timeout=5)


def test_make_connection_hands_a_peers_parked_replies_to_that_peer_only():
    """WS-MakeConnection (issue 10, item 4): bob polling alice's WS-MC address gets nothing (202, as
    when nothing waits) and takes nothing; alice's own poll gets her reply."""
    from tests.engine.support import item_text, payload
    from wsrm_plugin.makeconnection import Mailbox, mc_address_for
    from wsrm_plugin.wire import MakeConnection
    from wsrm_plugin.wire.namespaces import MAKE_CONNECTION_ACTION, mc_anonymous_id

    def echo(envelope: bytes, context) -> None:
        context.reply(payload("re:" + item_text(envelope)), action="urn:wsrm-engine-test:reply")

    mailbox = Mailbox()
    server = ReliableEngine("memory:", fast_policy(soap_version="1.2"), application=echo, name="mc-server",
                            transport=mailbox.transport(HttpTransport(timeout=5.0)))
    mailbox.owner_of = server.destination.owner_of
    server.serve(middleware=lambda app: BasicAuth(mailbox.middleware(app), USERS))
    server.start()
    address = mc_address_for("alice")
    alice = ReliableEngine("memory:", fast_policy(soap_version="1.2"), name="alice", endpoint_address=address,
                           transport=HttpTransport(timeout=10, auth=("alice", USERS["alice"])))
    alice.start()
    try:
        url = server.endpoint_address
        alice.send(url, payload("a1"), action="urn:wsrm-engine-test:deliver", expect_reply=True)
        mc_id = mc_anonymous_id(address)
        assert wait_for(lambda: mailbox.pending(mc_id) >= 1)

        def poll(user: str) -> tuple[int, bytes]:
            message = protocol_message(SOAP12, WSA_2005_08, to=url, action=MAKE_CONNECTION_ACTION,
                                       body=MakeConnection(address).to_xml())
            parts = urlsplit(url)
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
            token = base64.b64encode(f"{user}:{USERS[user]}".encode()).decode()
            try:
                conn.request("POST", parts.path or "/", body=message, headers={
                    "Content-Type": "application/soap+xml; charset=utf-8", "Authorization": f"Basic {token}"})
                response = conn.getresponse()
                return response.status, response.read()
            finally:
                conn.close()

        assert poll("bob") == (202, b"")
        assert mailbox.pending(mc_id) >= 1  # still there for alice
        status, body = poll("alice")
        assert status == 200 and b"re:a1" in body
    finally:
        alice.stop(timeout=5)
        server.stop(timeout=5)
