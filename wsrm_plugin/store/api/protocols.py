"""What a store is: the :class:`StorageManager` that opens :class:`StoreTransaction` objects,
and the four managers a transaction gives (source sequences, the retransmission queue,
destination sequences, the invoker buffer).

Each is an abstract class a store implements (memory, SQLite, PostgreSQL); the
default methods here are written once against the abstract ones, so a store only
writes what its storage does differently.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Generic, Self, TypeVar, overload

from txmanager.xa import XAResource

from ...statemachine.ackranges import AckRanges
from .errors import (
    _RANK_NAMES,
    InvalidAcknowledgementError,
    LockOrderError,
    StoreError,
    TransactionClosedError,
    UnknownMessageError,
    UnknownSequenceError,
)
from .ranges import check_number, format_ranges
from .records import (
    BufferedMessage,
    InvokerSequence,
    NodeCondition,
    PoisonMessage,
    RmdSequence,
    RmdSequenceStatus,
    RmsMessage,
    RmsSequence,
    RmsSequenceStatus,
    StoreStatus,
    _now,
)
from .states import rmd_state_name, rms_life, rms_state_name

log = logging.getLogger(__name__)

class _Manager:
    def __init__(self, tx: "StoreTransaction") -> None:
        self._tx = tx


_M = TypeVar("_M", bound=_Manager)
#: The names a store transaction's managers go under (see ManagerOnFirstUse and
#: StoreTransaction._drop_managers).
_MANAGER_NAMES = frozenset(("rms", "rms_messages", "rmd", "invoker", "conditions"))


class ManagerOnFirstUse(Generic[_M]):
    """A store transaction's manager (``tx.rmd``...), made the first time it is read.

    A receive uses one or two of the managers, a branch that runs one
    statement none, an invoker's claim one; making them all for every
    transaction was four or five Python calls (each run cold between two round
    trips on a SQL store; several transactions a message on the memory store,
    which sets them in its own module too).  A non-data descriptor: the
    manager made goes into the transaction's ``__dict__``, where every later
    read finds it without a call.  Not ``functools.cached_property``: on
    Python 3.11 its first read takes a lock shared by every instance of the
    class, which would serialize the first use of a manager across all the
    threads running transactions.
    """

    __slots__ = ("_cls", "_name")

    def __init__(self, name: str, cls: type[_M]) -> None:
        self._name = name
        self._cls = cls

    @overload
    def __get__(self, tx: None, owner: type | None = None) -> "ManagerOnFirstUse[_M]": ...

    @overload
    def __get__(self, tx: StoreTransaction, owner: type | None = None) -> _M: ...

    def __get__(self, tx: StoreTransaction | None, owner: type | None = None) -> "_M | ManagerOnFirstUse[_M]":
        if tx is None:
            return self
        manager = tx.__dict__[self._name] = self._cls(tx)
        return manager


class RmsSequenceManager(_Manager, ABC):
    """Source sequences, by internal key or by the peer's sequence identifier."""

    @abstractmethod
    def create(self, key: str, *, target: str, acks_to: str, rm_version: str,
               wsa_version: str, offered_id: str | None = None, expires: float | None = None,
               next_control_at: float | None = None, now: float | None = None) -> RmsSequence:
        """Create a sequence (locks it). :class:`DuplicateSequenceError` if ``key`` exists.

        ``next_control_at`` defaults to ``now``: a new sequence needs its
        CreateSequence sent.
        """

    @abstractmethod
    def get(self, key: str, *, beside_enqueues: bool = False) -> RmsSequence | None:
        """The sequence, locked for this transaction, or None.

        ``beside_enqueues``: locked only as work on its messages needs it (the sender's, an
        acknowledgement that is not Final): while the sequence is open to enqueues (no last
        message, not closing, not faulted), such work changes nothing of it but its messages,
        and a store whose locks tell writers apart (PostgreSQL) then holds the row only against
        changes of its state (close, terminate, fault, delete): callers' enqueues, which take
        numbers from the same row, neither wait for that work nor hold it up.  Otherwise, and
        on the other stores, the row is locked as for any change.  A write of the row later in
        the transaction still holds off every other writer: nothing of it is lost.
        """

    @abstractmethod
    def get_by_sequence_id(self, sequence_id: str, *, beside_enqueues: bool = False) -> RmsSequence | None:
        """The sequence whose peer-assigned identifier is ``sequence_id`` (locked as :meth:`get`
        locks it), or None."""

    @abstractmethod
    def update(self, key: str, **changes: Any) -> RmsSequence:
        """Change state factors (see :attr:`RmsSequence.UPDATABLE`); returns the new record."""

    @abstractmethod
    def mark_last(self, key: str) -> RmsSequence:
        """The application sends no more: last_message set, last_number = highest number."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the sequence and every message it still holds."""

    @abstractmethod
    def needing_work(self, now: float | None = None, limit: int = 100) -> list[RmsSequence]:
        """Sequences whose ``next_control_at`` or ``expires`` has come (no lock)."""

    @abstractmethod
    def list_all(self) -> list[RmsSequence]:
        """Every source sequence (no lock), oldest first."""

    def peek(self, key: str) -> RmsSequence | None:
        """The sequence as this transaction sees it, without locking it, or None.

        For a look taken before the lock it may lead to (a transaction locks
        RMD records before RMS ones, so one holding an RMD lock may only read
        an RMS record), or where an answer that changes a moment later is
        harmless.  Per call, not per sequence: the stores answer it by key;
        this default scans, for a store that has nothing better.
        """
        return next((seq for seq in self.list_all() if seq.key == key), None)

    def peek_by_sequence_id(self, sequence_id: str) -> RmsSequence | None:
        """:meth:`peek` of the sequence whose peer-assigned identifier is ``sequence_id``."""
        return next((seq for seq in self.list_all() if seq.sequence_id == sequence_id), None)

    # shared helper
    def require(self, key: str) -> RmsSequence:
        seq = self.get(key)
        if seq is None:
            raise UnknownSequenceError("RMS", key)
        return seq


class RmsMessageManager(_Manager, ABC):
    """The retransmission queue of the source sequences.

    A message is locked through its sequence: every method that locks takes
    the sequence's lock first, then the message rows (one order, no
    deadlock between a poller and an acknowledgement).

    Message numbers are handed out by :meth:`enqueue` from the sequence's
    ``next_number`` under the sequence's lock, so they are gap-free and unique
    under any concurrency: a transaction that rolls back gives its numbers
    back.  The price: the sequence stays locked until the enqueuing
    transaction ends, so keep such transactions short.
    """

    @abstractmethod
    def enqueue(self, sequence_key: str, payload: bytes, *, action: str, soap_version: str,
                message_id: str, last: bool = False, reply_callback: str | None = None,
                reply_context: bytes | None = None, send_at: float | None = None,
                now: float | None = None, awaits_reply: bool = False,
                handed_out: bool = False) -> RmsMessage:
        """Append a message with the next number (locks the sequence).

        ``last=True`` makes it the sequence's last message (WS-RM 1.0
        LastMessage).  The message is ``reply_pending`` (kept until
        :meth:`reply_received`) when it has a ``reply_callback`` or
        ``awaits_reply``.  Raises :class:`SequenceNotOpenError` when the
        sequence already has its last message, is closed, terminated or
        faulted, and :class:`MessageNumberRolloverError` when the numbers are
        used up.

        ``handed_out``: a back-channel reply that the thread which received its request hands
        out in the HTTP response itself, in this transaction: stored as sent once already
        (``send_count`` 1, ``last_sent_at`` now), what :meth:`record_send_attempt` would make
        it, without a statement more; its client may acknowledge it from the commit on.
        """

    @abstractmethod
    def get(self, sequence_key: str, number: int) -> RmsMessage | None:
        """One message (locks its sequence), or None if unknown or purged.

        :class:`UnknownSequenceError` when the sequence itself does not exist.
        """

    @abstractmethod
    def find_by_message_id(self, message_id: str) -> RmsMessage | None:
        """The request with that wsa:MessageID (no lock): correlates a response.  A request is a
        message enqueued awaiting a reply (``awaits_reply`` or a ``reply_callback``), found before
        its reply and after.  Whether another message is found is the store's choice: the SQL
        stores index only requests by their message id (schema version 13), memory finds any."""

    @abstractmethod
    def mark_acked(self, sequence_key: str, ranges: Iterable[tuple[int, int]],
                   now: float | None = None) -> list[int]:
        """Apply an acknowledgement; returns the numbers acknowledged for the first time.

        :class:`InvalidAcknowledgementError` (and nothing changed) when a range
        names a number never sent: not handed out yet, or still unsent.
        """

    def acknowledge(self, sequence_key: str, ranges: Iterable[tuple[int, int]],
                    now: float | None = None, *, keep_awaiting: bool = False) -> tuple[list[int], bool]:
        """Apply an acknowledgement and purge what it finished: :meth:`mark_acked`, then whether
        the sequence still has an unacknowledged message (:meth:`has_unacked`), then, when
        anything was newly acknowledged, :meth:`purge_acked` of the sequence.  Returns (the
        numbers acknowledged for the first time, whether one is still unacknowledged).

        ``keep_awaiting``: a request the acknowledgement names that still waits for its reply
        (``reply_pending``) stays unacknowledged (a source whose replies come in HTTP responses
        sends it again until its reply came), unless the acknowledgement names a number never
        handed out (refused whole).

        What every acknowledgement does, as one step: the PostgreSQL store runs it in
        one round trip instead of six.  :class:`InvalidAcknowledgementError`, and
        nothing changed, as :meth:`mark_acked`.
        """
        merged = AckRanges.from_ranges(ranges)
        if keep_awaiting and merged.ranges:
            awaiting = [m.number for m in self.list_for(sequence_key) if m.reply_pending and not m.acked]
            seq = self._tx.rms.get(sequence_key)
            highest = max(upper for _, upper in merged.ranges)
            if awaiting and (seq is None or highest <= seq.highest_number):
                merged = merged.difference(AckRanges.of(awaiting))
        newly = self.mark_acked(sequence_key, merged.ranges, now=now) if merged.ranges else []
        pending = self.has_unacked(sequence_key)
        if newly:
            self.purge_acked(sequence_key)
        return newly, pending

    def acknowledge_sequence(self, sequence_id: str, ranges: Iterable[tuple[int, int]],
                             now: float | None = None, *, keep_offered_awaiting: bool = False,
                             beside_enqueues: bool = False, alone: bool = False
                             ) -> tuple[RmsSequence, tuple[list[int], bool] | None] | None:
        """:meth:`acknowledge` of the source sequence the peer calls ``sequence_id``, its row
        looked up and locked first (``get_by_sequence_id``): None when there is none; the
        sequence as it was, and None for the acknowledgement (nothing written), when it is not
        transmitting (started and live); else the sequence and :meth:`acknowledge`'s result,
        ``keep_awaiting`` when the sequence carries an Offer and ``keep_offered_awaiting``.

        An acknowledgement riding on a message names its sequence by the peer's identifier:
        the PostgreSQL store looks the row up in the acknowledgement's statement (a round trip
        less on a service's receipt).  :class:`InvalidAcknowledgementError`, and nothing
        changed, as :meth:`acknowledge`.

        ``beside_enqueues``: the row looked up as ``get_by_sequence_id(beside_enqueues=True)``
        looks it up.  ``alone``: the transaction is this acknowledgement only (nothing written
        before it, nothing after it unless it returns a sequence closed to enqueues): the
        PostgreSQL store then sends no BEGIN, and its commit no COMMIT (one round trip for the
        sender's acknowledgement transaction, which was three)."""
        seq = self._tx.rms.get_by_sequence_id(sequence_id, beside_enqueues=beside_enqueues)
        if seq is None:
            return None
        if not rms_life(seq).transmitting:
            return seq, None
        return seq, self.acknowledge(seq.key, ranges, now,
                                     keep_awaiting=keep_offered_awaiting and seq.offered_id is not None)

    def enqueue_claiming(self, sequence_key: str, payload: bytes, *, action: str, soap_version: str,
                         message_id: str, target: str, next_send_at: float, rmd_sequence_id: str | None = None,
                         reply_callback: str | None = None, reply_context: bytes | None = None,
                         send_at: float | None = None, awaits_reply: bool = False, now: float | None = None,
                         acked: Sequence[tuple[int, int]] | None = None
                         ) -> tuple[RmsMessage, bool, RmsSequence, RmdSequence | None] | None:
        """:meth:`enqueue`, then :meth:`claim_first_send_reading` of the message enqueued, when
        its sequence is transmitting to ``target``: the message (as enqueued), whether it was
        claimed, the sequence as the enqueue left it and destination sequence
        ``rmd_sequence_id`` read beside (None where not read).  None, nothing done, where the
        store does not do both in one statement (here): the caller enqueues, then claims.
        ``acked``: ranges the peer acknowledged that no transaction applied yet (the answers to
        earlier callers' sends); the message before counts as acknowledged when among them.  A
        store that cannot judge by them returns None (the caller applies them, then claims).

        A caller waiting for its reply claims its request in the transaction that enqueues it:
        the PostgreSQL store inserts the message as sent, when it is the caller's to send, in
        the statement that takes its number (a round trip less before the request leaves)."""
        return None

    def enqueue_claiming_at_commit(self, sequence_key: str, payload: bytes, *, action: str, soap_version: str,
                                   message_id: str, target: str | None, next_send_at: float,
                                   enqueued: Callable[[RmsMessage, bool, Callable[[], tuple[RmsSequence,
                                                                                         RmdSequence | None]]], None],
                                   otherwise: Callable[[], None], rmd_sequence_id: str | None = None,
                                   reply_callback: str | None = None, reply_context: bytes | None = None,
                                   send_at: float | None = None, awaits_reply: bool = False,
                                   now: float | None = None) -> bool:
        """:meth:`enqueue_claiming`, sent with the commit of the transaction (a branch of a global
        transaction committed in one phase) instead of in a round trip of its own: False,
        nothing done, where the store cannot (here).  Otherwise the message's number is known
        only once the transaction commits: ``enqueued`` is then given the message, whether it
        was claimed, and what gives the sequence and destination sequence ``rmd_sequence_id`` as
        :meth:`enqueue_claiming` returns them (read only when called: a message no caller
        claims needs only its number), before the commit returns.  Where the sequence takes no more
        messages when the commit comes, nothing of the enqueue stays and ``otherwise()`` runs,
        in this transaction, before it commits: the caller enqueues another way (it may open a
        sequence).  A rollback calls neither.  ``target`` None: never claimed (a message the
        sender sends; ``enqueued`` is told it was not)."""
        return False

    def claim_first_send(self, sequence_key: str, number: int, *, next_send_at: float,
                         now: float | None = None) -> RmsMessage | None:
        """Record the first transmission of message ``number`` (as :meth:`record_send_attempt`)
        if it is still unsent and unacknowledged and the message before it is acknowledged (or
        purged); the message as it was before, or None, having changed nothing.

        A caller's thread sending its own request claims it so (a round never sends it then,
        and the retransmission timer covers a send that never ends); the PostgreSQL store in
        one round trip instead of three.
        """
        msg = self.get(sequence_key, number)
        if msg is None or msg.acked or msg.send_count:
            return None
        if number > 1:
            before = self.get(sequence_key, number - 1)
            if before is not None and not before.acked:
                return None
        self.record_send_attempt(sequence_key, number, next_send_at=next_send_at, now=now)
        return msg

    def claim_first_send_reading(self, sequence_key: str, number: int, rmd_sequence_id: str, *,
                                 next_send_at: float, now: float | None = None
                                 ) -> tuple[RmsMessage | None, RmdSequence | None]:
        """:meth:`claim_first_send`, and destination sequence ``rmd_sequence_id`` as committed,
        read without a lock, in the same round trip (PostgreSQL); None for it where the store
        does not read it so (here: it would lock it after the source sequence, against the
        order of locks): the caller then reads it when it needs it, as before.

        A caller's request claimed in its own global transaction carries the acknowledgement
        of the replies on its offered sequence: read so, it costs no round trip of its own
        after the commit (which flushes the WAL past what the read saw, see
        :mod:`~wsrm_plugin.store.late_commits`), and no lock that the transaction would hold
        over the replies' records until it ends."""
        return self.claim_first_send(sequence_key, number, next_send_at=next_send_at, now=now), None

    @abstractmethod
    def due_messages(self, now: float | None = None, limit: int = 100, *,
                     per_sequence: int | None = None, payloads: bool = True) -> list[RmsMessage]:
        """Unacknowledged messages of started, unfaulted sequences with ``next_send_at <= now``.

        ``per_sequence`` makes the poll fair: at most that many messages of
        each sequence, taken round robin (every sequence's oldest due message,
        then every sequence's second...), so one sequence's backlog cannot
        starve the others (their destinations would end them as inactive).

        The messages returned, and their sequences, are locked for this
        transaction; sequences another transaction holds are skipped (SKIP
        LOCKED), so pollers can share a store.  Oldest due first.  Record the
        attempts and commit before sending: the locks block acknowledgements
        of those sequences meanwhile.

        ``payloads=False``: a payload the store reads apart from its row (a large one on
        PostgreSQL) is left out (``payload`` None); :meth:`with_payloads` reads those of the
        messages the caller goes on with.  The sender's round so reads only what it claims:
        the window and the lanes leave some due messages for a later round.
        """

    def with_payloads(self, msgs: Sequence[RmsMessage]) -> list[RmsMessage]:
        """``msgs`` (from :meth:`due_messages` with ``payloads=False``, in this transaction)
        with the payloads it left out read."""
        return [m if m.payload is not None else self.get(m.sequence_key, m.number) or m for m in msgs]

    @abstractmethod
    def record_send_attempt(self, sequence_key: str, number: int, *, next_send_at: float,
                            now: float | None = None) -> RmsMessage:
        """Count one (re)transmission and schedule the next one (backoff is the caller's)."""

    def record_send_attempts(self, sequence_key: str, numbers: Iterable[int], *, next_send_at: float,
                             now: float | None = None) -> int:
        """:meth:`record_send_attempt` for several messages of a sequence at once; how many were found.

        The sender's claim counts a whole round this way: one statement per
        sequence, not one per message, for the store's busiest table.
        """
        found = 0
        for number in numbers:
            try:
                self.record_send_attempt(sequence_key, number, next_send_at=next_send_at, now=now)
            except UnknownMessageError:
                continue
            found += 1
        return found

    def claim_first_sends(self, sequence_key: str, limit: int, *, next_send_at: float,
                          now: float | None = None, after: int = 0) -> list[RmsMessage]:
        """The lowest-numbered ``limit`` due messages of ``sequence_key``, their first transmission
        recorded (as :meth:`record_send_attempts`), each as it was before; nothing when one of
        them was sent before (a retransmission is due: the sender's rounds take that).

        A sender's lane that has sent its round's messages of a sequence while the
        round's other lanes still send takes the sequence's next ones so, in a
        transaction on that sequence alone, instead of idling until the round ends.
        The stores read only about that many rows.

        ``after``: only messages numbered above it.  The lane knows those up to it acknowledged
        (the answers said so; the store hears it at the round's end): past their retransmission
        time they are due in the store, and the first due one, a retransmission, would have the
        claim take nothing."""
        t = time.time() if now is None else now
        self._tx.rms.get(sequence_key)  # the sequence's lock first, as everywhere
        msgs = [m for m in self.list_for(sequence_key)
                if not m.acked and m.next_send_at <= t and m.number > after][:max(0, limit)]
        if not msgs or any(m.send_count for m in msgs):
            return []
        self.record_send_attempts(sequence_key, [m.number for m in msgs], next_send_at=next_send_at, now=now)
        return msgs

    def claim_first_sends_of(self, sequence_key: str, limit: int, *, next_send_at: float,
                             now: float | None = None, after: int = 0) -> tuple[RmsSequence | None, list[RmsMessage]]:
        """A sending lane's refill: the sequence, read as ``rms.get(beside_enqueues=True)`` reads
        it (held), and, when it is transmitting (started and live), :meth:`claim_first_sends`
        (of the messages numbered above ``after``);
        (None, []) for no such sequence, (the sequence, []) for one not transmitting.  PostgreSQL
        returns a sequence with no message due as read, not held (a lock that protects no
        claim would be a transaction of its own, with a commit record).

        PostgreSQL reads the row in the claim's own statement (one round trip where the read
        took one of its own): the refill claims a few messages at a time, so that read was a
        statement for every three or four messages sent."""
        seq = self._tx.rms.get(sequence_key, beside_enqueues=True)
        if seq is None or seq.sequence_id is None or not rms_life(seq).transmitting:
            return seq, []
        return seq, self.claim_first_sends(sequence_key, limit, next_send_at=next_send_at, now=now, after=after)

    def record_send_attempts_across(self, numbers: Mapping[str, Iterable[int]], *, next_send_at: float,
                                    now: float | None = None) -> int:
        """:meth:`record_send_attempts` for the messages of several sequences (sequence key ->
        numbers): a sender's round over many sequences records them in one statement where
        the store can (a round trip saved per sequence), one per sequence elsewhere."""
        return sum(self.record_send_attempts(key, wanted, next_send_at=next_send_at, now=now)
                   for key, wanted in numbers.items())

    @abstractmethod
    def make_due(self, sequence_key: str, numbers: Iterable[int], at: float | None = None) -> int:
        """Schedule unacked messages for sending at ``at`` (a Nack, an AckRequested reply...)."""

    @abstractmethod
    def reply_received(self, sequence_key: str, number: int) -> RmsMessage:
        """The response of an in-out message arrived: the message may now be purged."""

    def mark_answered(self, message_id: str) -> tuple[str, int, bool] | None:
        """The request whose message id is ``message_id``, if it waits for its reply, marked
        answered (:meth:`reply_received`, its sequence locked first): its sequence's key, its
        number, and whether it was acknowledged already.  None, nothing changed, when there is
        no such request or it was answered already.

        A client's record of a reply does this for the reply's request, on the caller's path:
        the PostgreSQL store in one round trip instead of three (the look-up by message id, the
        sequence's lock, the update), and the sequence's row comes with it."""
        request = self.find_by_message_id(message_id)
        if request is None or not request.reply_pending:
            return None
        self.reply_received(request.sequence_key, request.number)
        return request.sequence_key, request.number, request.acked

    def mark_answered_acknowledging(self, message_id: str, sequence_id: str, ranges: Iterable[tuple[int, int]],
                                    now: float | None = None, *, keep_offered_awaiting: bool = False
                                    ) -> tuple[tuple[str, int, bool] | None,
                                               tuple[RmsSequence, list[int], bool] | None]:
        """:meth:`mark_answered`, then the acknowledgement that rode on the reply applied
        (:meth:`acknowledge_sequence`) when it names the request's sequence (``sequence_id``) and
        the request, which was not acknowledged yet: what it returned, and the sequence (as it
        was), the newly acknowledged numbers and whether one is left unacknowledged; None for
        the second when the acknowledgement was not applied (it names something else, the
        sequence is not transmitting, or it was refused: nothing of it written).

        A client's record of a reply does both for the reply's request, on the caller's path:
        the PostgreSQL store in one round trip instead of two."""
        answered = self.mark_answered(message_id)
        if answered is None:
            return None, None
        key, number, acked = answered
        merged = AckRanges.from_ranges(ranges)
        seq = self._tx.rms.get(key)
        if acked or seq is None or seq.sequence_id != sequence_id or number not in merged:
            return answered, None
        try:
            found = self.acknowledge_sequence(sequence_id, merged.ranges, now,
                                              keep_offered_awaiting=keep_offered_awaiting)
        except InvalidAcknowledgementError:
            return answered, None
        if found is None or found[1] is None:
            return answered, None
        return answered, (found[0], *found[1])

    @abstractmethod
    def count_unacked(self, sequence_key: str | None = None) -> int:
        """Unacknowledged messages of one sequence or of all (no lock)."""

    def oldest_unacked(self, sequence_key: str) -> float | None:
        """When the sequence's oldest unacknowledged message was enqueued (epoch seconds); None
        when every message is acknowledged.  (No lock: a health check's question.)"""
        times = [m.created_at for m in self.list_for(sequence_key) if not m.acked]
        return min(times) if times else None

    def count_in_flight(self, sequence_key: str, window: int, now: float | None = None) -> int:
        """Messages of the sequence sent and not yet acknowledged: what a sending round counts
        against its window (``RMPolicy.max_unacknowledged``, ``window``).

        Asked once per round and sequence while a backlog drains, so it must not walk the
        unsent rest: a SQL store counts them among the sequence's first ``window``
        unacknowledged messages by number, among the first ``window`` by due time (first sends
        go in that order, so one sent out of number order, lower numbers held for later, is
        there) and among those sent again, whose next time is after ``now``; a count of
        ``window`` or more means the window is full, and it stops counting the first ones there.
        A message sent again, due again now, and beyond the first ``window`` both by number and
        by due time may be left out (the window then lets one more out for it, until it is sent
        again).  This default reads every message."""
        return sum(1 for m in self.list_for(sequence_key) if m.send_count and not m.acked)

    def has_unacked(self, sequence_key: str) -> bool:
        """Does the sequence still have an unacknowledged message?  (No lock.)

        What every acknowledgement asks (is the sequence done?): the SQL
        stores answer from one index entry, where counting walks a backlog
        that a big job makes tens of thousands long.
        """
        return self.count_unacked(sequence_key) > 0

    @abstractmethod
    def purge_acked(self, sequence_key: str | None = None) -> int:
        """Delete acknowledged messages that wait for no reply; returns how many.

        Keeps memory and disk bounded: a store that only ever grows would
        eventually stop the node.  Retransmission counts of the purged messages
        are folded into :attr:`RmsSequence.purged_retransmissions`.
        """

    @abstractmethod
    def list_for(self, sequence_key: str) -> list[RmsMessage]:
        """Every stored message of a sequence by number (no lock)."""

    def tally(self, sequence_key: str) -> tuple[int, int, int]:
        """(stored, unacknowledged, transmissions beyond each message's first) of a sequence, for
        ``status()`` (no lock).  A SQL store counts without reading a payload: listing the
        messages read every stored payload at each health check."""
        msgs = self.list_for(sequence_key)
        return (len(msgs), sum(1 for m in msgs if not m.acked),
                sum(max(m.send_count - 1, 0) for m in msgs))


class RmdSequenceManager(_Manager, ABC):
    """Destination sequences: what was received, what is owed to the peer."""

    @abstractmethod
    def create(self, sequence_id: str, *, acks_to: str, rm_version: str, wsa_version: str,
               principal: str | None = None, offered_id: str | None = None,
               expires: float | None = None, now: float | None = None) -> RmdSequence:
        """Create (locks it). :class:`DuplicateSequenceError` if the id exists."""

    @abstractmethod
    def get(self, sequence_id: str) -> RmdSequence | None:
        """The sequence, locked for this transaction, or None."""

    def read(self, sequence_id: str) -> RmdSequence | None:
        """The sequence as committed, without locking it, or None: for an acknowledgement of it
        (any committed state is a true one), which then waits for no receive of the sequence
        nor holds one up.  On PostgreSQL a statement outside the transaction (its BEGIN not
        sent: one round trip for a transaction that reads only this); the stores whose locks
        cost nothing lock it all the same."""
        return self.get(sequence_id)

    @abstractmethod
    def record_received(self, sequence_id: str, number: int, *, last: bool = False,
                        now: float | None = None) -> bool:
        """Note message ``number`` received; False when it is a duplicate.

        ``last=True`` (WS-RM 1.0 LastMessage) also records ``last_number``.  Also
        refreshes ``last_activity``.  The decision whether the message may be
        accepted at all (closed, beyond the last number...) is the state
        machine's; the store records.
        """

    @abstractmethod
    def update(self, sequence_id: str, **changes: Any) -> RmdSequence:
        """Change state factors (see :attr:`RmdSequence.UPDATABLE`)."""

    @abstractmethod
    def request_ack(self, sequence_id: str, due_at: float | None = None) -> RmdSequence:
        """Owe the peer an acknowledgement by ``due_at`` (keeps an earlier due time)."""

    @abstractmethod
    def ack_sent(self, sequence_id: str) -> RmdSequence:
        """The acknowledgement went out (or was piggybacked): clear the flag."""

    @abstractmethod
    def needing_ack(self, now: float | None = None, limit: int = 100) -> list[RmdSequence]:
        """Sequences whose acknowledgement is due (no lock)."""

    @abstractmethod
    def list_all(self) -> list[RmdSequence]:
        """Every destination sequence (no lock), oldest first."""

    def open_ids(self, principal: str | None = None) -> list[str]:
        """Identifiers of the sequences not terminated, of one ``principal`` if given (no lock).

        What the limits on open sequences count at each CreateSequence: a store overrides it to
        read identifiers only, since reading every row made each new sequence cost more with
        every sequence already open.
        """
        return [s.sequence_id for s in self.list_all()
                if not s.terminated and (principal is None or s.principal == principal)]

    @abstractmethod
    def delete(self, sequence_id: str) -> None:
        """Forget the sequence (its invoker buffer is the invoker manager's: ``discard``)."""

    def _receipt(self, sequence_id: str, number: int, *, last: bool,
                 now: float | None) -> tuple[RmdSequence, dict[str, Any]]:
        """The held sequence, and what recording ``number`` as received changes in it (what a
        store's ``record_received`` writes, alone or with the take in one statement)."""
        check_number(number)
        seq = self.require(sequence_id)
        changes: dict[str, Any] = {"received": seq.received.add(number), "last_activity": _now(now)}
        if last:
            changes["last_number"] = number
        return seq, changes

    def require(self, sequence_id: str) -> RmdSequence:
        seq = self.get(sequence_id)
        if seq is None:
            raise UnknownSequenceError("RMD", sequence_id)
        return seq


class InvokerBufferManager(_Manager, ABC):
    """Messages received and not yet handed to the application.

    A message leaves the buffer when :meth:`mark_delivered` commits, in the
    same transaction as the application's work: that is what makes delivery
    exactly-once when the store and the application's database share an XA
    transaction.
    """

    @abstractmethod
    def put(self, sequence_id: str, number: int, payload: bytes, *, action: str,
            soap_version: str, message_id: str | None = None, reply_to: str | None = None,
            now: float | None = None) -> bool:
        """Buffer a message; False if it is already buffered or was delivered (a duplicate).

        It need not wait for a delivery of the same sequence to commit (the
        SQL stores do not): reception goes on while the application works.
        """

    @abstractmethod
    def next_deliverable(self, sequence_id: str, *, in_order: bool = True,
                         now: float | None = None) -> BufferedMessage | None:
        """The message to deliver next for this sequence (locks its buffer), or None.

        InOrder: exactly the number after the delivered prefix, else None (the
        gap must fill first).  Otherwise: the lowest buffered number.  With
        ``now``, a message whose ``next_attempt_at`` is later does not count
        (InOrder: None; otherwise the lowest number that is due); without it,
        the next message in line whatever its retry state.
        """

    @abstractmethod
    def claim_next(self, *, in_order: bool = True, now: float | None = None) -> BufferedMessage | None:
        """The invoker worker's poll: a deliverable message of any sequence whose
        buffer no other transaction holds (SKIP LOCKED); locks that buffer.
        A message waiting for a retry later than ``now`` (default: the
        current time) is not deliverable yet."""

    @abstractmethod
    def mark_delivered(self, sequence_id: str, number: int) -> None:
        """Remove the message from the buffer and record its number as delivered."""

    def mark_next_delivered(self, sequence_id: str, number: int) -> None:
        """:meth:`mark_delivered` for a message that was the next in order when this process
        buffered it (InOrder: every number before it delivered).  A store may check that in its
        writes instead of reading the sequence first; :class:`UnknownMessageError` if the
        message is no longer buffered, or no longer the next (delivered elsewhere meanwhile)."""
        if not _is_prefix(self.state(sequence_id).delivered, number - 1):
            raise UnknownMessageError(f"message {number} of sequence {sequence_id!r} is not the next to deliver")
        self.mark_delivered(sequence_id, number)

    def take_next(self, sequence_id: str, number: int) -> bool:
        """Record ``number`` as delivered without buffering it, if it is the next one in order.

        For delivery on receipt (``RMPolicy.deliver_on_receive``): the message
        is handed to the application in the very transaction that receives
        it, so it never needs a buffer row.  True only when every number
        before it, and nothing after it, is delivered and it is not buffered
        (then it holds the sequence's buffer, like :meth:`next_deliverable`,
        and so waits for a delivery of the sequence in progress elsewhere);
        False when it must be buffered as usual (a gap, a message waiting for
        a retry).  A store that cannot tell answers False: every message is
        then buffered.
        """
        return False

    @abstractmethod
    def state(self, sequence_id: str) -> InvokerSequence:
        """Delivered ranges and buffered count of a sequence (no lock)."""

    @abstractmethod
    def count(self, sequence_id: str | None = None) -> int:
        """Buffered messages of one sequence or of all (no lock)."""

    def held(self, sequence_id: str, received: AckRanges) -> int:
        """Of the ``received`` numbers of a sequence, how many wait for delivery (no lock).

        The destination's flow control asks this on every receive.  A store
        that keeps the delivered ranges answers from them (received minus
        delivered) instead of counting buffered rows, a count that grows with
        the very backlog it is there to bound.
        """
        return self.count(sequence_id)

    @abstractmethod
    def held_bytes(self) -> dict[str, int]:
        """Bytes of the messages buffered, by sequence (sequences with none are left out; no lock).

        The destination's byte budgets ask this on every new message: a count
        limit alone lets a peer park gigabytes behind a gap.  The stores sum
        the payload lengths the database already keeps (SQLite and PostgreSQL
        read a blob's length without reading the blob), so no schema change.
        """

    @abstractmethod
    def discard(self, sequence_id: str) -> int:
        """Drop a sequence's buffer and delivery record; returns buffered messages dropped."""

    # -- failed deliveries and the poison store -------------------------------------------------

    @abstractmethod
    def get(self, sequence_id: str, number: int) -> BufferedMessage | None:
        """A buffered message (locks its sequence's buffer), or None."""

    def _require(self, sequence_id: str, number: int) -> BufferedMessage:
        """:meth:`get`, raising :class:`UnknownMessageError` where it finds nothing."""
        msg = self.get(sequence_id, number)
        if msg is None:
            raise UnknownMessageError(
                f"message {number} of sequence {sequence_id!r} is not in the invoker buffer")
        return msg

    @abstractmethod
    def record_failure(self, sequence_id: str, number: int, *, attempts: int, cycle: int,
                       next_attempt_at: float | None, error: str) -> BufferedMessage:
        """Write a failed delivery's new retry state (locks the buffer).

        Runs in a transaction of its own after the delivery rolled back, so
        the count survives the rollback and a restart.
        """

    @abstractmethod
    def poison(self, sequence_id: str, number: int, *, hold: bool, error: str | None = None,
               now: float | None = None) -> PoisonMessage:
        """Move a buffered message into the poison store (locks the buffer).

        ``hold=False`` records its number as delivered, so the rest of the
        sequence goes on without it; ``hold=True`` leaves the gap, so InOrder
        delivery waits for an operator.
        """

    @abstractmethod
    def list_poison(self, sequence_id: str | None = None) -> list[PoisonMessage]:
        """Poison messages, oldest first (no lock)."""

    @abstractmethod
    def get_poison(self, sequence_id: str, number: int) -> PoisonMessage | None:
        """One poison message (no lock)."""

    @abstractmethod
    def retry_poison(self, sequence_id: str, number: int, *, now: float | None = None) -> BufferedMessage:
        """Put a poison message back into its sequence's buffer with a fresh retry budget.

        It takes its place again: a held sequence resumes with it; a sequence
        that went on without it delivers it before anything received later.
        :class:`UnknownMessageError` when there is no such poison message.
        """

    @abstractmethod
    def discard_poison(self, sequence_id: str, number: int) -> PoisonMessage:
        """Delete a poison message for good (an operator's decision); its sequence goes on.

        :class:`UnknownMessageError` when there is no such poison message.
        """

    @abstractmethod
    def count_poison(self, sequence_id: str | None = None) -> int:
        """Poison messages of one sequence or of all (no lock)."""

    @abstractmethod
    def count_retrying(self, sequence_id: str | None = None) -> int:
        """Buffered messages waiting for a retry after a failed delivery (no lock)."""



class ConditionManager(_Manager, ABC):
    """What engine processes report about what they depend on (:class:`NodeCondition`).

    Not protocol state: no lock is taken (the last report wins) and none of it
    belongs in an XA transaction; write it in a store transaction of its own.
    """

    @abstractmethod
    def put(self, condition: NodeCondition) -> None:
        """Add or replace the condition of (kind, subject, reporter)."""

    @abstractmethod
    def remove(self, kind: str, *, subject: str | None = None, reporter: str | None = None,
               reported_before: float | None = None) -> int:
        """Remove the conditions of ``kind`` matching every criterion given; how many."""

    @abstractmethod
    def list_all(self, kind: str | None = None) -> list[NodeCondition]:
        """Every condition (of ``kind``), oldest first."""


class StoreTransaction(ABC):
    """One unit of work on the store; use it as a context manager.

    ``with store.begin() as tx:`` commits when the block ends normally and
    rolls back when it raises.  Locks taken by the managers are held until the
    end (two-phase locking, as in seed 004).
    """

    rms: RmsSequenceManager
    rms_messages: RmsMessageManager
    rmd: RmdSequenceManager
    invoker: InvokerBufferManager
    conditions: ConditionManager

    def __init__(self) -> None:
        self._max_rank = -1
        self._held: set[tuple[int, Any]] = set()
        self._closed = False
        #: The error that doomed this transaction (a lock timeout, a failed
        #: statement): PostgreSQL aborts the transaction then, so every store
        #: lets it only roll back, and a commit cannot silently lose work.
        self.failed: BaseException | None = None

    # -- lock order bookkeeping (every store) ----------------------------------

    def _check_lock_order(self, rank: int, key: Any) -> bool:
        """Raise :class:`LockOrderError` for a lock against the order; True if new."""
        if (rank, key) in self._held:
            return False
        if rank < self._max_rank:
            raise LockOrderError(
                f"this transaction already holds an {_RANK_NAMES[self._max_rank]} lock and now "
                f"asks for the {_RANK_NAMES[rank]} {key!r}: locks must be taken in the order "
                "RMD sequence, invoker buffer, RMS sequence (seed 004) to rule out deadlocks; "
                f"touch the {_RANK_NAMES[rank]} first")
        return True

    def _note_lock(self, rank: int, key: Any) -> None:
        self._held.add((rank, key))
        self._max_rank = max(self._max_rank, rank)

    def order_as_first(self, rank: int, key: Any) -> None:
        """Count the lock of ``rank`` on ``key`` as this transaction's first, for the order check.

        Only for a transaction of a store whose transactions take the whole store
        (``StorageManager.defers_transactions``): no lock of one can wait for a row
        another holds, so the order is bookkeeping alone there.  The delivery on
        receipt of such a store (``InvokerWorker.deliver_received``) runs the
        application before it touches the buffer (the file is taken at the first
        statement); an application that answers enqueues its reply (an RMS sequence)
        before the buffer row is marked delivered, as the invoker's claim would have
        taken it first."""
        if self._check_lock_order(rank, key):
            self._note_lock(rank, key)

    def next_part(self) -> None:
        """What follows is another caller's part of this transaction: the lock order starts again.

        Only for a transaction of a store whose transactions take the whole store
        (``StorageManager.defers_transactions``), where no lock can wait for a row another
        transaction holds and the order is bookkeeping alone: receives of several sequences
        recorded in one SQLite transaction (group commit), each taking its sequence's rows
        in the order, one after the other.  And for receives of several sequences delivered
        in one global transaction on PostgreSQL (``Destination._deliver_in_one_global``):
        their parts take their sequences in the order of the identifiers, and a deadlock
        with another transaction is detected by the server and rolls the batch back (each
        receive then goes alone)."""
        self._max_rank = -1

    def _drop_managers(self) -> None:
        """Let go of the managers made on first use (:class:`ManagerOnFirstUse`) once the
        transaction ended: each holds the transaction, which holds it, a reference cycle
        that only the garbage collector frees.  A transaction a message or more (the memory
        store: 3-4 a message at 16 sequences) kept the collector's youngest generation
        filling (a collection every 5-6 messages, with the interceptors' cycles); freed by
        reference counting instead, the transaction and its stage go at once.  A manager
        read after the end is made again, and refuses as the old one did (the transaction
        is closed)."""
        found = self.__dict__
        for name in _MANAGER_NAMES.intersection(found):  # (those made: one or two, a pop each)
            del found[name]

    def _check_open(self) -> None:
        if self._closed:
            raise TransactionClosedError("this store transaction has already ended; begin a new one")
        if self.failed is not None:
            raise TransactionClosedError(
                f"an earlier step of this store transaction failed ({self.failed}); it can only "
                "roll back: roll it back and retry the whole transaction")

    def _doom(self, exc: BaseException) -> None:
        if self.failed is None:
            self.failed = exc

    def _refuse_commit_if_failed(self) -> None:
        """Commit of a doomed transaction: roll back instead and say so."""
        if self.failed is not None and not self._closed:
            cause = self.failed
            self.rollback()
            raise TransactionClosedError(
                f"not committed: an earlier step of this store transaction failed ({cause}); "
                "it was rolled back, retry the whole transaction") from cause

    @property
    def closed(self) -> bool:
        return self._closed

    # -- steps of a receive that a store may do in one round trip ------------------------------

    def receive_and_take(self, sequence_id: str, number: int, *, last: bool = False,
                         now: float | None = None) -> bool:
        """:meth:`RmdSequenceManager.record_received`, then :meth:`InvokerBufferManager.take_next`:
        True when ``number`` was taken for delivery on receipt.

        For a message that is new and changes nothing else in its sequence.
        One call because a store may do both in one round trip (PostgreSQL:
        one statement): a receive that delivers on receipt does them while
        the receives of its sequence behind it wait for its commit, so every
        round trip saved there shortens the wait of every message after it."""
        self.rmd.record_received(sequence_id, number, last=last, now=now)
        return self.invoker.take_next(sequence_id, number)

    def receive_in_order(self, sequence_id: str, number: int, *, now: float | None = None,
                         answering: tuple[str, str, Sequence[tuple[int, int]], bool] | None = None,
                         acknowledging: tuple[str, Sequence[tuple[int, int]], bool] | None = None,
                         take: bool = True, commits: tuple[str, str | None, tuple[str, ...]] | None = None
                         ) -> tuple[RmdSequence, bool] | None:
        """The sequence's RMD row locked, ``number`` recorded as received and taken (as
        :meth:`receive_and_take`) in one round trip, if the sequence is open and has received
        exactly 1..number-1: the sequence as it was before, and whether it was taken.

        None (nothing written) when that guess is wrong, or the store has no such
        round trip to save: the caller then reads the sequence and records the
        message the general way.  The caller checks the message against the
        sequence returned and, if it refuses it, rolls the transaction back.

        ``answering``: the arguments of :meth:`RmsMessageManager.mark_answered_acknowledging`
        the caller makes next if the message is taken (a reply that answers a call); a store
        may run it in the same round trip, that call then answering from what it wrote.
        ``acknowledging``: likewise, the arguments of
        :meth:`RmsMessageManager.acknowledge_sequence` (but ``now``) the caller makes if the
        message is received (the acknowledgement that rode on it).  ``take=False``: recorded
        as received only, never taken (the caller buffers it: a receive that delivers apart);
        a store may then save a round trip only where the receipt alone saves one.

        ``commits`` (with ``answering``, in a transaction that does nothing else): the caller
        writes nothing after the answering call when everything went as expected, and would
        then commit at once, returning before the disk (``wait_for_disk_later``); a store may
        commit in the same round trip when it finds that so -- the reply received and taken,
        its request answered with the acknowledgement applied, no last message on the request's
        sequence, and the reply's sequence speaking the RM version ``commits[0]``, of principal
        ``commits[1]`` (or none) and with an AcksTo among ``commits[2]``.  A store that tried and
        found otherwise raises :class:`CommitDeclined`, having written nothing (the caller goes
        again without ``commits``); one that did not try leaves the outcome as without it."""
        return None

    @property
    def receives_at_commit(self) -> bool:
        """Can a receipt in order ride on this transaction's commit (:meth:`receive_at_commit`)?"""
        return False

    def foresee_sequence(self, seq: RmsSequence) -> None:
        """Take ``seq`` (as this process last saw it committed) as the row this transaction holds
        of it, without reading nor locking it: an enqueue on it then takes its number from
        there, and its writes ride to the commit.  Only before :meth:`receive_at_commit`, whose
        statement checks, before the commit, that the row was so (``reply``); a store without
        :attr:`receives_at_commit` ignores it."""
        return None

    def receive_at_commit(self, sequence_id: str, number: int, *, now: float | None = None,
                          acknowledging: tuple[str, Sequence[tuple[int, int]], bool] | None = None,
                          reply: str | None = None) -> bool:
        """The receipt in order of ``number`` (recorded as received and taken, as
        :meth:`receive_in_order`, which the caller guessed would take it) and the
        acknowledgement that rode on it (``acknowledging``, as there) sent with the transaction's
        commit, after what the transaction did already (the application's work, run before its
        receipt) and before the writes riding to that commit (its reply's enqueue).  False,
        nothing done, where the store cannot.

        That statement checks what the caller guessed, and fails on purpose where it does not
        hold, the whole transaction with it (nothing of it is committed, the application's
        work neither): the sequence open and with exactly 1..number-1 received, the message
        taken, the acknowledgement applying to a transmitting sequence and naming nothing
        unsent, and the sequence of key ``reply`` (the one acknowledged) open to enqueues, with
        the next number :meth:`foresee_sequence` took it to have, where an enqueue of this
        transaction took its number from there.
        The commit's failure then says so (:meth:`StorageManager.declined_at_commit`).

        A one-way message (neither ``acknowledging`` nor ``reply``: nothing rode on it, nothing
        answers it) has its receipt and take alone sent so, checked the same way."""
        return False

    def held_rows(self, sequence_id: str, key: str) -> tuple[RmdSequence | None, RmsSequence | None]:
        """The rows of destination sequence ``sequence_id`` and source sequence ``key`` as this
        transaction holds them (locked, or written by it), each None where it holds none or
        the store keeps no such copy: what the next receipt at commit may foresee, once this
        transaction committed."""
        return None, None

    def next_write_commits(self) -> None:
        """The transaction's next write commits by itself, where that saves round trips
        (PostgreSQL: a transaction that has sent nothing yet sends it without BEGIN, and the
        server commits it as it ends; its COMMIT is then no round trip, nor BEGIN and COMMIT
        statements); whatever the transaction writes after it is a transaction of its own.

        For a transaction whose one write is all it does (a sending lane's refill: its claim):
        nothing after that write may need to undo it, since a rollback then cannot.  A store
        that cannot do it commits everything at the end, as usual."""
        return None

    #: True when :meth:`savepoint` works (the memory and SQL stores).
    supports_savepoints: ClassVar[bool] = False

    @property
    def untouched(self) -> bool:
        """A transaction of :meth:`StorageManager.begin_deferred` that has run no statement yet:
        it holds nothing and read nothing, so its commit has nothing to make durable.  What its
        caller would still write may then go in another transaction that takes the store anyway
        (a delivery's removal from the buffer, with other receipts: see
        ``InvokerWorker.deliver_received``).  False for every other transaction."""
        return False

    def wait_for_disk_later(self) -> None:
        """Its commit returns before it is on disk; whoever reads it still waits for the disk.

        For a step whose caller commits durably again before it tells anyone
        anything (a message buffered by a receive that then delivers it in a
        transaction of its own: that commit's wait covers this one, as commits
        reach the disk in order).  Unlike ``durable=False`` the commit counts
        as durable for every other transaction: one that reads it (a duplicate
        of the message, acknowledged) returns only once it is on disk.  Its
        caller's later wait covers every commit before this one too, so this
        one does not wait for the commits it read either: what it read must
        not leave the process before that wait (the delivery on receipt's
        method runs meanwhile, as it ran before its transaction's commit when
        it ran inside it).  Stores that do not make a commit's durability wait
        for others wait as usual.  Set before the commit; :meth:`wait_for_disk`
        waits for it (and what it read) after all.
        """
        return None

    def wait_for_disk(self) -> None:
        """After a commit that :meth:`wait_for_disk_later`: return once it is on disk (the
        caller's durable commit that was to cover it did not happen)."""
        return None

    def make_durable(self) -> None:
        """This transaction's commit waits for the disk after all (begun with ``durable=False``).

        For a decision taken in it that nobody may be told of and then have
        forgotten by a crash: a sequence faulted (its fault hook tells the
        application which messages failed).
        """
        return None  # the stores that commit every transaction durably have nothing to change

    def savepoint(self) -> Any:
        """A context manager: when its block raises, only the block's changes are undone.

        The transaction stays open (and keeps every lock it took) so the work
        before the savepoint can still commit.  The invoker uses it to deliver
        several messages in one transaction and still settle a failing one
        exactly as if it had been delivered alone.  A block whose failure
        doomed the transaction (a failed statement) cannot be undone alone:
        the transaction stays doomed and can only roll back.
        """
        raise StoreError(f"{type(self).__name__} has no savepoints: "
                         "check supports_savepoints before calling savepoint()")

    @abstractmethod
    def commit(self) -> None: ...

    @abstractmethod
    def rollback(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._closed:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()


class StorageManager(ABC):
    """A store: opens transactions, offers an XA resource, reports status.

    Open one with :func:`wsrm_plugin.store.open_store`.
    """

    url: str
    #: Seconds a transaction waits for a lock before :class:`LockTimeoutError`.
    lock_timeout: float
    #: A commit costs a flush to disk or a round trip to a server, so work arriving together is
    #: worth committing together (the destination's receive batches), and a delivery's own
    #: transaction is worth saving (``RMPolicy.deliver_on_receive``).  Not so in memory.
    commits_are_costly: ClassVar[bool] = True
    #: Transactions of different sequences proceed at once (row or sequence locks): several
    #: invoker threads deliver several sequences side by side.  Not so in SQLite, whose
    #: transactions take turns on the whole file (``RMPolicy.invoker_threads``).
    concurrent_sequences: ClassVar[bool] = True

    @abstractmethod
    def begin(self, *, xa: Any = None, durable: bool = True) -> StoreTransaction:
        """A new transaction.

        With ``xa=`` a transaction manager (``txmanager.TransactionManager``)
        that has a current transaction, the store's XA resource is enlisted in
        it and the returned transaction is that branch: its work commits or
        rolls back with the user's other resources, so ``commit()`` and
        ``rollback()`` belong to the transaction manager and the ``with`` block
        does not end it.  With no current transaction the store falls back to
        a local transaction.

        ``durable=False``: the commit need not wait for the disk.  For work a
        crash may forget because it is learned again from the peer or redone
        (a send attempt recorded, an acknowledgement applied): a crash loses
        at most the last such commits, never one made after them durably, and
        nothing that was acknowledged or delivered.  PostgreSQL commits it
        with ``synchronous_commit`` off (no WAL flush to wait for, so the rows
        it locked are free sooner); SQLite returns from the commit without
        waiting for the WAL's fsync, which the next durable commit's covers (a
        killed process loses neither: only a power loss can); the memory store
        commits as usual.  Ignored for a branch of an XA transaction.
        """

    #: :meth:`begin_deferred` gives a transaction that holds nothing until its first
    #: statement (SQLite: the whole file waits for a transaction from its first statement).
    defers_transactions: ClassVar[bool] = False

    def in_use(self) -> bool:
        """Does a transaction of this process hold the whole store now (SQLite's file)?  Always
        False where transactions lock rows, not the store."""
        return False

    def buffer_may_hold(self) -> bool:
        """Might the invoker buffer hold a message (committed)?  False only when this process
        knows, without a transaction, that it holds none: an invoker thread's claim then opens
        none to find nothing (a delivering thread looks once more after each delivery, and
        finds nothing about as often as something).  A message buffered after the look wakes
        the invoker when its receive commits, so nothing waits for the poll.  True where that
        is not known without asking the database (another process may have buffered one)."""
        return True

    def declined_at_commit(self, exc: BaseException) -> bool:
        """Did a commit fail with ``exc`` (or an exception it was raised from) because a receipt
        riding on it found its guess wrong (``StoreTransaction.receive_at_commit``)?"""
        return False

    def foresee_in_order(self, sequence_id: str, number: int) -> RmdSequence | None:
        """Read from the last committed state, without taking the store: destination sequence
        ``sequence_id`` if it has received and delivered exactly 1..number-1, holds nothing
        for delivery and is open (no last number, not closed, not terminated); else None.

        For a delivery on receipt that runs its application before its receipt
        (``Destination._run_first``, stores that :attr:`defers_transactions`): whether
        ``number`` would be taken on receipt, asked while other transactions hold the store.
        A hint: the receipt's own transaction decides.  None where a store has no such read
        (then nothing runs before its receipt)."""
        return None

    def written_elsewhere(self) -> int | None:
        """A count that changes whenever another process (or another store object on the same
        data) may have written the store since this one's count was taken; None where the store
        cannot tell.  Read without a transaction.  For a guess made from what this process last
        committed, instead of a read (``Destination._run_first``): valid while the count stays."""
        return None

    def begin_deferred(self) -> StoreTransaction:
        """A local transaction that takes the store only at its first statement.

        For a delivery whose application runs before it touches the store (the
        destination's delivery on receipt on a store whose transactions take
        turns on the whole file): the others are not held while it runs.  From
        its first statement to its end it is one ordinary transaction; nothing
        before that statement is part of it.  Stores that hold nothing at
        ``begin`` (rows are locked as they are touched) give :meth:`begin`'s."""
        return self.begin()

    @abstractmethod
    def xa_resource(self) -> XAResource:
        """The XA resource of this store (register it with the recovery manager)."""

    @abstractmethod
    def close(self) -> None: ...

    def analyze(self) -> None:
        """Refresh the database's planner statistics of the message tables, after a bulk load.

        A job that commits a hundred thousand messages at once leaves the
        statistics describing a nearly empty queue until autovacuum notices
        (up to a minute); meanwhile the sender's claim is planned for a few
        rows and reads the whole backlog on every round.  Stores without a
        cost-based planner do nothing.
        """
        return  # deliberately not abstract: the default is to do nothing

    def status(self) -> StoreStatus:
        """Counters for operators (``wsrm status``), read in a transaction of their own."""
        with self.begin() as tx:
            return _status_of(tx, prepared=len(self.xa_resource().recover()))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"


def _status_of(tx: StoreTransaction, prepared: int = 0) -> StoreStatus:
    rms = []
    for seq in tx.rms.list_all():
        stored, unacked, resent = tx.rms_messages.tally(seq.key)
        rms.append(RmsSequenceStatus(
            key=seq.key, sequence_id=seq.sequence_id, state=rms_state_name(seq),
            next_number=seq.next_number, unacked=unacked, stored=stored,
            retransmissions=seq.purged_retransmissions + resent,
            fault_reason=seq.fault_reason, last_activity=seq.last_activity))
    rmd = []
    for dseq in tx.rmd.list_all():
        inv = tx.invoker.state(dseq.sequence_id)
        rmd.append(RmdSequenceStatus(
            sequence_id=dseq.sequence_id, state=rmd_state_name(dseq),
            received=format_ranges(dseq.received), last_number=dseq.last_number,
            buffered=inv.buffered, delivered=inv.delivered_count, last_activity=dseq.last_activity,
            retrying=tx.invoker.count_retrying(dseq.sequence_id),
            poisoned=tx.invoker.count_poison(dseq.sequence_id)))
    return StoreStatus(rms=tuple(rms), rmd=tuple(rmd), prepared_branches=prepared,
                       retrying=tx.invoker.count_retrying(), poisoned=tx.invoker.count_poison(),
                       conditions=tuple(tx.conditions.list_all()))


def refuse_if_global(tx: Any) -> None:
    """A branch's store transaction is ended by the transaction manager only."""
    if getattr(tx, "_global", None) is not None:
        raise StoreError(
            f"this store transaction is a branch of global transaction {tx._global.xid}: "
            "commit or roll back through the transaction manager, not the store")


def exit_global(tx: Any, exc_type: Any) -> None:
    """Leaving ``with store.begin(xa=tm)``: the TM ends the branch; an error dooms it."""
    if exc_type is not None:
        try:
            tx._global.set_rollback_only()
        except Exception:  # the TM may already be rolling back
            log.debug("could not mark %s rollback-only", tx._global, exc_info=True)


def _is_prefix(delivered: AckRanges, upto: int) -> bool:
    """Are ``delivered`` exactly the numbers 1..upto?"""
    return delivered.count == upto and (upto == 0 or delivered.is_complete_up_to(upto))
