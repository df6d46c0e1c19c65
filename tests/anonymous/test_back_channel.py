"""In-out calls of a zeep client without a listener: replies in the HTTP responses (issue 4)."""

from __future__ import annotations

import collections
import threading

from tests.engine.support import wait_for
from wsrm_plugin.tools.proxy import LossyProxy

from . import service
from .conftest import fast_policy

CALLBACK = "tests.anonymous.service:on_reply"


def _store_empty(engine) -> bool:
    status = engine.store.status()
    return not status.rms and not status.rmd


def test_a_future_resolves_on_the_record_of_its_reply_from_the_response_which_consumes_it(servers, clients,
                                                                                          monkeypatch):
    """The reply in the HTTP response is recorded, and its future resolved, in the sending thread;
    the record takes it (no delivery follows), and the request it answers, which waited for it,
    is acknowledged in that transaction: it is not sent again."""
    rc = clients(servers().url)
    delivered: list[object] = []
    on_reply = rc._on_reply

    def counted_delivery(*args, **kwargs):
        delivered.append(args)
        return on_reply(*args, **kwargs)

    monkeypatch.setattr(rc, "_on_reply", counted_delivery)
    assert rc.service.echo("early").result(timeout=30) == "re:early"
    assert rc.engine.store.status().buffered == 0
    assert wait_for(lambda: sum(rc.unacknowledged()[0].values()) == 0)  # the request has its reply
    assert delivered == [] and rc.pending_futures() == 0 and service.RAN["early"] == 1
    assert rc.engine.status().retransmissions == 0


def test_in_out_calls_without_a_listener_get_their_replies_on_the_back_channel(servers, clients):
    server = servers()
    rc = clients(server.url)
    assert rc.listener_address is None
    futures = [rc.service.echo(f"q{i}", _callback=CALLBACK, _context=f"c{i}") for i in range(8)]
    notes = [rc.service.note(f"n{i}") for i in range(3)]  # one-way calls on their own sequence
    assert [f.result(timeout=60) for f in futures] == [f"re:q{i}" for i in range(8)]
    assert service.REPLIES == collections.Counter({(f"re:q{i}", f"c{i}"): 1 for i in range(8)})
    assert wait_for(lambda: all(service.RAN[n] for n in ("n0", "n1", "n2")))
    assert service.RAN == collections.Counter({**{f"q{i}": 1 for i in range(8)}, "n0": 1, "n1": 1, "n2": 1})
    assert len(notes) == 3 and rc.pending_futures() == 0
    assert server.engine.back_channel.handed_out >= 8
    # the client acknowledged every reply, so the server acknowledged every request
    assert wait_for(lambda: server.engine.status().unacked == 0 and rc.engine.status().unacked == 0)
    # the replies travelled on the sequence the client offered, which ends with its request sequence
    assert rc.close() == 2
    assert wait_for(lambda: _store_empty(rc.engine) and _store_empty(server.engine)), (
        rc.engine.store.status(), server.engine.store.status())


def test_every_call_resolves_exactly_once_through_a_proxy_that_loses_responses(servers, clients):
    server = servers()
    with LossyProxy(server.url, drop_response=0.3, seed=4) as proxy:
        rc = clients(server.url, address=proxy.url)
        futures = [rc.service.echo(f"x{i}", _callback=CALLBACK, _context=f"k{i}") for i in range(20)]
        assert [f.result(timeout=120) for f in futures] == [f"re:x{i}" for i in range(20)]
        # exactly once: each reply reached the callback once, each request ran the service once
        assert service.REPLIES == collections.Counter({(f"re:x{i}", f"k{i}"): 1 for i in range(20)})
        assert service.RAN == collections.Counter({f"x{i}": 1 for i in range(20)})
        assert wait_for(lambda: server.engine.status().unacked == 0 and rc.engine.status().unacked == 0,
                        timeout=60)
        proxy.drain()
        assert proxy.stats.responses_dropped > 0
        # a request whose response was lost was sent again and answered with its stored reply
        assert server.engine.back_channel.handed_out > 20
        rc.close()
        assert wait_for(lambda: _store_empty(rc.engine) and _store_empty(server.engine), timeout=60)


def test_a_reply_slower_than_the_wait_comes_with_a_retransmission(servers, clients):
    service.reset(delay=0.4)
    # buffered (delivered by an invoker thread), so that the HTTP thread's wait can run out:
    # delivered on receipt, the request's own response would bring its reply
    server = servers(fast_policy(back_channel_reply_wait=0.05, deliver_on_receive=False))
    rc = clients(server.url)
    futures = [rc.service.echo(f"s{i}") for i in range(3)]
    assert [f.result(timeout=60) for f in futures] == ["re:s0", "re:s1", "re:s2"]
    assert service.RAN == collections.Counter({"s0": 1, "s1": 1, "s2": 1})
    assert rc.engine.status().retransmissions >= 3  # every first answer was an empty 202
    assert wait_for(lambda: server.engine.status().unacked == 0)


def test_a_request_is_sent_again_until_its_reply_arrives(servers):
    """A client that never takes its replies: the server acknowledges the request (its
    acknowledgements are cumulative) and keeps the reply stored; the client keeps the request
    unacknowledged, since its reply never arrived, and sends it again, and every copy gets the
    same reply.  (The server used to hold the request's acknowledgement back instead.)"""
    from wsrm_plugin.engine import ReliableEngine

    from tests.spyne_server.conftest import Envelopes
    from wsrm_plugin.wire import parse_envelope

    server = servers()
    # an engine client that never serves and never handles what comes back: it only sends
    client = ReliableEngine("memory:", fast_policy(base_retransmission_interval=0.3), name="raw")
    seen: list[bytes] = []
    original = client.transport.send

    def record(address, envelope, headers):
        response = original(address, envelope, headers)
        if response.body and b"echoResponse" in response.body:
            seen.append(response.body)
        return response

    client.transport.send = record  # type: ignore[method-assign]
    client.retransmission._reply_on_back_channel = lambda seq, data: None  # a client that never acks
    client.start()
    try:
        build = Envelopes(server.url)
        receipt = client.send(server.url, build("echo", "held"), action=f"{service.TNS}/echo",
                              expect_reply=True)
        assert wait_for(lambda: len(seen) >= 3, timeout=30)
        replies = [parse_envelope(body) for body in seen]
        texts = {r.root.findtext(f".//{{{service.TNS}}}echoResult") for r in replies}
        assert texts == {"re:held"}
        # every copy's answer acknowledges the request: the server holds nothing back
        from wsrm_plugin.wire import SequenceAcknowledgement, parse_rm_element
        acks = [parsed[0] for r in replies for h in r.headers
                if (parsed := parse_rm_element(h)) is not None and isinstance(parsed[0], SequenceAcknowledgement)]
        assert len(acks) == len(replies) and all(a.ranges == [(1, 1)] for a in acks), acks
        assert service.RAN == collections.Counter({"held": 1})
        with client.store.begin() as tx:
            assert tx.rms_messages.find_by_message_id(receipt.message_id).acked is False
        assert server.engine.status().unacked == 1  # the reply, kept until acknowledged
    finally:
        client.stop(timeout=5)


def test_back_channel_replies_do_not_wait_for_the_poll_interval(servers, clients):
    """Every wake-up is signalled: a stored request wakes the invoker, a stored reply ends the
    HTTP thread's wait.  With a 5 s poll interval on both sides, 20 sequential in-out calls over
    the anonymous back-channel would take about 50 s if a step of each waited for a poll (2.5 s on
    average), 100 s if it waited a whole interval; the bound of 25 s is one only polling can miss
    (a loaded machine answers a call in a tenth of a second, well under the 1.25 s allowed)."""
    import time

    slow_polls = fast_policy(poll_interval=5.0)
    server = servers(slow_polls)
    rc = clients(server.url, policy=slow_polls)
    rc.service.echo("warm-up").result(timeout=60)  # the sequence and its offer are set up
    started = time.monotonic()
    for i in range(20):
        assert rc.service.echo(f"p{i}").result(timeout=60) == f"re:p{i}"
    elapsed = time.monotonic() - started
    assert elapsed < 25.0, f"20 calls took {elapsed:.1f} s with poll_interval 5 s"
    assert service.RAN == collections.Counter({"warm-up": 1, **{f"p{i}": 1 for i in range(20)}})


def test_the_sender_learns_from_the_acknowledgements_riding_on_back_channel_replies(servers, clients):
    """A reply in the HTTP response carries the acknowledgement of its request: the sender's
    pacing counts it, so what it remembers as sent and not known acknowledged does not grow with
    every call of a long sequence (it used to, up to 4,096 numbers walked at every round)."""
    rc = clients(servers().url)
    for i in range(12):
        assert rc.service.echo(f"p{i}").result(timeout=30) == f"re:p{i}"
    # the caller has its reply once it is recorded, a little before the sender's round ends and
    # merges what that round's answers acknowledged: wait for the round, not a fixed time
    flows = lambda: list(rc.engine.retransmission._flows.values())  # noqa: E731
    assert wait_for(lambda: any(flow.known.is_complete_up_to(12) for flow in flows()), timeout=30), \
        [flow.known for flow in flows()]
    assert wait_for(lambda: flows() and all(not flow.outstanding for flow in flows()), timeout=30), \
        [flow.outstanding for flow in flows()]
