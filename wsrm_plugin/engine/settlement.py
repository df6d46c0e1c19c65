"""What follows a failed delivery: whose fault it was, and whether the message is retried, put off,
given up with its fault, or moved to the poison store.

When the application's handler raises, the delivery's transaction rolls back
and the message stays in the store: an accepted message is never deleted
unless someone decides so.  The message is SETTLING (the delivery machine,
:mod:`wsrm_plugin.statemachine.delivery`) while this module judges, in a
transaction of its own, what was raised (WCF's queued delivery and a broker's
redelivery policy are the anchors; the knobs are in :class:`~.policy.RMPolicy`):

* contention in the store (a lock timeout) or the store unable to write is
  nobody's fault: nothing is counted;
* a failure the way an outage fails (:mod:`.outage`) is the service's, not the
  message's, when another message fails the same way next: the outage machine
  decides, and nothing is counted unless another message is delivered first;
* an :class:`ApplicationFault` (the service's declared SOAP fault) is the
  service's answer: after ``max_delivery_attempts`` (at once for a Sender
  fault) a new transaction takes the message out and sends the fault back on
  the response sequence; when nobody can be answered (a one-way message) the
  message goes to the poison store instead;
* anything else is a *failure to process* (a bug, a bad message): the message
  is tried again after a growing delay, in retry cycles separated by
  ``retry_cycle_delay``, its attempt count, cycle and next attempt time written
  to the store (a restart goes on where it was); after the last cycle it moves
  to the poison store, which ``wsrm poison`` lists, retries and discards.  The
  sequence waits for it (``poison_handling="hold"``) or goes on without it.

The application's ``on_delivery_failure`` hook hears of every message given
up without an answer.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..statemachine import InvalidTransition, MessageEvent, ServiceAction, Stage
from ..store import BufferedMessage, LockTimeoutError, StorageManager, StoreTransaction, StoreUnavailableError
from ..wire import SoapFault, SoapVersion, fault_envelope, to_bytes
from .ledger import MessageLedger
from .logs import for_sequence
from .outage import DeliveryPause, is_outage
from .policy import RMPolicy
from .source import Source

__all__ = ["ApplicationFault", "FailedDelivery", "RecordedFailure", "Settlement", "describe_error"]

#: The invoker's logger: what follows a failed delivery is part of delivering, and operators set
#: delivery's logging by that name.
log = logging.getLogger(__name__.rpartition(".")[0] + ".invoker")

_E = MessageEvent
#: Seconds an attempt put off by an outage waits beyond the next probe, so that probe tries another.
_AFTER_PROBE = 0.1


@dataclass(frozen=True)
class FailedDelivery:
    """A message the application could not process within its attempts (given up).

    ``poison_id`` names it in the poison store (``wsrm poison show``), where it
    stays until an operator retries or discards it; None for a message the
    engine could not keep there.
    """

    sequence_id: str
    message_number: int
    message_id: str | None
    action: str
    payload: bytes
    error: BaseException
    poison_id: str | None = None


class ApplicationFault(Exception):
    """Raised by a handler whose service answered with a SOAP fault.

    The delivery rolls back like for any error; when it is given up, this
    ``envelope`` (the service's own fault, not a generic one) is what goes
    back on the response sequence.  ``retryable=False`` gives up at once: a
    Sender fault says the request itself is wrong, so running it again cannot help.
    """

    def __init__(self, envelope: bytes, reason: str = "the service answered with a SOAP fault", *,
                 retryable: bool = True) -> None:
        super().__init__(reason)
        self.envelope = envelope
        self.retryable = retryable


class RecordedFailure(Exception):
    """The error of a failed attempt known only from the store (the attempt ran before a restart)."""

    def __init__(self, description: str | None) -> None:
        super().__init__(description or "a failure recorded in the store")


def describe_error(exc: BaseException, limit: int = 2000) -> str:
    """What the store keeps of an error: its type and message, bounded."""
    text = str(exc) if isinstance(exc, RecordedFailure) else f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + "..."


def _store_unavailable(exc: BaseException | None) -> bool:
    """Was ``exc`` caused by a store that cannot write now (also when a commit wrapped it)?"""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, StoreUnavailableError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class Settlement:
    """Judges failed deliveries and settles what is given up (used by the invoker's threads and
    by receives that deliver).  Counts what it did, for the engine's status."""

    def __init__(self, store: StorageManager, policy: RMPolicy, source: Source, *,
                 transaction: Callable[[], contextlib.AbstractContextManager[StoreTransaction]],
                 ledger: MessageLedger, pause: DeliveryPause,
                 after_commit: Callable[[], None], on_delivered: Callable[[], None],
                 on_failure: Callable[[FailedDelivery], None] | None) -> None:
        self.store = store
        self.policy = policy
        self.source = source
        self._transaction = transaction
        self._ledger = ledger
        self.pause = pause
        self._after_commit = after_commit
        self._on_delivered = on_delivered
        self._on_failure = on_failure
        #: Messages given up: answered with a fault, or moved to the poison store.
        self.failed = 0
        #: Of those, moved to the poison store.
        self.poisoned = 0
        #: Failed attempts counted (each rolled back and scheduled again).
        self.retries = 0

    def outage(self, exc: BaseException) -> bool:
        """Something failed the way an outage fails before or after any message was to blame
        (a claim, a batch's commit): tell the service machine.  False when ``exc`` is not of that
        kind (the caller goes on as before)."""
        if not (self.policy.pause_on_outage and is_outage(exc, self.policy)):
            return False
        self.service_actions(self.pause.outage(exc))
        return True

    def judge(self, msg: BufferedMessage, exc: BaseException) -> bool:
        """After a delivery of ``msg`` rolled back because of ``exc`` (``msg`` is SETTLING): whose
        fault was it, and what follows.  True when ``msg`` was settled (given up or gone).

        The count goes to the store in a transaction of its own.  When even
        that fails (the store itself is unavailable) nothing is spent: the
        message is simply tried again later.
        """
        try:
            return self._verdict(msg, exc)
        except Exception:  # noqa: BLE001 -- the store is down: retried after a poll interval
            log.exception("could not record the failed delivery of message %d of sequence %s "
                          "(it stays in the store and is tried again)", msg.number, msg.sequence_id)
            with contextlib.suppress(InvalidTransition):
                self._ledger.apply(msg, _E.NOT_COUNTED)
            return False

    def _verdict(self, msg: BufferedMessage, exc: BaseException) -> bool:
        slog = for_sequence(log, msg.sequence_id, msg.number)
        if isinstance(exc, LockTimeoutError):  # contention in the store, not the application's doing
            slog.warning("delivery rolled back on a lock timeout (not counted as an attempt): %s", exc)
            self._ledger.apply(msg, _E.NOT_COUNTED)
            return False
        if not isinstance(exc, ApplicationFault) and self.policy.pause_on_outage and is_outage(exc, self.policy):
            return self._outage_failure(msg, exc)
        if _store_unavailable(exc):
            # the store, not the message, failed (disk full, database down): the message's
            # attempts are for the application's failures, so this one is not counted
            slog.warning("delivery rolled back, the store cannot take writes now (will retry, "
                         "no attempt counted): %s", exc)
            self._ledger.apply(msg, _E.NOT_COUNTED)
            return False
        self.service_actions(self.pause.failed())
        return self._counted(msg, exc)

    def _counted(self, msg: BufferedMessage, exc: BaseException) -> bool:
        if isinstance(exc, ApplicationFault):
            return self._fault_failed(msg, exc)
        return self._processing_failed(msg, exc)

    def _outage_failure(self, msg: BufferedMessage, exc: BaseException) -> bool:
        """``msg`` failed the way an outage fails: not counted; the service machine says whether
        it is suspect (the next delivery of another message decides) or the outage's (absorbed).

        Either way its next attempt is put off in the store without counting:
        a suspect by the delay its failure would have cost (other messages get
        the chance to prove the service works first), an absorbed one until
        after the next probe (so that the probe tries another message first).
        """
        actions = self.pause.outage(exc)
        slog = for_sequence(log, msg.sequence_id, msg.number)
        if ServiceAction.SUSPECT_MESSAGE in actions:
            delay = self.policy.delivery_retry_delay_after(msg.attempts + 1)
            self._put_off(msg, exc, _E.SUSPECTED, delay)
            slog.info("delivery failed as an outage fails (%s): not counted unless another message is "
                      "delivered meanwhile; tried again in %.1fs", describe_error(exc), delay)
        else:
            self._put_off(msg, exc, _E.NOT_COUNTED, self.pause.next_probe_in() + _AFTER_PROBE)
            slog.debug("delivery failed during an outage (%s): not counted", describe_error(exc))
        self.service_actions(actions)
        return False

    def _put_off(self, msg: BufferedMessage, exc: BaseException, event: MessageEvent, delay: float) -> None:
        """Apply ``event`` to ``msg`` and put its next attempt ``delay`` seconds off, uncounted."""
        try:
            with self.store.begin() as tx:
                current = tx.invoker.get(msg.sequence_id, msg.number)
                if current is not None:
                    current = tx.invoker.record_failure(
                        msg.sequence_id, msg.number, attempts=current.attempts, cycle=current.cycle,
                        next_attempt_at=time.time() + delay, error=describe_error(exc))
        except Exception as store_error:  # noqa: BLE001 -- the store is down too: tried at the next probe
            log.debug("could not put off message %d of sequence %s: %s", msg.number, msg.sequence_id, store_error)
            self._ledger.apply(msg, event, error=exc, deferred=False)
            return
        if current is None:
            self._ledger.apply(msg, _E.VANISHED)
            return
        self._ledger.apply(current, event, error=exc, deferred=True)

    def succeeded(self) -> None:
        """After a commit that delivered: the service works."""
        actions = self.pause.delivered()
        if actions:
            self.service_actions(actions)

    def service_actions(self, actions: tuple[ServiceAction, ...]) -> None:
        """The message side of the service machine's actions (its own side is done)."""
        for action in actions:
            if action is ServiceAction.CHARGE_SUSPECTS:
                for kept in self._ledger.in_stage(Stage.SUSPECT):
                    try:
                        self._ledger.apply(kept.msg, _E.CHARGE)
                    except InvalidTransition:
                        continue  # taken again meanwhile: that delivery's outcome decides
                    self._judge_counted(kept.msg, kept.error or RecordedFailure(kept.msg.last_error))
            elif action is ServiceAction.PAUSE:
                for kept in self._ledger.in_stage(Stage.SUSPECT):
                    with contextlib.suppress(InvalidTransition):
                        self._ledger.apply(kept.msg, _E.ABSORB)
            elif action is ServiceAction.RESUME:
                self._bring_forward()

    def _judge_counted(self, msg: BufferedMessage, exc: BaseException) -> None:
        """A suspect's failure is its own after all (another message was delivered): count it."""
        for_sequence(log, msg.sequence_id, msg.number).info(
            "another message was delivered since this one failed (%s): its failure counts", describe_error(exc))
        try:
            self._counted(msg, exc)
        except Exception:  # noqa: BLE001 -- the store is down: it is tried again, uncounted
            log.exception("could not record the failed delivery of message %d of sequence %s",
                          msg.number, msg.sequence_id)
            with contextlib.suppress(InvalidTransition):
                self._ledger.apply(msg, _E.NOT_COUNTED)

    def _bring_forward(self) -> None:
        """Delivery resumed: the attempts an outage put off are due now, not after their back-off."""
        deferred = self._ledger.deferred()
        if not deferred:
            return
        done: list[BufferedMessage] = []
        try:
            with self.store.begin() as tx:
                for kept in deferred:
                    current = tx.invoker.get(kept.msg.sequence_id, kept.msg.number)
                    if current is not None and (current.attempts, current.cycle) == (kept.msg.attempts, kept.msg.cycle):
                        tx.invoker.record_failure(current.sequence_id, current.number, attempts=current.attempts,
                                                  cycle=current.cycle, next_attempt_at=None,
                                                  error=current.last_error or "")
                    done.append(kept.msg)
        except Exception as exc:  # noqa: BLE001 -- they come due by themselves, a few seconds later
            log.debug("could not bring the put-off deliveries forward: %s", exc)
            return
        self._ledger.undefer(done)

    def _gone(self, msg: BufferedMessage, error: str) -> None:
        """A failed delivery's message is no longer in the buffer: delivered after all (by another
        thread, or by this attempt, whose commit's answer was lost) or discarded.  Said out loud:
        the application may have run for a message this attempt did not deliver, and what it did
        outside its transaction then happened twice (a claim that returned a message just
        delivered did that, silently, until the claim was fixed)."""
        for_sequence(log, msg.sequence_id, msg.number).warning(
            "delivery failed (%s), and the message is no longer in the buffer (delivered after all, "
            "by another thread or by a commit whose answer was lost, or discarded): nothing to retry",
            error)
        with contextlib.suppress(InvalidTransition):
            self._ledger.apply(msg, _E.VANISHED)

    def _first_in_line(self, tx: StoreTransaction, msg: BufferedMessage) -> bool:
        current = tx.invoker.next_deliverable(msg.sequence_id, in_order=self.policy.in_order)
        return current is not None and current.number == msg.number

    def _processing_failed(self, msg: BufferedMessage, exc: BaseException) -> bool:
        """A failure to process: retry later, in this cycle or the next, or poison after the last."""
        slog = for_sequence(log, msg.sequence_id, msg.number)
        error = describe_error(exc)
        settled: Callable[[], None] | None = None
        with self.store.begin() as tx:
            current = tx.invoker.get(msg.sequence_id, msg.number)
            if current is None:
                self._gone(msg, error)
                return True
            step = self.policy.after_failure(current.attempts, current.cycle, time.time())
            current = tx.invoker.record_failure(
                msg.sequence_id, msg.number, attempts=step.attempts, cycle=step.cycle,
                next_attempt_at=step.next_attempt_at, error=error)
            if step.poisoned and self._first_in_line(tx, current):
                settled = self.poison(tx, current, exc)
        self.retries += 1
        if settled is not None:
            settled()
            return True
        if step.poisoned:
            self._ledger.apply(msg, _E.POISON_LATER, error=exc)
            slog.warning("last delivery attempt failed (%s); moved to the poison store once the "
                         "messages before it are delivered", error)
        elif step.attempts == 0:
            self._ledger.apply(msg, _E.NEXT_CYCLE)
            slog.warning("retry cycle %d of %d failed (%d attempts, rolled back): %s; next cycle in %.1fs",
                         step.cycle, self.policy.max_retry_cycles + 1, self.policy.max_delivery_attempts,
                         error, self.policy.retry_cycle_delay)
        else:
            self._ledger.apply(msg, _E.RETRY)
            slog.warning("delivery attempt %d of %d (cycle %d of %d) failed (rolled back, will retry "
                         "in %.1fs): %s", step.attempts, self.policy.max_delivery_attempts, step.cycle + 1,
                         self.policy.max_retry_cycles + 1, self.policy.delivery_retry_delay_after(step.attempts),
                         error)
        return False

    def _fault_failed(self, msg: BufferedMessage, exc: ApplicationFault) -> bool:
        """The service answered with a SOAP fault: retry it (unless a Sender fault), then answer it."""
        slog = for_sequence(log, msg.sequence_id, msg.number)
        error = describe_error(exc)
        settled: Callable[[], None] | None = None
        with self._transaction() as tx:
            current = tx.invoker.get(msg.sequence_id, msg.number)
            if current is None:
                self._gone(msg, error)
                return True
            attempts = current.attempts + 1
            if exc.retryable and attempts < self.policy.max_delivery_attempts:
                delay = self.policy.delivery_retry_delay_after(attempts)
                tx.invoker.record_failure(msg.sequence_id, msg.number, attempts=attempts, cycle=current.cycle,
                                          next_attempt_at=time.time() + delay, error=error)
                self._ledger.apply(msg, _E.RETRY)
                slog.warning("delivery attempt %d of %d answered with a fault (rolled back, will retry in "
                             "%.1fs): %s", attempts, self.policy.max_delivery_attempts, delay, error)
                self.retries += 1
                return False
            current = tx.invoker.record_failure(msg.sequence_id, msg.number, attempts=attempts,
                                                cycle=current.cycle, next_attempt_at=None, error=error)
            if self._first_in_line(tx, current):
                slog.error("giving up after %d delivery attempts: %s", attempts, error)
                settled = self.give_up(tx, current, exc)
            else:
                self._ledger.apply(msg, _E.ANSWER_LATER, error=exc)
        if settled is not None:
            settled()
        return True

    def give_up(self, tx: StoreTransaction, msg: BufferedMessage, exc: BaseException) -> Callable[[], None]:
        """Answer ``msg`` with its fault in ``tx``, or keep it in the poison store when nobody can be answered.

        Returns what to do once ``tx`` committed.
        """
        if self._reply_with_fault(tx, msg, exc):
            tx.invoker.mark_delivered(msg.sequence_id, msg.number)

            def answered() -> None:
                with contextlib.suppress(InvalidTransition):
                    self._ledger.apply(msg, _E.ANSWERED)
                self.failed += 1
                self._after_commit()
                self._on_delivered()  # the fault reply is stored: a back-channel may wait for it
            return answered
        return self.poison(tx, msg, exc)

    def poison(self, tx: StoreTransaction, msg: BufferedMessage, exc: BaseException) -> Callable[[], None]:
        """Move ``msg`` to the poison store in ``tx``; returns what to do once ``tx`` committed."""
        hold = self.policy.holds_on_poison
        poisoned = tx.invoker.poison(msg.sequence_id, msg.number, hold=hold, error=describe_error(exc))

        def after() -> None:
            with contextlib.suppress(InvalidTransition):
                self._ledger.apply(msg, _E.POISONED)
            self.failed += 1
            self.poisoned += 1
            slog = for_sequence(log, msg.sequence_id, msg.number)
            slog.error(
                "moved to the poison store after %d delivery attempts in %d cycle(s) (last error: %s); %s; "
                "see `wsrm poison show %s`, then `wsrm poison retry` or `discard` it",
                poisoned.total_attempts, poisoned.cycles, poisoned.last_error,
                "its sequence is HELD: nothing after it is delivered until an operator decides" if hold
                else "the rest of its sequence goes on without it", poisoned.poison_id)
            if not hold:
                self._after_commit()
            self._report(FailedDelivery(msg.sequence_id, msg.number, msg.message_id, msg.action, msg.payload,
                                        exc, poison_id=poisoned.poison_id))
        return after

    def _reply_with_fault(self, tx: StoreTransaction, msg: BufferedMessage, exc: BaseException) -> bool:
        soap = SoapVersion.for_namespace(msg.soap_version) or self.policy.soap_version
        if isinstance(exc, ApplicationFault):
            envelope = exc.envelope
        else:
            fault = SoapFault(f"the service failed to process the message: {exc}", code="Receiver")
            envelope = to_bytes(fault_envelope(fault, soap))
        receipt = self.source.enqueue_reply(tx, msg.sequence_id, envelope, reply_to=msg.reply_to,
                                            relates_to=msg.message_id,
                                            action=self.policy.addressing.soap_fault_action,
                                            answers=msg.number)
        return receipt is not None

    def _report(self, failure: FailedDelivery) -> None:
        if self._on_failure is None:
            return  # the poison store keeps it, and the ERROR above named it
        try:
            self._on_failure(failure)
        except Exception:  # noqa: BLE001
            log.exception("the delivery failure hook itself failed")
