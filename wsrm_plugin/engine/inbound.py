"""Reading a received envelope and routing each WS-RM part to the Source or the Destination.

One envelope may carry several things at once: an application message with
its wsrm:Sequence header, acknowledgements for sequences going the other
way, AckRequested headers, or a protocol body (CreateSequence...).  They are
read all at once (:func:`read_message`, which refuses anything malformed,
oversized or unsafe before it reaches the store) and then applied:
acknowledgements first (they only ever free things), then the body, then the
message.

:class:`Inbound` does this for requests (:meth:`Inbound.handle`, what the
HTTP endpoint calls, answering with an envelope, 202 or a fault) and for
the responses the workers get back (:meth:`Inbound.read_response`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lxml import etree

from ..store import LockTimeoutError, StoreError
from ..wire import (
    RM10, AckRequested, ActionNotSupported, AddressingHeaders, AddressingVersion, CloseSequence, CloseSequenceResponse,
    CreateSequence, CreateSequenceResponse, Envelope, MessageTooLargeError, RMVersion,
    SequenceAcknowledgement, SequenceHeader, SoapFault, SoapVersion, TerminateSequence,
    TerminateSequenceResponse, UnknownSequence, WSRMFault, WSRMRequired, new_message_id,
    parse_envelope, parse_rm_element, to_bytes,
)
from ..wire import tracecontext
from ..wire.headers import PROTOCOL_HEADERS
from ..wire.soap import build_envelope
from . import observe
from .ackanswer import acknowledgement_bytes, read_acknowledgement_bytes
from .backchannel import BackChannel, Outcome
from .destination import Accepted, Destination
from .parsed import TREES
from .faults import UnsupportedMediaType, busy_fault
from .policy import RMPolicy
from .source import Source, is_back_channel
from .transport import Reply, soap_version_for_content_type

__all__ = ["Inbound", "Message", "read_message", "ResponseContent"]

log = logging.getLogger(__name__)


@dataclass
class Message:
    """A received envelope, read: addressing, WS-RM headers and body, and any fault it carries."""

    raw: bytes
    envelope: Envelope
    addressing: AddressingHeaders
    sequence: tuple[SequenceHeader, RMVersion] | None = None
    acks: list[tuple[SequenceAcknowledgement, RMVersion]] = field(default_factory=list)
    ack_requests: list[tuple[AckRequested, RMVersion]] = field(default_factory=list)
    body: tuple[object, RMVersion] | None = None
    fault: SoapFault | None = None

    @property
    def soap(self) -> SoapVersion:
        return self.envelope.version

    @property
    def rm_version(self) -> RMVersion | None:
        for part in (self.sequence, self.body, *self.acks, *self.ack_requests):
            if part is not None:
                return part[1]
        return None


def read_message(data: bytes, max_size: int, parsed: etree._Element | Envelope | None = None,
                 addressing: AddressingHeaders | None = None) -> Message:
    """Parse and classify ``data``; raises the SoapFault to answer when it is not acceptable.

    ``parsed``: ``data``'s tree, already parsed safely by the caller (read, not parsed again),
    or that tree as the caller read it already (an :class:`Envelope`, not read again);
    ``addressing``: what that tree's WS-A headers say, already read by the caller (only with
    ``parsed``).
    """
    if parsed is None:
        envelope = parse_envelope(data, max_size=max_size)
        addressing = None
    else:
        if len(data) > max_size:
            raise MessageTooLargeError(len(data), max_size)
        envelope = parsed if isinstance(parsed, Envelope) else Envelope.from_element(parsed)
    if addressing is None:
        addressing = AddressingHeaders.from_header(envelope.headers)
    message = Message(data, envelope, addressing)
    for header in envelope.headers:
        rm = parse_rm_element(header)
        if rm is None:
            continue
        element, version = rm
        if isinstance(element, SequenceHeader):
            if message.sequence is not None:
                raise SoapFault("more than one wsrm:Sequence header", code="Sender")
            message.sequence = (element, version)
        elif isinstance(element, SequenceAcknowledgement):
            message.acks.append((element, version))
        elif isinstance(element, AckRequested):
            message.ack_requests.append((element, version))
    if envelope.is_fault:
        message.fault = envelope.fault()
    elif envelope.body_element is not None:
        message.body = parse_rm_element(envelope.body_element)
    return message


def _destination_sequences_named(message: Message) -> Iterator[tuple[str, RMVersion]]:
    """Every sequence ``message`` speaks to as its destination: its Sequence header, its
    AckRequested headers, a CloseSequence or TerminateSequence body."""
    if message.sequence is not None:
        yield message.sequence[0].identifier, message.sequence[1]
    for request, version in message.ack_requests:
        yield request.identifier, version
    if message.body is not None and isinstance(message.body[0], (CloseSequence, TerminateSequence)):
        yield message.body[0].identifier, message.body[1]


@dataclass(frozen=True)
class ResponseContent:
    """What a response to one of our requests said, after its acknowledgements were applied."""

    body: object | None = None
    fault: SoapFault | None = None
    #: It is a reliable message (a reply on the back-channel): hand it to :meth:`Inbound.handle`.
    reliable: bool = False
    #: The acknowledgements it carried (already applied): the sender learns from them what the
    #: peer kept (:mod:`.pacing`).
    acks: tuple[SequenceAcknowledgement, ...] = ()
    #: A reliable one as read here: :meth:`Inbound.handle` takes it as it is (``read=``), not
    #: parsing the same bytes again.
    message: Message | None = None


@dataclass
class _Received:
    """Who sent a request and how it reached us: what every handler of its parts may ask."""

    principal: str | None
    remote_addr: str | None
    #: Does its operation answer?  None: unknown (the engine was not told).
    expects_reply: bool | None
    #: It came in the HTTP response to a request of ours (a reply on the back-channel, a
    #: MakeConnection poll's answer): from the peer we addressed, not from whoever can reach
    #: our listener.
    via_response: bool = False
    #: Plain acknowledgements that ride on its application message, left to that message's
    #: receipt to apply in its own transaction (``Destination.apply_riding_ack``).
    riding_acks: list[tuple[SequenceAcknowledgement, RMVersion]] = field(default_factory=list)


@dataclass
class _Answer:
    """What the HTTP response to one received envelope will carry, as its parts are applied."""

    soap: SoapVersion
    headers: list[etree._Element] = field(default_factory=list)
    #: The acknowledgements it carries after ``headers``, written as elements only when the
    #: answer says more than them (else as bytes: :mod:`.ackanswer`).
    acks: list[tuple[SequenceAcknowledgement, RMVersion]] = field(default_factory=list)
    #: (body element, wsa:Action) of a protocol response (CreateSequenceResponse...).
    body: tuple[etree._Element, str] | None = None
    #: Sequences this answer acknowledges already (an AckRequested for one needs nothing more).
    acked: set[str] = field(default_factory=set)
    #: Does anyone send it?  Not a reply read from the response to our request: no envelope is
    #: built for it (its acknowledgement goes with the next request, or on its own).
    wanted: bool = True

    def acknowledge(self, ack: SequenceAcknowledgement | None, version: RMVersion) -> None:
        if ack is not None:
            if self.wanted:
                self.acks.append((ack, version))
            self.acked.add(ack.identifier)

    def header_blocks(self) -> list[etree._Element]:
        """Its header blocks as elements: ``headers``, then its acknowledgements'."""
        return [*self.headers, *(ack.to_xml(version, self.soap) for ack, version in self.acks)]


#: (SOAP, WS-A namespaces, wsa:Action) -> the envelope of an answer that only acknowledges, its
#: MessageID empty (see _acknowledgement_envelope)
_ACK_ENVELOPES: dict[tuple[str, str, str], etree._Element] = {}


def _acknowledgement_envelope(soap: SoapVersion, wsa: AddressingVersion, action: str) -> etree._Element:
    """A new envelope with the WS-A headers of an answer that only acknowledges (To anonymous,
    ``action``, an empty MessageID third), for the acknowledgements to be appended to its Header.

    One is copied per received message: lxml copies a tree about four times faster than it
    builds one element by element with their namespace maps (~25 against ~100 us here)."""
    key = (soap.ns, wsa.ns, action)
    made = _ACK_ENVELOPES.get(key)
    if made is None:
        addressing = AddressingHeaders(to=wsa.anonymous, action=action, message_id="", version=wsa)
        made = _ACK_ENVELOPES[key] = build_envelope(soap, addressing.to_elements(wsa, soap=soap))
    return made.__copy__()  # type: ignore[attr-defined]  # lxml's deep copy (see addressing._copy_of)


#: A handler of one part of a received message; a Reply ends the dispatch with that answer.
_Step = Callable[[Message, _Received, _Answer], "Reply | None"]
#: A handler of one kind of WS-RM body.
_BodyHandler = Callable[[Any, RMVersion, Message, _Received, _Answer], "Reply | None"]


class Inbound:
    """Routes received envelopes to the engine's Source and Destination.

    Each kind of WS-RM body has its handler in a table (:attr:`body_handlers`),
    as zeep maps operations and CXF's RM interceptors map actions; the parts
    of an envelope are applied in a fixed order (:attr:`steps`):
    acknowledgements first (they only ever free things), a fault, the body,
    the application message, then AckRequested.
    """

    def __init__(self, source: Source, destination: Destination, policy: RMPolicy,
                 back_channel: BackChannel | None = None,
                 answers: Callable[[etree._Element], bool] | None = None, *,
                 understands: Iterable[str] | None = (),
                 knows: Callable[[etree._Element | None, str | None], bool] | None = None) -> None:
        self.source = source
        self.destination = destination
        self.policy = policy
        self.back_channel = back_channel
        #: Does the operation of this request body element answer?  The application's say
        #: (``ReliableEngine(answers=...)``; the spyne adapter's from its service's methods).
        #: None: unknown (no request is refused for want of a way back).
        self.answers = answers
        #: Header blocks processed here (``{ns}local``), the protocols' own included; None: a
        #: front end in front of the engine applies SOAP's mustUnderstand rule itself.
        self.understood: frozenset[str] | None = (
            None if understands is None else PROTOCOL_HEADERS | frozenset(understands))
        #: Is this application message's operation one of the service's (body element, action)?
        #: None: unknown (every body is taken).
        self.knows = knows
        self.faults_sent = 0
        self.steps: tuple[_Step, ...] = (self._refuse_strangers_on_offered, self._apply_acks, self._apply_fault,
                                         self._apply_body, self._apply_sequence, self._apply_ack_requests,
                                         self._require_rm)
        self.body_handlers: dict[type, _BodyHandler] = {
            CreateSequence: self._on_create_sequence,
            CloseSequence: self._on_close_sequence,
            TerminateSequence: self._on_terminate_sequence,
            CreateSequenceResponse: self._on_create_sequence_response,
            CloseSequenceResponse: self._on_sequence_response,
            TerminateSequenceResponse: self._on_sequence_response,
        }

    # -- requests ----------------------------------------------------------------------------

    def handle(self, data: bytes, *, principal: str | None = None, content_type: str | None = None,
               remote_addr: str | None = None, parsed: etree._Element | Envelope | None = None,
               addressing: AddressingHeaders | None = None, via_response: bool = False,
               read: Message | None = None, answered: bool = True) -> Reply:
        """Answer one received request: an envelope (200), nothing to say (202), or a fault.

        ``parsed`` is ``data``'s tree when the caller parsed it already (safely:
        :func:`~wsrm_plugin.wire.xmlsafe.parse_xml`), or that tree as it read it (an
        :class:`Envelope`); it is only read.  ``addressing`` is
        what its WS-A headers say when the caller read them already.  ``read``: ``data`` as
        :func:`read_message` read it already (a reply in a response, :meth:`read_response`).
        ``via_response``: ``data`` came in the HTTP response to a request of ours (see
        :class:`_Received`).  ``answered=False``: nobody sends what this returns (a reply read
        from the response to our request): no acknowledgement envelope is built for it, and it
        returns "accepted" (202) or a fault.
        """
        try:
            message = read if read is not None else \
                read_message(data, self.policy.max_message_size, parsed, addressing)
            if read is not None and via_response and message.sequence is not None:
                # a reply in a response: whoever reads its body next (the call it answers) takes
                # this tree instead of a parse; nothing here changes it
                TREES.remember(message.raw, message.envelope.root)
        except SoapFault as fault:
            self.faults_sent += 1
            log.info("refused a request from %s: %s", remote_addr, fault)
            if isinstance(fault, WSRMFault) and fault.version is None:
                fault.version = self.policy.rm_version
            return Reply.fault(fault, soap_version_for_content_type(content_type))
        try:
            self._check_media_type(message, content_type)
            self._check_understood(message)
            self._check_operation(message)
        except SoapFault as fault:
            self.faults_sent += 1
            log.info("refused a request from %s: %s", remote_addr, fault)
            return self._fault_reply(fault, message)
        expects_reply: bool | None = None
        if self.answers is not None and message.sequence is not None and message.fault is None:
            body = message.envelope.body_element
            expects_reply = body is not None and bool(self.answers(body))
        received = _Received(principal, remote_addr, expects_reply, via_response)
        try:
            return self._dispatch(message, received, answered)
        except SoapFault as fault:
            self.faults_sent += 1
            return self._fault_reply(fault, message)
        except LockTimeoutError as exc:
            log.warning("store busy, asking the peer to retry: %s", exc)
            return self._fault_reply(busy_fault("the destination is busy; retransmit later", 1), message)
        except StoreError as exc:
            # disk full, database down...: nothing was recorded, so the peer must send it again
            log.warning("the store cannot take the message now, asking the peer to retry in %ds: %s",
                        self.policy.retry_after, exc)
            return self._fault_reply(busy_fault("the destination could not store the message; retransmit later",
                                                self.policy.retry_after), message)
        except Exception:  # noqa: BLE001 -- a bug must still answer with a fault, not a broken response
            log.exception("unexpected error while handling message %s", message.addressing.message_id)
            return self._fault_reply(SoapFault("internal error in the WS-RM destination", code="Receiver"),
                                     message)

    # -- checks before anything is recorded -------------------------------------------------------

    @staticmethod
    def _check_media_type(message: Message, content_type: str | None) -> None:
        """SOAP 1.2's HTTP binding: the media type names the version.  A mismatch is refused
        before anything is recorded (else the message is acknowledged, then fails delivery)."""
        if content_type is not None and soap_version_for_content_type(content_type) is not message.soap:
            raise UnsupportedMediaType(
                f"a SOAP {message.soap.name} envelope was sent as {content_type.split(';')[0].strip()!r}; "
                f"SOAP {message.soap.name} is sent as {message.soap.content_type!r}")

    def _check_understood(self, message: Message) -> None:
        """SOAP's processing model: a header block marked mustUnderstand that nothing here
        processes faults the whole message (MustUnderstand), before it is recorded."""
        if self.understood is not None:
            message.envelope.check_must_understand(self.understood)

    def _check_operation(self, message: Message) -> None:
        """An application message whose body names no operation of the service is the sender's
        error: refused before it is acknowledged, so its source learns it at once and the
        sequence is not blocked behind a message that can never be delivered."""
        if self.knows is None or message.sequence is None or message.fault is not None:
            return
        header, version = message.sequence
        action = message.addressing.action
        if header.last_message and version is RM10 and action == RM10.action("LastMessage"):
            return  # 1.0's LastMessage marker: a protocol message, no operation
        body = message.envelope.body_element
        if self.knows(body, action):
            return
        what = (f"the body element {etree.QName(body).text}" if body is not None and isinstance(body.tag, str)
                else "an empty body")
        reason = (f"message {header.message_number} of sequence {header.identifier} names no operation of "
                  f"this service ({what}, action {action!r}); it was not accepted")
        wsa = message.addressing.version
        if wsa is not None and action:
            raise ActionNotSupported(reason, problem_action=action, version=wsa)
        raise SoapFault(reason, code="Sender")

    # -- the parts of a message, in order ---------------------------------------------------------

    def _dispatch(self, message: Message, received: _Received, answered: bool = True) -> Reply:
        answer = _Answer(message.soap, wanted=answered)
        for step in self.steps:
            reply = step(message, received, answer)
            if reply is not None:
                return reply
        return self._answer(message, answer) if answered else Reply.accepted()

    def _refuse_strangers_on_offered(self, message: Message, received: _Received, answer: _Answer) -> Reply | None:
        """Refuse, before anything is applied, what names a sequence this engine offered when
        its peer never posts that sequence's messages to us.

        With an anonymous (or WS-MakeConnection) Offer Endpoint and ReplyTo, the
        offered sequence's replies, AckRequested, Close and Terminate come only in
        the HTTP responses to our own requests (WS-RM 1.1 section 3.4: the Offer's
        Endpoint is where they are sent), as on WCF's request-reply session channel,
        which has no listener at all.  The same envelope posted to a listener of
        ours is a stranger's, who learnt the offered identifier: taken, it would
        hand the application a reply nobody sent, end the sequence the real replies
        arrive on, or -- with an acknowledgement riding on it -- drop requests the
        peer never got.  UnknownSequence, as for a sequence that does not exist
        (WS-RM 1.1 section 4.3; Sandesha2 answers so, after its token check): the
        stranger learns nothing, and nothing is stored.
        """
        if received.via_response or self.source.offered_sequences_post_here():
            return None
        for identifier, version in _destination_sequences_named(message):
            if self.destination.is_offered_by_us(identifier):
                log.warning("refused a message on sequence %s from %s at our listener: it is a sequence we "
                            "offered, whose messages come in the responses to our requests", identifier,
                            received.principal or received.remote_addr or "an unknown peer")
                raise UnknownSequence(identifier, version=version)
        return None

    def _apply_acks(self, message: Message, received: _Received, answer: _Answer) -> Reply | None:
        # A bad acknowledgement riding on a message must not get the message refused: the
        # sender would retransmit it, with the same acknowledgement, for ever.
        standalone = message.sequence is None and message.body is None and not message.ack_requests
        riding = message.sequence[0].identifier if message.sequence is not None else None
        # applied by the message's receipt, in its transaction (a plain one; a Nack or a Final
        # acknowledgement at once): a store transaction less per message
        deferred = riding is not None and message.body is None and self.destination.apply_riding_ack is not None
        for ack, version in message.acks:
            try:
                self._check_sender(ack.identifier, version, received, riding=riding)
                if deferred and not ack.nacks and not ack.final:
                    received.riding_acks.append((ack, version))
                    continue
                self.source.on_ack(ack, version)
            except SoapFault as fault:
                if standalone:
                    raise
                log.warning("piggybacked acknowledgement ignored: %s", fault)
        return None

    def _apply_fault(self, message: Message, received: _Received, answer: _Answer) -> Reply | None:
        # a fault with a Sequence header is a reliable reply (a service's fault): delivered below
        if message.fault is None or message.sequence is not None:
            return None
        fault = message.fault
        if isinstance(fault, WSRMFault) and fault.identifier:
            self._check_sender(fault.identifier, fault.version or self.policy.rm_version, received, known=True)
        if isinstance(fault, WSRMFault):
            self.source.on_fault(fault)
        else:
            log.warning("a peer sent us a fault: %s", fault)
        return Reply.accepted()

    def _apply_body(self, message: Message, received: _Received, answer: _Answer) -> Reply | None:
        if message.body is None:
            return None
        body, version = message.body
        handler = self.body_handlers.get(type(body))
        return handler(body, version, message, received, answer) if handler is not None else None

    def _apply_sequence(self, message: Message, received: _Received, answer: _Answer) -> Reply | None:
        if message.sequence is None:
            return None
        header, version = message.sequence
        ack_requested = any(a.identifier == header.identifier for a, _ in message.ack_requests)
        riding = tuple(received.riding_acks)
        if not answer.wanted and received.via_response and not message.ack_requests and observe.active is None \
                and self.destination.answer_before_record(header, message.raw, message.addressing):
            # a reply read from the response to our request, its call answered now: its record (the
            # same transaction) follows in the records' thread, off the caller's path; nothing
            # here waits for what it answers, and no step after this one has work to do
            self.destination.record_later(lambda: self._record_answered(message, received, riding))
            return None
        accepted = self._receive(message, received, ack_requested, riding)
        reply_to = message.addressing.reply_to
        if (accepted.offered and self.back_channel is not None and received.expects_reply is not False
                and is_back_channel(reply_to.address if reply_to else None)):
            # A reply owed on this very HTTP exchange (a client without a listener).  A one-way
            # operation never has one, and a message behind a gap cannot be delivered now: both
            # are answered at once, with the acknowledgement.
            if accepted.behind_gap:
                # No acknowledgement (a copy of a request is done once its exchange carries one):
                # the source sends it again, and its copy after the gap is filled gets the reply.
                return Reply.accepted()
            if accepted.reply is not None:  # delivered on receipt: its reply taken with it
                back = self.back_channel.hand_out(header.identifier, header.message_number, message.soap,
                                                  accepted.reply, accepted.ack)
            else:
                back = self.back_channel.reply_for(header.identifier, header.message_number, message.soap)
            if back.outcome is Outcome.REPLY:
                return Reply.envelope(back.envelope, back.soap or message.soap, back.action, tree=back.tree)
            if back.outcome is Outcome.TIMED_OUT:
                # No acknowledgement: a source that stops retrying a request once its exchange
                # carries one (WCF's initiator) sends it again and its copy gets the reply.
                return Reply.accepted()
        answer.acknowledge(accepted.ack, version)
        return None

    def _receive(self, message: Message, received: _Received, ack_requested: bool,
                 riding: tuple[tuple[SequenceAcknowledgement, RMVersion], ...]) -> Accepted:
        """The destination's receive of ``message``'s application message, and the
        acknowledgements riding on it that its receipt did not apply."""
        assert message.sequence is not None
        header, version = message.sequence
        accepted: Accepted | None = None
        try:
            if observe.active is None:
                accepted = self.destination.receive(
                    header, version, message.raw, message.addressing, principal=received.principal,
                    soap_ns=message.soap.ns, ack_requested=ack_requested,
                    expects_reply=bool(received.expects_reply), acks=riding)
            else:
                accepted = self._receive_observed(observe.active, message, received.principal, ack_requested,
                                                  bool(received.expects_reply), riding)
        finally:
            if riding and (accepted is None or not accepted.acks_applied):
                self._apply_riding_acks(riding, failed=accepted is None)
        return accepted

    def _record_answered(self, message: Message, received: _Received,
                         riding: tuple[tuple[SequenceAcknowledgement, RMVersion], ...]) -> None:
        """The record of a reply whose call was answered before it (the records' thread): as
        its receive on the caller's thread would have made it.  What fails is logged: nobody
        waits for it, and the peer sends the reply again with its request's next copy."""
        try:
            self._receive(message, received, False, riding)
        except Exception as exc:  # noqa: BLE001 -- a fault, the store: the reply comes again
            log.info("reply %s, answered before its record, not recorded: %s", message.addressing.message_id, exc)
            log.debug("its record failed", exc_info=True)

    def _apply_riding_acks(self, acks: tuple[tuple[SequenceAcknowledgement, RMVersion], ...], *,
                           failed: bool) -> None:
        """What the receipt of the message they rode on did not apply (it was refused, discarded,
        or rolled back): each in a transaction of its own, as without that receipt."""
        for ack, version in acks:
            try:
                self.source.on_ack(ack, version)
            except SoapFault as fault:
                log.warning("piggybacked acknowledgement ignored: %s", fault)
            except Exception:  # noqa: BLE001 -- the receive's own error is the one to answer
                if not failed:
                    raise
                log.debug("piggybacked acknowledgement not applied", exc_info=True)

    def _apply_ack_requests(self, message: Message, received: _Received, answer: _Answer) -> Reply | None:
        for request, version in message.ack_requests:
            if request.identifier in answer.acked:
                continue
            seq = self.destination.ack_requested(request.identifier, version, principal=received.principal)
            if self.destination.acks_on_back_channel(seq):
                answer.acknowledge(self.destination.ack_for(seq), version)
        return None

    def _require_rm(self, message: Message, received: _Received, answer: _Answer) -> Reply | None:
        if message.body is None and message.sequence is None and not message.acks and not message.ack_requests:
            version = self.policy.rm_version
            raise WSRMRequired(None, "this endpoint takes WS-ReliableMessaging messages only",
                               version=version) if version.is_11 else \
                SoapFault("this endpoint takes WS-ReliableMessaging messages only (no wsrm:Sequence header)",
                          code="Sender")
        return None

    def _answer(self, message: Message, answer: _Answer) -> Reply:
        if answer.body is None and not answer.headers and not answer.acks:
            return Reply.accepted()
        soap = message.soap
        version = message.rm_version or self.policy.rm_version
        wsa = message.addressing.version or version.addressing
        if answer.body is not None:
            element, action = answer.body
            addressing = message.addressing.reply_headers(action)
        else:
            # the answer to most messages: acknowledgements alone, as bytes made once (no tree)
            action = version.sequence_acknowledgement_action
            if not answer.headers:
                written = acknowledgement_bytes(soap, wsa, action, new_message_id(), answer.acks)
                if written is not None:
                    return Reply.envelope(written, soap, action)
            # else in a copy of a made envelope
            envelope = _acknowledgement_envelope(soap, wsa, action)
            header = envelope[0]
            header[2].text = new_message_id()
            for block in answer.header_blocks():  # made for this answer (build_envelope copies one in a tree)
                header.append(block if block.getparent() is None else copy.deepcopy(block))
            return Reply.envelope(to_bytes(envelope), soap, action, tree=envelope)
        envelope = build_envelope(soap, [*addressing.to_elements(wsa, soap=soap), *answer.header_blocks()], element)
        return Reply.envelope(to_bytes(envelope), soap, action, tree=envelope)

    def _receive_observed(self, observer: observe.Observer, message: Message, principal: str | None,
                          ack_requested: bool, expects_reply: bool,
                          acks: tuple[tuple[SequenceAcknowledgement, RMVersion], ...] = ()) -> Accepted:
        """The destination's receive, told to ``observer``, which may change what is stored."""
        assert message.sequence is not None
        header, version = message.sequence
        step = observer.receiving(message.raw, headers=message.envelope.headers, sequence_id=header.identifier,
                                  number=header.message_number, action=message.addressing.action,
                                  message_id=message.addressing.message_id)
        if step.data is not message.raw:  # its trace header names the receive: so must the tree kept with it
            self._retree(message.raw, step.data)
        try:
            accepted = self.destination.receive(
                header, version, step.data, message.addressing, principal=principal, soap_ns=message.soap.ns,
                ack_requested=ack_requested, expects_reply=expects_reply, acks=acks)
        except BaseException as exc:
            step.end(exc)
            raise
        step.note(duplicate=accepted.duplicate)
        step.end()
        return accepted

    @staticmethod
    def _retree(raw: bytes, stored: bytes) -> None:
        """File the tree parsed from ``raw`` under ``stored``, its copy with another trace parent."""
        fields = tracecontext.read(data=stored)
        tree = TREES.take(raw)
        if tree is not None and fields is not None and tracecontext.set_parent(
                Envelope.from_element(tree).headers, fields[0][36:52]):
            TREES.remember(stored, tree)

    # -- the WS-RM bodies ------------------------------------------------------------------------

    def _on_create_sequence(self, body: CreateSequence, version: RMVersion, message: Message,
                            received: _Received, answer: _Answer) -> Reply | None:
        wsa = message.addressing.version or version.addressing
        response = self.destination.create_sequence(body, version, message.addressing,
                                                    principal=received.principal,
                                                    remote_addr=received.remote_addr)
        answer.body = (response.to_xml(version, wsa), version.create_sequence_response_action)
        return None

    def _on_close_sequence(self, body: CloseSequence, version: RMVersion, message: Message,
                           received: _Received, answer: _Answer) -> Reply | None:
        seq = self.destination.close(body, version, principal=received.principal)
        answer.body = (CloseSequenceResponse(body.identifier).to_xml(version), version.action("CloseSequenceResponse"))
        answer.acknowledge(self.destination.ack_for(seq), version)  # Final: CloseSequence is 1.1
        return None

    def _on_terminate_sequence(self, body: TerminateSequence, version: RMVersion, message: Message,
                               received: _Received, answer: _Answer) -> Reply | None:
        seq = self.destination.terminate(body, version, principal=received.principal)
        answer.acknowledge(self.destination.ack_for(seq), version)
        if version.is_11:
            answer.body = (TerminateSequenceResponse(body.identifier).to_xml(version),
                           version.action("TerminateSequenceResponse"))
        return None

    def _on_create_sequence_response(self, body: CreateSequenceResponse, version: RMVersion, message: Message,
                                     received: _Received, answer: _Answer) -> Reply | None:
        """A response a peer sent to our endpoint instead of the back-channel (we ask with an
        anonymous ReplyTo, but a peer may use AcksTo or send it late): matched by RelatesTo."""
        key = self.source.key_for_create_response(message.addressing.relates_to)
        if key is not None:
            self.source.on_create_sequence_response(key, body, version,
                                                    create_offered=self.destination.create_offered)
        else:
            log.info("unmatched CreateSequenceResponse (relates to %s) ignored", message.addressing.relates_to)
        return Reply.accepted()

    def _on_sequence_response(self, body: CloseSequenceResponse | TerminateSequenceResponse, version: RMVersion,
                              message: Message, received: _Received, answer: _Answer) -> Reply | None:
        """A Close/TerminateSequenceResponse sent to our endpoint (see above)."""
        self._check_sender(body.identifier, version, received)
        key = self.source.key_for_sequence(body.identifier)
        if key is None:
            # a response about a sequence we do not have (or do not have for this peer): say so
            raise UnknownSequence(body.identifier, version=version)
        if isinstance(body, CloseSequenceResponse):
            self.source.on_closed(key)
        else:
            self.source.on_terminated(key)
        return Reply.accepted()

    # -- who may speak for a source sequence --------------------------------------------------------

    def _check_sender(self, identifier: str, version: RMVersion, received: _Received, *,
                      known: bool = False, riding: str | None = None) -> None:
        """Refuse what names a source sequence of ours from anyone but where it is due.

        Application messages, AckRequested, Close and Terminate name destination
        sequences and are checked there (:meth:`Destination._sequence`).  This is
        the same check for what names a source sequence -- acknowledgements, WS-RM
        faults, Close/TerminateSequenceResponse:

        * the reply sequence offered with a destination sequence belongs to that
          sequence's principal;
        * a sequence this engine opened itself hears about its messages where
          its acknowledgements are due: in the HTTP responses to what it sends
          (``via_response``) when its AcksTo is anonymous -- or piggybacked on
          a message of the sequence it offered (``riding``), whose identifier
          only that peer was told -- or at our listener when we named it as
          AcksTo.  Anyone else who reaches the listener --
          a stranger who learnt the identifier -- would make the source drop
          messages the destination never got, or fault a healthy sequence.

        A stranger gets UnknownSequence, as for a sequence that does not exist
        (``known``: that is refused too, here; elsewhere the Source does it): it
        learns nothing.
        """
        exists, owner = self.destination.source_owner(identifier)
        if known and not exists:
            raise UnknownSequence(identifier, version=version)
        if owner is not None and owner != received.principal:
            log.warning("refused a message about source sequence %s from %r: it belongs to %r",
                        identifier, received.principal, owner)
            raise UnknownSequence(identifier, version=version)
        if exists and not received.via_response and not self.source.hears_at_listener(identifier, riding=riding):
            log.warning("refused a message about source sequence %s from %s at our listener: its "
                        "acknowledgements come in the responses to what we send", identifier,
                        received.principal or received.remote_addr or "an unknown peer")
            raise UnknownSequence(identifier, version=version)

    def _fault_reply(self, fault: SoapFault, message: Message, status: int | None = None) -> Reply:
        if isinstance(fault, WSRMFault) and fault.version is None:
            fault.version = message.rm_version or self.policy.rm_version
        wsa = message.addressing.version
        headers: list[etree._Element] = []
        if wsa is not None:
            action = fault.fault_action(wsa)
            headers = message.addressing.reply_headers(action, fault=True).to_elements(wsa, soap=message.soap)
        log.info("answering %s from message %s", fault, message.addressing.message_id)
        reply = Reply.fault(fault, message.soap, headers)
        if status is not None:
            return Reply(status, reply.body, reply.content_type, retry_after=reply.retry_after)
        return reply

    # -- responses to what we sent ------------------------------------------------------------------

    def read_response(self, data: bytes, *, store_key: str | None = None, apply_faults: bool = True,
                      origin: str | Callable[[], str] | None = None) -> ResponseContent:
        """Apply what a response says (acks; faults about ``store_key`` unless not
        ``apply_faults``); return its body or fault for the caller to judge.

        ``origin`` says what answered what (``HTTP 200 OK from URL to message 4``)
        for the log line of a response that cannot be read; a callable is asked only then.
        """
        if len(data) <= self.policy.max_message_size:
            # most answers are a service's acknowledgement alone, written from pieces
            # (:mod:`.ackanswer`): read so without a parse, as the full reading would
            plain = read_acknowledgement_bytes(data)
            if plain is not None:
                return ResponseContent(acks=self._apply_response_acks(plain))
        try:
            message = read_message(data, self.policy.max_message_size)
        except SoapFault as fault:
            if callable(origin):
                origin = origin()
            log.warning("unreadable response%s (%s); treating it as lost", f" ({origin})" if origin else "", fault)
            return ResponseContent()
        if message.sequence is not None:  # a reply on the back-channel: the caller handles it (acks too),
            # and learns from the acknowledgements it carries what the peer took (pacing)
            return ResponseContent(reliable=True, acks=tuple(ack for ack, _ in message.acks), message=message)
        acks = self._apply_response_acks(message.acks)
        if message.fault is not None:
            if not apply_faults:
                pass
            elif isinstance(message.fault, WSRMFault):
                self.source.on_fault(message.fault, store_key)
            else:
                log.warning("peer answered with a fault: %s", message.fault)
            return ResponseContent(fault=message.fault, acks=acks)
        return ResponseContent(body=message.body[0] if message.body is not None else None, acks=acks)

    def _apply_response_acks(self, acks: list[tuple[SequenceAcknowledgement, RMVersion]]
                             ) -> tuple[SequenceAcknowledgement, ...]:
        """Apply the acknowledgements a response carried; they are returned for the sender."""
        for ack, version in acks:
            try:
                self.source.on_ack(ack, version)
            except SoapFault as fault:
                log.warning("acknowledgement in a response refused: %s", fault)
        return tuple(ack for ack, _ in acks)
