"""An invoker thread that finds the memory store's buffer empty opens no transaction to look
(issue 33: a delivering thread looks once more after each delivery, and at 16 sequences about
half of those looks found nothing); a message buffered is still delivered, by the wake-up its
receive sends after its commit."""

from __future__ import annotations

import threading
from typing import Any

from wsrm_plugin.engine import ReliableEngine

from .conftest import fast_policy
from .support import item_text, payload, wait_for

ACTION = "urn:test:idle-look"


class _Recording:
    def __init__(self) -> None:
        self.delivered: list[str] = []

    def __call__(self, envelope: bytes, context: Any) -> None:
        self.delivered.append(item_text(envelope) or "")


class _Begins:
    """Counts the transactions the store begins, by thread."""

    def __init__(self, engine: ReliableEngine, monkeypatch) -> None:
        self.by_thread: dict[str, int] = {}
        self._lock = threading.Lock()
        store = engine.store
        real = store.begin

        def begin(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                name = threading.current_thread().name
                self.by_thread[name] = self.by_thread.get(name, 0) + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(store, "begin", begin)


def test_an_empty_buffer_is_seen_without_a_transaction(engines, monkeypatch) -> None:
    app = _Recording()
    server = engines("memory:", fast_policy(), serve=True, application=app, name="idle")
    client = engines("memory:", fast_policy(), name="client")
    for n in range(3):
        client.send(server.endpoint_address, payload(f"m{n}"), action=ACTION, key="a")
    assert wait_for(lambda: len(app.delivered) == 3), app.delivered
    assert not server.store.buffer_may_hold()
    begins = _Begins(server, monkeypatch)
    for _ in range(5):
        assert server.invoker.step() is False  # nothing to deliver
    assert begins.by_thread.get(threading.current_thread().name, 0) == 0  # before: one a look


def test_a_buffered_message_is_seen_and_delivered(engines) -> None:
    app = _Recording()
    server = engines("memory:", fast_policy(deliver_on_receive=False), serve=True, application=app,
                     name="idle")
    client = engines("memory:", fast_policy(), name="client")
    for n in range(20):
        client.send(server.endpoint_address, payload(f"k{n % 4}-{n}"), action=ACTION, key=f"k{n % 4}")
    assert wait_for(lambda: len(app.delivered) == 20), app.delivered
    for key in ("k0", "k1", "k2", "k3"):  # each sequence in its order
        mine = [item for item in app.delivered if item.startswith(f"{key}-")]
        assert mine == sorted(mine, key=lambda item: int(item.rsplit("-", 1)[1]))
    assert not server.store.buffer_may_hold()


def test_the_memory_store_says_when_its_buffer_may_hold_a_message() -> None:
    from wsrm_plugin.store.memory import MemoryStore

    store = MemoryStore()
    assert not store.buffer_may_hold()
    with store.begin() as tx:
        tx.rmd.create("s", acks_to="urn:a", rm_version="1.1", wsa_version="2005/08")
        tx.invoker.put("s", 1, b"<x/>", action="urn:a", soap_version="1.1")
        assert not store.buffer_may_hold()  # not committed yet
    assert store.buffer_may_hold()
    with store.begin() as tx:
        assert tx.invoker.claim_next() is not None
        tx.invoker.mark_delivered("s", 1)
    assert not store.buffer_may_hold()
