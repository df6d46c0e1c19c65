"""Interoperability with a WS-RM implementation the project did not write: gSOAP 2.8's plugin.

Both directions, WS-RM 1.1 and 1.0, real processes and real HTTP on 127.0.0.1:

* the gSOAP CLIENT sends to OUR spyne server (:func:`~interceptors.spyne_server.service.reliable_service`
  around a spyne service shaped like ``gsoap/echo.h``): every message must be
  acknowledged to gSOAP's satisfaction (its exit status, its acked count) and run
  by the spyne method exactly once, in order;
* OUR zeep client (:func:`~interceptors.zeep_client.client.reliable_client` over the WSDL
  the peer build produced) sends to the gSOAP SERVER: every message must be
  acknowledged (our source sequence terminated with nothing left unacknowledged)
  and delivered by gSOAP exactly once, in order; in-out ``Echo`` calls offer a
  sequence and get their answers back reliably on it.

What the peer does and the quirks it keeps are in ``gsoap/README.md``.  Waits
are generous and only guard against hangs; no assertion depends on timing.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.engine.support import wait_for
from interceptors.spyne_server.service import ReliableService, reliable_service
from wsrm_plugin.engine import RMPolicy, SendReceipt
from wsrm_plugin.tools.proxy import LossyProxy
from interceptors.zeep_client.client import ReliableClient, reliable_client

from . import interop_service as service
from .gsoap_peer import (
    WSRM_VERSIONS,
    GsoapServer,
    GsoapUnavailable,
    build_gsoap_peer,
    run_gsoap_client,
    unused_tcp_port,
)
from .local_schemas import gsoap_zeep_client

N = 20

#: Short retransmission intervals so a lost message is resent within the test; the
#: peer speaks WS-Addressing 2005/08 whatever the WS-RM version (README, quirks).
FAST = dict(base_retransmission_interval=0.3, exponential_backoff=False, poll_interval=0.05,
            http_timeout=10.0, wsa_version="2005/08")


@pytest.fixture(scope="module", params=WSRM_VERSIONS, ids=lambda v: f"wsrm{v}")
def version(request: pytest.FixtureRequest) -> str:
    """Each WS-RM version, the peer built once (a missing toolchain fails, it is not skipped)."""
    try:
        build_gsoap_peer(request.param)
    except GsoapUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    return request.param


def texts(count: int, tag: str) -> list[str]:
    """Distinct texts, some with characters both stacks must carry unharmed."""
    specials = ["tab\there", "new\nline", "back\\slash", "<xml & 'quotes'>", "ünïcødé €"]
    return [f"{tag}-{i:02d} {specials[i % len(specials)]}" for i in range(1, count + 1)]


# -- the gSOAP client -> our spyne server ----------------------------------------------------


@pytest.fixture
def spyne_server(version: str) -> Iterator[Callable[..., ReliableService]]:
    """``start(soap_version)``: our reliable spyne service for ``version``, served on loopback."""
    service.reset()
    started: list[ReliableService] = []

    def start(soap_version: str = "1.2") -> ReliableService:
        policy = RMPolicy(rm_version=version, soap_version=soap_version, **FAST)
        server = reliable_service(service.application(soap_version), "memory:", policy)
        started.append(server)
        server.serve()
        return server.start()

    yield start
    for server in started:
        server.stop(timeout=5)
    service.reset()


def assert_ran_once_in_order(sent: list[str], sequence: str | None, operation: str = "Note") -> None:
    runs = service.runs()
    assert [run.text for run in runs] == sent
    assert [run.number for run in runs] == list(range(1, len(sent) + 1))
    assert {run.sequence for run in runs} == {sequence}
    assert {run.operation for run in runs} == {operation}


def wait_until_released(server: ReliableService, sequence: str | None) -> None:
    """Our destination terminated ``sequence`` and handed every message over: nothing can run again."""
    def released() -> bool:
        store = server.engine.store.status()
        return store.buffered == 0 and all(seq.sequence_id != sequence for seq in store.rmd)
    assert server.engine.wait_until(lambda _: released(), timeout=60), server.engine.store.status()


@pytest.mark.parametrize(("acks", "soap_version"), [
    ("anonymous", "1.2"), ("anonymous", "1.1"), ("addressable", "1.2")])
def test_gsoap_client_notes_reach_the_spyne_method_exactly_once(version: str, spyne_server, acks: str,
                                                                soap_version: str) -> None:
    server = spyne_server(soap_version)
    sent = texts(N, f"{version}-{acks}-soap{soap_version}")
    acks_to = f"http://127.0.0.1:{unused_tcp_port()}/" if acks == "addressable" else None
    # With an addressable AcksTo the gSOAP client's listener waits out its read timeout on
    # our kept-alive ack connection before it lets its main thread on: keep that short.
    result = run_gsoap_client(version, server.url, sent, acks_to=acks_to, soap_version=soap_version,
                              request_timeout_s=3 if acks_to else 10)

    assert result.ok, result.stderr
    assert (result.sent, result.acked, result.unacked) == (N, N, ())
    assert (result.close, result.terminate) == ("ok", "ok")
    wait_until_released(server, result.sequence)
    assert_ran_once_in_order(sent, result.sequence)
    # the delivered counter moves after each delivery's commit, a moment after the application ran
    assert wait_for(lambda: server.engine.status().delivered == N), server.engine.status()
    status = server.engine.status()
    assert (status.delivered, status.delivery_failures, status.refused_sequences) == (N, 0, 0)


def test_gsoap_client_notes_sent_twice_run_once(version: str, spyne_server) -> None:
    """Every request reaches our server twice; each copy is acknowledged, each Note runs once.

    A seeded lossy mix would also drop gSOAP's CreateSequence or Close/Terminate,
    which gSOAP's client does not retry (it reports failure): duplication keeps the
    run deterministic.  The duplicated CreateSequence opens a second, empty
    sequence on our side (gSOAP's CreateSequence has no MessageID to recognise a
    repeat by); it is never used and expires with the inactivity timeout.
    """
    server = spyne_server("1.2")
    sent = texts(N, f"{version}-twice")
    with LossyProxy(server.url, duplicate=1.0, seed=7) as proxy:
        result = run_gsoap_client(version, proxy.url, sent)
        proxy.drain()
        stats = proxy.stats
    assert result.ok, result.stderr
    assert result.acked == N
    assert stats.duplicated == stats.received >= N + 3  # CreateSequence, N Notes, close, terminate
    wait_until_released(server, result.sequence)
    assert_ran_once_in_order(sent, result.sequence)
    assert wait_for(lambda: server.engine.status().delivered == N, timeout=15)  # counted after the commit
    assert all(seq.received == "" for seq in server.engine.store.status().rmd)  # only the unused twin


def test_gsoap_client_echo_with_offer_gets_each_spyne_answer(version: str, spyne_server) -> None:
    """In-out from gSOAP: it offers a sequence with an anonymous endpoint, so each answer
    must come back on the HTTP response of its request, numbered in the offered sequence."""
    server = spyne_server("1.2")
    sent = texts(5, f"{version}-echo")
    result = run_gsoap_client(version, server.url, sent, operation="Echo", offer=True)
    assert result.ok, result.stderr
    assert list(result.responses) == sent
    assert (result.sent, result.acked) == (5, 5)
    wait_until_released(server, result.sequence)
    assert_ran_once_in_order(sent, result.sequence, operation="Echo")


# -- our zeep client -> the gSOAP server -----------------------------------------------------


@pytest.fixture
def gsoap_server(version: str, tmp_path: Path) -> Iterator[GsoapServer]:
    with GsoapServer(version, workdir=tmp_path) as server:
        yield server


@pytest.fixture
def zeep_clients(version: str) -> Iterator[Callable[..., ReliableClient]]:
    """``make(address, listen=None, **policy)``: a started reliable zeep client of the peer's WSDL."""
    made: list[ReliableClient] = []

    def make(address: str, *, listen: bool = False, **policy: object) -> ReliableClient:
        peer = build_gsoap_peer(version)
        rm_policy = RMPolicy(rm_version=version, soap_version="1.1",  # the WSDL binds SOAP 1.1
                             **{**FAST, **policy})
        rc = reliable_client(gsoap_zeep_client(peer, address), "memory:", rm_policy,
                             key=f"interop-{version}", name=f"interop-{version}-{len(made)}",
                             listen=("127.0.0.1", 0) if listen else None)
        made.append(rc)
        return rc

    yield make
    for rc in reversed(made):
        rc.stop(timeout=5, discard_unsent=True)  # a test that needs everything sent flushes


def close_and_wait(rc: ReliableClient) -> None:
    """End our sequence: all acknowledged, then (1.1 Close and) Terminate, then purged."""
    assert rc.close() >= 1
    assert rc.engine.wait_until(lambda s: s.rms_sequences == 0, timeout=60), rc.engine.status()
    status = rc.engine.status()
    assert (status.unacked, status.faulted_sequences) == (0, 0), status


def assert_gsoap_delivered_once_in_order(server: GsoapServer, sent: list[str],
                                         operation: str = "Note") -> None:
    deliveries = server.deliveries()
    assert [d.text for d in deliveries] == sent, server.log()
    assert [d.number for d in deliveries] == list(range(1, len(sent) + 1))
    assert len({d.sequence for d in deliveries}) == 1
    assert {d.operation for d in deliveries} == {operation}


@pytest.mark.parametrize("acks", ["anonymous", "addressable"])
def test_zeep_client_notes_reach_gsoap_exactly_once(version: str, gsoap_server: GsoapServer,
                                                    zeep_clients, acks: str) -> None:
    # addressable: AcksTo is our client's own endpoint, where gSOAP sends its acks
    rc = zeep_clients(gsoap_server.url, listen=acks == "addressable", decoupled_acks=acks == "addressable")
    sent = texts(N, f"{version}-zeep-{acks}")
    receipts = [rc.service.Note(text=text) for text in sent]
    assert all(isinstance(r, SendReceipt) for r in receipts)
    assert [r.number for r in receipts] == list(range(1, N + 1))

    assert len(gsoap_server.wait_for_deliveries(N)) == N, gsoap_server.log()
    close_and_wait(rc)
    assert_gsoap_delivered_once_in_order(gsoap_server, sent)


def test_zeep_client_echo_with_offer_gets_each_answer_once(version: str, gsoap_server: GsoapServer,
                                                           zeep_clients) -> None:
    """In-out: the request sequence offers one for the answers, which gSOAP sends to our listener.

    (soapcpp2's WSDL gives Echo the soapAction ``.../EchoResponse``; zeep sends what the
    WSDL says and gSOAP, finding no operation for that action, dispatches on the body.)
    """
    rc = zeep_clients(gsoap_server.url, listen=True)
    sent = texts(5, f"{version}-echo")
    futures = [rc.service.Echo(text=text) for text in sent]
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)

    answers = [f.result(timeout=60) for f in futures]
    assert [answer.body.text for answer in answers] == sent
    assert rc.pending_futures() == 0
    close_and_wait(rc)
    assert_gsoap_delivered_once_in_order(gsoap_server, sent, operation="Echo")
    # each answer came on the offered sequence and was handed over exactly once
    assert wait_for(lambda: rc.engine.status().delivered == len(sent), timeout=15)  # counted after the commit


def test_zeep_client_through_a_lossy_network_delivers_each_note_once(version: str,
                                                                     gsoap_server: GsoapServer,
                                                                     zeep_clients) -> None:
    """Our source retransmits what the network ate; gSOAP acks duplicates and fills gaps in order."""
    with LossyProxy(gsoap_server.url, drop=0.15, drop_response=0.15, duplicate=0.1, seed=5) as proxy:
        rc = zeep_clients(proxy.url)
        sent = texts(N, f"{version}-zeep-lossy")
        for text in sent:
            rc.service.Note(text=text)
        assert len(gsoap_server.wait_for_deliveries(N)) == N, gsoap_server.log()
        # Close and Terminate go through the same loss: a retried Terminate that finds the
        # sequence gone is answered 202 by gSOAP 1.1, which must end it (it once did not).
        close_and_wait(rc)
        proxy.drain()  # second copies count once delivered
        stats = proxy.stats
    assert stats.dropped and stats.responses_dropped and stats.duplicated, f"too little was lost: {stats}"
    # The source saw the loss: a failed send, or a message sent again. (Which one
    # depends on timing: with parallel sends, an ack for a later message can cover
    # a message whose response was lost, so it need not be sent again.)
    status = rc.engine.status()
    assert status.retransmissions + status.send_failures > 0
    assert_gsoap_delivered_once_in_order(gsoap_server, sent)
