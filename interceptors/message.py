"""A SOAP message in flight, as interceptors see it: its direction, headers, state and response.

The chain (:mod:`interceptors.chain`) orders interceptors and runs them; this
module is what they are given.  A :class:`Message` knows where it stopped
(aborted, suspended at an interceptor) and what the other side gets instead
(:class:`Response`), so an adapter can honour an interceptor's decision without
knowing the chain.  Kept apart from the chain so that the hook specifications
(:mod:`interceptors.hookspecs`), which name these types, need not import the
chain that loads them.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import ItemsView, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from lxml import etree

from wsrm_plugin.wire.namespaces import SOAP11, SOAP_VERSIONS, SoapVersion
from wsrm_plugin.wire.soap import to_bytes
from wsrm_plugin.wire.xmlsafe import DEFAULT_MAX_SIZE, children, parse_xml

if TYPE_CHECKING:
    from wsrm_plugin.wire.addressing import AddressingHeaders
    from wsrm_plugin.wire.soap import Envelope

__all__ = [
    "Phase", "Direction", "Role", "HttpHeaders", "Response", "Exchange", "Message",
    "action_from_http", "serialize", "ChainError", "ChainConfigurationError", "MessageConsumed",
]


class ChainError(Exception):
    """Base of the errors the chain itself raises (not the ones interceptors raise)."""


class ChainConfigurationError(ChainError, ValueError):
    """The chain cannot be built as asked: a duplicate name, an impossible order, a bad plugin."""


class MessageConsumed(ChainError):
    """An interceptor consumed a message that its caller needs (a client's reply)."""


class Phase(enum.IntEnum):
    """Where an interceptor runs; the values give the in order, the out chain runs them backwards.

    TRANSPORT sees the raw HTTP side (headers, size, security); ADDRESSING reads
    and writes WS-Addressing; RELIABLE_MESSAGING is where WS-RM takes, stores
    and acknowledges messages; DISPATCH is closest to the application.
    """

    TRANSPORT = 100
    ADDRESSING = 200
    RELIABLE_MESSAGING = 300
    DISPATCH = 400


class Direction(enum.Enum):
    """IN: the message was received; OUT: it is being sent."""

    IN = "in"
    OUT = "out"


class Role(enum.Enum):
    """Which side of the exchange runs the chain: the CLIENT sends requests, the SERVER answers."""

    CLIENT = "client"
    SERVER = "server"


class HttpHeaders(MutableMapping[str, str]):
    """HTTP headers with case-insensitive names that keep the spelling they were set with."""

    def __init__(self, headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None) -> None:
        self._items: dict[str, tuple[str, str]] = {}
        if headers is None:
            return
        kind = type(headers)
        if kind is HttpHeaders:  # a copy: its names and values were checked when set
            self._items = dict(headers._items)  # type: ignore[union-attr]
            return
        pairs: Iterable[tuple[str, str]]
        if kind is dict or kind is list:
            # a front end's headers and a response's (every message received makes two): one
            # loop, no ABC check, no comprehension; a value __setitem__ would refuse falls to it
            items: dict[str, tuple[str, str]] = {}
            pairs = headers.items() if kind is dict else headers  # type: ignore[union-attr,assignment]
            for name, value in pairs:
                if type(value) is not str:
                    break
                items[name.lower()] = (name, value)  # a later name wins, as with __setitem__
            else:
                self._items = items
                return
        elif isinstance(headers, Mapping):  # what MutableMapping.update does, without its dispatch
            pairs = headers.items()
        elif hasattr(headers, "keys"):
            pairs = ((name, headers[name]) for name in headers.keys())  # type: ignore[index]
        else:
            pairs = headers
        for name, value in pairs:
            self[name] = value

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()][1]

    # Mapping's get, __contains__ and items() go through __getitem__ (and a KeyError) for each
    # name: the adapters read a message's headers several times each, so these read the table.
    def get(self, name: str, default: Any = None) -> Any:
        item = self._items.get(name.lower())
        return default if item is None else item[1]

    def __contains__(self, name: object) -> bool:
        return name.lower() in self._items  # type: ignore[attr-defined]  # as Mapping's: a str key

    def items(self) -> ItemsView[str, str]:
        return _Items(self)

    def __setitem__(self, name: str, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"HTTP header {name!r} needs a str value, not {type(value).__name__}")
        self._items[name.lower()] = (name, value)

    def __delitem__(self, name: str) -> None:
        del self._items[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"HttpHeaders({dict(self.items())!r})"

    def pairs(self) -> list[tuple[str, str]]:
        """The (name as set, value) pairs, in order: what WSGI's start_response takes."""
        return list(self._items.values())


class _Items(ItemsView[str, str]):
    """:meth:`HttpHeaders.items`: the (name as set, value) pairs as the headers keep them."""

    _mapping: HttpHeaders

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._mapping._items.values())


#: "202 Accepted" and the like, by status code (see :attr:`Response.status_line`)
_STATUS_LINES: dict[int, str] = {}


#: "{namespace}Envelope" -> its SOAP version (see :func:`_soap_version_of`)
_SOAP_BY_ENVELOPE_TAG: dict[object, SoapVersion] = {f"{{{v.ns}}}Envelope": v for v in SOAP_VERSIONS}


def _soap_version_of(envelope: etree._Element | None) -> SoapVersion | None:
    # read from the tag's text rather than through an etree.QName: every look at a message's
    # headers, body or fault asks for its version, a dozen times per message
    if envelope is None:
        return None
    tag = envelope.tag
    version = _SOAP_BY_ENVELOPE_TAG.get(tag)  # an Envelope (every message): one look-up
    if version is not None:
        return version
    if not isinstance(tag, str) or not tag.startswith("{"):
        return None
    return SoapVersion.for_namespace(tag[1:tag.find("}")])


def action_from_http(headers: Mapping[str, str], version: SoapVersion | None) -> str | None:
    """The SOAP action the HTTP headers carry: SOAPAction (1.1) or Content-Type's action (1.2)."""
    if version is None or version is SOAP11:
        action = headers.get("SOAPAction")
        if action is not None or version is SOAP11:
            return (action.strip().strip('"') or None) if action is not None else None
    for param in (headers.get("Content-Type") or "").split(";")[1:]:
        key, _, value = param.strip().partition("=")
        if key.lower() == "action":
            return value.strip().strip('"') or None
    return None


def serialize(envelope: etree._Element) -> bytes:
    """The bytes an envelope travels as: UTF-8 with a declaration (what both frameworks send).

    The wire module's serializer, so an empty Body is written ``<Body></Body>`` (gSOAP needs it).
    """
    return to_bytes(envelope)


@dataclass
class Response:
    """What the other side receives when an interceptor answers in place of the normal flow.

    ``status`` defaults to 200 with an envelope and 202 (Accepted, nothing to
    say) without.  Content-Type follows the envelope's SOAP version unless
    ``http_headers`` sets it.
    """

    status: int | None = None
    envelope: etree._Element | None = None
    http_headers: Mapping[str, str] = field(default_factory=dict)
    #: The bytes ``envelope`` serializes to, when whoever built it has them already (the engine
    #: serialized its answer): :meth:`body` sends them instead of serializing the tree again, as
    #: long as ``envelope`` is still the tree they were given with.  Nobody may change that tree.
    #: Given without an ``envelope``: the answer's bytes as they are sent, no tree made for them
    #: (the engine's answer that only acknowledges; ``status`` and Content-Type given with them).
    raw: bytes | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.status is not None and not 100 <= self.status <= 599:
            raise ValueError(f"HTTP status {self.status} is not a status code (100..599)")
        version = _soap_version_of(self.envelope)
        if self.envelope is not None and version is None:
            raise ValueError(
                f"a Response envelope must be a SOAP 1.1 or 1.2 Envelope, not {self.envelope.tag!r}")
        self._raw_for = self.envelope if self.raw is not None else None

    @property
    def status_code(self) -> int:
        if self.status is not None:
            return self.status
        return 200 if self.envelope is not None or (self.raw is not None and self._raw_for is None) else 202

    @property
    def status_line(self) -> str:
        """``"202 Accepted"``: the form WSGI's start_response wants."""
        code = self.status_code
        line = _STATUS_LINES.get(code)
        if line is None:  # the phrase looked up once a code (every answer sent asks)
            try:
                phrase = HTTPStatus(code).phrase
            except ValueError:
                phrase = "Unknown"
            line = _STATUS_LINES[code] = f"{code} {phrase}"
        return line

    def body(self) -> bytes:
        if self.raw is not None and self.envelope is self._raw_for:
            return self.raw  # (an envelope set since the bytes came alone is written instead)
        if self.envelope is None:
            return b""
        return serialize(self.envelope)

    def headers(self, body: bytes | None = None) -> HttpHeaders:
        """The HTTP headers to send, Content-Type and Content-Length filled in.

        Pass the :meth:`body` already rendered to save serializing it twice.
        """
        headers = HttpHeaders(self.http_headers)
        version = _soap_version_of(self.envelope)  # an Envelope's: one dict look-up
        items = headers._items  # the names this class sets, written in its table directly
        if version is not None and "content-type" not in items:
            items["content-type"] = ("Content-Type", f"{version.content_type}; charset=utf-8")
        items["content-length"] = ("Content-Length", str(len(self.body() if body is None else body)))
        return headers


class Exchange:
    """One request and its response, so the reply's interceptors can see the request.

    ``properties`` is for interceptors that need to pass something from the
    request to its response (CXF's Exchange); ``Message.context`` is per message.

    Each message holds its exchange (``message.exchange``) and the exchange
    refers to its messages weakly: ``request`` and ``response`` answer a
    message as long as anything holds it, and None after.  When the exchange
    held its messages too, every message made a reference cycle left to the
    garbage collector with everything it held (its tree, its headers, a
    delivery's context and store transaction): three a message at 16
    sequences, 43 of the 87 objects the collector found a message
    (``bench_sequences_cpu.py``).  Whoever needs a request later holds the
    message (the zeep adapter does, between a request and its reply).
    """

    __slots__ = ("_request", "_response", "properties")

    def __init__(self, request: Message | None = None, response: Message | None = None,
                 properties: dict[str, Any] | None = None) -> None:
        self._request: weakref.ref[Message] | None = None
        self._response: weakref.ref[Message] | None = None
        self.request = request
        self.response = response
        self.properties: dict[str, Any] = properties if properties is not None else {}

    @property
    def request(self) -> Message | None:
        held = self._request
        return held() if held is not None else None

    @request.setter
    def request(self, message: Message | None) -> None:
        self._request = weakref.ref(message) if message is not None else None

    @property
    def response(self) -> Message | None:
        held = self._response
        return held() if held is not None else None

    @response.setter
    def response(self, message: Message | None) -> None:
        self._response = weakref.ref(message) if message is not None else None

    def __repr__(self) -> str:
        return f"Exchange(request={self.request!r}, response={self.response!r}, properties={self.properties!r})"


_RUNNING, _ABORTED, _SUSPENDED = "running", "aborted", "suspended"


class Message:
    """One SOAP message in flight, as the interceptors see it.

    ``envelope`` is the lxml Envelope element (None for an empty HTTP body, such
    as a one-way operation's 202).  Interceptors may change it in place or
    replace it.  ``address`` is the endpoint URL (the target on a client, the
    request URL on a server); ``action`` the SOAP action if the transport said
    one; ``operation`` the operation name where the framework knows it.
    ``addressing`` is filled by the WS-Addressing interceptor.  ``fault`` is the
    exception a fault response answers (set by the server adapter, so
    interceptors can pick the fault's WS-A action); ``error`` is what an
    interceptor raised while the chain ran this message.
    """

    def __init__(self, envelope: etree._Element | None, direction: Direction, role: Role, *,
                 http_headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
                 address: str | None = None, action: str | None = None,
                 operation: str | None = None, http_status: int | None = None,
                 exchange: Exchange | None = None, context: dict[str, Any] | None = None,
                 resume_point: str | None = None) -> None:
        if not isinstance(direction, Direction):
            raise TypeError(f"direction must be a Direction, not {direction!r}")
        if not isinstance(role, Role):
            raise TypeError(f"role must be a Role, not {role!r}")
        version = _soap_version_of(envelope)
        if envelope is not None and version is None:
            raise ValueError(
                f"a Message envelope must be a SOAP 1.1 or 1.2 Envelope, not {envelope.tag!r}")
        self._envelope = envelope
        #: the envelope's SOAP version, read from its tag once (every look at its headers,
        #: body or fault asks for it: about 20 times per message on a server)
        self._version = version
        self._raw: bytes | None = None
        #: (bytes, their envelope as read) given to :meth:`serialized_as`: see :meth:`read_envelope`
        self._read: tuple[bytes, Envelope] | None = None
        self.direction = direction
        self.role = role
        self.http_headers = HttpHeaders(http_headers)
        self.address = address
        self.action = action
        self.operation = operation
        self.http_status = http_status
        self.context: dict[str, Any] = context if context is not None else {}
        self.addressing: AddressingHeaders | None = None
        self.fault: BaseException | None = None
        self.error: BaseException | None = None
        self.response: Response | None = None
        self.resume_point = resume_point
        self.current: str | None = None
        self.stopped_by: str | None = None
        self._state = _RUNNING
        self.exchange = exchange if exchange is not None else Exchange()
        if self.is_request:
            self.exchange.request = self
        else:
            self.exchange.response = self

    def __repr__(self) -> str:
        return (f"<Message {self.direction.value} {self.role.value} {self.operation or ''}"
                f" {self._state}>")

    def _run_again(self) -> None:
        """The chain resumes this stopped message: it runs, with no stop or response recorded."""
        self._state = _RUNNING
        self.response = None
        self.stopped_by = None

    @property
    def envelope(self) -> etree._Element | None:
        return self._envelope

    @envelope.setter
    def envelope(self, envelope: etree._Element | None) -> None:
        self._envelope = envelope
        self._version = _soap_version_of(envelope)
        self._raw = None

    def serialized_as(self, data: bytes, read: Envelope | None = None) -> None:
        """Say that ``data`` is exactly what the envelope serializes to now (its stored form).

        :meth:`to_bytes` then returns ``data`` instead of serializing the tree
        again, until anything may have changed the envelope: the chain forgets
        it before it runs any interceptor or hook on the message, and so do
        :meth:`add_header`, :meth:`remove_header` and replacing the envelope.
        ``read``: the wire module's reading of the envelope as it is now (its
        header blocks and body, :class:`~wsrm_plugin.wire.soap.Envelope`), handed
        out by :meth:`read_envelope` for as long as ``data`` stands.
        """
        if self._envelope is None:
            raise ChainError("this message has no envelope to serialize")
        self._raw = data
        self._read = (data, read) if read is not None else None

    def read_envelope(self) -> Envelope | None:
        """The reading given to :meth:`serialized_as` while its bytes still stand for the tree
        (nothing may have changed it since), else None.  A server's adapter reads a received
        envelope before the chain runs; the WS-RM interceptor, which changes nothing, hands
        that reading to the engine instead of a second one."""
        read = self._read
        return read[1] if read is not None and read[0] is self._raw else None

    # -- what kind of message ---------------------------------------------------
    @property
    def is_request(self) -> bool:
        """A client's outgoing or a server's incoming message (else a response)."""
        return (self.direction is Direction.OUT) == (self.role is Role.CLIENT)

    @property
    def request(self) -> Message | None:
        """The request this message answers (itself for a request)."""
        return self.exchange.request

    @property
    def soap_version(self) -> SoapVersion | None:
        return self._version

    @property
    def body_element(self) -> etree._Element | None:
        """The first child of the Body (the payload or the Fault), or None."""
        body = self._part("Body")
        if body is None:
            return None
        return next(children(body), None)

    @property
    def is_fault(self) -> bool:
        body = self.body_element
        version = self.soap_version
        return body is not None and version is not None and body.tag == f"{{{version.ns}}}Fault"

    # -- headers ----------------------------------------------------------------
    def _part(self, local: str) -> etree._Element | None:
        version = self.soap_version
        if version is None or self.envelope is None:
            return None
        tag = f"{{{version.ns}}}{local}"
        for child in children(self.envelope):
            if child.tag == tag:
                return child
        return None

    def header_elements(self) -> list[etree._Element]:
        """The SOAP header blocks, in document order (a new list; the elements are live)."""
        read = self._read
        if read is not None and read[0] is self._raw:  # the adapter's reading, which still stands
            return list(read[1].headers)
        header = self._part("Header")
        return list(children(header)) if header is not None else []

    def add_header(self, element: etree._Element, *, first: bool = False) -> etree._Element:
        """Append (or prepend) a header block, creating the Header if there is none."""
        self.add_headers([element], first=first)
        return element

    def add_headers(self, elements: Iterable[etree._Element], *, first: bool = False) -> None:
        """Append (or put first, in their order) several header blocks: the Header found (or made)
        once, where a block at a time looked for it again (a reply's WS-A headers are four)."""
        version = self.soap_version
        if version is None or self.envelope is None:
            raise ChainError("this message has no SOAP envelope to add a header to")
        self._raw = None
        header = self._part("Header")
        if header is None:
            header = etree.Element(version.qname("Header"))
            self.envelope.insert(0, header)
        if first:
            for position, element in enumerate(elements):
                header.insert(position, element)
        else:
            for element in elements:
                header.append(element)

    def remove_header(self, element: etree._Element) -> None:
        header = self._part("Header")
        if header is None or element.getparent() is not header:
            raise ValueError("that element is not a header block of this message")
        self._raw = None
        header.remove(element)

    # -- leaving the flow ---------------------------------------------------------
    def abort(self, response: Response | None = None) -> None:
        """Consume this message: the chain stops and the message is not delivered.

        ``response`` is what the sender gets instead (server in: the HTTP
        answer; client out: what the client sees as the reply; server out:
        replaces the service's answer; client in: its envelope becomes the
        reply, and without one the caller gets MessageConsumed).  None means
        an empty 202.
        """
        self._stop(_ABORTED, response)

    def suspend(self, response: Response | None = None) -> None:
        """Like :meth:`abort`, but :meth:`InterceptorChain.resume` can finish the chain later.

        Only an interceptor can suspend (the chain resumes after it by name).
        """
        if self.current is None:
            raise ChainError(
                "suspend() needs to know which interceptor to resume after: call it from an "
                "interceptor's handler (hooks can abort, not suspend)")
        self.resume_point = self.current
        self._stop(_SUSPENDED, response)

    def _stop(self, state: str, response: Response | None) -> None:
        if response is not None and not isinstance(response, Response):
            raise TypeError(f"response must be an interceptors.Response, not {type(response).__name__}")
        self._state = state
        self.response = response

    @property
    def stopped(self) -> bool:
        """True once aborted or suspended: the adapter must not deliver the message."""
        return self._state != _RUNNING

    @property
    def aborted(self) -> bool:
        return self._state == _ABORTED

    @property
    def suspended(self) -> bool:
        return self._state == _SUSPENDED

    # -- storing and rebuilding (for workers that resume later) --------------------
    def to_bytes(self) -> bytes:
        if self._envelope is None:
            raise ChainError("this message has no envelope to serialize")
        if self._raw is not None:
            return self._raw
        return serialize(self._envelope)

    @classmethod
    def from_bytes(cls, data: bytes, direction: Direction, role: Role, *,
                   max_size: int = DEFAULT_MAX_SIZE, **kwargs: Any) -> Message:
        """Rebuild a message from stored or received bytes, parsed safely (no DTD, size-limited)."""
        return cls(parse_xml(data, max_size=max_size), direction, role, **kwargs)
