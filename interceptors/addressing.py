"""The WS-Addressing interceptor: reads wsa headers on the way in, writes them on the way out.

WS-RM needs WS-Addressing on every message (Action to route protocol
messages, MessageID/RelatesTo to correlate, ReplyTo for the back-channel), so
this is the first protocol interceptor of a chain, in phase ADDRESSING.

Reading fills ``message.addressing`` (an
:class:`~wsrm_plugin.wire.addressing.AddressingHeaders`; a bad header is the
WS-A fault the wire layer raises).  Writing follows the roles:

* a client's request gets To (the endpoint), Action (the SOAP action, else the
  body element's name), a fresh MessageID and ReplyTo (anonymous unless
  configured);
* a server's response answers the request's headers: To = its ReplyTo,
  RelatesTo = its MessageID, its reference parameters echoed, Action = the
  request's plus ``Response`` (the WCF convention) or the fault action.  A
  request that carried no WS-A gets none back: that peer would not expect them.

Writing is idempotent (:func:`apply_addressing` leaves an envelope that
already has wsa headers alone), because on the way out ADDRESSING comes after
RELIABLE_MESSAGING: a WS-RM interceptor that stores a message for
retransmission calls :func:`apply_addressing` first, so every copy keeps the
same MessageID, and this interceptor then finds the headers already there.
"""

from __future__ import annotations

import logging

from lxml import etree

from wsrm_plugin.wire.addressing import AddressingHeaders, EndpointReference, new_message_id
from wsrm_plugin.wire.faults import MessageAddressingHeaderRequired, SoapFault
from wsrm_plugin.wire.headers import WSA_HEADERS
from wsrm_plugin.wire.namespaces import WSA_2005_08, AddressingVersion

from .chain import Interceptor, Message, Phase, action_from_http

__all__ = ["AddressingInterceptor", "read_addressing", "apply_addressing"]

log = logging.getLogger(__name__)


def _version(version: AddressingVersion | str | None) -> AddressingVersion:
    if version is None:
        return WSA_2005_08
    if isinstance(version, AddressingVersion):
        return version
    found = AddressingVersion.for_namespace(version)
    if found is None:
        raise ValueError(f"unknown WS-Addressing namespace {version!r}; use "
                         "wsrm_plugin.wire.WSA_2005_08 or WSA_2004_08")
    return found


def read_addressing(message: Message | None) -> AddressingHeaders | None:
    """The message's WS-A properties, read from its headers once and cached on it.

    None for no message or no envelope; an ``AddressingHeaders`` whose
    ``version`` is None when the envelope has no wsa header.  Raises the WS-A
    fault (InvalidAddressingHeader) for headers that are present but wrong.
    """
    if message is None:
        return None
    if message.addressing is None and message.envelope is not None:
        message.addressing = AddressingHeaders.from_header(message.header_elements())
    return message.addressing


def _default_action(message: Message) -> str | None:
    action = message.action or action_from_http(message.http_headers, message.soap_version)
    if action:
        return action
    body = message.body_element
    if body is None:
        return None
    qname = etree.QName(body)
    namespace, local = qname.namespace, qname.localname
    return f"{namespace.rstrip('/')}/{local}" if namespace else local


def _fault_action(message: Message, wsa: AddressingVersion) -> str:
    fault = message.fault
    if isinstance(fault, SoapFault):
        return fault.fault_action(wsa)
    return wsa.soap_fault_action


def apply_addressing(message: Message, version: AddressingVersion | str | None = None, *,
                     reply_to: EndpointReference | None = None,
                     must_understand: bool = False) -> AddressingHeaders | None:
    """Write the WS-A headers ``message`` should carry, unless it already has some.

    Properties set beforehand on ``message.addressing`` (by the application or
    an earlier interceptor) win over the defaults.  Returns what the message
    now carries, or None when it carries no WS-A (no envelope, or a response to
    a request without WS-A).
    """
    if message.envelope is None:
        return None
    present = AddressingHeaders.from_header(message.header_elements())
    if present.version is not None:
        message.addressing = present
        return present
    preset = message.addressing if message.addressing is not None else AddressingHeaders()
    if message.is_request:
        wsa = preset.version or _version(version)
        headers = AddressingHeaders(
            to=preset.to or message.address,
            action=preset.action or _default_action(message),
            message_id=preset.message_id or new_message_id(),
            relates_to=preset.relates_to, relationship_type=preset.relationship_type,
            reply_to=preset.reply_to or reply_to or EndpointReference(wsa.anonymous),
            fault_to=preset.fault_to, from_=preset.from_,
            reference_parameters=preset.reference_parameters, version=wsa,
        )
    else:
        try:
            request = read_addressing(message.request)
        except SoapFault:
            request = None  # its WS-A headers are what failed: there is nothing to answer to
        if request is None or request.version is None:
            if message.addressing is None:
                return None  # the peer spoke no WS-A: answer in kind
            headers = preset
            headers.version = preset.version or _version(version)
        else:
            wsa = request.version
            action: str | None  # None when neither side named one: the reply then has no wsa:Action
            if message.is_fault:
                action = preset.action or _fault_action(message, wsa)
            else:
                action = preset.action or message.action or (
                    f"{request.action}Response" if request.action else None)
            headers = request.reply_headers(action, preset.message_id, fault=message.is_fault)
    soap = message.soap_version if must_understand else None
    message.add_headers(headers.to_elements(headers.version, soap=soap), first=True)
    message.addressing = headers
    return headers


class AddressingInterceptor(Interceptor):
    """WS-Addressing in phase ADDRESSING: read on the way in, write on the way out.

    ``version`` is what requests are written in (responses answer in the
    request's version).  ``required`` refuses requests without WS-A with the
    MessageAddressingHeaderRequired fault, as a service whose policy says
    ``wsam:Addressing`` should.  ``reply_to`` replaces the anonymous ReplyTo
    of requests (an addressable client).  ``must_understand`` marks Action and
    To mustUnderstand, as WCF does.
    """

    name = "addressing"
    phase = Phase.ADDRESSING
    understands = WSA_HEADERS
    changes_received = False  # reading only: a received request's bytes still stand for its tree
    quiet_without_envelope = True  # apply_addressing writes nothing where there is no envelope

    def __init__(self, version: AddressingVersion | str | None = WSA_2005_08, *,
                 required: bool = False, reply_to: EndpointReference | str | None = None,
                 must_understand: bool = False, name: str | None = None) -> None:
        super().__init__(name=name)
        self.version = _version(version)
        self.required = required
        self.reply_to = EndpointReference(reply_to) if isinstance(reply_to, str) else reply_to
        self.must_understand = must_understand

    def handle_in(self, message: Message) -> None:
        headers = read_addressing(message)
        if headers is None:
            return
        if headers.version is None:
            if self.required and message.is_request:
                raise MessageAddressingHeaderRequired(
                    "this endpoint requires WS-Addressing: the message has no wsa:Action header",
                    problem_header=self.version.qname("Action"), version=self.version)
            return
        if message.is_request:
            headers.require("action")  # mandatory whenever WS-A is used
        else:
            sent = read_addressing(message.request)
            if sent is not None and sent.message_id and headers.relates_to not in (None, sent.message_id):
                log.warning("reply relates to %s, but the request was %s",
                            headers.relates_to, sent.message_id)

    def handle_out(self, message: Message) -> None:
        apply_addressing(message, self.version, reply_to=self.reply_to,
                         must_understand=self.must_understand)
