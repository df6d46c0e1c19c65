"""AckRanges (examples; the set-model equivalence is in test_properties) and rms_acknowledge."""

from __future__ import annotations

import pytest

from wsrm_plugin.statemachine import (
    MAX_MESSAGE_NUMBER,
    AckRanges,
    InvalidTransition,
    Reason,
    RMSEvent,
    RMSState,
    rms_acknowledge,
)


def test_adding_merges_adjacent_numbers_into_one_range():
    r = AckRanges()
    for n in [3, 1, 5, 2, 4]:
        r = r.add(n)
    assert r.ranges == ((1, 5),)
    assert str(r) == "1-5" and r.count == 5 and r.highest == 5 and r.next_expected == 6


def test_gaps_and_completeness():
    r = AckRanges.of([1, 2, 4, 7, 8])
    assert r.ranges == ((1, 2), (4, 4), (7, 8))
    assert str(r) == "1-2,4,7-8"
    assert 4 in r and 3 not in r and 0 not in r and "4" not in r
    assert r.is_complete_up_to(2) and not r.is_complete_up_to(4)
    assert r.missing_up_to(9).ranges == ((3, 3), (5, 6), (9, 9))
    assert r.next_expected == 3
    assert AckRanges().is_complete_up_to(0) and not AckRanges().is_complete_up_to(1)
    assert AckRanges.of([2]).next_expected == 1


def test_a_duplicate_returns_the_same_value():
    r = AckRanges.of([1, 2, 3])
    assert r.add(2) is r


def test_peer_ranges_are_normalised():
    r = AckRanges.from_ranges([(5, 9), (1, 2), (3, 3), (8, 12)])
    assert r.ranges == ((1, 3), (5, 12))


def test_union_and_difference():
    a = AckRanges.of([1, 2, 3, 7])
    b = AckRanges.of([3, 4, 9])
    assert a.union(b).ranges == ((1, 4), (7, 7), (9, 9))
    assert a.difference(b).ranges == ((1, 2), (7, 7))
    assert b.difference(a).ranges == ((4, 4), (9, 9))


@pytest.mark.parametrize(
    "ranges, error",
    [
        (((2, 1),), ValueError),
        (((0, 3),), ValueError),
        (((1, MAX_MESSAGE_NUMBER + 1),), ValueError),
        (((1, 3), (4, 5)), ValueError),  # adjacent: not merged
        (((4, 5), (1, 2)), ValueError),  # not sorted
        (((1, 3), (2, 5)), ValueError),  # overlapping
        (((1, 2, 3),), TypeError),
        (((1.0, 2),), TypeError),
        (((True, 2),), TypeError),
    ],
)
def test_non_canonical_or_out_of_range_values_are_refused(ranges, error):
    with pytest.raises(error):
        AckRanges(ranges)


def test_bad_numbers_are_refused():
    with pytest.raises(ValueError, match="outside"):
        AckRanges().add(0)
    with pytest.raises(ValueError, match="lower bound above"):
        AckRanges.from_ranges([(5, 4)])
    with pytest.raises(ValueError, match="negative"):
        AckRanges().is_complete_up_to(-1)
    assert AckRanges().add(MAX_MESSAGE_NUMBER).highest == MAX_MESSAGE_NUMBER


# rms_acknowledge

STARTED = RMSState.of("SS MIB")


def test_partial_then_full_acknowledgement():
    out = rms_acknowledge(STARTED, AckRanges.of([1, 3]), acked=AckRanges(), highest_assigned=3)
    assert out.event is RMSEvent.ACK and out.transition.state == STARTED
    assert out.acked.ranges == ((1, 1), (3, 3)) and out.newly_acked == out.acked
    out = rms_acknowledge(out.transition.state, AckRanges.of([1, 2]), acked=out.acked, highest_assigned=3)
    assert out.event is RMSEvent.ACKALL and out.transition.state == RMSState.of("SS")
    assert out.acked.ranges == ((1, 3),) and out.newly_acked.ranges == ((2, 2),)


def test_an_acknowledgement_never_shrinks_what_was_acknowledged():
    out = rms_acknowledge(STARTED, AckRanges.of([2]), acked=AckRanges.of([1, 3]), highest_assigned=4)
    assert out.acked.ranges == ((1, 3),) and out.event is RMSEvent.ACK


def test_ack_for_numbers_never_sent_is_invalid_acknowledgement():
    with pytest.raises(InvalidTransition) as info:
        rms_acknowledge(STARTED, AckRanges.of([1, 2, 5]), acked=AckRanges(), highest_assigned=4)
    assert info.value.reason is Reason.INVALID_ACKNOWLEDGEMENT
    assert info.value.fault == "InvalidAcknowledgement"
    assert "only 1..4 were sent" in str(info.value)


def test_ack_before_the_sequence_started_is_unknown_sequence():
    with pytest.raises(InvalidTransition) as info:
        rms_acknowledge(RMSState.of("MIB"), AckRanges.of([1]), acked=AckRanges(), highest_assigned=1)
    assert info.value.fault == "UnknownSequence"


def test_late_ack_after_termination_is_a_no_op():
    done = RMSState.of("SS LMR TMS")
    out = rms_acknowledge(done, AckRanges.of([1, 2, 99]), acked=AckRanges.of([1, 2]), highest_assigned=2)
    assert out.transition.noop and out.acked == AckRanges.of([1, 2]) and not out.newly_acked


def test_ack_all_twice_is_a_no_op():
    out = rms_acknowledge(RMSState.of("SS LMR"), AckRanges.of([1, 2]), acked=AckRanges.of([1, 2]), highest_assigned=2)
    assert out.event is RMSEvent.ACKALL and out.transition.noop


def test_inconsistent_bookkeeping_is_refused():
    with pytest.raises(ValueError, match="beyond the highest assigned"):
        rms_acknowledge(STARTED, AckRanges(), acked=AckRanges.of([5]), highest_assigned=3)
    with pytest.raises(ValueError, match=">= 0"):
        rms_acknowledge(STARTED, AckRanges(), acked=AckRanges(), highest_assigned=-1)
