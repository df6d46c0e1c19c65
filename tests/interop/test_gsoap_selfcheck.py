"""Self-check of the gSOAP WS-RM peer: gSOAP client -> gSOAP server, then the server alone.

Before the project is tested against the peer, the peer must be shown to work with
itself: every message acknowledged, every message delivered exactly once and in
order, duplicates acknowledged but not delivered, a message after a gap held back
until the gap is filled.  The raw-HTTP tests also pin down the wire shape the
project's side will meet (see gsoap/README.md).
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from lxml import etree

from tests.interop.gsoap_peer import (
    ACTION_NOTE,
    NAMESPACE,
    WSA_NAMESPACE,
    WSRM_NAMESPACE,
    WSRM_VERSIONS,
    GsoapServer,
    GsoapUnavailable,
    build_gsoap_peer,
    run_gsoap_client,
    unused_tcp_port,
)

SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
ANONYMOUS = WSA_NAMESPACE + "/anonymous"
SAFE_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)


@pytest.fixture(scope="module", params=WSRM_VERSIONS, ids=lambda v: f"wsrm{v}")
def version(request: pytest.FixtureRequest) -> str:
    """Each WS-RM version, built once (a missing toolchain fails, it is not skipped)."""
    try:
        build_gsoap_peer(request.param)
    except GsoapUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    return request.param


def texts(count: int, tag: str) -> list[str]:
    """Distinct texts, some with characters the peer must carry unharmed."""
    specials = ["tab\there", "new\nline", "back\\slash", "<xml & 'quotes'>", "ünïcødé €"]
    return [f"{tag}-{i:02d} {specials[i % len(specials)]}" for i in range(1, count + 1)]


def assert_delivered_once_in_order(server: GsoapServer, sent: list[str], sequence: str | None,
                                   operation: str = "Note") -> None:
    deliveries = server.deliveries()
    assert [d.text for d in deliveries] == sent, server.log()
    assert [d.number for d in deliveries] == list(range(1, len(sent) + 1))
    assert {d.sequence for d in deliveries} == {sequence}
    assert {d.operation for d in deliveries} == {operation}


# -- gSOAP client -> gSOAP server -------------------------------------------------------


@pytest.mark.parametrize("acks", ["anonymous", "addressable"])
def test_twenty_notes_all_acknowledged_and_delivered_once(version: str, acks: str,
                                                          tmp_path: Path) -> None:
    sent = texts(20, f"{version}-{acks}")
    acks_to = f"http://127.0.0.1:{unused_tcp_port()}/" if acks == "addressable" else None
    with GsoapServer(version, workdir=tmp_path) as server:
        result = run_gsoap_client(version, server.url, sent, acks_to=acks_to)
        assert result.ok, result.stderr
        assert (result.sent, result.acked, result.unacked) == (20, 20, ())
        assert (result.close, result.terminate) == ("ok", "ok")
        assert_delivered_once_in_order(server, sent, result.sequence)


def test_echo_with_offer_in_soap11(version: str, tmp_path: Path) -> None:
    sent = texts(5, f"{version}-echo")
    with GsoapServer(version, workdir=tmp_path) as server:
        result = run_gsoap_client(version, server.url, sent, operation="Echo", offer=True,
                                  soap_version="1.1")
        assert result.ok, result.stderr
        assert list(result.responses) == sent
        assert_delivered_once_in_order(server, sent, result.sequence, operation="Echo")


class ResponseDroppingProxy:
    """TCP proxy that loses the reply to the first transmission of every 3rd Note.

    The server gets and accepts the message; the client sees the connection drop,
    retransmits, and the server must acknowledge the duplicate without delivering it
    again.  The gSOAP server closes every connection after one reply, so one
    connection carries one request.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.dropped: list[int] = []
        self._seen: set[int] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/"
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._stopping = threading.Event()

    def __enter__(self) -> ResponseDroppingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        self._listener.close()

    def _accept_loop(self) -> None:
        self._listener.settimeout(0.1)  # to notice _stopping
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        request = bytearray()
        with client, socket.create_connection(("127.0.0.1", self.target_port)) as upstream:
            def forward_request() -> None:
                with contextlib.suppress(OSError):  # the relay may close first
                    while chunk := client.recv(65536):
                        request.extend(chunk)
                        upstream.sendall(chunk)

            threading.Thread(target=forward_request, daemon=True).start()
            response = bytearray()
            while chunk := upstream.recv(65536):
                response.extend(chunk)
            match = re.search(rb"<wsrm:MessageNumber>(\d+)</wsrm:MessageNumber>", bytes(request))
            is_note = ACTION_NOTE.encode() in request
            number = int(match.group(1)) if match and is_note else None
            if number is not None and number % 3 == 0 and number not in self._seen:
                self._seen.add(number)
                self.dropped.append(number)
                client.shutdown(socket.SHUT_RDWR)  # the reply is lost: EOF now, not at a timeout
                return
            if number is not None:
                self._seen.add(number)
            client.sendall(response)


def test_lost_replies_cause_duplicates_that_are_acked_not_delivered(version: str,
                                                                  tmp_path: Path) -> None:
    sent = texts(20, f"{version}-lossy")
    with GsoapServer(version, workdir=tmp_path) as server, \
            ResponseDroppingProxy(server.port) as proxy:
        result = run_gsoap_client(version, proxy.url, sent, retry_ms=50)
        assert result.ok, result.stderr + server.log()
        assert result.acked == 20
        assert_delivered_once_in_order(server, sent, result.sequence)
        assert proxy.dropped == [3, 6, 9, 12, 15, 18]
        duplicates = re.findall(r"Note \S+#(\d+) not delivered", server.log())
        assert sorted(map(int, duplicates)) == proxy.dropped


# -- the server on its own, over raw HTTP ------------------------------------------------


class RawSource:
    """Just enough of a WS-RM source, over http.client, to send what gSOAP's client never
    would (gaps, duplicates, no sequence).  SOAP 1.2, WS-Addressing 2005/08."""

    def __init__(self, url: str, version: str) -> None:
        self.url = url
        self.rm = WSRM_NAMESPACE[version]
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port

    def envelope(self, action: str, body: etree._Element | None,
                 sequence: tuple[str, int] | None = None) -> bytes:
        nsmap = {"s": SOAP12, "wsa": WSA_NAMESPACE, "wsrm": self.rm, "ns": NAMESPACE}
        env = etree.Element(f"{{{SOAP12}}}Envelope", nsmap=nsmap)
        header = etree.SubElement(env, f"{{{SOAP12}}}Header")
        etree.SubElement(header, f"{{{WSA_NAMESPACE}}}Action").text = action
        etree.SubElement(header, f"{{{WSA_NAMESPACE}}}To").text = self.url
        etree.SubElement(header, f"{{{WSA_NAMESPACE}}}MessageID").text = f"urn:uuid:{uuid.uuid4()}"
        reply_to = etree.SubElement(header, f"{{{WSA_NAMESPACE}}}ReplyTo")
        etree.SubElement(reply_to, f"{{{WSA_NAMESPACE}}}Address").text = ANONYMOUS
        if sequence is not None:
            identifier, number = sequence
            seq = etree.SubElement(header, f"{{{self.rm}}}Sequence")
            etree.SubElement(seq, f"{{{self.rm}}}Identifier").text = identifier
            etree.SubElement(seq, f"{{{self.rm}}}MessageNumber").text = str(number)
            ack_requested = etree.SubElement(header, f"{{{self.rm}}}AckRequested")
            etree.SubElement(ack_requested, f"{{{self.rm}}}Identifier").text = identifier
        body_el = etree.SubElement(env, f"{{{SOAP12}}}Body")
        if body is not None:
            body_el.append(body)
        return etree.tostring(env, xml_declaration=True, encoding="utf-8")

    def post(self, action: str, payload: bytes) -> tuple[int, etree._Element | None]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request("POST", "/", body=payload, headers={
                "Content-Type": f'application/soap+xml; charset=utf-8; action="{action}"'})
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        return response.status, etree.fromstring(data, SAFE_PARSER) if data.strip() else None

    def create_sequence(self) -> str:
        body = etree.Element(f"{{{self.rm}}}CreateSequence")
        acks_to = etree.SubElement(body, f"{{{self.rm}}}AcksTo")
        etree.SubElement(acks_to, f"{{{WSA_NAMESPACE}}}Address").text = ANONYMOUS
        action = self.rm + "/CreateSequence"
        status, reply = self.post(action, self.envelope(action, body))
        assert status == 200 and reply is not None
        return reply.findtext(f".//{{{self.rm}}}CreateSequenceResponse/{{{self.rm}}}Identifier")

    def note(self, identifier: str | None, number: int, text: str) -> tuple[int, etree._Element | None]:
        body = etree.Element(f"{{{NAMESPACE}}}Note")
        etree.SubElement(body, f"{{{NAMESPACE}}}text").text = text
        sequence = (identifier, number) if identifier is not None else None
        return self.post(ACTION_NOTE, self.envelope(ACTION_NOTE, body, sequence))

    def acked_ranges(self, reply: etree._Element | None) -> list[tuple[int, int]]:
        assert reply is not None, "expected a SequenceAcknowledgement on the back-channel"
        return [(int(r.get("Lower")), int(r.get("Upper")))
                for r in reply.iterfind(f".//{{{self.rm}}}AcknowledgementRange")]


@pytest.fixture
def held_server(version: str, tmp_path: Path) -> Iterator[GsoapServer]:
    # A long hold so the gap is surely filled in time on a busy machine.
    with GsoapServer(version, workdir=tmp_path, hold_ms=60000) as server:
        yield server


def test_message_after_a_gap_is_held_until_the_gap_fills(version: str,
                                                        held_server: GsoapServer) -> None:
    source = RawSource(held_server.url, version)
    identifier = source.create_sequence()
    second: dict[str, object] = {}
    sender = threading.Thread(target=lambda: second.update(reply=source.note(identifier, 2, "second")))
    sender.start()
    # Send #1 only once the server has #2 in hand (and is holding it).
    assert log_shows(held_server, rf"received Note {re.escape(identifier)}#2\b"), held_server.log()
    assert held_server.deliveries() == []
    status, first_reply = source.note(identifier, 1, "first")
    sender.join(timeout=120)
    assert status == 200
    # #2 may be accepted between #1's acceptance and #1's reply
    assert source.acked_ranges(first_reply) in ([(1, 1)], [(1, 2)])
    status2, second_reply = second["reply"]  # type: ignore[misc]
    assert status2 == 200 and source.acked_ranges(second_reply) == [(1, 2)]
    assert [(d.number, d.text) for d in held_server.deliveries()] == [(1, "first"), (2, "second")]

    # A duplicate: acknowledged on the back-channel, not delivered again.
    status, dup_reply = source.note(identifier, 1, "first")
    assert status == 200 and source.acked_ranges(dup_reply) == [(1, 2)]
    assert len(held_server.deliveries()) == 2


def log_shows(server: GsoapServer, pattern: str, attempts: int = 1200) -> bool:
    """Poll the server log for ``pattern`` (the bound only guards against a hang)."""
    for _ in range(attempts):
        if re.search(pattern, server.log()):
            return True
        time.sleep(0.05)
    return False


def test_message_without_a_sequence_is_refused_with_wsrm_required(version: str,
                                                                 held_server: GsoapServer) -> None:
    source = RawSource(held_server.url, version)
    status, reply = source.note(None, 0, "no sequence")
    assert status >= 400 and reply is not None
    subcodes = [el.text for el in reply.iter(f"{{{SOAP12}}}Value")]
    assert any(code and code.endswith(":WSRMRequired") for code in subcodes), etree.tostring(reply)
    assert held_server.deliveries() == []
