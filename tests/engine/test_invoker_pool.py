"""The invoker's threads grow with the sequences that have messages waiting (issue 33).

With one invoker thread, a service whose messages go through the buffer (the memory store's
default) delivered 16 sequences one message at a time: each delivery's database commit waited
for the one before it.  By default there are now up to 4 threads where the store runs different
sequences' transactions at once: the first polls, and a message waiting wakes one that is not
busy, so they deliver side by side when several sequences have messages, and an idle one costs
nothing.  SQLite keeps one: its transactions take turns on the file anyway.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from wsrm_plugin.engine import ReliableEngine, RMPolicy

from .conftest import fast_policy
from .support import item_text, payload, wait_for

ACTION = "urn:test:pool"


class _Blocking:
    """An application that holds every delivery until released, noting how many run at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.delivered: list[str] = []

    def __call__(self, envelope: bytes, context: Any) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            self.release.wait(30)
        finally:
            with self.lock:
                self.running -= 1
                self.delivered.append(item_text(envelope) or "")


def _pair(engines: Callable[..., ReliableEngine], store: str, policy: RMPolicy,
          application: Any) -> tuple[ReliableEngine, ReliableEngine]:
    server = engines(store, policy, serve=True, application=application)
    client = engines("memory:", fast_policy(), name="client")
    return server, client


def test_several_sequences_are_delivered_side_by_side_by_default(engines) -> None:
    app = _Blocking()
    server, client = _pair(engines, "memory:", fast_policy(), app)
    for key in ("a", "b", "c"):
        client.send(server.endpoint_address, payload(f"{key}1"), action=ACTION, key=key)
    assert wait_for(lambda: app.running == 3, timeout=30), app.running  # a thread each, at once
    app.release.set()
    assert wait_for(lambda: len(app.delivered) == 3)
    assert app.most == 3


def test_the_pool_is_bounded_and_one_sequence_is_delivered_in_order(engines) -> None:
    app = _Blocking()
    server, client = _pair(engines, "memory:", fast_policy(invoker_threads=2), app)
    for key in ("a", "b", "c"):
        for n in range(1, 4):
            client.send(server.endpoint_address, payload(f"{key}{n}"), action=ACTION, key=key)
    assert wait_for(lambda: app.running == 2, timeout=30)
    time.sleep(0.3)  # a third thread would have started by now
    assert app.running == 2
    app.release.set()
    assert wait_for(lambda: len(app.delivered) == 9)
    assert app.most == 2
    for key in ("a", "b", "c"):
        assert [d for d in app.delivered if d[0] == key] == [f"{key}1", f"{key}2", f"{key}3"]


def test_sqlite_keeps_one_invoker_thread(engines, tmp_path) -> None:
    server = engines(f"sqlite:///{tmp_path}/s.db", fast_policy(deliver_on_receive=False), serve=True,
                     application=lambda envelope, context: None)
    assert [w.name for w in server.workers if "invoker" in w.name] == ["wsrm-invoker-0"]


@pytest.mark.parametrize("threads", [None, 4])
def test_idle_invoker_threads_do_not_poll(engines, threads) -> None:
    """Only the first thread looks at the store on the poll interval; the others wait to be woken."""
    server = engines("memory:", fast_policy(invoker_threads=threads), serve=True,
                     application=lambda envelope, context: None)
    steps: dict[str, int] = {}
    invokers = [w for w in server.workers if "invoker" in w.name]
    assert len(invokers) == (8 if threads is None else 4)  # (automatic on memory: AUTOMATIC_THREADS_BUFFERED)
    for worker in invokers:
        counted = worker._step  # noqa: SLF001 -- counting the steps of a running worker

        def step(counted=counted, name=worker.name) -> bool:
            steps[name] = steps.get(name, 0) + 1
            return counted()
        worker._step = step  # noqa: SLF001
    # 20 poll intervals of fast_policy (a second; longer when the machine is loaded)
    assert wait_for(lambda: steps.get("wsrm-invoker-0", 0) >= 20, timeout=60), steps
    assert all(steps.get(w.name, 0) == 0 for w in invokers[1:]), steps
