"""A reliable service stores a received request as it came (UTF-8) instead of serializing its tree
again, unless an interceptor before WS-RM may have changed that tree."""

from __future__ import annotations

import threading

from lxml import etree

from interceptors import Interceptor, InterceptorChain, Message, Phase
from interceptors import message as message_module
from interceptors.addressing import AddressingInterceptor

from . import service
from .conftest import send_records

TNS = service.TNS


class _Serializations:
    """Counts the chain's serializations of received requests (envelopes with a ``record`` body)."""

    def __init__(self, monkeypatch) -> None:
        self.requests = 0
        self._lock = threading.Lock()
        real = message_module.serialize

        def counting(envelope: etree._Element) -> bytes:
            if envelope.find(f".//{{{TNS}}}record") is not None:
                with self._lock:
                    self.requests += 1
            return real(envelope)

        monkeypatch.setattr(message_module, "serialize", counting)


class _Upper(Interceptor):
    """Changes a received request's item in place, before WS-RM stores it."""

    name, phase = "upper", Phase.ADDRESSING
    after = ("addressing",)

    def handle_in(self, message: Message) -> None:
        for element in message.envelope.iter(f"{{{TNS}}}item"):
            element.text = element.text.upper()


def test_a_request_read_only_by_the_chain_is_stored_as_received(servers, clients, monkeypatch):
    counted = _Serializations(monkeypatch)
    items = [f"item-{i}" for i in range(4)]
    assert send_records(servers, clients, items) == items
    assert counted.requests == 0  # before: one per request, by the WS-RM interceptor


def test_a_request_an_interceptor_may_have_changed_is_stored_as_changed(servers, clients, monkeypatch):
    counted = _Serializations(monkeypatch)
    chain = InterceptorChain([AddressingInterceptor(), _Upper()])
    assert send_records(servers, clients, ["a", "b"], chain=chain) == ["A", "B"]
    assert counted.requests == 2  # the changed tree, serialized for the store
