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

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from lxml import etree

from ..store import LockTimeoutError, StoreError
from ..wire import (
    AckRequested, AddressingHeaders, CloseSequence, CloseSequenceResponse, CreateSequence,
    CreateSequenceResponse, Envelope, MessageTooLargeError, RMVersion, SequenceAcknowledgement,
    SequenceHeader, SoapFault, SoapVersion, TerminateSequence, TerminateSequenceResponse, UnknownSequence,
    WSRMFault, WSRMRequired, new_message_id,
    parse_envelope, parse_rm_element, to_bytes,
)
from ..wire import tracecontext
from ..wire.soap import build_envelope
from . import observe
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


def read_message(data: bytes, max_size: int, parsed: etree._Element | None = None,
                 addressing: AddressingHeaders | None = None) -> Message:
    """Parse and classify ``data``; raises the SoapFault to answer when it is not acceptable.

    ``parsed``: ``data``'s tree, already parsed safely by the caller (read, not parsed again);
    ``addressing``: what that tree's WS-A headers say, already read by the caller (only with
    ``parsed``).
    """
    if parsed is None:
        envelope = parse_envelope(data, max_size=max_size)
        addressing = None
    else:
        if len(data) > max_size:
            raise MessageTooLargeError(len(data), max_size)
        envelope = Envelope.from_element(parsed)
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


class Inbound:
    """Routes received envelopes to the engine's Source and Destination."""

    def __init__(self, source: Source, destination: Destination, policy: RMPolicy,
                 back_channel: BackChannel | None = None,
                 answers: Callable[[etree._Element], bool] | None = None) -> None:
        self.source = source
        self.destination = destination
        self.policy = policy
        self.back_channel = back_channel
        #: Does the operation of this request body element answer?  The application's say
        #: (``ReliableEngine(answers=...)``; the spyne adapter's from its service's methods).
        #: None: unknown (no request is refused for want of a way back).
        self.answers = answers
        self.faults_sent = 0

    # -- requests ----------------------------------------------------------------------------

    def handle(self, data: bytes, *, principal: str | None = None, content_type: str | None = None,
               remote_addr: str | None = None, parsed: etree._Element | None = None,
               addressing: AddressingHeaders | None = None) -> Reply:
        """Answer one received request: an envelope (200), nothing to say (202), or a fault.

        ``parsed`` is ``data``'s tree when the caller parsed it already (safely:
        :func:`~wsrm_plugin.wire.xmlsafe.parse_xml`); it is only read.  ``addressing`` is
        what its WS-A headers say when the caller read them already.
        """
        try:
            message = read_message(data, self.policy.max_message_size, parsed, addressing)
        except SoapFault as fault:
            self.faults_sent += 1
            log.info("refused a request from %s: %s", remote_addr, fault)
            if isinstance(fault, WSRMFault) and fault.version is None:
                fault.version = self.policy.rm_version
            return Reply.fault(fault, soap_version_for_content_type(content_type))
        if content_type is not None and soap_version_for_content_type(content_type) is not message.soap:
            # SOAP 1.2's HTTP binding: the media type names the version.  A mismatch is refused
            # before anything is recorded (else the message is acknowledged, then fails delivery).
            self.faults_sent += 1
            refusal = UnsupportedMediaType(
                f"a SOAP {message.soap.name} envelope was sent as {content_type.split(';')[0].strip()!r}; "
                f"SOAP {message.soap.name} is sent as {message.soap.content_type!r}")
            log.info("refused a request from %s: %s", remote_addr, refusal)
            return Reply.fault(refusal, message.soap)
        expects_reply = False
        if self.answers is not None and message.sequence is not None and message.fault is None:
            body = message.envelope.body_element
            expects_reply = body is not None and bool(self.answers(body))
        try:
            return self._dispatch(message, principal, remote_addr, expects_reply)
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

    def _dispatch(self, message: Message, principal: str | None, remote_addr: str | None,
                  expects_reply: bool = False) -> Reply:
        answer_headers: list[etree._Element] = []
        answer_body: tuple[etree._Element, str] | None = None  # (element, action)
        soap = message.soap

        # A bad acknowledgement riding on a message must not get the message refused: the
        # sender would retransmit it, with the same acknowledgement, for ever.
        standalone = message.sequence is None and message.body is None and not message.ack_requests
        for ack, version in message.acks:
            try:
                self._check_owner(ack.identifier, version, principal)
                self.source.on_ack(ack, version)
            except SoapFault as fault:
                if standalone:
                    raise
                log.warning("piggybacked acknowledgement ignored: %s", fault)

        if message.fault is not None and message.sequence is None:
            # a fault with a Sequence header is a reliable reply (a service's fault): delivered below
            received = message.fault
            if isinstance(received, WSRMFault) and received.identifier:
                self._check_owner(received.identifier, received.version or self.policy.rm_version, principal,
                                  known=True)
            self._on_received_fault(received)
            return Reply.accepted()

        acked: set[str] = set()
        if message.body is not None:
            body, version = message.body
            wsa = message.addressing.version or version.addressing
            if isinstance(body, CreateSequence):
                response = self.destination.create_sequence(body, version, message.addressing,
                                                            principal=principal, remote_addr=remote_addr)
                answer_body = (response.to_xml(version, wsa), version.create_sequence_response_action)
            elif isinstance(body, CloseSequence):
                seq = self.destination.close(body, version, principal=principal)
                answer_body = (CloseSequenceResponse(body.identifier).to_xml(version),
                               version.action("CloseSequenceResponse"))
                final = self.destination.ack_for(seq)  # never None: CloseSequence is 1.1
                if final is not None:
                    answer_headers.append(final.to_xml(version, soap))
                    acked.add(body.identifier)
            elif isinstance(body, TerminateSequence):
                seq = self.destination.terminate(body, version, principal=principal)
                final = self.destination.ack_for(seq)
                if final is not None:
                    answer_headers.append(final.to_xml(version, soap))
                    acked.add(body.identifier)
                if version.is_11:
                    answer_body = (TerminateSequenceResponse(body.identifier).to_xml(version),
                                   version.action("TerminateSequenceResponse"))
            elif isinstance(body, (CreateSequenceResponse, CloseSequenceResponse, TerminateSequenceResponse)):
                if not isinstance(body, CreateSequenceResponse):
                    self._check_owner(body.identifier, version, principal)
                self._on_decoupled_response(body, version, message.addressing)
                return Reply.accepted()

        if message.sequence is not None:
            header, version = message.sequence
            ack_requested = any(a.identifier == header.identifier for a, _ in message.ack_requests)
            if observe.active is None:
                accepted = self.destination.receive(
                    header, version, message.raw, message.addressing, principal=principal,
                    soap_ns=soap.ns, ack_requested=ack_requested, expects_reply=expects_reply)
            else:
                accepted = self._receive_observed(observe.active, message, principal, ack_requested,
                                                  expects_reply)
            if accepted.ack is not None:
                answer_headers.append(accepted.ack.to_xml(version, soap))
                acked.add(header.identifier)
            reply_to = message.addressing.reply_to
            if accepted.offered and self.back_channel is not None and \
                    is_back_channel(reply_to.address if reply_to else None):
                answer = self.back_channel.reply_for(header.identifier, header.message_number, soap)
                if answer.outcome is Outcome.REPLY:
                    return Reply.envelope(answer.envelope, answer.soap or soap, answer.action)
                if answer.outcome is Outcome.TIMED_OUT:
                    return Reply.accepted()  # no acknowledgement: the retransmission gets the reply
                if answer.outcome is Outcome.DELIVERED and accepted.ack is not None:
                    current = self.destination.current_ack(header.identifier)
                    if current is not None:  # else the sequence is gone since: the first ack stands
                        answer_headers[-1] = current.to_xml(version, soap)

        for request, version in message.ack_requests:
            if request.identifier in acked:
                continue
            seq = self.destination.ack_requested(request.identifier, version, principal=principal)
            if self.destination.acks_on_back_channel(seq):
                requested = self.destination.ack_for(seq)
                if requested is not None:
                    answer_headers.append(requested.to_xml(version, soap))
                    acked.add(request.identifier)

        if message.body is None and message.sequence is None and not message.acks and not message.ack_requests:
            version = self.policy.rm_version
            raise WSRMRequired(None, "this endpoint takes WS-ReliableMessaging messages only",
                               version=version) if version.is_11 else \
                SoapFault("this endpoint takes WS-ReliableMessaging messages only (no wsrm:Sequence header)",
                          code="Sender")

        if answer_body is None and not answer_headers:
            return Reply.accepted()
        version = message.rm_version or self.policy.rm_version
        wsa = message.addressing.version or version.addressing
        if answer_body is not None:
            element, action = answer_body
            addressing = message.addressing.reply_headers(action)
        else:
            element, action = None, version.sequence_acknowledgement_action
            addressing = AddressingHeaders(to=wsa.anonymous, action=action, message_id=new_message_id(),
                                           version=wsa)
        envelope = build_envelope(soap, [*addressing.to_elements(wsa, soap=soap), *answer_headers], element)
        return Reply.envelope(to_bytes(envelope), soap, action, tree=envelope)

    def _receive_observed(self, observer: observe.Observer, message: Message, principal: str | None,
                          ack_requested: bool, expects_reply: bool) -> Accepted:
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
                ack_requested=ack_requested, expects_reply=expects_reply)
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

    def _check_owner(self, identifier: str, version: RMVersion, principal: str | None, *,
                     known: bool = False) -> None:
        """Refuse a message about one of our source sequences from anyone but the peer it serves.

        Application messages, AckRequested, Close and Terminate name destination
        sequences and are checked there (:meth:`Destination._sequence`).  This is
        the same check for what names a source sequence -- acknowledgements, WS-RM
        faults, Close/TerminateSequenceResponse: the reply sequence offered with a
        destination sequence belongs to that sequence's principal.  A stranger gets
        UnknownSequence, as for a sequence that does not exist (``known``: that is
        refused too, here; elsewhere the Source does it): it learns nothing.
        """
        exists, owner = self.destination.source_owner(identifier)
        if known and not exists:
            raise UnknownSequence(identifier, version=version)
        if owner is not None and owner != principal:
            log.warning("refused a message about source sequence %s from %r: it belongs to %r",
                        identifier, principal, owner)
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

    def _on_decoupled_response(self, body: CreateSequenceResponse | CloseSequenceResponse | TerminateSequenceResponse,
                               version: RMVersion, addressing: AddressingHeaders) -> None:
        """A response a peer sent to our endpoint instead of the back-channel (we ask with an
        anonymous ReplyTo, but a peer may use AcksTo or send it late): match it and apply it."""
        if isinstance(body, CreateSequenceResponse):
            key = self.source.key_for_create_response(addressing.relates_to)
            if key is not None:
                self.source.on_create_sequence_response(key, body, version,
                                                        create_offered=self.destination.create_offered)
                return
        else:
            key = self.source.key_for_sequence(body.identifier)
            if key is not None:
                if isinstance(body, CloseSequenceResponse):
                    self.source.on_closed(key)
                else:
                    self.source.on_terminated(key)
                return
            # a response about a sequence we do not have (or do not have for this peer): say so
            raise UnknownSequence(body.identifier, version=version)
        log.info("unmatched %s (relates to %s) ignored", type(body).__name__, addressing.relates_to)

    def _on_received_fault(self, fault: SoapFault) -> None:
        if isinstance(fault, WSRMFault):
            self.source.on_fault(fault)
        else:
            log.warning("a peer sent us a fault: %s", fault)

    # -- responses to what we sent ------------------------------------------------------------------

    def read_response(self, data: bytes, *, store_key: str | None = None,
                      apply_faults: bool = True, origin: str | None = None) -> ResponseContent:
        """Apply what a response says (acks; faults about ``store_key`` unless not
        ``apply_faults``); return its body or fault for the caller to judge.

        ``origin`` says what answered what (``HTTP 200 OK from URL to message 4``)
        for the log line of a response that cannot be read.
        """
        try:
            message = read_message(data, self.policy.max_message_size)
        except SoapFault as fault:
            log.warning("unreadable response%s (%s); treating it as lost", f" ({origin})" if origin else "", fault)
            return ResponseContent()
        if message.sequence is not None:
            return ResponseContent(reliable=True)  # a reply on the back-channel: the caller handles it
        acks = tuple(ack for ack, _ in message.acks)
        for ack, version in message.acks:
            try:
                self.source.on_ack(ack, version)
            except SoapFault as fault:
                log.warning("acknowledgement in a response refused: %s", fault)
        if message.fault is not None:
            if not apply_faults:
                pass
            elif isinstance(message.fault, WSRMFault):
                self.source.on_fault(message.fault, store_key)
            else:
                log.warning("peer answered with a fault: %s", message.fault)
            return ResponseContent(fault=message.fault, acks=acks)
        return ResponseContent(body=message.body[0] if message.body is not None else None, acks=acks)
