"""A one-way call's empty answer (delivered by the invoker) is made without running the out chain
when nothing in it would touch a message without an envelope; any interceptor that does not say
so, or a ``wsrm_out_message`` hook, still sees it."""

from __future__ import annotations

import threading

from interceptors import Interceptor, InterceptorChain, Message, Phase, hookimpl
from interceptors import chain as chain_module
from interceptors.addressing import AddressingInterceptor
from tests.engine.support import wait_for

from .conftest import send_records


class _OutRuns:
    """Counts the chain's runs of outgoing messages without an envelope (a one-way call's answer)."""

    def __init__(self, monkeypatch) -> None:
        self.empty = 0
        self._lock = threading.Lock()
        real = chain_module.InterceptorChain.handle_out

        def counting(chain, message: Message, **kwargs):
            if message.envelope is None:
                with self._lock:
                    self.empty += 1
            return real(chain, message, **kwargs)

        monkeypatch.setattr(chain_module.InterceptorChain, "handle_out", counting)


class _Watcher(Interceptor):
    """An interceptor that says nothing of envelope-less messages: it must see them all."""

    name, phase = "watcher", Phase.DISPATCH

    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[int | None] = []

    def handle_out(self, message: Message) -> None:
        if message.envelope is None:
            self.statuses.append(message.http_status)


class _Hook:
    def __init__(self) -> None:
        self.empty = 0

    @hookimpl
    def wsrm_out_message(self, message: Message, phase: Phase) -> None:
        if message.envelope is None and phase is Phase.DISPATCH:
            self.empty += 1


def test_the_default_chain_is_not_run_for_a_one_way_answer(servers, clients, monkeypatch):
    runs = _OutRuns(monkeypatch)
    items = [f"item-{i}" for i in range(3)]
    assert send_records(servers, clients, items) == items
    assert runs.empty == 0  # before: one run of the out chain per delivered one-way call


def test_an_interceptor_that_does_not_say_so_sees_every_one_way_answer(servers, clients, monkeypatch):
    runs = _OutRuns(monkeypatch)
    watcher = _Watcher()
    chain = InterceptorChain([AddressingInterceptor(), watcher])
    items = ["a", "b", "c"]
    assert send_records(servers, clients, items, chain=chain) == items
    assert wait_for(lambda: len(watcher.statuses) >= len(items)), watcher.statuses
    assert watcher.statuses == [202, 202, 202]
    assert runs.empty == len(items)


def test_a_hook_sees_every_one_way_answer(servers, clients):
    hook = _Hook()
    chain = InterceptorChain([AddressingInterceptor()], plugins=[hook])
    items = ["x", "y"]
    assert send_records(servers, clients, items, chain=chain) == items
    assert wait_for(lambda: hook.empty >= len(items)), hook.empty
    assert hook.empty == len(items)


def test_the_chain_says_whether_it_is_quiet_without_an_envelope():
    chain = InterceptorChain([AddressingInterceptor()])
    assert chain.quiet_without_envelope()
    chain.add(_Watcher())
    assert not chain.quiet_without_envelope()
    chain.remove("watcher")
    assert chain.quiet_without_envelope()
    chain.register_plugin(_Hook())
    assert not chain.quiet_without_envelope()
