"""Every acknowledgement names every number accepted, and a Final one all of them (issue 32, 1 2 7).

The same sequences a WCF or gSOAP peer checks: request-reply calls on a sequence
with an Offer, then AckRequested, CloseSequence and TerminateSequence; a one-way
message behind a gap.  The destination's acknowledgements must never shrink.
"""

from __future__ import annotations

import time

from tests.engine.support import wait_for
from wsrm_plugin.wire import RM10, SOAP11, SequenceHeader, parse_envelope, parse_rm_element

from . import service
from .conftest import fast_policy
from .peer import RawPeer, echo, note, ranges_of

#: How long the service would hold a request's HTTP exchange for its reply: far longer than an
#: exchange that does not wait takes on a loaded machine, shorter than the peer's HTTP timeout
REPLY_WAIT = 25.0
#: An exchange answered at once takes far less; one that waited for a reply takes REPLY_WAIT
AT_ONCE = 15.0


def _reply_number(response) -> int | None:
    for header in parse_envelope(response.body).headers:
        parsed = parse_rm_element(header)
        if parsed is not None and isinstance(parsed[0], SequenceHeader):
            return parsed[0].message_number
    return None


def test_echo_requests_on_an_offered_sequence_are_acknowledged_cumulatively(peer):
    """Four Echo requests get 1-1, 1-2, 1-3, 1-4 (not 1-1, 2-2, 3-3, 4-4), each with its reply;
    AckRequested afterwards gets 1-4 (not None), though no reply was acknowledged."""
    identifier, offered = peer.open(offer=True)
    seen = []
    for n in range(1, 5):
        response = peer.message(identifier, n, echo(f"e{n}"))
        assert response.status == 200 and b"re:e" in response.body, response
        assert _reply_number(response) == n  # the reply, on the offered sequence
        seen.append(ranges_of(response, identifier))
    assert seen == [[(1, 1)], [(1, 2)], [(1, 3)], [(1, 4)]]
    assert ranges_of(peer.ack_request(identifier), identifier) == [(1, 4)]


def test_the_final_acknowledgement_names_every_accepted_message(peer):
    """gSOAP's 1.1 client with an Offer: four messages, the fourth an answered Echo, then Close:
    CloseSequenceResponse and TerminateSequenceResponse say Final 1-4, never 1-3."""
    identifier, _ = peer.open(offer=True)
    for n in range(1, 4):
        assert ranges_of(peer.message(identifier, n, note(f"n{n}")), identifier) == [(1, n)]
    answered = peer.message(identifier, 4, echo("last"))
    assert ranges_of(answered, identifier) == [(1, 4)]
    closed = peer.close(identifier, 4)
    final = [a for a in _acks(closed) if a.identifier == identifier]
    assert [(a.ranges, a.final) for a in final] == [([(1, 4)], True)]
    terminated = peer.terminate(identifier, 4)
    assert [(a.ranges, a.final) for a in _acks(terminated) if a.identifier == identifier] == [([(1, 4)], True)]


def _acks(response):
    from .peer import acks_of
    return acks_of(response)


def test_a_one_way_message_behind_a_gap_is_answered_at_once_with_the_acknowledgement(servers):
    """Message 1 lost, 2 a one-way Note on a sequence with an Offer: no wait for a reply that a
    one-way operation never has, and the acknowledgement (2-2) comes with the answer."""
    server = servers(fast_policy(back_channel_reply_wait=REPLY_WAIT))
    peer = RawPeer(server.url)
    identifier, _ = peer.open(offer=True)
    started = time.monotonic()
    response = peer.message(identifier, 2, note("behind"))
    took = time.monotonic() - started
    assert ranges_of(response, identifier) == [(2, 2)]
    assert took < AT_ONCE, f"a one-way message behind a gap was held {took:.1f} s"
    # the gap filled: both delivered, in order, and the acknowledgement is cumulative
    assert ranges_of(peer.message(identifier, 1, note("first")), identifier) == [(1, 2)]
    assert wait_for(lambda: service.ran("first") == 1 and service.ran("behind") == 1)


def test_a_request_behind_a_gap_is_answered_at_once_without_an_acknowledgement(servers):
    """A request that answers cannot be delivered before the gap fills: its HTTP exchange ends at
    once (202, no acknowledgement, so its source sends it again), and its copy after the gap
    gets the reply with 1-2."""
    peer = RawPeer(servers(fast_policy(back_channel_reply_wait=REPLY_WAIT)).url)
    identifier, _ = peer.open(offer=True)
    started = time.monotonic()
    early = peer.message(identifier, 2, echo("second"))
    took = time.monotonic() - started
    assert took < AT_ONCE, f"a request behind a gap was held {took:.1f} s"
    assert early.status == 202 and ranges_of(early, identifier) is None
    first = peer.message(identifier, 1, echo("first"))
    assert b"re:first" in first.body and ranges_of(first, identifier) in ([(1, 1)], [(1, 2)])
    again = peer.message(identifier, 2, echo("second"))
    assert b"re:second" in again.body and ranges_of(again, identifier) == [(1, 2)]
    assert service.ran("second") == 1


def test_acknowledgements_never_shrink_in_ws_rm_1_0_over_soap_1_1(servers):
    server = servers(soap="1.1")
    peer = RawPeer(server.url, rm=RM10, soap=SOAP11)
    identifier, _ = peer.open(offer=True)
    seen = [ranges_of(peer.message(identifier, n, echo(f"x{n}")), identifier) for n in (1, 2, 3)]
    assert seen == [[(1, 1)], [(1, 2)], [(1, 3)]]
    assert ranges_of(peer.ack_request(identifier), identifier) == [(1, 3)]
