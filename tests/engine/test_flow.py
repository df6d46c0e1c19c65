"""Flow control and acknowledgement routes: the window, AcksTo endpoints, batching, piggybacking."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from wsrm_plugin.engine import AckRequestMode, HttpTransport, Response
from wsrm_plugin.engine.inbound import read_message
from wsrm_plugin.store.sql import transaction
from wsrm_plugin.store.sql.large_payloads import COPY_PAYLOAD_AT

from .conftest import fast_policy
from .support import ACTION, Recorder, payload, wait_for


class WatchingTransport:
    """A real HTTP transport that notes what goes out and can lose the answers to messages.

    ``lose_answers``: responses to application messages come back empty (as
    if the HTTP response were lost), so their acknowledgements never arrive.
    """

    def __init__(self) -> None:
        self.inner = HttpTransport(timeout=5)
        self.lose_answers = False
        self.sent_numbers: Counter[int] = Counter()
        self.piggybacked = 0
        self._lock = threading.Lock()

    def send(self, address, envelope, headers):
        message = read_message(envelope, 1 << 24)
        response = self.inner.send(address, envelope, headers)
        with self._lock:
            if message.sequence is not None:
                self.sent_numbers[message.sequence[0].message_number] += 1
                if message.acks:
                    self.piggybacked += 1
        if message.sequence is not None and self.lose_answers:
            return Response(202)
        return response

    def close(self):
        self.inner.close()


def test_window_holds_back_new_messages_until_acknowledged(engines, store_for):
    received = Recorder()
    server = engines(store_for("memory", "s"), serve=True, application=received, name="server")
    transport = WatchingTransport()
    transport.lose_answers = True
    client = engines(store_for("memory", "c"), fast_policy(max_unacknowledged=2), transport=transport,
                     name="client")
    target = server.endpoint_address
    for i in range(6):
        client.send(target, payload(f"m{i}"), action=ACTION)
    # no acknowledgement gets back: 1 and 2 are retransmitted, 3.. never leave
    assert wait_for(lambda: transport.sent_numbers[1] >= 3 and transport.sent_numbers[2] >= 3)
    assert set(transport.sent_numbers) == {1, 2}

    transport.lose_answers = False
    client.close(target)
    assert wait_for(lambda: not client.store.status().rms, timeout=30), client.status()
    # a buffered message is delivered after its acknowledgement: wait for the delivery
    assert wait_for(lambda: received.snapshot() == [f"m{i}" for i in range(6)]), received.snapshot()
    assert set(transport.sent_numbers) == set(range(1, 7))  # 1.1 closes with CloseSequence, not a message


@pytest.mark.postgres
def test_a_round_reads_the_large_payloads_of_the_messages_it_claims_only(pg_dsn_factory, engines, monkeypatch):
    """The window leaves due messages to later rounds: their payloads (read apart, by COPY, on
    PostgreSQL) are read when a round claims them, not by every round that finds them due
    (before: each round read every due message's, 21 reads for 6 messages through a window of 1)."""
    read: list[int] = []
    copy_out = transaction.SqlTransaction.copy_out_payloads

    def counted(self, table, keys, wanted):
        found = copy_out(self, table, keys, wanted)
        if table == "rms_message":
            read.append(len(found))
        return found
    monkeypatch.setattr(transaction.SqlTransaction, "copy_out_payloads", counted)
    received = Recorder()
    server = engines("memory:", serve=True, application=received, name="server")
    transport = WatchingTransport()
    client = engines("postgresql:" + pg_dsn_factory("window"), fast_policy(max_unacknowledged=1),
                     transport=transport, name="client")
    texts = [f"m{i}-" + "x" * COPY_PAYLOAD_AT for i in range(6)]
    for text in texts:
        client.send(server.endpoint_address, payload(text), action=ACTION)
    assert wait_for(lambda: received.snapshot() == texts, timeout=60)
    assert wait_for(lambda: sum(transport.sent_numbers.values()) >= len(texts))  # the last send returned
    assert sum(read) <= sum(transport.sent_numbers.values()), (read, transport.sent_numbers)


def test_acks_to_an_addressable_endpoint_are_sent_standalone_and_batched(engines, store_for):
    received = Recorder()
    server = engines(store_for("memory", "s"), fast_policy(acknowledgement_interval=0.5), serve=True,
                     application=received, name="server")
    client = engines(store_for("memory", "c"), fast_policy(decoupled_acks=True, base_retransmission_interval=30.0),
                     serve=True, name="client")
    target = server.endpoint_address
    for i in range(30):
        client.send(target, payload(f"m{i}"), action=ACTION)
    client.close(target)
    assert wait_for(lambda: not client.store.status().rms, timeout=30), client.status()
    # a buffered message is delivered after its acknowledgement: wait for the delivery
    assert wait_for(lambda: received.snapshot() == [f"m{i}" for i in range(30)]), received.snapshot()
    acks = server.acknowledgement.acks_sent
    assert 0 < acks < 30
    assert client.status().retransmissions == 0  # every ack came without asking again


def test_acks_ride_on_messages_going_to_the_acks_to_endpoint(engines, store_for):
    got_a, got_b = Recorder(), Recorder()
    transport_a = WatchingTransport()
    a = engines(store_for("memory", "a"), fast_policy(decoupled_acks=True, acknowledgement_interval=30.0),
                serve=True, application=got_a, transport=transport_a, name="a")
    b = engines(store_for("memory", "b"), fast_policy(decoupled_acks=True, ack_request=AckRequestMode.NEVER,
                                                      base_retransmission_interval=30.0),
                serve=True, application=got_b, name="b")
    for i in range(3):
        b.send(a.endpoint_address, payload(f"b{i}"), action=ACTION)
    assert wait_for(lambda: got_a.snapshot() == ["b0", "b1", "b2"])
    assert b.status().unacked == 3  # a owes the acknowledgement, batched for 30 s

    a.send(b.endpoint_address, payload("a0"), action=ACTION)
    assert wait_for(lambda: b.status().unacked == 0), b.status()
    assert wait_for(lambda: transport_a.piggybacked == 1)  # counted once a0's HTTP response is back
    assert a.acknowledgement.acks_sent == 0
    assert wait_for(lambda: got_b.snapshot() == ["a0"])


def test_at_most_once_sends_each_message_once(engines, store_for):
    from wsrm_plugin.engine import DeliveryAssurance

    received = Recorder()
    server = engines(store_for("memory", "s"), serve=True, application=received, name="server")
    transport = WatchingTransport()
    transport.lose_answers = True
    client = engines(store_for("memory", "c"),
                     fast_policy(delivery=DeliveryAssurance.AT_MOST_ONCE | DeliveryAssurance.IN_ORDER),
                     transport=transport, name="client")
    for i in range(3):
        client.send(server.endpoint_address, payload(f"m{i}"), action=ACTION)
    assert wait_for(lambda: received.snapshot() == ["m0", "m1", "m2"])
    assert wait_for(lambda: client.status().messages_sent == 3)
    assert transport.sent_numbers == Counter({1: 1, 2: 1, 3: 1})
