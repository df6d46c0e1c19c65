"""A buffered message's life in the invoker: what can happen to it next, in one table.

The seed's invoker machine (:mod:`.invoker`) follows a sequence's buffer as a
whole.  Between "received" and "delivered" a single message has a life of its
own: it can be delivered in a batch or alone, fail and be retried in this
cycle or the next, be given up (answered with the service's fault, or moved to
the poison store), wait behind a poisoned one, or fail while the service's
database is down, which is not its fault.  This machine is that life.  The
engine's invoker asks it what a message may do before doing it, and keeps
nothing about a message but its :class:`MessageState`.

The stages (:class:`Stage`):

===============  ====================================================================
 WAITING         in the buffer; delivered when it is next in line
 DELIVERING      taken by a transaction: the application runs on it
 APART           buffered by its receive, which delivers it itself, outside the store's
                 transactions (``deliver_apart``): no invoker thread takes it meanwhile
 RUNNING_FIRST   handed to the application before its receipt (delivering apart): not in the
                 buffer; the receipt, in the application's transaction, takes it (or it fails)
 MISSED          its receive meant to deliver it on receipt (DELIVERING, APART) and its receipt
                 buffered it instead, not next in order: in the buffer, and its receive delivers
                 the buffer up to it before answering
 SETTLING        its delivery failed and rolled back; the failure is being judged
                 and recorded, and no other delivery of it may start meanwhile
 SUSPECT         it failed the way an outage fails (a connection refused...); not
                 counted until the next outcome says whose fault it was
 RETRY_WAIT      failed, with attempts left in its cycle: due after a delay
 CYCLE_WAIT      its cycle's attempts failed: due after ``retry_cycle_delay``
 TO_ANSWER       out of attempts with the service's own fault, behind messages still
                 to deliver: answered (without running the application) once next
 TO_POISON       out of retry cycles, behind messages still to deliver: moved to the
                 poison store once next
 POISONED        in the poison store, until an operator retries or discards it
 HELD            behind a poisoned message of its sequence (``poison_handling="hold"``)
 DELIVERED       handed over, committed
 ANSWERED        given up, its fault sent back on the response sequence, committed
 DISCARDED       discarded from the poison store by an operator
===============  ====================================================================

``alone`` (:attr:`MessageState.alone`): the message is delivered on its own,
never taken along by a batch or by a receive catching up, because it failed
before or broke a batch: a message that failed once, counted or not, is
delivered alone until it is delivered (a message whose failure is being judged,
is suspect, waits for a retry, a cycle or its giving up always is).  A message taken on receipt starts in DELIVERING,
one whose application runs before its receipt in RUNNING_FIRST (never alone: it was never in the
buffer), any other in WAITING.

The durable part of a state is in the store (a buffered message's attempts and
cycle; the poison store); :func:`stored_state` reads it from there.  SETTLING,
SUSPECT, TO_ANSWER, APART, RUNNING_FIRST and ``alone`` after a batch live in the
engine's memory: after a restart a message is what its row says.  MISSED lives in its
receive's alone: to the invoker threads, which read the row, the message is WAITING.

A receive chooses the way it delivers its message (:class:`Way`: buffered for the
invoker threads, inside its transaction, apart, or first) by the state it puts the
message in (:func:`way_in`), and reads the way back from that state
(:data:`WAYS`): so this module's tables say both which way a receive may take and
what may follow it.  A receive that meant to deliver its message (DELIVERING, APART) and
whose receipt buffered it instead, because it is not next in order (behind a gap, or the one
before it buffered), says so by NOT_TAKEN: the message is MISSED, in the buffer as a WAITING
one is (claimed, taken along or held the same), and the stage still says that its receive
meant to deliver it on receipt, so catches up on the buffer before it answers.  Whether a failure is the
message's or the service's is :mod:`wsrm_plugin.statemachine.outage`'s question; this machine only
takes the verdict (:attr:`MessageEvent.SUSPECTED`, ``NOT_COUNTED``, ``CHARGE``,
``ABSORB``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .common import InvalidTransition, Reason, Transition

__all__ = ["MessageAction", "MessageEvent", "MessageState", "Stage", "WAYS", "Way", "message_transition",
           "receipt_way", "stored_state", "way_in"]


class Stage(Enum):
    WAITING = "in the buffer; delivered when it is next in line"
    DELIVERING = "taken by a transaction: the application runs on it"
    APART = "buffered by its receive, which delivers it itself, outside the store's transactions"
    RUNNING_FIRST = "handed to the application before its receipt, which takes it in the same transaction"
    MISSED = ("meant to be delivered on receipt, buffered by its receipt instead (not next in order): its receive"
              " delivers the buffer up to it")
    SETTLING = "its delivery failed and rolled back; the failure is being judged and recorded"
    SUSPECT = "it failed the way an outage fails; not counted until the next outcome says whose fault it was"
    RETRY_WAIT = "failed, with attempts left in its cycle: due after a delay"
    CYCLE_WAIT = "its cycle's attempts failed: due after the retry cycle delay"
    TO_ANSWER = "out of attempts with the service's fault: answered without running the application once next"
    TO_POISON = "out of retry cycles: moved to the poison store once next"
    POISONED = "in the poison store, until an operator retries or discards it"
    HELD = "behind a poisoned message of its sequence: waits for an operator"
    DELIVERED = "handed over, committed"
    ANSWERED = "given up, its fault sent back on the response sequence, committed"
    DISCARDED = "discarded from the poison store by an operator"


#: Stages a message has left the invoker's hands in: nothing delivers them.
_SETTLED = frozenset({Stage.POISONED, Stage.HELD, Stage.DELIVERED, Stage.ANSWERED, Stage.DISCARDED})
#: Stages only a failure leads to: a message in them is always delivered alone.
_FAILED = frozenset({Stage.SETTLING, Stage.SUSPECT, Stage.RETRY_WAIT, Stage.CYCLE_WAIT, Stage.TO_ANSWER,
                     Stage.TO_POISON})


#: Stages a message never failed in: it is never 'alone' there.
_NEVER_ALONE = _SETTLED | {Stage.RUNNING_FIRST}


@dataclass(frozen=True)
class MessageState:
    """A stage, and whether the message is delivered on its own from now on."""

    stage: Stage
    alone: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.stage, Stage) or not isinstance(self.alone, bool):
            raise TypeError(f"MessageState takes a Stage and a bool, not {self.stage!r}, {self.alone!r}")
        if self.alone and self.stage in _SETTLED:
            raise ValueError(f"a {self.stage.name} message is out of the invoker's hands: it cannot be 'alone'")
        if self.alone and self.stage is Stage.RUNNING_FIRST:
            raise ValueError("a message running before its receipt was never in the buffer: it cannot be 'alone'")
        if not self.alone and self.stage in _FAILED:
            raise ValueError(f"a {self.stage.name} message failed before: it is delivered 'alone'")

    @classmethod
    def initial(cls, *, taken_on_receipt: bool = False, run_first: bool = False) -> MessageState:
        """Buffered on receipt (WAITING), taken and delivered by the receiving transaction
        (DELIVERING), or handed to the application before its receipt (RUNNING_FIRST)."""
        if run_first:
            return cls(Stage.RUNNING_FIRST)
        return cls(Stage.DELIVERING if taken_on_receipt else Stage.WAITING)

    @classmethod
    def valid_states(cls) -> tuple[MessageState, ...]:
        return tuple(cls(stage, alone) for stage in Stage for alone in (False, True)
                     if not (alone and stage in _NEVER_ALONE) and not (not alone and stage in _FAILED))

    @classmethod
    def of(cls, label: str) -> MessageState:
        """From a label: ``"WAITING"``, ``"RETRY_WAIT alone"``."""
        name, _, rest = label.partition(" ")
        if rest not in ("", "alone"):
            raise ValueError(f"a message state's label is a stage, optionally followed by 'alone': {label!r}")
        return cls(Stage[name], rest == "alone")

    @property
    def label(self) -> str:
        return f"{self.stage.name} alone" if self.alone else self.stage.name

    @property
    def settled(self) -> bool:
        """Out of the invoker's hands: delivered, answered, poisoned, held or discarded."""
        return self.stage in _SETTLED

    def __str__(self) -> str:
        return f"Message[{self.label}]"


class MessageEvent(Enum):
    # taking it
    CLAIM = "an invoker thread took it as the next message of its sequence"
    FOLLOW = "taken along right after the message before it (by a batch, or by a receive catching up)"
    KEPT_APART = "its receive buffered it, next in order, to deliver it apart itself"
    NOT_TAKEN = ("its receipt did not take it, which its receive meant to deliver (not next in order: behind a gap,"
                 " or the one before it buffered): it waits in the buffer, MISSED")
    # how its transaction ended
    COMMITTED = "the transaction that delivered it committed"
    FAILED = "its delivery raised, and the transaction rolled back"
    ROLLED_BACK = "its batch rolled back because of another message: nothing of it happened"
    BATCH_COMMIT_FAILED = "the commit of its batch failed: no single message is to blame"
    # the verdict on a failure (its judgement, in a transaction of its own)
    RETRY = "counted; attempts are left in this cycle"
    NEXT_CYCLE = "counted; this cycle's attempts are used up, a cycle is left"
    ANSWER_LATER = "counted; out of attempts with the service's fault, behind messages still to deliver"
    POISON_LATER = "counted; out of cycles, behind messages still to deliver"
    ANSWERED = "given up: the service's fault went back on the response sequence (committed)"
    POISONED = "given up: moved to the poison store (committed)"
    NOT_COUNTED = "not the message's doing (a lock timeout, the store or the service unavailable): not counted"
    SUSPECTED = "it failed as an outage fails: counted only if another message is then delivered"
    VANISHED = "it is no longer in the buffer (delivered after all, by another thread or a lost commit answer)"
    # the service's verdict on a suspect
    CHARGE = "another message was delivered: the failure was its own, and is judged now"
    ABSORB = "delivery paused: the failure was the outage's, and is not counted"
    # its sequence and the operator
    HOLD = "a message before it went to the poison store, and its sequence holds"
    RELEASE = "the poisoned message before it was retried or discarded: its sequence goes on"
    RETRY_POISON = "an operator put it back into the buffer with a fresh retry budget"
    DISCARD = "an operator discarded it from the poison store"


class MessageAction(Enum):
    RUN_APPLICATION = "hand the message to the application, in the taking transaction"
    JUDGE_FAILURE = "judge and record the failure, in a transaction of its own"
    GIVE_UP = "answer it with the service's fault, or poison it when nobody can be answered"
    POISON = "move it to the poison store"


_A = MessageAction
_S = Stage
_E = MessageEvent

#: What ``alone`` becomes: kept, set (it failed, or broke a batch) or cleared (a fresh start).
_KEEP, _SET, _CLEAR = "keep", "set", "clear"

#: (stage, event) -> (stage after, actions, what ``alone`` becomes).  Every pair not here is refused.
RULES: dict[tuple[Stage, MessageEvent], tuple[Stage, tuple[MessageAction, ...], str]] = {
    (_S.WAITING, _E.CLAIM): (_S.DELIVERING, (_A.RUN_APPLICATION,), _KEEP),
    (_S.WAITING, _E.FOLLOW): (_S.DELIVERING, (_A.RUN_APPLICATION,), _KEEP),
    (_S.WAITING, _E.HOLD): (_S.HELD, (), _CLEAR),
    (_S.WAITING, _E.KEPT_APART): (_S.APART, (), _KEEP),
    (_S.RETRY_WAIT, _E.CLAIM): (_S.DELIVERING, (_A.RUN_APPLICATION,), _KEEP),
    (_S.CYCLE_WAIT, _E.CLAIM): (_S.DELIVERING, (_A.RUN_APPLICATION,), _KEEP),
    (_S.SUSPECT, _E.CLAIM): (_S.DELIVERING, (_A.RUN_APPLICATION,), _KEEP),
    (_S.TO_ANSWER, _E.CLAIM): (_S.TO_ANSWER, (_A.GIVE_UP,), _KEEP),
    (_S.TO_POISON, _E.CLAIM): (_S.TO_POISON, (_A.POISON,), _KEEP),

    (_S.DELIVERING, _E.COMMITTED): (_S.DELIVERED, (), _CLEAR),
    (_S.DELIVERING, _E.FAILED): (_S.SETTLING, (_A.JUDGE_FAILURE,), _SET),
    (_S.DELIVERING, _E.ROLLED_BACK): (_S.WAITING, (), _KEEP),
    (_S.DELIVERING, _E.BATCH_COMMIT_FAILED): (_S.WAITING, (), _SET),
    (_S.DELIVERING, _E.NOT_TAKEN): (_S.MISSED, (), _KEEP),  # its receipt buffered it: not next in order

    (_S.APART, _E.COMMITTED): (_S.DELIVERED, (), _CLEAR),
    (_S.APART, _E.FAILED): (_S.SETTLING, (_A.JUDGE_FAILURE,), _SET),
    (_S.APART, _E.ROLLED_BACK): (_S.WAITING, (), _KEEP),  # the batch that buffered it rolled back
    (_S.APART, _E.NOT_TAKEN): (_S.MISSED, (), _KEEP),  # buffered, not next in order: left to the invoker

    # in the buffer as a WAITING message is: its receive catching up (or an invoker thread)
    # claims it or takes it along, or a poisoned one before it holds it; never kept apart or
    # missed again (its receipt is over)
    (_S.MISSED, _E.CLAIM): (_S.DELIVERING, (_A.RUN_APPLICATION,), _KEEP),
    (_S.MISSED, _E.FOLLOW): (_S.DELIVERING, (_A.RUN_APPLICATION,), _KEEP),
    (_S.MISSED, _E.HOLD): (_S.HELD, (), _CLEAR),

    (_S.RUNNING_FIRST, _E.COMMITTED): (_S.DELIVERED, (), _CLEAR),
    # its application or its receipt failed: nothing of it is stored; buffered now, the try counted
    (_S.RUNNING_FIRST, _E.FAILED): (_S.SETTLING, (_A.JUDGE_FAILURE,), _SET),

    (_S.SETTLING, _E.RETRY): (_S.RETRY_WAIT, (), _SET),
    (_S.SETTLING, _E.NEXT_CYCLE): (_S.CYCLE_WAIT, (), _SET),
    (_S.SETTLING, _E.ANSWER_LATER): (_S.TO_ANSWER, (), _SET),
    (_S.SETTLING, _E.POISON_LATER): (_S.TO_POISON, (), _SET),
    (_S.SETTLING, _E.ANSWERED): (_S.ANSWERED, (), _CLEAR),
    (_S.SETTLING, _E.POISONED): (_S.POISONED, (), _CLEAR),
    (_S.SETTLING, _E.NOT_COUNTED): (_S.WAITING, (), _KEEP),
    (_S.SETTLING, _E.SUSPECTED): (_S.SUSPECT, (), _KEEP),
    (_S.SETTLING, _E.VANISHED): (_S.DELIVERED, (), _CLEAR),

    (_S.SUSPECT, _E.CHARGE): (_S.SETTLING, (_A.JUDGE_FAILURE,), _KEEP),
    (_S.SUSPECT, _E.ABSORB): (_S.WAITING, (), _KEEP),

    (_S.TO_ANSWER, _E.ANSWERED): (_S.ANSWERED, (), _CLEAR),
    (_S.TO_ANSWER, _E.POISONED): (_S.POISONED, (), _CLEAR),
    (_S.TO_POISON, _E.POISONED): (_S.POISONED, (), _CLEAR),

    (_S.HELD, _E.RELEASE): (_S.WAITING, (), _CLEAR),
    (_S.POISONED, _E.RETRY_POISON): (_S.WAITING, (), _CLEAR),
    (_S.POISONED, _E.DISCARD): (_S.DISCARDED, (), _CLEAR),
}

#: Why the pairs not in :data:`RULES` are refused, where there is more to say than UNEXPECTED.
_REFUSALS: dict[tuple[Stage, MessageEvent], Reason] = {
    **{(stage, _E.FOLLOW): Reason.DELIVERED_ALONE
       for stage in (_S.RETRY_WAIT, _S.CYCLE_WAIT, _S.SUSPECT, _S.TO_ANSWER, _S.TO_POISON)},
    **{(_S.SETTLING, event): Reason.BEING_SETTLED for event in (_E.CLAIM, _E.FOLLOW)},
    **{(_S.APART, event): Reason.DELIVERED_APART for event in (_E.CLAIM, _E.FOLLOW, _E.KEPT_APART)},
    # (a receipt after its application ran takes its message, or fails: FAILED)
    **{(_S.RUNNING_FIRST, event): Reason.RUNNING_FIRST for event in (_E.CLAIM, _E.FOLLOW, _E.KEPT_APART,
                                                                      _E.NOT_TAKEN)},
    **{(stage, event): Reason.SETTLED for stage in _SETTLED for event in (_E.CLAIM, _E.FOLLOW)},
}


def _decide(state: MessageState, event: MessageEvent) -> Transition[MessageState] | Reason:
    rule = RULES.get((state.stage, event))
    if rule is None:
        return _REFUSALS.get((state.stage, event), Reason.UNEXPECTED)
    if event is _E.FOLLOW and state.alone:
        return Reason.DELIVERED_ALONE
    stage, actions, alone = rule
    after = MessageState(stage, {_KEEP: state.alone, _SET: True, _CLEAR: False}[alone])
    return Transition(state, after, actions)


#: Every (state, event) answer, computed once: a message takes several events per delivery.
_TABLE: dict[tuple[MessageState, MessageEvent], Transition[MessageState] | Reason] = {
    (state, event): _decide(state, event) for state in MessageState.valid_states() for event in MessageEvent
}


def message_transition(state: MessageState, event: MessageEvent) -> Transition[MessageState]:
    """Apply ``event`` to ``state``; raises :class:`InvalidTransition` when not allowed."""
    try:
        answer = _TABLE[(state, event)]
    except (KeyError, TypeError):
        if not isinstance(event, MessageEvent):
            raise TypeError(f"not a MessageEvent: {event!r}") from None
        raise TypeError(f"not a MessageState: {state!r}") from None
    if isinstance(answer, Reason):
        raise InvalidTransition(state, event, answer)
    return answer


class Way(Enum):
    """How a receive delivers its message: read from the state the receive put it in (:data:`WAYS`)."""

    BUFFERED = "recorded into the buffer: the invoker threads deliver it"
    INSIDE = "taken by its receive's transaction, which delivers it (alone, or together with other receives)"
    APART = "buffered by its receive, which delivers it itself, outside the store's transactions"
    FIRST = "handed to the application before its receipt, which takes it in the same transaction"


#: The stage a receive's message is in while its receive runs -> the way that receive takes.  A
#: receive chooses its way by the state it puts its message in (:func:`way_in`), and what may
#: follow is :data:`RULES`'s: the way is never kept beside the state.  A message received again
#: after its delivery on receipt failed (FAILED: SETTLING, judged after its record) is buffered,
#: and so is one its receipt did not take (NOT_TAKEN: MISSED, behind a gap; the stage, not the
#: way, says that its receive then catches up on the buffer).  No other stage is a receive's.
WAYS: dict[Stage, Way] = {
    _S.WAITING: Way.BUFFERED,
    _S.DELIVERING: Way.INSIDE,
    _S.APART: Way.APART,
    _S.RUNNING_FIRST: Way.FIRST,
    _S.SETTLING: Way.BUFFERED,
    _S.MISSED: Way.BUFFERED,
}


def receipt_way(state: MessageState) -> Way:
    """The way a receive whose message is in ``state`` takes (:data:`WAYS`); ValueError when
    ``state`` is no receive's (a receive never holds a message delivered, poisoned...)."""
    try:
        return WAYS[state.stage]
    except KeyError:
        raise ValueError(f"a receive's message is never {state.label}: it takes no way") from None


def way_in(way: Way) -> MessageState:
    """The state a receive that takes ``way`` puts its message in, before its record: buffered
    (WAITING), taken on receipt (DELIVERING), run before its receipt (RUNNING_FIRST), or kept
    apart by its receive (APART: WAITING, then KEPT_APART, which :data:`RULES` allows)."""
    return _WAYS_IN[way]


def stored_state(attempts: int, cycle: int, *, last_cycle: int) -> MessageState:
    """The state a buffered message's row says it is in (what survives a restart).

    ``attempts`` failed in its current ``cycle`` (cycles begun after the
    first); ``last_cycle`` is the policy's ``max_retry_cycles``: a cycle
    beyond it means the last one ended while messages before it were still
    to deliver.  A message that failed before is delivered on its own.
    """
    if attempts == 0 and cycle == 0:
        return _FRESH
    if cycle > last_cycle:
        return _DUE_FOR_POISON
    return _RETRYING if attempts > 0 else _NEXT_CYCLE


_FRESH = MessageState(Stage.WAITING)
_RETRYING = MessageState(Stage.RETRY_WAIT, True)
_NEXT_CYCLE = MessageState(Stage.CYCLE_WAIT, True)
_DUE_FOR_POISON = MessageState(Stage.TO_POISON, True)

_WAYS_IN: dict[Way, MessageState] = {
    Way.BUFFERED: _FRESH,
    Way.INSIDE: MessageState.initial(taken_on_receipt=True),
    Way.APART: message_transition(_FRESH, MessageEvent.KEPT_APART).state,
    Way.FIRST: MessageState.initial(run_first=True),
}
assert all(receipt_way(state) is way for way, state in _WAYS_IN.items())
