"""Each message is parsed once along the chain: by the spyne side when it arrives, not again by the
engine, the chain's response, or the delivery; the zeep side hands its tree to the engine, whose
first transmission uses it.

Parses are counted where every safe parse happens (the per-thread lxml parser of
:mod:`wsrm_plugin.wire.xmlsafe`).  Per one-way call over the back-channel: the server
parses the request once (HTTP in), the client parses the HTTP response carrying the
acknowledgement once; spyne's own parse of the request it runs is not ours to count.
Before the change it was 8 per call (164 for 20; server: HTTP in, engine, acknowledgement
response, delivery, spyne's empty one-way answer; client: enqueue, first transmission,
acknowledgement); after, 2 (42 for 20).
"""

from __future__ import annotations

import collections
import threading

from tests.engine.support import wait_for
from wsrm_plugin.wire import xmlsafe

from . import service

CALLS = 20


def _count_parses(monkeypatch) -> collections.Counter[str]:
    """XML parses from now on, by thread name (every parse takes ``xmlsafe._parser``)."""
    parses: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    real_parser = xmlsafe._parser

    def counting_parser():
        with lock:
            parses[threading.current_thread().name] += 1
        return real_parser()

    monkeypatch.setattr(xmlsafe, "_parser", counting_parser)
    return parses


def test_one_parse_per_message_on_each_side(servers, clients, monkeypatch):
    server = servers()
    rc = clients(server.url)
    rc.service.echo("warm-up").result(timeout=60)  # the sequences exist; what follows is steady state
    assert wait_for(lambda: server.engine.status().unacked == 0 and rc.engine.status().unacked == 0)

    parses = _count_parses(monkeypatch)
    for i in range(CALLS):
        rc.service.note(f"n{i}")
    assert wait_for(lambda: all(service.RAN[f"n{i}"] == 1 for i in range(CALLS)), timeout=60), service.RAN
    assert wait_for(lambda: rc.engine.status().unacked == 0, timeout=60)
    monkeypatch.undo()

    total = sum(parses.values())
    # two per call (the request on the server, the response on the client); a little slack for
    # an acknowledgement on its own, or a delivery that ran before its tree was filed
    assert total <= 2.5 * CALLS, f"{total} parses for {CALLS} calls: {dict(parses)}"
    assert total >= CALLS, dict(parses)  # the counter counts: every request is parsed at least once
    print(f"{total} parses for {CALLS} calls: {dict(parses)}")


def test_a_reply_is_parsed_once_on_its_way_to_the_caller_and_not_again_by_the_service(servers, clients, monkeypatch):
    # per sequential request-reply call, on the client: the response carrying the reply once, by
    # the engine (it read it for its acknowledgements, hands that read on to record the reply, and
    # zeep's reading of the result takes its tree: 3 parses, then 2, before); on the server (its
    # threads are waitress's): the request as it arrives, nothing else -- spyne hands over its
    # answer's tree unwritten, which is stored and stamped for the response without a parse (3
    # before: spyne's written answer, the reply's bytes to be stored and the stamped response
    # were each parsed again; then 2: spyne's written answer)
    server = servers()
    rc = clients(server.url)
    rc.service.echo("warm-up").result(timeout=60)
    assert wait_for(lambda: server.engine.status().unacked == 0 and rc.engine.status().unacked == 0)
    parses = _count_parses(monkeypatch)
    for i in range(CALLS):
        assert rc.service.echo(f"e{i}").result(timeout=60) is not None
    monkeypatch.undo()
    client = sum(n for thread, n in parses.items() if not thread.startswith("waitress"))
    server = sum(n for thread, n in parses.items() if thread.startswith("waitress"))
    assert client <= 1.5 * CALLS, f"{client} parses on the client for {CALLS} calls: {dict(parses)}"
    assert client >= CALLS, dict(parses)  # the counter counts
    assert server <= 1.5 * CALLS, f"{server} parses on the server for {CALLS} calls: {dict(parses)}"
    assert server >= CALLS, dict(parses)


def test_the_service_reads_a_requests_ws_addressing_headers_once_and_never_its_replys(servers, clients, monkeypatch):
    # per sequential request-reply call on the server: the request's WS-A headers as it arrives
    # (the delivery on receipt takes that read with the request's tree), and none of the reply's,
    # which its front end wrote (3 before: the delivery read the request's again, and the reply's
    # enqueue read back what the addressing interceptor had just written)
    from wsrm_plugin.wire.addressing import AddressingHeaders

    server = servers()
    rc = clients(server.url)
    rc.service.echo("warm-up").result(timeout=60)
    assert wait_for(lambda: server.engine.status().unacked == 0 and rc.engine.status().unacked == 0)
    reads: collections.Counter[str] = collections.Counter()
    real = AddressingHeaders.from_header.__func__

    def counting(cls, header_elements):
        elements = list(header_elements)
        if elements:  # an envelope with headers to read (an answer spyne built has none)
            reads[threading.current_thread().name] += 1
        return real(cls, elements)

    monkeypatch.setattr(AddressingHeaders, "from_header", classmethod(counting))
    for i in range(CALLS):
        assert rc.service.echo(f"a{i}").result(timeout=60) is not None
    monkeypatch.undo()
    server_reads = sum(n for thread, n in reads.items() if thread.startswith("waitress"))
    assert CALLS <= server_reads <= 1.5 * CALLS, f"{server_reads} reads on the server for {CALLS} calls: {dict(reads)}"


def test_the_client_builds_no_answer_for_a_reply_it_read_from_a_response(servers, clients, monkeypatch):
    # per sequential request-reply call the client writes one acknowledgement of the replies:
    # the one its next request carries; the HTTP response that brought the reply has no answer
    # to send, so none is built for it (2 before: an acknowledgement envelope, then dropped)
    from wsrm_plugin.engine import retransmission
    from wsrm_plugin.wire.rm import SequenceAcknowledgement

    server = servers()
    rc = clients(server.url)
    rc.service.echo("warm-up").result(timeout=60)  # its reply's acknowledgement is posted alone
    assert wait_for(lambda: server.engine.status().unacked == 0 and rc.engine.status().unacked == 0)
    # from now on every reply's acknowledgement rides on the next request however slow a loaded
    # machine makes the caller (else the sender posts it on its own after 50 ms: one more written)
    monkeypatch.setattr(retransmission, "_REPLY_ACK_WAIT", 60.0)
    written: collections.Counter[str] = collections.Counter()
    real = SequenceAcknowledgement.to_xml

    def counting(self, *args, **kwargs):
        written[threading.current_thread().name] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SequenceAcknowledgement, "to_xml", counting)
    for i in range(CALLS):
        assert rc.service.echo(f"w{i}").result(timeout=60) is not None
    monkeypatch.setattr(SequenceAcknowledgement, "to_xml", real)
    client = sum(n for thread, n in written.items() if not thread.startswith("waitress"))
    # whoever sends a request (its caller, or the sender when the caller could not) writes the
    # acknowledgement it carries: every request but the first (the warm-up's went alone)
    assert CALLS - 1 <= client <= CALLS, f"{client} acknowledgements written on the client for {CALLS} calls: " \
        f"{dict(written)}"


def test_a_one_way_call_reads_its_envelopes_once_each(servers, clients, monkeypatch):
    """The spyne side reads a received envelope (its header blocks and body) before the chain runs,
    and the WS-RM interceptor, which changes nothing, hands that reading to the engine: one reading
    per one-way call in the server's HTTP threads (fails without: two, the engine read it again).
    The client writes the request's WS-A headers and the Sequence header into its bytes, and
    reads the response with its acknowledgement from its bytes, reading no envelope a call
    (fails without: two a call; three before the transmission was handed the request's tree)."""
    from wsrm_plugin.wire.soap import Envelope

    server = servers()
    rc = clients(server.url)
    rc.service.echo("warm-up").result(timeout=60)
    assert wait_for(lambda: server.engine.status().unacked == 0 and rc.engine.status().unacked == 0)
    reads: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    real = Envelope.from_element

    def counting(root):
        with lock:
            reads[threading.current_thread().name.rstrip("0123456789-")] += 1
        return real(root)

    monkeypatch.setattr(Envelope, "from_element", staticmethod(counting))
    for i in range(CALLS):
        rc.service.note(f"r{i}")
    assert wait_for(lambda: all(service.RAN[f"r{i}"] == 1 for i in range(CALLS)), timeout=60), service.RAN
    monkeypatch.undo()
    # a little slack for an acknowledgement on its own
    assert CALLS <= reads["waitress"] <= 1.25 * CALLS, dict(reads)
    client = sum(n for thread, n in reads.items() if thread != "waitress")
    # the client writes its WS-A headers from pieces (read once, from the first envelope of a
    # shape) and reads the acknowledgement from the bytes of its pieces (fails without: two a call)
    assert client <= 0.25 * CALLS, dict(reads)
