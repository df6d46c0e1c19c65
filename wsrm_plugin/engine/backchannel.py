"""Replies on the HTTP back-channel: in-out calls from clients that have no listener.

A client that cannot accept connections offers a sequence whose endpoint is
the WS-Addressing anonymous URI and sends its requests with an anonymous
ReplyTo.  Its replies can then only travel in the HTTP responses to its own
requests, as CXF and WCF do it:

* the HTTP thread that stored request n waits (at most the policy's
  ``back_channel_reply_wait``) for the invoker to deliver it, then answers
  with the reply the delivery enqueued, stamped with its wsrm:Sequence
  header on the offered sequence and the acknowledgement of the request
  sequence.  A one-way operation (it never has a reply) and a request behind
  a gap (it cannot be delivered before the gap is filled) do not wait: the
  first is answered at once with the acknowledgement, the second with an
  empty 202, as is a request whose reply is not ready in time;
* the reply stays in the offered sequence's RMS until the client
  acknowledges it.  The request is acknowledged like any other (every
  acknowledgement names every number received: :mod:`.ackbuilder`); it is
  its source that keeps sending it until the reply arrived, as WCF's
  initiator does (and :meth:`Source.on_ack <.source.Source.on_ack>` here).
  So a client whose response was lost, or that got the 202, retransmits n,
  and the duplicate gets the stored reply again: it is found by the
  request's message number.

The worker never posts such replies (there is no address); they leave the
store when acknowledged, or with the request sequence.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass

from lxml import etree

from ..store import RmsMessage, RmsSequence, StorageManager
from ..wire import SequenceAcknowledgement, SequenceHeader, SoapVersion
from .destination import Destination
from .envelopes import stamped
from .logs import for_sequence
from .policy import RMPolicy
from .source import back_channel_replies, count_reply_handed_out, reply_sequence_key, rm_version_of

__all__ = ["BackChannel", "Outcome", "BackChannelReply"]

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    REPLY = "reply"              #: the reply is ready: answer with it
    DELIVERED = "delivered"      #: delivered with no reply owed (one-way, or already acknowledged)
    TIMED_OUT = "timed out"      #: still being processed: answer 202, the retransmission gets it
    NOT_APPLICABLE = "n/a"       #: the sequence's replies go to an address


@dataclass(frozen=True)
class BackChannelReply:
    outcome: Outcome
    envelope: bytes = b""
    soap: SoapVersion | None = None
    action: str | None = None
    #: ``envelope``'s tree (it serializes to those bytes; nobody may change it).
    tree: etree._Element | None = None


class BackChannel:
    """Waits for, and hands out, the replies of requests whose ReplyTo is anonymous."""

    def __init__(self, store: StorageManager, policy: RMPolicy, destination: Destination) -> None:
        self.store = store
        self.policy = policy
        self.destination = destination
        self._changed = threading.Condition()
        #: HTTP threads inside :meth:`reply_for`'s look and wait (counted under the condition's lock,
        #: from before their look): a delivery wakes them only when there is one
        self._waiting = 0
        self.handed_out = 0

    def delivered(self) -> None:
        """The invoker committed a delivery: wake the HTTP threads that wait for one."""
        if self._waiting:  # (every delivery comes here: a notify_all alone is 9 Python calls)
            with self._changed:
                self._changed.notify_all()

    def reply_for(self, identifier: str, number: int, soap: SoapVersion) -> BackChannelReply:
        """The answer to request ``number`` of destination sequence ``identifier``, waiting for it.

        Waits at most the policy's ``back_channel_reply_wait`` (looking at
        least once: a retransmitted request finds its stored reply at once).
        Other processes sharing the store are noticed by polling.
        """
        deadline = time.monotonic() + self.policy.back_channel_reply_wait
        while True:
            with self._changed:
                # counted before the look: a delivery that commits after it sees this thread
                # waiting, one that committed before it is seen by the look
                self._waiting += 1
                try:
                    outcome, taken = self._take(identifier, number)
                    remaining = deadline - time.monotonic()
                    if outcome is not Outcome.TIMED_OUT or remaining <= 0:
                        break
                    self._changed.wait(min(remaining, self.policy.poll_interval))
                finally:
                    self._waiting -= 1
        if taken is not None:
            return self._hand_out(identifier, number, soap, *taken)
        return BackChannelReply(outcome)

    def _take(self, identifier: str, number: int) -> tuple[Outcome, tuple[RmsSequence, RmsMessage] | None]:
        """Look for the reply to request ``number`` and, when it is there, count it as sent (the
        client may acknowledge it now, and the worker never sends it), in one transaction.

        Not durable: a send attempt recorded, which a power loss may forget (the reply then waits
        for its request's next copy, as one whose response was lost); a killed process keeps it.
        The look takes no lock; the sequence's row is locked only once its reply is there.

        "Delivered, and no reply": the replies are looked at again after the delivery was seen.
        Each statement reads what was committed when it began (PostgreSQL's READ COMMITTED):
        a delivery that committed between the look at the replies and the look at the
        deliveries, its reply with it, would otherwise be taken for one that owes none, and
        its request acknowledged without its reply -- the client then never asks for it again
        (a call that never ends)."""
        with self.store.begin(durable=False) as tx:
            replies = back_channel_replies(tx, identifier)
            if replies is None:
                return Outcome.NOT_APPLICABLE, None
            reply = replies.get(number)
            if reply is None:
                if number not in tx.invoker.state(identifier).delivered:
                    return Outcome.TIMED_OUT, None
                reply = (back_channel_replies(tx, identifier) or {}).get(number)
                if reply is None:
                    return Outcome.DELIVERED, None
            taken = count_reply_handed_out(tx, reply_sequence_key(identifier), reply.number)
            if taken is None:
                return Outcome.DELIVERED, None  # acknowledged (or ended) meanwhile
        return Outcome.REPLY, taken

    def hand_out(self, identifier: str, number: int, soap: SoapVersion, taken: tuple[RmsSequence, RmsMessage],
                 ack: SequenceAcknowledgement | None) -> BackChannelReply:
        """The reply that the receive of request ``number`` took in its own transaction (it was
        delivered there: ``Destination``'s delivery on receipt), with ``ack``, the acknowledgement
        that receive made: no transaction of its own to find the reply, none to read the
        acknowledgement."""
        return self._hand_out(identifier, number, soap, *taken, ack=ack)

    def _hand_out(self, identifier: str, number: int, soap: SoapVersion, seq: RmsSequence,
                  reply: RmsMessage, ack: SequenceAcknowledgement | None = None) -> BackChannelReply:
        """The reply, stamped with its sequence header and the acknowledgement of the request."""
        assert seq.sequence_id is not None  # _take hands out only on a started sequence
        rm = rm_version_of(seq)
        reply_soap = SoapVersion.for_namespace(reply.soap_version) or soap
        headers = [SequenceHeader(seq.sequence_id, reply.number).to_xml(rm, reply_soap)]
        if ack is None:
            ack = self.destination.current_ack(identifier)  # names request ``number``: it was recorded
        if ack is not None:
            headers.append(ack.to_xml(rm, reply_soap))
        self.handed_out += 1
        for_sequence(log, seq.sequence_id, reply.number).debug(
            "reply to message %d of %s handed out on the back-channel", number, identifier)
        data, tree = stamped(reply.payload, headers)
        return BackChannelReply(Outcome.REPLY, data, reply_soap, reply.action, tree)
