"""Dual channel, anonymous (back-channel acks, no listener) and WS-MakeConnection polling."""

from __future__ import annotations

import pytest
import zeep

from tests.engine.support import wait_for
from wsrm_plugin.engine import HttpTransport, ReliableEngine
from wsrm_plugin.makeconnection import Mailbox
from wsrm_plugin.wire.namespaces import WSMC_ANONYMOUS_PREFIX
from interceptors.zeep_client.client import reliable_client

from . import service
from .conftest import fast_policy


@pytest.fixture
def mc_server():
    """The spyne service's engine with a MakeConnection mailbox in front and behind."""
    service.reset()
    receiver = service.SpyneReceiver()
    mailbox = Mailbox()
    engine = ReliableEngine("memory:", fast_policy(), application=receiver, name="mc-server",
                            transport=mailbox.transport(HttpTransport(timeout=5.0)))
    engine.serve(middleware=lambda app: receiver.middleware(mailbox.middleware(app)))
    engine.start()
    yield engine, mailbox
    engine.stop(timeout=5)


def test_anonymous_client_gets_acks_on_the_back_channel(clients, server):
    rc = clients(key="anon")
    assert rc.listener_address is None
    for i in range(3):
        rc.service.record(f"a{i}")
    assert wait_for(lambda: service.RECEIVED == ["a0", "a1", "a2"])
    assert wait_for(lambda: rc.engine.status().unacked == 0)  # acks came back on the HTTP responses
    # (in-out calls without a listener get their replies on the back-channel: tests/anonymous)


def test_dual_channel_client_takes_decoupled_acks_and_replies_on_its_listener(clients, server):
    rc = clients(listen=("127.0.0.1", 0), policy=fast_policy(decoupled_acks=True))
    assert rc.listener_address.startswith("http://127.0.0.1:")
    rc.service.record("dual")
    assert rc.service.echo("dual").result(timeout=30) == "re:dual"
    assert wait_for(lambda: rc.engine.status().unacked == 0)
    with rc.engine.store.begin() as tx:
        seqs = tx.rms.list_all()
    assert seqs and all(s.acks_to == rc.listener_address for s in seqs)
    assert rc.close() >= 1
    assert wait_for(lambda: not rc.engine.store.status().rms and not server.store.status().rmd)


def test_make_connection_polling_delivers_replies_to_a_client_without_listener(mc_server):
    server, mailbox = mc_server
    zc = zeep.Client(server.endpoint_address + "?wsdl")
    rc = reliable_client(zc, "memory:", fast_policy(), make_connection=True, name="poller", poll_interval=0.05)
    try:
        assert rc.listener_address.startswith(WSMC_ANONYMOUS_PREFIX)
        futures = [rc.service.echo(f"p{i}") for i in range(4)]
        assert [f.result(timeout=30) for f in futures] == [f"re:p{i}" for i in range(4)]
        assert rc.poller.received >= 4
        # the client's acknowledgements reached the server: nothing left to retransmit or park
        assert wait_for(lambda: server.status().unacked == 0)
        assert mailbox.pending(rc.listener_address[len(WSMC_ANONYMOUS_PREFIX):]) == 0
    finally:
        rc.stop(timeout=5)


def test_a_parked_copy_the_client_acknowledged_meanwhile_is_dropped_not_handed_out(mc_server):
    """A retransmitted reply parked after the client took (and acknowledged) an earlier copy: the
    mailbox asks the source at its turn and drops it, so the poll finds nothing and the client gets
    no duplicate."""
    server, mailbox = mc_server
    mailbox.acknowledged = server.source.acknowledged  # as reliable_service(make_connection=True) wires it
    parked: list[tuple[str, bytes]] = []
    park = mailbox.park
    mailbox.park = lambda mc_id, envelope: (parked.append((mc_id, envelope)), park(mc_id, envelope))[1]
    zc = zeep.Client(server.endpoint_address + "?wsdl")
    rc = reliable_client(zc, "memory:", fast_policy(), make_connection=True, name="poller", poll_interval=0.05)
    try:
        assert rc.service.echo("once").result(timeout=30) == "re:once"
        assert wait_for(lambda: server.status().unacked == 0)  # the client acknowledged the reply
        mc_id = rc.listener_address[len(WSMC_ANONYMOUS_PREFIX):]
        # parked once, or again by a retransmission that went before the acknowledgement came
        # (the server's interval is 0.2 s: a loaded machine's client acknowledges later)
        reply = next(envelope for box, envelope in parked if box == mc_id and b"re:once" in envelope)
        assert wait_for(lambda: mailbox.pending(mc_id) == 0)  # such a copy taken or dropped by now
        dropped, received = mailbox.dropped_acknowledged, rc.poller.received
        park(mc_id, reply)  # the copy a retransmission would park
        assert wait_for(lambda: mailbox.dropped_acknowledged > dropped), mailbox.pending(mc_id)
        assert mailbox.pending(mc_id) == 0 and rc.poller.received == received
    finally:
        rc.stop(timeout=5)


def test_make_connection_with_a_foreign_address_is_a_sender_fault(mc_server):
    import urllib.error
    import urllib.request

    from wsrm_plugin.engine.envelopes import protocol_message
    from wsrm_plugin.wire import SOAP12, WSA_2005_08, parse_envelope
    from wsrm_plugin.wire.mc import MakeConnection
    from wsrm_plugin.wire.namespaces import MAKE_CONNECTION_ACTION

    server, _ = mc_server
    body = protocol_message(SOAP12, WSA_2005_08, to=server.endpoint_address, action=MAKE_CONNECTION_ACTION,
                            body=MakeConnection("http://example.org/not-mc").to_xml())
    request = urllib.request.Request(server.endpoint_address, data=body, method="POST",
                                     headers={"Content-Type": "application/soap+xml; charset=utf-8"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 400
    fault = parse_envelope(caught.value.read()).fault()
    assert fault.code == "Sender" and "not a WS-MC anonymous URI" in fault.reason
