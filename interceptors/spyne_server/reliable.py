"""The WS-RM interceptor (phase RELIABLE_MESSAGING): the chain's bridge to a ReliableEngine.

Seed 004's Mercury is two handlers plus workers; this is the handler half on
a server.  On the way in:

* anything that speaks WS-RM (a protocol body such as CreateSequence, an
  application message with a wsrm:Sequence header, acknowledgements,
  AckRequested) is handed to :meth:`ReliableEngine.handle
  <wsrm_plugin.engine.ReliableEngine.handle>`: protocol answers go back on the
  HTTP response, an application message is stored in the destination's
  invoker buffer and answered 202 (with its acknowledgement when AcksTo is
  anonymous).  The service does NOT run now: the message is taken out of the
  flow (``message.suspend``) and the engine's invoker worker finishes it later.
  A request whose ReplyTo is anonymous (a client without a listener) is the
  exception: this HTTP thread waits, bounded, for that delivery and answers
  with its reply (:mod:`wsrm_plugin.engine.backchannel`).  The peer's
  authenticated principal (``REMOTE_USER``, a TLS client certificate) goes to
  the engine, so a sequence only takes messages from its creator;
* an application message without a Sequence header, when RM is required, is
  refused with WSRMRequired (1.1) or a Sender fault saying the same (1.0).

Later, in the invoker worker's transaction, :class:`ChainDeliverer` rebuilds
the stored message and resumes the chain after this interceptor
(:meth:`ChainMiddleware.deliver <interceptors.spyne_server.adapter.ChainMiddleware.deliver>`),
so spyne runs the method in that thread, inside the transaction.  On the way
out this interceptor then catches what the method produced: a response is
enqueued on the offered (response) sequence in the same transaction instead
of being lost on a back-channel that is long closed; a SOAP fault makes the
delivery roll back and is sent reliably afterwards by the engine
(:class:`~wsrm_plugin.engine.ApplicationFault`).

The public surface is small on purpose (the client-role interceptor may reuse
it): :func:`carries_rm`, :func:`response_of`, :func:`current_delivery`,
:class:`ReliableMessagingInterceptor` and :class:`ChainDeliverer`.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from typing import TYPE_CHECKING

from lxml import etree

from wsrm_plugin.engine import ApplicationFault, DeliveryContext, ReliableEngine
from wsrm_plugin.engine.parsed import TREES
from wsrm_plugin.engine.transport import Reply
from wsrm_plugin.wire.faults import SoapFault, WSRMRequired
from wsrm_plugin.wire.headers import WSMC_HEADERS, WSRM_HEADERS
from wsrm_plugin.wire.namespaces import RM_VERSIONS, SOAP11, SoapVersion
from wsrm_plugin.wire.xmlsafe import parse_xml

from interceptors.addressing import apply_addressing
from interceptors.chain import Direction, Exchange, HttpHeaders, Interceptor, Message, Phase, Response, Role

if TYPE_CHECKING:
    from interceptors.spyne_server.adapter import ChainMiddleware

__all__ = [
    "DELIVERY_KEY", "ReliableMessagingInterceptor", "ChainDeliverer", "carries_rm", "response_of",
    "current_delivery", "principal_of", "ServiceFailure",
]

log = logging.getLogger(__name__)

#: ``Exchange.properties`` key of the :class:`DeliveryContext` of a message the invoker is delivering.
DELIVERY_KEY = "wsrm.delivery"
_FAULT_KEY = "wsrm.service_fault"
#: Exchange property: the method raised a spyne ``Fault`` of its own (a declared application fault).
_DECLARED_KEY = "wsrm.declared_fault"
_LISTENING = "_wsrm_declared_fault_listener"
#: Exchange property: what a method raised that was not a spyne ``Fault`` (for the poison store).
_ERROR_KEY = "wsrm.method_error"
#: Exchange property: that exception itself, so the invoker can tell a database down (an outage,
#: which pauses delivery) from a bad message (counted): spyne's fault says only "Internal Error".
_RAISED_KEY = "wsrm.method_exception"
#: "{namespace}" of each WS-RM version: a tag in one starts with it (a comment's tag is no str)
_RM_TAG_PREFIXES = tuple(f"{{{v.ns}}}" for v in RM_VERSIONS)
_local = threading.local()


def carries_rm(message: Message) -> bool:
    """Does ``message`` say anything in WS-RM (a header block or a body of either WS-RM version)?"""
    # the tags' text, no etree.QName a block: every message a service receives is asked
    for header in message.header_elements():
        tag = header.tag
        if type(tag) is str and tag.startswith(_RM_TAG_PREFIXES):
            return True
    body = message.body_element  # (looked at only when no header is WS-RM's: a CreateSequence)
    body_tag = body.tag if body is not None else None
    return type(body_tag) is str and body_tag.startswith(_RM_TAG_PREFIXES)


def response_of(reply: Reply, max_size: int) -> Response:
    """The chain :class:`Response` for an engine :class:`Reply`: its tree, or its bytes alone when
    the engine wrote them without one (an answer that only acknowledges: nothing after the WS-RM
    interceptor reads a suspended request's answer, it goes out as it is), else its body parsed
    safely."""
    envelope = reply.tree
    raw = reply.body if envelope is not None or (reply.body and reply.status == 200) else None
    if envelope is None and reply.body and raw is None:
        envelope = parse_xml(reply.body, max_size=max(max_size, len(reply.body)))
    headers = {"Content-Type": reply.content_type} if reply.content_type and (envelope is not None or raw) else {}
    if reply.retry_after is not None:
        headers["Retry-After"] = str(reply.retry_after)
    return Response(reply.status, envelope, headers, raw=raw)


def principal_of(message: Message) -> tuple[str | None, str | None]:
    """(principal, remote address) of a received request, from its WSGI environ.

    The principal is what authenticated the peer in front of the service:
    ``REMOTE_USER`` (HTTP authentication, set by a middleware or a reverse
    proxy), else the subject of a verified TLS client certificate
    (``SSL_CLIENT_S_DN``, as mod_ssl and cheroot set it).  A sequence then
    takes messages, acknowledgements, Close and Terminate from that
    principal only.
    """
    from interceptors.spyne_server.adapter import WSGI_ENVIRON_KEY

    environ = message.context.get(WSGI_ENVIRON_KEY) or {}
    principal = environ.get("REMOTE_USER") or None
    if principal is None and environ.get("SSL_CLIENT_S_DN") and \
            environ.get("SSL_CLIENT_VERIFY", "SUCCESS") == "SUCCESS":
        principal = f"cert:{environ['SSL_CLIENT_S_DN']}"
    return principal, environ.get("REMOTE_ADDR") or None


def current_delivery() -> DeliveryContext | None:
    """The invoker delivery running in this thread, if any (for code that has no spyne ctx)."""
    return getattr(_local, "delivery", None)


class ReliableMessagingInterceptor(Interceptor):
    """Server-role WS-RM: received messages go to ``engine``; replies of deliveries go reliably.

    ``required``: refuse application messages that are not in a sequence
    (the WS-RM policy the WSDL publishes says RM is required).  When the
    engine has no ``endpoint_address`` yet (the address offered sequences'
    AcksTo names), the first request's URL becomes it.
    """

    name = "wsrm"
    phase = Phase.RELIABLE_MESSAGING
    understands = WSRM_HEADERS | WSMC_HEADERS
    changes_received = False  # stores the request's bytes (as received, when nothing changed it)
    quiet_without_envelope = True  # a reply without an envelope is nothing to send reliably

    def __init__(self, engine: ReliableEngine, *, required: bool = True, name: str | None = None) -> None:
        super().__init__(name=name)
        self.engine = engine
        self.required = required

    # -- in ------------------------------------------------------------------------------------
    def handle_in(self, message: Message) -> None:
        if message.role is not Role.SERVER:
            return  # the client side is interceptors.zeep_client.reliable's job
        if not carries_rm(message):
            if self.required:
                raise self._rm_required()
            return  # an optional-RM service: a plain call runs at once, unreliably
        if self.engine.endpoint_address is None and message.address:
            self.engine.endpoint_address = message.address
            log.info("WS-RM endpoint address taken from the first request: %s", message.address)
        principal, remote_addr = principal_of(message)
        data = message.to_bytes()
        envelope = message.envelope
        if envelope is None:  # to_bytes() raises first: a message without one carries no WS-RM
            raise SoapFault("a WS-RM message needs a SOAP envelope", code="Sender")
        # The chain stops here, and the engine reads the tree only before it stores the message:
        # the delivery (with an in-memory store, of these very bytes) takes it instead of a parse.
        # Filed first, since the invoker may deliver before handle() returns.
        TREES.remember(data, envelope, message.addressing)  # what the chain read: not read again
        # the WS-A properties the chain's addressing interceptor read, if it ran: not read again
        # the adapter's reading of the envelope, while nothing changed it: not read again
        reply = self.engine.handle(data, principal=principal, remote_addr=remote_addr,
                                   content_type=message.http_headers.get("Content-Type"),
                                   parsed=message.read_envelope() or envelope, addressing=message.addressing)
        # suspend, not abort: what the invoker delivers later resumes right after this interceptor
        message.suspend(response_of(reply, self.engine.policy.max_message_size))

    def _rm_required(self) -> SoapFault:
        version = self.engine.policy.rm_version
        if version.is_11:
            return WSRMRequired(None, "this service requires WS-ReliableMessaging: send the message "
                                "in a sequence (CreateSequence first)", version=version)
        return SoapFault("this service requires WS-ReliableMessaging 1.0: send the message in a "
                         "sequence (wsrm:Sequence header, CreateSequence first)", code="Sender")

    # -- out -----------------------------------------------------------------------------------
    def handle_out(self, message: Message) -> None:
        if message.role is not Role.SERVER:
            return
        delivery: DeliveryContext | None = message.exchange.properties.get(DELIVERY_KEY)
        if delivery is None or message.envelope is None:
            return  # an ordinary response, or nothing to say (one-way)
        if message.is_fault:
            # rolled back by the deliverer, then sent on the response sequence by the engine
            message.exchange.properties[_FAULT_KEY] = message.to_bytes()
            message.abort()
            return
        written = apply_addressing(message)  # the reply's own MessageID, kept by every retransmission
        try:
            # its tree, not its bytes: stored (and stamped for the response) without a parse, nor a
            # read of the WS-A headers just written; the message is aborted below, so nothing here
            # touches the tree again
            delivery.reply(message.envelope, addressing=written)
        except ValueError as exc:
            log.error("the response to message %s cannot be sent reliably and is dropped: %s",
                      delivery.message_id, exc)
        message.abort()


@functools.lru_cache(maxsize=256)
def _http_headers(soap: SoapVersion, action: str | None) -> HttpHeaders:
    """The HTTP headers a delivery of ``action`` in ``soap`` carries, made once per action (a
    service has a few): each delivery's message takes a copy of them."""
    if soap is SOAP11:
        return HttpHeaders([("Content-Type", "text/xml; charset=utf-8"), ("SOAPAction", f'"{action or ""}"')])
    content_type = f"{soap.content_type}; charset=utf-8"
    if action:
        content_type += f'; action="{action}"'
    return HttpHeaders([("Content-Type", content_type)])


class ChainDeliverer:
    """The engine's application: run a stored message through the rest of the chain and spyne.

    Called by the invoker worker inside the delivery transaction; a SOAP
    fault from the service raises :class:`ApplicationFault` so everything the
    delivery did rolls back (Sender faults are not retried: the request is wrong).
    """

    def __init__(self, middleware: ChainMiddleware, interceptor: ReliableMessagingInterceptor) -> None:
        self.middleware = middleware
        self.interceptor = interceptor
        _listen_for_declared_faults(getattr(middleware.application, "app", None))

    def __call__(self, payload: bytes, context: DeliveryContext) -> None:
        soap = SoapVersion.for_namespace(context.soap_version) or SOAP11
        exchange = Exchange(properties={DELIVERY_KEY: context})
        # received by this process moments ago: its tree, not a second parse, and the WS-A
        # properties the chain read from it then (as the chain's later steps saw them)
        taken = TREES.take_noted(payload)
        tree, addressing = taken if taken is not None else (parse_xml(payload, max_size=max(len(payload), 1)), None)
        request = Message(tree, Direction.IN, Role.SERVER, http_headers=_http_headers(soap, context.action),
                          address=self.interceptor.engine.endpoint_address, action=context.action,
                          exchange=exchange)
        request.addressing = addressing
        request.serialized_as(payload)  # the tree is payload's: spyne gets these bytes, no serializing
        previous = current_delivery()
        _local.delivery = context
        try:
            self.middleware.deliver(request, after=self.interceptor.name)
        finally:
            _local.delivery = previous
        fault: bytes | None = exchange.properties.get(_FAULT_KEY)
        if fault is not None:
            if exchange.properties.get(_DECLARED_KEY):
                raise _application_fault(fault, soap)
            # not the method's own answer: spyne could not read the request, or the method
            # raised something else (a database down, a bug): retried, then kept as poison
            raised = exchange.properties.get(_ERROR_KEY)
            cause = exchange.properties.get(_RAISED_KEY)
            raise ServiceFailure(f"the service failed to process the message: {raised or _fault_text(fault, soap)}") \
                from cause


class ServiceFailure(RuntimeError):
    """The service produced a fault that is not its declared answer: a failure to process."""


def _listen_for_declared_faults(application: object) -> None:
    """Tell a method's own ``spyne.Fault`` from any other error spyne turned into a fault.

    spyne answers both with a fault envelope; in its ``method_exception_object``
    event the exception being handled is the one the method raised.
    """
    events = getattr(application, "event_manager", None)
    if events is None or getattr(application, _LISTENING, False):
        return
    from spyne import Fault

    from interceptors.spyne_server.adapter import current_message

    def on_exception(ctx: object) -> None:
        message = current_message(ctx)
        raised = sys.exc_info()[1]
        if message is None or raised is None:
            return
        if isinstance(raised, Fault):
            message.exchange.properties[_DECLARED_KEY] = True
        else:  # spyne's fault says only "Internal Error": keep what the method really raised
            message.exchange.properties[_ERROR_KEY] = f"{type(raised).__name__}: {raised}"
            message.exchange.properties[_RAISED_KEY] = raised

    events.add_listener("method_exception_object", on_exception)
    setattr(application, _LISTENING, True)


def _fault_text(envelope: bytes, soap: SoapVersion) -> str:
    try:
        return str(_application_fault(envelope, soap))
    except Exception:  # noqa: BLE001 -- an unreadable fault is still a failure
        return "an unreadable fault"


def _application_fault(envelope: bytes, soap: SoapVersion) -> ApplicationFault:
    root = parse_xml(envelope, max_size=max(len(envelope), 1))
    fault = root.find(f"{soap.qname('Body').text}/{soap.qname('Fault').text}")
    code, reason = "", "the service answered with a SOAP fault"
    if fault is not None:
        if soap is SOAP11:
            code = (fault.findtext("faultcode") or "").strip()
            reason = (fault.findtext("faultstring") or reason).strip()
        else:
            code = (fault.findtext(f"{soap.qname('Code').text}/{soap.qname('Value').text}") or "").strip()
            reason = " ".join(fault.itertext()).strip() or reason  # type: ignore[arg-type]  # lxml-stubs: str here
    local = code.rpartition(":")[2]
    sender = local in ("Client", "Sender") or local.startswith("Client.")
    # a plain fault envelope: the engine adds the WS-A headers of a reply on the response sequence
    plain = _without_headers(root)
    return ApplicationFault(plain, f"service fault {code}: {reason}", retryable=not sender)


def _without_headers(root: etree._Element) -> bytes:
    for child in list(root):
        if isinstance(child.tag, str) and etree.QName(child).localname == "Header":
            root.remove(child)
    return etree.tostring(root, xml_declaration=True, encoding="utf-8")
