"""An invoker thread that finds the memory store's buffer empty opens no transaction to look
(issue 33: a delivering thread looks once more after each delivery, and at 16 sequences about
half of those looks found nothing); a message buffered is still delivered, by the wake-up its
receive sends after its commit.  Nor when every message buffered is of a sequence whose buffer
another transaction holds (an invoker thread delivering it: the message stays in the buffer until
that commit), which the claim would skip."""

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


class _Blocking(_Recording):
    """Delivers, but holds the first delivery until released (its sequence's buffer held meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, envelope: bytes, context: Any) -> None:
        self.entered.set()
        assert self.release.wait(30)
        super().__call__(envelope, context)


def test_a_buffer_held_by_a_delivery_is_seen_without_a_transaction(engines, monkeypatch) -> None:
    """A look while the only message buffered is being delivered by another invoker thread opens no
    transaction (fails without: one, whose claim skips the held sequence and finds nothing)."""
    app = _Blocking()
    server = engines("memory:", fast_policy(deliver_on_receive=False), serve=True, application=app,
                     name="idle")
    client = engines("memory:", fast_policy(), name="client")
    try:
        client.send(server.endpoint_address, payload("h0"), action=ACTION, key="h")
        assert wait_for(app.entered.is_set)
        begins = _Begins(server, monkeypatch)
        assert server.invoker.step() is False  # nothing another thread does not hold
        assert begins.by_thread.get(threading.current_thread().name, 0) == 0
    finally:
        app.release.set()
    assert wait_for(lambda: app.delivered == ["h0"]), app.delivered
    assert wait_for(lambda: not server.store.buffer_may_hold())


def test_the_memory_store_skips_a_buffer_a_transaction_holds() -> None:
    """``buffer_may_hold`` looks past a sequence whose buffer a transaction holds, as the claim does
    (fails without: True while the claim holds it)."""
    from wsrm_plugin.store.memory import MemoryStore

    store = MemoryStore()
    with store.begin() as tx:
        for sequence in ("s", "t"):
            tx.rmd.create(sequence, acks_to="urn:a", rm_version="1.1", wsa_version="2005/08")
        for sequence in ("s", "t"):
            tx.invoker.put(sequence, 1, b"<x/>", action="urn:a", soap_version="1.1")
    with store.begin() as first:
        assert first.invoker.claim_next() is not None
        assert store.buffer_may_hold()  # the other sequence's buffer is free
        with store.begin() as second:
            assert second.invoker.claim_next() is not None
            assert not store.buffer_may_hold()  # both held: a claim would find nothing
            second.rollback()
        assert store.buffer_may_hold()  # released, its message still buffered
