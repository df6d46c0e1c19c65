"""WS-MakeConnection 200702 for engines: replies to clients that cannot accept connections.

A client behind a firewall names itself with the WS-MC anonymous URI
(``http://docs.oasis-open.org/ws-rx/wsmc/200702/anonymous?id=...``) as its
ReplyTo and Offer endpoint, and polls the server with ``MakeConnection``.

* Server end: :class:`Mailbox`.  ``mailbox.transport(inner)`` wraps the
  engine's transport so what the engine sends to a WS-MC anonymous address is
  parked in a per-id mailbox instead of posted (the engine still counts it as
  sent and retransmits it until acknowledged, so a poll response lost on the
  way is harmless); ``mailbox.middleware(app)`` answers ``MakeConnection``
  POSTs with the oldest parked message (``wsmc:MessagePending`` says whether
  more wait) or an empty 202, and passes every other request to ``app``.
* Client end: :class:`Poller`, a thread that POSTs MakeConnection to the
  servers the client called, hands each message it gets back to the client's
  engine (``engine.handle``) and posts the engine's answer (the
  acknowledgement) back to the server, since a poll response has no
  back-channel of its own.
"""

from __future__ import annotations

import io
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from lxml import etree

from .engine.envelopes import protocol_message
from .engine.transport import Response, Transport, TransportError
from .wire import AddressingHeaders, SequenceHeader, SoapFault, parse_envelope, parse_rm_element, to_bytes
from .wire.mc import MakeConnection, MessagePending
from .wire.namespaces import MAKE_CONNECTION_ACTION, WSMC_NS, mc_anonymous_id, mc_anonymous_uri
from .wire.xmlsafe import DEFAULT_MAX_SIZE

__all__ = ["Mailbox", "Poller", "mc_address_for"]

log = logging.getLogger(__name__)

_MAKE_CONNECTION = etree.QName(WSMC_NS, "MakeConnection").text
_MESSAGE_PENDING = etree.QName(WSMC_NS, "MessagePending").text


def mc_address_for(name: str) -> str:
    """A stable WS-MC anonymous address for client ``name`` (the same after a restart)."""
    return mc_anonymous_uri(str(uuid.uuid5(uuid.NAMESPACE_URL, f"wsrm-client:{name}")))


class _MailboxTransport:
    def __init__(self, mailbox: Mailbox, inner: Transport) -> None:
        self._mailbox = mailbox
        self._inner = inner

    def send(self, address: str, envelope: bytes, headers: Mapping[str, str]) -> Response:
        mc_id = mc_anonymous_id(address)
        if mc_id is None:
            return self._inner.send(address, envelope, headers)
        self._mailbox.park(mc_id, envelope)
        return Response(202)

    def close(self) -> None:
        self._inner.close()


class Mailbox:
    """The server end: messages for polling clients, by WS-MC id, oldest first.

    A retransmission replaces the parked copy with the same wsa:MessageID, so
    an idle client does not find the same message queued many times.
    ``max_per_client`` bounds what one id may hold (the oldest is dropped;
    the engine retransmits it later), so a client that never polls cannot
    fill the server's memory.  A parked copy of a sequence message that the
    client acknowledged meanwhile (it took an earlier copy, and its
    acknowledgement came back on another poll or request) is dropped when its
    turn comes instead of handed out again: ``acknowledged(sequence id,
    number)`` says so (``engine.source.acknowledged``).
    """

    def __init__(self, *, max_per_client: int = 1000, max_message_size: int = DEFAULT_MAX_SIZE,
                 owner_of: Callable[[str], str | None] | None = None,
                 acknowledged: Callable[[str, int], bool] | None = None) -> None:
        self.max_per_client = max_per_client
        self.max_message_size = max_message_size
        #: The principal a sequence belongs to (``engine.destination.owner_of``): a box whose
        #: messages belong to a principal is emptied by that principal's polls only.
        self.owner_of = owner_of
        #: Has the client acknowledged this message of our sequence? (``engine.source.acknowledged``)
        self.acknowledged = acknowledged
        #: Parked copies dropped at their turn because the client had acknowledged them meanwhile.
        self.dropped_acknowledged = 0
        self._boxes: dict[str, OrderedDict[str, tuple[bytes, tuple[str, int] | None]]] = {}
        self._owners: dict[str, str] = {}
        self._lock = threading.Lock()

    def transport(self, inner: Transport) -> Transport:
        """``inner`` for ordinary addresses, this mailbox for WS-MC anonymous ones."""
        return _MailboxTransport(self, inner)

    def park(self, mc_id: str, envelope: bytes) -> None:
        parsed = parse_envelope(envelope, max_size=1 << 30)
        message_id = AddressingHeaders.from_header(parsed.headers).message_id
        owner = self._owner(parsed.headers)
        numbered = _sequence_message(parsed.headers)
        with self._lock:
            if owner is not None:
                bound = self._owners.setdefault(mc_id, owner)
                if bound != owner:
                    log.warning("WS-MC address %s serves %r; a message of %r's sequence is parked there too",
                                mc_id, bound, owner)
            box = self._boxes.setdefault(mc_id, OrderedDict())
            key = message_id or uuid.uuid4().hex
            box.pop(key, None)
            box[key] = (envelope, numbered)
            while len(box) > self.max_per_client:
                box.popitem(last=False)
        log.debug("parked %s for WS-MC client %s", message_id, mc_id)

    def _owner(self, headers: Iterable[etree._Element]) -> str | None:
        """The principal of the sequence a parked message names (its Sequence or acknowledgement)."""
        if self.owner_of is None:
            return None
        for header in headers:
            parsed = parse_rm_element(header)
            identifier = getattr(parsed[0], "identifier", None) if parsed is not None else None
            if identifier:
                owner = self.owner_of(identifier)
                if owner is not None:
                    return owner
        return None

    def may_poll(self, mc_id: str, principal: str | None) -> bool:
        """May ``principal`` take the messages parked for ``mc_id``?  Only its owner, once it has one."""
        with self._lock:
            owner = self._owners.get(mc_id)
        return owner is None or owner == principal

    def pending(self, mc_id: str) -> int:
        with self._lock:
            return len(self._boxes.get(mc_id, ()))

    def take(self, mc_id: str) -> tuple[bytes | None, bool]:
        """The oldest message for ``mc_id`` the client still needs, and whether more wait."""
        while True:
            with self._lock:
                box = self._boxes.get(mc_id)
                if not box:
                    return None, False
                _, (envelope, numbered) = box.popitem(last=False)
                more = bool(box)
            if numbered is None or not self._was_acknowledged(*numbered):
                return envelope, more
            self.dropped_acknowledged += 1
            log.debug("dropped the parked copy of message %d of %s for WS-MC client %s: the client "
                      "acknowledged it meanwhile", numbered[1], numbered[0], mc_id)

    def _was_acknowledged(self, identifier: str, number: int) -> bool:
        if self.acknowledged is None:
            return False
        try:
            return self.acknowledged(identifier, number)
        except Exception as exc:  # noqa: BLE001 -- when in doubt, hand it out: the client discards a duplicate
            log.debug("could not learn whether message %d of %s was acknowledged: %s", number, identifier, exc)
            return False

    def middleware(self, app: Callable[..., Any]) -> Callable[..., Any]:
        """WSGI middleware answering MakeConnection polls; everything else goes to ``app``."""

        def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            if environ.get("REQUEST_METHOD") != "POST":
                return app(environ, start_response)
            try:
                length = int(environ.get("CONTENT_LENGTH") or "")
            except ValueError:
                return app(environ, start_response)
            if not 0 <= length <= self.max_message_size:
                return app(environ, start_response)  # let the endpoint refuse it properly
            data = environ["wsgi.input"].read(length)
            environ["wsgi.input"] = io.BytesIO(data)
            if b"MakeConnection" not in data:
                return app(environ, start_response)  # cheap pre-check: not a poll
            try:
                envelope = parse_envelope(data, max_size=self.max_message_size)
            except SoapFault:
                return app(environ, start_response)
            body = envelope.body_element
            if body is None or body.tag != _MAKE_CONNECTION:
                return app(environ, start_response)
            try:
                poll = MakeConnection.from_xml(body)
            except SoapFault as fault:
                return _refuse(start_response, fault, envelope)
            mc_id = mc_anonymous_id(poll.address)
            if mc_id is None:
                refusal = SoapFault(f"MakeConnection address {_shown(poll.address)} is not a WS-MC anonymous "
                                    "URI", code="Sender")
                return _refuse(start_response, refusal, envelope)
            principal = environ.get("REMOTE_USER") or None
            if not self.may_poll(mc_id, principal):
                # like a poll that finds nothing: a stranger learns nothing, and takes nothing
                log.warning("MakeConnection for %s from %r refused: its messages belong to another peer",
                            mc_id, principal)
                start_response("202 Accepted", [("Content-Length", "0")])
                return [b""]
            message, more = self.take(mc_id)
            if message is None:
                start_response("202 Accepted", [("Content-Length", "0")])
                return [b""]
            reply = parse_envelope(message, max_size=1 << 30)
            header = reply.root.find(reply.version.qname("Header").text)
            if header is None:
                header = etree.Element(reply.version.qname("Header"))
                reply.root.insert(0, header)
            header.append(MessagePending(more).to_xml())
            return _respond(start_response, 200, to_bytes(reply.root), reply.version)

        return wsgi


def _sequence_message(headers: Iterable[etree._Element]) -> tuple[str, int] | None:
    """(identifier, number) of a parked envelope's wsrm:Sequence header; None for another message."""
    for header in headers:
        if isinstance(header.tag, str) and etree.QName(header).localname == SequenceHeader.TAG:
            parsed = parse_rm_element(header)
            if parsed is not None and isinstance(parsed[0], SequenceHeader):
                return parsed[0].identifier, parsed[0].message_number
    return None


def fault_bytes(fault: SoapFault, soap: Any, headers: Iterable[etree._Element] = ()) -> bytes:
    from .wire import fault_envelope
    return to_bytes(fault_envelope(fault, soap, headers))


def _shown(text: str, limit: int = 200) -> str:
    """``text`` quoted for a fault reason, cut to ``limit`` characters (a peer's input echoed back
    whole would let it make our answers as large as its requests)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def _refuse(start_response: Callable[..., Any], fault: SoapFault, envelope: Any) -> list[bytes]:
    """A fault answering a MakeConnection, with the status of SOAP's HTTP binding (1.1: 500;
    1.2: 400 for a Sender fault), the same the engine's endpoint answers faults with, and the
    WS-Addressing headers of a fault reply when the poll had them."""
    from .engine.transport import http_status_for

    addressing = AddressingHeaders.from_header(envelope.headers)
    headers: list[etree._Element] = []
    if addressing.version is not None:
        headers = addressing.reply_headers(fault.fault_action(addressing.version), fault=True).to_elements(
            addressing.version, soap=envelope.version)
    return _respond(start_response, http_status_for(fault, envelope.version),
                    fault_bytes(fault, envelope.version, headers), envelope.version)


def _respond(start_response: Callable[..., Any], status: int, body: bytes, soap: Any) -> list[bytes]:
    reason = {200: "OK", 400: "Bad Request", 500: "Internal Server Error"}[status]
    start_response(f"{status} {reason}", [("Content-Length", str(len(body))),
                                          ("Content-Type", soap.http_headers()["Content-Type"])])
    return [body]


class Poller:
    """The client end: polls ``targets()`` for messages to ``address`` and feeds them to ``engine``."""

    def __init__(self, engine: Any, address: str, targets: Callable[[], Iterable[str]], *,
                 interval: float = 0.2) -> None:
        if mc_anonymous_id(address) is None:
            raise ValueError(f"{address!r} is not a WS-MC anonymous URI (use mc_address_for(name))")
        self.engine = engine
        self.address = address
        self.targets = targets
        self.interval = interval
        self.received = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Poller:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="wsrm-mc-poller", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            more = False
            for target in list(self.targets()):
                try:
                    more = self.poll(target) or more
                except Exception:  # noqa: BLE001 -- a poll failing must not end polling
                    log.exception("MakeConnection poll of %s failed; polling again later", target)
            if not more:
                self._stop.wait(self.interval)

    def poll(self, target: str) -> bool:
        """One poll of ``target``; True when the server says more messages wait."""
        policy = self.engine.policy
        request = protocol_message(policy.soap_version, policy.addressing, to=target,
                                   action=MAKE_CONNECTION_ACTION, body=MakeConnection(self.address).to_xml())
        headers = policy.soap_version.http_headers(MAKE_CONNECTION_ACTION)
        try:
            response = self.engine.transport.send(target, request, headers)
        except TransportError as exc:
            log.info("MakeConnection to %s failed: %s", target, exc)
            return False
        if not response.body:
            return False
        envelope = parse_envelope(response.body, max_size=policy.max_message_size)
        if envelope.is_fault:
            log.warning("server %s answered MakeConnection with a fault: %s", target, envelope.fault())
            return False
        more = any(h.tag == _MESSAGE_PENDING and MessagePending.from_xml(h).pending for h in envelope.headers)
        self.received += 1
        answer = self.engine.handle(response.body, via_response=True)
        if answer.body:  # the acknowledgement the server would have got on a back-channel
            try:
                self.engine.transport.send(target, answer.body,
                                           {"Content-Type": answer.content_type or headers["Content-Type"]})
            except TransportError as exc:
                log.info("acknowledgement to %s not delivered (%s); the server will retransmit", target, exc)
        return more
