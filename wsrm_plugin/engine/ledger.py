"""What the invoker knows about each message beyond its row: its state in the delivery machine.

The store keeps a buffered message's durable history (failed attempts, retry
cycle, next attempt time); :func:`~wsrm_plugin.statemachine.stored_state`
reads its state from that.  A few states are known only to this process: a
failure being judged (SETTLING), a failure that looked like an outage and is
not counted yet (SUSPECT), a message given up whose turn has not come
(TO_ANSWER, TO_POISON: the exception to answer or report with), a message its
receive delivers apart (APART: no invoker thread may take it), a message whose
application runs before its receipt (RUNNING_FIRST: it has no row yet), and a
message to deliver alone although its row says nothing (its batch's commit failed).
The ledger keeps exactly those, and every change of a message's state goes
through :func:`~wsrm_plugin.statemachine.message_transition`: the invoker
asks, the machine answers, the ledger remembers what the row cannot.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from ..statemachine import MessageEvent, MessageState, Stage, Transition, message_transition, stored_state
from ..store import BufferedMessage

__all__ = ["Kept", "MessageLedger"]

Key = tuple[str, int]

#: States the row does not say, so the ledger must (a WAITING message is kept only when alone).
_REMEMBERED = frozenset({Stage.SETTLING, Stage.SUSPECT, Stage.TO_ANSWER, Stage.TO_POISON, Stage.WAITING, Stage.APART,
                         Stage.RUNNING_FIRST})
#: Ways in that no row says, so the ledger is told (:meth:`MessageLedger.enter`).
_ENTERED = frozenset({Stage.RUNNING_FIRST})


@dataclass(frozen=True)
class Kept:
    """A message's state in this process, with what its next steps need."""

    state: MessageState
    msg: BufferedMessage
    #: The failure being judged, suspected, or to answer or report the message with.
    error: BaseException | None = None
    #: Its next attempt was put off without counting a failure (an outage): undone on resume.
    deferred: bool = False


def _key(msg: BufferedMessage) -> Key:
    return (msg.sequence_id, msg.number)


class MessageLedger:
    """The delivery machine's states of this process's messages (thread-safe)."""

    def __init__(self, last_cycle: int) -> None:
        self._last_cycle = last_cycle
        self._kept: dict[Key, Kept] = {}
        self._lock = threading.Lock()

    def state(self, msg: BufferedMessage) -> MessageState:
        """What the machine says ``msg`` is in: this process's knowledge, else its row's."""
        kept = self._kept.get(_key(msg))
        if kept is not None:
            return kept.state
        return stored_state(msg.attempts, msg.cycle, last_cycle=self._last_cycle)

    def kept(self, msg: BufferedMessage) -> Kept | None:
        return self._kept.get(_key(msg))

    def enter(self, msg: BufferedMessage, state: MessageState) -> None:
        """``msg``, which has no row yet, is in this process's hands in ``state``: a way in that
        no row can say (RUNNING_FIRST: its application runs before its receipt, which takes it).
        What follows goes through :meth:`apply`.  Only its receive adds it, and nothing else
        can take the message meanwhile: it is in no buffer."""
        if state.stage not in _ENTERED:
            raise ValueError(f"a message enters the ledger only running before its receipt, not {state.label}")
        with self._lock:
            self._kept[_key(msg)] = Kept(state, msg)

    def apply(self, msg: BufferedMessage, event: MessageEvent, *, state: MessageState | None = None,
              error: BaseException | None = None, deferred: bool | None = None) -> Transition[MessageState]:
        """Apply ``event`` to ``msg`` (in ``state``, else its current one) and remember the result.

        Raises :class:`~wsrm_plugin.statemachine.InvalidTransition` when the
        machine refuses, remembering nothing.  ``error`` replaces the kept
        error (else it is kept); ``deferred`` likewise.
        """
        return self._apply(msg, event, state, error, deferred)[0]

    def take(self, msg: BufferedMessage, event: MessageEvent) -> tuple[Transition[MessageState], BaseException | None]:
        """``msg`` is taken (CLAIM or FOLLOW): the transition, and the error it was kept with."""
        result, before = self._apply(msg, event, None, None, None)
        return result, before.error if before is not None else None

    def _apply(self, msg: BufferedMessage, event: MessageEvent, state: MessageState | None,
               error: BaseException | None, deferred: bool | None) -> tuple[Transition[MessageState], Kept | None]:
        key = _key(msg)
        if key not in self._kept:
            # every delivery passes here: a message nothing is kept about, going where nothing needs
            # keeping (WAITING -> DELIVERING -> DELIVERED), takes no lock.  An entry is only ever
            # added for a message its adder's transaction holds, so none appears under our feet.
            result = message_transition(state if state is not None else stored_state(
                msg.attempts, msg.cycle, last_cycle=self._last_cycle), event)
            after = result.state
            if not (after.stage in _REMEMBERED and (after.stage is not Stage.WAITING or after.alone)):
                return result, None
        with self._lock:
            kept = self._kept.get(key)
            if state is None:
                state = kept.state if kept is not None else stored_state(
                    msg.attempts, msg.cycle, last_cycle=self._last_cycle)
            result = message_transition(state, event)
            after = result.state
            if after.stage in _REMEMBERED and (after.stage is not Stage.WAITING or after.alone):
                self._kept[key] = Kept(
                    after, msg, error if error is not None else (kept.error if kept is not None else None),
                    deferred if deferred is not None else (kept.deferred if kept is not None else False))
            elif kept is not None:
                del self._kept[key]
        return result, kept

    def in_stage(self, stage: Stage) -> list[Kept]:
        """The kept messages in ``stage`` (a snapshot)."""
        with self._lock:
            return [kept for kept in self._kept.values() if kept.state.stage is stage]

    def deferred(self) -> list[Kept]:
        """The kept messages whose next attempt was put off by an outage (a snapshot)."""
        with self._lock:
            return [kept for kept in self._kept.values() if kept.deferred]

    def undefer(self, messages: Iterable[BufferedMessage]) -> None:
        """Their put-off attempts were brought forward again: forget that they were put off."""
        with self._lock:
            for msg in messages:
                kept = self._kept.get(_key(msg))
                if kept is not None:
                    self._kept[_key(msg)] = Kept(kept.state, kept.msg, kept.error, False)

    def __len__(self) -> int:
        return len(self._kept)
