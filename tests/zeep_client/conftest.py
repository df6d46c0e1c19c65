"""Fixtures: a spyne service behind a served ReliableEngine, and reliable zeep clients, all on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zeep

from wsrm_plugin.engine import HttpServer, ReliableEngine, RMPolicy
from interceptors.zeep_client.client import ReliableClient, reliable_client

from . import service

#: Short intervals so retransmissions happen within seconds; waits are generous only against hangs.
FAST = dict(base_retransmission_interval=0.2, exponential_backoff=False, poll_interval=0.05, http_timeout=5.0)


def fast_policy(**overrides: Any) -> RMPolicy:
    return RMPolicy(**{**FAST, **overrides})


@pytest.fixture
def server() -> Iterator[ReliableEngine]:
    """A served engine whose application is the spyne OrderService (RECEIVED/ECHOED record runs)."""
    service.reset()
    receiver = service.SpyneReceiver()
    engine = ReliableEngine("memory:", fast_policy(), application=receiver, name="server")
    engine.serve(middleware=receiver.middleware)
    engine.start()
    yield engine
    engine.stop(timeout=5)


@pytest.fixture
def plain_server() -> Iterator[str]:
    """The same spyne service without WS-RM (what a reliable client meets when pointed at the wrong
    service); yields its address."""
    server = HttpServer(service.plain_front(), "127.0.0.1", 0).start()
    yield server.url
    server.stop(5)


@pytest.fixture
def clients(server: ReliableEngine) -> Iterator[Callable[..., ReliableClient]]:
    """``make(store="memory:", **options)``: a started reliable zeep client of ``server``, stopped at teardown."""
    made: list[ReliableClient] = []

    def make(store: Any = "memory:", policy: RMPolicy | None = None, **options: Any) -> ReliableClient:
        zc = zeep.Client(server.endpoint_address + "?wsdl")
        rc = reliable_client(zc, store, policy or fast_policy(), **options)
        made.append(rc)
        return rc

    yield make
    for rc in reversed(made):
        rc.stop(timeout=5, discard_unsent=True)  # a test that needs everything sent flushes
