"""Our zeep client's sending side against real peers through real loss (issue 11).

1000 one-way Notes per case go from a reliable zeep client through the lossy
proxy to a destination that does NOT keep out-of-order messages -- gSOAP's
server (WS-RM 1.1 and 1.0, built with no hold time: an out-of-order message
is dropped with a bare 202, as gSOAP's plugin does) and our own spyne service
with ``out_of_order="discard"`` -- and to our buffering spyne service.  Each
case must deliver every message exactly once, in order, and terminate the
sequence.  In-out Echo calls with an Offer go through the same loss.

Bounds, from the loss rate (not timings: the proxy counts what was sent):

* a lost request or response costs the in-order sender at most the message
  itself and the one sent after it before the answer showed the gap, plus
  one inline retry of a failed exchange: 3 extra requests per loss;
* trying pipelining again costs a round of 2 x send_concurrency messages
  each time, at most log2(N) times, and when the try wins by the noise of a
  busy machine, one pipelined round of up to send_batch (50) messages before
  the peer's answers show the discards: at most 50 per try;
so ``requests <= N + 3 * losses + 50 * log2(N) + 100`` (the 100: CreateSequence,
Close, Terminate and their retries).  The old sender (every message on its
own exponential timer, pipelined) needed several transmissions per message
against a discarding peer and did not finish at all in the time guard below,
which allows ``60 s + N x 0.1 s / (1 - p)^2`` per case, p the loss rate.
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from interceptors.spyne_server.service import ReliableService, reliable_service
from interceptors.zeep_client.client import ReliableClient, reliable_client
from interceptors.zeep_client.errors import UnsentMessages
from tests.engine.support import wait_for
from wsrm_plugin.engine import RMPolicy
from wsrm_plugin.tools.proxy import LossyProxy, _Decision

from . import interop_service as service
from .gsoap_peer import GsoapServer, GsoapUnavailable, build_gsoap_peer
from .local_schemas import gsoap_zeep_client

N = 1000
ECHOES = 40

#: name -> (LossyProxy arguments, loss rate p for the bounds)
PROFILES: dict[str, tuple[dict, float]] = {
    "no-loss": ({}, 0.0),
    "10%": ({"drop": 0.05, "drop_response": 0.05}, 0.10),
    "30%": ({"drop": 0.15, "drop_response": 0.15}, 0.30),
    "bursts": ({"bursts": (100, 10)}, 0.10),
    "duplicates": ({"duplicate": 0.3}, 0.0),
}

#: The user's floor and cap for the timers.  A burst of 10 lost requests silences the peer, and
#: a message alone at the end of a sequence that meets one must go through 10 attempts on its
#: backed-off timer (the burst counts requests, not seconds): with the default 3 s floor and
#: 60 s cap that is minutes.  Everything else is the default policy.
POLICY = dict(base_retransmission_interval=0.5, max_retransmission_interval=2.0, poll_interval=0.05,
              wsa_version="2005/08", soap_version="1.1")


class BurstyProxy(LossyProxy):
    """Drops ``length`` requests in a row every ``every`` requests (a link going down briefly)."""

    def __init__(self, target: str, *, bursts: tuple[int, int], **kwargs) -> None:
        super().__init__(target, **kwargs)
        self._every, self._length = bursts
        self._posts = 0

    def _decide(self) -> _Decision:
        with self._lock:
            self._posts += 1
            drop = self._posts % self._every < self._length and self._posts > self._every
        decision = super()._decide()
        return _Decision(drop=drop or decision.drop, reorder=decision.reorder, duplicate=decision.duplicate,
                         drop_response=decision.drop_response, delay=decision.delay)


def lossy(target: str, profile: str, seed: int) -> LossyProxy:
    kwargs, _ = PROFILES[profile]
    if "bursts" in kwargs:
        return BurstyProxy(target, seed=seed, **kwargs)
    return LossyProxy(target, seed=seed, **kwargs)


def time_guard(count: int, p: float) -> float:
    return 60.0 + count * 0.1 / (1 - p) ** 2


def request_bound(count: int, losses: int) -> int:
    return count + 3 * losses + 50 * math.ceil(math.log2(count)) + 100


@pytest.fixture(scope="module")
def peers() -> dict[str, object]:
    try:
        return {version: build_gsoap_peer(version) for version in ("1.1", "1.0")}
    except GsoapUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def clients(peers) -> Iterator[Callable[..., ReliableClient]]:
    made: list[ReliableClient] = []

    def make(version: str, address: str, *, listen: bool = False) -> ReliableClient:
        rc = reliable_client(gsoap_zeep_client(peers[version], address), "memory:",
                             RMPolicy(rm_version=version, **POLICY), key="loss",
                             name=f"loss-{len(made)}", listen=("127.0.0.1", 0) if listen else None)
        made.append(rc)
        return rc

    yield make
    for rc in reversed(made):
        try:
            rc.stop(timeout=5)
        except UnsentMessages:  # the test failed already; its client must not outlive it
            rc.stop(discard_unsent=True)


@pytest.fixture
def spyne_destination() -> Iterator[Callable[[str], ReliableService]]:
    service.reset()
    started: list[ReliableService] = []

    def start(out_of_order: str) -> ReliableService:
        policy = RMPolicy(rm_version="1.1", out_of_order=out_of_order, poll_interval=0.05,
                          wsa_version="2005/08", soap_version="1.1")
        server = reliable_service(service.application("1.1"), "memory:", policy)
        started.append(server)
        server.serve()
        return server.start()

    yield start
    for server in started:
        server.stop(timeout=5)
    service.reset()


def send_all_and_terminate(rc: ReliableClient, texts: list[str], p: float) -> None:
    for text in texts:
        rc.service.Note(text=text)
    assert rc.close() >= 1
    assert rc.engine.wait_until(lambda s: s.rms_sequences == 0, timeout=time_guard(len(texts), p)), \
        rc.engine.status()
    status = rc.engine.status()
    assert (status.unacked, status.faulted_sequences) == (0, 0), status


def check_requests(proxy: LossyProxy, count: int) -> None:
    proxy.drain()
    stats = proxy.stats
    losses = stats.dropped + stats.responses_dropped
    assert stats.received <= request_bound(count, losses), stats


@pytest.mark.slow(minutes=0.1)
@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("version", ["1.1", "1.0"], ids=lambda v: f"wsrm{v}")
def test_notes_reach_gsoap_once_in_order_through_loss(version: str, profile: str, clients, tmp_path: Path):
    texts = [f"{version}-{profile}-{i:04d}" for i in range(N)]
    _, p = PROFILES[profile]
    with GsoapServer(version, workdir=tmp_path, hold_ms=0) as server, \
            lossy(server.url, profile, seed=17) as proxy:
        send_all_and_terminate(clients(version, proxy.url), texts, p)
        deliveries = server.deliveries()
        check_requests(proxy, N)
    assert [d.text for d in deliveries] == texts
    assert [d.number for d in deliveries] == list(range(1, N + 1))


@pytest.mark.slow(minutes=0.1)
@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("out_of_order", ["discard", "buffer"])
def test_notes_reach_our_destination_once_in_order_through_loss(out_of_order: str, profile: str, clients,
                                                                spyne_destination):
    texts = [f"{out_of_order}-{profile}-{i:04d}" for i in range(N)]
    _, p = PROFILES[profile]
    server = spyne_destination(out_of_order)
    with lossy(server.url, profile, seed=23) as proxy:
        send_all_and_terminate(clients("1.1", proxy.url), texts, p)
        check_requests(proxy, N)
    assert wait_for(lambda: len(service.runs()) >= N and server.engine.status().buffered == 0, timeout=60)
    runs = service.runs()
    assert [run.text for run in runs] == texts
    assert [run.number for run in runs] == list(range(1, N + 1))


@pytest.mark.slow(minutes=0.1)
@pytest.mark.parametrize("peer", ["gsoap-1.1", "gsoap-1.0", "ours-discard", "ours-buffer"])
def test_echo_with_offer_through_loss_gets_every_reply_once(peer: str, clients, spyne_destination,
                                                            tmp_path: Path):
    texts = [f"{peer}-echo-{i:02d}" for i in range(ECHOES)]
    kind, _, variant = peer.partition("-")
    version = variant if kind == "gsoap" else "1.1"
    if kind == "gsoap":
        server_cm = GsoapServer(version, workdir=tmp_path, hold_ms=0)
        url = server_cm.__enter__().url
    else:
        server_cm = None
        url = spyne_destination(variant).url
    try:
        with LossyProxy(url, drop=0.15, drop_response=0.15, seed=29) as proxy:
            rc = clients(version, proxy.url, listen=True)
            futures = [rc.service.Echo(text=text) for text in texts]
            assert all(isinstance(f, concurrent.futures.Future) for f in futures)
            answers = [f.result(timeout=time_guard(ECHOES, 0.3)) for f in futures]
            assert [answer.body.text for answer in answers] == texts
            assert rc.pending_futures() == 0
            assert rc.close() >= 1
            assert rc.engine.wait_until(lambda s: s.rms_sequences == 0, timeout=time_guard(ECHOES, 0.3)), \
                rc.engine.status()
            # each reply was handed over exactly once (counted after its commit)
            assert wait_for(lambda: rc.engine.status().delivered == ECHOES, timeout=15)
            assert rc.engine.status().delivered == ECHOES
        if kind == "gsoap":
            assert [d.text for d in server_cm.deliveries()] == texts
        else:
            assert wait_for(lambda: len(service.runs()) >= ECHOES, timeout=30)
            assert [run.text for run in service.runs()] == texts
    finally:
        if server_cm is not None:
            server_cm.__exit__(None, None, None)


@pytest.mark.slow(minutes=0.1)
def test_a_wsrm10_sequence_to_gsoap_ends_without_resending_its_last_window(clients, tmp_path: Path):
    # gSOAP answers a 1.0 LastMessage with a bare 202 and acknowledges it only in its answers to
    # other messages. The in-order sender read that bare answer as a discard and went back to the
    # start of the last window, 16 times: about 400 requests for 60 messages, without any loss.
    count = 60
    texts = [f"tail-{i:03d}" for i in range(count)]
    with GsoapServer("1.0", workdir=tmp_path, hold_ms=0) as server, \
            lossy(server.url, "no-loss", seed=5) as proxy:
        send_all_and_terminate(clients("1.0", proxy.url), texts, 0.0)
        deliveries = server.deliveries()
        proxy.drain()
        # 60 messages, CreateSequence, the LastMessage, an AckRequested, TerminateSequence, and the
        # cost of one pipelining try against a peer that discards (up to 2 x 50)
        assert proxy.stats.received <= count + 100, proxy.stats
    assert [d.text for d in deliveries] == texts
