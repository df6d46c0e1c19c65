"""The store's records: frozen dataclasses a manager hands out (sequences, messages,
buffered and poisoned messages, status rows) and the conversions between them.

A manager hands out copies and takes changes through its methods, so nothing changes
behind a transaction's back; a record checks the changes it is given once, here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from ...statemachine.ackranges import AckRanges


#: A sequence's ``last_activity`` is written by an acknowledgement of a source sequence
#: (``sql.rms``) and by a receipt in order of a destination sequence (``sql.statements``) only when
#: the one stored is older than this many seconds.  On PostgreSQL a source row is then written,
#: and held against callers' enqueues, about once a second rather than at every
#: acknowledgement; a destination row is written at every receipt anyway (its received
#: ranges), but with its last columns unchanged the update's WAL record carries only the
#: changed bytes of the ranges (PostgreSQL leaves out the prefix and the suffix a new row
#: version shares with the old on its page): 147 -> 124 B of WAL a receipt and its commit
#: (SQLite writes a whole row either way).
#: What reads it (keep-alives, ``wsrm status``) works in seconds and minutes; the inactivity
#: timeout counts a stored ``last_activity`` as up to this much behind (``AcknowledgementWorker``).
ACTIVITY_GRAIN = 1.0


def _now(now: float | None) -> float:
    return time.time() if now is None else float(now)


class _Record:
    """Shared helpers of the record dataclasses."""

    #: Fields a manager's ``update`` may change; the others are managed by the store.
    UPDATABLE: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def check_changes(cls, changes: dict[str, Any]) -> None:
        unknown = set(changes) - cls.UPDATABLE
        if unknown:
            raise TypeError(
                f"{cls.__name__} fields {sorted(unknown)} cannot be updated this way; "
                f"updatable: {sorted(cls.UPDATABLE)}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class RmsSequence(_Record):
    """A source (sending) sequence.

    ``key`` is the client's own name for the sequence (CXF's "internal key",
    e.g. target address + a user-chosen conversation id); ``sequence_id`` is
    the identifier the destination handed out in CreateSequenceResponse, None
    until then.  The boolean factors are seed 004's RMS state factors plus
    WS-RM 1.1's close and the faulted end state.  ``next_control_at`` is when the
    RMS worker should next look at the sequence for a control message
    (CreateSequence, CloseSequence, TerminateSequence, a retry of one); the
    engine sets it, :meth:`RmsSequenceManager.needing_work` lists it.
    """

    UPDATABLE: ClassVar[frozenset[str]] = frozenset({
        "target", "acks_to", "sequence_id", "started", "last_message", "last_number",
        "close_sent", "closed", "terminate_sent", "faulted", "fault_reason",
        "control_attempts", "next_control_at", "expires", "last_activity",
    })

    key: str
    target: str
    acks_to: str
    rm_version: str
    wsa_version: str
    offered_id: str | None = None
    sequence_id: str | None = None
    started: bool = False
    last_message: bool = False
    last_number: int | None = None
    close_sent: bool = False
    closed: bool = False
    terminate_sent: bool = False
    faulted: bool = False
    fault_reason: str | None = None
    next_number: int = 1
    control_attempts: int = 0
    next_control_at: float | None = None
    expires: float | None = None
    created_at: float = 0.0
    last_activity: float = 0.0
    #: Retransmissions of messages already purged (the status counter keeps them).
    purged_retransmissions: int = 0
    #: The SQL stores' number for the sequence (``rms_sequence.id``), by which its messages'
    #: rows name it (``rms_message.seq``): their key and indexes hold 8 bytes, not the text of
    #: ``key``.  None in the memory store.  Not compared: the same sequence read from two
    #: stores is equal.
    store_id: int | None = field(default=None, compare=False)

    @property
    def highest_number(self) -> int:
        """The highest message number handed out so far (0 for none)."""
        return self.next_number - 1



@dataclass(frozen=True, slots=True)
class RmsMessage(_Record):
    """An application message in the retransmission queue of a source sequence.

    ``payload`` is the complete SOAP envelope as sent (the engine rewrites only
    the headers that change per attempt).  ``reply_callback`` is the import path
    (``"package.module:function"``) of what handles the response of an in-out
    call, with ``reply_context`` its opaque bytes: a path and bytes, not a Python
    object, so the reply can still be handled after a restart.  A message with
    a reply callback stays ``reply_pending`` (and is not purged) until
    :meth:`RmsMessageManager.reply_received`.
    """

    sequence_key: str
    number: int
    message_id: str
    action: str
    soap_version: str
    payload: bytes
    last: bool = False
    reply_callback: str | None = None
    reply_context: bytes | None = None
    reply_pending: bool = False
    send_count: int = 0
    next_send_at: float = 0.0
    last_sent_at: float | None = None
    acked: bool = False
    created_at: float = 0.0


@dataclass(frozen=True, slots=True)
class RmdSequence(_Record):
    """A destination (receiving) sequence.

    ``received`` holds the message numbers seen so far as merged ranges (the
    ranges a SequenceAcknowledgement carries), so a long sequence costs a few
    bytes, not a row per message.  ``ack_due_at`` is the batched-ack flag: when
    set, the RMD worker owes AcksTo an acknowledgement at that time.
    """

    UPDATABLE: ClassVar[frozenset[str]] = frozenset({
        "acks_to", "last_number", "closed", "terminated", "ack_due_at", "expires",
        "last_activity",
    })

    sequence_id: str
    acks_to: str
    rm_version: str
    wsa_version: str
    principal: str | None = None
    offered_id: str | None = None
    received: AckRanges = AckRanges()
    last_number: int | None = None
    closed: bool = False
    terminated: bool = False
    ack_due_at: float | None = None
    expires: float | None = None
    created_at: float = 0.0
    last_activity: float = 0.0

    def with_received(self, received: AckRanges) -> RmdSequence:
        """This row with ``received`` (``dataclasses.replace(self, received=received)`` without
        its walk of the fields: a receive delivered on its commit remembers one)."""
        return RmdSequence(self.sequence_id, self.acks_to, self.rm_version, self.wsa_version, self.principal,
                           self.offered_id, received, self.last_number, self.closed, self.terminated,
                           self.ack_due_at, self.expires, self.created_at, self.last_activity)

    @property
    def first_received(self) -> bool:
        return bool(self.received)

    @property
    def last_received(self) -> bool:
        return self.last_number is not None

    @property
    def every_received(self) -> bool:
        """Seed 004's "every message received": the last number is known and nothing is missing."""
        return self.last_number is not None and self.received.is_complete_up_to(self.last_number)


@dataclass(frozen=True, slots=True)
class BufferedMessage(_Record):
    """A message received in order or not, waiting for the application.

    ``attempts``, ``cycle``, ``next_attempt_at`` and ``last_error`` are its
    delivery history, kept durably so a restart goes on where it was (WCF's
    retry count and retry cycle of a queued message): failed attempts in the
    current cycle, retry cycles begun after the first, when it may be tried
    again (None: at once), and why the last attempt failed.  A message whose
    ``cycle`` is beyond the policy's last cycle is due for the poison store.
    """

    sequence_id: str
    number: int
    message_id: str | None
    action: str
    soap_version: str
    payload: bytes
    reply_to: str | None = None
    received_at: float = 0.0
    attempts: int = 0
    cycle: int = 0
    next_attempt_at: float | None = None
    last_error: str | None = None

    @property
    def waiting_for_retry(self) -> bool:
        """Has it failed at least once and not been delivered yet?"""
        return self.attempts > 0 or self.cycle > 0


@dataclass(frozen=True, slots=True)
class PoisonMessage(_Record):
    """A message the application failed to process in every retry cycle (the poison store).

    Kept in the same store as the buffer it came from and never deleted by
    the engine: an operator retries it (back into its sequence's buffer) or
    discards it (``wsrm poison``).  ``held`` says whether its sequence waits
    for it (the hold policy: nothing after it is delivered meanwhile).
    ``total_attempts`` counts every attempt over every cycle.
    """

    sequence_id: str
    number: int
    message_id: str | None
    action: str
    soap_version: str
    payload: bytes
    reply_to: str | None = None
    received_at: float = 0.0
    total_attempts: int = 0
    cycles: int = 0
    last_error: str | None = None
    poisoned_at: float = 0.0
    held: bool = True

    @property
    def poison_id(self) -> str:
        """The operator's name for it: ``<sequence id>#<number>`` (``wsrm poison show ID``)."""
        return f"{self.sequence_id}#{self.number}"


@dataclass(frozen=True, slots=True)
class InvokerSequence(_Record):
    """What the invoker has handed to the application for one sequence."""

    sequence_id: str
    delivered: AckRanges = AckRanges()
    buffered: int = 0

    @property
    def next_in_order(self) -> int:
        """The number InOrder delivery waits for next."""
        return self.delivered.next_expected

    @property
    def delivered_count(self) -> int:
        return self.delivered.count


@dataclass(frozen=True, slots=True)
class RmsSequenceStatus:
    key: str
    sequence_id: str | None
    state: str
    next_number: int
    unacked: int
    stored: int
    retransmissions: int
    fault_reason: str | None = None
    last_activity: float = 0.0


@dataclass(frozen=True, slots=True)
class RmdSequenceStatus:
    sequence_id: str
    state: str
    received: str
    last_number: int | None
    buffered: int
    delivered: int
    last_activity: float = 0.0
    #: Buffered messages that failed at least once and wait for their next attempt.
    retrying: int = 0
    #: Messages of the sequence in the poison store.
    poisoned: int = 0


@dataclass(frozen=True, slots=True)
class NodeCondition:
    """Something an engine process reports about what it depends on, for ``wsrm status``.

    Kept in the store so that an operator's ``wsrm status`` (another process)
    sees it: today a peer the process cannot reach (``kind`` ``"unreachable-peer"``,
    ``subject`` its address), delivery paused by an outage (``"delivery-paused"``, ``subject``
    the engine's name).  Each process reports its own view (``reporter``:
    its engine's name, host and process id), replaces it as it changes and
    removes it when the condition ends; ``reported_at`` says how fresh it is.
    """

    #: The kind of condition a peer address stays unreachable under (:mod:`wsrm_plugin.engine.reachability`).
    UNREACHABLE_PEER: ClassVar[str] = "unreachable-peer"
    #: The kind of condition an engine's delivery is paused under (``subject``: the engine's name;
    #: :mod:`wsrm_plugin.engine.outage`): what its application depends on is down.
    DELIVERY_PAUSED: ClassVar[str] = "delivery-paused"

    kind: str
    subject: str
    reporter: str
    state: str
    since: float
    last_error: str | None = None
    #: A line for a person: "5 probes, 40 messages held, next probe in 31s".
    detail: str = ""
    reported_at: float = 0.0


@dataclass(frozen=True, slots=True)
class StoreStatus:
    """The counters ``wsrm status`` prints."""

    rms: tuple[RmsSequenceStatus, ...] = ()
    rmd: tuple[RmdSequenceStatus, ...] = ()
    prepared_branches: int = 0
    #: Buffered messages waiting for a retry after a failed delivery (every sequence).
    retrying: int = 0
    #: Messages in the poison store (every sequence, also those already released).
    poisoned: int = 0
    #: What the engine processes using the store report (unreachable peers...).
    conditions: tuple[NodeCondition, ...] = ()

    @property
    def unacked(self) -> int:
        return sum(s.unacked for s in self.rms)

    @property
    def retransmissions(self) -> int:
        return sum(s.retransmissions for s in self.rms)

    @property
    def faulted(self) -> int:
        return sum(1 for s in self.rms if s.state == "faulted")

    @property
    def buffered(self) -> int:
        return sum(s.buffered for s in self.rmd)


    def by_state(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for name in (*(f"rms {s.state}" for s in self.rms), *(f"rmd {s.state}" for s in self.rmd)):
            counts[name] = counts.get(name, 0) + 1
        return counts


def poison_of(msg: BufferedMessage, *, hold: bool, error: str | None, now: float) -> PoisonMessage:
    """The poison-store record of a buffered message given up after its last retry cycle."""
    return PoisonMessage(
        sequence_id=msg.sequence_id, number=msg.number, message_id=msg.message_id, action=msg.action,
        soap_version=msg.soap_version, payload=msg.payload, reply_to=msg.reply_to,
        received_at=msg.received_at, total_attempts=msg.attempts, cycles=msg.cycle,
        last_error=error if error is not None else msg.last_error, poisoned_at=now, held=hold)


def buffered_of(poisoned: PoisonMessage) -> BufferedMessage:
    """A poison message back in the buffer, with a fresh retry budget."""
    return BufferedMessage(
        sequence_id=poisoned.sequence_id, number=poisoned.number, message_id=poisoned.message_id,
        action=poisoned.action, soap_version=poisoned.soap_version, payload=poisoned.payload,
        reply_to=poisoned.reply_to, received_at=poisoned.received_at)


def delivered_for_retry(delivered: AckRanges | None, number: int) -> AckRanges:
    """A sequence's delivered ranges once poison message ``number`` is back in the buffer.

    Under the continue policy its number was recorded as delivered; taking it
    out makes it the next in order again, and once it is delivered the
    in-order prefix jumps back over everything delivered meanwhile.  A
    sequence already released (no delivery record) gets every number below
    it as delivered, so it is the next and only one.
    """
    if delivered is None:
        return AckRanges.from_ranges([(1, number - 1)]) if number > 1 else AckRanges()
    if number in delivered:
        return delivered.difference(AckRanges.of([number]))
    return delivered
