"""A one-way message the memory store buffers is delivered by the thread that received it, once
its HTTP response is written, not by an invoker thread woken for it (issue 33: at 16 sequences
the woken invoker threads made about 4.5 of the service's 12-14 thread switches a message).

The acknowledgement still goes out before the application runs, and each sequence is delivered in
its order; outside an HTTP request (a direct ``handle()``), and with ``deliver_on_receive`` False,
the invoker threads deliver as before."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from wsrm_plugin.engine import ReliableEngine, after_response

from .conftest import fast_policy
from .support import item_text, payload, wait_for

ACTION = "urn:test:after-response"


class _Recording:
    """Each delivery's item and the name of the thread that ran it."""

    def __init__(self) -> None:
        self.delivered: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, envelope: bytes, context: Any) -> None:
        with self._lock:
            self.delivered.append((item_text(envelope) or "", threading.current_thread().name))

    def items(self) -> list[str]:
        with self._lock:
            return [item for item, _ in self.delivered]

    def threads(self) -> set[str]:
        with self._lock:
            return {thread for _, thread in self.delivered}


def test_a_buffered_message_is_delivered_by_its_receiving_thread(engines) -> None:
    """Fails without: the service's invoker threads delivered every message.  (Their first
    thread's look once a poll interval is put off past the test.)"""
    app = _Recording()
    server = engines("memory:", fast_policy(poll_interval=300.0), serve=True, application=app, name="after")
    client = engines("memory:", fast_policy(), name="client")
    for n in range(24):
        client.send(server.endpoint_address, payload(f"k{n % 3}-{n}"), action=ACTION, key=f"k{n % 3}")
    assert wait_for(lambda: len(app.items()) == 24), app.items()
    for key in ("k0", "k1", "k2"):  # each sequence in its order
        mine = [item for item in app.items() if item.startswith(f"{key}-")]
        assert mine == sorted(mine, key=lambda item: int(item.rsplit("-", 1)[1])), mine
    assert not any("-invoker-" in thread for thread in app.threads()), app.threads()
    assert wait_for(lambda: not server.store.buffer_may_hold())


class _Held(_Recording):
    """Holds its first delivery until released."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, envelope: bytes, context: Any) -> None:
        self.entered.set()
        assert self.release.wait(60)
        super().__call__(envelope, context)


def test_the_acknowledgement_goes_out_before_the_application_runs(engines) -> None:
    """The receiving thread delivers after its response: the client holds the acknowledgement
    while the application is still held (it would wait for it forever were the delivery before
    the response)."""
    app = _Held()
    server = engines("memory:", fast_policy(), serve=True, application=app, name="after")
    client = engines("memory:", fast_policy(), name="client")
    try:
        receipt = client.send(server.endpoint_address, payload("h0"), action=ACTION, key="h")
        assert wait_for(app.entered.is_set)
        assert wait_for(lambda: _acked(client, receipt))
    finally:
        app.release.set()
    assert wait_for(lambda: app.items() == ["h0"]), app.items()


def _acked(engine: Any, receipt: Any) -> bool:
    with engine.store.begin() as tx:
        msg = tx.rms_messages.get(receipt.sequence_key, receipt.number)
        return msg is None or msg.acked


def test_with_deliver_on_receive_off_the_invoker_threads_deliver(engines) -> None:
    app = _Recording()
    server = engines("memory:", fast_policy(deliver_on_receive=False), serve=True, application=app,
                     name="after")
    client = engines("memory:", fast_policy(), name="client")
    for n in range(4):
        client.send(server.endpoint_address, payload(f"i{n}"), action=ACTION, key="i")
    assert wait_for(lambda: app.items() == [f"i{n}" for n in range(4)]), app.items()
    assert all("-invoker-" in thread for thread in app.threads()), app.threads()


def test_deferred_work_runs_once_the_body_is_closed_and_each_piece_once() -> None:
    ran: list[str] = []
    assert after_response.defer(lambda: ran.append("outside")) is False  # no request answered here
    with after_response.collecting({}) as later:
        assert after_response.defer(lambda: ran.append("a"))
        assert after_response.defer(lambda: 1 / 0)  # logged; the others still run
        assert after_response.defer(lambda: ran.append("b"))
    assert after_response.defer(lambda: ran.append("outside")) is False  # the scope ended
    body = after_response.then([b"answer"], later)
    assert list(body) == [b"answer"] and ran == []  # written first
    body.close()  # type: ignore[attr-defined]
    body.close()  # type: ignore[attr-defined]
    assert ran == ["a", "b"]
    with after_response.collecting({}) as nothing:
        pass
    assert after_response.then([b"x"], nothing) == [b"x"]


def test_a_server_that_closes_the_body_before_sending_it_gets_nothing_deferred() -> None:
    """(The asyncio front ends: the acknowledgement would wait for the delivery.)"""
    with after_response.collecting({after_response.CLOSES_BEFORE_SENDING: True}) as later:
        assert after_response.defer(lambda: None) is False
    assert later == []


class _KeptBodies:
    """A middleware that writes each response's chunks but keeps its body unclosed (the test
    closes it), as a server may close a body once the engine stopped."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, app: Any) -> Any:
        def kept(environ: dict[str, Any], start_response: Any) -> list[bytes]:
            body = app(environ, start_response)
            chunks = list(body)
            with self._lock:
                self.bodies.append(body)
            return chunks
        return kept

    def close_all(self) -> None:
        with self._lock:
            bodies, self.bodies = self.bodies, []
        for body in bodies:
            getattr(body, "close", lambda: None)()


def test_a_body_closed_after_the_engine_stopped_delivers_nothing(engines, caplog) -> None:
    """Fails without: the deferred steps ran after ``stop()`` and delivered the buffer to the
    application of a stopped engine (or, on a closed store, logged an exception)."""
    caplog.set_level(logging.INFO, logger="wsrm_plugin")
    app = _Recording()
    kept = _KeptBodies()
    server = engines("memory:", fast_policy(poll_interval=300.0), serve=True, application=app, name="after",
                     middleware=kept)
    client = engines("memory:", fast_policy(), name="client")
    receipt = client.send(server.endpoint_address, payload("s0"), action=ACTION, key="s")
    assert wait_for(lambda: _acked(client, receipt))  # answered: its body's close() is what delivers
    assert wait_for(lambda: any(body.__class__.__name__ == "_ThenRun" for body in kept.bodies))
    server.stop(timeout=5)
    kept.close_all()
    assert app.items() == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "after a response" in r.getMessage()]


def test_answering_defers_to_the_body_close_runs_at_once_on_a_failure_and_restores_the_scope() -> None:
    # answering() sets the scope up itself (no context manager: every request answered comes
    # here): what it defers, runs and leaves behind stays collecting()'s
    ran: list[str] = []

    def respond(name: str) -> list[bytes]:
        assert after_response.defer(lambda: ran.append(name))
        return [name.encode()]

    with after_response.collecting({}) as outer:
        body = after_response.answering({}, lambda: respond("inner"))
        assert after_response.defer(lambda: ran.append("outer"))  # the outer scope is back
    assert list(body) == [b"inner"] and ran == [] and len(outer) == 1
    body.close()  # type: ignore[attr-defined]
    assert ran == ["inner"]

    def fail() -> list[bytes]:
        respond("failed")
        raise RuntimeError("no answer")

    with pytest.raises(RuntimeError, match="no answer"):
        after_response.answering({}, fail)
    assert ran == ["inner", "failed"]  # at once, as the answer failed
    assert after_response.defer(lambda: None) is False  # and no scope left behind
    plain = after_response.answering({after_response.CLOSES_BEFORE_SENDING: True},
                                     lambda: [b"x"] if not after_response.defer(lambda: None) else [b"deferred"])
    assert plain == [b"x"]


def test_a_receive_that_finds_every_place_taken_leaves_its_message_to_the_thread_holding_one(
        engines, monkeypatch) -> None:
    """Fails without: the receive that found the only place taken woke an invoker thread (which
    would wait for the place), and the thread holding it, whose last look had found nothing,
    left without delivering the message.

    The holder is caught between its look that found nothing and leaving its place; the second
    sequence's message is received and answered then."""
    app = _Recording()
    kept = _KeptBodies()
    server = engines("memory:", fast_policy(poll_interval=300.0, invoker_threads=1), serve=True,
                     application=app, name="after", middleware=kept)
    client = engines("memory:", fast_policy(), name="client")
    invoker = server.invoker
    wakes: list[str] = []
    monkeypatch.setattr(invoker, "_wake_invoker", lambda: wakes.append(threading.current_thread().name))
    looked, go_on = threading.Event(), threading.Event()
    real_step = invoker._step_in_slot

    def step_in_slot() -> bool:
        busy = real_step()
        if not busy and threading.current_thread().name == "holder" and not looked.is_set():
            looked.set()  # its look found nothing; it still holds the only place
            assert go_on.wait(30)
        return busy

    monkeypatch.setattr(invoker, "_step_in_slot", step_in_slot)
    first = client.send(server.endpoint_address, payload("a0"), action=ACTION, key="a")
    assert wait_for(lambda: _acked(client, first))
    holder = threading.Thread(target=kept.close_all, name="holder")  # its body's close() delivers
    holder.start()
    try:
        assert looked.wait(30) and app.delivered == [("a0", "holder")]
        second = client.send(server.endpoint_address, payload("b0"), action=ACTION, key="b")
        assert wait_for(lambda: _acked(client, second))
        kept.close_all()  # the second receive's steps: the only place is taken
        assert app.items() == ["a0"] and wakes == []
    finally:
        go_on.set()
        holder.join(30)
    assert wait_for(lambda: app.items() == ["a0", "b0"]), app.items()
    assert app.delivered == [("a0", "holder"), ("b0", "holder")] and wakes == []


def test_a_step_that_raises_hands_a_wanted_step_to_another_thread_and_gives_its_place_back(
        monkeypatch) -> None:
    """The thread whose step raises waits out its interval: a step a receive left to it (every
    place was taken) goes to another invoker thread.  Fails without the wake.  (An engine not
    started: no worker thread steps meanwhile.)"""
    server = ReliableEngine("memory:", fast_policy(), application=_Recording(), name="after")
    invoker = server.invoker
    wakes: list[str] = []
    monkeypatch.setattr(invoker, "_wake_invoker", lambda: wakes.append("woken"))

    def failing_step() -> bool:
        invoker._step_wanted = True  # a receive found every place taken meanwhile
        raise RuntimeError("the store is down")

    monkeypatch.setattr(invoker, "_step_in_slot", failing_step)
    with pytest.raises(RuntimeError):
        invoker.step()
    assert wakes == ["woken"]
    assert invoker._step_slots.qsize() == invoker.thread_count  # every place back
    server.stop(timeout=5)
