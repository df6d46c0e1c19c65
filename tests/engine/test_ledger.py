"""The invoker's ledger: it keeps a message's state only where its row does not say it, and every
change is the delivery machine's."""

from __future__ import annotations

import pytest

from wsrm_plugin.engine.ledger import MessageLedger
from wsrm_plugin.statemachine import InvalidTransition, MessageEvent, MessageState, Reason, Stage
from wsrm_plugin.store import BufferedMessage

E = MessageEvent


def _msg(number: int = 1, attempts: int = 0, cycle: int = 0) -> BufferedMessage:
    return BufferedMessage("s", number, None, "a", "soap", b"", attempts=attempts, cycle=cycle)


def test_a_plain_delivery_leaves_nothing_behind():
    ledger = MessageLedger(last_cycle=2)
    taken = ledger.apply(_msg(), E.CLAIM)
    assert taken.state == MessageState(Stage.DELIVERING)
    assert ledger.apply(_msg(), E.COMMITTED, state=taken.state).state.stage is Stage.DELIVERED
    assert len(ledger) == 0


def test_a_failure_is_kept_while_it_is_judged_and_then_the_row_says_the_rest():
    ledger = MessageLedger(last_cycle=2)
    msg = _msg()
    ledger.apply(msg, E.FAILED, state=MessageState(Stage.DELIVERING))
    assert ledger.state(msg) == MessageState(Stage.SETTLING, alone=True)
    with pytest.raises(InvalidTransition) as refused:  # no other thread may start it meanwhile
        ledger.apply(msg, E.CLAIM)
    assert refused.value.reason is Reason.BEING_SETTLED
    ledger.apply(msg, E.RETRY)
    assert len(ledger) == 0  # its row (attempts 1) says it now
    assert ledger.state(_msg(attempts=1)) == MessageState(Stage.RETRY_WAIT, alone=True)
    assert ledger.state(_msg(cycle=3)) == MessageState(Stage.TO_POISON, alone=True)


def test_what_the_row_cannot_say_is_kept_with_its_error_until_it_is_settled():
    ledger = MessageLedger(last_cycle=2)
    msg, fault = _msg(), RuntimeError("the service's fault")
    ledger.apply(msg, E.FAILED, state=MessageState(Stage.DELIVERING))
    ledger.apply(msg, E.ANSWER_LATER, error=fault)
    taken, error = ledger.take(msg, E.CLAIM)
    assert error is fault and [a.name for a in taken.actions] == ["GIVE_UP"]
    ledger.apply(msg, E.ANSWERED)
    assert len(ledger) == 0


def test_what_an_outage_put_off_is_listed_until_brought_forward():
    ledger = MessageLedger(last_cycle=2)
    msg = _msg(attempts=2)
    ledger.apply(msg, E.FAILED, state=MessageState(Stage.DELIVERING, alone=True))
    ledger.apply(msg, E.SUSPECTED, error=ConnectionError(), deferred=True)
    assert [k.state.stage for k in ledger.in_stage(Stage.SUSPECT)] == [Stage.SUSPECT]
    ledger.apply(msg, E.ABSORB)
    [kept] = ledger.deferred()
    assert kept.state == MessageState(Stage.WAITING, alone=True) and kept.msg.attempts == 2
    ledger.undefer([msg])
    assert ledger.deferred() == [] and len(ledger) == 1  # still delivered alone
    ledger.apply(msg, E.CLAIM)
    assert len(ledger) == 0


def test_a_message_running_before_its_receipt_is_kept_until_its_receipt_commits_or_it_fails():
    """RUNNING_FIRST has no row to say it: the ledger keeps it, and no claim takes the message."""
    ledger = MessageLedger(last_cycle=2)
    msg = _msg(2)
    ledger.enter(msg, MessageState.initial(run_first=True))
    assert ledger.state(msg) == MessageState(Stage.RUNNING_FIRST)
    with pytest.raises(InvalidTransition) as refused:
        ledger.apply(msg, E.CLAIM)
    assert refused.value.reason is Reason.RUNNING_FIRST
    with pytest.raises(InvalidTransition):  # nor is it kept apart by a receive
        ledger.apply(msg, E.KEPT_APART)
    assert ledger.apply(msg, E.COMMITTED).state.stage is Stage.DELIVERED
    assert len(ledger) == 0
    ledger.enter(msg, MessageState.initial(run_first=True))
    ledger.apply(msg, E.FAILED)  # judged now: no claim takes it before its try is counted
    assert ledger.state(msg) == MessageState(Stage.SETTLING, alone=True)
    with pytest.raises(ValueError, match="only running before its receipt"):
        ledger.enter(_msg(3), MessageState.initial(taken_on_receipt=True))
