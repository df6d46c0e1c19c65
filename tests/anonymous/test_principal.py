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
from wsrm_plugin.wire import RM11, SOAP11, WSA_2005_08, SequenceHeader, TerminateSequence, parse_envelope

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
