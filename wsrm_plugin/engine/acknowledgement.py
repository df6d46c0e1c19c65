"""The RMD worker: standalone acknowledgements, and the end of destination sequences.

When a sequence's AcksTo is anonymous its acknowledgements ride the HTTP
responses and this worker has nothing to send for it.  When AcksTo is an
address, every received message leaves the sequence owing an
acknowledgement by ``now + acknowledgement_interval`` (0: at once); the
retransmission worker piggybacks it on a message going to that address when
there is one, and this worker sends whatever is still owed when it falls due
as a SequenceAcknowledgement message of its own.

An AcksTo the retransmission worker's breaker judged unreachable
(:mod:`.reachability`) gets its acknowledgements held, or sent as its probe,
like the messages to it.

Housekeeping also lives here: a sequence with no activity for the
inactivity timeout (or past its Expires) is ended, and a terminated sequence
is deleted once the invoker has nothing left to deliver from it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..statemachine import RMDDuty, rmd_duties
from ..store import RmdSequence, StorageManager, StoreTransaction
from ..store.api.records import ACTIVITY_GRAIN
from ..store.api.states import received_ranges, rmd_state
from ..wire import SequenceAcknowledgement
from ..wire.namespaces import AddressingVersion
from .destination import Destination
from .envelopes import protocol_message
from .inbound import Inbound
from .logs import for_sequence
from .policy import RMPolicy
from .reachability import Gate, Reachability, failure_of, retry_after_of
from .source import Source, rm_version_of

from .transport import Transport, TransportError

__all__ = ["AcknowledgementWorker"]

log = logging.getLogger(__name__)

_BATCH = 100


class AcknowledgementWorker:
    """One round of the RMD worker: ``step()`` (run by a :class:`~.workers.Worker`)."""

    def __init__(self, store: StorageManager, policy: RMPolicy, destination: Destination, inbound: Inbound,
                 transport: Transport, *, source: Source, housekeeping_interval: float = 1.0,
                 reachability: Reachability | None = None) -> None:
        self.store = store
        self.source = source
        self.policy = policy
        self.destination = destination
        self.inbound = inbound
        self.transport = transport
        self.housekeeping_interval = housekeeping_interval
        self.reachability = reachability or Reachability(policy)
        #: Inactivity is counted from here at the earliest: the time this process was not running
        #: is no silence of the peer's (see _housekeeping).
        self.started_at = time.time()
        self._next_housekeeping = 0.0
        self.acks_sent = 0
        self.released = 0

    def request_housekeeping(self) -> None:
        self._next_housekeeping = 0.0

    def step(self) -> bool:
        now = time.time()
        worked = self._send_acks(now)
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + self.housekeeping_interval
            worked = self._housekeeping(now) or worked
        return worked

    def _send_acks(self, now: float) -> bool:
        with self.store.begin() as tx:
            due = tx.rmd.needing_ack(now, limit=_BATCH)
        for seq in due:
            if self.destination.acks_on_back_channel(seq):
                with self.store.begin() as tx:
                    if tx.rmd.get(seq.sequence_id) is not None:
                        tx.rmd.ack_sent(seq.sequence_id)
                continue
            ack = self.destination.ack_for(seq)
            if ack is None:
                continue
            self._send(seq, ack, now)
        return bool(due)

    def _send(self, seq, ack: SequenceAcknowledgement, now: float) -> None:
        rm = rm_version_of(seq)
        soap = self.policy.soap_version
        wsa = AddressingVersion.for_namespace(seq.wsa_version) or rm.addressing
        action = rm.sequence_acknowledgement_action
        data = protocol_message(soap, wsa, to=seq.acks_to, action=action, headers=[ack.to_xml(rm, soap)])
        slog = for_sequence(log, seq.sequence_id)
        gate = self.reachability.gate(seq.acks_to)
        if gate is Gate.WAIT:  # sent when the peer answers again (or as a later probe)
            self._again(seq, now + self.reachability.hold_seconds())
            return
        probe = gate is Gate.PROBE
        try:
            response = self.transport.send(seq.acks_to, data, soap.http_headers(action))
        except TransportError as exc:
            self.reachability.failed(seq.acks_to, str(exc), probe=probe)
            level = logging.INFO if self.reachability.sending(seq.acks_to) else logging.DEBUG
            slog.log(level, "acknowledgement to %s not delivered (will retry): %s", seq.acks_to, exc)
            self._again(seq, now + self.policy.base_retransmission_interval)
            return
        failure = failure_of(response)
        if failure is not None:  # a gateway's 502, a 503: not delivered either
            self.reachability.failed(seq.acks_to, failure, probe=probe, retry_after=retry_after_of(response))
            level = logging.INFO if self.reachability.sending(seq.acks_to) else logging.DEBUG
            slog.log(level, "acknowledgement to %s not delivered (will retry): %s", seq.acks_to, failure)
            self._again(seq, now + self.policy.base_retransmission_interval)
            return
        self.reachability.answered(seq.acks_to)
        self.acks_sent += 1
        if response.body and response.is_xml:
            self.inbound.read_response(response.body, origin=f"{response.describe(seq.acks_to)} to an acknowledgement")
        elif not 200 <= response.status < 300:
            slog.warning("acknowledgement answered with %s", response.describe(seq.acks_to))
        self.destination.ack_delivered(seq)
        slog.debug("acknowledged %s to %s", ack.ranges, seq.acks_to)

    def _again(self, seq: Any, at: float) -> None:
        with self.store.begin() as tx:
            if tx.rmd.get(seq.sequence_id) is not None:
                tx.rmd.update(seq.sequence_id, ack_due_at=at)

    def _housekeeping(self, now: float) -> bool:
        with self.store.begin() as tx:
            sequences = tx.rmd.list_all()
        worked = False
        timeout = self.policy.inactivity_timeout
        for seq in sequences:
            # A destination that was down itself (stopped, crashed, its host rebooted) heard
            # nothing because it was not there: counting that as the source's silence would end
            # every sequence at its restart after a stop longer than the timeout, and each
            # source would find its sequence gone (faulted, its messages waiting for an operator).
            # So the timer runs from this process's start at the earliest.
            # A store writes a receipt's last_activity once a second at most (ACTIVITY_GRAIN): the
            # one read may be that much behind the sequence's last message, and a timeout below a
            # second would otherwise end a sequence that is receiving.
            last_activity = max(seq.last_activity + ACTIVITY_GRAIN, self.started_at)
            if RMDDuty.RELEASE in rmd_duties(rmd_state(seq)):
                worked = self._release(seq.sequence_id) or worked
            elif (timeout is not None and last_activity + timeout <= now) or \
                    (seq.expires is not None and seq.expires <= now):
                worked = self.destination.expire(seq.sequence_id) or worked
        return worked

    def _release(self, sequence_id: str) -> bool:
        """Delete a terminated sequence once nothing more can be delivered from it.

        Messages still buffered then wait behind a gap that will never be filled
        (the source terminated without sending the missing numbers).  They were
        accepted and acknowledged, so they are not dropped: each goes to the poison
        store with the reason, where ``wsrm poison list`` shows it and an operator
        delivers it out of order (``retry``) or discards it.
        """
        with self.store.begin() as tx:
            seq = tx.rmd.get(sequence_id)
            if seq is None or RMDDuty.RELEASE not in rmd_duties(rmd_state(seq)):
                return False
            if tx.invoker.next_deliverable(sequence_id, in_order=self.policy.in_order) is not None:
                return False  # the invoker is still delivering (or retrying a failed delivery)
            if any(p.held for p in tx.invoker.list_poison(sequence_id)):
                return False  # held behind a poison message until an operator retries or discards it
            kept = self._keep_behind_gap(tx, seq)
            tx.invoker.discard(sequence_id)
            tx.rmd.delete(sequence_id)
            self.source.end_reply_sequence(tx, sequence_id)
        self.destination.forget(sequence_id)
        self.released += 1
        slog = for_sequence(log, sequence_id)
        if kept:
            slog.warning("released; %d message(s) behind a gap that will never be filled are kept in the "
                         "poison store (`wsrm poison list`): deliver them out of order with `wsrm poison "
                         "retry` or discard them", kept)
        else:
            slog.debug("released")
        return True

    @staticmethod
    def _keep_behind_gap(tx: StoreTransaction, seq: RmdSequence) -> int:
        """Move the messages of terminated sequence ``seq`` that wait behind a gap into the poison store."""
        received = received_ranges(seq)
        reason = (f"behind a gap that will never be filled: the sequence was terminated without message(s) "
                  f"{received.missing_up_to(received.highest)} (received {received})")
        kept = 0
        while (msg := tx.invoker.next_deliverable(seq.sequence_id, in_order=False)) is not None:
            tx.invoker.poison(seq.sequence_id, msg.number, hold=False, error=reason)
            kept += 1
        return kept
