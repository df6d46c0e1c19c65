"""The destination's ``out_of_order`` option, and how the source paces a sequence against it.

``out_of_order="discard"`` makes the destination behave as gSOAP's does: only
the next message in order is taken; a later one is dropped unrecorded and
unacknowledged (the source sends it again after the gap), a duplicate is
acknowledged.  The source, sending to such a peer, must still deliver every
message exactly once and in order, and must not leave messages sent after a
gap to their own timers.
"""

from __future__ import annotations

import pytest

from wsrm_plugin.engine import RMPolicy
from wsrm_plugin.tools.proxy import LossyProxy

from .conftest import fast_policy
from .support import ACTION, RM10, RM11, Recorder, payload, wait_for
from .test_bad_input import open_sequence, send_ok


@pytest.mark.parametrize("rm", [RM11, RM10], ids=["wsrm1.1", "wsrm1.0"])
def test_a_discarding_destination_takes_only_the_next_message(engines, store_for, rm):
    received = Recorder()
    server = engines(store_for("memory", "s"), fast_policy(out_of_order="discard"), serve=True,
                     application=received)
    url = server.endpoint_address
    identifier = open_sequence(url, rm)
    assert send_ok(url, rm, identifier, 1, "one") == [(1, 1)]
    assert send_ok(url, rm, identifier, 3, "three early") == [(1, 1)]  # dropped: only 1 acknowledged
    assert send_ok(url, rm, identifier, 1, "one again") == [(1, 1)]  # a duplicate: acked, not delivered
    assert send_ok(url, rm, identifier, 2, "two") == [(1, 2)]
    assert send_ok(url, rm, identifier, 4, "four early") == [(1, 2)]
    assert send_ok(url, rm, identifier, 3, "three") == [(1, 3)]
    assert wait_for(lambda: received.snapshot() == ["one", "two", "three"])
    assert server.destination.discarded_out_of_order == 2
    assert server.status().discarded_out_of_order == 2


def test_a_buffering_destination_keeps_what_comes_early(engines, store_for):
    received = Recorder()
    server = engines(store_for("memory", "s"), fast_policy(), serve=True, application=received)
    url = server.endpoint_address
    identifier = open_sequence(url, RM11)
    assert send_ok(url, RM11, identifier, 2, "two") == [(2, 2)]
    assert send_ok(url, RM11, identifier, 1, "one") == [(1, 2)]
    assert wait_for(lambda: received.snapshot() == ["one", "two"])
    assert server.destination.discarded_out_of_order == 0


def test_out_of_order_must_be_buffer_or_discard():
    assert RMPolicy().out_of_order == "buffer"
    with pytest.raises(ValueError, match="out_of_order"):
        RMPolicy(out_of_order="drop")


@pytest.mark.parametrize("mode", ["discard", "buffer"])
def test_a_backlog_reaches_a_destination_once_in_order_through_loss(engines, mode):
    """200 messages enqueued at once, 30% of exchanges lost, the timers 60 s: only the answers can
    have driven the retransmissions, and each message arrives once, in order."""
    received = Recorder()
    server = engines("memory:", fast_policy(out_of_order=mode), serve=True, application=received)
    count = 200
    with LossyProxy(server.endpoint_address, drop=0.15, drop_response=0.15, seed=11) as proxy:
        client = engines("memory:", fast_policy(base_retransmission_interval=60.0,
                                                max_retransmission_interval=60.0), name="client")
        for i in range(count):
            client.send(proxy.url, payload(f"m{i:03d}"), action=ACTION, key="k")
        assert wait_for(lambda: len(received.snapshot()) >= count, timeout=50), \
            (len(received.snapshot()), client.status())
        stats = proxy.stats
    assert received.snapshot() == [f"m{i:03d}" for i in range(count)]
    assert stats.dropped and stats.responses_dropped
    worker = client.retransmission
    assert worker.fast_retransmits + worker.loss_probes > 0
    assert (server.destination.discarded_out_of_order > 0) == (mode == "discard")
