"""A buffered message's life (statemachine.delivery): every state, every event, reachability.

The table below is the specification, written out by hand: a row per valid state, a cell per
event (a refusal's reason, NOOP, or the state after and its actions).  The engine's invoker
asks this machine before it acts on a message; the engine tests show it doing so.
"""

from __future__ import annotations

import pytest

from wsrm_plugin.statemachine import (
    InvalidTransition,
    MessageAction,
    MessageEvent,
    MessageState,
    Reason,
    WAYS,
    Stage,
    Way,
    message_transition,
    receipt_way,
    stored_state,
    transition,
    way_in,
)

from .helpers import cells, check_cell, reachable

U, ALONE, SETTLING_R, SETTLED = Reason.UNEXPECTED, Reason.DELIVERED_ALONE, Reason.BEING_SETTLED, Reason.SETTLED
APART_R, FIRST_R = Reason.DELIVERED_APART, Reason.RUNNING_FIRST
RUN, JUDGE, GIVE_UP, POISON = ["RUN_APPLICATION"], ["JUDGE_FAILURE"], ["GIVE_UP"], ["POISON"]


def row(**cells_: object) -> dict[str, object]:
    """Every event refused as UNEXPECTED, except the cells given."""
    return {event.name: cells_.get(event.name, U) for event in MessageEvent}




def settled(**extra: object) -> dict[str, object]:
    return row(CLAIM=SETTLED, FOLLOW=SETTLED, **extra)


TABLE = {
    "WAITING": row(CLAIM=("DELIVERING", RUN), FOLLOW=("DELIVERING", RUN), HOLD=("HELD", []),
                   KEPT_APART=("APART", [])),
    "WAITING alone": row(CLAIM=("DELIVERING alone", RUN), FOLLOW=ALONE, HOLD=("HELD", []),
                         KEPT_APART=("APART alone", [])),
    "DELIVERING": row(COMMITTED=("DELIVERED", []), FAILED=("SETTLING alone", JUDGE), ROLLED_BACK=("WAITING", []),
                      BATCH_COMMIT_FAILED=("WAITING alone", []), NOT_TAKEN=("MISSED", [])),
    "DELIVERING alone": row(COMMITTED=("DELIVERED", []), FAILED=("SETTLING alone", JUDGE),
                            ROLLED_BACK=("WAITING alone", []), BATCH_COMMIT_FAILED=("WAITING alone", []),
                            NOT_TAKEN=("MISSED alone", [])),
    # delivering apart: buffered by its receive, which delivers it itself; or run before its receipt
    "APART": row(CLAIM=APART_R, FOLLOW=APART_R, KEPT_APART=APART_R, COMMITTED=("DELIVERED", []),
                 FAILED=("SETTLING alone", JUDGE), ROLLED_BACK=("WAITING", []), NOT_TAKEN=("MISSED", [])),
    "APART alone": row(CLAIM=APART_R, FOLLOW=APART_R, KEPT_APART=APART_R, COMMITTED=("DELIVERED", []),
                       FAILED=("SETTLING alone", JUDGE), ROLLED_BACK=("WAITING alone", []),
                       NOT_TAKEN=("MISSED alone", [])),
    "RUNNING_FIRST": row(CLAIM=FIRST_R, FOLLOW=FIRST_R, KEPT_APART=FIRST_R, COMMITTED=("DELIVERED", []),
                         FAILED=("SETTLING alone", JUDGE), NOT_TAKEN=FIRST_R),
    # its receipt buffered what its receive meant to deliver: in the buffer as WAITING is, its
    # receipt over (never kept apart, never missed again, nothing of it failed)
    "MISSED": row(CLAIM=("DELIVERING", RUN), FOLLOW=("DELIVERING", RUN), HOLD=("HELD", [])),
    "MISSED alone": row(CLAIM=("DELIVERING alone", RUN), FOLLOW=ALONE, HOLD=("HELD", [])),
    "SETTLING alone": row(CLAIM=SETTLING_R, FOLLOW=SETTLING_R,
                          RETRY=("RETRY_WAIT alone", []), NEXT_CYCLE=("CYCLE_WAIT alone", []),
                          ANSWER_LATER=("TO_ANSWER alone", []), POISON_LATER=("TO_POISON alone", []),
                          ANSWERED=("ANSWERED", []), POISONED=("POISONED", []), NOT_COUNTED=("WAITING alone", []),
                          SUSPECTED=("SUSPECT alone", []), VANISHED=("DELIVERED", [])),
    "SUSPECT alone": row(CLAIM=("DELIVERING alone", RUN), FOLLOW=ALONE, CHARGE=("SETTLING alone", JUDGE),
                         ABSORB=("WAITING alone", [])),
    "RETRY_WAIT alone": row(CLAIM=("DELIVERING alone", RUN), FOLLOW=ALONE),
    "CYCLE_WAIT alone": row(CLAIM=("DELIVERING alone", RUN), FOLLOW=ALONE),
    "TO_ANSWER alone": row(CLAIM=("TO_ANSWER alone", GIVE_UP), FOLLOW=ALONE, ANSWERED=("ANSWERED", []),
                           POISONED=("POISONED", [])),
    "TO_POISON alone": row(CLAIM=("TO_POISON alone", POISON), FOLLOW=ALONE, POISONED=("POISONED", [])),
    "POISONED": settled(RETRY_POISON=("WAITING", []), DISCARD=("DISCARDED", [])),
    "HELD": settled(RELEASE=("WAITING", [])),
    "DELIVERED": settled(),
    "ANSWERED": settled(),
    "DISCARDED": settled(),
}


def test_the_table_covers_every_valid_state_and_every_event():
    assert {MessageState.of(label) for label in TABLE} == set(MessageState.valid_states())
    for cells_ in TABLE.values():
        assert set(cells_) == {e.name for e in MessageEvent}


@pytest.mark.parametrize("label, event, expected", cells(TABLE, MessageEvent), ids=str)
def test_transition(label, event, expected):
    check_cell(MessageState, message_transition, label, event, expected)
    check_cell(MessageState, transition, label, event, expected)


def test_every_valid_state_is_reachable_from_the_three_ways_in():
    start = {MessageState.initial(), MessageState.initial(taken_on_receipt=True), MessageState.initial(run_first=True)}
    assert reachable(start, message_transition, MessageEvent) == set(MessageState.valid_states())


def test_states_that_cannot_exist_are_refused():
    with pytest.raises(ValueError, match="out of the invoker's hands"):
        MessageState(Stage.DELIVERED, alone=True)
    with pytest.raises(ValueError, match="failed before"):
        MessageState(Stage.RETRY_WAIT)
    with pytest.raises(ValueError, match="never in the buffer"):
        MessageState(Stage.RUNNING_FIRST, alone=True)
    with pytest.raises(TypeError):
        MessageState("WAITING")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="optionally followed by 'alone'"):
        MessageState.of("WAITING together")


def test_the_store_row_says_where_a_message_is_after_a_restart():
    assert stored_state(0, 0, last_cycle=2) == MessageState.of("WAITING")
    assert stored_state(2, 0, last_cycle=2) == MessageState.of("RETRY_WAIT alone")
    assert stored_state(0, 1, last_cycle=2) == MessageState.of("CYCLE_WAIT alone")
    assert stored_state(1, 2, last_cycle=2) == MessageState.of("RETRY_WAIT alone")
    assert stored_state(9, 3, last_cycle=2) == MessageState.of("TO_POISON alone")
    assert stored_state(0, 1, last_cycle=0) == MessageState.of("TO_POISON alone")


def test_a_message_that_failed_is_never_taken_along_again_until_delivered():
    # the property batches and receives rely on, over every path: once a failure was counted
    # or a batch's commit failed, FOLLOW is refused until the message leaves the buffer
    start = MessageState.initial()
    seen = {start}
    todo = [start]
    while todo:
        state = todo.pop()
        for event in MessageEvent:
            try:
                after = message_transition(state, event).state
            except InvalidTransition:
                continue
            if event in (MessageEvent.FAILED, MessageEvent.RETRY, MessageEvent.NEXT_CYCLE,
                         MessageEvent.BATCH_COMMIT_FAILED):
                assert after.alone
            if state.alone and not after.settled and event is not MessageEvent.RETRY_POISON:
                assert after.alone, f"{state} --{event.name}--> {after}"
            if after not in seen:
                seen.add(after)
                todo.append(after)


def test_foreign_objects_are_refused():
    with pytest.raises(TypeError, match="not a MessageEvent"):
        message_transition(MessageState.initial(), "CLAIM")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a MessageState"):
        message_transition("WAITING", MessageEvent.CLAIM)  # type: ignore[arg-type]


# -- the way a receive delivers its message, read from the state it puts the message in -------

def test_each_way_a_receive_may_take_is_read_back_from_the_state_it_puts_its_message_in():
    # buffered, taken on receipt, kept apart by its receive (WAITING --KEPT_APART-->), run first
    expected = {Way.BUFFERED: "WAITING", Way.INSIDE: "DELIVERING", Way.APART: "APART", Way.FIRST: "RUNNING_FIRST"}
    for way, label in expected.items():
        assert way_in(way) == MessageState.of(label), way
        assert receipt_way(way_in(way)) is way
    assert way_in(Way.APART) == message_transition(MessageState.initial(), MessageEvent.KEPT_APART).state
    assert {way_in(w) for w in (Way.BUFFERED, Way.INSIDE, Way.FIRST)} == {
        MessageState.initial(), MessageState.initial(taken_on_receipt=True), MessageState.initial(run_first=True)}


def test_a_receive_whose_delivery_on_receipt_failed_is_buffered_and_one_that_buffers_cannot_fail_so():
    for way in (Way.INSIDE, Way.APART, Way.FIRST):
        failed = message_transition(way_in(way), MessageEvent.FAILED)
        assert failed.state == MessageState.of("SETTLING alone"), way
        assert receipt_way(failed.state) is Way.BUFFERED  # received again, into the buffer
    with pytest.raises(InvalidTransition) as refused:  # it never delivered: nothing failed on receipt
        message_transition(way_in(Way.BUFFERED), MessageEvent.FAILED)
    assert refused.value.reason is Reason.UNEXPECTED


def test_a_receipt_that_does_not_take_its_message_leaves_it_missed_in_the_buffer():
    # taken on receipt or kept apart, but not next in order (behind a gap): the receipt buffers
    # it, and its state says so (not DELIVERING or APART, which no receive holds any more), and
    # that its receive meant to deliver it on receipt (MISSED, not WAITING: no flag beside it)
    for way in (Way.INSIDE, Way.APART):
        not_taken = message_transition(way_in(way), MessageEvent.NOT_TAKEN)
        assert not_taken.state == MessageState.of("MISSED"), way
        assert not_taken.actions == ()
        assert receipt_way(not_taken.state) is Way.BUFFERED  # recorded into the buffer
        # ...where its receive catching up, or an invoker thread, claims it or takes it along
        for event in (MessageEvent.CLAIM, MessageEvent.FOLLOW):
            taken = message_transition(not_taken.state, event)
            assert taken.state == MessageState.of("DELIVERING") and taken.actions == (MessageAction.RUN_APPLICATION,)
        # its receipt is over: it is neither missed again nor kept apart, and nothing of it failed
        for event in (MessageEvent.NOT_TAKEN, MessageEvent.KEPT_APART, MessageEvent.FAILED,
                      MessageEvent.COMMITTED):
            with pytest.raises(InvalidTransition) as refused:
                message_transition(not_taken.state, event)
            assert refused.value.reason is Reason.UNEXPECTED, (way, event)
    # a receipt after its application ran takes its message or fails (FAILED); one that only
    # buffered took nothing to begin with
    for way, reason in ((Way.FIRST, Reason.RUNNING_FIRST), (Way.BUFFERED, Reason.UNEXPECTED)):
        with pytest.raises(InvalidTransition) as refused:
            message_transition(way_in(way), MessageEvent.NOT_TAKEN)
        assert refused.value.reason is reason, way
    # no way in starts MISSED: only a receipt that did not take its message leads there
    assert all(way_in(way).stage is not Stage.MISSED for way in Way)


def test_no_way_follows_another_once_taken():
    # a message running first, or kept apart, is neither kept apart again nor taken by a claim
    for way, reason in ((Way.FIRST, Reason.RUNNING_FIRST), (Way.APART, Reason.DELIVERED_APART)):
        for event in (MessageEvent.KEPT_APART, MessageEvent.CLAIM, MessageEvent.FOLLOW):
            with pytest.raises(InvalidTransition) as refused:
                message_transition(way_in(way), event)
            assert refused.value.reason is reason, (way, event)
    with pytest.raises(InvalidTransition):  # taken on receipt: not kept apart after all
        message_transition(way_in(Way.INSIDE), MessageEvent.KEPT_APART)


def test_a_state_no_receive_holds_takes_no_way():
    assert set(WAYS) == {Stage.WAITING, Stage.DELIVERING, Stage.APART, Stage.RUNNING_FIRST, Stage.SETTLING,
                         Stage.MISSED}
    for state in MessageState.valid_states():
        if state.stage not in WAYS:
            with pytest.raises(ValueError, match="takes no way"):
                receipt_way(state)
