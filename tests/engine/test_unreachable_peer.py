"""A peer down for a while: one probe at a time goes to it, nothing is faulted, and everything
flows at once when it answers again.  Short intervals here; ``test_peer_outage_slow.py`` is the
ten-minute outage with the defaults.

The requests sent while the peer is down are counted where they go: at a proxy in front of the
peer (which answers 502 while the peer is down, as a gateway does) or, with nothing listening
at all (connection refused), at the client's transport.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from wsrm_plugin.engine import HttpTransport
from wsrm_plugin.metrics import exposition
from wsrm_plugin.status import format_report, report
from wsrm_plugin.tools.proxy import LossyProxy

from .conftest import fast_policy
from .support import ACTION, item_text, payload, wait_for

KEYS = 4
OUTAGE = 8.0
#: Retransmission cap (and so the probe cap) of these tests: the peer is found within it.
CAP = 2.0


class TimedRecorder:
    def __init__(self) -> None:
        self.items: list[tuple[float, str | None]] = []
        self._lock = threading.Lock()

    def __call__(self, envelope: bytes, context: object) -> None:
        with self._lock:
            self.items.append((time.monotonic(), item_text(envelope)))

    def texts(self) -> list[str | None]:
        with self._lock:
            return [text for _, text in self.items]

    def first_after(self, moment: float) -> float | None:
        with self._lock:
            return next((at for at, _ in self.items if at >= moment), None)


class CountingTransport(HttpTransport):
    """The engine's own HTTP transport, remembering when each request went."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sent: list[float] = []
        self._count_lock = threading.Lock()

    def send(self, address, envelope, headers):
        with self._count_lock:
            self.sent.append(time.monotonic())
        return super().send(address, envelope, headers)

    def between(self, start: float, end: float) -> int:
        with self._count_lock:
            return sum(1 for at in self.sent if start <= at < end)


@pytest.mark.parametrize("way", ["refused", "502"])
def test_a_down_peer_gets_one_probe_at_a_time_and_everything_once_it_is_back(engines, store_for, caplog, way):
    caplog.set_level(logging.INFO, logger="wsrm_plugin")
    policy = fast_policy(exponential_backoff=True, max_retransmission_interval=CAP)
    received = TimedRecorder()
    server = engines(store_for("sqlite", "server"), policy, application=received, name="server")
    http = server.serve()
    port = http.port
    proxy = LossyProxy(http.url).start() if way == "502" else None
    target = proxy.url if proxy is not None else http.url
    transport = CountingTransport(timeout=policy.http_timeout)
    client = engines(store_for("sqlite", "client"), policy, transport=transport, name="client")

    def send(i: int) -> None:
        for k in range(KEYS):
            client.send(target, payload(f"k{k}-{i}"), action=ACTION, key=f"k{k}")

    try:
        for i in range(3):  # before the outage: delivered
            send(i)
        assert wait_for(lambda: len(received.texts()) == 3 * KEYS and client.status().unacked == 0)

        http.stop()
        down = time.monotonic()
        for i in range(3, 6):  # queued during the outage: each sequence has messages to send
            send(i)
        assert wait_for(lambda: client.status().unreachable_peers != (), timeout=30)
        tripped = time.monotonic()
        [peer] = client.status().unreachable_peers
        assert peer.address == target
        assert ("ConnectionRefused" in peer.last_error) if way == "refused" else ("HTTP 502" in peer.last_error)
        assert peer.since <= time.time()
        # wsrm status (another process, reading the store) shows it too, and the metrics
        assert wait_for(lambda: report(client.store).unreachable_peers != ())
        [shown] = report(client.store).unreachable_peers
        assert shown.subject == target and shown.since == pytest.approx(peer.since)
        text = format_report(report(client.store))
        assert "unreachable peers         1" in text and f"  {target}: since " in text
        assert "wsrm_unreachable_peers 1" in exposition(report(client.store))
        requests_before = proxy.stats.received if proxy is not None else transport.between(tripped, tripped)
        for i in range(6, 9):  # and more while it is judged down
            send(i)
        time.sleep(max(0.0, down + OUTAGE - time.monotonic()))

        back = time.monotonic()
        during = (proxy.stats.received - requests_before) if proxy is not None else transport.between(tripped, back)
        status = client.status()
        assert status.unreachable_peers[0].held > 0  # the messages wait, parked
        assert status.faulted_sequences == 0
        server.serve(port=port)

        expected = {f"k{k}-{i}" for k in range(KEYS) for i in range(9)}
        assert wait_for(lambda: set(received.texts()) == expected, timeout=60), sorted(set(received.texts()))
        first = received.first_after(back)
        assert first is not None
        recovery = first - back
        print(f"\n[{way}] peer back -> first message delivered: {recovery:.2f}s (cap {CAP}s); "
              f"requests during {back - tripped:.1f}s judged down: {during}")
        assert recovery <= CAP + 1.5  # found by a probe within the cap (+ an exchange on a loaded machine)
        # one probe per back-off interval (>= CAP/2 once capped), not one per sequence or message:
        # 4 sequences x 6 waiting messages would be ~24 requests per interval each on its own timer
        assert during <= (back - tripped) / (CAP / 2) + 3, during
        assert len(received.texts()) == len(expected)  # each once
        for k in range(KEYS):
            assert [t for t in received.texts() if t.startswith(f"k{k}-")] == [f"k{k}-{i}" for i in range(9)]
        assert wait_for(lambda: client.status().unacked == 0)
        final = client.status()
        assert final.unreachable_peers == () and final.faulted_sequences == 0 and final.peer_outages == 1
        assert final.probes_sent >= 1
        assert wait_for(lambda: report(client.store).unreachable_peers == ())
        warnings = [r.getMessage() for r in caplog.records
                    if r.levelno >= logging.WARNING and r.name.startswith("wsrm_plugin.engine.re")]
        assert len(warnings) == 1 and "unreachable" in warnings[0], warnings
        infos = [r.getMessage() for r in caplog.records if "reachable again" in r.getMessage()]
        assert len(infos) == 1
    finally:
        if proxy is not None:
            proxy.stop()


def test_sequences_waiting_for_a_down_peer_spend_none_of_their_retries(engines, store_for):
    """With ``max_retries`` set, only the probe's sequence spends retries while the peer is down:
    the others are not sent, so they are not faulted for the peer's absence."""
    policy = fast_policy(max_retries=50, max_retransmission_interval=0.4)
    received = TimedRecorder()
    server = engines(store_for("memory", "server"), policy, application=received, name="server")
    http = server.serve()
    port, url = http.port, http.url
    client = engines(store_for("memory", "client"), policy, name="client")
    for k in range(KEYS):
        client.send(url, payload(f"k{k}-0"), action=ACTION, key=f"k{k}")
    assert wait_for(lambda: len(received.texts()) == KEYS and client.status().unacked == 0)
    http.stop()
    for k in range(KEYS):
        client.send(url, payload(f"k{k}-1"), action=ACTION, key=f"k{k}")
    assert wait_for(lambda: client.status().probes_sent >= 10, timeout=60)
    with client.store.begin() as tx:
        counts = sorted(m.send_count for seq in tx.rms.list_all() for m in tx.rms_messages.list_for(seq.key)
                        if not m.acked)
    probes = client.status().probes_sent
    print(f"\nsend counts of the waiting messages after {probes} probes: {counts}")
    # the probes went out as one message (or two); the others were sent only before the peer
    # was judged down: a first try and a retransmission or two each
    assert counts[-1] >= 5 and all(count <= 4 for count in counts[:-2]), counts
    assert sum(counts) <= 4 * KEYS + probes, counts
    assert client.status().faulted_sequences == 0
    server.serve(port=port)
    assert wait_for(lambda: len(received.texts()) == 2 * KEYS, timeout=30)


def test_acknowledgements_to_an_unreachable_acks_to_wait_for_its_probe(engines, store_for):
    """Decoupled acknowledgements go to the client's own endpoint; while it is down the service's
    acknowledgement worker sends one probe at a time, not an acknowledgement per sequence and
    retransmission, and everything it owes goes once the endpoint answers again."""
    policy = fast_policy(exponential_backoff=True, max_retransmission_interval=CAP)
    received = TimedRecorder()
    service_transport = CountingTransport(timeout=policy.http_timeout)
    server = engines(store_for("memory", "server"), policy, application=received, transport=service_transport,
                     serve=True, name="server")
    client = engines(store_for("memory", "client"), policy.replace(decoupled_acks=True), name="client")
    listener = client.serve()
    port = listener.port
    for k in range(KEYS):
        client.send(server.endpoint_address, payload(f"k{k}-0"), action=ACTION, key=f"k{k}")
    assert wait_for(lambda: len(received.texts()) == KEYS and client.status().unacked == 0)

    listener.stop()
    for k in range(KEYS):
        client.send(server.endpoint_address, payload(f"k{k}-1"), action=ACTION, key=f"k{k}")
    assert wait_for(lambda: server.status().unreachable_peers != (), timeout=30)
    tripped = time.monotonic()
    [peer] = server.status().unreachable_peers
    assert peer.address == client.endpoint_address
    assert wait_for(lambda: len(received.texts()) == 2 * KEYS)  # the messages arrive; their acks cannot go
    time.sleep(OUTAGE / 2)
    back = time.monotonic()
    acks = service_transport.between(tripped, back)
    print(f"\nacknowledgements tried while the client's endpoint was down {back - tripped:.1f}s: {acks}")
    # the client retransmits its unacknowledged messages meanwhile, each asking for an
    # acknowledgement; the service holds them all behind one probe per back-off interval
    assert acks <= (back - tripped) / (CAP / 2) + 3, acks
    client.serve(port=port)
    assert wait_for(lambda: client.status().unacked == 0, timeout=30)
    print(f"endpoint back -> every message acknowledged: {time.monotonic() - back:.2f}s")
    assert wait_for(lambda: server.status().unreachable_peers == ())
    assert received.texts().count("k0-1") == 1
