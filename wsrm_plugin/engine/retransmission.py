"""The RMS worker (CXF's RetransmissionQueue): everything the source side puts on the wire.

Each round has two parts, both driven only by what the store says:

* **control**: for every sequence whose ``next_control_at`` has come, the
  state's duties name the one protocol message owed (CreateSequence,
  CloseSequence, TerminateSequence) or that the sequence can be released;
* **transmission**: unacknowledged messages whose ``next_send_at`` has come
  are claimed, their attempt recorded with the next retry time (the peer's
  measured retransmission timeout, never below the base interval, doubled
  per attempt), and only then sent.  What the round's answers say is then
  applied at once (:mod:`.pacing`): numbers proven lost are sent again in the
  next round, not when their timers fire, and a sequence whose peer discards
  out-of-order messages is sent in order, one message at a time.

Before either, a peer judged unreachable (:mod:`.reachability`) gets one
probe and nothing else: its other messages are held, unsent and uncounted,
until it answers.

The rule that keeps this safe: no store transaction is held across a network
call.  A round records what it is about to send and commits; the send
happens outside; the answer is applied in a new transaction.  A crash or a
lost answer at any point leaves a state whose duty is to send again, and the
destination discards duplicates.  When the retry budget is spent the
sequence is faulted and the application told (:meth:`Source.report_and_release`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from lxml import etree

from ..statemachine import AckRanges, InvalidTransition, LaneEvent, LaneState, RMSDuty, lane_transition, rms_duties
from ..store import (
    NodeCondition, RmdSequence, RmsMessage, RmsSequence, StorageManager, StoreError, UnknownSequenceError,
)
from ..wire import (
    RM10, AckRequested, CloseSequence, CloseSequenceResponse, CreateSequence, CreateSequenceResponse,
    EndpointReference, Offer, SequenceAcknowledgement, SequenceHeader, SoapFault, SoapVersion,
    TerminateSequence, TerminateSequenceResponse, WSRMFault,
)
from ..wire.namespaces import AddressingVersion
from . import observe
from .destination import Destination
from .envelopes import protocol_message, stamp_sequence
from .inbound import Inbound, ResponseContent
from .logs import for_sequence
from .reporter import reporter_name
from .pacing import Exchange, RttEstimator, SequenceFlow
from .policy import AckRequestMode, RMPolicy
from .reachability import Gate, Reachability, failure_of, retry_after_of
from .source import AT_ONCE, CREATE_REFUSED, NEVER, PendingAcks, SequenceKey, Source, is_back_channel, rm_version_of
from ..store.api.states import rms_life, rms_state
from .transport import Response, Transport, TransportError
from txmanager.transaction import Status

__all__ = ["RetransmissionWorker"]

log = logging.getLogger(__name__)

#: Faults by which a destination says it no longer holds the sequence at all.
_GONE = frozenset({"UnknownSequence", "SequenceTerminated"})

#: "Never again" for a message the AtMostOnce-only assurance sends once (a float the stores keep).
_NEVER = 4e18
#: Sequences looked at per round; the rest wait for the next one.
_CONTROL_BATCH = 50
#: A sequence with messages still to deliver that has exchanged nothing with its peer for this
#: fraction of the inactivity timeout gets an AckRequested, which resets the peer's timer.
_KEEP_ALIVE_FRACTION = 0.4
#: The peer's inactivity timeout assumed when this engine's own policy has none (RMPolicy's default).
_DEFAULT_PEER_INACTIVITY = 600.0
#: Seconds the acknowledgement of a reply that came in an HTTP response waits for the next request of
#: its sequence to carry it (a caller waiting for each answer sends one within a millisecond or so)
#: before it goes in a message of its own, at the sender's next round after that.
_REPLY_ACK_WAIT = 0.05
#: Times one in-order lane goes back to a gap before it leaves the rest to the next rounds.
_MAX_GO_BACKS = 16


#: Seconds a round of several sequences, each on a lane of its own, stays open: until then a lane
#: that has sent its messages takes its sequence's next ones (:meth:`RetransmissionWorker._refill`)
#: while another lane of the round still sends; after it, each ends with its message under way, and
#: its last refill takes only as many as it sends before then.  With four refills at most instead,
#: a lane ended with its share sent whatever the others did, and its slot waited for the round's
#: slowest (16 sequences, 1,600 messages: 80 lanes of 20 messages, their slots idle at their rounds'
#: ends 12% of the time under XA in one database, 19% across two, 30% on SQLite).  Not
#: longer: the round's end is when the sender next looks at its control messages (a new
#: sequence's CreateSequence, a finished one's TerminateSequence) and claims the sequences that
#: were not due at its start.
_ROUND_OPEN = 2.0
#: Messages a lane's refill takes at least (else as many as it sent last).  Each refill is a store
#: transaction (on PostgreSQL a round trip with its commit), and a round's claim gives each of
#: many sequences only a few (``send_batch`` over them: 3 of 50 at 16 sequences), so refills of
#: 2 or 3 made one claim every 2.4 messages.  XA in one database at 16 sequences
#: (bench_compare --clients 16, load 20-33): refill claims 0.28 -> 0.11-0.12 a message, PostgreSQL
#: commits 2.66-2.81 -> 2.44-2.66.  The round lasts longer, so its acknowledgements are applied
#: later and more rows wait for them (WAL 2.4 -> 2.7-2.8 kB a message: fewer of the claims'
#: updates find room on their page).
_REFILL_AT_LEAST = 16


class _Round:
    """A round's sending lanes, one a sequence (``RetransmissionWorker._run_lanes``): how many
    still send, and until when they take more of their sequences (:data:`_ROUND_OPEN`)."""

    def __init__(self, lanes: int, open_for: float | None = None) -> None:
        self._lock = threading.Lock()
        self._left = lanes
        self._queued = lanes
        self._closes = time.monotonic() + (_ROUND_OPEN if open_for is None else open_for)

    def began(self) -> None:
        """A lane got its thread."""
        with self._lock:
            self._queued -= 1

    def others(self) -> bool:
        """Does another lane of the round still send, and none wait for a thread (``send_concurrency``
        below the round's sequences): a lane that went on then kept a waiting sequence out until
        the round closed."""
        with self._lock:
            return self._left > 1 and self._queued <= 0

    def ended(self) -> None:
        with self._lock:
            self._left -= 1

    def left(self) -> float:
        """Seconds until the round closes (negative after)."""
        return self._closes - time.monotonic()


@dataclass
class _Planned:
    message: RmsMessage
    sequence: RmsSequence
    request_ack: bool = False
    piggyback: list[RmdSequence] = field(default_factory=list)
    #: The one request the peer's breaker let through while it is unreachable.
    probe: bool = False
    #: The acknowledgement of back-channel replies it carries, read (and taken from the owed ones)
    #: by its claim; None with ``reply_ack_taken`` false: looked up when it is sent.
    reply_ack: SequenceAcknowledgement | None = None
    reply_ack_taken: bool = False
    #: Claimed by its enqueue (:meth:`RetransmissionWorker.early_claim`): the reply sequence whose
    #: acknowledgement it carries, as read then (taken from the owed ones when it is sent).
    reply_ack_rmd: RmdSequence | None = None


class _EarlyClaim:
    """A waiting caller's claim of its request, made in the transaction that enqueues it.

    In a global transaction, which commits later or not at all, the lane is taken only once
    it committed (:meth:`after_completion`): until then the claim is the store's alone (the
    message uncommitted, then sent once and due only at its retransmission time), so no
    other caller nor round waits for a transaction that may last long; and the
    acknowledgement of the replies it carries is read with the claim, in one statement,
    without a lock the transaction would hold (``offered_id``: their sequence, when one is
    owed); the commit flushes the WAL past what it read (:mod:`~wsrm_plugin.store.late_commits`)."""

    __slots__ = ("_worker", "_key", "_rmd", "_item", "_owes_control", "_global", "_offered_id")

    def __init__(self, worker: "RetransmissionWorker", key: str, rmd: RmdSequence | None, *,
                 in_global: bool = False, offered_id: str | None = None) -> None:
        self._worker = worker
        self._key = key
        self._rmd = rmd
        self._item: _Planned | None = None
        self._owes_control = False
        self._global = in_global
        self._offered_id = offered_id

    def claim(self, tx: Any, receipt: Any) -> None:
        """In the enqueue's transaction, after it: claim the message just enqueued."""
        if receipt.sequence_key == self._key:  # else the sequence took no more: a new one got it
            self._item, self._owes_control, rmd = self._worker._claim_early(
                tx, self._key, receipt.number, self._offered_id)
            if self._item is not None:
                self._item.reply_ack_rmd = self._rmd if self._offered_id is None else rmd

    @property
    def key(self) -> str:
        """The sequence the enqueue takes (the one the engine last used for the call's target)."""
        return self._key

    @property
    def in_global(self) -> bool:
        """The enqueue is in a global transaction (its claim is the caller's once that commits)."""
        return self._global

    def first_send(self, target: str) -> tuple[float, str | None, list[tuple[int, int]] | None] | None:
        """What the enqueue needs to claim its message in its own statement
        (``enqueue_claiming``): the next send time should it be claimed, the sequence of the
        replies whose acknowledgement the request carries, read beside, and what the answers
        to earlier callers' sends on this sequence acknowledged and no store transaction
        applied yet (ranges, or None): the message before counts as acknowledged when it is
        among them.  That acknowledgement is applied later, with the others, by the sender's
        next round (:meth:`RetransmissionWorker._apply_callers_acks`), not by each message: a
        one-way caller sending each of its messages found the one before's acknowledgement
        pending every time, and applied it in its enqueue's transaction (120 of the 1,190
        Python calls of a call).  None when the claim must follow the enqueue (:meth:`claim`):
        in a global transaction with this sequence's acknowledgement pending (the enqueue rides
        on the commit, where it cannot be judged), or a peer not sent to now.  Other
        sequences' pending acknowledgements do not matter to this claim."""
        worker = self._worker
        if not worker._sends_now(target):
            return None
        acked = worker._callers_ack_of(self._key)
        if acked is not None and self._global:
            return None
        return worker._first_retry_at(target, time.time()), self._offered_id, acked

    def claimed(self, msg: RmsMessage | None, seq: RmsSequence, rmd: RmdSequence | None) -> None:
        """The enqueue claimed its message (``msg``, as enqueued) in its own statement, or found
        it not the caller's to send (None): as :meth:`claim` after it."""
        if msg is not None:
            self._item = self._worker._planned_for_caller(msg, seq)
            self._item.reply_ack_rmd = self._rmd if self._offered_id is None else rmd

    def committed(self) -> None:
        """The enqueue committed: the claim is its caller's (or the lane is free again).  In a
        global transaction: the enqueue's part is over, and the transaction's commit decides."""
        if self._global:
            self._worker.source.tm.get_transaction().register_synchronization(self)
            return
        self._settle(lane_held=True)

    def _settle(self, lane_held: bool) -> None:
        """The claim committed: the caller sends its message on the lane (``lane_held``: taken
        before the enqueue, else taken now if idle, or the message left due for the round)."""
        worker = self._worker
        if self._owes_control:
            worker.source._wake()  # every message acknowledged after the last: Close/Terminate is due
        item = self._item
        if item is None:
            if lane_held:
                worker._lane(self._key, LaneEvent.CALLER_ENDED)
        elif lane_held or worker._try_caller_lane(self._key):
            worker._hold_early(item)
        else:  # a round is on the lane now: the message it cannot see as due is made due for it
            worker._claimed_to_round(self._key, item.message.number)

    def abandon(self) -> None:
        """The enqueue failed or rolled back: nothing was claimed."""
        self._item = None
        if not self._global:
            self._worker._lane(self._key, LaneEvent.CALLER_ENDED)

    # -- a synchronization of the global transaction ----------------------------------------------

    def before_completion(self) -> None:
        pass

    def after_completion(self, status: Any) -> None:
        if status == Status.COMMITTED:  # else the claim rolled back with the enqueue; no lane was taken
            self._settle(lane_held=False)


def _chains(plan: list[_Planned]) -> list[list[list[_Planned]]]:
    """The round's messages by sequence, sequences by chain: those that continue one another.

    A chain is the sequences rolled over from one another (same target,
    caller's key and kind), the older generation first; any other sequence
    is a chain of its own.  Each sequence's messages stay in claim order.
    """
    by_sequence: dict[str, list[_Planned]] = {}
    for item in sorted(plan, key=lambda i: i.message.number):  # each sequence in number order
        by_sequence.setdefault(item.sequence.key, []).append(item)
    chains: dict[Any, list[tuple[int, list[_Planned]]]] = {}
    for key, items in by_sequence.items():
        parsed = SequenceKey.decode(key)
        if parsed is None:
            chains[key] = [(0, items)]
        else:
            chains.setdefault((parsed.target, parsed.key, parsed.offered), []).append((parsed.generation, items))
    return [[items for _, items in sorted(generations, key=lambda g: g[0])] for generations in chains.values()]


def _chain_of(key: str) -> Any:
    """What the sequences rolled over from one another share (None for other sequences)."""
    parsed = SequenceKey.decode(key)
    return None if parsed is None else (parsed.target, parsed.key, parsed.offered)


def _generation(key: str) -> int:
    parsed = SequenceKey.decode(key)
    return 0 if parsed is None else parsed.generation


def _sid(seq: RmsSequence) -> str:
    """The peer's identifier of ``seq``: every message but CreateSequence names it, and none is
    sent before the CreateSequenceResponse gave it."""
    if seq.sequence_id is None:
        raise RuntimeError(f"source sequence {seq.key!r} is not created yet: it has no identifier to send")
    return seq.sequence_id


def _refused_for_good(fault: SoapFault) -> bool:
    """Does ``fault``, the answer to an application message, blame the message itself?

    WS-RM faults are the protocol's own (the source applies them); a Receiver
    fault says "later" (a busy destination, a store that cannot write now).  A
    Sender fault, MustUnderstand (a service without WS-RM) or VersionMismatch
    is the answer every copy of the message would get."""
    return (not isinstance(fault, WSRMFault)
            and fault.code in ("Sender", "MustUnderstand", "VersionMismatch", "DataEncodingUnknown"))


def create_refusal(response: Response, content: ResponseContent | None) -> str | None:
    """Why an answer to CreateSequence is a definitive refusal, or None when retrying may help.

    Retrying helps only when the peer could not answer (a transport error,
    never seen here), was busy or broken for a while (a 5xx without a SOAP
    fault, a Receiver fault, 408/429) or said nothing usable.  A fault that
    blames the request (Sender/Client, MustUnderstand, VersionMismatch: a
    service without WS-RM) or another 4xx will be answered the same way for
    ever; so is a CreateSequenceRefused (even a Receiver one: the destination
    says no, and a refused sequence's messages wait for the operator's resend).
    """
    fault = content.fault if content is not None else None
    if isinstance(fault, WSRMFault) and fault.fault_code == "CreateSequenceRefused":
        return str(fault)  # the destination's own word, whatever its fault code
    if fault is not None:
        return None if fault.code == "Receiver" else str(fault)
    if 400 <= response.status < 500 and response.status not in (408, 429):
        return f"HTTP {response.status}"
    body = content.body if content is not None else None
    if 200 <= response.status < 300 and body is not None:  # it answered, but not to WS-RM
        tag = getattr(body, "tag", None)
        return f"answered with {etree.QName(tag).localname if isinstance(tag, str) else type(body).__name__}, " \
               "not a CreateSequenceResponse"
    return None


def soap_of(msg: RmsMessage, policy: RMPolicy) -> SoapVersion:
    return SoapVersion.for_namespace(msg.soap_version) or policy.soap_version


class RetransmissionWorker:
    """One round of the RMS worker: ``step()`` (run by a :class:`~.workers.Worker`)."""

    def __init__(self, store: StorageManager, policy: RMPolicy, source: Source, destination: Destination,
                 inbound: Inbound, transport: Transport, *,
                 on_reachable: Callable[[str], None] | None = None, name: str = "wsrm",
                 reporter: str | None = None) -> None:
        self.store = store
        self.policy = policy
        self.source = source
        self.destination = destination
        self.inbound = inbound
        self.transport = transport
        self.messages_sent = 0
        #: Application messages sent again (every attempt after a message's first, whatever its outcome).
        self.retransmissions = 0
        #: Control messages (CreateSequence, CloseSequence, TerminateSequence) sent again.
        self.control_retries = 0
        self.send_failures = 0
        self._counter_lock = threading.Lock()  # sending lanes count from several threads
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        #: Last successful exchange with the peer per sequence key (the store's
        #: ``last_activity`` only moves with acknowledgements).
        self._exchanged: dict[str, float] = {}
        self._next_keep_alive = 0.0
        self.keep_alives_sent = 0
        #: What the answers taught about each peer and each sequence (:mod:`.pacing`).
        self._peers: dict[str, RttEstimator] = {}
        self._flows: dict[str, SequenceFlow] = {}
        self._pacing_lock = threading.Lock()
        #: Acknowledgements of back-channel replies owed to the peers: sequence key -> (when it
        #: goes on its own unless a request carried it first, the sequence)
        self._reply_acks: dict[str, tuple[float, RmsSequence]] = {}
        #: The replies a predecessor of this process recorded may be owed their acknowledgement
        #: (it was killed before one went): looked at in the first round (see _owe_reply_acks).
        self._looked_for_owed_acks = False
        self._reply_acks_lock = threading.Lock()
        #: Why a message is sent again, noted at the attempt or round that decided it (observed only).
        self._again: dict[tuple[str, int], str] = {}
        self.fast_retransmits = 0
        self.loss_probes = 0
        #: A lane's claims of more of its sequence while its round's other lanes still sent
        #: (:meth:`_refill`), and the messages they took.
        self.refill_claims = 0
        self.refilled = 0
        #: The rounds whose sequences went out each on a lane of its own (:meth:`_run_lanes`), their
        #: lanes, and the lanes' time: milliseconds sending (``lane_busy_ms``) against the round's
        #: length times its lanes (``lane_slot_ms``): the rest is lanes idle at their round's end.
        self.lane_rounds = 0
        self.lanes = 0
        self.lane_busy_ms = 0
        self.lane_slot_ms = 0
        #: Why each such lane ended: the peer did not take a message (``lane_ends_untaken``), no
        #: other lane of its round still sent (``lane_ends_alone``), the round closed
        #: (``lane_ends_closed``), its sequence had nothing left to claim (``lane_ends_empty``).
        self.lane_ends_untaken = 0
        self.lane_ends_alone = 0
        self.lane_ends_closed = 0
        self.lane_ends_empty = 0
        #: Whether each peer can be reached; ``on_reachable(address)`` hears when one is back.
        self.reachability = Reachability(policy, on_reachable=self._peer_is_back)
        self._on_reachable = on_reachable
        self._back: deque[str] = deque()
        self._nothing_to_probe: dict[str, float] = {}
        #: Messages held for unreachable peers (not sent, parked in the store) since the start.
        self.held = 0
        #: Who this process is in the conditions it reports for ``wsrm status`` (:mod:`.reporter`).
        self.reporter = reporter or reporter_name(name)
        self._reported: set[str] = set()
        self._reported_changes = -1
        self._next_report = 0.0
        #: Who sends each sequence's messages now (:mod:`wsrm_plugin.statemachine.lane`): only
        #: sequences that are not idle have an entry.
        self._lane_states: dict[str, LaneState] = {}
        self._lane_lock = threading.Lock()
        #: Notified when a lane's round ends (a caller may be waiting for it: send_for_caller).
        self._lane_idle = threading.Condition(self._lane_lock)
        #: A round's and a caller's exchanges are settled one at a time (a sequence's flow learns from both).
        self._settle_lock = threading.Lock()
        #: Requests their callers sent from their own threads (statemachine.lane's SEND_FROM_CALLER).
        self.sent_by_callers = 0
        #: The plain acknowledgements that came with callers' exchanges, not applied yet: the next
        #: caller's claim on their sequence applies them in its transaction, a round the rest.
        self._callers_acks = PendingAcks()
        #: Requests claimed for their callers by their enqueue's transaction (:meth:`early_claim`),
        #: not sent yet: (sequence key, number) -> (the claim, when it goes to a round instead).
        self._early: dict[tuple[str, int], tuple[_Planned, float]] = {}
        #: The peer's identifier of each sequence a caller sent on (the name of its acknowledgement
        #: in ``_callers_acks``): sequence key -> identifier.
        self._caller_sids: dict[str, str | None] = {}
        #: One-way callers waiting for a round to send their message (:meth:`send_for_caller`'s
        #: ``paced``): (sequence key, number) -> set once a round sent it, held it or stopped.
        self._paced_callers: dict[tuple[str, int], threading.Event] = {}
        #: One-way messages whose callers waited for a round to send them (paced, not sent by them).
        self.callers_paced = 0

    def step(self) -> bool:
        now = time.time()
        self._expire_early_claims()
        self._apply_callers_acks()
        released = self._release_held()
        probed = self._probe(now)
        controlled = self._control(now)
        sent = self._transmit(now)
        if not self._looked_for_owed_acks:
            self._owe_reply_acks()
        replies_acked = self._acknowledge_replies()
        kept = self._keep_alive(time.time())
        self._report_unreachable()
        return released or probed or controlled or sent or kept or replies_acked

    # -- unreachable peers (see .reachability) ----------------------------------------------------

    def _report_unreachable(self) -> None:
        """Write the unreachable peers into the store for ``wsrm status`` (another process): on a
        change, and every half minute while one stays unreachable, so that its age says whether
        the report is fresh.  The first call also clears what an earlier run of this engine left."""
        now = time.time()
        changes = self.reachability.changes
        if changes == self._reported_changes and (not self._reported or now < self._next_report):
            return
        peers = self.reachability.unreachable()
        kind = NodeCondition.UNREACHABLE_PEER
        try:
            with self.store.begin() as tx:
                if self._reported_changes < 0:  # a predecessor's reports, and anyone's older than a day
                    tx.conditions.remove(kind, reporter=self.reporter)
                    tx.conditions.remove(kind, reported_before=now - 86400)
                for peer in peers:
                    detail = f"{peer.probes} probe(s), {peer.held} message(s) held, " + (
                        "a probe is out" if peer.next_probe_at is None
                        else f"next probe in {max(peer.next_probe_at - now, 0):.0f}s")
                    tx.conditions.put(NodeCondition(kind, peer.address, self.reporter,
                                                    "probing" if peer.probing else "unreachable", peer.since,
                                                    peer.last_error, detail, now))
                for address in self._reported - {peer.address for peer in peers}:
                    tx.conditions.remove(kind, subject=address, reporter=self.reporter)
        except StoreError as exc:  # only the report is late: the next round writes it
            log.debug("unreachable peers not reported to the store: %s", exc)
            return
        self._reported = {peer.address for peer in peers}
        self._reported_changes = changes
        self._next_report = now + min(30.0, self.policy.probe_interval_cap)

    def _peer_is_back(self, address: str) -> None:
        self._back.append(address)
        if self._on_reachable is not None:
            self._on_reachable(address)

    def _release_held(self) -> bool:
        """Everything held for a peer that answered again is due at once, control messages too."""
        released = False
        while self._back:
            address = self._back.popleft()
            self._nothing_to_probe.pop(address, None)
            held = self.reachability.take_held(address)
            now = time.time()
            with self.store.begin() as tx:
                owing = {seq.key for seq in tx.rms.list_all() if seq.target == address
                         and seq.next_control_at is not None and seq.next_control_at > now}
                for key in sorted(owing | set(held)):  # rows in key order, as _make_due takes them
                    try:
                        if key in held:
                            tx.rms_messages.make_due(key, held[key], at=AT_ONCE)
                        if key in owing:
                            tx.rms.update(key, next_control_at=now)
                    except UnknownSequenceError:
                        continue  # released meanwhile
            with self.store.begin() as tx:  # its own transaction: RMD rows before RMS ones, never after
                for rmd in tx.rmd.list_all():  # acknowledgements held for it (the RMD worker's)
                    if rmd.acks_to == address and rmd.ack_due_at is not None and rmd.ack_due_at > now:
                        tx.rmd.update(rmd.sequence_id, ack_due_at=now)
            released = True
        return released

    def _probe(self, now: float) -> bool:
        """For each unreachable peer whose back-off ended, one request (a message that falls due
        goes as the probe by itself; this finds one when none does):

        * an AckRequested on a sequence the peer has not heard of for the keep-alive time: a
          peer that turns messages away (503: its budget is full) may still count it as the
          sequence's activity, which keeps the sequence from ending for inactivity;
        * else the lowest held message: it is delivered if the peer is back;
        * else a control message a sequence owes the peer (CreateSequence, Close, Terminate).
        """
        sent = False
        for address in self.reachability.probes_due():
            if self._nothing_to_probe.get(address, 0.0) > now:
                continue
            with self.store.begin() as tx:
                mine = [seq for seq in tx.rms.list_all()
                        if seq.target == address and not (seq.faulted or seq.terminate_sent)]
                silent = [seq for seq in mine if seq.started and seq.sequence_id is not None
                          and max(seq.last_activity, self._exchanged.get(seq.key, 0.0)) + self.keep_alive_after <= now
                          and tx.rms_messages.has_unacked(seq.key)]
            owing = [seq.key for seq in mine if seq.next_control_at is not None]
            held = self.reachability.held_messages(address)
            if silent:
                if self.reachability.gate(address) is Gate.PROBE:
                    self._send_ack_requested(silent[0], probe=True)
                    sent = True
            elif held and self._probe_with_message(address, *held[0], now):
                sent = True
            elif owing:
                with self.store.begin() as tx:
                    if tx.rms.get(owing[0]) is not None:
                        tx.rms.update(owing[0], next_control_at=now)
                sent = self._control_one(owing[0], now) or sent
            else:
                # Nothing of ours to probe with (a message falling due, or the acknowledgement
                # worker, may probe it meanwhile): look again in a second, not at every round.
                self._nothing_to_probe[address] = now + max(5 * self.policy.poll_interval, 1.0)
        return sent

    def _probe_with_message(self, address: str, key: str, number: int, now: float) -> bool:
        """Send message ``number`` of sequence ``key`` as the probe; False when it cannot be."""
        if self.reachability.gate(address) is not Gate.PROBE:
            return False
        item = None
        with self.store.begin(durable=False) as tx:
            seq = tx.rms.get(key)
            msg = tx.rms_messages.get(key, number) if seq is not None else None
            if seq is not None and msg is not None and not msg.acked and seq.started and not seq.faulted \
                    and seq.sequence_id is not None:
                if msg.send_count and self.policy.retries_exhausted(msg.send_count):
                    self.source.fault_in(tx, seq, f"message {number} unacknowledged after {msg.send_count} "
                                                  "transmissions")
                else:
                    tx.rms_messages.record_send_attempt(
                        key, number, next_send_at=now + self.reachability.hold_seconds(), now=now)
                    item = _Planned(msg, seq, request_ack=self.policy.ack_request is not AckRequestMode.NEVER,
                                    probe=True)
        if item is None:
            self.reachability.abandon_probe(address)
            return False
        exchange = self._send_or_hold(item)
        if exchange is not None:
            self._settle([(item, exchange)])
        return True

    def _hold(self, tx: Any, seq: RmsSequence, numbers: list[int], now: float) -> None:
        """Park messages of an unreachable peer: unsent, and not due again before the probe cap."""
        tx.rms_messages.make_due(seq.key, numbers, at=now + self.reachability.hold_seconds())
        self.reachability.held(seq.target, seq.key, numbers)
        self._bump(held=len(numbers))
        for number in numbers:
            self._round_sent(seq.key, number)

    # -- keep-alive -----------------------------------------------------------------------------

    @property
    def keep_alive_after(self) -> float:
        """Seconds of silence on a sequence with messages still to deliver before an AckRequested."""
        timeout = self.policy.inactivity_timeout or _DEFAULT_PEER_INACTIVITY
        return timeout * _KEEP_ALIVE_FRACTION

    def _keep_alive(self, now: float) -> bool:
        """AckRequested for busy sequences the peer has not heard from for a while.

        A large backlog spread over many sequences can keep a sequence's
        messages waiting longer than the destination's inactivity timeout
        (its timer runs from the CreateSequence or the last message); the
        destination would end it and fault every message left.  Any message on
        the sequence resets that timer, so an AckRequested does (and its
        acknowledgement is welcome anyway).  Our own ``inactivity_timeout``
        stands for the peer's, which is not on the wire.
        """
        after = self.keep_alive_after
        if now < self._next_keep_alive:
            return False
        self._next_keep_alive = now + max(self.policy.poll_interval, after / 4)
        idle: list[RmsSequence] = []
        with self.store.begin() as tx:
            sequences = tx.rms.list_all()
            live = {seq.key for seq in sequences}
            for key in set(self._exchanged) - live:
                self._exchanged.pop(key, None)  # released sequences
            self.reachability.forget({key for key in self.reachability.held_keys() if key not in live})
            with self._pacing_lock:
                for key in set(self._flows) - live:
                    self._flows.pop(key, None)
            for key in set(self._caller_sids) - live:  # (callers only ever add)
                self._caller_sids.pop(key, None)
            for seq in sequences:
                if not rms_life(seq).transmitting or seq.sequence_id is None or is_back_channel(seq.target):
                    continue
                last = max(seq.last_activity, self._exchanged.get(seq.key, 0.0))
                if last + after <= now and tx.rms_messages.has_unacked(seq.key):
                    idle.append(seq)
        sent = False
        for seq in idle:
            # To an unreachable peer a keep-alive goes only as its probe: a peer whose store turns
            # messages away (503) may still count an AckRequested as the sequence's activity.
            gate = self.reachability.gate(seq.target)
            if gate is not Gate.WAIT:
                self._send_ack_requested(seq, probe=gate is Gate.PROBE)
                sent = True
        return sent

    def _exchanged_with(self, key: str) -> None:
        self._exchanged[key] = time.time()

    def _send_ack_requested(self, seq: RmsSequence, probe: bool = False) -> None:
        rm = rm_version_of(seq)
        soap, wsa = self._soap_wsa(seq)
        action = rm.ack_requested_action
        data = protocol_message(soap, wsa, to=seq.target, action=action,
                                headers=[AckRequested(_sid(seq)).to_xml(rm, soap)])
        slog = for_sequence(log, seq.sequence_id, key=seq.key)
        try:
            response = self.transport.send(seq.target, data, routing_headers(soap, action, seq))
        except TransportError as exc:
            self.send_failures += 1
            self.reachability.failed(seq.target, str(exc), probe=probe)
            slog.info("keep-alive AckRequested not delivered (will retry): %s", exc)
            return
        self._heard(seq.target, response, probe)
        self.keep_alives_sent += 1
        if 200 <= response.status < 300:
            self._exchanged_with(seq.key)
        slog.info("messages still waiting to go out: AckRequested sent so the peer keeps the sequence")
        self._read(seq, response, "AckRequested", store_key=seq.key)

    def _bump(self, **counts: int) -> None:
        with self._counter_lock:
            for name, n in counts.items():
                if n:
                    setattr(self, name, getattr(self, name) + n)

    def _read(self, seq: RmsSequence, response: Response, what: str, number: int | None = None,
              **kwargs: Any) -> ResponseContent | None:
        """The response's content (None when it had none), after logging an answer that is no SOAP.

        An HTTP error with a proxy's or server's text page says more by its
        status and URL than a parse error of its body would.
        """
        if response.body and response.is_xml:
            # said only of a response that cannot be read: not written out for every one
            return self.inbound.read_response(
                response.body, origin=lambda: f"{response.describe(seq.target)} to {what}", **kwargs)
        if not 200 <= response.status < 300:
            # An unavailable peer's answers (502, 503...) say so at INFO until its breaker judges
            # it unreachable, which it reports once (WARNING), then at DEBUG: not once per request.
            level = logging.WARNING
            if failure_of(response) is not None:
                level = logging.INFO if self.reachability.sending(seq.target) else logging.DEBUG
            for_sequence(log, seq.sequence_id, number, key=seq.key).log(
                level, "%s answered with %s; treating it as lost (will retry)", what, response.describe(seq.target))
        elif response.body:
            for_sequence(log, seq.sequence_id, number, key=seq.key).warning(
                "%s answered with %s, which is no SOAP envelope; ignored", what, response.describe(seq.target))
        return None

    # -- control messages -----------------------------------------------------------------------

    def _control(self, now: float) -> bool:
        with self.store.begin() as tx:
            due = tx.rms.needing_work(now, limit=_CONTROL_BATCH)
        if len(due) > 1 and self.policy.send_lanes(len(due)) > 1:
            # Independent sequences' control messages go out at once, as their messages do, on
            # the sending lanes: 16 callers opening their sequences together waited for 16
            # CreateSequence exchanges one after the other (a third of a second on a loaded
            # machine), and no message went out meanwhile.
            pool = self._lanes()
            futures = [pool.submit(self._control_one, seq.key, now) for seq in due]
            wait(futures)
            return any([future.result() for future in futures])
        worked = False
        for seq in due:
            worked = self._control_one(seq.key, now) or worked
        return worked

    def _control_one(self, key: str, now: float) -> bool:
        policy = self.policy
        with self.store.begin() as tx:
            seq = tx.rms.get(key)
            if seq is None:
                return False
            slog = for_sequence(log, seq.sequence_id, key=key)
            live = rms_life(seq).live
            if live and seq.expires is not None and seq.expires <= now:
                seq = tx.rms.update(key, expires=None)
                self.source.fault_in(tx, seq, "the sequence expired")
                return True
            if seq.next_control_at is None or seq.next_control_at > now:
                return False
            action = self._control_action(seq, tx.rms_messages.has_unacked(key))
            if action is None:  # messages in flight, or an open sequence: acks and close() set the next time
                tx.rms.update(key, next_control_at=None)
                return False
            probe = False
            if action != "release":
                attempts = seq.control_attempts
                if policy.retries_exhausted(attempts) or \
                        (action == "terminate" and attempts >= policy.max_terminate_attempts):
                    if action == "terminate":
                        slog.warning("TerminateSequence unanswered after %d attempts; releasing the "
                                     "sequence anyway (every message was acknowledged)", attempts)
                        action = "give-up"
                    else:
                        self.source.fault_in(tx, seq, f"no answer to {action} sequence after {attempts} attempts")
                        return True
                else:
                    gate = self.reachability.gate(seq.target)
                    if gate is Gate.WAIT:  # the peer is unreachable: no attempt, none counted
                        tx.rms.update(key, next_control_at=now + self.reachability.hold_seconds())
                        return False
                    probe = gate is Gate.PROBE
                    if attempts:
                        self._bump(control_retries=1)
                    tx.rms.update(key, control_attempts=attempts + 1,
                                  next_control_at=now + policy.retry_delay(attempts + 1),
                                  **({"close_sent": True} if action == "close" else {}))
        if action == "release":
            if seq.faulted:
                if not self.source.report_and_release(key):
                    with self.store.begin() as tx:
                        if tx.rms.get(key) is not None:
                            tx.rms.update(key, next_control_at=now + policy.retry_delay(1))
            else:
                self.source.on_terminated(key)
            return True
        if action == "give-up":
            self.source.on_terminated(key)
            return True
        getattr(self, f"_send_{action}")(seq, probe)
        return True

    def _control_action(self, seq: RmsSequence, unacked: int) -> str | None:
        """The control duty of the sequence's state: release, create, close, terminate or None."""
        close_first = rm_version_of(seq).is_11 and self.policy.close_before_terminate
        duties = rms_duties(rms_state(seq, unacked), close_first=close_first)
        for duty, action in ((RMSDuty.RELEASE, "release"), (RMSDuty.SEND_CREATE_SEQUENCE, "create"),
                             (RMSDuty.SEND_CLOSE, "close"), (RMSDuty.SEND_TERMINATE, "terminate")):
            if duty in duties:
                return action
        return None

    def _soap_wsa(self, seq: RmsSequence) -> tuple[SoapVersion, AddressingVersion]:
        wsa = AddressingVersion.for_namespace(seq.wsa_version) or self.policy.addressing
        return self.policy.soap_version, wsa

    def _heard(self, target: str, response: Response, probe: bool = False) -> None:
        """Tell the peer's breaker what an HTTP answer says: an answer, or the peer unavailable."""
        failure = failure_of(response)
        if failure is None:
            self.reachability.answered(target)
        else:
            self.reachability.failed(target, failure, probe=probe, retry_after=retry_after_of(response))

    def _post(self, seq: RmsSequence, action: str, body: Any, *, message_id: str | None = None,
              probe: bool = False) -> Response | None:
        """Send a control message on its own; its HTTP response, or None when the transport failed."""
        soap, wsa = self._soap_wsa(seq)
        rm = rm_version_of(seq)
        data = protocol_message(soap, wsa, to=seq.target, action=action, body=body.to_xml(rm) if not
                                isinstance(body, CreateSequence) else body.to_xml(rm, wsa),
                                reply_to=wsa.anonymous, message_id=message_id)
        try:
            response = self.transport.send(seq.target, data, routing_headers(soap, action, seq))
        except TransportError as exc:
            self._bump(send_failures=1, control_retries=exc.attempts - 1)
            self.reachability.failed(seq.target, str(exc), probe=probe)
            level = logging.INFO if self.reachability.sending(seq.target) else logging.DEBUG
            for_sequence(log, seq.sequence_id, key=seq.key).log(
                level, "%s not delivered (will retry): %s", type(body).__name__, exc)
            return None
        self._heard(seq.target, response, probe)
        self._bump(control_retries=response.attempts - 1)
        if 200 <= response.status < 300:
            self._exchanged_with(seq.key)
        return response

    def _exchange(self, seq: RmsSequence, action: str, body: Any, *, message_id: str | None = None,
                  apply_faults: bool = True, probe: bool = False) -> ResponseContent | None:
        """Send a control message; the response's content (None when nothing usable came back)."""
        response = self._post(seq, action, body, message_id=message_id, probe=probe)
        if response is None:
            return None
        return self._read(seq, response, type(body).__name__, store_key=seq.key, apply_faults=apply_faults)

    def _send_create(self, seq: RmsSequence, probe: bool = False) -> None:
        rm = rm_version_of(seq)
        acks_to = EndpointReference(seq.acks_to)
        offer = None
        if seq.offered_id:
            reply_to = EndpointReference(self.source.endpoint_address or seq.acks_to)
            offer = Offer(seq.offered_id, endpoint=reply_to if rm.is_11 else None)
        response = self._post(seq, rm.create_sequence_action, CreateSequence(acks_to, offer=offer),
                              message_id=self.source.create_message_id(seq), probe=probe)
        if response is None:
            self._release_paced(seq.key)  # paced callers do not wait for the next try
            return  # a transport error: tried again
        content = self._read(seq, response, "CreateSequence", store_key=seq.key, apply_faults=False)
        if content is not None and isinstance(content.body, CreateSequenceResponse):
            self.source.on_create_sequence_response(seq.key, content.body, rm,
                                                    create_offered=self.destination.create_offered)
            return
        self._release_paced(seq.key)
        refusal = create_refusal(response, content)
        if refusal is not None:
            self.source.fault_sequence(seq.key, f"{CREATE_REFUSED} by {seq.target}: {refusal}")
        elif content is not None and content.fault is not None:
            for_sequence(log, None, key=seq.key).warning(
                "CreateSequence to %s answered with a fault (will retry): %s", seq.target, content.fault)

    def _send_close(self, seq: RmsSequence, probe: bool = False) -> None:
        rm = rm_version_of(seq)
        last = seq.last_number or None
        content = self._exchange(seq, rm.action("CloseSequence"), CloseSequence(_sid(seq), last),
                                 apply_faults=False, probe=probe)
        if content is None:
            return
        if isinstance(content.body, CloseSequenceResponse):
            self.source.on_closed(seq.key)
            return
        fault = content.fault
        if not isinstance(fault, WSRMFault):
            if fault is not None:
                for_sequence(log, seq.sequence_id, key=seq.key).warning(
                    "CloseSequence answered with a fault (will retry): %s", fault)
            return
        # A retried Close (its first response lost) may find the sequence closed, or already
        # gone: Close is only sent once every message is acknowledged, so neither loses anything.
        if fault.fault_code == "SequenceClosed":
            self.source.on_closed(seq.key)
        elif fault.fault_code in _GONE:
            for_sequence(log, seq.sequence_id, key=seq.key).info(
                "CloseSequence answered %s: the destination is done with the sequence", fault.fault_code)
            self.source.on_terminated(seq.key)
        else:
            self.source.on_fault(fault, seq.key)

    def _send_terminate(self, seq: RmsSequence, probe: bool = False) -> None:
        rm = rm_version_of(seq)
        last = (seq.last_number or None) if rm.is_11 else None
        response = self._post(seq, rm.terminate_sequence_action, TerminateSequence(_sid(seq), last), probe=probe)
        if response is None:
            return
        content = self._read(seq, response, "TerminateSequence", apply_faults=False)
        fault = content.fault if content is not None else None
        body = content.body if content is not None else None
        if fault is not None:
            ended = isinstance(fault, WSRMFault) and fault.fault_code in _GONE
        else:
            # 1.0 has no TerminateSequenceResponse: a 2xx is all there is. In 1.1 a 2xx without a
            # body is what a destination that already forgot the sequence may answer a retried
            # Terminate with (gSOAP 2.8 answers 202): it took the message, and every message was
            # acknowledged before it went out, so waiting for more would only keep the sequence.
            ended = isinstance(body, TerminateSequenceResponse) or (
                200 <= response.status < 300 and (body is None or not rm.is_11))
        if ended:
            self.source.on_terminated(seq.key)

    def _last_message_accepted(self, seq: RmsSequence, number: int) -> None:
        """A 1.0 LastMessage the destination accepted counts as acknowledged (anonymous AcksTo only).

        It carries no application data, and some destinations never acknowledge
        it on the back-channel: gSOAP 2.8 answers it 202 and sends its acks to
        an anonymous AcksTo nowhere.  Waiting for that ack would retransmit the
        LastMessage for ever and never terminate; every application message
        must still be acknowledged before TerminateSequence goes out.
        """
        try:
            self.source.on_ack(SequenceAcknowledgement(_sid(seq), [(number, number)]), RM10)
        except WSRMFault as fault:  # the sequence went away meanwhile: nothing left to do
            for_sequence(log, seq.sequence_id, number).debug("LastMessage acceptance not applied: %s", fault)

    # -- application messages -----------------------------------------------------------------------

    def _transmit(self, now: float) -> bool:
        plan = self._claim(now)
        if not plan:
            return False
        keys = {item.sequence.key for item in plan}
        for key in keys:
            self._lane(key, LaneEvent.ROUND_CLAIMED)
        try:
            return self._transmit_plan(plan)
        finally:
            for key in keys:
                self._lane(key, LaneEvent.ROUND_ENDED)

    def _transmit_plan(self, plan: list[_Planned]) -> bool:
        chains = _chains(plan)
        exchanges: list[tuple[_Planned, Exchange]] = []
        try:
            if len(chains) > 1 and self.policy.send_lanes(len(chains)) > 1:
                # Several independent sequences: each gets a lane of its own, and they go out at
                # once, as many as send_concurrency allows (one per sequence by default).  The
                # destination records a sequence's messages one at a time (its acknowledgement
                # state is one row), so parallel requests on one sequence mostly wait for each
                # other there; on different sequences their durable receives overlap.
                self._run_lanes([[item for items in chain for item in items] for chain in chains], exchanges,
                                refill=True)
                return True
            for chain in chains:
                for items in chain:  # a rolled-over sequence before its successor
                    self._send_pipelined(items, exchanges)
            return bool(plan)
        finally:
            if exchanges:
                self._settle(exchanges)

    def _send_pipelined(self, items: list[_Planned], exchanges: list[tuple[_Planned, Exchange]]) -> None:
        """One sequence's messages over up to ``send_lanes(1)`` keep-alive connections at once.

        The peer's durable receive of one overlaps the others' transfer and
        parsing instead of adding up.  They were claimed (and the window
        checked) together; dealt round robin, they arrive nearly in order, and
        a destination that buffers orders them anyway.  One that discards
        out-of-order messages gets them one at a time, in order.
        """
        flow = self._flow(items[0].sequence.key)
        lanes = 1 if flow.ordered else min(self.policy.send_lanes(1), len(items))
        started = time.monotonic()
        if flow.ordered:
            self._send_in_order(items, flow, exchanges)
        elif lanes <= 1:
            self._send_lane(items, exchanges)
        else:
            self._run_lanes([items[i::lanes] for i in range(lanes)], exchanges)
        flow.note_round(ordered=flow.ordered, seconds=time.monotonic() - started)

    def _run_lanes(self, lanes: list[list[_Planned]], exchanges: list[tuple[_Planned, Exchange]], *,
                   refill: bool = False) -> None:
        """Send each lane on a thread of the pool; returns once every send has ended and the
        round's acknowledgements are applied (one store transaction per sequence, not per lane).

        The pool starts a thread only when a lane finds none idle, up to the policy's
        ``most_requests_in_flight``: the lanes in flight grow with the sequences a round has
        due, and a sender that only ever has one sequence due keeps a thread or a few.

        ``refill``: each lane is one sequence's (or chain's) messages; a
        lane that has sent them while another lane of the round still sends takes its sequence's
        next ones (:meth:`_refill`) rather than wait for the round's end, until the round closes
        (:data:`_ROUND_OPEN`)."""
        pool = self._lanes()
        sending = _Round(len(lanes)) if refill else None
        started = time.monotonic()
        with self.source.coalesced_acks() as pending:
            futures = [pool.submit(self._send_lane, lane, exchanges, pending, sending) for lane in lanes]
            wait(futures)  # every lane has merged its acknowledgements before they are applied
            if sending is not None:
                self._bump(lane_rounds=1, lanes=len(lanes),
                           lane_slot_ms=round(1000 * (time.monotonic() - started) * len(lanes)))
            for future in futures:
                future.result()

    def _send_lane(self, items: list[_Planned], exchanges: list[tuple[_Planned, Exchange]],
                   pending: PendingAcks | None = None, sending: "_Round | None" = None) -> None:
        """Send ``items``; with ``sending`` (a round of several sequences) and one sequence's
        items, go on with its next ones (:meth:`_refill`) while another lane of the round sends
        and the round is open, each refill as many as the lane sends before it closes."""
        refilling = sending is not None and len({i.sequence.key for i in items}) == 1
        if sending is not None:
            sending.began()
        began = time.monotonic()
        sent = taken_whole = 0
        why = "lane_ends_closed"
        try:
            with self.source.coalesced_acks(pending):  # one store transaction for the acks, not one per message
                while items:
                    taken = True  # the peer took each of them: no gap, no failure, nothing held
                    for item in items:
                        exchange = self._send_or_hold(item)
                        if exchange is not None:
                            exchanges.append((item, exchange))
                        taken = taken and exchange is not None and exchange.answered and (
                            exchange.bare or (exchange.ack is not None and item.message.number in exchange.ack))
                    sent += len(items)
                    if not taken or not refilling or sending is None or not sending.others():
                        why = "lane_ends_untaken" if not taken else "lane_ends_alone"
                        break
                    each, left = (time.monotonic() - began) / sent, sending.left()
                    if left < each / 2:
                        break  # the round closes: it ends with the others, within a message of each other
                    seq = items[-1].sequence
                    count = min(max(len(items), _REFILL_AT_LEAST), max(1, round(left / each)))
                    taken_whole += 1
                    items = self._refill(seq, count, 0 if pending is None else pending.acked_through(_sid(seq)),
                                         taken_whole)
                    if not items:
                        why = "lane_ends_empty"
        finally:
            if sending is not None:
                sending.ended()
                self._bump(**{why: 1, "lane_busy_ms": round(1000 * (time.monotonic() - began))})

    def _refill(self, seq: RmsSequence, count: int, acked_through: int = 0, taken: int = 0) -> list[_Planned]:
        """The next ``count`` messages of ``seq`` never sent yet, claimed for the lane that has
        just sent its round's messages of it (``_run_lanes``).

        ``acked_through``: the sequence's messages up to it are acknowledged in the answers the
        round holds (:meth:`PendingAcks.acked_through`), not yet in the store, which applies them
        at the round's end: the claim passes over them.  Past their retransmission time (a lane
        that sends longer than the interval) they are due there, and the first due message, a
        retransmission, made the claim take nothing: the lane ended, or applied them first, a
        store transaction (XA in one database at 16 sequences, 1,600 messages: 0.17 a message
        where lanes go on until their round closes).

        Only the plain case: a reachable peer that took every message the lane sent, never
        seen discarding one sent after a gap, no window to keep (``max_unacknowledged``), no
        retransmission due in the sequence; at most the flow's claim limit (a sequence sent in
        order keeps its window), grown as a round's end grows it (doubled, up to the batch)
        for each time the lane's peer took all it claimed, ``taken`` times: the window, learnt
        once a round, stayed at 2 or 4 through a round that lasts while it has messages.  A round
        that tries the other way of sending a sequence (``flow.probing``) refills as any: each
        of its lanes sends one message at a time anyway.  Everything else (retransmissions,
        piggybacked acknowledgements) waits for the next round as before.  The claim records
        each attempt before the send, as a round's does, and is no more durable: a crash
        forgets at most that they were sent (they are sent again)."""
        policy = self.policy
        key = seq.key
        flow = self._flow(key)
        if policy.max_unacknowledged is not None or flow.discards_seen or not self._sends_now(seq.target):
            return []
        limit = flow.claim_limit()
        count = min(count, limit if limit >= flow.batch else min(limit << min(taken, 8), flow.batch))
        now = time.time()
        next_at = self._first_retry_at(seq.target, now)
        with self.store.begin(durable=False) as tx:
            tx.next_write_commits()  # the claim is all it writes: its COMMIT costs no round trip
            # the sequence read beside callers' enqueues, and claimed from only while it transmits
            current, msgs = tx.rms_messages.claim_first_sends_of(key, count, next_send_at=next_at, now=now,
                                                                 after=acked_through)
            if current is None or current.sequence_id is None or not rms_life(current).transmitting:
                return []
        self._bump(refill_claims=1, refilled=len(msgs))
        always = policy.ack_request is AckRequestMode.ALWAYS
        return [_Planned(msg, current, request_ack=always) for msg in msgs]

    def _send_in_order(self, items: list[_Planned], flow: SequenceFlow,
                       exchanges: list[tuple[_Planned, Exchange]]) -> None:
        """One sequence's messages one at a time, going back to the gap as soon as an answer shows one.

        For a peer that discards (or holds) a message sent after a gap, every
        message sent past a gap is wasted (or waits for the peer's hold time),
        so the lane goes back at once: a failed exchange is sent again, and an
        answer that leaves the message out sends the numbers from the gap
        again, each attempt recorded before it goes out, as every send is.
        """
        queue = deque(items)
        backs = 0
        seen = AckRanges()  # what this round's answers acknowledged (flow.known learns it at its end)
        with self.source.coalesced_acks():
            while queue:
                item = queue.popleft()
                exchange = self._send_or_hold(item)
                if exchange is None:
                    continue
                exchanges.append((item, exchange))
                if exchange.ack is not None:
                    seen = seen.union(exchange.ack)
                if backs >= _MAX_GO_BACKS:
                    continue
                gap = self._gap(item, exchange, flow, seen)
                if gap is None:
                    continue
                if not exchange.answered and not self._peer(item.sequence.target).alive:
                    continue  # a silent peer: no point in sending it again at once
                backs += 1
                skip = exchange.ack or AckRanges()
                again = self._reclaim(item.sequence, [n for n in range(gap, item.message.number + 1) if n not in skip]
                                      [:flow.window])
                queue.extendleft(reversed(again))

    def _gap(self, item: _Planned, exchange: Exchange, flow: SequenceFlow,
             seen: AckRanges | None = None) -> int | None:
        """The number to go back to after ``exchange``, or None when the peer took the message.

        ``seen``: what the answers of this round acknowledged so far.  A bare answer from a
        peer that acknowledges in its responses means it did not take the message -- unless
        an answer already said it holds it, or it is a WS-RM 1.0 LastMessage (gSOAP answers
        that with a bare 202 whether or not it holds it, and acknowledges it in its answers to
        the others: going back on that resent the last window of a sequence 16 times).
        """
        if not exchange.answered:
            return item.message.number
        ack = exchange.ack
        if ack is None:
            if not (exchange.bare and flow.acks_in_responses):
                return None
            if item.message.last:
                return None  # a 1.0 LastMessage answered 2xx counts as taken (_last_message_accepted)
            ack = flow.known if seen is None else flow.known.union(seen)
        if item.message.number in ack:
            return None
        return min(ack.next_expected, item.message.number)

    def _reclaim(self, seq: RmsSequence, numbers: list[int]) -> list[_Planned]:
        """Record another attempt of ``numbers`` (those still unacknowledged) to send them now."""
        if not numbers:
            return []
        now = time.time()
        planned: list[_Planned] = []
        with self.store.begin() as tx:
            # held as the claim holds it (against close and terminate only): a caller whose open
            # transaction took the sequence's next number must not hold the round up until it ends
            if tx.rms.get(seq.key, beside_enqueues=True) is None:
                return []
            for number in numbers:
                msg = tx.rms_messages.get(seq.key, number)
                if msg is None or msg.acked or msg.send_count == 0:
                    continue
                attempt = msg.send_count + 1
                msg = tx.rms_messages.record_send_attempt(
                    seq.key, number, next_send_at=now + self._retry_delay(seq.target, attempt), now=now)
                self._note_again(seq.key, number, "sent again at once: the peer discards what follows a gap")
                planned.append(_Planned(replace(msg, send_count=attempt - 1), seq, request_ack=
                                        self.policy.ack_request is not AckRequestMode.NEVER))
        self._bump(fast_retransmits=len(planned))
        return planned

    # -- a waiting caller sends its own request (statemachine.lane) ----------------------------------

    def _lane(self, key: str, event: LaneEvent) -> None:
        """Apply ``event`` to sequence ``key``'s lane (raises InvalidTransition when it is refused)."""
        with self._lane_lock:
            state = lane_transition(self._lane_states.get(key, LaneState.initial()), event).state
            if state.idle:
                self._lane_states.pop(key, None)
            else:
                self._lane_states[key] = state
            if event is LaneEvent.ROUND_ENDED or event is LaneEvent.CALLER_ENDED:
                self._lane_idle.notify_all()

    def _caller_claims_lane(self, key: str, deadline: float | None = None) -> bool:
        """CALLER_CLAIMS on ``key``'s lane; while a round is finishing on it, wait for its end (at
        most the caller's grace, after which the round may take the request anyway).

        The round that sent this caller's previous request resolved its future before the round
        ended (applying the round's acknowledgements, settling): a caller that calls again at once
        finds that round still on the lane, and leaving its request to the sender there would
        keep every following call of it on the sender's thread.  Another caller's request on
        the lane is not waited for once it is out (the sender's round sends beside it); one its
        enqueue claimed and its caller has not sent yet is (:meth:`early_claim`).  ``deadline``
        (``time.monotonic()``): wait until then instead (a paced one-way caller)."""
        if deadline is None:
            deadline = time.monotonic() + (self.policy.caller_send_grace or 0.0)
        with self._lane_lock:
            while True:
                state = self._lane_states.get(key, LaneState.initial())
                try:
                    self._lane_states[key] = lane_transition(state, LaneEvent.CALLER_CLAIMS).state
                    return True
                except InvalidTransition:
                    left = deadline - time.monotonic()
                    # another caller's request claimed by its enqueue and not sent yet: wait for
                    # its send to start (or its grace to end), as for a round's end, rather than
                    # have this request overtake it with the round
                    waits = not state.caller_sending or any(k == key for k, _ in self._early)
                    if not waits or left <= 0:
                        return False
                    self._lane_idle.wait(left)

    def lane_of(self, key: str) -> LaneState:
        """Who sends sequence ``key``'s messages now."""
        with self._lane_lock:
            return self._lane_states.get(key, LaneState.initial())

    def send_for_caller(self, key: str, number: int, *, paced: float | None = None) -> bool:
        """Send message ``number`` of sequence ``key`` from the calling thread, if its lane is idle.

        For a caller that waits for the reply of its own request: its thread
        sends the request and reads the answer (which resolves its call) instead
        of handing both over to the sender's thread and back.  The message is
        claimed as a round claims it (its first attempt recorded, with the next
        retransmission time, before it goes out), so when this thread's send
        fails or never ends, the retransmission timer sends it again.  False,
        and nothing sent, when the lane is not idle or the store says the
        message is not this caller's to send (a round claimed it, it was sent or
        acknowledged already, something before it is still unacknowledged, its
        peer is unreachable...): the sender's round sends it then.

        ``paced`` (seconds; a one-way caller, policy ``one_way_caller_sends``): a caller that
        cannot send its message waits, at most that long in all, for a round on its lane to end
        and then for a round to send (or hold) its message, before it returns: a caller never
        runs ahead of what its sequence has sent.  Left to the sender, 16 callers on a memory
        store stored a round's messages in a third of its time (each of the sender's sends then
        waiting for the interpreter behind them) while the service, fed a sixth of them, idled;
        and a caller that runs ahead never gets its lane back (its next message always has one
        before it still to send).  Paced, a caller's next message finds the message before it
        sent and acknowledged, and the caller sends it itself.
        """
        early = self._take_early(key, number)
        if early is not None:
            self._send_early(key, early)
            return True
        deadline = None if paced is None else time.monotonic() + paced
        if not self._caller_claims_lane(key, deadline):
            self._leave_to_round(key, number, deadline)
            return False
        item: _Planned | None = None
        try:
            item = self._claim_for_caller(key, number)
            if item is not None:
                self._transmit_for_caller(item)
        finally:
            self._lane(key, LaneEvent.CALLER_ENDED)
        if item is None:
            self._leave_to_round(key, number, deadline)
        return item is not None

    def _leave_to_round(self, key: str, number: int, deadline: float | None) -> None:
        """:meth:`leave_to_round`; with a ``deadline`` (a paced one-way caller), then wait until a
        round sent or held the message (or the deadline, or the sender's stop)."""
        if deadline is None:
            self.leave_to_round(key, number)
            return
        if self._peer_failing(key):  # a round would not send it soon: the caller returns now
            self.leave_to_round(key, number)
            return
        sent = threading.Event()
        where = (key, number)
        self._paced_callers[where] = sent  # before it is due: a round that sends it at once sets it
        try:
            if self.leave_to_round(key, number):
                self._bump(callers_paced=1)
                sent.wait(max(deadline - time.monotonic(), 0.0))
        finally:
            self._paced_callers.pop(where, None)

    def _failing(self, target: str) -> bool:
        """Did the last exchange with ``target`` fail (a message's, or with the peer's breaker on,
        any request's), with no answer since?"""
        return self._peer(target).failures_in_row > 0 or self.reachability.failing(target)

    def _peer_failing(self, key: str) -> bool:
        """Did the last exchange with sequence ``key``'s peer fail (or is it held back)?"""
        parsed = SequenceKey.decode(key)
        return parsed is not None and (self._failing(parsed.target) or not self.reachability.sending(parsed.target))

    def _round_sent(self, key: str, number: int) -> None:
        """A round sent (or held) message ``number`` of ``key``: a paced caller waiting for it goes on."""
        if self._paced_callers:
            sent = self._paced_callers.pop((key, number), None)
            if sent is not None:
                sent.set()

    def leave_to_round(self, key: str, number: int) -> bool:
        """Message ``number`` of ``key`` was kept for its caller, who will not send it: due at once
        (not when the caller's grace ends), and the sender woken.  True when it was made due now
        (a round sends it next); False when it was sent already, or acknowledged, or the store
        could not say (its timer or grace sends it)."""
        if self._take_early(key, number) is not None:  # claimed (never sent): due now all the same
            try:
                with self.store.begin(durable=False) as tx:
                    tx.rms_messages.make_due(key, [number], at=time.time())
            except (StoreError, UnknownSequenceError) as exc:  # its retransmission timer sends it
                log.debug("message %d of %s left to its retransmission timer: %s", number, key, exc)
                return False
            finally:
                self._lane(key, LaneEvent.CALLER_ENDED)
                self.source._wake()
            return True
        try:
            with self.store.begin(durable=False) as tx:
                msg = tx.rms_messages.get(key, number)
                if msg is None or msg.acked or msg.send_count:
                    return False
                tx.rms_messages.make_due(key, [number], at=time.time())
        except (StoreError, UnknownSequenceError) as exc:  # the grace ends anyway: the sender sends it then
            log.debug("message %d of %s left to the sender's grace: %s", number, key, exc)
            return False
        self.source._wake()
        return True

    # -- the caller's claim made by its request's enqueue ------------------------------------------

    def _try_caller_lane(self, key: str) -> bool:
        """CALLER_CLAIMS on ``key``'s lane if it is idle now (no wait)."""
        with self._lane_lock:
            try:
                self._lane_states[key] = lane_transition(self._lane_states.get(key, LaneState.initial()),
                                                         LaneEvent.CALLER_CLAIMS).state
            except InvalidTransition:
                return False
        return True

    def _claimed_to_round(self, key: str, number: int) -> None:
        """Message ``number`` of ``key``, claimed by its enqueue in a global transaction, whose
        caller could not take the lane at the commit: due at once for the sender's round."""
        try:
            with self.store.begin(durable=False) as tx:
                tx.rms_messages.make_due(key, [number], at=time.time())
        except (StoreError, UnknownSequenceError) as exc:  # its retransmission timer sends it
            log.debug("message %d of %s left to its retransmission timer: %s", number, key, exc)
        self.source._wake()

    def early_claim(self, tx: Any, key: str, in_global: bool = False) -> "_EarlyClaim | None":
        """In the transaction about to enqueue a request on sequence ``key`` for a caller that
        will wait for its reply (``Source.send``, kept for it): take the lane for that caller now
        and read what its claim needs before the enqueue locks the sequence (the replies'
        acknowledgement it will carry: RMD rows first); None when the lane is not idle.  The
        claim itself follows the enqueue in the same transaction (:meth:`_EarlyClaim.claim`),
        so the caller's send needs no transaction of its own (:meth:`send_for_caller`).
        ``in_global``: the enqueue is in a global transaction (see :class:`_EarlyClaim`)."""
        if self.policy.max_unacknowledged is not None:
            return None  # the window is the round's to count
        if in_global:
            with self._reply_acks_lock:
                owed = self._reply_acks.get(key)
            return _EarlyClaim(self, key, None, in_global=True,
                               offered_id=owed[1].offered_id if owed is not None else None)
        if not self._try_caller_lane(key):
            return None
        try:
            with self._reply_acks_lock:
                owed = self._reply_acks.get(key)
            offered_id = owed[1].offered_id if owed is not None else None
            rmd = tx.rmd.get(offered_id) if offered_id else None
        except BaseException:
            self._lane(key, LaneEvent.CALLER_ENDED)
            raise
        return _EarlyClaim(self, key, rmd)

    def _claim_early(self, tx: Any, key: str, number: int,
                     offered_id: str | None = None) -> tuple[_Planned | None, bool, RmdSequence | None]:
        """:meth:`_claim_for_caller`'s work in the enqueue's transaction (the sequence's row
        locked by the enqueue): the claim, or None; whether the callers' acknowledgements it
        applied made the sequence's Close or Terminate due; and destination sequence
        ``offered_id`` read with the claim (its replies' acknowledgement rides on the request)."""
        now = time.time()
        owes_control = False
        seq = tx.rms.get(key)
        if seq is not None and seq.sequence_id is not None and rms_life(seq).transmitting:
            owes_control = self._apply_callers_ack(tx, seq, now)
            seq = tx.rms.get(key)
        if seq is None or seq.sequence_id is None or not rms_life(seq).transmitting \
                or not self._sends_now(seq.target):
            return None, owes_control, None
        claimed = self._claim_in(tx, seq, number, now, offered_id)
        if claimed is None:
            return None, owes_control, None
        msg, seq, rmd = claimed
        return self._planned_for_caller(msg, seq), owes_control, rmd

    def _sends_now(self, target: str) -> bool:
        """Does a message to ``target`` go out as soon as it is claimed?  Not on a back-channel
        (its replies wait for the peer's next request) nor to a peer held back (unreachable,
        probing)."""
        return not is_back_channel(target) and self.reachability.gate(target) is Gate.SEND

    def _first_retry_at(self, target: str, now: float) -> float:
        """When a message sent once at ``now`` is due again (never without retransmissions)."""
        return now + self._retry_delay(target, 1) if self.policy.retransmits else _NEVER

    def _planned_for_caller(self, msg: RmsMessage, seq: RmsSequence, **reply_ack: Any) -> _Planned:
        """A claimed message that its caller sends: an AckRequested only where the policy
        asks one on every message (the reply answers for it otherwise)."""
        return _Planned(msg, seq, request_ack=self.policy.ack_request is AckRequestMode.ALWAYS, **reply_ack)

    def _hold_early(self, item: _Planned) -> None:
        """A claim the enqueue committed: its caller's to send until the grace ends."""
        at = time.monotonic() + (self.policy.caller_send_grace or 0.0)
        with self._lane_lock:
            self._early[(item.sequence.key, item.message.number)] = (item, at)

    def _take_early(self, key: str, number: int) -> _Planned | None:
        """The early claim of message ``number`` of ``key``, taken (once: by its caller's send, by
        its caller leaving it, or when the grace ends)."""
        with self._lane_lock:
            held = self._early.pop((key, number), None)
            if held is not None:
                self._lane_idle.notify_all()  # a caller may wait for this one's send to start
        return held[0] if held is not None else None

    def _expire_early_claims(self) -> None:
        """Early claims whose callers did not come within the grace go to the round now."""
        if not self._early:
            return
        now = time.monotonic()
        with self._lane_lock:
            expired = [where for where, (_, at) in self._early.items() if at <= now]
        for key, number in expired:
            self.leave_to_round(key, number)

    def _send_early(self, key: str, item: _Planned) -> None:
        """Send a request its enqueue claimed, from its caller's thread (the lane is the caller's
        since that claim)."""
        try:
            rmd = item.reply_ack_rmd
            if rmd is not None:
                with self._reply_acks_lock:
                    taken = self._reply_acks.pop(key, None) is not None
                item.reply_ack = self.destination.ack_for(rmd) if taken else None
                item.reply_ack_taken = True
            self._transmit_for_caller(item)
        finally:
            self._lane(key, LaneEvent.CALLER_ENDED)

    def _transmit_for_caller(self, item: _Planned) -> None:
        """Send ``item`` from its caller's thread and settle the attempt there.  Its answer's
        acknowledgements wait for the next claim on the sequence (or the sender's next round): a
        store transaction less before the caller has its reply."""
        self._bump(sent_by_callers=1)
        seq = item.sequence
        if self._caller_sids.get(seq.key) != seq.sequence_id:
            self._caller_sids[seq.key] = seq.sequence_id  # (its pending acknowledgement's name)
        with self.source.coalesced_acks(self._callers_acks):
            exchange = self._send_message(item)
        with self._settle_lock:
            if self._flow(seq.key).taken_alone(exchange):
                return  # nothing else to learn: no round's settling for it
            self._settle_now([(item, exchange)])

    def _claim_for_caller(self, key: str, number: int) -> _Planned | None:
        """Claim message ``number`` for its caller's thread: only its first transmission, of a
        transmitting sequence whose message before it is acknowledged, to a peer that is sent
        to.  One store transaction, as a round's claim (not durable: a claim a crash forgot only
        means the message is sent again), which also reads the acknowledgement of the replies
        the request carries and applies what earlier callers' answers acknowledged."""
        policy = self.policy
        if policy.max_unacknowledged is not None:
            return None  # the window is the round's to count
        self.destination.wait_records()  # the request before it has its reply's record (and ack)
        with self._reply_acks_lock:
            owed = self._reply_acks.get(key)
        offered_id = owed[1].offered_id if owed is not None else None
        now = time.time()
        claimed: tuple[RmsMessage, RmsSequence, RmdSequence | None] | None = None
        owes_control = False
        try:
            with self.store.begin(durable=False) as tx:
                # the acknowledgement of the replies this request carries, read here rather than in
                # a transaction of its own when it is sent (RMD rows before RMS ones, as everywhere)
                rmd = tx.rmd.get(offered_id) if offered_id else None
                seq = tx.rms.get(key)
                if seq is not None and seq.sequence_id is not None and rms_life(seq).transmitting:
                    owes_control = self._apply_callers_ack(tx, seq, now)
                    seq = tx.rms.get(key)
                if seq is not None and rms_life(seq).transmitting and seq.sequence_id is not None \
                        and self._sends_now(seq.target):
                    claimed = self._claim_in(tx, seq, number, now)
        except WSRMFault as fault:  # rolled back: the peer acknowledged what was never sent
            for_sequence(log, None, key=key).warning("acknowledgement refused: %s", fault)
            return None
        if owes_control:
            self.source._wake()  # every message acknowledged after the last: Close/Terminate is due
        if claimed is None:
            return None
        msg, seq, _ = claimed
        with self._reply_acks_lock:
            taken = self._reply_acks.pop(key, None) is not None
        return self._planned_for_caller(
            msg, seq, reply_ack=self.destination.ack_for(rmd) if taken and rmd is not None else None,
            reply_ack_taken=True)

    def _claim_in(self, tx: Any, seq: RmsSequence, number: int, now: float, offered_id: str | None = None,
                  ) -> tuple[RmsMessage, RmsSequence, RmdSequence | None] | None:
        """In ``tx``: record the first attempt of message ``number`` of ``seq`` when it is the
        caller's to send (unsent, unacknowledged, the message before it acknowledged); with
        ``offered_id``, that destination sequence read in the same statement (its replies'
        acknowledgement rides on the request)."""
        # None: a round sent it (or it was acknowledged meanwhile), or it would overtake a message
        # still out, or lost
        next_at = self._first_retry_at(seq.target, now)
        if offered_id is None:
            msg, rmd = tx.rms_messages.claim_first_send(seq.key, number, next_send_at=next_at, now=now), None
        else:
            msg, rmd = tx.rms_messages.claim_first_send_reading(seq.key, number, offered_id,
                                                                next_send_at=next_at, now=now)
        return None if msg is None else (msg, seq, rmd)

    def _callers_ack_of(self, key: str) -> list[tuple[int, int]] | None:
        """The ranges callers' answers acknowledged on sequence ``key`` that no store transaction
        applied yet, or None."""
        if not self._callers_acks:
            return None
        sid = self._caller_sids.get(key)
        return None if sid is None else self._callers_acks.ranges_of(sid)

    def sends_unhindered(self, target: str, key: str) -> bool:
        """Would a one-way caller's own send of a message of sequence ``key`` to ``target`` meet
        no trouble that makes it wait where the sender would not: the peer is sent to (not a
        back-channel, not held back as unreachable), its last exchange was answered, and every
        message of the sequence sent so far is acknowledged, as far as the answers say (none
        lost or still out, so none to send again first).  The automatic
        ``one_way_caller_sends`` asks this (:meth:`ReliableEngine._one_way_caller_sends`): a
        peer that stopped answering lets callers return once their message is stored."""
        if not self._sends_now(target) or self._failing(target):
            return False
        with self._pacing_lock:
            flow = self._flows.get(key)
        return flow is None or not flow.outstanding

    def _release_paced(self, key: str) -> None:
        """Every caller paced on sequence ``key`` goes on: its messages cannot go out now (its
        CreateSequence failed), and the sender sends them when they can."""
        if self._paced_callers:
            for where in [where for where in list(self._paced_callers) if where[0] == key]:
                self._round_sent(*where)

    def _apply_callers_ack(self, tx: Any, seq: RmsSequence, now: float) -> bool:
        """In ``tx``: apply the acknowledgement of ``seq`` that earlier callers' answers brought;
        True when that made the sequence's Close or Terminate due."""
        held = self._callers_acks.pop(_sid(seq))
        if held is None:
            return False
        ack, version = held
        return self.source._apply_ack(tx, seq, ack, version, now)[1]

    def _apply_callers_acks(self) -> None:
        """Apply, each in a transaction of its own, what callers' answers acknowledged and no
        claim applied since (a round's work: the caller has its reply by now)."""
        for identifier in self._callers_acks.identifiers():
            self.source._flush_ack(self._callers_acks, identifier)

    # -- pacing: what the answers say ------------------------------------------------------------

    def _flow(self, key: str) -> SequenceFlow:
        with self._pacing_lock:
            flow = self._flows.get(key)
            if flow is None:
                flow = self._flows[key] = SequenceFlow(batch=self.policy.send_batch,
                                                       concurrency=self.policy.send_lanes(1))
            return flow

    def _peer(self, target: str) -> RttEstimator:
        with self._pacing_lock:
            peer = self._peers.get(target)
            if peer is None:
                peer = self._peers[target] = RttEstimator()
            return peer

    def flow_of(self, key: str, *, create: bool = False) -> SequenceFlow | None:
        """What the sender learnt about a sequence's peer (None before its first round, unless
        ``create``: then a new one, which its first round takes as it finds it)."""
        if create:
            return self._flow(key)
        with self._pacing_lock:
            return self._flows.get(key)

    def retransmission_timeout(self, target: str) -> float:
        """The current retransmission timeout for ``target`` (before a message's own backoff)."""
        return self._peer(target).timeout(self.policy.base_retransmission_interval,
                                          self.policy.max_retransmission_interval)

    def _retry_delay(self, target: str, attempts: int) -> float:
        """Seconds after the ``attempts``-th transmission before the timer sends it again.

        The policy's backoff applied to the peer's measured timeout instead of
        the fixed base interval (which stays the floor).  The timeout doubles
        with the message's attempts only while the peer stays silent (its
        exchanges failing in a row): a message that was merely unlucky on a
        lossy link to a peer that answers is not pushed minutes away.
        """
        if attempts < 1:
            return 0.0
        policy = self.policy
        peer = self._peer(target)
        rto = peer.timeout(policy.base_retransmission_interval, policy.max_retransmission_interval)
        if not policy.exponential_backoff:
            return rto
        exponent = min(attempts - 1, max(peer.failures_in_row, 0 if peer.srtt is not None else 30), 30)
        return min(rto * 2 ** exponent, policy.max_retransmission_interval)

    def _settle(self, exchanges: list[tuple[_Planned, Exchange]]) -> None:
        """Apply a round's evidence: resend what was proven lost now, probe the silent ends soon."""
        with self._settle_lock:
            self._settle_now(exchanges)

    def _settle_now(self, exchanges: list[tuple[_Planned, Exchange]]) -> None:
        by_sequence: dict[str, tuple[RmsSequence, list[Exchange]]] = {}
        for item, exchange in exchanges:
            by_sequence.setdefault(item.sequence.key, (item.sequence, []))[1].append(exchange)
        plans: list[tuple[RmsSequence, set[int], set[int]]] = []
        for key, (seq, made) in by_sequence.items():
            flow = self._flow(key)
            was_ordered = flow.ordered
            verdict = flow.after_round(made)
            if flow.ordered != was_ordered:
                for_sequence(log, seq.sequence_id, key=key).info(
                    "sending this sequence %s (%s)", "in order, one message at a time" if flow.ordered
                    else "pipelined", "the peer discarded a message sent after a gap" if verdict.discarding
                    else f"delivery rates {flow.rates}")
            alive = self._peer(seq.target).alive and self.reachability.sending(seq.target)
            probe = set(verdict.probe) if alive else set()
            if verdict.resend or probe:
                plans.append((seq, set(verdict.resend), probe))
        if plans:
            self._make_due(plans)

    def _make_due(self, plans: list[tuple[RmsSequence, set[int], set[int]]]) -> None:
        """Resend at once / probe soon: each sequence in a transaction of its own, in key order.

        Engines sharing a store (worker processes, or several clients in one
        process) claim each other's sequences, so two rounds may settle the
        same ones; each taking the rows in the order its round met them, in one
        transaction, deadlocked (four client engines on one PostgreSQL store: the
        victim was a caller's enqueue).  Each is held as a claim holds it
        (``beside_enqueues``, against close and terminate only): locked against every
        writer, a settle waited for another engine's claim of the sequence, while that
        claim, following the row's update chain to lock it, waited for the settle's lock
        of another one (PostgreSQL waits there even under SKIP LOCKED; 16 client engines
        on one store, up to 5 deadlocks a run).

        One transaction a sequence: a settle holds one sequence at a time, so it waits in
        no cycle whatever the order, and it does not keep a sequence it has made due locked
        while it waits for the next one.  In one transaction for all, each sequence's writer
        lock (the acknowledgements' ``_WRITERS_BESIDE`` on PostgreSQL) was held until the
        last was written: acknowledgements of the first queued behind the settle's wait for
        the last (waits over 200 ms, 16 client engines on one store).  Not durable: a
        resend or a probe a crash forgot is sent at its retransmission time instead."""
        now = time.time()
        ordered = sorted(plans, key=lambda plan: plan[0].key)
        for seq, resend, probe in ordered:
            made = probed = 0
            with self.store.begin(durable=False) as tx:
                if tx.rms.get(seq.key, beside_enqueues=True) is None:
                    continue  # deleted meanwhile: nothing to send again
                if resend:
                    made = tx.rms_messages.make_due(seq.key, resend, at=AT_ONCE)
                    for number in resend:
                        self._note_again(seq.key, number, "the round's acknowledgements proved it lost")
                if probe:
                    for number in probe:
                        self._note_again(seq.key, number, "loss probe: no answer said it arrived")
                    delay = self._peer(seq.target).probe_delay()
                    probed = tx.rms_messages.make_due(seq.key, probe, at=now + delay)
            self.fast_retransmits += made
            self.loss_probes += probed
        for seq, resend, probe in ordered:
            for_sequence(log, seq.sequence_id, key=seq.key).debug(
                "sending again at once %s, probing %s", sorted(resend), sorted(probe))

    def _lanes(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.policy.most_requests_in_flight,
                                                thread_name_prefix="wsrm-send")
            return self._pool

    def close(self) -> None:
        """End the sending threads (the engine calls this once its workers stopped), and withdraw
        this process's reports of unreachable peers: nobody holds messages for them here now."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        for where in list(self._paced_callers):  # no round sends their messages now: paced callers go on
            self._round_sent(*where)
        try:
            self._apply_callers_acks()
        except StoreError as exc:  # only bookkeeping: the messages are acknowledged again
            log.debug("acknowledgements of callers' answers not applied at stop: %s", exc)
        if self._reported:
            try:
                with self.store.begin() as tx:
                    tx.conditions.remove(NodeCondition.UNREACHABLE_PEER, reporter=self.reporter)
            except StoreError as exc:
                log.debug("reports of unreachable peers not withdrawn: %s", exc)
            self._reported = set()

    def _claim(self, now: float) -> list[_Planned]:
        policy = self.policy
        plan: list[_Planned] = []
        # not durable: a send attempt a crash forgot only means the message is sent again; the
        # claim holds its sequences' rows, which enqueues wait for, until the commit
        with self.store.begin(durable=False) as tx:
            owed_acks: dict[str, list[RmdSequence]] = {}
            for rmd in tx.rmd.needing_ack(now=_NEVER, limit=100):  # no lock: piggyback candidates
                if not self.destination.acks_on_back_channel(rmd):
                    owed_acks.setdefault(rmd.acks_to, []).append(rmd)
            sequences: dict[str, RmsSequence | None] = {}
            in_flight: dict[str, int] = {}
            attempts: dict[tuple[str, float], list[int]] = {}  # (sequence, next send) -> numbers
            held: dict[str, list[int]] = {}  # sequence -> numbers held for an unreachable peer
            # Round robin across the sequences with due messages (each sequence's first due
            # message, then the seconds...): oldest-first would drain one sequence's backlog
            # while the others' destinations end them as inactive.  The round stays bounded by
            # send_batch; no per-sequence cap below it, which could hide a sequence's
            # retransmissions behind its unsent messages held back by the window.
            # the large payloads read only of the messages claimed (below): the window and the
            # checks leave some due ones to a later round, which reads them then
            for msg in self._paced(tx.rms_messages.due_messages(now, limit=policy.send_batch,
                                                                per_sequence=policy.send_batch, payloads=False)):
                key = msg.sequence_key
                if key not in sequences:  # its state judged once per round, not per message
                    seq = tx.rms.get(key)
                    sequences[key] = seq if seq is not None and seq.sequence_id is not None \
                        and rms_life(seq).transmitting else None
                seq = sequences[key]
                if seq is None:
                    continue
                if is_back_channel(seq.target):
                    # replies that only travel in HTTP responses (a restart made them due): never posted
                    tx.rms_messages.make_due(key, [msg.number], at=NEVER)
                    continue
                if msg.send_count and policy.retries_exhausted(msg.send_count):
                    self.source.fault_in(tx, seq, f"message {msg.number} unacknowledged after "
                                                f"{msg.send_count} transmissions")
                    sequences[key] = None
                    continue
                if msg.send_count == 0 and policy.max_unacknowledged is not None:
                    if key not in in_flight:
                        in_flight[key] = tx.rms_messages.count_in_flight(key, policy.max_unacknowledged, now)
                    if in_flight[key] >= policy.max_unacknowledged:
                        continue
                gate = self.reachability.gate(seq.target)
                if gate is Gate.WAIT:
                    held.setdefault(key, []).append(msg.number)
                    continue
                if msg.send_count == 0 and policy.max_unacknowledged is not None:
                    in_flight[key] += 1
                attempt = msg.send_count + 1
                next_at = now + self._retry_delay(seq.target, attempt) if policy.retransmits else _NEVER
                if gate is Gate.PROBE:  # the peer's one request: if it fails, the next probe takes over
                    next_at = now + self.reachability.hold_seconds()
                attempts.setdefault((key, next_at), []).append(msg.number)
                plan.append(_Planned(msg, seq, piggyback=owed_acks.pop(seq.target, []), probe=gate is Gate.PROBE))
            by_time: dict[float, dict[str, list[int]]] = {}  # one statement for the round's sequences
            for (key, next_at), numbers in attempts.items():
                by_time.setdefault(next_at, {})[key] = numbers
            for next_at, numbered in by_time.items():
                tx.rms_messages.record_send_attempts_across(numbered, next_send_at=next_at, now=now)
            for key, numbers in held.items():
                self._hold(tx, sequences[key] or tx.rms.require(key), numbers, now)
            if any(item.message.payload is None for item in plan):
                for item, msg in zip(plan, tx.rms_messages.with_payloads([i.message for i in plan]), strict=True):
                    item.message = msg
        mode = policy.ack_request
        for item in plan:
            item.request_ack = mode is AckRequestMode.ALWAYS or (
                mode is AckRequestMode.RETRANSMISSIONS and item.message.send_count > 0)
        return plan

    def _paced(self, due: list[RmsMessage]) -> list[RmsMessage]:
        """The due messages this round may claim: of a sequence sent in order, its lowest numbers,
        as many as its flow's window; the others as they came."""
        ordered: dict[str, list[RmsMessage]] = {}
        out: list[RmsMessage] = []
        for msg in due:
            if self._flow(msg.sequence_key).claim_limit() < self.policy.send_batch:
                ordered.setdefault(msg.sequence_key, []).append(msg)
            else:
                out.append(msg)
        held_back: set[Any] = set()  # chains (rolled over sequences) with a generation held back
        for key in sorted(ordered, key=_generation):
            chain = _chain_of(key)
            if chain in held_back:
                continue  # a successor must not overtake its predecessor's held-back messages
            msgs = sorted(ordered[key], key=lambda m: m.number)
            limit = self._flow(key).claim_limit()
            out.extend(msgs[:limit])
            if len(msgs) > limit and chain is not None:
                held_back.add(chain)
        return out

    def _send_or_hold(self, item: _Planned) -> Exchange | None:
        """Send a claimed message, unless its peer was judged unreachable since the claim (a round
        to a peer that stops answering): then it is held instead, unsent (None).  Its claim
        counted an attempt; no more go while the peer is down."""
        if item.probe:
            exchange = self._send_message(item)
            # still unreachable: the probe's message waits with the others (and may probe again)
            self.reachability.held(item.sequence.target, item.sequence.key, [item.message.number])
            self._round_sent(item.sequence.key, item.message.number)
            return exchange
        if self.reachability.sending(item.sequence.target):
            exchange = self._send_message(item)
            self._round_sent(item.sequence.key, item.message.number)
            return exchange
        try:
            with self.store.begin(durable=False) as tx:
                self._hold(tx, item.sequence, [item.message.number], time.time())
        except (StoreError, UnknownSequenceError) as exc:  # its own timer sends it (and holds it) later
            log.debug("message %d not held: %s", item.message.number, exc)
        return None

    def _send_message(self, item: _Planned) -> Exchange:
        msg, seq = item.message, item.sequence
        rm = rm_version_of(seq)
        soap = soap_of(msg, self.policy)
        headers = []  # after the Sequence header, written from pieces (stamp_sequence)
        if item.request_ack:
            headers.append(AckRequested(_sid(seq)).to_xml(rm, soap))
        for rmd in item.piggyback:
            piggybacked = self.destination.ack_for(rmd)
            if piggybacked is not None:
                headers.append(piggybacked.to_xml(rm_version_of(rmd), soap))
        reply_ack = item.reply_ack if item.reply_ack_taken else self._owed_reply_ack(seq)
        if reply_ack is not None:
            headers.append(reply_ack.to_xml(rm, soap))
        sequence = SequenceHeader(_sid(seq), msg.number, last_message=msg.last and rm is RM10)
        exchange = self._transmit_observed(item, stamp_sequence(msg.payload, rm, soap, sequence, headers), soap)
        if reply_ack is not None and not exchange.answered:
            self._reply_ack_not_carried(seq)  # the next message carries it, or it goes on its own
        return exchange

    def _transmit_observed(self, item: _Planned, data: bytes, soap: SoapVersion) -> Exchange:
        """:meth:`_transmit_one`, told to the observer when one is installed."""
        msg, seq = item.message, item.sequence
        observer = observe.active
        if observer is None:
            return self._transmit_one(item, data, soap, None)
        step = observer.transmitting(data, target=seq.target, action=msg.action, sequence_id=_sid(seq),
                                     number=msg.number, attempt=msg.send_count + 1,
                                     reason=self._reason_again(seq.key, msg) if msg.send_count else None)
        try:
            exchange = self._transmit_one(item, step.data, soap, step)
        except BaseException as exc:
            step.end(exc)
            raise
        if not exchange.answered:
            self._note_again(seq.key, msg.number, "the previous attempt was not answered")
        step.note(acknowledged=exchange.ack is not None and msg.number in exchange.ack)
        step.end()
        return exchange

    # -- why a message goes again (told to an observer: wsrm_plugin.engine.observe) -----------------

    def _note_again(self, key: str, number: int, why: str) -> None:
        """Remember why message ``number`` of ``key`` will be sent again (only while observed)."""
        if observe.active is None:
            return
        with self._pacing_lock:
            if len(self._again) >= 10_000:
                self._again.clear()  # reasons are for the next attempt only; never grow for ever
            self._again.setdefault((key, number), why)

    def _reason_again(self, key: str, msg: RmsMessage) -> str:
        with self._pacing_lock:
            why = self._again.pop((key, msg.number), None)
        if why is not None:
            return why
        if msg.next_send_at == AT_ONCE:
            return "an acknowledgement showed it missing (a gap or a Nack)"
        return "retransmission timeout: not acknowledged in time"

    def _transmit_one(self, item: _Planned, data: bytes, soap: SoapVersion,
                      step: observe.Step | None) -> Exchange:
        msg, seq = item.message, item.sequence
        rm = rm_version_of(seq)
        slog = for_sequence(log, seq.sequence_id, msg.number)
        # Every copy after the first counts, whatever its outcome, including the one the transport
        # itself sends again when a kept-alive connection turned out closed.
        first = 0 if msg.send_count else 1
        peer = self._peer(seq.target)
        started = time.monotonic()
        try:
            response = self.transport.send(seq.target, data, routing_headers(soap, msg.action, seq))
        except TransportError as exc:
            self._bump(send_failures=1, retransmissions=exc.attempts - first)
            peer.failed()
            self.reachability.failed(seq.target, str(exc), probe=item.probe)
            slog.debug("not delivered (attempt %d, will retry): %s", msg.send_count + 1, exc)
            if step is not None:
                self._note_again(seq.key, msg.number, f"the previous attempt failed: {exc}")
                step.note(error=str(exc), copies=exc.attempts if exc.attempts > 1 else None)
            return Exchange(msg.number, started, time.monotonic(), answered=False)
        ended = time.monotonic()
        self._heard(seq.target, response, item.probe)
        if step is not None:  # copies: the transport sent it again on a fresh connection at once
            step.note(status=response.status, copies=response.attempts if response.attempts > 1 else None)
        self._bump(messages_sent=1, retransmissions=response.attempts - first)
        if 200 <= response.status < 300:  # a proxy's 503 does not reach the destination's timer
            self._exchanged_with(seq.key)
        elif response.status == 503:
            self._retry_after(seq, msg, response)
            self._note_again(seq.key, msg.number, "the peer was busy (HTTP 503)")
        elif response.status >= 500:
            self._note_again(seq.key, msg.number, f"the previous attempt was answered HTTP {response.status}")
        if msg.send_count:
            slog.debug("retransmitted (attempt %d): HTTP %d", msg.send_count + 1, response.status)
        content = self._read(seq, response, f"message {msg.number}", msg.number, store_key=seq.key)
        if msg.last and rm is RM10 and 200 <= response.status < 300 and getattr(content, "fault", None) is None \
                and EndpointReference(seq.acks_to).is_anonymous:
            self._last_message_accepted(seq, msg.number)
        if content is not None and content.reliable:
            self._reply_on_back_channel(seq, response.body, content.message)
        if item.piggyback and 200 <= response.status < 300:
            for rmd in item.piggyback:
                self.destination.ack_delivered(rmd)
        ack: AckRanges | None = None
        if content is not None and content.fault is None:
            for candidate in content.acks:
                if candidate.identifier == seq.sequence_id and not candidate.nacks:
                    ranges = AckRanges.from_ranges(candidate.ranges)
                    ack = ranges if ack is None else ack.union(ranges)
        refusal = content.fault if content is not None else None
        if refusal is not None and _refused_for_good(refusal) and (ack is None or msg.number not in ack):
            self._refused(seq, msg, refusal)
        if ack is not None and content is not None and msg.number in ack and msg.reply_pending \
                and not content.reliable:
            self.source.exchange_acknowledged(seq.key, msg.number)
        # A 5xx without an acknowledgement (a proxy's 502, an overloaded server) is no answer from
        # the destination: it counts as a failed exchange, not as a round trip.  A 503 is the
        # destination's own "later" (its Retry-After decides when): not a loss to resend at once.
        answered = ack is not None or response.status < 500 or response.status == 503
        if answered:
            peer.sample(ended - started)
        else:
            peer.failed()
        return Exchange(msg.number, started, ended, answered=answered, ack=ack,
                        bare=ack is None and 200 <= response.status < 300)

    def _refused(self, seq: RmsSequence, msg: Any, fault: SoapFault) -> None:
        """The destination refused message ``msg.number`` for good: every copy would get the same
        answer.  The sequence faults at once (its messages kept for the fault hook or ``wsrm
        resend``) instead of the message going again until ``max_retries``, silently."""
        try:
            with self.store.begin() as tx:
                current = tx.rms.get(seq.key)
                if current is not None:
                    self.source.fault_in(tx, current, f"message {msg.number} was refused: {fault}")
        except StoreError as exc:  # not recorded: the next copy is refused again and tries again
            log.info("refusal of message %d not recorded: %s", msg.number, exc)

    def _retry_after(self, seq: RmsSequence, msg: Any, response: Any) -> None:
        """A 503 (the destination is full or its store failing): the message stays unacknowledged
        and goes again on its backoff, or after the peer's Retry-After (seconds) when that is
        later -- capped by ``max_retransmission_interval``, so a peer cannot park it for ever."""
        headers = {k.lower(): v for k, v in (getattr(response, "headers", None) or {}).items()}
        try:
            wait = float(headers.get("retry-after", ""))
        except ValueError:
            return  # absent, or an HTTP-date: the backoff alone decides
        wait = min(max(wait, 0.0), self.policy.max_retransmission_interval)
        if not self.policy.retransmits or wait <= self.policy.retry_delay(msg.send_count + 1):
            return
        try:
            with self.store.begin() as tx:
                tx.rms_messages.make_due(seq.key, [msg.number], at=time.time() + wait)
        except StoreError as exc:  # only a later retransmission is lost: the backoff still applies
            log.info("Retry-After not recorded: %s", exc)
            return
        for_sequence(log, seq.sequence_id, msg.number).info("peer busy (HTTP 503): next attempt in %.1fs", wait)

    def _reply_on_back_channel(self, seq: RmsSequence, data: bytes, read: Any = None) -> None:
        """A reply came in the HTTP response (we offered with an anonymous endpoint).

        It is handled like one received on a listener (from the peer we addressed).
        Its acknowledgement has no back-channel here: the next request of ``seq``
        carries it when one goes out within :data:`_REPLY_ACK_WAIT` seconds (a
        caller that waits for each answer sends the next at once), else it is
        POSTed on its own with an AckRequested for ``seq``.  Either way the peer
        then acknowledges the request, which stays unacknowledged here until its
        reply arrived (:meth:`Source.on_ack`).  One exchange per call instead of
        two: a sequential request-reply caller's next request no longer waits
        behind the acknowledgement's own round trip either.
        """
        # read: the response as read already; what handle would answer has nowhere to go
        self.inbound.handle(data, via_response=True, read=read, answered=False)
        if seq.offered_id:
            with self._reply_acks_lock:
                self._reply_acks.setdefault(seq.key, (time.monotonic() + _REPLY_ACK_WAIT, seq))

    def _owe_reply_acks(self) -> None:
        """At the first round: the back-channel replies a predecessor of this process recorded
        may not have been acknowledged (it died before the next request or its own POST carried
        the acknowledgement, which only its memory owed), and the peer then keeps them, and their
        requests' sequence, until that sequence ends.  So each sequence whose offered sequence
        received replies owes its acknowledgement once now (carried by a request within the
        usual wait, else POSTed)."""
        if not self.source._replies_on_back_channel():
            self._looked_for_owed_acks = True
            return
        try:
            with self.store.begin() as tx:
                owing = [seq for seq in tx.rms.list_all()
                         if seq.offered_id and seq.started and not seq.faulted and not seq.terminate_sent
                         and (rmd := tx.rmd.get(seq.offered_id)) is not None and rmd.received]
        except StoreError as exc:  # looked at again in the next round
            log.debug("acknowledgements owed by a predecessor not looked for: %s", exc)
            return
        self._looked_for_owed_acks = True
        with self._reply_acks_lock:
            for seq in owing:
                self._reply_acks.setdefault(seq.key, (time.monotonic() + _REPLY_ACK_WAIT, seq))

    def _owed_reply_ack(self, seq: RmsSequence) -> SequenceAcknowledgement | None:
        """The acknowledgement of replies to ``seq``'s requests owed to its peer, if any (taken: a
        message carrying it gives it back with :meth:`_reply_ack_not_carried` if it failed)."""
        with self._reply_acks_lock:
            owed = self._reply_acks.pop(seq.key, None)
        if owed is None or not seq.offered_id:
            return None
        return self.destination.current_ack(seq.offered_id)

    def _reply_ack_not_carried(self, seq: RmsSequence) -> None:
        with self._reply_acks_lock:
            self._reply_acks.setdefault(seq.key, (time.monotonic(), seq))

    def _acknowledge_replies(self) -> bool:
        """POST the acknowledgements of replies no request carried within their wait."""
        now = time.monotonic()
        with self._reply_acks_lock:
            due = [seq for key, (at, seq) in self._reply_acks.items() if at <= now]
            for seq in due:
                del self._reply_acks[seq.key]
        for seq in due:
            self._post_reply_ack(seq)
        return bool(due)

    def _post_reply_ack(self, seq: RmsSequence) -> None:
        ack = self.destination.current_ack(seq.offered_id) if seq.offered_id else None
        if ack is None:
            return
        rm = rm_version_of(seq)
        soap, wsa = self._soap_wsa(seq)
        action = rm.sequence_acknowledgement_action
        message = protocol_message(soap, wsa, to=seq.target, action=action,
                                   headers=[ack.to_xml(rm, soap), AckRequested(_sid(seq)).to_xml(rm, soap)])
        try:
            response = self.transport.send(seq.target, message, routing_headers(soap, action, seq))
        except TransportError as exc:
            self.reachability.failed(seq.target, str(exc))
            for_sequence(log, seq.sequence_id, key=seq.key).info(
                "acknowledgement of a back-channel reply not delivered (%s); the reply comes again", exc)
            return
        self._heard(seq.target, response)
        self._read(seq, response, "SequenceAcknowledgement", store_key=seq.key)


#: The HTTP header naming the sequence of a message, for a load balancer in front of several hosts
#: of one store: hashing on it (haproxy ``balance hdr(WSRM-Sequence)``) keeps a sequence on one host
#: while that host lives, so its messages in flight at once are recorded together there rather than
#: each waiting for the others on other hosts.  Requests without it (CreateSequence) go round robin.
SEQUENCE_HEADER = "WSRM-Sequence"


def routing_headers(soap: SoapVersion, action: str | None, seq: RmsSequence) -> dict[str, str]:
    """The HTTP headers of a message of ``seq``: the SOAP ones and :data:`SEQUENCE_HEADER`."""
    headers = soap.http_headers(action)
    if seq.sequence_id:
        headers[SEQUENCE_HEADER] = seq.sequence_id
    return headers
