"""WS-MakeConnection 200702: let a client that can't be called back poll for its messages.

A client behind a firewall gives the WS-MC anonymous URI
(``.../wsmc/200702/anonymous?id=...``) as its ReplyTo/AcksTo and sends
``MakeConnection`` with that address; the server answers on the HTTP response
with a queued message (flagged ``MessagePending`` if more wait) or an empty 202.
"""

from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

from .faults import MalformedMessageError, MissingSelection, UnsupportedSelection
from .namespaces import WSMC_NS
from .xmlsafe import children, text_of

__all__ = ["MakeConnection", "MessagePending"]

_MAKE_CONNECTION = etree.QName(WSMC_NS, "MakeConnection")
_MESSAGE_PENDING = etree.QName(WSMC_NS, "MessagePending")
_ADDRESS = etree.QName(WSMC_NS, "Address")


@dataclass
class MakeConnection:
    """Body of a poll: ``address`` selects the messages addressed to that WS-MC anonymous URI."""

    address: str

    def to_xml(self) -> etree._Element:
        if not self.address:
            raise ValueError("MakeConnection needs an address to select messages by")
        element = etree.Element(_MAKE_CONNECTION, nsmap={"wsmc": WSMC_NS})
        etree.SubElement(element, _ADDRESS).text = self.address
        return element

    @classmethod
    def from_xml(cls, element: etree._Element) -> MakeConnection:
        """Raises MissingSelection without an Address, UnsupportedSelection for other criteria only."""
        if etree.QName(element) != _MAKE_CONNECTION:
            raise MalformedMessageError(f"expected wsmc:MakeConnection, got {etree.QName(element).text}")
        address = None
        others = []
        for child in children(element):
            if etree.QName(child) == _ADDRESS:
                if address is not None:
                    raise MalformedMessageError("wsmc:MakeConnection has more than one Address")
                address = text_of(child)
            else:
                others.append(etree.QName(child).text)
        if address:
            return cls(address)
        if others:
            raise UnsupportedSelection(
                f"MakeConnection selects by {', '.join(others)}; only wsmc:Address is supported")
        raise MissingSelection()


@dataclass
class MessagePending:
    """Header on a message returned to a poll: are more messages waiting?

    A missing ``pending`` attribute reads as False (nothing promised); a value
    that is not an xs:boolean is malformed.
    """

    pending: bool

    def to_xml(self) -> etree._Element:
        element = etree.Element(_MESSAGE_PENDING, nsmap={"wsmc": WSMC_NS})
        element.set("pending", "true" if self.pending else "false")
        return element

    @classmethod
    def from_xml(cls, element: etree._Element) -> MessagePending:
        if etree.QName(element) != _MESSAGE_PENDING:
            raise MalformedMessageError(f"expected wsmc:MessagePending, got {etree.QName(element).text}")
        raw = (element.get("pending") or "").strip()
        if raw in ("true", "1"):
            return cls(True)
        if raw in ("false", "0", ""):
            return cls(False)
        raise MalformedMessageError(f"wsmc:MessagePending/@pending {raw!r} is not an xs:boolean")
