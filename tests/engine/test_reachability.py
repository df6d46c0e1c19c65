"""The peer breaker's bookkeeping on a clock the test turns: when a peer becomes unreachable,
when probes go, how the back-off grows, and what counts as the peer being down."""

from __future__ import annotations

import logging
import random

import pytest

from wsrm_plugin.engine import RMPolicy
from wsrm_plugin.engine.reachability import Gate, Reachability, failure_of
from wsrm_plugin.engine.transport import Response

PEER = "http://127.0.0.1:9/"
SOAP = b'<?xml version="1.0"?><soap:Envelope xmlns:soap="http://www.w3.org/2003/05/soap-envelope"/>'


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def breaker(**policy):
    clock = Clock()
    back: list[str] = []
    reach = Reachability(RMPolicy(**{"base_retransmission_interval": 1.0, **policy}), on_reachable=back.append,
                         rng=random.Random(7), clock=clock, wall=clock)
    return reach, clock, back


def trip(reach, clock, error="POST failed: ConnectionRefusedError(111)"):
    for i in range(3):
        clock.now += 0.5 if i else 0.0
        reach.failed(PEER, error)
    assert reach.gate(PEER) is Gate.WAIT


@pytest.mark.parametrize("status, body, down", [
    (200, b"", False), (202, b"", False), (400, SOAP, False), (404, b"not found", False),
    (500, SOAP, False),            # the peer's own SOAP fault: it is there
    (500, b"<html>oops</html>", True),  # a proxy's error page
    (502, b"", True), (503, b"", True), (503, SOAP, True),  # the destination's own "later" too
    (504, b"", True), (429, b"", True),
])
def test_what_counts_as_the_peer_being_down(status, body, down):
    headers = {"Content-Type": "application/soap+xml"} if body == SOAP else {"Content-Type": "text/html"}
    assert (failure_of(Response(status, body, headers)) is not None) == down


def test_retry_after_is_named_in_the_failure():
    assert failure_of(Response(503, b"", {"Retry-After": "7"})) == "HTTP 503 Service Unavailable (Retry-After 7s)"
    assert failure_of(Response(502, b"no backend\nat all", {"Content-Type": "text/plain"})) == \
        "HTTP 502 Bad Gateway: 'no backend'"


def test_failures_in_a_blink_are_not_an_outage_nor_is_a_single_failure_long_after_an_answer():
    reach, clock, _ = breaker()
    for _ in range(10):  # a round's lanes all meeting the refused port at once
        reach.failed(PEER, "refused")
    assert reach.gate(PEER) is Gate.SEND and reach.failing(PEER)
    reach.answered(PEER)
    assert not reach.failing(PEER)
    reach.failed(PEER, "refused")
    clock.now += 50
    reach.failed(PEER, "refused")  # two in a row, however far apart: not three
    assert reach.gate(PEER) is Gate.SEND
    clock.now += 1
    reach.failed(PEER, "refused")
    assert reach.gate(PEER) is Gate.WAIT
    assert reach.outages == 1


def test_one_probe_at_a_time_after_a_back_off_that_doubles_up_to_the_cap(caplog):
    caplog.set_level(logging.DEBUG, logger="wsrm_plugin.engine.reachability")
    reach, clock, back = breaker(max_probe_interval=8.0)
    trip(reach, clock)
    waits = []
    for _ in range(8):
        [peer] = reach.unreachable()
        assert peer.next_probe_at is not None
        wait = peer.next_probe_at - clock.now
        waits.append(wait)
        clock.now += wait - 0.01
        assert reach.gate(PEER) is Gate.WAIT and reach.probes_due() == []
        clock.now += 0.01
        assert reach.probes_due() == [PEER]
        assert reach.gate(PEER) is Gate.PROBE
        assert reach.gate(PEER) is Gate.WAIT  # one at a time
        assert reach.unreachable()[0].probing
        reach.failed(PEER, "refused", probe=True)
    # base 1 s doubling, capped at 8, each jittered to 50-100% of its value
    for wait, ceiling in zip(waits, [1, 2, 4, 8, 8, 8, 8, 8]):
        assert ceiling / 2 <= wait <= ceiling
    assert len(set(waits)) == len(waits)  # jittered: no two sources probe in step
    assert reach.probes_sent == 8 and back == []
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "unreachable" in warnings[0].getMessage()


def test_without_exponential_backoff_probes_keep_the_base_interval():
    reach, clock, _ = breaker(exponential_backoff=False)
    trip(reach, clock)
    for _ in range(5):
        clock.now += 1.0
        assert reach.gate(PEER) is Gate.PROBE
        reach.failed(PEER, "refused", probe=True)
        assert reach.unreachable()[0].next_probe_at - clock.now <= 1.0


def test_a_probe_never_goes_before_the_peers_retry_after():
    reach, clock, _ = breaker(max_probe_interval=30.0)
    trip(reach, clock, "HTTP 503")
    clock.now += 1.0
    assert reach.gate(PEER) is Gate.PROBE
    reach.failed(PEER, "HTTP 503 (Retry-After 20s)", probe=True, retry_after=20.0)
    assert reach.unreachable()[0].next_probe_at - clock.now >= 20.0
    clock.now += 20.0
    assert reach.gate(PEER) is Gate.PROBE
    reach.failed(PEER, "HTTP 503", probe=True, retry_after=3600.0)  # capped: the peer cannot park us
    assert reach.unreachable()[0].next_probe_at - clock.now <= 30.0


def test_the_first_answer_ends_the_outage_once(caplog):
    caplog.set_level(logging.INFO, logger="wsrm_plugin.engine.reachability")
    reach, clock, back = breaker()
    trip(reach, clock)
    reach.held(PEER, "k1", [3, 4])
    reach.held(PEER, "k2", [1])
    assert reach.held_messages(PEER) == [("k1", 3), ("k1", 4), ("k2", 1)]
    clock.now += 2
    assert reach.gate(PEER) is Gate.PROBE
    reach.answered(PEER)
    reach.answered(PEER)  # a second answer changes nothing
    assert back == [PEER]
    assert reach.gate(PEER) is Gate.SEND and reach.unreachable() == ()
    assert reach.take_held(PEER) == {"k1": [3, 4], "k2": [1]}
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "reachable again" in infos[0]


def test_a_probe_that_never_reports_is_taken_as_failed():
    reach, clock, _ = breaker(http_timeout=2.0)
    trip(reach, clock)
    clock.now += 1
    assert reach.gate(PEER) is Gate.PROBE
    clock.now += 6.5  # more than 2.5 HTTP timeouts and a second
    assert reach.gate(PEER) is Gate.WAIT
    assert not reach.unreachable()[0].probing


def test_an_abandoned_probe_lets_the_next_one_go_soon():
    reach, clock, _ = breaker(poll_interval=0.1)
    trip(reach, clock)
    clock.now += 1
    assert reach.gate(PEER) is Gate.PROBE
    reach.abandon_probe(PEER)
    assert reach.probes_sent == 0
    clock.now += 0.1
    assert reach.gate(PEER) is Gate.PROBE


def test_the_breaker_can_be_turned_off():
    reach, clock, _ = breaker(peer_unreachable_after=None)
    for _ in range(10):
        reach.failed(PEER, "refused")
        clock.now += 5
    assert reach.gate(PEER) is Gate.SEND and reach.unreachable() == ()


def test_knobs_are_checked():
    with pytest.raises(ValueError, match="peer_unreachable_after"):
        RMPolicy(peer_unreachable_after=0)
    with pytest.raises(ValueError, match="probe_interval_cap"):
        RMPolicy(max_probe_interval=1.0)  # below the base interval (3 s)
    assert RMPolicy().probe_interval_cap == RMPolicy().max_retransmission_interval == 60.0
