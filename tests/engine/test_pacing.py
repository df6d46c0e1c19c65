"""What the source learns from its exchanges (:mod:`wsrm_plugin.engine.pacing`), without a network."""

from __future__ import annotations

import pytest

from wsrm_plugin.engine.pacing import Exchange, RttEstimator, SequenceFlow
from wsrm_plugin.statemachine import AckRanges


def ranges(*pairs: tuple[int, int]) -> AckRanges:
    return AckRanges.from_ranges(pairs)


def answered(number: int, t: float, *ack: tuple[int, int]) -> Exchange:
    return Exchange(number, t, t + 0.5, answered=True, ack=ranges(*ack))


def failed(number: int, t: float) -> Exchange:
    return Exchange(number, t, t + 0.5, answered=False)


def test_the_timeout_follows_the_round_trip_time_above_the_floor_and_below_the_cap():
    peer = RttEstimator()
    assert peer.timeout(3.0, 60.0) == 3.0  # nothing measured: the base interval
    for _ in range(20):
        peer.sample(0.01)
    assert peer.timeout(3.0, 60.0) == 3.0  # a fast peer: the user's floor
    assert peer.timeout(0.001, 60.0) == pytest.approx(0.01, abs=0.01)
    slow = RttEstimator()
    for rtt in [4.0, 6.0, 5.0, 7.0, 5.0]:
        slow.sample(rtt)
    assert 5.0 < slow.timeout(3.0, 60.0) < 20.0  # SRTT + 4 RTTVAR: no retransmission while answers travel
    assert slow.timeout(3.0, 6.0) == 6.0  # the cap
    assert slow.alive
    for _ in range(3):
        slow.failed()
    assert not slow.alive  # a silent peer: back to the timers


def test_a_peer_that_leaves_a_message_out_of_its_own_answer_after_a_gap_discards():
    flow = SequenceFlow(batch=50, ordered=False)
    # pipelined: 1 and 3 arrived before 2; the peer took 1 and dropped 3
    verdict = flow.after_round([answered(1, 0.0, (1, 1)), answered(3, 0.1, (1, 1)), failed(2, 0.1)])
    assert verdict.discarding and flow.ordered
    assert verdict.resend == {2, 3}  # from the gap, in order


def test_a_buffering_peer_gets_only_the_hole_again_and_stays_pipelined():
    flow = SequenceFlow(batch=50, ordered=False)
    # 2 was lost on the way; 3 and 4, sent after 2's exchange ended, were kept
    verdict = flow.after_round([answered(1, 0.0, (1, 1)), failed(2, 1.0), answered(3, 2.0, (1, 1), (3, 3)),
                                answered(4, 3.0, (1, 1), (3, 4))])
    assert not verdict.discarding and not flow.ordered
    assert verdict.resend == {2}


def test_a_flow_told_to_pipeline_claims_its_batch_until_a_discard_puts_it_in_order():
    flow = SequenceFlow(batch=50, concurrency=4)
    assert flow.ordered and flow.claim_limit() == 2  # a new sequence starts in order, 2 at a time
    flow.pipeline()  # a peer known to keep what arrives out of order
    assert not flow.ordered and flow.claim_limit() == 50
    flow.after_round([answered(1, 0.0, (1, 1)), answered(3, 0.1, (1, 1)), failed(2, 0.1)])
    assert flow.ordered and flow.claim_limit() == 2  # it discarded after all


def test_no_resend_without_evidence_and_a_probe_for_a_failed_end():
    flow = SequenceFlow(batch=50)
    verdict = flow.after_round([answered(1, 0.0, (1, 1)), answered(2, 1.0, (1, 2)), failed(3, 2.0)])
    assert verdict.resend == frozenset()
    assert verdict.probe == {3}  # nothing came after it to tell: send it again soon
    # the next answer covers 3 (its response was what got lost): nothing to send again
    verdict = flow.after_round([answered(4, 3.0, (1, 4))])
    assert verdict.resend == frozenset() and flow.outstanding == {}


def test_a_bare_answer_from_a_peer_that_acknowledges_counts_as_not_taken():
    flow = SequenceFlow(batch=50)
    flow.after_round([answered(1, 0.0, (1, 1))])
    bare = Exchange(3, 2.0, 2.5, answered=True, bare=True)  # gSOAP's 202 for a dropped message
    verdict = flow.after_round([failed(2, 1.0), bare])
    assert verdict.discarding
    assert verdict.resend == {2, 3}


def test_the_faster_way_is_kept_and_the_loser_tried_less_often():
    flow = SequenceFlow(batch=50, concurrency=4)
    assert flow.ordered  # a sequence starts in order: safe with every peer
    flow.note_round(ordered=True, seconds=0.02)
    flow.after_round([answered(1, 0.0, (1, 1)), answered(2, 0.01, (1, 2))])
    assert flow.probing and not flow.ordered  # the ordered rate is known: try pipelining
    assert flow.claim_limit() == 8
    flow.note_round(ordered=False, seconds=1.0)  # 8 messages in a second: far slower
    flow.after_round([answered(n, 1.0 + n / 100, (1, n)) for n in range(3, 11)])
    assert flow.ordered and not flow.probing
    assert flow.probe_after == 64
